"""The analyst's privacy odometer: what every released window of one population has cost, in total.

A client that reports hourly for a year is in 8,760 releases; each window's eps_central is the cost of that
window alone. The odometer composes them by privacy loss distributions (``shuffle_pld``: the per-window
curve is exactly the tight shuffle bound's, and each window's crowd count is composed alongside), then
reads the total epsilon at the total delta. Composition by PLDs is the tightest general method available
(it is exact for the dominating pairs up to a pessimistic discretisation) and handles heterogeneous windows
(different n, mechanisms, crowd parameters) without splitting delta.

Mechanisms whose per-window guarantee comes from their own accountant (``rappor``, ``rappor_fragments``,
multi-message protocols, ``vector_sum``) enter as ``WindowRelease.approximate(eps, delta)``: the PLD of the
canonical (eps, delta) pair, which dominates *every* (eps, delta)-DP mechanism, so composing it is the
optimal composition of their (eps, delta) ledgers (Kairouz, Oh and Viswanath 2015), valid but looser than a
mechanism-specific PLD. ``PrivacyOdometer.method`` says which was used.

A window whose exact PLD is too large to build (``shuffle_pld.MAX_POINTS``: very large crowds at small
eps_local) enters either as the canonical pair of its tight single-window bound (eps_c(delta_w), delta_w),
which the tight bound certifies, with delta_w = s delta_total / (G k) for k such windows in each of G such
groups and a few fixed shares s, or as the exact PLD of the largest crowd on the client grid that fits
(``capped_clients``: fewer clients never certify more privacy, see below); the smallest of these totals is
published (each is a valid guarantee; the choice does not look at data; labelled in ``method``).

Windows are grouped: ``n_clients`` is rounded *down* to a 2% geometric grid before the PLD is built.
That is conservative because the shuffle bound's pair for n + 1 users is the pair for n users plus one more
independent blanket report, a post-processing, so fewer users never certify more privacy; it costs at most
2% of n (measured at the demo setting: +0.37% of the total after 365 windows, +0.38% after 8,760) and lets a
year of windows share a handful of PLDs.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import asdict

from dp_accounting.pld import privacy_loss_distribution as pld_lib

from ._checks import check_delta
from .shuffle_pld import DEFAULT_INTERVAL, PLDTooLargeError
from .window_release import (
    CLIENT_GRID,
    WindowRelease,
    _components,
    _is_count,
    capped_clients,
    quantize_clients,
    reports_pld,
    window_pld,
)

MAX_INTERVAL = 0.01  # the coarsest PLD grid the odometer accepts (at most one step of pessimism per window)

__all__ = ["CLIENT_GRID", "PrivacyOdometer", "WindowRelease", "capped_clients", "compose_releases",
           "compose_with_delta", "cumulative_epsilon", "infinity_mass", "interval_for", "quantize_clients",
           "reports_pld", "window_pld"]

FALLBACK_SHARES = (0.5, 0.9, 0.99)  # shares of delta_total tried for the too-large windows' own deltas
METHOD_FALLBACK = ("; windows too large for an exact PLD as the canonical pair of their tight bound (a share of "
                   "delta_total split over them) or as the exact PLD of the largest crowd that fits, whichever "
                   "total is smaller")
METHOD_PLD = ("pld: tight shuffle bound per window (the blanket pair where the mechanism declares one and it is "
              "smaller, else the generic clone pair), composed by privacy loss distributions")
METHOD_MIXED = ("pld: tight shuffle bound per window where available; (eps, delta) windows as the canonical "
                "(eps, delta) pair (optimal composition of their ledgers)")


class PrivacyOdometer:
    """Running total of one population's releases, incremental and independent of release order.

    Equal windows form a group (``WindowRelease.group_key``); a group of k windows is always the FFT
    self-composition base^k of its window's PLD, and the total is the composition of the groups in sorted key
    order. So the state is a function of the multiset of releases only (a crash that reorders releases
    publishes the same numbers), and ``add`` costs one self-composition of the changed group plus one
    composition per other group (the 2% client grid keeps groups few): independent of how many windows came
    before, except through the composed distribution's support. ``compositions`` counts these calls.

    delta: the total is read at ``delta_total`` plus the composition's infinite-loss mass
    (``delta_cumulative``): the mass each window really puts on infinite loss (a crowd count's top outcome,
    an (eps, delta) window's delta), never a per-window allowance.
    """

    def __init__(self, delta_total: float, interval: float = DEFAULT_INTERVAL) -> None:
        self.delta_total = check_delta("delta_total", delta_total)
        self.interval = float(interval)
        if not 0.0 < self.interval <= MAX_INTERVAL:
            raise ValueError(f"interval must be in (0, {MAX_INTERVAL}], got {interval!r}")
        self.releases: list[WindowRelease] = []
        self._groups: dict[tuple, list] = {}  # key -> [count, base PLD, composed PLD or None, member, too large]
        self._total: tuple[float, float] | None = None  # (epsilon, delta_cumulative), None when stale
        # The groups' composition as a balanced tree over the sorted keys: a changed group recomposes only the
        # nodes above it (log2 of the groups), not every group again (the cost per release then stays flat
        # with many size groups, e.g. small windows). Rebuilt from scratch when a new key changes the order.
        self._order: list[tuple] = []
        self._nodes: dict[tuple[int, int], pld_lib.PrivacyLossDistribution | None] = {}
        self._stale: set[tuple] = set()
        self.compositions = 0

    @property
    def method(self) -> str:
        approx = any(r.approx_epsilon is not None for r in self.releases)
        fallback = any(group[4] for group in self._groups.values())
        return (METHOD_MIXED if approx else METHOD_PLD) + (METHOD_FALLBACK if fallback else "")

    def add(self, release: WindowRelease) -> float:
        """Record one more window and return the cumulative epsilon of everything released so far."""
        self.record(release)
        return self.epsilon

    def extend(self, releases: Sequence[WindowRelease]) -> float:
        """Record many windows at once (each group composed once)."""
        for release in releases:
            self.record(release)
        return self.epsilon

    def record(self, release: WindowRelease) -> None:
        """Record a window without reading the total (``add`` reads it)."""
        if not isinstance(release, WindowRelease):
            raise TypeError(f"expected a WindowRelease, got {type(release).__name__}")
        self.releases.append(release)
        for part in _components(release):
            key = part.group_key()
            group = self._groups.get(key)
            if group is None:
                group = self._groups[key] = [0, None, None, part, False]
                try:
                    group[1] = window_pld(part, self.interval, reference_delta=self.delta_total)
                except PLDTooLargeError:
                    group[4] = True
            group[0] += 1
            group[2] = None
            self._stale.add(key)
        self._total = None

    def _composed(self, group: list) -> pld_lib.PrivacyLossDistribution | None:
        if group[2] is None and group[1] is not None:
            self.compositions += 1
            group[2] = group[1] if group[0] == 1 else group[1].self_compose(group[0])
        return group[2]

    def _exact(self, counts_only: bool = False) -> pld_lib.PrivacyLossDistribution | None:
        if counts_only:  # the counts' part alone (one group in practice): folded directly
            total = None
            for key in sorted(self._groups, key=repr):
                group = self._groups[key]
                composed = None if group[4] or not _is_count(group[3]) else self._composed(group)
                if composed is not None:
                    total = composed if total is None else total.compose(composed)
            return total
        order = sorted(self._groups, key=repr)
        if order != self._order:
            self._order, self._nodes = order, {}
        else:
            for key in self._stale:  # drop the cached nodes on the path of every changed group
                i, lo, hi = order.index(key), 0, len(order)
                while hi - lo > 1:
                    self._nodes.pop((lo, hi), None)
                    mid = (lo + hi) // 2
                    lo, hi = (lo, mid) if i < mid else (mid, hi)
        self._stale = set()
        return self._fold(0, len(order)) if order else None

    def _fold(self, lo: int, hi: int) -> pld_lib.PrivacyLossDistribution | None:
        """The composition of groups ``order[lo:hi]`` (cached per node; leaves are the groups' own)."""
        if hi - lo == 1:
            group = self._groups[self._order[lo]]
            return None if group[4] else self._composed(group)
        if (lo, hi) not in self._nodes:
            mid = (lo + hi) // 2
            left, right = self._fold(lo, mid), self._fold(mid, hi)
            if left is not None and right is not None:
                self.compositions += 1
            self._nodes[(lo, hi)] = right if left is None else left if right is None else left.compose(right)
        return self._nodes[(lo, hi)]

    def _read(self) -> tuple[float, float]:
        if self._total is not None:
            return self._total
        exact = self._exact()
        too_large = [group for group in self._groups.values() if group[4]]
        if not too_large:
            self._total = _read_total(exact, self.delta_total)
            return self._total
        best = (math.inf, self.delta_total)
        for share in FALLBACK_SHARES:
            total = exact
            for group in too_large:
                count, member = group[0], group[3]
                delta_w = share * self.delta_total / (len(too_large) * count)
                base = window_pld(member, self.interval, fallback_delta=delta_w)
                composed = base if count == 1 else base.self_compose(count)
                total = composed if total is None else total.compose(composed)
            eps = float(total.get_epsilon_for_delta(self.delta_total))  # pairs' deltas inside delta_total
            best = min(best, (eps, self.delta_total))
        capped, complete = exact, True  # every too-large window as the exact PLD of the largest crowd that fits
        for group in too_large:
            count, member = group[0], group[3]
            fit = capped_clients(member, self.interval)
            if fit < 2:
                complete = False
                break
            base = window_pld(dataclasses.replace(member, n_clients=fit), self.interval)
            composed = base if count == 1 else base.self_compose(count)
            capped = composed if capped is None else capped.compose(composed)
        if complete and capped is not None:  # read inside delta_total, like the pairs
            best = min(best, (float(capped.get_epsilon_for_delta(self.delta_total)), self.delta_total))
        self._total = best
        return best

    @property
    def epsilon(self) -> float:
        """Cumulative epsilon at ``delta_cumulative`` (0 before any release).

        Too-large groups (``method``) get a share of delta_total split evenly over their windows; the best
        of a few fixed shares is returned (each is a valid guarantee, and the choice does not look at data).
        """
        return self._read()[0]

    def epsilon_within(self, delta: float) -> float:
        """Cumulative epsilon with everything, infinite-loss mass included, inside ``delta`` (a plan's fixed
        total budget); inf when that mass alone exceeds it. Windows too large for an exact PLD: ``epsilon``."""
        if any(group[4] for group in self._groups.values()):
            return self.epsilon
        exact = self._exact()
        if exact is None:
            return 0.0
        return math.inf if infinity_mass(exact) >= delta else float(exact.get_epsilon_for_delta(delta))

    @property
    def count_epsilon(self) -> float:
        """The yearly-designed counts' part alone, read like ``epsilon`` (0 if no count was charged)."""
        return _read_total(self._exact(counts_only=True), self.delta_total)[0]

    @property
    def delta_cumulative(self) -> float:
        """The delta ``epsilon`` holds at: delta_total plus the composition's infinite-loss mass."""
        return self._read()[1]

    def to_json(self) -> str:
        """The ledger: delta_total, the loss grid and every release, in order."""
        return json.dumps({"delta_total": self.delta_total, "interval": self.interval,
                           "releases": [asdict(r) for r in self.releases]})

    @classmethod
    def from_json(cls, text: str) -> PrivacyOdometer:
        """Rebuild an odometer (state included) from ``to_json``'s output."""
        doc = json.loads(text)
        odometer = cls(doc["delta_total"], doc.get("interval", DEFAULT_INTERVAL))
        odometer.extend([WindowRelease(**r) for r in doc["releases"]])
        return odometer


def infinity_mass(pld: pld_lib.PrivacyLossDistribution) -> float:
    """The larger of the two directions' mass on infinite loss (hockey-stick divergence at eps = inf)."""
    masses = [pld._pmf_remove._infinity_mass]  # dp_accounting exposes no accessor
    if pld._pmf_add is not None:
        masses.append(pld._pmf_add._infinity_mass)
    return float(max(masses))


def _read_total(pld: pld_lib.PrivacyLossDistribution | None, delta: float) -> tuple[float, float]:
    """(epsilon, delta_cumulative) of a composed PLD: read at delta plus its own infinite-loss mass."""
    if pld is None:
        return 0.0, delta
    total_delta = delta + infinity_mass(pld)
    return float(pld.get_epsilon_for_delta(total_delta)), total_delta


def interval_for(scale: float) -> float:
    """The PLD grid of a population whose largest per-window epsilon is ``scale``: 1e-3 of it, never finer
    than 1e-5 and never coarser than ``MAX_INTERVAL``, the coarsest grid the odometer accepts (a window of
    epsilon above 10, such as the grid demo's 16, asked for a coarser one, and every release of its
    population then failed). Pessimistic rounding costs at most one grid step per window, so the total
    stays within 0.1% of finer grids while the composed support stays bounded. One rule for ``esa privacy``,
    ``esa plan`` and the analyzer's ledger, so the three agree to the digit."""
    return min(MAX_INTERVAL, max(DEFAULT_INTERVAL, 1e-3 * scale)) if math.isfinite(scale) else DEFAULT_INTERVAL


def compose_releases(releases: Sequence[WindowRelease], delta_total: float,
                     interval: float = DEFAULT_INTERVAL) -> tuple[float, str]:
    """(cumulative epsilon, method) of ``releases`` at ``delta_total`` plus their infinite-loss mass."""
    odometer = PrivacyOdometer(delta_total, interval)
    epsilon = odometer.extend(list(releases))
    return epsilon, odometer.method


def compose_with_delta(releases: Sequence[WindowRelease], delta_total: float,
                       interval: float = DEFAULT_INTERVAL) -> tuple[float, float, str]:
    """(cumulative epsilon, the delta it holds at, method): the one accountant of ``esa privacy``/``esa plan``
    and the analyzer's ledger."""
    odometer = PrivacyOdometer(delta_total, interval)
    epsilon = odometer.extend(list(releases))
    return epsilon, odometer.delta_cumulative, odometer.method


def cumulative_epsilon(releases: Sequence[WindowRelease], delta_total: float,
                       interval: float = DEFAULT_INTERVAL) -> float:
    """Cumulative central epsilon of all ``releases`` of one population at total ``delta_total``."""
    return compose_releases(releases, delta_total, interval)[0]
