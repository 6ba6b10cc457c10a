"""The demo's picture, per analysis kind: estimates against the truth, with the privacy ledger in the title.

``PLOTS`` maps a kind to its plot (grid histograms get images instead of bars); every plot writes one PNG.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from transforms.spec import AnalysisSpec

PlotFn = Callable[[AnalysisSpec, pa.Table, dict[str, Any], Path], None]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def ledger_title(facts: dict[str, Any]) -> str:
    """One line with the mechanism, n and the privacy ledger (what every demo picture states)."""
    return (f"{facts['mechanism']}  n={facts['n_clients']:,}  ε_local={facts['eps_local']:g}  "
            f"ε_central={facts['eps_central']:.4f}  δ={facts['delta']:g}")


def plot_bars(spec: AnalysisSpec, comparison: pa.Table, facts: dict[str, Any], path: Path) -> None:
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
    ax.set_ylabel("estimate")
    ax.set_title(f"{ledger_title(facts)}  {100 * facts['fraction_within_3_stderr']:.1f}% within 3 stderr",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_grid(spec: AnalysisSpec, comparison: pa.Table, facts: dict[str, Any], path: Path) -> None:
    """Original density, raw reconstruction and post-processed reconstruction side by side (001 Tables
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
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.6), dpi=110)
    for ax, (title, img, _) in zip(np.atleast_1d(axes), panels, strict=True):
        ax.imshow(np.clip(img, 0, None), cmap="gray", vmin=0, vmax=top, origin="upper", interpolation="nearest")
        ax.set_title(title, fontsize=9)
        ax.set_axis_off()
    fig.suptitle(f"{width}x{height} grid, attribute fragmenting  {ledger_title(facts)}  "
                 f"{facts['messages_per_client']} messages/client", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_kv(spec: AnalysisSpec, comparison: pa.Table, facts: dict[str, Any], path: Path) -> None:
    """Key-value estimates in three panels (share of devices, normalised mean, conditional mean in value
    units), each estimate +/- 2 stderr against the truth, keys in spec order."""
    plt = _pyplot()
    rows = comparison.to_pylist()
    first = (rows[0]["window_start"], rows[0]["crowd_id"])
    rows = [r for r in rows if (r["window_start"], r["crowd_id"]) == first]
    groups = [("frequency", "share of devices holding the key"), ("mean", "mean (normalised, missing = 0)"),
              ("conditional_mean", "conditional mean (value units)")]
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
    axes[0].legend(fontsize=8)
    axes[0].set_title(f"{ledger_title(facts)}  {100 * facts['fraction_within_3_stderr']:.1f}% within 3 stderr",
                      fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def is_grid(spec: AnalysisSpec) -> bool:
    return spec.kind == "histogram" and "grid" in spec.domain


PLOTS: dict[str, PlotFn] = {"histogram": plot_bars, "kv_mean": plot_kv, "vector_mean": plot_bars}


def plot_file_name(spec: AnalysisSpec) -> str:
    return "grid_reconstruction.png" if is_grid(spec) else "estimates_vs_truth.png"


def plot(spec: AnalysisSpec, comparison: pa.Table, facts: dict[str, Any], path: Path) -> None:
    """The kind's picture (bars by default)."""
    (plot_grid if is_grid(spec) else PLOTS.get(spec.kind, plot_bars))(spec, comparison, facts, path)
