"""The typed reading of an analysis spec's TOML tables: field errors that name the file, the table and the key,
and the ``[domain]`` table of each analysis kind (``transforms.spec`` builds the spec from them).
"""

from __future__ import annotations

import math
from typing import Any


class SpecError(ValueError):
    """An analysis spec that cannot be used; the message names the file and the field."""


def _domain(reader: _Reader, kind: str) -> tuple[tuple[str, ...], tuple[tuple[str, Any], ...]]:
    """(item names, other domain values) of ``[domain]``, checked for the analysis kind."""
    domain = reader.table("domain")
    allowed = {"histogram": {"categories", "size", "grid"}, "kv_mean": {"keys", "s", "value_range"},
               "vector_mean": {"dimension", "value_range"}, "range": {"bits", "value_range"},
               "quantile": {"bits", "value_range", "quantiles"}, "heavy_hitters": {"bits", "top"}}[kind]
    for key in domain:
        if key not in allowed:
            reader.fail("domain", key, f"is not a field of a {kind} domain (fields: {', '.join(sorted(allowed))})")
    params: dict[str, Any] = {}
    if kind == "histogram":
        names = _categories(reader)
        grid = domain.get("grid")
        return names, ((("grid", (int(grid[0]), int(grid[1]))),) if grid else ())
    if kind == "kv_mean":
        keys = _names(reader, "keys")
        s = reader.get("domain", "s", int, 1)
        if not 1 <= s <= len(keys):
            reader.fail("domain", "s", f"must be in [1, number of keys = {len(keys)}] (got {s})")
        params = {"s": s, "value_range": _value_range(reader, (-1.0, 1.0))}
        return keys, tuple(params.items())
    if kind == "vector_mean":
        dim = reader.get("domain", "dimension", int)
        if dim < 1:
            reader.fail("domain", "dimension", f"must be >= 1 (got {dim})")
        return tuple(str(i) for i in range(dim)), (("value_range", _value_range(reader, (0.0, 1.0))),)
    bits = reader.get("domain", "bits", int)
    limit = 64 if kind == "heavy_hitters" else 24
    if not 1 <= bits <= limit:
        reader.fail("domain", "bits", f"must be in [1, {limit}] (got {bits})")
    params["bits"] = bits
    if kind in ("range", "quantile") and "value_range" in domain:
        params["value_range"] = _value_range(reader, None)
    if kind == "quantile":
        qs = reader.get("domain", "quantiles", list, [0.25, 0.5, 0.75])
        if not qs or not all(isinstance(q, int | float) and not isinstance(q, bool) and 0 < q < 1 for q in qs):
            reader.fail("domain", "quantiles", f"must list numbers in (0, 1) (got {qs!r})")
        params["quantiles"] = tuple(float(q) for q in qs)
    if kind == "heavy_hitters":
        top = reader.get("domain", "top", int, 10)
        if top < 1:
            reader.fail("domain", "top", f"must be >= 1 (got {top})")
        params["top"] = top
    return (), tuple(params.items())


def _names(reader: _Reader, key: str) -> tuple[str, ...]:
    names = reader.get("domain", key, list)
    if len(names) < 1 or not all(isinstance(c, str) and c for c in names):
        reader.fail("domain", key, "must list non-empty strings")
    if len(set(names)) != len(names):
        reader.fail("domain", key, "must not repeat a name")
    return tuple(names)


def _value_range(reader: _Reader, default: tuple[float, float] | None) -> tuple[float, float]:
    raw = reader.get("domain", "value_range", list, list(default) if default else reader._MISSING)
    ok = (len(raw) == 2 and all(isinstance(v, int | float) and not isinstance(v, bool) for v in raw)
          and all(math.isfinite(v) for v in raw) and raw[0] < raw[1])
    if not ok:
        reader.fail("domain", "value_range", f"must be [lo, hi] with finite lo < hi (got {raw!r})")
    return float(raw[0]), float(raw[1])


def _categories(reader: _Reader) -> tuple[str, ...]:
    domain = reader.table("domain")
    given = [k for k in ("categories", "size", "grid") if k in domain]
    if len(given) != 1:
        reader.fail("domain", "categories", "give exactly one of categories = [...], size = N or grid = [W, H]")
    if "grid" in domain:
        grid = reader.get("domain", "grid", list)
        if len(grid) != 2 or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 1 for g in grid):
            reader.fail("domain", "grid", f"must be [width, height] of positive integers (got {grid!r})")
        width, height = grid
        if width * height < 2:
            reader.fail("domain", "grid", "must have at least 2 cells")
        # row-major cells named "x,y": item index = y * width + x
        return tuple(f"{x},{y}" for y in range(height) for x in range(width))
    if "size" in domain:
        size = reader.get("domain", "size", int)
        if size < 2:
            reader.fail("domain", "size", f"must be >= 2 (got {size})")
        return tuple(str(i) for i in range(size))
    cats = reader.get("domain", "categories", list)
    if len(cats) < 2 or not all(isinstance(c, str) and c for c in cats):
        reader.fail("domain", "categories", "must list at least 2 non-empty strings")
    if len(set(cats)) != len(cats):
        reader.fail("domain", "categories", "must not repeat a category")
    return tuple(cats)


class _Reader:
    """Typed access to TOML tables with errors of the form 'file: [table] key ...'."""

    def __init__(self, raw: dict[str, Any], source: str):
        self.raw, self.source = raw, source

    def fail(self, table: str, key: str, message: str) -> None:
        raise SpecError(f"{self.source}: [{table}] {key} {message}")

    def table(self, name: str) -> dict[str, Any]:
        value = self.raw.get(name, {})
        if not isinstance(value, dict):
            raise SpecError(f"{self.source}: [{name}] must be a table")
        return value

    _MISSING = object()

    def get(self, table: str, key: str, kind: type | tuple[type, ...], default: Any = _MISSING) -> Any:
        values = self.table(table)
        if key not in values:
            if default is self._MISSING:
                self.fail(table, key, "is required")
            return default
        value = values[key]
        if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            self.fail(table, key, f"must be {names} (got {value!r})")
        return value
