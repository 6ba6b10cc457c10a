"""``esa privacy --windows W``: what W releases of the same population cost in total, before collection.

Each window releases the shuffled reports of the population (one report per client per window) and, if
``crowd_epsilon``/``crowd_delta`` are given, the crowd threshold's noisy count. The total is the composition
of all of them by privacy loss distributions (``odometer``), read at the report's delta as the *total* delta.
Beside it: the cumulative value after 1, 10, 30, 365 and 8,760 windows (those <= W) and basic composition
(W times the per-window value at delta / W), which the PLD total never exceeds.

For ``rappor``/``rappor_fragments`` a window is the two changed channels (replacement DP, as in their
``eps_central``), so it enters as two copies of the channel's pair.
"""

from __future__ import annotations

from typing import Any

from ._checks import check_delta, check_epsilon, check_int
from .odometer import WindowRelease, compose_releases

__all__ = ["MILESTONES", "format_windows_report", "windows_report"]

MILESTONES: tuple[int, ...] = (1, 10, 30, 365, 8760)


def _window(report: dict[str, Any], crowd_epsilon: float | None, crowd_delta: float | None) -> list[WindowRelease]:
    alpha, n = report["alpha"], report["n"]
    if report["mechanism"] in ("rappor", "rappor_fragments"):
        eps = report["epsilon_local"]  # removal budget of one channel (eps(tau) for the fragment tuple)
        return [WindowRelease(alpha, eps, n, crowd_epsilon, crowd_delta), WindowRelease(alpha, eps, n)]
    return [WindowRelease(alpha, report["epsilon_local"], n, crowd_epsilon, crowd_delta)]


def windows_report(report: dict[str, Any], windows: int, crowd_epsilon: float | None = None,
                   crowd_delta: float | None = None) -> dict[str, Any]:
    """The composition over ``windows`` windows of the single-window ``report`` (``build_privacy_report``)."""
    windows = check_int("windows", windows, 1)
    if (crowd_epsilon is None) != (crowd_delta is None):
        raise ValueError("crowd_epsilon and crowd_delta must be given together")
    if crowd_epsilon is not None:
        check_epsilon("crowd_epsilon", crowd_epsilon)
        check_delta("crowd_delta", crowd_delta)
    delta = report["delta"]
    window = _window(report, crowd_epsilon, crowd_delta)
    cumulative = {}
    method = ""
    for w in sorted({m for m in MILESTONES if m <= windows} | {windows}):
        cumulative[str(w)], method = compose_releases(window * w, delta)
    per_window_at_split, _ = compose_releases(window, delta / windows)
    return {
        "windows": windows,
        "delta_total": delta,
        "crowd_epsilon": crowd_epsilon,
        "crowd_delta": crowd_delta,
        "eps_central_total": cumulative[str(windows)],
        "cumulative": cumulative,
        "basic_composition": windows * per_window_at_split,
        "local_composition": windows * report["epsilon_local"] * (2 if len(window) == 2 else 1),
        "method": method,
    }


def format_windows_report(block: dict[str, Any]) -> str:
    """Text lines of ``windows_report``'s dict (appended to the single-window report)."""
    crowd = ("no crowd count" if block["crowd_epsilon"] is None else
             f"crowd count eps_cr={block['crowd_epsilon']:g}, delta_cr={block['crowd_delta']:g} per window")
    lines = [
        f"windows          {block['windows']} releases of the same population ({crowd})",
        f"total epsilon    {block['eps_central_total']:.6g} at total delta {block['delta_total']:g}  "
        f"[{block['method']}]",
        "  after windows  " + ", ".join(f"{w}: {v:.4g}" for w, v in block["cumulative"].items()),
        f"  basic          {block['basic_composition']:.6g}  (W x per-window eps at delta/W)",
        f"  local only     {block['local_composition']:.6g}  (W x eps_local, no shuffling)",
    ]
    return "\n".join(lines)
