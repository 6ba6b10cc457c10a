"""Kind-specific checks of a demo run, beyond the generic per-item z-statistics of ``pipelines.demo.run``.

A range tree has ~2^(bits+1) node rows: a summary of their z-statistics says little that a user asks, so
range and quantile runs are judged on what they are for: ``RANDOM_RANGES`` random ranges answered by the
tree rebuilt from the STORED rows (``pipelines.query.ranges``, as ``esa query`` would) against the exact counts,
and each quantile's stated interval against the true quantile. Heavy hitters are judged on precision and
recall of the reported top-k against the true top-k. Each check returns (facts to merge, evidence for the
kind's plot); ``facts["details"]`` lists the extra summary lines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from pipelines.query.ranges import StoredTree, answer_quantile, trees_of
from transforms.mechanisms.randomness import os_entropy_rng, seeded_stream
from transforms.spec import AnalysisSpec

RANDOM_RANGES = 1000

Check = Callable[[AnalysisSpec, pa.Table, pa.Table, pa.Table, "int | None"], tuple[dict[str, Any], Any]]


def _crowd_rows(table: pa.Table, window_start: int, crowd_id: str | None) -> list[dict[str, Any]]:
    cols = [c for c in ("window_start", "crowd_id", "item", "item_index", "truth", "raw_estimate", "stderr",
                        "example", "population") if c in table.column_names]
    return [r for r in table.select(cols).to_pylist() if (r["window_start"], r["crowd_id"]) == (window_start, crowd_id)]


@dataclass(frozen=True)
class RangeEvidence:
    """The first tree, its (rescaled) true leaf counts, random ranges answered from it, and quantile checks."""

    stored: StoredTree
    truth_leaves: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    estimate: np.ndarray
    stderr: np.ndarray
    truth: np.ndarray
    quantiles: list[dict[str, Any]]


def random_ranges(size: int, truth_leaves: np.ndarray, count: int, rng: np.random.Generator) -> tuple[np.ndarray,
                                                                                                     np.ndarray]:
    """``count`` leaf ranges [lo, hi): half with endpoints uniform over the domain, half with endpoints at
    random clients' leaves (where the data is); never the whole domain (known exactly) nor empty."""
    half = count // 2
    uniform = rng.integers(0, size + 1, size=(half, 2))
    weights = np.clip(truth_leaves, 0, None)
    p = weights / weights.sum() if weights.sum() > 0 else None
    at_data = rng.choice(size, size=(count - half, 2), p=p) + rng.integers(0, 2, size=(count - half, 2))
    ends = np.sort(np.concatenate([uniform, at_data]), axis=1)
    lo, hi = ends[:, 0], ends[:, 1]
    hi = np.where(hi == lo, np.minimum(lo + 1, size), hi)
    lo = np.where(hi == lo, lo - 1, lo)
    whole = (lo == 0) & (hi == size)
    hi = np.where(whole, size - 1, hi)
    return lo.astype(np.int64), hi.astype(np.int64)


def _leaf_truth(rows: list[dict[str, Any]], bits: int, n_clients: int) -> np.ndarray:
    """True count of every leaf from the TRUTH table's rows of one crowd (not the comparison: a tree may
    store only some nodes, e.g. [MultiMsg]'s left children), rescaled to the ``n_clients`` the shuffler released."""
    out = np.full(1 << bits, np.nan)
    prefix = f"{bits}/"
    for r in rows:
        if r["item"].startswith(prefix):
            scale = n_clients / r["population"] if r.get("population") else 1.0
            out[int(r["item"][len(prefix):])] = r["truth"] * scale
    return out


def range_checks(spec: AnalysisSpec, estimates: pa.Table, comparison: pa.Table, truth: pa.Table,
                 seed: int | None) -> tuple[dict[str, Any], RangeEvidence | None]:
    """Random ranges within 3 stderr (all crowds), node z-statistics, and quantiles within their intervals."""
    rng = seeded_stream(seed, "demo-range-checks") if seed is not None else os_entropy_rng()
    trees = trees_of(estimates, spec_id=spec.spec_id)
    z_ranges, quantiles, evidence = [], [], None
    for stored in trees:
        rows = _crowd_rows(comparison, stored.window_start, stored.crowd_id)
        leaves = _leaf_truth(_crowd_rows(truth, stored.window_start, stored.crowd_id), stored.bits, stored.tree.n)
        if not rows or np.isnan(leaves).any():
            continue
        lo, hi = random_ranges(stored.size, leaves, RANDOM_RANGES, rng)
        est, se = stored.tree.answers(lo, hi)
        cum = np.concatenate(([0.0], np.cumsum(leaves)))
        exact = cum[hi] - cum[lo]
        z_ranges.append(np.abs(est - exact) / se)
        checked = []
        truth_q = {r["item"]: r["truth"] for r in rows if r["item"].startswith("quantile:")}
        for q in spec.domain.get("quantiles", ()):
            answer = answer_quantile(stored, q)
            true_value = truth_q.get(f"quantile:{q:g}")
            if true_value is None:
                continue
            # the truth is a bucket's upper edge: within when its bucket lies in [lower, upper]
            slack = 1e-9 * max(abs(answer.ci_high), 1.0)
            within = answer.ci_low + slack < true_value <= answer.ci_high + slack
            checked.append({"q": q, "estimate": answer.value, "ci_low": answer.ci_low, "ci_high": answer.ci_high,
                            "truth": float(true_value), "within_ci": bool(within),
                            "window_start": stored.window_start, "crowd_id": stored.crowd_id})
        quantiles.extend(checked)
        if evidence is None:
            evidence = RangeEvidence(stored, leaves, lo, hi, est, se, exact, checked)
    z = np.concatenate(z_ranges) if z_ranges else np.zeros(0)
    names = comparison["item"].to_pylist()
    node = np.array([not name.startswith("quantile:") for name in names], dtype=bool)
    z_nodes = np.asarray(comparison["abs_error_over_stderr"], dtype=float)[node]
    z_nodes = z_nodes[np.isfinite(z_nodes)]
    raw = np.asarray(comparison["raw_estimate"], dtype=float)[node]
    cons = np.asarray(comparison["estimate"], dtype=float)[node]
    exact_nodes = np.asarray(comparison["truth"], dtype=float)[node]
    facts: dict[str, Any] = {
        "z_basis": "random ranges",
        "max_abs_error_over_stderr": float(z.max()) if z.size else float("nan"),
        "fraction_within_3_stderr": float(np.mean(z <= 3)) if z.size else float("nan"),
        "random_ranges": int(z.size),
        "nodes": int(node.sum()),
        "node_fraction_within_3_stderr": float(np.mean(z_nodes <= 3)) if z_nodes.size else float("nan"),
        "node_max_abs_error_over_stderr": float(z_nodes.max()) if z_nodes.size else float("nan"),
        "rmse_raw": float(np.sqrt(np.mean((raw - exact_nodes) ** 2))) if raw.size else float("nan"),
        "rmse": float(np.sqrt(np.mean((cons - exact_nodes) ** 2))) if cons.size else float("nan"),
        "rmse_label": "node counts",
    }
    details = [["tree nodes within 3 stderr", f"{100 * facts['node_fraction_within_3_stderr']:.2f}% of "
                f"{facts['nodes']:,} (max {facts['node_max_abs_error_over_stderr']:.2f}; ~4.5-5 expected)"]]
    if quantiles:
        facts["quantiles"] = quantiles
        facts["quantiles_within_ci"] = sum(q["within_ci"] for q in quantiles)
        for q in quantiles:
            verdict = "within" if q["within_ci"] else "OUTSIDE"
            details.append([f"quantile {q['q']:g}", f"{q['estimate']:.5g}  95% CI [{q['ci_low']:.5g}, "
                            f"{q['ci_high']:.5g}]  truth {q['truth']:.5g}  {verdict}"])
        details.append(["quantiles within their CI", f"{facts['quantiles_within_ci']} of {len(quantiles)}"])
    facts["details"] = details
    return facts, evidence


@dataclass(frozen=True)
class HeavyHitterEvidence:
    """Reported items (first window and crowd), the true top-k, and a readable string per item hash."""

    reported: list[dict[str, Any]]
    true_top: list[dict[str, Any]]
    labels: dict[str, str]


def heavy_hitter_checks(spec: AnalysisSpec, estimates: pa.Table, comparison: pa.Table, truth: pa.Table,
                        seed: int | None) -> tuple[dict[str, Any], HeavyHitterEvidence | None]:
    """Precision and recall of the reported top-k against the true top-k (k = the spec's top), per crowd."""
    k = spec.domain["top"]
    keys = sorted({(r["window_start"], r["crowd_id"]) for r in
                   comparison.select(["window_start", "crowd_id"]).to_pylist()}, key=lambda x: (x[0], x[1] or ""))
    found, reported_total, evidence, missed = 0, 0, None, []
    for window_start, crowd_id in keys:
        reported = _crowd_rows(comparison, window_start, crowd_id)
        true_rows = sorted(_crowd_rows(truth, window_start, crowd_id), key=lambda r: -r["truth"])
        true_top = true_rows[:k]
        hits = {r["item"] for r in reported} & {r["item"] for r in true_top}
        found += len(hits)
        reported_total += len(reported)
        missed.extend({"item": r["item"], "truth": r["truth"], "example": r.get("example")}
                      for r in true_top if r["item"] not in hits)
        if evidence is None:
            labels = {r["item"]: r.get("example") or r["item"] for r in true_rows if "example" in r}
            evidence = HeavyHitterEvidence(reported, true_top, labels)
    crowds = max(len(keys), 1)
    facts: dict[str, Any] = {
        "z_basis": "reported items",
        "top": k,
        "precision_at_k": found / reported_total if reported_total else float("nan"),
        "recall_at_k": found / (k * crowds),
        "true_top_found": found,
        "true_top_missed": missed,
    }
    facts["details"] = [
        [f"true top-{k} found", f"{found} of {k * crowds}" + ("" if crowds == 1 else f" ({crowds} crowds)")],
        [f"precision / recall @ {k}", f"{facts['precision_at_k']:.2f} / {facts['recall_at_k']:.2f}"],
    ] + [["missed", f"{m['example'] or m['item']} (true frequency {m['truth']:.4f})"] for m in missed[:5]]
    return facts, evidence


CHECKS: dict[str, Check] = {"range": range_checks, "quantile": range_checks, "heavy_hitters": heavy_hitter_checks}


def kind_checks(spec: AnalysisSpec, estimates: pa.Table, comparison: pa.Table, truth: pa.Table,
                seed: int | None = None) -> tuple[dict[str, Any], Any]:
    """The kind's own facts and plot evidence, or ({}, None) for kinds judged item by item."""
    check = CHECKS.get(spec.kind)
    if check is None or comparison.num_rows == 0:
        return {}, None
    return check(spec, estimates, comparison, truth, seed)
