"""``esa privacy --windows W``: what W releases of the same population cost in total, before collection.

Each window releases the shuffled reports of the population (one report per client per window). The crowd
count is charged only under a claim that makes it data-dependent (``--crowd_claim partition``: a device may
move between public crowds, two counts change; ``membership``: whether it reported is protected, one
count), as the discrete Gaussian the shuffler then uses, sized for a year of ``--window_seconds`` windows
(``crowd_count``). The total is the composition of all of it by privacy loss distributions (``odometer``),
read at the report's delta plus the composition's own infinite-loss mass (the same terms, grid and delta
convention as the analyzer's ledger, so the two agree). Beside it: the cumulative value after 1, 10, 30,
365 and 8,760 windows (those <= W), the count's part alone, and basic composition (W times the per-window
value at delta / W).

For ``rappor``/``rappor_fragments`` a window is the two changed channels (replacement DP, as in their
``eps_central``), so it enters as two copies of the channel's pair.
"""

from __future__ import annotations

from typing import Any

from ._checks import check_delta, check_epsilon, check_int
from .crowd_count import count_charges, design, neighbouring_notion, windows_per_year
from .odometer import WindowRelease, compose_with_delta, interval_for

__all__ = ["CLAIMS", "MILESTONES", "format_windows_report", "windows_report"]

MILESTONES: tuple[int, ...] = (1, 10, 30, 365, 8760)
CLAIMS = ("none", "partition", "membership", "partition+membership")


def count_release(claim: str, window_seconds: int, epsilon_year: float, delta_year: float
                  ) -> tuple[dict[str, Any], int]:
    """(the count's WindowRelease fields, charges) for a claim (no fields when the count is free)."""
    if claim not in CLAIMS:
        raise ValueError(f"crowd claim must be one of {', '.join(CLAIMS)}, got {claim!r}")
    charges = count_charges("partition" in claim, "membership" in claim)
    if not charges:
        return {}, 0
    sigma, threshold = design(check_epsilon("crowd_epsilon_year", epsilon_year),
                              check_delta("crowd_delta_year", delta_year), windows_per_year(window_seconds), charges)
    return {"count_sigma": sigma, "count_threshold": threshold, "count_charges": charges}, charges


def _window(report: dict[str, Any], count: dict[str, Any]) -> WindowRelease:
    channels = 2 if report["mechanism"] in ("rappor", "rappor_fragments") else 1
    # rappor: removal budget of one channel (eps(tau) for the fragment tuple), two channels change
    blanket = (report.get("blanket") or {}).get("decomposition") if channels == 1 else None
    return WindowRelease(report["alpha"], report["epsilon_local"], report["n"], **count, channels=channels,
                         blanket=None if blanket is None else tuple(blanket))


def windows_report(report: dict[str, Any], windows: int, claim: str = "none", window_seconds: int = 86_400,
                   epsilon_year: float = 1.0, delta_year: float = 1e-6) -> dict[str, Any]:
    """The composition over ``windows`` windows of the single-window ``report`` (``build_privacy_report``)."""
    windows = check_int("windows", windows, 1)
    count, charges = count_release(claim, window_seconds, epsilon_year, delta_year)
    delta = report["delta"]
    window = _window(report, count)
    interval = interval_for(float(report["eps_central"]))  # the analyzer's rule: same grid, same total
    cumulative, method, delta_cumulative = {}, "", delta
    for w in sorted({m for m in MILESTONES if m <= windows} | {windows}):
        cumulative[str(w)], delta_cumulative, method = compose_with_delta([window] * w, delta, interval)
    per_window_at_split, _, _ = compose_with_delta([window], delta / windows, interval)
    out = {
        "windows": windows,
        "notion": neighbouring_notion("partition" in claim, "membership" in claim),
        "delta_total": delta,
        "delta_cumulative": delta_cumulative,
        "eps_central_total": cumulative[str(windows)],
        "cumulative": cumulative,
        "basic_composition": windows * per_window_at_split,
        "local_composition": windows * report["epsilon_local"] * window.channels,
        "method": method,
        "crowd_count": None,
    }
    if charges:
        only = WindowRelease(None, None, 0, approx_epsilon=0.0, approx_delta=0.0, **count)
        eps_count, delta_count, _ = compose_with_delta([only] * windows, delta, interval)
        out["crowd_count"] = {"charges": charges, "sigma": count["count_sigma"],
                              "threshold": count["count_threshold"], "epsilon_year": epsilon_year,
                              "delta_year": delta_year, "windows_per_year": windows_per_year(window_seconds),
                              "eps_count_total": eps_count, "delta_count_total": delta_count}
    return out


def format_windows_report(block: dict[str, Any]) -> str:
    """Text lines of ``windows_report``'s dict (appended to the single-window report)."""
    count = block["crowd_count"]
    crowd = ("crowd count not charged: it does not change between replacement neighbours" if count is None else
             f"crowd count charged {count['charges']}x per window: discrete Gaussian sigma={count['sigma']:.4g}, "
             f"T={count['threshold']}, sized for eps={count['epsilon_year']:g} over "
             f"{count['windows_per_year']} windows")
    lines = [
        f"windows          {block['windows']} releases of the same population; notion: {block['notion']}",
        f"  count          {crowd}",
        f"total epsilon    {block['eps_central_total']:.6g} at total delta {block['delta_cumulative']:.4g}  "
        f"[{block['method']}]",
        "  after windows  " + ", ".join(f"{w}: {v:.4g}" for w, v in block["cumulative"].items()),
        f"  basic          {block['basic_composition']:.6g}  (W x per-window eps at delta/W)",
        f"  local only     {block['local_composition']:.6g}  (W x eps_local, no shuffling)",
    ]
    if count is not None:
        lines.insert(2, f"  count alone    {count['eps_count_total']:.6g} at delta {count['delta_count_total']:.4g}")
    return "\n".join(lines)
