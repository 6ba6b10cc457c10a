"""Append-only estimate parts: written once per release, read back as one sorted table."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from schemas.arrow import ESTIMATE_ARROW_SCHEMA
from tests.state.racing import race
from transforms.io.sinks import ESTIMATE_ARROW_SCHEMA as SINKS_SCHEMA
from transforms.state.estimates_store import read_estimates, write_release_estimates

HOUR = 3_600_000


def rows(spec_id: str, window_end: int, crowd: str | None, items: list[str], value: float = 0.5) -> list[dict]:
    return [{"schema_version": 1, "spec_id": spec_id, "analysis": "histogram", "window_start": window_end - HOUR,
             "window_end": window_end, "crowd_id": crowd, "item": item, "item_index": i, "estimate": value,
             "stderr": 0.01, "raw_estimate": value, "n_reports": 1000, "n_clients": 1000, "n_deleted": None,
             "eps_local": 2.0, "eps_central": 0.1, "delta": 1e-6, "mechanism": "olh",
             "parameters": json.dumps({"d": 4})} for i, item in enumerate(items)]


def complete(row: dict) -> dict:
    """The row as read back: every schema column, null where the row left a nullable one out."""
    return {name: row.get(name) for name in ESTIMATE_ARROW_SCHEMA.names}


def test_the_sink_and_the_store_share_one_schema() -> None:
    assert SINKS_SCHEMA is ESTIMATE_ARROW_SCHEMA


def test_write_once_per_release(tmp_path: Path) -> None:
    first = rows("lang@0123456789ab", 2 * HOUR, None, ["en", "de"])
    path, created = write_release_estimates(tmp_path, first, spec_name="lang", window_end_ms=2 * HOUR, release_id="r1")
    assert created and path == tmp_path / "estimates" / "spec=lang" / f"window_end_ms={2 * HOUR}" / "part-r1.parquet"
    again, created = write_release_estimates(tmp_path, rows("lang@0123456789ab", 2 * HOUR, None, ["xx"], 0.9),
                                             spec_name="lang", window_end_ms=2 * HOUR, release_id="r1")
    assert (again, created) == (path, False)
    table = pq.read_table(path)
    assert table.schema.equals(ESTIMATE_ARROW_SCHEMA, check_metadata=False)
    assert table.to_pylist() == [complete(r) for r in first]
    assert sorted(p.name for p in path.parent.iterdir()) == ["part-r1.parquet"]


def test_read_combines_parts_and_the_legacy_file_sorted(tmp_path: Path) -> None:
    spec = "lang@0123456789ab"
    write_release_estimates(tmp_path, rows(spec, 2 * HOUR, "v2", ["en", "de"]), spec_name="lang",
                            window_end_ms=2 * HOUR, release_id="b")
    write_release_estimates(tmp_path, rows(spec, HOUR, "v1", ["en"]), spec_name="lang", window_end_ms=HOUR,
                            release_id="a")
    write_release_estimates(tmp_path, rows("usage@ffffffffffff", HOUR, None, ["k"]), spec_name="usage@ffffffffffff",
                            window_end_ms=HOUR, release_id="c")
    write_release_estimates(tmp_path, [], spec_name="lang", window_end_ms=3 * HOUR, release_id="empty")
    legacy = rows(spec, HOUR, "v0", ["fr"])
    pq.write_table(pa.Table.from_pylist(legacy, schema=ESTIMATE_ARROW_SCHEMA), tmp_path / "estimates.parquet")
    (tmp_path / "estimates" / "spec=lang" / ".part-x.parquet.0a.tmp").write_bytes(b"PAR1 half")  # crash litter
    table = read_estimates(tmp_path)
    assert table.schema.equals(ESTIMATE_ARROW_SCHEMA, check_metadata=False)
    keys = [(r["spec_id"], r["window_end"], r["crowd_id"], r["item"]) for r in table.to_pylist()]
    assert keys == [(spec, HOUR, "v0", "fr"), (spec, HOUR, "v1", "en"), (spec, 2 * HOUR, "v2", "de"),
                    (spec, 2 * HOUR, "v2", "en"), ("usage@ffffffffffff", HOUR, None, "k")]
    only = read_estimates(tmp_path, columns=["item", "estimate"], spec_name="lang")
    assert only.column_names == ["item", "estimate"] and sorted(only.column("item").to_pylist()) == [
        "de", "en", "en", "fr"]


def test_nothing_there_is_an_empty_table_with_the_schema(tmp_path: Path) -> None:
    empty = read_estimates(tmp_path)
    assert empty.num_rows == 0 and empty.schema.equals(ESTIMATE_ARROW_SCHEMA)
    assert read_estimates(tmp_path, columns=["item"]).column_names == ["item"]
    with pytest.raises(ValueError, match="unknown estimate columns"):
        read_estimates(tmp_path, columns=["spec"])


def test_hive_readers_see_no_clashing_partition_columns(tmp_path: Path) -> None:
    write_release_estimates(tmp_path, rows("lang@0123456789ab", HOUR, None, ["en"]), spec_name="lang",
                            window_end_ms=HOUR, release_id="a")
    table = ds.dataset(tmp_path / "estimates", format="parquet", partitioning="hive").to_table()
    assert table.schema.field("window_end").type == pa.int64()
    assert table.column("spec").to_pylist() == ["lang"] and table.column("window_end_ms").to_pylist() == [HOUR]


@pytest.mark.parametrize("spec_name", ["_private", ".dot", "a/b", "déjà vu", "name=x"])
def test_awkward_spec_names_stay_visible_and_inside_the_tree(tmp_path: Path, spec_name: str) -> None:
    path, _ = write_release_estimates(tmp_path, rows(spec_name, HOUR, None, ["en"]), spec_name=spec_name,
                                      window_end_ms=HOUR, release_id="a")
    assert path.resolve().is_relative_to((tmp_path / "estimates").resolve())
    assert len(path.relative_to(tmp_path / "estimates").parts) == 3
    assert read_estimates(tmp_path).column("spec_id").to_pylist() == [spec_name]
    assert read_estimates(tmp_path, spec_name=spec_name).num_rows == 1


def test_rows_that_do_not_belong_are_refused(tmp_path: Path) -> None:
    good = rows("lang@0123456789ab", HOUR, None, ["en"])
    with pytest.raises(ValueError, match="window_end"):
        write_release_estimates(tmp_path, good, spec_name="lang", window_end_ms=2 * HOUR, release_id="a")
    with pytest.raises(ValueError, match="spec"):
        write_release_estimates(tmp_path, good, spec_name="other", window_end_ms=HOUR, release_id="a")
    with pytest.raises(ValueError, match="missing"):
        write_release_estimates(tmp_path, [{k: v for k, v in good[0].items() if k != "stderr"}], spec_name="lang",
                                window_end_ms=HOUR, release_id="a")
    with pytest.raises(ValueError, match="extra"):
        write_release_estimates(tmp_path, [{**good[0], "client_id": "c1"}], spec_name="lang", window_end_ms=HOUR,
                                release_id="a")
    with pytest.raises(ValueError, match="release_id must"):
        write_release_estimates(tmp_path, good, spec_name="lang", window_end_ms=HOUR, release_id="../x")
    assert not (tmp_path / "estimates").exists()


def _race_write(me: int, out_dir: Path) -> bool:
    return write_release_estimates(out_dir, rows("lang@0123456789ab", HOUR, None, [f"item{me}"]), spec_name="lang",
                                   window_end_ms=HOUR, release_id="same")[1]


def test_racing_publishers_of_one_release_write_one_part(tmp_path: Path) -> None:
    created = race(8, _race_write, tmp_path)
    assert sum(created) == 1
    assert read_estimates(tmp_path).column("item").to_pylist() == [f"item{created.index(True)}"]
