"""Append-only, idempotent estimate outputs: one Parquet part per release, never rewritten.

``out_dir/estimates/spec=<spec name>/window_end_ms=<ms>/part-<release_id>.parquet``. The part is published
create-if-absent under its release id, so republishing a release after a crash (the ledger's
``unpublished``) or a racing duplicate job finds the part there and writes nothing: every release appears
exactly once however often it is published.

Partition directory names. Hive partition columns are added to a dataset's rows by readers that infer
them (pyarrow, Spark, DuckDB). The Estimate schema has ``spec_id`` (string, ``name@hash``) and
``window_end`` (long). ``window_end=<ms>`` would duplicate the ``window_end`` column, and readers infer the
directory value as int32 (pyarrow) against the file's int64: a type clash, or a silently shadowed column. So
the window directory is ``window_end_ms=``. ``spec=`` clashes with nothing (there is no ``spec`` column) and
holds the spec *name*, which groups every parameter version (spec id) of an analysis under one directory.
``read_estimates`` returns the Estimate columns (and, asked for, the analyst's columns of
``schemas.arrow.ANALYST_FIELDS``), from the files themselves. To read the directory values typed, give
readers the partitioning ``ESTIMATE_PARTITIONING`` (spec: string, window_end_ms: int64); docs/querying.md.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from schemas.arrow import ESTIMATE_ARROW_SCHEMA, ESTIMATE_PART_SCHEMA
from transforms.state.estimate_columns import with_analyst_columns
from transforms.state.files import create_exclusive

ESTIMATES_DIR = "estimates"
ESTIMATE_PARTITIONING = ds.partitioning(pa.schema([("spec", pa.string()), ("window_end_ms", pa.int64())]),
                                        flavor="hive")
LEGACY_FILE = "estimates.parquet"
SORT_COLUMNS = ("spec_id", "window_end", "crowd_id", "item")
_RELEASE_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
_PLAIN_SEGMENT = re.compile(r"[A-Za-z0-9._@+-]+")


def _segment(value: str) -> str:
    """A directory-safe form of a partition value that Hive readers decode back (URI percent-encoding of
    '/', '=', spaces, non-ASCII...). The directory name starts with ``spec=`` whatever the value, so it is
    never one of the '.'/'_' names that pyarrow and Spark skip as hidden."""
    return value if _PLAIN_SEGMENT.fullmatch(value) else quote(value, safe="")


def part_path(out_dir: Path, spec_name: str, window_end_ms: int, release_id: str) -> Path:
    if not isinstance(spec_name, str) or not spec_name:
        raise ValueError(f"spec_name must be a non-empty string, got {spec_name!r}")
    if not isinstance(release_id, str) or not _RELEASE_ID.fullmatch(release_id):
        raise ValueError(f"release_id must be 1-128 characters of [A-Za-z0-9_-], got {release_id!r}")
    if not isinstance(window_end_ms, int) or isinstance(window_end_ms, bool):
        raise ValueError(f"window_end_ms must be an int, got {window_end_ms!r}")
    return (Path(out_dir) / ESTIMATES_DIR / f"spec={_segment(spec_name)}" / f"window_end_ms={window_end_ms}"
            / f"part-{release_id}.parquet")


def _check_rows(rows: list[dict[str, Any]], spec_name: str, window_end_ms: int) -> None:
    """Every required column present (nullable ones may be left out: they default to null), none unknown."""
    names = set(ESTIMATE_ARROW_SCHEMA.names)
    required = {f.name for f in ESTIMATE_ARROW_SCHEMA if not f.nullable}
    for i, row in enumerate(rows):
        missing, extra = sorted(required - set(row)), sorted(set(row) - names)
        if missing or extra:
            raise ValueError(f"estimate row {i} does not match schemas/Estimate.avsc: missing {missing}, extra {extra}")
        if row["window_end"] != window_end_ms:
            raise ValueError(f"estimate row {i} has window_end {row['window_end']}, not the release's {window_end_ms}")
        if row["spec_id"] != spec_name and row["spec_id"].split("@", 1)[0] != spec_name:
            raise ValueError(f"estimate row {i} is of spec {row['spec_id']}, not {spec_name}")


def write_release_estimates(out_dir: Path, rows: list[dict[str, Any]], *, spec_name: str, window_end_ms: int,
                            release_id: str, kind: str | None = None) -> tuple[Path, bool]:
    """Publish one release's estimate rows as a new part: (path, True), or (path, False) if that release's
    part exists already (then nothing is written: the first publication stands).

    ``spec_name`` is the spec's name or its id; each row must belong to it and to ``window_end_ms``. An empty
    ``rows`` writes an empty part, which still records that the release was published. With the spec's
    ``kind``, the part also carries the analyst's columns (``transforms.state.estimate_columns``) and is written
    with ``ESTIMATE_PART_SCHEMA`` (column descriptions in its metadata).
    """
    path = part_path(out_dir, spec_name, window_end_ms, release_id)
    _check_rows(rows, spec_name, window_end_ms)  # even when the part exists: a caller bug must not hide
    if path.exists():
        return path, False
    if kind is None:
        table = pa.Table.from_pylist(rows, schema=ESTIMATE_ARROW_SCHEMA)
    else:
        table = pa.Table.from_pylist(with_analyst_columns(kind, rows), schema=ESTIMATE_PART_SCHEMA)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return path, create_exclusive(path, sink.getvalue().to_pybytes())


def read_estimates(out_dir: Path, *, columns: list[str] | None = None, spec_name: str | None = None) -> pa.Table:
    """Every estimate row under ``out_dir`` (parts, plus a legacy ``estimates.parquet``), sorted by
    (spec_id, window_end, crowd_id, item) as far as those columns are selected.

    Files are read with the current Estimate schema (a column an older part lacks comes back null).
    ``spec_name`` restricts the parts to one spec's directory (the legacy file is filtered by its rows).
    """
    out_dir = Path(out_dir)
    wanted = list(ESTIMATE_ARROW_SCHEMA.names) if columns is None else list(columns)
    unknown = [c for c in wanted if c not in ESTIMATE_PART_SCHEMA.names]
    if unknown:
        raise ValueError(f"unknown estimate columns {unknown}; known: {ESTIMATE_PART_SCHEMA.names}")
    root = out_dir / ESTIMATES_DIR
    if spec_name is not None:
        root = root / f"spec={_segment(spec_name)}"
    sources = [str(p) for p in sorted(root.rglob("*.parquet")) if not _hidden(p, root)] if root.is_dir() else []
    legacy = out_dir / LEGACY_FILE
    tables = []
    if sources:
        tables.append(ds.dataset(sources, schema=ESTIMATE_PART_SCHEMA, format="parquet").to_table(columns=wanted))
    if legacy.is_file():
        dataset = ds.dataset(str(legacy), schema=ESTIMATE_PART_SCHEMA, format="parquet")
        if spec_name is None:
            tables.append(dataset.to_table(columns=wanted))
        else:
            spec_id = ds.field("spec_id")
            match = (spec_id == spec_name) | pc.starts_with(spec_id, pattern=spec_name + "@")
            tables.append(dataset.to_table(columns=wanted, filter=match))
    if not tables:
        return ESTIMATE_PART_SCHEMA.empty_table().select(wanted)
    table = pa.concat_tables(tables)
    keys = [(c, "ascending") for c in SORT_COLUMNS if c in wanted]
    return table.sort_by(keys) if keys and table.num_rows else table


def _hidden(path: Path, root: Path) -> bool:
    """Temporary files and hidden directories (leading '.' or '_'), which dataset readers skip too."""
    return any(part.startswith((".", "_")) for part in path.relative_to(root).parts)
