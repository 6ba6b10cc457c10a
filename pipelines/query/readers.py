"""Pandas-friendly readers of stored estimates: the rows an analyst loads into a notebook.

``estimates_frame`` reads the append-only dataset (``OUTPUT_DIR/estimates/spec=*/window_end_ms=*/part-*.parquet``)
and a legacy ``estimates.parquet`` through ``read_estimates``, filters them like ``esa query`` does, and hands
back a ``pandas.DataFrame`` with the window bounds as UTC timestamps. pandas is imported on call only: the
pipelines never need it, so it is not a runtime dependency.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from schemas.arrow import ESTIMATE_ARROW_SCHEMA
from transforms.state.estimates_store import read_estimates

__all__ = ["estimates_frame", "filter_estimates", "load_estimates"]


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise ImportError("estimates_frame needs pandas: pip install pandas (or the 'dev' extra: "
                          "pip install -e '.[dev]')") from None
    return pandas


def load_estimates(out_dir: str | Path) -> pa.Table:
    """Every estimate row of an output directory (dataset parts and a legacy ``estimates.parquet``), or of an
    ``estimates.parquet`` file given directly; ValueError if there is nothing to read."""
    path = Path(out_dir)
    if path.is_file():  # that file alone, read with the current schema like read_estimates does
        try:
            return ds.dataset(str(path), schema=ESTIMATE_ARROW_SCHEMA, format="parquet").to_table()
        except (OSError, pa.ArrowException) as err:
            raise ValueError(f"cannot read estimates at {path}: {err}") from None
    if not path.is_dir():
        raise ValueError(f"no estimates at {path} (give the output directory of esa run/demo/analyze)")
    table = read_estimates(path)
    if table.num_rows == 0 and not (path / "estimates").is_dir() and not (path / "estimates.parquet").is_file():
        raise ValueError(f"no estimates at {path} (give the output directory of esa run/demo/analyze)")
    return table


def filter_estimates(table: pa.Table, spec: str | None = None, window: str | int | None = None,
                     crowd: str | None = None) -> pa.Table:
    """Rows of one spec (its id ``name@hash`` or its name: every version), window (start, epoch ms or ISO
    8601) and crowd id; None keeps all."""

    mask = None

    def both(a: Any, b: Any) -> Any:
        return b if a is None else pc.and_(a, b)

    if spec is not None:
        column = table["spec_id"]
        mask = both(mask, pc.or_(pc.equal(column, spec), pc.starts_with(column, pattern=spec + "@")))
    if window is not None:
        mask = both(mask, pc.equal(table["window_start"], parse_time_ms(str(window))))
    if crowd is not None:
        mask = both(mask, pc.equal(table["crowd_id"], crowd))
    return table if mask is None else table.filter(pc.fill_null(mask, False))


def estimates_frame(out_dir: str | Path, spec: str | None = None, window: str | int | None = None,
                    crowd: str | None = None, *, parse_parameters: bool = False) -> Any:
    """The estimates of ``out_dir`` as a ``pandas.DataFrame``, one row per (spec, window, crowd, item).

    ``window_start`` and ``window_end`` become tz-aware UTC timestamps (the epoch milliseconds stay in
    ``window_start_ms`` / ``window_end_ms``); ``parse_parameters=True`` replaces the ``parameters`` JSON
    strings by dicts. Filters as ``filter_estimates``.
    """
    pandas = _pandas()
    table = filter_estimates(load_estimates(out_dir), spec, window, crowd)
    frame = table.to_pandas()
    for column in ("window_start", "window_end"):
        frame[f"{column}_ms"] = frame[column].astype("int64")
        frame[column] = pandas.to_datetime(frame[column], unit="ms", utc=True)
    if parse_parameters:
        frame["parameters"] = [json.loads(p) if p else {} for p in frame["parameters"]]
    return frame


def parse_time_ms(text: str, flag: str = "--window") -> int:
    """A time given as milliseconds since the epoch or an ISO 8601 time (UTC unless it says)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{flag} must be epoch milliseconds or an ISO 8601 time, got {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return round(when.timestamp() * 1000)
