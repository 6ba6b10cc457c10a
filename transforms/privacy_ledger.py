"""The analyst's odometer: each estimate row carries the population's cumulative epsilon across windows.

A population is one (spec, crowd id): the same devices report in every window, so their privacy loss
composes across windows. The per-window curve is the project's tight shuffle bound for the clients
actually released (plus the crowd threshold's own noisy count); windows are composed by privacy loss
distributions (``transforms.privacy.odometer``). The accounting parameters of every release are kept in
the analyst's ledger entry, so the running total is recomputed from the ledger and never depends on
process memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from transforms.spec import AnalysisSpec


def accounting_of(spec: AnalysisSpec, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the odometer needs of one window's release (JSON-safe, stored in the analyst's ledger)."""
    mechanism = spec.randomizer
    n = int(rows[0]["n_clients"]) if rows else 0
    return {"mechanism": mechanism.name, "mixture_alpha": float(getattr(mechanism, "mixture_alpha", 1.0)),
            "eps_local": float(mechanism.epsilon_local), "n_clients": n,
            "eps_central": float(rows[0]["eps_central"]) if rows else None,
            "crowd_epsilon": float(spec.crowd.epsilon), "crowd_delta": float(spec.crowd.delta)}


def with_cumulative_epsilon(spec: AnalysisSpec, rows: list[dict[str, Any]], population: Iterable[Any],
                            upto_window_end_ms: int) -> list[dict[str, Any]]:
    """Rows with ``eps_central_cumulative`` and ``windows_composed`` over the population's releases so far."""
    from transforms.privacy.odometer import cumulative_for_spec

    releases = sorted((e for e in population if e.key.window_end_ms <= upto_window_end_ms),
                      key=lambda e: e.key.window_end_ms)
    accounts = [e.extra["accounting"] for e in releases if "accounting" in e.extra]
    total = cumulative_for_spec(spec, accounts)
    return [{**row, "eps_central_cumulative": total, "windows_composed": len(accounts)} for row in rows]
