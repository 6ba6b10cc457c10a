"""The analyst's columns of an estimate row: what ``estimate`` means, in which unit, of which key.

Why: ``estimate`` changes meaning by kind (a fraction for a histogram, a count for a range-tree node, a
value in the metric's units for a quantile) and kv_mean packed the statistic into the item name
(``search:frequency``); an analyst should filter on columns, not parse names.
"""

from __future__ import annotations

from typing import Any

# kind -> (statistic, unit) of every item, unless the item name says otherwise (kv_mean, quantile).
_BY_KIND = {"histogram": ("frequency", "fraction"), "heavy_hitters": ("frequency", "fraction"),
            "vector_mean": ("mean", "value"), "range": ("node_count", "clients"),
            "quantile": ("node_count", "clients")}
_KV_UNITS = {"frequency": "fraction", "mean": "normalised", "conditional_mean": "value"}


def statistic_of(kind: str, item: str) -> tuple[str, str, str]:
    """(statistic, key, unit) of one item of a spec of ``kind``."""
    if kind == "kv_mean":
        key, _, statistic = item.rpartition(":")
        if statistic not in _KV_UNITS:
            raise ValueError(f"kv_mean item {item!r} does not end in one of :{', :'.join(_KV_UNITS)}")
        return statistic, key, _KV_UNITS[statistic]
    if kind == "quantile" and item.startswith("quantile:"):
        return "quantile", item.split(":", 1)[1], "value"
    if kind not in _BY_KIND:
        raise ValueError(f"unknown analysis kind {kind!r}")
    statistic, unit = _BY_KIND[kind]
    return statistic, item, unit


def with_analyst_columns(kind: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with ``window_start_utc``/``window_end_utc`` (epoch ms, typed as UTC timestamps by the Parquet
    schema), ``statistic``, ``key`` and ``unit``."""
    out = []
    for row in rows:
        statistic, key, unit = statistic_of(kind, str(row["item"]))
        out.append({**row, "window_start_utc": row["window_start"], "window_end_utc": row["window_end"],
                    "statistic": statistic, "key": key, "unit": unit})
    return out


def neighbouring_notion(row: dict[str, Any]) -> str:
    """The neighbouring notion a row's epsilon is stated in (docs/mathematics.md §1.1): a column of the row when
    the analyzer writes one, else by mechanism (the fragmented RAPPORs are accounted in removal DP)."""
    for column in ("notion", "neighbouring", "neighbouring_notion"):
        if row.get(column):
            return str(row[column])
    return "removal" if str(row.get("mechanism", "")).startswith("rappor") else "replacement"
