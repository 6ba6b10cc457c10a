"""Searches behind the planner: the largest local epsilon whose tight shuffle bound meets a central target,
and a bracketing golden-section minimiser over integers.

Feasibility of a local epsilon needs no inner bisection on eps_c: the tight central epsilon is <= the target
exactly when ``D_{e^target}(P_alpha || Q_alpha) <= delta`` (the divergence is non-increasing in eps_c), so
each step of the outer bisection costs one evaluation of ``ShuffleDivergence`` (O(sqrt n) with the window
of ``shuffle_bound``: about a millisecond at n = 1e6).

Monotonicity in eps_local is not assumed for soundness: the bisection keeps a lower end it has *verified*
feasible, so whatever it returns meets the target. It is assumed only for maximality, and checked: after the
bisection a grid of smaller budgets is re-verified, and if one fails the search restarts below it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from transforms.privacy.blanket_shuffle import CLASSES_MAX_N, BlanketDecomposition, BlanketShuffleDivergence
from transforms.privacy.shuffle_bound import FAST_WINDOW_SDS, ShuffleDivergence

__all__ = ["EPS_LOCAL_CAP", "FeasibilityOracle", "Search", "largest_feasible_eps", "minimise_int"]

# No plan uses a larger local budget. Above it alpha ~ e^-eps leaves n e^-eps << 1 expected clones for any
# realistic n, so the divergence is ~ 1/2 and only a delta near 1 could be met; a cap also keeps the output
# sizes t ~ s e^eps exactly representable in float64 (< 2^53).
EPS_LOCAL_CAP = 30.0
GRID_CHECKS = 8
_GOLDEN = 0.6180339887498949


class FeasibilityOracle:
    """``(alpha, eps_local) -> tight eps_c <= target?`` for n users at delta, counting its evaluations."""

    def __init__(self, n: int, target: float, delta: float) -> None:
        self.n, self.target, self.delta = n, target, delta
        self.evaluations = 0

    def __call__(self, alpha: float, eps_local: float, decomposition: BlanketDecomposition | None = None) -> bool:
        """Feasible when ANY valid bound meets the target: the generic clone pair at ``alpha``, or, where the
        randomizer declares a blanket ``decomposition``, the blanket pair (its cover, or every one of its pair
        classes where ``best_epsilon`` uses them): the bounds ``events.central_epsilon`` publishes the smallest of."""
        if eps_local <= self.target:  # D_{e^c} = 0 once c >= eps_local: shuffling never hurts
            return True
        self.evaluations += 1
        divergence = ShuffleDivergence(self.n, alpha, eps_local, window_sds=FAST_WINDOW_SDS)
        if divergence(self.target) <= self.delta:
            return True
        if decomposition is None:
            return False
        if BlanketShuffleDivergence(self.n, decomposition)(self.target) <= self.delta:
            return True
        return bool(decomposition.classes) and self.n <= CLASSES_MAX_N and all(
            BlanketShuffleDivergence(self.n, part)(self.target) <= self.delta for part in decomposition.classes)


@dataclass(frozen=True)
class Search:
    """Outcome of ``largest_feasible_eps``: ``eps`` is verified feasible; ``infeasible`` is a budget verified
    infeasible (None when capped); ``monotone`` is False when the grid check had to restart the search."""

    eps: float
    infeasible: float | None
    capped: bool
    monotone: bool


def largest_feasible_eps(
    feasible: Callable[[float], bool],
    target: float,
    *,
    lo: float | None = None,
    hi: float | None = None,
    rel_tol: float = 1e-10,
    grid_checks: int = GRID_CHECKS,
) -> Search:
    """Largest eps_local in (0, EPS_LOCAL_CAP] with ``feasible(eps)``, by bracketing and bisection.

    ``lo`` / ``hi`` are an optional warm bracket the caller knows to be feasible / infeasible. Stops when the
    bracket is narrower than ``rel_tol`` times its upper end, then (``grid_checks`` > 0) re-verifies that many
    evenly spaced smaller budgets.
    """
    low = min(target, EPS_LOCAL_CAP) if lo is None else lo
    floor = low  # the grid check re-verifies (floor, result)
    if hi is None:
        if low >= EPS_LOCAL_CAP:
            return Search(EPS_LOCAL_CAP, None, True, True)
        high = max(2.0 * low, 1.0)
        while True:
            high = min(high, EPS_LOCAL_CAP)
            if not feasible(high):
                break
            if high >= EPS_LOCAL_CAP:
                return Search(EPS_LOCAL_CAP, None, True, True)
            low, high = high, 2.0 * high
    else:
        high = hi
    monotone = True
    while True:
        while high - low > rel_tol * high:
            middle = 0.5 * (low + high)
            if feasible(middle):
                low = middle
            else:
                high = middle
        failed = [x for x in (floor + (low - floor) * k / (grid_checks + 1) for k in range(1, grid_checks + 1))
                  if not feasible(x)]
        if not failed:
            return Search(low, high, False, monotone)
        monotone = False
        low, high = floor, failed[0]


def minimise_int(g: Callable[[int], float], lower: int) -> int:
    """Integer minimiser of g over x >= ``lower``, assumed unimodal (one interior minimum): a ladder
    lower + 2^k - 1 brackets the minimum, golden-section on the integers of the bracket finds it.
    ``g`` should memoise: the golden-section revisits points."""
    ladder = [lower]
    while len(ladder) < 3 or (g(ladder[-1]) < g(ladder[-2]) and len(ladder) < 50):
        ladder.append(lower + 2 ** len(ladder) - 1)
    best = min(range(len(ladder)), key=lambda k: g(ladder[k]))
    lo, hi = ladder[max(best - 1, 0)], ladder[min(best + 1, len(ladder) - 1)]
    m1, m2 = hi - round(_GOLDEN * (hi - lo)), lo + round(_GOLDEN * (hi - lo))
    while hi - lo > 4:
        if not lo < m1 < m2 < hi:  # rounding collapsed the interior points: place them afresh
            m1, m2 = hi - round(_GOLDEN * (hi - lo)), lo + round(_GOLDEN * (hi - lo))
            if not lo < m1 < m2 < hi:
                break
        if g(m1) <= g(m2):  # the minimum is in [lo, m2]; m1 becomes the upper interior point
            hi, m2, m1 = m2, m1, m2 - round(_GOLDEN * (m2 - lo))
        else:  # the minimum is in [m1, hi]
            lo, m1, m2 = m1, m2, m1 + round(_GOLDEN * (hi - m1))
    return min(range(lo, hi + 1), key=g)
