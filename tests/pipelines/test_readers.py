"""``estimates_frame``: the dataset parts and a legacy file as one pandas DataFrame, filtered, with timestamps."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.query.readers import estimates_frame
from schemas.arrow import ESTIMATE_ARROW_SCHEMA
from transforms.state.estimates_store import write_release_estimates

HOUR = 3_600_000
START = 1_700_000_000_000 // HOUR * HOUR


def rows(spec_id: str, start: int, crowd: str | None, values: list[float]) -> list[dict]:
    return [{"schema_version": 1, "spec_id": spec_id, "analysis": spec_id.split("@")[0], "window_start": start,
             "window_end": start + HOUR, "crowd_id": crowd, "item": f"c{i}", "item_index": i, "estimate": v,
             "stderr": 0.01, "raw_estimate": v, "n_reports": 100, "n_clients": 100, "eps_local": 1.0,
             "eps_central": 0.3, "delta": 1e-6, "mechanism": "oue", "parameters": json.dumps({"d": 2, "epsilon": 1.0})}
            for i, v in enumerate(values)]


@pytest.fixture()
def out(tmp_path: Path) -> Path:
    write_release_estimates(tmp_path, rows("lang@a1", START, None, [0.6, 0.4]), spec_name="lang",
                            window_end_ms=START + HOUR, release_id="r1")
    write_release_estimates(tmp_path, rows("lang@a2", START + HOUR, "v2", [0.5, 0.5]), spec_name="lang",
                            window_end_ms=START + 2 * HOUR, release_id="r2")
    legacy = pa.Table.from_pylist(rows("old@z", START, None, [1.0, 0.0]), schema=ESTIMATE_ARROW_SCHEMA)
    pq.write_table(legacy, tmp_path / "estimates.parquet")
    return tmp_path


def test_frame_has_every_row_with_timestamps(out: Path) -> None:
    frame = estimates_frame(out)
    assert isinstance(frame, pd.DataFrame) and len(frame) == 6
    assert list(frame["spec_id"]) == ["lang@a1"] * 2 + ["lang@a2"] * 2 + ["old@z"] * 2
    assert frame["window_start"].iloc[0] == pd.Timestamp(START, unit="ms", tz="UTC")
    assert str(frame["window_end"].dtype).startswith("datetime64") and frame["window_end"].dt.tz is not None
    assert list(frame["window_end_ms"]) == [START + HOUR] * 2 + [START + 2 * HOUR] * 2 + [START + HOUR] * 2
    assert isinstance(frame["parameters"].iloc[0], str)


def test_filters_and_parsed_parameters(out: Path) -> None:
    by_name = estimates_frame(out, spec="lang")
    assert set(by_name["spec_id"]) == {"lang@a1", "lang@a2"}
    by_window = estimates_frame(out, window=pd.Timestamp(START + HOUR, unit="ms", tz="UTC").isoformat())
    assert list(by_window["crowd_id"]) == ["v2", "v2"]
    crowd = estimates_frame(out, spec="lang@a2", crowd="v2", parse_parameters=True)
    assert list(crowd["estimate"]) == [0.5, 0.5] and crowd["parameters"].iloc[0] == {"d": 2, "epsilon": 1.0}
    assert estimates_frame(out, window=START, spec="old")["item"].tolist() == ["c0", "c1"]


def test_missing_pandas_says_how_to_install(out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="pip install pandas"):
        estimates_frame(out)


def test_nothing_to_read(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no estimates at"):
        estimates_frame(tmp_path)
