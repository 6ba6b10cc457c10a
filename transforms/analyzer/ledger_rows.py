"""The analyst's odometer: each estimate row carries the population's cumulative epsilon across windows.

A population is one (metric, crowd id): the same devices report in every window whatever edits the spec
went through (a new lateness or crowd parameter is a new spec hash, not new devices), so their privacy loss
composes across all of the metric's specs. The per-window curve is the tight shuffle bound for the clients
actually released, plus the crowd count where the spec's neighbouring notion makes it cost
(``transforms.privacy.crowd_count``: a partition or membership claim; under plain replacement the count
does not change between neighbours and is not charged). Windows are composed by privacy loss distributions
(``transforms.privacy.odometer``); under a claim, windows the shuffler withheld are charged their count too
(counted from the window grid between the population's first release and this one, since the analyzer never
receives them). The accounting parameters of every release are kept in its ledger entry, so the total is
rebuilt from the ledger after a restart; within a run it is carried forward incrementally.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

from transforms.privacy.odometer import PrivacyOdometer, WindowRelease, interval_for
from transforms.spec import AnalysisSpec


def accounting_of(spec: AnalysisSpec, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the odometer needs of one window's release (JSON-safe, stored in the analyst's ledger)."""
    mechanism = spec.randomizer
    n = int(rows[0]["n_clients"]) if rows else 0
    # Unary encodings (rappor, rappor_fragments) are two changed channels of a binary randomizer each: their
    # exact pair, not their (eps, delta) ledger, so their delta does not pile up window after window.
    channels = 2 if mechanism.epsilon_replacement is not None else 1
    own = (mechanism.accounts_central and channels == 1) \
        or spec.max_reports_per_client > 1 or not math.isfinite(float(mechanism.epsilon_local))
    design = spec.crowd.count_design(spec.window_seconds)
    dec = None if own or channels != 1 else mechanism.blanket_decomposition()
    return {"mechanism": mechanism.name, "own_accountant": bool(own), "metric": spec.metric,
            "mixture_alpha": None if own else float(mechanism.mixture_alpha),
            "eps_local": None if own else float(mechanism.epsilon_local), "n_clients": n,
            "eps_central": float(rows[0]["eps_central"]) if rows else None, "delta": float(spec.delta),
            "notion": spec.crowd.notion, "count_charges": spec.crowd.charges,
            "count_sigma": None if design is None else design[0],
            "count_threshold": None if design is None else design[1],
            "window_seconds": spec.window_seconds, "channels": channels,
            "blanket": None if dec is None else list(dec.as_tuple()),
            "eps_central_bound": _bound_of(rows)}


def _bound_of(rows: list[dict[str, Any]]) -> str | None:
    """The bound the rows' eps_central came from (``estimates.central_epsilon_bound``), as the row states it."""
    parameters = rows[0].get("parameters") if rows else None
    return json.loads(parameters).get("eps_central_bound") if isinstance(parameters, str) else None


def metric_of(entry: Any) -> str:
    """The metric of a ledger entry (entries written before the metric was stored: the spec's name)."""
    account = entry.extra.get("accounting") or {}
    return str(account.get("metric") or entry.key.spec_id.split("@", 1)[0])


def window_release(account: dict[str, Any], charge_legacy_count: bool = False) -> WindowRelease:
    """One ledger account -> the odometer's ``WindowRelease`` (shuffle parameters, or (eps, delta) for
    mechanisms that carry their own accountant), its crowd count charged as the account says. An account
    from before the yearly count design carries a per-window Laplace count, charged only under a claim."""
    crowd: tuple[Any, Any] = (None, None)
    if "count_charges" not in account and charge_legacy_count and account.get("crowd_epsilon") is not None:
        crowd = (account["crowd_epsilon"], account["crowd_delta"])
    count = {"count_sigma": account.get("count_sigma"), "count_threshold": account.get("count_threshold"),
             "count_charges": int(account.get("count_charges") or 0)}
    if account.get("own_accountant"):
        return WindowRelease(None, None, account["n_clients"], *crowd, float(account["eps_central"]),
                             float(account["delta"]), **count)
    return WindowRelease(account["mixture_alpha"], account["eps_local"], account["n_clients"], *crowd, **count,
                         channels=int(account.get("channels") or 1), blanket=account.get("blanket"))


def withheld_release(spec: AnalysisSpec) -> WindowRelease | None:
    """A withheld window as the odometer sees it: no reports, the count only (None where the count is free)."""
    design = spec.crowd.count_design(spec.window_seconds)
    if design is None:
        return None
    return WindowRelease(None, None, 0, approx_epsilon=0.0, approx_delta=0.0, count_sigma=design[0],
                         count_threshold=design[1], count_charges=spec.crowd.charges)


def withheld_windows(spec: AnalysisSpec, ends: list[int], upto_window_end_ms: int) -> int:
    """Window slots between the population's first release and ``upto`` that released nothing."""
    if not ends:
        return 0
    step = spec.window_seconds * 1000
    slots = (upto_window_end_ms - min(ends)) // step + 1
    return max(0, int(slots) - len(ends))


def composition_interval(accounts: list[dict[str, Any]]) -> float:
    """The population's PLD grid (``odometer.interval_for`` of its largest per-window loss scale)."""
    scale = max([float(a.get("crowd_epsilon") or 0.0) for a in accounts if "count_charges" not in a]
                + [float(a.get("eps_central") or 0.0) for a in accounts if a.get("eps_central") is not None]
                + [0.0])
    return interval_for(scale)


def _finite(value: Any) -> bool:
    return value is not None and math.isfinite(float(value))


class Odometers:
    """The odometers of the populations one analyzer run releases, carried from release to release.

    A row's total is a function of the set of releases of its population with window end <= the row's
    (and of the withheld slots among them), never of the order they were sealed in: a release that extends
    the carried set is added (one group update), anything else (a late window, a new grid) rebuilds.
    """

    def __init__(self) -> None:
        self._state: dict[tuple, tuple[PrivacyOdometer, frozenset, int]] = {}
        self.rebuilds = 0

    def rows(self, spec: AnalysisSpec, rows: list[dict[str, Any]], population: Iterable[Any],
             upto_window_end_ms: int) -> list[dict[str, Any]]:
        """Rows with ``eps_central_cumulative``, ``windows_composed``, ``delta_cumulative``, ``notion`` and
        ``eps_count_cumulative`` (the count's part alone; None where the count is not charged)."""
        releases = sorted((e for e in population if e.key.window_end_ms <= upto_window_end_ms
                           and "accounting" in e.extra), key=lambda e: (e.key.window_end_ms, e.key.spec_id))
        accounts = [e.extra["accounting"] for e in releases]
        extra = {"notion": spec.crowd.notion, "eps_count_cumulative": None}
        if not accounts:
            return [{**row, "eps_central_cumulative": None, "windows_composed": 0,
                     "delta_cumulative": float(spec.delta), **extra} for row in rows]
        if any(a.get("own_accountant") and not _finite(a.get("eps_central")) for a in accounts):
            # A window without a finite guarantee (e.g. a multi-message crowd far below its calibrated size)
            # leaves the composition unbounded too; the odometer says so instead of failing the release.
            return [{**row, "eps_central_cumulative": math.inf, "windows_composed": len(accounts),
                     "delta_cumulative": float(spec.delta), **extra} for row in rows]
        withheld = withheld_windows(spec, [e.key.window_end_ms for e in releases], upto_window_end_ms)
        count_only = withheld_release(spec)
        withheld = withheld if count_only is not None else 0
        keys = frozenset((e.key.spec_id, e.key.window_end_ms) for e in releases)
        charge_legacy = spec.crowd.charges > 0
        odometer = self._odometer(spec, releases, keys, withheld, count_only, composition_interval(accounts),
                                  charge_legacy, metric_of(releases[-1]), releases[-1].key.crowd_id)
        if spec.crowd.charges:
            extra["eps_count_cumulative"] = odometer.count_epsilon
        total = {"eps_central_cumulative": odometer.epsilon, "windows_composed": len(accounts) + withheld,
                 "delta_cumulative": odometer.delta_cumulative, **extra}
        return [{**row, **total} for row in rows]

    def _odometer(self, spec: AnalysisSpec, releases: list[Any], keys: frozenset, withheld: int,
                  count_only: WindowRelease | None, interval: float, charge_legacy: bool, metric: str,
                  crowd: str | None) -> PrivacyOdometer:
        """The population's odometer, carried forward when the set of releases only grew."""
        state_key = (metric, crowd, float(spec.delta), interval, charge_legacy)
        state = self._state.get(state_key)
        if state is not None and state[1] <= keys and state[2] <= withheld:
            odometer, held, held_withheld = state
            new = [e for e in releases if (e.key.spec_id, e.key.window_end_ms) not in held]
        else:
            self.rebuilds += 1
            odometer, held_withheld = PrivacyOdometer(float(spec.delta), interval), 0
            new = releases
        for entry in new:
            odometer.record(window_release(entry.extra["accounting"], charge_legacy))
        for _ in range(withheld - held_withheld):
            odometer.record(count_only)
        self._state[state_key] = (odometer, keys, withheld)
        return odometer


def with_cumulative_epsilon(spec: AnalysisSpec, rows: list[dict[str, Any]], population: Iterable[Any],
                            upto_window_end_ms: int, odometers: Odometers | None = None) -> list[dict[str, Any]]:
    """Rows with the population's odometer columns over its releases up to ``upto_window_end_ms``."""
    return (odometers or Odometers()).rows(spec, rows, population, upto_window_end_ms)


def cumulative_for_spec(spec: AnalysisSpec, accounts: list[dict[str, Any]], delta: float) -> float | None:
    """The cumulative epsilon of ``accounts`` at ``delta`` (plus their infinite-loss mass); None if empty."""
    if not accounts:
        return None
    if any(a.get("own_accountant") and not _finite(a.get("eps_central")) for a in accounts):
        return math.inf
    odometer = PrivacyOdometer(delta, composition_interval(accounts))
    return odometer.extend([window_release(a, spec.crowd.charges > 0) for a in accounts])
