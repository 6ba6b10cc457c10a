"""The analyst's odometer: each estimate row carries the population's cumulative epsilon across windows.

A population is one (metric, crowd id): the same devices report in every window whatever edits the spec
went through (a new lateness or crowd parameter is a new spec hash, not new devices), so their privacy loss
composes across all of the metric's specs. The per-window curve is the tight shuffle bound for the clients
actually released, plus the crowd count where the spec's neighbouring notion makes it cost
(``transforms.privacy.crowd_count``: a partition or membership claim; under plain replacement the count
does not change between neighbours and is not charged). Windows are composed by privacy loss distributions
(``transforms.privacy.odometer``); under a claim, windows the shuffler withheld are charged their count too
(counted from the window grid between the population's first release and this one, since the analyzer never
receives them). Every release's typed privacy event (``transforms.privacy.events``) is kept in its ledger
entry, so the total is rebuilt from the ledger after a restart; within a run it is carried forward incrementally.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable
from typing import Any

from transforms.privacy.events import NeighbouringRelation, WindowEvent, window_event
from transforms.privacy.odometer import PrivacyOdometer, WindowRelease, interval_for
from transforms.spec import AnalysisSpec


def event_of(spec: AnalysisSpec, rows: list[dict[str, Any]]) -> WindowEvent:
    """The privacy event of one window's release (stored in the analyst's ledger): built from the spec's
    mechanism as the rows' ``eps_central`` was (``events.window_event``), with the rows' figure and bound, which
    ``events.central_epsilon`` computed (``estimates.central_epsilon_bound``): nothing is computed twice."""
    n = int(rows[0]["n_clients"]) if rows else 0
    eps = float(rows[0]["eps_central"]) if rows else None
    design = spec.crowd.count_design(spec.window_seconds)
    event = window_event(spec.randomizer, n, float(spec.delta), spec.max_reports_per_client,
                         NeighbouringRelation(spec.crowd.notion), own_epsilon=eps, metric=spec.metric,
                         window_seconds=spec.window_seconds, count_charges=spec.crowd.charges,
                         count_sigma=None if design is None else design[0],
                         count_threshold=None if design is None else design[1])
    return dataclasses.replace(event, eps_central=eps, bound=_bound_of(rows))


def _bound_of(rows: list[dict[str, Any]]) -> str | None:
    """The bound the rows' eps_central came from (``estimates.central_epsilon_bound``), as the row states it."""
    parameters = rows[0].get("parameters") if rows else None
    return json.loads(parameters).get("eps_central_bound") if isinstance(parameters, str) else None


def metric_of(entry: Any) -> str:
    """The metric of a ledger entry (entries written before the metric was stored: the spec's name)."""
    metric = entry.event.metric if entry.event is not None else None
    return str(metric or entry.key.spec_id.split("@", 1)[0])


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


def composition_interval(events: list[WindowEvent]) -> float:
    """The population's PLD grid (``odometer.interval_for`` of its largest per-window loss scale)."""
    scale = max([float(e.legacy_count[0]) for e in events if e.count_charges is None and e.legacy_count]
                + [float(e.eps_central) for e in events if e.eps_central is not None]
                + [0.0])
    return interval_for(scale)


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
                           and e.event is not None), key=lambda e: (e.key.window_end_ms, e.key.spec_id))
        accounts = [e.event for e in releases]
        extra = {"notion": spec.crowd.notion, "eps_count_cumulative": None}
        if not accounts:
            return [{**row, "eps_central_cumulative": None, "windows_composed": 0,
                     "delta_cumulative": float(spec.delta), **extra} for row in rows]
        if not all(a.finite for a in accounts):
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
            odometer.record(entry.event.to_release(charge_legacy))
        for _ in range(withheld - held_withheld):
            odometer.record(count_only)
        self._state[state_key] = (odometer, keys, withheld)
        return odometer


def with_cumulative_epsilon(spec: AnalysisSpec, rows: list[dict[str, Any]], population: Iterable[Any],
                            upto_window_end_ms: int, odometers: Odometers | None = None) -> list[dict[str, Any]]:
    """Rows with the population's odometer columns over its releases up to ``upto_window_end_ms``."""
    return (odometers or Odometers()).rows(spec, rows, population, upto_window_end_ms)


def cumulative_for_spec(spec: AnalysisSpec, events: list[WindowEvent], delta: float) -> float | None:
    """The cumulative epsilon of ``events`` at ``delta`` (plus their infinite-loss mass); None if empty."""
    if not events:
        return None
    if not all(e.finite for e in events):
        return math.inf
    odometer = PrivacyOdometer(delta, composition_interval(events))
    return odometer.extend([e.to_release(spec.crowd.charges > 0) for e in events])
