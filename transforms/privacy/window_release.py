"""One window's release as the odometer sees it, and its privacy loss distribution (``odometer`` composes them).

Split from ``odometer``: the per-window half (what a release is, how its clients are rounded to the grid, which
pair's PLD it enters with); ``odometer`` keeps the running composition.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld.common import DifferentialPrivacyParameters

from ._checks import check_delta, check_epsilon, check_int
from .blanket_shuffle import BOUND_BLANKET, BlanketDecomposition, best_epsilon, blanket_pld_fits, blanket_shuffle_pld
from .shuffle_bound import check_mixture_alpha, epsilon_central
from .shuffle_pld import (
    DEFAULT_INTERVAL,
    PLDTooLargeError,
    count_pld,
    crowd_count_pld,
    pld_fits,
    shuffle_pld,
)

__all__ = ["CLIENT_GRID", "WindowRelease", "capped_clients", "quantize_clients", "reports_pld", "window_pld"]

@dataclass(frozen=True)
class WindowRelease:
    """One window's release of a population, as the odometer needs it.

    ``mechanism_alpha``/``eps_local``/``n_clients``: the shuffled reports (mixture parameter of the
    randomizer, its local epsilon, the number of clients actually released: after the crowd threshold).
    ``crowd_epsilon``/``crowd_delta``: a legacy per-window discrete Laplace count charged as two counts
    (ledgers written before the yearly design; None: not charged). ``count_sigma``/``count_threshold``/
    ``count_charges``: the yearly-designed discrete Gaussian count (``crowd_count``), charged
    ``count_charges`` times (0 under replacement with one crowd, where the count does not change).
    ``approx_epsilon``/``approx_delta``: instead of the shuffle parameters, a per-window (eps, delta)
    guarantee from a mechanism's own accountant. ``channels``: copies of the pair one replacement changes.
    """

    mechanism_alpha: float | None
    eps_local: float | None
    n_clients: int
    crowd_epsilon: float | None = None
    crowd_delta: float | None = None
    approx_epsilon: float | None = None
    approx_delta: float | None = None
    count_sigma: float | None = None
    count_threshold: int | None = None
    count_charges: int = 0
    channels: int = 1  # independent shuffled populations one replacement changes (unary encodings: 2)
    blanket: tuple[float, float, float, float, float] | None = None  # the mechanism's blanket decomposition

    def __post_init__(self) -> None:
        if self.blanket is not None:
            object.__setattr__(self, "blanket", tuple(float(v) for v in self.blanket))  # JSON gives a list
            BlanketDecomposition(*self.blanket)  # validated here, not in the middle of a composition
        check_int("n_clients", self.n_clients, 0)
        check_int("channels", self.channels, 1)
        check_int("count_charges", self.count_charges, 0)
        if self.count_charges and (self.count_sigma is None or self.count_threshold is None):
            raise ValueError("a charged count needs count_sigma and count_threshold")
        if (self.crowd_epsilon is None) != (self.crowd_delta is None):
            raise ValueError("crowd_epsilon and crowd_delta must be given together")
        if self.crowd_epsilon is not None:
            check_epsilon("crowd_epsilon", self.crowd_epsilon)
            check_delta("crowd_delta", self.crowd_delta)
        if self.approx_epsilon is not None:
            if self.mechanism_alpha is not None:
                raise ValueError("give either the shuffle parameters or (approx_epsilon, approx_delta), not both")
            check_epsilon("approx_epsilon", self.approx_epsilon, allow_zero=True)
            if self.approx_delta is None:
                raise ValueError("approx_epsilon needs approx_delta (0 for pure DP)")
            if not 0.0 <= float(self.approx_delta) < 1.0:
                raise ValueError(f"approx_delta must be in [0, 1), got {self.approx_delta!r}")
        elif self.mechanism_alpha is None or self.eps_local is None:
            raise ValueError("a release needs mechanism_alpha and eps_local, or approx_epsilon/approx_delta")
        else:
            check_mixture_alpha(self.mechanism_alpha, self.eps_local)

    @classmethod
    def approximate(cls, epsilon: float, delta: float, n_clients: int, crowd_epsilon: float | None = None,
                    crowd_delta: float | None = None) -> WindowRelease:
        """A window known only by its (epsilon, delta) (mechanisms with their own accountant)."""
        return cls(None, None, n_clients, crowd_epsilon, crowd_delta, float(epsilon), float(delta))

    def group_key(self) -> tuple:
        """Releases with equal keys have the same PLD (n rounded down, see ``quantize_clients``)."""
        n = self.n_clients if self.approx_epsilon is not None else quantize_clients(self.n_clients)
        return (self.mechanism_alpha, self.eps_local, n, self.crowd_epsilon, self.crowd_delta,
                self.approx_epsilon, self.approx_delta, self.count_sigma, self.count_threshold, self.count_charges,
                self.channels, self.blanket)


CLIENT_GRID = 1.02  # windows share a PLD when their client counts round down to the same point of this grid


def quantize_clients(n: int) -> int:
    """n rounded down to the geometric grid floor(1.02^k) (n below 100: exact).

    Conservative (fewer clients, less amplification) and at most 2% below n: measured at README's demo
    setting the composed total grows by 0.37% after 365 windows and 0.38% after 8,760 (docs/mathematics.md
    §1.4, "Cost per release"); in exchange the windows of a population, whose sizes wander by a few percent from
    hour to hour, share a handful of privacy loss distributions instead of one each (the analyzer's cost
    per release stays flat over months of windows instead of growing with every window released).
    """
    n = check_int("n", n, 0)
    if n < 100:
        return n
    k = math.floor(math.log(n) / math.log(CLIENT_GRID))
    while math.floor(CLIENT_GRID**k) > n:  # guard the float rounding of log
        k -= 1
    return max(math.floor(CLIENT_GRID**k), 100)


def capped_clients(release: WindowRelease, interval: float) -> int:
    """The largest client count on the grid of ``quantize_clients``, at most the release's, whose exact PLD fits
    ``shuffle_pld.MAX_POINTS`` (0 if not even 2 clients fit). Found by bisection on the grid; the result is
    verified to fit, so it is a valid stand-in (not always the very largest) if the count is not monotone."""
    n = quantize_clients(release.n_clients)
    grid = list(range(2, min(n, 99) + 1))
    k = math.ceil(math.log(100) / math.log(CLIENT_GRID))
    while (c := math.floor(CLIENT_GRID**k)) <= n:
        grid.append(c)
        k += 1

    def fits(c: int) -> bool:
        return pld_fits(c, release.mechanism_alpha, release.eps_local, interval)

    if not grid or not fits(grid[0]):
        return 0
    lo, hi = 0, len(grid)  # grid[lo] fits; grid[hi:] not known to
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(grid[mid]) else (lo, mid)
    return grid[lo]


def _local_pld(alpha: float, eps_local: float, interval: float) -> pld_lib.PrivacyLossDistribution:
    """A lone report (n = 1): the victim's three outcomes of the docs/mathematics.md §1.2 decomposition, no blanket."""
    e_alpha = math.exp(eps_local) * alpha
    rest = max(0.0, 1.0 - alpha - e_alpha)
    upper = {"one": math.log(e_alpha), "two": math.log(alpha)}
    lower = {"one": math.log(alpha), "two": math.log(e_alpha)}
    if rest > 0.0:
        upper["zero"] = lower["zero"] = math.log(rest)
    return pld_lib.from_two_probability_mass_functions(lower, upper, value_discretization_interval=interval)


def reports_pld(release: WindowRelease, n: int, interval: float, reference_delta: float
                ) -> pld_lib.PrivacyLossDistribution:
    """The reports' PLD: the blanket pair where the release declares a decomposition and it certifies a smaller
    epsilon at ``reference_delta`` (the odometer's delta: a choice on public parameters only, each pair being
    valid) and fits ``MAX_POINTS``; the generic clone pair otherwise."""
    if release.blanket is not None:
        dec = BlanketDecomposition(*release.blanket)
        # Counted first: where the blanket pair's PLD cannot be built the generic one is taken whichever pair
        # certifies less, so the choice (the blanket bound's bisection, ~0.25 s of CPU at n = 10^5) is skipped.
        if blanket_pld_fits(n, dec, interval):
            _, bound = best_epsilon(n, release.mechanism_alpha, release.eps_local, reference_delta, dec)
            if bound == BOUND_BLANKET:
                try:
                    return blanket_shuffle_pld(n, dec, interval)
                except PLDTooLargeError:
                    pass
    return shuffle_pld(n, release.mechanism_alpha, release.eps_local, interval)


def window_pld(release: WindowRelease, interval: float = DEFAULT_INTERVAL, fallback_delta: float | None = None,
               reference_delta: float = 1e-6) -> pld_lib.PrivacyLossDistribution | None:
    """The PLD of one window, reports and crowd count composed (None if it released nothing). A window too
    large for an exact PLD raises ``PLDTooLargeError`` unless ``fallback_delta`` is given: then its reports
    enter as the canonical pair of the tight bound at that delta."""
    _, _, n, crowd_eps, crowd_delta, approx_eps, approx_delta, *_ = release.group_key()
    out = None
    if approx_eps is not None:
        if n > 0:
            out = pld_lib.from_privacy_parameters(DifferentialPrivacyParameters(approx_eps, approx_delta),
                                                  value_discretization_interval=interval)
    elif n >= 2:
        try:
            out = reports_pld(release, n, interval, reference_delta)
        except PLDTooLargeError:
            if fallback_delta is None:
                raise
            eps_w = epsilon_central(n, release.mechanism_alpha, release.eps_local, fallback_delta)
            out = pld_lib.from_privacy_parameters(DifferentialPrivacyParameters(eps_w, fallback_delta),
                                                  value_discretization_interval=interval)
    elif n == 1:
        out = _local_pld(release.mechanism_alpha, release.eps_local, interval)
    if out is not None and release.channels > 1:
        out = out.self_compose(release.channels)
    if crowd_eps is not None:
        count = crowd_count_pld(crowd_eps, crowd_delta, interval)
        out = count if out is None else out.compose(count)
    if release.count_charges:
        count = count_pld(release.count_sigma, release.count_threshold, release.count_charges, interval)
        out = count if out is None else out.compose(count)
    return out


def _is_count(part: WindowRelease) -> bool:
    return part.n_clients == 0 and (part.count_charges > 0 or part.crowd_epsilon is not None)


def _components(release: WindowRelease) -> list[WindowRelease]:
    """A release as independent parts: its reports (with any legacy count) and its charged count. Composition
    commutes, so the total is unchanged, while every window's count lands in one shared group (one
    self-composition serves the total and ``count_epsilon``, whatever the windows' sizes)."""
    if (not release.count_charges and release.crowd_epsilon is None) or _is_count(release):
        return [release]
    count = WindowRelease(None, None, 0, release.crowd_epsilon, release.crowd_delta, 0.0, 0.0, release.count_sigma,
                          release.count_threshold, release.count_charges)
    data = dataclasses.replace(release, crowd_epsilon=None, crowd_delta=None, count_sigma=None,
                               count_threshold=None, count_charges=0)
    return [data, count] if data.n_clients > 0 else [count]
