"""Privacy accounting of the multi-message shuffle protocols of [MultiMsg] (docs/mathematics.md §7.1, §7.2).

Neither protocol is locally private: one client's message set always contains its data message(s), which
the blanket messages of *all* clients hide only after shuffling. Both accountants below therefore bound the
central (shuffled) guarantee of one **element swap** (one client replaces one element j of its set by j')
and chain k_set swaps for whole sets (§1.4 chain: ``(k eps', delta' sum_{i<k} e^{i eps'})``).

**Hadamard (§7.1).** [MultiMsg] Lemma 4.4 gives the adversary every data message except the target's message for
j/j', and the multiset W of that message plus all ``n rho`` blanket messages. The likelihood of W is
proportional to ``N_j(W)`` (messages of W inside ``C_j^tau``), so the privacy loss is ``ln(N_j / N_j')`` with
(only-C_j, only-C_j', both) blanket counts ~ Multinomial(n rho; p1, p1, p2), ``p2 = 4^-tau``,
``p1 = 2^-tau - p2``; under D ``N_j = X + 1`` and ``N_j' = Y + Bern(2^-tau)``. The divergence
``E[(1 - e^eps N_j'/N_j)_+]`` is summed exactly (binomial cdfs in closed form; only tail mass beyond 40 sd is
bounded by adding it). The Chernoff rule of the paper is very conservative next to it.

**Count-min (§7.2).** The analyzer's view is the table of per-cell message counts; each cell carries
independent Bin(n, gamma) blanket noise. A swap moves <= tau cells by +1 and <= tau cells by -1, so the loss is
a sum of <= 2 tau independent single-cell losses ``ln p(X)/p(X+1)`` and ``ln p(Y)/p(Y-1)`` (infinite where
the shifted pmf vanishes). We compose the 2 tau losses by FFT on a grid after rounding every loss *up* to the
grid (``delta(eps) = E[(1 - e^{eps - L})_+]`` is non-decreasing in L, so rounding up only overestimates);
mass outside a 15-sd window counts as infinite loss. Fewer distinct cells (shared buckets) or adding/removing
one element (tau cells move, one direction) are marginals of this pair, hence never worse than it.
The paper's gamma (Lemma 4.10 constants) is infeasible (> 1) except for huge n,
which is why the numeric calibration is the default.

**Truncation.** A count-min client sends at most ``cap`` blanket messages (the shuffler's flood quota needs a
bound). Capping changes each client's output with probability ``P[Bin(tau s, gamma) > cap]``, hence the
protocol's output distribution by at most ``eta = n P[...]`` in total variation, which adds
``(1 + e^eps) eta`` to delta.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import numpy as np
from scipy.fft import irfft, next_fast_len, rfft

from ._checks import check_delta, check_epsilon, check_int, check_real
from .binomial import binom_cdf, binom_pmf, binom_sf
from .bisection import bisect_certified, smallest_int
from .composition import chain_composition

__all__ = [
    "EPSILON_SEARCH_MAX",
    "CountMinLoss",
    "blanket_cap",
    "countmin_delta",
    "countmin_epsilon",
    "countmin_grid",
    "countmin_loss",
    "countmin_min_gamma",
    "countmin_paper_buckets",
    "countmin_paper_gamma",
    "countmin_paper_rows",
    "hadamard_default_tau",
    "hadamard_delta",
    "hadamard_epsilon",
    "hadamard_min_rho",
    "hadamard_paper_rho",
    "hadamard_swap_divergence",
    "truncation_delta",
]

EPSILON_SEARCH_MAX = 64.0  # central epsilons beyond this are reported as "not certified" (inf)
HADAMARD_WINDOW_SDS = 40.0
TAIL_TRIM = 1e-30  # binomial tails below this are not summed but added to delta (conservative)
COUNTMIN_WINDOW_SDS = 15.0
MAX_RHO = 1 << 22
MAX_GRID_POINTS = 1 << 24
TRUNCATION_SHARE = 0.01  # fraction of delta spent on capping the count-min blanket


def _bisect_epsilon(delta_of: Callable[[float], float], delta: float, steps: int = 32) -> float:
    """Smallest certified eps in [0, EPSILON_SEARCH_MAX] found by doubling then bisection; inf if none.

    ``delta_of`` need not be monotone (chained swaps and blanket truncation grow with e^eps), so the upper
    bracket is found by doubling from 1/64 rather than taken at the top of the range. The returned eps always
    satisfies ``delta_of(eps) <= delta``: a valid guarantee, at worst not the smallest one.
    """
    if delta_of(0.0) <= delta:
        return 0.0
    low, high = 0.0, 1.0 / 64.0
    while delta_of(high) > delta:
        low, high = high, 2.0 * high
        if high > EPSILON_SEARCH_MAX:
            return math.inf
    return bisect_certified(delta_of, low, high, delta, steps)


def _chain(delta_of_swap: Callable[[float], float], eps: float, k_set: int) -> float:
    """delta of a whole-set change: k element swaps at eps/k each, chained (§1.4)."""
    step = eps / k_set
    return chain_composition(step, min(1.0, delta_of_swap(step)), k_set)[1]


# -- Hadamard response (§7.1) ----------------------------------------------------------------------------


def hadamard_default_tau(n: int) -> int:
    """tau = floor(log2 n), so that 2^tau <= n and the blanket mean n rho 2^-tau is at least rho."""
    return check_int("n", n, 2).bit_length() - 1


def hadamard_paper_rho(epsilon: float, delta: float, k_set: int = 1) -> int:
    """Paper-style rho = ceil(36 ln(1/delta') / eps'^2), eps' = eps/k, delta' = delta/(k e^eps) [R-M]."""
    eps = check_epsilon("epsilon", epsilon)
    delta = check_delta("delta", delta)
    k = check_int("k_set", k_set, 1)
    eps1 = eps / k
    log_inv_delta1 = -math.log(delta) + math.log(k) + eps
    return math.ceil(36.0 * log_inv_delta1 / (eps1 * eps1))


def _window(trials: int, p: float) -> tuple[int, int, float]:
    """Support window of Bin(trials, p) outside which each tail is below 1e-30, and the mass outside it."""
    w = HADAMARD_WINDOW_SDS
    mean, sd = trials * p, math.sqrt(trials * p * (1.0 - p))
    lo = max(0, math.floor(mean - w * sd - w))
    hi = min(trials, math.ceil(mean + w * sd + w))
    k = np.arange(lo, hi + 1)
    lower, upper = binom_cdf(k, trials, p), binom_sf(k, trials, p)
    lo = int(k[np.argmax(lower >= TAIL_TRIM)]) if lower[-1] >= TAIL_TRIM else lo
    hi = int(k[np.argmax(upper < TAIL_TRIM)]) if upper[-1] < TAIL_TRIM else hi
    return lo, hi, float(binom_cdf(lo - 1, trials, p) + binom_sf(hi, trials, p))


def hadamard_swap_divergence(n: int, rho: int, tau: int, eps: float) -> float:
    """``D_{e^eps}`` of the Lemma 4.4 view under one element swap (both directions are equal by symmetry)."""
    n = check_int("n", n, 1)
    rho = check_int("rho", rho, 0)
    tau = check_int("tau", tau, 1)
    eps = check_epsilon("eps", eps, allow_zero=True)
    trials = n * rho
    p_in = 2.0**-tau
    p_both = p_in * p_in
    p_only = p_in - p_both
    e = math.exp(eps)
    c_lo, c_hi, outside = _window(trials, p_both)
    c = np.arange(c_lo, c_hi + 1, dtype=np.int64)
    weight_c = binom_pmf(c, trials, p_both)
    r_a = p_only / (1.0 - p_both)  # A | C=c ~ Bin(trials - c, r_a)
    a_lo, a_hi, _ = _window(trials, r_a)
    a = np.arange(a_lo, a_hi + 1, dtype=np.int64)[None, :]
    cc = c[:, None]
    trials_a = trials - cc
    weight_a = binom_pmf(a, trials_a, r_a)
    outside += float(np.sum(weight_c * (binom_cdf(a_lo - 1, trials - c, r_a) + binom_sf(a_hi, trials - c, r_a))))
    # A' | A=a, C=c ~ Bin(m, q): the target's j'-count among the remaining blanket messages.
    q = p_only / (1.0 - p_in)
    m = np.maximum(trials_a - a, 0)
    n_j = (a + cc + 1).astype(float)
    threshold = np.ceil(n_j / e).astype(np.int64) - 1  # largest y with y e^eps < N_j
    total = np.zeros(np.broadcast(a, cc).shape)
    for b, p_b in ((0, 1.0 - p_in), (1, p_in)):
        u = threshold - cc - b  # largest A' with a positive contribution
        below = binom_cdf(u, m, q)
        partial_mean = m * q * binom_cdf(u - 1, m - 1, q)  # E[A'; A' <= u]
        value = below * (1.0 - e * (cc + b) / n_j) - e / n_j * partial_mean
        total += p_b * np.where(u >= 0, np.maximum(value, 0.0), 0.0)
    valid = a <= trials_a
    return min(1.0, float(np.sum(np.where(valid, weight_c[:, None] * weight_a * total, 0.0))) + outside)


def hadamard_delta(n: int, rho: int, tau: int, k_set: int, eps: float) -> float:
    """Central delta at central eps of the whole protocol (k_set chained swaps) for n clients."""
    k = check_int("k_set", k_set, 1)
    return _chain(lambda e: hadamard_swap_divergence(n, rho, tau, e), check_epsilon("eps", eps, allow_zero=True), k)


def hadamard_epsilon(n: int, rho: int, tau: int, k_set: int, delta: float) -> float:
    """Smallest certified central eps at ``delta`` for n clients (inf when no eps <= 64 is certified)."""
    delta = check_delta("delta", delta)
    return _bisect_epsilon(lambda e: hadamard_delta(n, rho, tau, k_set, e), delta)


@lru_cache(maxsize=256)
def hadamard_min_rho(n: int, tau: int, k_set: int, epsilon: float, delta: float) -> int:
    """Fewest blanket messages per client certifying (epsilon, delta) for n clients ("tight rho").

    Searches upward from the paper rule's bracket; raises if even ``MAX_RHO`` is not enough.
    """
    eps = check_epsilon("epsilon", epsilon)
    delta = check_delta("delta", delta)

    def ok(rho: int) -> bool:
        return hadamard_delta(n, rho, tau, k_set, eps) <= delta

    high = max(1, hadamard_paper_rho(eps, delta, k_set))
    while not ok(high):
        high *= 2
        if high > MAX_RHO:
            raise ValueError(
                f"no rho <= {MAX_RHO} certifies (epsilon={eps}, delta={delta}) for n={n}, tau={tau}; "
                "raise epsilon or delta, or lower tau"
            )
    return smallest_int(ok, 0, high)  # rho = 0 (no blanket) is never private


# -- Count-min + multi-message randomized response (§7.2) ------------------------------------------------


def countmin_paper_rows(d: int, beta: float) -> int:
    """tau = ceil(log2(2 B / beta)) rows [R-M]."""
    d = check_int("d", d, 1)
    beta = check_delta("beta", beta)
    return max(1, math.ceil(math.log2(2.0 * d / beta)))


def countmin_paper_buckets(n: int, k_set: int = 1) -> int:
    """s = 2 n k buckets per row [R-M]: few enough collisions with the other held elements (Lemma 4.8)."""
    return 2 * check_int("n", n, 1) * check_int("k_set", k_set, 1)


def countmin_paper_gamma(n: int, rows: int, k_set: int, epsilon: float, delta: float) -> float:
    """gamma = 90 k^2 tau^2 ln(2 k tau / delta) / (n eps^2) [R-M]; feasible only when <= 1."""
    n = check_int("n", n, 1)
    tau = check_int("rows", rows, 1)
    k = check_int("k_set", k_set, 1)
    eps = check_epsilon("epsilon", epsilon)
    delta = check_delta("delta", delta)
    return 90.0 * k * k * tau * tau * math.log(2.0 * k * tau / delta) / (n * eps * eps)


def countmin_grid(epsilon: float, rows: int) -> float:
    """Loss grid whose worst-case rounding (2 tau grid) is 1/200 of epsilon, within [1e-5, 1e-2]."""
    eps = check_epsilon("epsilon", epsilon)
    return min(1e-2, max(1e-5, eps / (400.0 * check_int("rows", rows, 1))))


class CountMinLoss:
    """Privacy-loss distribution of one element swap of the count-min protocol (2 tau cells), on a grid.

    ``delta(eps)`` is an upper bound of the hockey-stick divergence: losses are rounded up to the grid and the
    window's neglected mass counts as infinite loss. FFT round-off (~1e-16 per grid point, negatives clipped)
    makes values below ~1e-12 unreliable; deltas in use are far above that.
    """

    def __init__(self, n: int, gamma: float, rows: int, grid: float) -> None:
        self.n = check_int("n", n, 1)
        self.gamma = check_real("gamma", gamma)
        if not 0.0 < self.gamma < 1.0:
            raise ValueError(f"gamma must lie in (0, 1) for a finite privacy loss, got {gamma!r}")
        self.rows = check_int("rows", rows, 1)
        self.grid = check_real("grid", grid)
        if self.grid <= 0.0:
            raise ValueError(f"grid must be > 0, got {grid!r}")
        mean = self.n * self.gamma
        sd = math.sqrt(mean * (1.0 - self.gamma))
        lo = max(0, math.floor(mean - COUNTMIN_WINDOW_SDS * sd - COUNTMIN_WINDOW_SDS))
        hi = min(self.n, math.ceil(mean + COUNTMIN_WINDOW_SDS * sd + COUNTMIN_WINDOW_SDS))
        x = np.arange(lo, hi + 1, dtype=np.int64)
        pmf = binom_pmf(x, self.n, self.gamma)
        outside = float(binom_cdf(lo - 1, self.n, self.gamma) + binom_sf(hi, self.n, self.gamma))
        log_odds = math.log1p(-self.gamma) - math.log(self.gamma)
        xf = x.astype(float)
        plus_ok, minus_ok = x < self.n, x > 0  # p(X + 1) = 0 at X = n; p(Y - 1) = 0 at Y = 0
        with np.errstate(divide="ignore"):
            loss_plus = np.log(xf + 1.0) - np.log(self.n - xf) + log_odds
            loss_minus = np.log(self.n - xf + 1.0) - np.log(xf) - log_odds
        p_plus, lo_plus, inf_plus = self._on_grid(loss_plus[plus_ok], pmf[plus_ok], outside + pmf[~plus_ok].sum())
        p_minus, lo_minus, inf_minus = self._on_grid(loss_minus[minus_ok], pmf[minus_ok],
                                                     outside + pmf[~minus_ok].sum())
        length = self.rows * (p_plus.size - 1) + self.rows * (p_minus.size - 1) + 1
        if length > MAX_GRID_POINTS:
            raise ValueError(f"count-min loss grid of {length} points is too fine; use a coarser grid")
        size = next_fast_len(length, real=True)
        spectrum = rfft(p_plus, size) ** self.rows * rfft(p_minus, size) ** self.rows
        conv = np.maximum(irfft(spectrum, size)[:length], 0.0)
        self.loss = (self.rows * (lo_plus + lo_minus) + np.arange(length)) * self.grid
        self.pmf = conv
        self.infinite_mass = float(-math.expm1(self.rows * (math.log1p(-min(inf_plus, 1.0))
                                                            + math.log1p(-min(inf_minus, 1.0)))))
        # Suffix sums (from the top, so tiny tails keep full precision) make delta(eps) O(log L).
        # Only losses above eps >= 0 are ever summed, so e^-L is taken at max(L, 0): no overflow.
        self._tail_p = np.cumsum(conv[::-1])[::-1]
        self._tail_pe = np.cumsum((conv * np.exp(-np.maximum(self.loss, 0.0)))[::-1])[::-1]

    def _on_grid(self, loss: np.ndarray, pmf: np.ndarray, infinite: float) -> tuple[np.ndarray, int, float]:
        index = np.ceil(loss / self.grid).astype(np.int64)
        lo = int(index.min())
        return np.bincount(index - lo, weights=pmf), lo, float(infinite)

    def delta(self, eps: float) -> float:
        """``E[(1 - e^{eps - L})_+]`` of the rounded loss, plus the infinite-loss mass."""
        eps = check_epsilon("eps", eps, allow_zero=True)
        start = int(np.searchsorted(self.loss, eps, side="right"))
        if start >= self.loss.size:
            return min(1.0, self.infinite_mass)
        finite = self._tail_p[start] - math.exp(eps) * self._tail_pe[start]
        return min(1.0, self.infinite_mass + max(0.0, float(finite)))


@lru_cache(maxsize=64)
def countmin_loss(n: int, gamma: float, rows: int, grid: float) -> CountMinLoss:
    """Cached :class:`CountMinLoss` (one FFT per parameter set; the analyzer asks per window)."""
    return CountMinLoss(n, gamma, rows, grid)


def blanket_cap(cells: int, gamma: float, n: int, eps: float, budget: float) -> int:
    """Smallest cap m <= cells with ``(1 + e^eps) n P[Bin(cells, gamma) > m] <= budget``."""
    cells = check_int("cells", cells, 1)
    scale = (1.0 + math.exp(check_epsilon("eps", eps))) * check_int("n", n, 1)
    mean = cells * gamma
    hi = min(cells, math.ceil(mean + 60.0 * math.sqrt(mean + 1.0) + 60.0))
    m = np.arange(hi + 1)
    ok = np.nonzero(scale * binom_sf(m, cells, gamma) <= budget)[0]
    return int(m[ok[0]]) if ok.size else cells


def truncation_delta(cells: int, gamma: float, cap: int, n: int, eps: float) -> float:
    """``(1 + e^eps) n P[Bin(cells, gamma) > cap]``: what capping the blanket adds to delta."""
    return (1.0 + math.exp(eps)) * n * float(binom_sf(cap, cells, gamma))


def countmin_delta(n: int, gamma: float, rows: int, buckets: int, k_set: int, cap: int, eps: float,
                   grid: float) -> float:
    """Central delta at eps of the whole count-min protocol for n clients (chained swaps + truncation)."""
    eps = check_epsilon("eps", eps, allow_zero=True)
    if gamma >= 1.0:
        return 1.0  # every cell gets exactly n blanket messages: no noise at all
    loss = countmin_loss(n, float(gamma), rows, grid)
    swaps = _chain(loss.delta, eps, k_set)
    return min(1.0, swaps + truncation_delta(rows * buckets, gamma, cap, n, eps))


def countmin_epsilon(n: int, gamma: float, rows: int, buckets: int, k_set: int, cap: int, delta: float,
                     grid: float) -> float:
    """Smallest certified central eps at ``delta`` for n clients (inf if none <= 64)."""
    delta = check_delta("delta", delta)
    return _bisect_epsilon(lambda e: countmin_delta(n, gamma, rows, buckets, k_set, cap, e, grid), delta)


@lru_cache(maxsize=64)
def countmin_min_gamma(n: int, rows: int, buckets: int, k_set: int, epsilon: float, delta: float,
                       grid: float) -> float:
    """Least blanket probability gamma certifying (epsilon, delta) for n clients, with the blanket capped so
    that truncation costs at most 1% of delta. Bisection on ln gamma to 0.5 % relative precision; raises if
    even gamma = 1/2 (the noisiest binomial) is not enough."""
    eps = check_epsilon("epsilon", epsilon)
    delta = check_delta("delta", delta)
    cells = rows * buckets

    def ok(gamma: float) -> bool:
        cap = blanket_cap(cells, gamma, n, eps, TRUNCATION_SHARE * delta)
        return countmin_delta(n, gamma, rows, buckets, k_set, cap, eps, grid) <= delta

    high = 0.5
    if not ok(high):
        raise ValueError(f"no blanket probability gamma <= 1/2 certifies (epsilon={eps}, delta={delta}) for n={n}, "
                         f"rows={rows}; raise n, epsilon or delta, or use fewer rows")
    low = min(high / 2.0, 0.5 / n)
    while ok(low):
        high, low = low, low / 4.0
    while high / low > 1.005:
        middle = math.sqrt(low * high)
        if ok(middle):
            high = middle
        else:
            low = middle
    return high
