"""``esa query`` for item estimates: histograms, heavy hitters and kv_mean keys, from stored Estimate rows.

Which rows are which kind comes from the ``mechanism`` column (``transforms.mechanisms.registry``): a
histogram oracle's rows are one frequency per category, a heavy-hitter analysis's are the top items as hex
hashes, a kv_mean mechanism's are ``key:frequency``, ``key:mean`` and ``key:conditional_mean``.

**Sums over items.** The stored stderr describes each item alone; the estimates of one window are not
independent in general, so the stderr of a sum over a set S of items uses the mechanism's covariance:

* ``grr``: exact. A report is one of d values, so the counts are multinomial: for u != v,
  ``Cov(c_u, c_v) = -(p q (c_u + c_v) + q^2 (n - c_u - c_v)) / (p - q)^2``, with the plug-in counts
  (the raw estimates clipped to [0, n]) that the stored stderr uses too.
* ``oue``, ``rappor``: zero. Each report's bits are drawn independently given the value, so two items'
  counts are uncorrelated (RAPPOR's cap on set bits is reached with probability < 2^-64).
* ``olh``: zero under a fully random hash (a holder of u hits H(v) with probability 1/g whatever it sends,
  and so does a non-holder of both); the finite seed family adds a correlation of order d / (S g) which is
  neglected, as it is in ``variance``'s leading term.
* ``hadamard``: exact. Item v owns row v + 1 of the Sylvester matrix, and rows multiply as
  ``H[a] H[b] = H[a ^ b]``, so a report is correlated between C_u and C_v only for the holders of the item
  x with row ``(u + 1) ^ (v + 1)``: ``Cov(c_u, c_v) = c_x / (2 p* - 1)`` (0 if x is outside the domain).
* anything else (``cms``, multi-message protocols, heavy hitters): no closed form is used,
  so the sum gets the Cauchy-Schwarz bound ``sum_v stderr_v``, valid for every covariance (conservative).

Every sum says which of the three it used (``covariance``: ``exact``, ``zero`` or ``bound``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms.mechanisms.frequency.counting import grr_probabilities
from transforms.mechanisms.heavy_hitters.prefix_tree import item_hash
from transforms.mechanisms.registry import MECHANISMS

ITEM_KINDS = ("histogram", "heavy_hitters", "kv_mean")
UNCORRELATED = ("oue", "rappor", "olh")
KV_PARTS = ("frequency", "mean", "conditional_mean")
DEFAULT_TOP = 10


def kind_of(mechanism: str) -> str | None:
    """The analysis kind a stored row's mechanism serves (ranges and quantiles share dyadic_range: 'range')."""
    entry = MECHANISMS.get(mechanism)
    return entry.kinds[0] if entry is not None else None


def hash_candidates(candidates: Iterable[str], bits: int) -> dict[str, list[str]]:
    """Map each candidate string to the hex item name the analyzer stores for it (the encoder's
    ``item_hash`` at ``bits`` bits, zero-padded to ``ceil(bits / 4)`` digits): {hex: [candidates]}.
    Several candidates can share one hash; all of them are listed."""
    names = [str(c) for c in candidates]
    if not names:
        return {}
    digits = (int(bits) + 3) // 4
    out: dict[str, list[str]] = {}
    for name, h in zip(names, item_hash(np.array(names, dtype=object), int(bits)).tolist(), strict=True):
        out.setdefault(f"{int(h):0{digits}x}", []).append(name)
    return out


def read_candidates(path: str) -> list[str]:
    """One candidate string per line (a trailing newline and blank lines are ignored)."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = [line.rstrip("\r\n") for line in handle]
    except OSError as err:
        raise ValueError(f"cannot read candidates from {path}: {err}") from None
    return [line for line in lines if line]


def grr_sum_variance(counts: np.ndarray, variances: np.ndarray, n: int, d: int, epsilon: float) -> float:
    """Variance of a sum of GRR frequency estimates (fractions of n): the stored per-item variances plus the
    multinomial covariances of every ordered pair (module docstring), at plug-in counts ``counts``."""
    p, q = grr_probabilities(epsilon, d)
    c = np.clip(np.asarray(counts, dtype=np.float64), 0.0, float(n))
    k, total = c.size, float(c.sum())
    pairs = 2.0 * (k - 1) * p * q * total + q * q * (k * (k - 1) * float(n) - 2.0 * (k - 1) * total)
    return float(np.sum(variances)) - pairs / ((p - q) ** 2 * float(n) ** 2)


def hadamard_sum_variance(index: Sequence[int], variances: np.ndarray, counts: np.ndarray, epsilon: float,
                          n: int) -> float:
    """Variance of a sum of Hadamard-response frequency estimates of the items ``index``: the per-item
    variances plus ``c_x / (2 p* - 1)`` for every ordered pair (module docstring); ``counts`` are the plug-in
    counts of every item of the domain (by item index)."""
    e = math.exp(min(epsilon, 700.0))
    p = e / (1.0 + e)
    c = np.clip(np.asarray(counts, dtype=np.float64), 0.0, float(n))
    pairs = 0.0
    for a in index:
        for b in index:
            x = ((a + 1) ^ (b + 1)) - 1
            if a != b and 0 <= x < c.size:
                pairs += c[x]
    return float(np.sum(variances)) + pairs / (2.0 * p - 1.0) / float(n) ** 2


def sum_of(rows: list[dict[str, Any]], mechanism: str, parameters: dict[str, Any], n: int,
           counts: np.ndarray | None = None) -> dict[str, Any]:
    """Sum of the estimates of ``rows`` with its stderr under the mechanism's covariance; ``counts`` (the
    window's plug-in counts by item index) is needed for Hadamard response's exact covariance."""
    estimate = float(sum(r["estimate"] for r in rows))
    raw = np.array([r["raw_estimate"] for r in rows], dtype=np.float64)
    se = np.array([r["stderr"] for r in rows], dtype=np.float64)
    if len(rows) == 1:
        covariance, stderr = "exact", float(se[0])
    elif mechanism == "grr" and "d" in parameters and "epsilon" in parameters and n > 0:
        covariance = "exact"
        stderr = math.sqrt(max(grr_sum_variance(raw * n, se**2, n, int(parameters["d"]),
                                                float(parameters["epsilon"])), 0.0))
    elif mechanism == "hadamard" and "epsilon" in parameters and counts is not None and n > 0:
        covariance = "exact"
        index = [int(r["item_index"]) for r in rows]
        stderr = math.sqrt(max(hadamard_sum_variance(index, se**2, counts, float(parameters["epsilon"]), n), 0.0))
    elif mechanism in UNCORRELATED:
        covariance, stderr = "zero", float(math.sqrt(np.sum(se**2)))
    else:
        covariance, stderr = "bound", float(np.sum(se))
    return {"items": [r["item"] for r in rows], "estimate": estimate, "raw_estimate": float(raw.sum()),
            "stderr": stderr, "covariance": covariance}


def _row(r: dict[str, Any], labels: dict[str, list[str]]) -> dict[str, Any]:
    out = {"item": r["item"], "estimate": r["estimate"], "stderr": r["stderr"], "raw_estimate": r["raw_estimate"]}
    if labels:
        out["candidates"] = labels.get(r["item"], [])
    return out


def _find(rows_by_item: dict[str, dict[str, Any]], name: str, labels: dict[str, list[str]],
          what: str) -> dict[str, Any]:
    """An item by its stored name or, for heavy hitters, by a candidate string that hashes to it."""
    if name in rows_by_item:
        return rows_by_item[name]
    for item, strings in labels.items():
        if name in strings and item in rows_by_item:
            return rows_by_item[item]
    known = ", ".join(list(rows_by_item)[:8]) + (" ..." if len(rows_by_item) > 8 else "")
    raise ValueError(f"no item {name!r} in {what} (items: {known})")


def _histogram(rows: list[dict[str, Any]], first: dict[str, Any], kind: str, top: int | None,
               items: Sequence[str], sums: Sequence[Sequence[str]], candidates: Sequence[str] | None,
               what: str) -> dict[str, Any]:
    parameters = json.loads(first["parameters"] or "{}")
    labels: dict[str, list[str]] = {}
    if candidates is not None:
        if kind != "heavy_hitters":
            raise ValueError(f"--candidates labels heavy-hitter hashes; {what} is a {kind} analysis")
        labels = hash_candidates(candidates, int(parameters.get("item_bits", 32)))
    by_item = {r["item"]: r for r in rows}
    ranked = sorted(rows, key=lambda r: (-r["estimate"], r["item"]))
    n = int(first["n_clients"])
    counts = None
    if kind == "histogram":
        counts = np.zeros(max(int(r["item_index"]) for r in rows) + 1)
        counts[[int(r["item_index"]) for r in rows]] = [r["raw_estimate"] * n for r in rows]
    return {"top": [_row(r, labels) for r in ranked[:top or 0]],
            "items": [_row(_find(by_item, name, labels, what), labels) for name in items],
            "sums": [sum_of([_find(by_item, name, labels, what) for name in group], first["mechanism"],
                            parameters, n, counts) for group in sums]}


def _kv(rows: list[dict[str, Any]], top: int | None, keys: Sequence[str], what: str) -> dict[str, Any]:
    table: dict[str, dict[str, Any]] = {}
    for r in rows:
        key, _, part = r["item"].rpartition(":")
        if part in KV_PARTS:
            table.setdefault(key, {"key": key})[part] = {"estimate": r["estimate"], "stderr": r["stderr"],
                                                         "raw_estimate": r["raw_estimate"]}
    missing = [k for k in keys if k not in table]
    if missing:
        known = ", ".join(list(table)[:8]) + (" ..." if len(table) > 8 else "")
        raise ValueError(f"no key {missing[0]!r} in {what} (keys: {known})")
    if keys:
        chosen = [table[k] for k in keys]
    else:
        ranked = sorted(table.values(), key=lambda e: (-e.get("frequency", {}).get("estimate", -math.inf), e["key"]))
        chosen = ranked if top is None else ranked[:top]
    return {"keys": chosen}


def label(group: dict[str, Any]) -> str:
    when = datetime.fromtimestamp(group["window_start"] / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    crowd = f"  crowd {group['crowd_id']}" if group["crowd_id"] is not None else ""
    return (f"{group['spec_id']}  {group['kind']} ({group['mechanism']})  window {when} ({group['window_start']})"
            f"{crowd}  n={group['n_clients']:,}  eps_local={group['eps_local']:g}  "
            f"eps_central={group['eps_central']:.4f}  delta={group['delta']:g}")


def item_answers(table: pa.Table, *, top: int | None = None, items: Sequence[str] = (),
                 sums: Sequence[Sequence[str]] = (), candidates: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Answer top-k, named items and sums on every histogram / heavy-hitter / kv_mean (spec, window, crowd)
    of an (already filtered) estimates table. With no question, the top ``DEFAULT_TOP`` items (all keys for
    kv_mean). Empty list if the table holds none of those kinds."""
    if top is not None and top < 1:
        raise ValueError(f"--top must be >= 1, got {top}")
    kv_top = top  # kv_mean: every key unless --top is given
    if top is None and not items and not sums:
        top = DEFAULT_TOP
    out = []
    mechanisms = pc.unique(table["mechanism"]).to_pylist() if table.num_rows else []
    wanted = [m for m in mechanisms if kind_of(m) in ITEM_KINDS]
    if not wanted:
        return []
    table = table.filter(pc.is_in(table["mechanism"], pa.array(wanted)))
    keys = table.select(["spec_id", "window_start", "crowd_id"]).group_by(
        ["spec_id", "window_start", "crowd_id"]).aggregate([]).to_pylist()
    for key in sorted(keys, key=lambda k: (k["spec_id"], k["window_start"], k["crowd_id"] or "")):
        mask = pc.and_(pc.equal(table["spec_id"], key["spec_id"]), pc.equal(table["window_start"], key["window_start"]))
        mask = pc.and_(mask, pc.is_null(table["crowd_id"]) if key["crowd_id"] is None
                       else pc.equal(table["crowd_id"], key["crowd_id"]))
        rows = table.filter(mask).to_pylist()
        first = rows[0]
        kind = kind_of(first["mechanism"])
        group = {"spec_id": key["spec_id"], "window_start": int(key["window_start"]),
                 "window_end": int(first["window_end"]), "crowd_id": key["crowd_id"], "kind": kind,
                 "mechanism": first["mechanism"], "n_clients": int(first["n_clients"]),
                 "eps_local": float(first["eps_local"]), "eps_central": float(first["eps_central"]),
                 "delta": float(first["delta"])}
        group["label"] = label(group)
        what = f"{key['spec_id']} window {key['window_start']}" + (
            f" crowd {key['crowd_id']}" if key["crowd_id"] is not None else "")
        if kind == "kv_mean":
            if sums:
                raise ValueError(f"--sum applies to histogram and heavy-hitter items; {what} is kv_mean")
            group.update(_kv(rows, kv_top, items, what))
        else:
            group.update(_histogram(rows, first, kind, top, items, sums, candidates, what))
        out.append(group)
    return out


def _fmt(entry: dict[str, Any]) -> str:
    return f"{entry['estimate']:.6g} ± {entry['stderr']:.3g}"


def format_item_answers(results: list[dict[str, Any]]) -> str:
    """Human-readable answers: one block per (spec, window, crowd)."""
    lines = []
    for result in results:
        lines.append(result["label"])
        if result["kind"] == "kv_mean":
            for e in result["keys"]:
                parts = "  ".join(f"{part} {_fmt(e[part])}" for part in KV_PARTS if part in e)
                lines.append(f"  key {e['key']}: {parts}")
            continue
        for title, entries in (("top", result["top"]), ("item", result["items"])):
            for rank, e in enumerate(entries, 1):
                tag = f"#{rank}" if title == "top" else "item"
                names = f"  ({', '.join(e['candidates'])})" if e.get("candidates") else ""
                lines.append(f"  {tag:<5} {e['item']}{names}: {_fmt(e)}")
        for s in result["sums"]:
            lines.append(f"  sum   {' + '.join(s['items'])}: {_fmt(s)}  [covariance {s['covariance']}]")
    return "\n".join(lines)
