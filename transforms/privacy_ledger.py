"""The analyst's odometer: each estimate row carries the population's cumulative epsilon across windows.

A population is one (spec, crowd id): the same devices report in every window, so their privacy loss
composes across windows. The per-window curve is the project's tight shuffle bound for the clients
actually released (plus the crowd threshold's own noisy count); windows are composed by privacy loss
distributions (``transforms.privacy.odometer``). The accounting parameters of every release are kept in
the analyst's ledger entry, so the running total is recomputed from the ledger and never depends on
process memory.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from transforms.spec import AnalysisSpec


def accounting_of(spec: AnalysisSpec, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the odometer needs of one window's release (JSON-safe, stored in the analyst's ledger)."""
    mechanism = spec.randomizer
    n = int(rows[0]["n_clients"]) if rows else 0
    own = callable(getattr(mechanism, "epsilon_central", None)) or spec.max_reports_per_client > 1 \
        or not math.isfinite(float(mechanism.epsilon_local))
    return {"mechanism": mechanism.name, "own_accountant": bool(own),
            "mixture_alpha": None if own else float(mechanism.mixture_alpha),
            "eps_local": None if own else float(mechanism.epsilon_local), "n_clients": n,
            "eps_central": float(rows[0]["eps_central"]) if rows else None, "delta": float(spec.delta),
            "crowd_epsilon": float(spec.crowd.epsilon), "crowd_delta": float(spec.crowd.delta)}


def with_cumulative_epsilon(spec: AnalysisSpec, rows: list[dict[str, Any]], population: Iterable[Any],
                            upto_window_end_ms: int) -> list[dict[str, Any]]:
    """Rows with ``eps_central_cumulative`` and ``windows_composed`` over the population's releases so far."""
    releases = sorted((e for e in population if e.key.window_end_ms <= upto_window_end_ms),
                      key=lambda e: e.key.window_end_ms)
    accounts = [e.extra["accounting"] for e in releases if "accounting" in e.extra]
    delta = cumulative_delta(spec, accounts)
    total = cumulative_for_spec(spec, accounts, delta)
    return [{**row, "eps_central_cumulative": total, "windows_composed": len(accounts), "delta_cumulative": delta}
            for row in rows]


def cumulative_delta(spec: AnalysisSpec, accounts: list[dict[str, Any]]) -> float:
    """The delta the cumulative epsilon is read at: the spec's delta plus every window's own delta terms.

    Each window's crowd count fails its pure guarantee with probability up to its crowd delta (001
    Algorithm 3), and a window known only by (eps, delta) brings its delta: W such terms cannot fit in a
    fixed total, so the total grows with them and is published beside the epsilon.
    """
    extra = sum(float(a.get("crowd_delta") or 0.0) + (float(a["delta"]) if a.get("own_accountant") else 0.0)
                for a in accounts)
    return float(spec.delta) + extra


def window_release(account: dict[str, Any]) -> Any:
    """One ledger account -> the odometer's ``WindowRelease`` (shuffle parameters, or (eps, delta) for
    mechanisms that carry their own accountant)."""
    from transforms.privacy.odometer import WindowRelease

    crowd = (account["crowd_epsilon"], account["crowd_delta"])
    if account.get("own_accountant"):
        return WindowRelease.approximate(account["eps_central"], account["delta"], account["n_clients"], *crowd)
    return WindowRelease(account["mixture_alpha"], account["eps_local"], account["n_clients"], *crowd)


MAX_INTERVAL = 0.01  # transforms.privacy.odometer.PrivacyOdometer refuses coarser grids


def composition_interval(accounts: list[dict[str, Any]]) -> float:
    """The PLD grid for this population: 1e-3 of the largest per-window loss scale, never finer than 1e-5 and
    never coarser than ``MAX_INTERVAL`` (the odometer's limit: a window of epsilon above 10, such as a grid
    spec's, used to ask for a coarser grid and made every release of the population fail).

    Pessimistic rounding costs at most one grid step per window, so the total stays within 0.1% of what
    finer grids give, while the support of the composed distribution (and the memory and time of each
    release) no longer grows with windows of large per-window epsilon such as the crowd count's.
    """
    from transforms.privacy.shuffle_pld import DEFAULT_INTERVAL

    scale = max([float(a.get("crowd_epsilon") or 0.0) for a in accounts]
                + [float(a.get("eps_central") or 0.0) for a in accounts if a.get("eps_central") is not None]
                + [0.0])
    return min(MAX_INTERVAL, max(DEFAULT_INTERVAL, 1e-3 * scale)) if math.isfinite(scale) else DEFAULT_INTERVAL


def cumulative_for_spec(spec: AnalysisSpec, accounts: list[dict[str, Any]], delta: float) -> float | None:
    """The population's cumulative epsilon at ``delta``; None before any release."""
    from transforms.privacy.odometer import cumulative_epsilon

    if not accounts:
        return None
    if any(a.get("own_accountant") and not _finite(a.get("eps_central")) for a in accounts):
        # A window without a finite guarantee (e.g. a multi-message crowd far below its calibrated size)
        # leaves the composition unbounded too; the odometer says so instead of failing the release.
        return math.inf
    return float(cumulative_epsilon([window_release(a) for a in accounts], delta, composition_interval(accounts)))


def _finite(value: Any) -> bool:
    return value is not None and math.isfinite(float(value))
