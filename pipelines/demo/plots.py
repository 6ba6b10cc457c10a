"""The demo's picture, per analysis kind: estimates against the truth, with the privacy ledger in the title.

``PLOTS`` maps a kind to its plot (grid histograms get images instead of bars); every plot writes one PNG.
``evidence`` is what the kind's checks (``pipelines.demo.checks``) computed beyond the comparison table: a
rebuilt range tree with random ranges, or heavy hitters' true top-k with readable labels.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from transforms.spec import AnalysisSpec

PlotFn = Callable[[AnalysisSpec, pa.Table, dict[str, Any], Path, Any], None]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# Unit suffixes of metric names (``latency_ms``) and the unit an axis label states for them.
UNIT_SUFFIXES = {"ms": "ms", "msec": "ms", "us": "µs", "s": "s", "sec": "s", "seconds": "s", "min": "minutes",
                 "mins": "minutes", "minutes": "minutes", "h": "hours", "hours": "hours", "bytes": "bytes",
                 "kb": "kB", "mb": "MB", "pct": "%", "percent": "%"}


def value_unit(spec: AnalysisSpec) -> str | None:
    """The unit of the spec's values, from the suffix of its metric name (``latency_ms`` -> ms), or None."""
    suffix = spec.metric.rsplit("_", 1)[-1].lower() if "_" in spec.metric else ""
    return UNIT_SUFFIXES.get(suffix)


def value_label(spec: AnalysisSpec) -> str:
    """Axis label of a value: the metric without its unit suffix and the unit, else the metric and its range."""
    unit = value_unit(spec)
    name = spec.metric.rsplit("_", 1)[0] if unit else spec.metric
    if unit:
        return f"{name.replace('_', ' ')} ({unit})"
    bounds = spec.domain.get("value_range")
    where = f" (range [{bounds[0]:g}, {bounds[1]:g}])" if bounds is not None else ""
    return f"{name.replace('_', ' ')}{where}"


def ledger_title(facts: dict[str, Any]) -> str:
    """One line with the mechanism, n and the privacy ledger (what every demo picture states)."""
    eps_local = float(facts["eps_local"])
    if not math.isfinite(eps_local):
        local = "ε_local=∞ (no local guarantee: multi-message protocol, central only)"
    elif facts.get("epsilon_role") == "central target":
        local = f"ε_local={eps_local:.4g} (from target ε_central={facts['epsilon_spec']:g})"
    else:
        local = f"ε_local={eps_local:g}"
    return (f"{facts['mechanism']}  n={facts['n_clients']:,}  {local}  ε_central={facts['eps_central']:.4f}  "
            f"δ={facts['delta']:g}")


def plot_bars(spec: AnalysisSpec, comparison: pa.Table, facts: dict[str, Any], path: Path,
              evidence: Any = None) -> None:
    """Estimate +/- 2 stderr against the truth, items ordered by truth (first window and crowd)."""
    plt = _pyplot()
    first = (comparison["window_start"][0].as_py(), comparison["crowd_id"][0].as_py())
    keep = [(w, c) == first for w, c in zip(comparison["window_start"].to_pylist(),
                                              comparison["crowd_id"].to_pylist(), strict=True)]
    table = comparison.filter(pa.array(keep))
    truth = np.asarray(table["truth"], dtype=float)
    order = np.argsort(-truth, kind="stable")
    est, se = np.asarray(table["raw_estimate"], dtype=float)[order], np.asarray(table["stderr"], dtype=float)[order]
    items = np.asarray(table["item"].to_pylist(), dtype=object)[order]
    x = np.arange(len(order))
    fig, ax = plt.subplots(figsize=(min(max(8, len(order) * 0.18), 30), 4.8), dpi=110)
    ax.errorbar(x, est, yerr=2 * se, fmt="o", ms=3, color="tab:blue", ecolor="tab:blue", elinewidth=0.8,
                capsize=1.5, label="private estimate ± 2 stderr")
    ax.plot(x, truth[order], "_", ms=9, mew=2, color="black", label="truth")
    ax.axhline(0, color="grey", lw=0.5)
    if len(order) <= 150:
        ax.set_xticks(x, items, rotation=90, fontsize=7)
    if spec.kind == "vector_mean":
        ax.set_xlabel("coordinate, ordered by true mean")
        ax.set_ylabel(f"mean of {value_label(spec)}")
    else:
        ax.set_xlabel("category, ordered by true frequency")
        ax.set_ylabel("frequency (fraction of clients)")
    ax.set_title(f"{ledger_title(facts)}  {100 * facts['fraction_within_3_stderr']:.1f}% within 3 stderr",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_grid(spec: AnalysisSpec, comparison: pa.Table, facts: dict[str, Any], path: Path,
              evidence: Any = None) -> None:
    """Original density, raw reconstruction and post-processed reconstruction side by side ([ESA] Tables
    III-IX); the caption states the central epsilon and the RMSE of each."""
    plt = _pyplot()
    width, height = spec.domain["grid"]
    first = comparison["window_start"][0].as_py()
    table = comparison.filter(pa.compute.equal(comparison["window_start"], first))
    index = np.asarray(table["item_index"], dtype=np.int64)

    def image(column: str) -> np.ndarray:
        out = np.zeros(width * height)
        out[index] = np.asarray(table[column], dtype=float)
        return out.reshape(height, width)

    truth, raw, processed = image("truth"), image("raw_estimate"), image("estimate")
    top = float(truth.max())
    panels = [("original density", truth, None), (f"raw unbiased estimate  RMSE {facts['rmse_raw']:.2e}", raw, None)]
    if facts["postprocess"] != "none":
        panels.append((f"{facts['postprocess']} projection  RMSE {facts['rmse']:.2e}", processed, None))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels) + 0.8, 4.6), dpi=110,
                             layout="constrained")
    axes = list(np.atleast_1d(axes))
    for ax, (title, img, _) in zip(axes, panels, strict=True):
        shown = ax.imshow(np.clip(img, 0, None), cmap="gray", vmin=0, vmax=top, origin="upper",
                          interpolation="nearest")
        ax.set_title(title, fontsize=9)
        ax.set_axis_off()
    # One shared scale: every panel is drawn with the same vmin/vmax (negative estimates shown as 0).
    bar = fig.colorbar(shown, ax=axes, fraction=0.03, pad=0.02)
    bar.set_label("fraction of clients in the cell", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    fig.suptitle(f"{width}x{height} grid, attribute fragmenting  {ledger_title(facts)}  "
                 f"{facts['messages_per_client']} messages/client", fontsize=9)
    fig.savefig(path)
    plt.close(fig)


def plot_kv(spec: AnalysisSpec, comparison: pa.Table, facts: dict[str, Any], path: Path,
            evidence: Any = None) -> None:
    """Key-value estimates in three panels (share of devices, normalised mean, conditional mean in value
    units), each estimate +/- 2 stderr against the truth, keys in spec order."""
    plt = _pyplot()
    rows = comparison.to_pylist()
    first = (rows[0]["window_start"], rows[0]["crowd_id"])
    rows = [r for r in rows if (r["window_start"], r["crowd_id"]) == first]
    groups = [("frequency", "share of devices holding the key"), ("mean", "mean (normalised, missing = 0)"),
              ("conditional_mean", f"conditional mean\n{value_label(spec)}")]
    fig, axes = plt.subplots(3, 1, figsize=(max(8, len(spec.categories) * 0.3), 9), dpi=110, sharex=True)
    x = np.arange(len(spec.categories))
    for ax, (suffix, label) in zip(axes, groups, strict=True):
        mine = {r["item"].rsplit(":", 1)[0]: r for r in rows if r["item"].endswith(":" + suffix)}
        est = np.array([mine[k]["raw_estimate"] if k in mine else np.nan for k in spec.categories])
        se = np.array([mine[k]["stderr"] if k in mine else np.nan for k in spec.categories])
        truth = np.array([mine[k]["truth"] if k in mine else np.nan for k in spec.categories])
        ax.errorbar(x, est, yerr=2 * se, fmt="o", ms=3, color="tab:blue", elinewidth=0.8, capsize=1.5,
                    label="estimate ± 2 stderr")
        ax.plot(x, truth, "_", ms=9, mew=2, color="black", label="truth")
        ax.set_ylabel(label, fontsize=8)
    axes[-1].set_xticks(x, spec.categories, rotation=90, fontsize=7)
    axes[-1].set_xlabel("key")
    axes[0].legend(fontsize=8)
    axes[0].set_title(f"{ledger_title(facts)}  {100 * facts['fraction_within_3_stderr']:.1f}% within 3 stderr",
                      fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _cdf_curves(evidence: Any, points: int = 400) -> dict[str, np.ndarray]:
    """Estimated CDF (fraction of clients) with its exact stderr, and the true CDF, at cut points in value
    units up to the true 99.9 % quantile (the latency tail would squash the body otherwise)."""
    stored, leaves = evidence.stored, evidence.truth_leaves
    cum = np.concatenate(([0.0], np.cumsum(leaves)))
    n_true = cum[-1]
    top = min(int(np.searchsorted(cum, 0.999 * n_true)) + 1, stored.size)
    cuts = np.unique(np.linspace(0, max(top, 2), points).round().astype(np.int64))
    est, se = stored.tree.answers(np.zeros_like(cuts), cuts)
    n = float(stored.tree.n)
    edges = np.array([stored.edge(c) for c in cuts])
    return {"x": edges, "est": est / n, "se": se / n, "truth": cum[cuts] / n_true}


def _cdf_panel(ax: Any, curves: dict[str, np.ndarray], xlabel: str = "value") -> None:
    ax.fill_between(curves["x"], curves["est"] - 2 * curves["se"], curves["est"] + 2 * curves["se"],
                    color="tab:blue", alpha=0.25, lw=0, label="± 2 stderr")
    ax.plot(curves["x"], curves["est"], color="tab:blue", lw=1, label="private estimate (consistent tree)")
    ax.plot(curves["x"], curves["truth"], color="black", lw=1, ls="--", label="truth")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of clients ≤ value")
    ax.legend(fontsize=8, loc="lower right")


def plot_range(spec: AnalysisSpec, comparison: pa.Table, facts: dict[str, Any], path: Path,
               evidence: Any = None) -> None:
    """CDF ± 2 stderr against the true CDF; 60 of the random ranges as estimate ± 2 stderr against their truth
    (by true count); the z-scores of all random ranges against N(0, 1), with the fraction within 3 stderr.

    The ranges overlap and are answered from one tree, so their errors are correlated (between overlapping
    ranges the correlation reaches ~0.5). Each z-score is still N(0, 1) marginally, so the N(0, 1) density is
    the *expected* histogram; the histogram of correlated draws just fluctuates around it more than one of
    independent draws would. Whitening with the exact covariance would cost one adjoint per pair of ranges
    (minutes for 1,000 ranges), so the panel states the correlation instead."""
    plt = _pyplot()
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(17, 5), dpi=110, width_ratios=(1.1, 1.1, 0.8))
    _cdf_panel(left, _cdf_curves(evidence), value_label(spec))
    left.set_title("CDF from the stored tree", fontsize=9)
    shown = np.linspace(0, evidence.truth.size - 1, min(60, evidence.truth.size)).round().astype(int)
    order = shown[np.argsort(evidence.truth[shown], kind="stable")]
    x = np.arange(order.size)
    middle.errorbar(x, evidence.estimate[order], yerr=2 * evidence.stderr[order], fmt="o", ms=3, color="tab:blue",
                    elinewidth=0.8, capsize=1.5, label="estimate ± 2 stderr")
    middle.plot(x, evidence.truth[order], "_", ms=8, mew=2, color="black", label="truth")
    middle.set_xlabel(f"{order.size} of the random ranges, by true count")
    middle.set_ylabel("clients in the range")
    middle.set_title("random range answers", fontsize=9)
    middle.legend(fontsize=8)
    z = (evidence.estimate - evidence.truth) / evidence.stderr
    within = np.mean(np.abs(z) <= 3)
    grid = np.linspace(-5, 5, 201)
    right.hist(np.clip(z, -5, 5), bins=40, range=(-5, 5), density=True, color="tab:blue", alpha=0.6,
               label=f"(estimate − truth) / stderr, {z.size} ranges")
    right.plot(grid, np.exp(-grid**2 / 2) / np.sqrt(2 * np.pi), color="black", lw=1, label="N(0, 1)")
    for side in (-3, 3):
        right.axvline(side, color="grey", ls=":", lw=1)
    right.set_title(f"{100 * within:.1f}% of random ranges within 3 stderr", fontsize=9)
    right.set_xlabel("(estimate − truth) / stderr\noverlapping ranges share noise: the z-scores are correlated,\n"
                     "each N(0, 1) marginally but not independent draws", fontsize=8)
    right.set_ylabel("density")
    right.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"{spec.name}: range counts  {ledger_title(facts)}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_quantiles(spec: AnalysisSpec, comparison: pa.Table, facts: dict[str, Any], path: Path,
                   evidence: Any = None) -> None:
    """Left: the CDF with each quantile estimate and its 95 % interval at height q, true quantiles marked.
    Right: per quantile, estimate and interval divided by the truth (quantiles span decades)."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), dpi=110)
    _cdf_panel(left, _cdf_curves(evidence), value_label(spec))
    qs = evidence.quantiles
    q = np.array([r["q"] for r in qs])
    est = np.array([r["estimate"] for r in qs])
    lo, hi = np.array([r["ci_low"] for r in qs]), np.array([r["ci_high"] for r in qs])
    truth = np.array([r["truth"] for r in qs])
    left.errorbar(est, q, xerr=[est - lo, hi - est], fmt="o", ms=4, color="tab:red", capsize=3,
                  label="quantile estimate, 95% CI")
    left.plot(truth, q, "x", color="black", ms=7, label="true quantile")
    left.legend(fontsize=8, loc="lower right")
    x = np.arange(q.size)
    ratio = np.where(truth > 0, truth, np.nan)
    right.errorbar(x, est / ratio, yerr=[(est - lo) / ratio, (hi - est) / ratio], fmt="o", ms=4, color="tab:red",
                   capsize=3, label="estimate, 95% CI")
    right.axhline(1.0, color="black", lw=1, label="truth")
    unit = value_unit(spec)
    right.set_xticks(x, [f"q={v:g}\ntruth {t:.4g}{' ' + unit if unit else ''}" for v, t in zip(q, truth, strict=True)],
                     fontsize=8)
    right.set_xlabel("quantile level")
    right.set_ylabel("relative to the true quantile")
    inside = sum(r["within_ci"] for r in qs)
    right.set_title(f"{inside} of {len(qs)} true quantiles inside their 95% CI", fontsize=9)
    right.legend(fontsize=8)
    fig.suptitle(f"{spec.name}: quantiles  {ledger_title(facts)}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_heavy_hitters(spec: AnalysisSpec, comparison: pa.Table, facts: dict[str, Any], path: Path,
                       evidence: Any = None) -> None:
    """Reported top-k: estimated frequency ± 2 stderr as bars against the true frequency, labelled with the
    item's string where the simulation knows it; true top-k items that were missed are listed in red."""
    plt = _pyplot()
    reported = sorted(evidence.reported, key=lambda r: r["item_index"]) if evidence else comparison.to_pylist()
    labels = evidence.labels if evidence else {}
    top = {r["item"] for r in evidence.true_top} if evidence else set()
    x = np.arange(len(reported))
    est = np.array([r["raw_estimate"] for r in reported])
    se = np.array([r["stderr"] for r in reported])
    truth = np.array([r["truth"] for r in reported])
    fig, ax = plt.subplots(figsize=(max(8, 0.55 * len(reported) + 3), 5.5), dpi=110)
    colors = ["tab:blue" if r["item"] in top else "tab:orange" for r in reported]
    ax.bar(x, est, yerr=2 * se, color=colors, alpha=0.8, capsize=3, label="estimate ± 2 stderr (orange: not true top)")
    ax.plot(x, truth, "_", ms=18, mew=2.5, color="black", label="true frequency")
    names = [f"{labels.get(r['item'], r['item'])}\n{r['item']}" for r in reported]
    ax.set_xticks(x, names, rotation=70, ha="right", fontsize=7)
    ax.set_xlabel(f"reported item: string (where known) and its {spec.domain.get('bits', '')}-bit hash")
    ax.set_ylabel("frequency (fraction of clients)")
    missed = [r for r in (evidence.true_top if evidence else []) if r["item"] not in {m["item"] for m in reported}]
    if missed:
        text = "missed true top items:\n" + "\n".join(f"{labels.get(m['item'], m['item'])}  {m['truth']:.4f}"
                                                       for m in missed[:6])
        ax.text(0.99, 0.97, text, transform=ax.transAxes, ha="right", va="top", fontsize=7, color="tab:red")
    ax.set_title(f"top-{facts.get('top', len(reported))}: precision {facts.get('precision_at_k', float('nan')):.2f}, "
                 f"recall {facts.get('recall_at_k', float('nan')):.2f}\n{ledger_title(facts)}", fontsize=9)
    ax.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def is_grid(spec: AnalysisSpec) -> bool:
    return spec.kind == "histogram" and "grid" in spec.domain


PLOTS: dict[str, PlotFn] = {"histogram": plot_bars, "kv_mean": plot_kv, "vector_mean": plot_bars,
                            "range": plot_range, "quantile": plot_quantiles, "heavy_hitters": plot_heavy_hitters}


def plot_file_name(spec: AnalysisSpec) -> str:
    return "grid_reconstruction.png" if is_grid(spec) else "estimates_vs_truth.png"


def plot(spec: AnalysisSpec, comparison: pa.Table, facts: dict[str, Any], path: Path, evidence: Any = None) -> None:
    """The kind's picture (bars by default; range kinds fall back to bars without their evidence)."""
    fn = plot_grid if is_grid(spec) else PLOTS.get(spec.kind, plot_bars)
    if fn in (plot_range, plot_quantiles) and evidence is None:
        fn = plot_bars
    fn(spec, comparison, facts, path, evidence)
