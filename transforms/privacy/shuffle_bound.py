"""Tight numerical amplification-by-shuffling bound (docs/mathematics.md §1.2: Feldman, McMillan, Talwar 2023).

The clone pair ``(P_alpha, Q_alpha)`` of two-dimensional counts (``ClonePairDivergence``) is evaluated
exactly in O(n) (§1.2 algorithm) and its hockey-stick divergence inverted by bisection. It dominates n
shuffled reports only where the victim's law has no leftover part, ``(1 + e^eps) alpha = 1``: that is the
generic alpha = 1/(e^eps + 1), valid for every eps-LDP randomizer. A mechanism-specific alpha below it leaves
the victim a leftover law that differs from the other clients' leftovers, the pair is then no post-processing
of the shuffled multiset, and it under-reports epsilon (exactly enumerated in
tests/privacy/test_shuffle_exact.py: 15 k-RR reports, d = 4, eps0 = 2, delta = 1e-3 give 1.82 against the
pair's 1.58). So the certified accountants ``ShuffleDivergence`` / ``epsilon_central`` accept the mechanism's
alpha (validated, and kept for reports) but evaluate the pair at the generic alpha. They are what the
pipeline reports, unless the per-mechanism blanket pair of ``blanket_shuffle`` (a decomposition in which the
victim's leftover law IS the others' blanket leftover) certifies less; the closed forms of ``closed_forms`` are
only for comparison.

For large n nearly all the mass of ``C ~ Bin(n-1, 2 alpha)`` sits within a few standard deviations of its
mean, so ``ShuffleDivergence`` may restrict the sum to a window and *add* the probability of leaving the
window to the result: the value stays an upper bound (conservative), and the cost per divergence drops from
O(n) to O(sqrt(n)).
"""

from __future__ import annotations

import math

import numpy as np

from ._checks import check_delta, check_epsilon, check_int, check_real
from .binomial import binom_cdf as _cdf
from .binomial import binom_pmf as _pmf
from .binomial import binom_sf as _sf
from .bisection import smallest_certified

__all__ = [
    "FAST_WINDOW_SDS",
    "CloneDivergence",
    "ClonePairDivergence",
    "ShuffleDivergence",
    "certified_alpha",
    "check_mixture_alpha",
    "epsilon_central",
    "hockey_stick",
    "pair_hockey_stick",
    "pair_terms",
]

# Half-width, in standard deviations of Bin(n-1, 2 alpha), of the window used by ``epsilon_central``. The
# neglected mass is added to the divergence, so the width trades only tightness (the mass beyond 12 sd is
# far below any delta in use) against speed, never soundness.
FAST_WINDOW_SDS = 12.0


def check_mixture_alpha(alpha: object, eps_local: float) -> float:
    """Validate ``0 < alpha`` and ``(1 + e^eps) alpha <= 1`` (up to 1e-12): the (0, 0) branch of §1.2 has
    probability ``1 - alpha - e^eps alpha`` and must exist."""
    eps_local = check_epsilon("eps_local", eps_local)
    a = check_real("alpha", alpha)
    if a <= 0.0:
        raise ValueError(f"alpha must be > 0, got {a!r}")
    total = a + math.exp(eps_local + math.log(a))
    if total > 1.0 + 1e-12:
        raise ValueError(
            f"(1 + e^eps_local) * alpha must be <= 1, got {total!r} (alpha={a!r}, eps_local={eps_local!r}); "
            "alpha is TV/(e^eps - 1), not the total variation itself"
        )
    return a


def certified_alpha(alpha: object, eps_local: float) -> float:
    """The alpha at which the clone pair certifies a randomizer with mixture parameters (eps_local, alpha).

    Validates ``alpha`` (``check_mixture_alpha``), then returns the generic ``1/(e^eps + 1)``: the clone
    reduction needs the victim's leftover law to be empty, ``(1 + e^eps) alpha = 1``, which holds exactly at
    the generic alpha, and the generic alpha is valid for every eps-LDP randomizer (a randomizer with
    mixture parameters (eps, alpha) is eps-LDP). A smaller mechanism-specific alpha certifies nothing more.
    """
    check_mixture_alpha(alpha, eps_local)
    tail = math.exp(-check_epsilon("eps_local", eps_local))
    return tail / (1.0 + tail)  # 1/(e^eps + 1) without overflow


def pair_terms(trials: int, clone: float, w1: float, w2: float, w0: float, window_sds: float | None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(m, A1, A2, neglected mass) of a clone pair (``CloneDivergence``) over totals m >= 1.

    ``window_sds=None`` keeps every m; a number keeps m within mean +- window_sds * sd of C ~ Bin(trials,
    clone) (plus one) and returns the P-mass of C outside it, which bounds everything left out.
    """
    c_lo, c_hi = 0, trials
    if window_sds is not None:
        width = check_real("window_sds", window_sds)
        if width <= 0.0:
            raise ValueError(f"window_sds must be > 0 or None, got {width!r}")
        mean, sd = trials * clone, math.sqrt(trials * clone * (1.0 - clone))
        c_lo = max(0, math.floor(mean - width * sd))
        c_hi = min(trials, math.ceil(mean + width * sd))
    # T = C + Delta1 + Delta2 lies in [c_lo, c_hi + 1] whenever C lies in [c_lo, c_hi]; each m contributes
    # at most P[T = m], so the P-mass of C outside the window bounds everything left out.
    neglected = float(_cdf(c_lo - 1, trials, clone) + _sf(c_hi, trials, clone))
    # m = 0 contributes nothing: the only outcome (0, 0) has the same probability under P and Q.
    m = np.arange(max(1, c_lo), c_hi + 2, dtype=np.int64)
    b_m = _pmf(m, trials, clone)
    b_m1 = _pmf(m - 1, trials, clone)
    k = b_m * max(0.0, w0) / 2.0
    return m, k + b_m1 * w1, k + b_m1 * w2, neglected


class CloneDivergence:
    """``eps_c -> D_{e^eps_c}(P || Q)`` of a general clone pair: ``trials`` others, each a clone with probability
    ``clone`` (half of x's kind, half of x''s), a victim of x's kind / x''s kind / neither with weights ``w1`` /
    ``w2`` / ``w0`` (swapped under Q). Weights may sum to less than one: the rest is a victim outcome revealed
    and equal under P and Q (it adds nothing to the divergence). The pair of §1.2 is ``trials = n - 1``,
    ``clone = 2 alpha`` and ``(e^eps alpha, alpha, 1 - alpha - e^eps alpha)``; the blanket pair of
    ``blanket_shuffle`` is one per revealed blanket count.

    Everything that does not depend on eps_c (the binomial weights A1, A2 of every total m) is computed once
    here, so a bisection step only recomputes the threshold x* and two binomial tails per m.
    ``window_sds=None`` sums over every m (exact); a number restricts m to mean +- window_sds * sd of
    Bin(trials, clone) (plus one) and adds the neglected mass ``neglected_mass`` (an upper bound).
    An instance caches the tails of its last evaluation, so share it between threads only with a lock.
    """

    def __init__(self, trials: int, clone: float, w1: float, w2: float, w0: float, *,
                 window_sds: float | None = None) -> None:
        trials = check_int("trials", trials, 0)
        p = check_real("clone", clone)
        if not 0.0 < p <= 1.0:
            raise ValueError(f"clone must lie in (0, 1], got {p!r}")
        m, a1, a2, self.neglected_mass = pair_terms(trials, p, w1, w2, w0, window_sds)
        self._set_terms(m, a1, a2)

    def _set_terms(self, m: np.ndarray, a1: np.ndarray, a2: np.ndarray) -> None:
        """The pair as arrays over totals m >= 1 (several pairs' terms may be concatenated, each scaled by its
        weight: the divergence is linear in A1, A2 and the threshold x* depends on their ratio only)."""
        self._m, self._a1, self._a2 = m, a1, a2
        # Binomial tails of the last evaluation, reused by ``_update_tails`` where x* did not move.
        self._x_star = m + 1
        self._s_u = np.zeros(m.shape)
        self._s_w = np.zeros(m.shape)

    def __call__(self, eps_central: float) -> float:
        """The divergence (plus the neglected window mass) at central epsilon ``eps_central`` >= 0."""
        eps_c = check_epsilon("eps_central", eps_central, allow_zero=True)
        e_c = math.exp(eps_c)
        m, a1, a2 = self._m, self._a1, self._a2
        gap = a1 - e_c * a2
        # Where gap <= 0, P(m, x) <= e^eps_c Q(m, x) for every x. Elsewhere P/Q grows with x through
        # r = x/(m - x), so the positive part is the upper tail from the first x with r > R,
        # R = (e^c A1 - A2)/(A1 - e^c A2): x* = floor(m R/(1 + R)) + 1, written m/(1 + 1/R) so that a huge R
        # cannot overflow. x* = m + 1 marks "no contribution".
        active = gap > 0.0
        threshold = np.full(m.shape, np.inf)
        threshold[active] = m[active] / (1.0 + gap[active] / (e_c * a1[active] - a2[active]))
        x_star = np.where(active, np.floor(np.minimum(threshold, m)).astype(np.int64) + 1, m + 1)
        self._update_tails(x_star)
        contributions = gap * self._s_u + (a2 - e_c * a1) * self._s_w
        contributions[x_star > m] = 0.0
        return max(0.0, float(np.sum(contributions))) + self.neglected_mass

    def _update_tails(self, x_star: np.ndarray) -> None:
        """Refresh Su = Pr[Bin(m-1, 1/2) >= x* - 1] and Sw = Pr[Bin(m-1, 1/2) >= x*] where x* moved.

        Late bisection steps move eps_c so little that x* stays put for almost every m; recomputing only the
        changed entries gives the same numbers at a fraction of the cost.
        """
        changed = (x_star != self._x_star) & (x_star <= self._m)
        if changed.any():
            m, x = self._m[changed], x_star[changed]
            s_w = _sf(x - 1, m - 1, 0.5)
            self._s_w[changed] = s_w
            self._s_u[changed] = s_w + _pmf(x - 1, m - 1, 0.5)  # a sum of two tails: no cancellation
        self._x_star = x_star


class ClonePairDivergence(CloneDivergence):
    """``eps_c -> D_{e^eps_c}(P_alpha || Q_alpha)`` of the clone pair at exactly the given (n, alpha, eps_local).

    The pair's divergence for any admissible alpha (the §1.2 algorithm and its reference values); a privacy
    bound only at the generic alpha (see the module docstring): accountants use ``ShuffleDivergence``.
    """

    def __init__(self, n: int, alpha: float, eps_local: float, *, window_sds: float | None = None) -> None:
        self.n = check_int("n", n, 2)
        self.eps_local = check_epsilon("eps_local", eps_local)
        self.alpha = check_mixture_alpha(alpha, self.eps_local)
        e_alpha = math.exp(self.eps_local + math.log(self.alpha))
        super().__init__(self.n - 1, 2.0 * self.alpha, e_alpha, self.alpha, 1.0 - self.alpha - e_alpha,
                         window_sds=window_sds)


class ShuffleDivergence(ClonePairDivergence):
    """Certified ``eps_c -> delta`` of n shuffled reports of an (eps_local, alpha)-mixture randomizer: the clone
    pair at ``certified_alpha`` (``alpha`` is the certified one; the argument is kept as ``mechanism_alpha``)."""

    def __init__(self, n: int, alpha: float, eps_local: float, *, window_sds: float | None = None) -> None:
        self.mechanism_alpha = check_mixture_alpha(alpha, eps_local)
        super().__init__(n, certified_alpha(alpha, eps_local), eps_local, window_sds=window_sds)


def pair_hockey_stick(
    n: int, alpha: float, eps_local: float, eps_central: float, *, window_sds: float | None = None
) -> float:
    """``D_{e^eps_central}(P_alpha || Q_alpha)`` of the clone pair at exactly this alpha (exact O(n) sum unless
    ``window_sds`` is given, then the windowed upper bound). Not a privacy bound below the generic alpha."""
    return ClonePairDivergence(n, alpha, eps_local, window_sds=window_sds)(eps_central)


def hockey_stick(
    n: int, alpha: float, eps_local: float, eps_central: float, *, window_sds: float | None = None
) -> float:
    """Certified delta at ``eps_central`` of n shuffled reports of an (eps_local, alpha)-mixture randomizer
    (the pair at ``certified_alpha``; exact O(n) sum unless ``window_sds`` is given)."""
    return ShuffleDivergence(n, alpha, eps_local, window_sds=window_sds)(eps_central)


def epsilon_central(
    n: int,
    alpha: float,
    eps_local: float,
    delta: float,
    steps: int = 60,
    *,
    window_sds: float | None = FAST_WINDOW_SDS,
) -> float:
    """Smallest certified central epsilon (replacement DP) of n shuffled reports of an (eps_local, alpha)-mixture
    randomizer: the clone pair at ``certified_alpha``.

    Bisection on [0, eps_local] (the divergence is non-increasing in eps_c); the upper end is returned, so
    the result always satisfies ``D <= delta``. If even eps_c = eps_local is not certified (possible only
    through the window's neglected mass), eps_local itself is returned: shuffling never hurts.
    """
    delta = check_delta("delta", delta)
    steps = check_int("steps", steps, 1)
    divergence = ShuffleDivergence(n, alpha, eps_local, window_sds=window_sds)
    return smallest_certified(divergence, divergence.eps_local, delta, steps)
