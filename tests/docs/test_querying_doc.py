"""docs/querying.md's DuckDB and pandas blocks, run as written against a kv_mean demo's real output: typed
times, the statistic and unit columns, typed partition columns and the column descriptions; the pandas section's
``estimates_frame`` block picks its window from the output it reads."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.demo.run import run_demo

pytestmark = pytest.mark.slow
DOC = Path(__file__).resolve().parents[2] / "docs" / "querying.md"


def _blocks() -> list[str]:
    section = DOC.read_text(encoding="utf-8").split("## The Parquet files", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


@pytest.fixture(scope="module")
def out(broker, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("query") / "out"
    run_demo(clients=3000, mechanism=None, epsilon=None, out=out, kind="kv_mean", seed=4, bad_per_kind=0,
             bootstrap=broker.bootstrap, direct=True)  # the querying doc is under test, not ingestion or a broker
    return out


def test_the_duckdb_block(out: Path) -> None:
    duckdb_block, _ = _blocks()
    scope: dict = {"OUT": str(out)}
    exec(compile(duckdb_block, str(DOC), "exec"), scope)
    frame = scope["frames"]
    assert len(frame) == 32 and set(frame["unit"]) == {"fraction"}  # feature_usage: 32 keys, one window
    assert str(frame["window_end_utc"].dtype).startswith("datetime64") and "UTC" in str(frame["window_end_utc"].dtype)
    assert not any(":" in k for k in frame["key"])
    assert scope["descriptions"]["unit"].startswith("Unit of estimate and stderr")
    assert set(scope["descriptions"]) >= {"estimate", "stderr", "window_end_utc", "statistic", "key"}


def test_the_pandas_block(out: Path) -> None:
    _, pandas_block = _blocks()
    scope: dict = {"OUT": str(out)}
    exec(compile(pandas_block, str(DOC), "exec"), scope)
    table, means = scope["table"], scope["means"]
    assert str(table.schema.field("window_end_ms").type) == "int64"  # the partition column, typed
    assert str(table.schema.field("window_end_utc").type) == "timestamp[ms, tz=UTC]"
    assert len(means) == 32 and set(means["unit"]) == {"value"}
    assert scope["description"].startswith("Unit of estimate and stderr")
    part = next((out / "estimates").rglob("*.parquet"))
    assert all(f.metadata and f.metadata.get(b"description") for f in pq.read_schema(part))


def test_the_estimates_frame_block_picks_a_window_the_output_has(out: Path) -> None:
    section = DOC.read_text(encoding="utf-8").split("\n## pandas", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    spec = next((out / "estimates").iterdir()).name.removeprefix("spec=")  # the kv_mean demo's spec
    scope: dict = {}
    exec(compile(block.replace('"out/demo"', repr(str(out))).replace('"app_language"', repr(spec)), str(DOC),
                 "exec"), scope)
    every, frame = scope["every"], scope["frame"]
    assert len(frame) and set(frame["window_start_ms"]) == {every["window_start_ms"].max()}
    assert all(isinstance(p, dict) for p in frame["parameters"])
