"""Shuffler-side privacy blanket: exact central epsilon of a report hidden among m dummy reports.

Amplification by shuffling hides a device among the *other* reports of its window, so enrolled devices that
collude with the analyst (and send reports it knows) hide nobody. The shuffler can add m dummy reports per
(window, crowd, analysis), drawn from the randomizer's input-independent ("blanket") component; then even an
adversary who knows every other real report exactly sees a post-processing of (victim's report + m dummies),
whose privacy does not depend on how many devices collude (Bittau et al., *Prochlo: Strong Privacy for
Analytics in the Crowd*, SOSP 2017; Balle, Bell, Gascón, Nissim, *The Privacy Blanket of the Shuffle Model*,
CRYPTO 2019).

Neighbouring notion: **replacement** -- the victim's value x is replaced by x' (every other input, the number
m of dummies and the number of reports fixed and public), the notion of the pipeline's ``eps_central``.

Both randomizers accounted here reduce exactly to two counts (a, b) with P_x(a, b) = J(a, b) s (kappa + a) and
P_x'(a, b) = J(a, b) s (kappa + b), J the (symmetric) law of (a, b) among m + 1 blanket draws. Summing over the
victim's report y, P_x(view) = sum_y P(y | x) Mult_m(view - y; B) = Mult_{m+1}(view; B) / (m+1) *
sum_cells n_c P(c | x) / B(c), and the ratio P(c | x) / B(c) takes one value on the cells that favour x, one on
those that favour x', and the same value under x and x' on every other cell: the rest is exchangeable.

* **GRR** over d values at eps0 reports x w.p. p = e^eps0/(e^eps0 + d - 1) and each other value w.p. q: the
  blanket is uniform (w = 1/d), (a, b) = the counts of x and x', J = Bin(a; m+1, 1/d) Bin(b; m+1-a, 1/(d-1)),
  s = d/(m+1) (p - q), kappa = q (m+1)/(p - q). The victim's leftover and the dummies' leftover are
  exchangeable on the other d - 2 values because both are uniform there (the victim puts q on each of them
  under x and under x').
* **OUE** sets the true bit w.p. 1/2 and every other bit w.p. q = 1/(1 + e^eps0): the blanket sets every bit
  w.p. q, independently (weight (1 + e^eps0)/(2 e^eps0)), (a, b) = the numbers of set bits in columns x and
  x', J = Bin(a; m+1, q) Bin(b; m+1, q), s = (1 - 2q)/(2 q (1 - q) (m+1)), kappa = (m+1) q/(1 - 2q). Every
  other column has the same law for the victim and the dummies, and within columns x, x' the ratio P / B is
  1/(2q) where the x-bit is set and 1/(2(1-q)) where it is not, whatever the x'-bit (and symmetrically).

The hockey-stick divergence is s sum_a Bin(a) sum_b Bin(b) max(0, (kappa + a) - e^eps (kappa + b)), symmetric
in x, x' (so it is the worst case over every pair). For each a the positive part is the lower tail b <= B(a),
two binomial CDFs: ``BlanketDivergence`` is O(m) exact, or O(sqrt(m)) on a window of a whose neglected mass it
adds (an upper bound); ``blanket_divergence_grid`` sums the (a, b) grid term by term in log space (O(m^2), a
reference). ``epsilon_blanket`` inverts by bisection; ``dummies_needed`` is the operator's inverse (smallest m
reaching a target). Adding a dummy is a post-processing (draw it and shuffle it in), so the divergence never
grows with m and the search over m is a bisection too.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import gammaln

from ._checks import check_delta, check_epsilon, check_int, check_real
from .binomial import binom_cdf, binom_pmf, binom_sf
from .bisection import smallest_certified, smallest_int
from .composition import chain_composition

__all__ = [
    "BLANKET_RANDOMIZERS",
    "MAX_DUMMIES",
    "BlanketDivergence",
    "blanket_divergence_grid",
    "dummies_needed",
    "epsilon_against_colluders",
    "epsilon_blanket",
    "grr_blanket_weight",
    "oue_blanket_weight",
    "per_report_delta",
]

# Default window: the mass of the dummies' count at x left out on either side is at most this (Bernstein), and
# is added to the divergence anyway, so it trades only tightness (far below any delta in use) for speed.
WINDOW_TAIL = 1e-30
MAX_DUMMIES = 10**9  # the search for m gives up beyond this (a release of a billion dummies is not a plan)
BLANKET_RANDOMIZERS = ("grr", "oue")


def grr_blanket_weight(eps0: float, d: int) -> float:
    """gamma = d/(e^eps0 + d - 1): GRR's output is (1 - gamma) [x] + gamma Uniform[d], the weight of its blanket."""
    eps0 = check_epsilon("eps0", eps0)
    d = check_int("d", d, 2)
    tail = math.exp(-eps0)
    return d * tail / (1.0 + (d - 1) * tail)


def oue_blanket_weight(eps0: float) -> float:
    """gamma = (1 + e^eps0)/(2 e^eps0): OUE's true bit, Bern(1/2), is gamma Bern(q) + (1 - gamma) [1] with
    q = 1/(1 + e^eps0), and its other bits are Bern(q) in both components."""
    eps0 = check_epsilon("eps0", eps0)
    return 0.5 * (1.0 + math.exp(-eps0))


class _Reduction:
    """The two-count reduction of one randomizer among m dummies (module docstring): everything but eps."""

    def __init__(self, randomizer: str, d: int, eps0: float, m: int) -> None:
        self.total = m + 1
        t = math.exp(-eps0)
        if randomizer == "grr":
            q = t / (1.0 + (d - 1) * t)
            gap = 1.0 - d * q  # p - q
            self.w_a, self.r_b, self.b_shrinks = 1.0 / d, 1.0 / (d - 1), True
            self.kappa = q * self.total / gap
            self.log_scale = math.log(d * gap / self.total)
        elif randomizer == "oue":
            q = t / (1.0 + t)
            gap = 1.0 - 2.0 * q  # = tanh(eps0 / 2)
            self.w_a, self.r_b, self.b_shrinks = q, q, False
            self.kappa = self.total * q / gap
            self.log_scale = math.log(gap) - math.log(2.0 * q * (1.0 - q) * self.total)
        else:
            raise ValueError(f"no blanket accounting for {randomizer!r}; known: {', '.join(BLANKET_RANDOMIZERS)}")

    def b_trials(self, a: np.ndarray) -> np.ndarray:
        return self.total - a if self.b_shrinks else np.full(a.shape, self.total)

    def log_joint(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """log J(a, b) (-inf off the support), for the grid."""
        n_b = self.b_trials(a)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = _log_binom(a, self.total, self.w_a) + _log_binom(b, n_b, self.r_b)
        return np.where((b >= 0) & (b <= n_b), out, -np.inf)


def _log_binom(k: np.ndarray, n: np.ndarray | int, p: float) -> np.ndarray:
    """log Bin(k; n, p), with p = 1 handled (all mass at k = n)."""
    k, n = np.asarray(k, dtype=np.float64), np.asarray(n, dtype=np.float64)
    coef = gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1)
    if p >= 1.0:
        return np.where(k == n, 0.0, -np.inf)
    return coef + k * math.log(p) + (n - k) * math.log1p(-p)


def _window(trials: int, w: float, tail: float | None) -> tuple[int, int]:
    """[lo, hi] holding all of Bin(trials, w) except at most ``tail`` per side (Bernstein's inequality:
    Pr[|X - mu| >= t] <= exp(-t^2 / (2 (sigma^2 + t/3))) per side); ``None`` is the whole support."""
    if tail is None:
        return 0, trials
    log_inv = math.log(1.0 / tail)
    mean, var = trials * w, trials * w * (1.0 - w)
    t = log_inv / 3.0 + math.sqrt(log_inv * log_inv / 9.0 + 2.0 * log_inv * var)
    return max(0, math.floor(mean - t)), min(trials, math.ceil(mean + t))


class BlanketDivergence:
    """``eps -> D_{e^eps}(P_x || P_x')`` of one report of ``randomizer`` (d, eps0) among m dummies (replacement).

    ``tail=None`` sums every a in [0, m+1] (exact, O(m)); a number sums a window of the dummies' count at x
    (a is that count, plus one if the victim's report also counts there) and adds the exact binomial mass
    left out (``neglected_mass``), which bounds what the omitted terms contribute (each is at most P_x(a)):
    the value stays an upper bound.
    """

    def __init__(self, d: int, eps0: float, m: int, *, randomizer: str = "grr",
                 tail: float | None = WINDOW_TAIL) -> None:
        self.d = check_int("d", d, 2)
        self.eps0 = check_epsilon("eps0", eps0)
        self.m = check_int("m", m, 0)
        if tail is not None and not 0.0 < check_real("tail", tail) < 1.0:
            raise ValueError(f"tail must lie in (0, 1) or be None, got {tail!r}")
        red = _Reduction(randomizer, self.d, self.eps0, self.m)
        self.randomizer = randomizer
        lo_d, hi_d = _window(self.m, red.w_a, tail)
        a = np.arange(lo_d, min(hi_d + 1, red.total) + 1, dtype=np.int64)
        # a < lo_d means A < lo_d; a > hi_d + 1 means A > hi_d: the P_x-mass of the a left out.
        self.neglected_mass = float(binom_cdf(lo_d - 1, self.m, red.w_a) + binom_sf(hi_d, self.m, red.w_a)) \
            if tail else 0.0
        with np.errstate(divide="ignore"):
            self._weight = np.exp(np.log(binom_pmf(a, red.total, red.w_a)) + red.log_scale)
        self._a, self._n_b, self._r, self._kappa = a, red.b_trials(a), red.r_b, red.kappa

    def __call__(self, eps: float) -> float:
        """The divergence (plus the neglected mass) at central epsilon ``eps`` >= 0."""
        eps = check_epsilon("eps", eps, allow_zero=True)
        e = math.exp(eps)
        a, n_b, r, kappa = self._a, self._n_b, self._r, self._kappa
        # (kappa + a) - e (kappa + b) > 0  <=>  b < beta = (kappa + a)/e - kappa; B = largest such integer.
        top = np.minimum(np.ceil((kappa + a) / e - kappa) - 1.0, n_b).astype(np.int64)
        f_b = binom_cdf(top, n_b, r)
        # sum_{b <= B} b Bin(b; N, r) = N r Pr[Bin(N - 1, r) <= B - 1]
        f_b1 = np.where(n_b > 0, n_b * r * binom_cdf(top - 1, np.maximum(n_b - 1, 0), r), 0.0)
        inner = np.where(top >= 0, (kappa + a - e * kappa) * f_b - e * f_b1, 0.0)
        inner = np.maximum(inner, 0.0)  # every summand is >= 0; clip rounding only
        return float(np.sum(self._weight * inner)) + self.neglected_mass


def blanket_divergence_grid(d: int, eps0: float, m: int, eps: float, *, randomizer: str = "grr") -> float:
    """The same divergence summed term by term over the (a, b) grid in log space: O(m^2), for checking.

    Each term is exp(log P_x(a, b)) * (-expm1(eps + log(kappa + b) - log(kappa + a))), so no difference of two
    nearly equal probabilities is formed.
    """
    d = check_int("d", d, 2)
    eps0 = check_epsilon("eps0", eps0)
    m = check_int("m", m, 0)
    eps = check_epsilon("eps", eps, allow_zero=True)
    red = _Reduction(randomizer, d, eps0, m)
    a, b = np.meshgrid(np.arange(red.total + 1), np.arange(red.total + 1), indexing="ij")
    log_j = red.log_joint(a, b)
    keep = np.isfinite(log_j)
    a, b, log_j = a[keep], b[keep], log_j[keep]
    log_px = log_j + red.log_scale + np.log(red.kappa + a)
    exponent = eps + np.log(red.kappa + b) - np.log(red.kappa + a)
    positive = exponent < 0.0
    terms = np.exp(log_px[positive]) * -np.expm1(exponent[positive])
    return math.fsum(terms.tolist())


def per_report_delta(eps0: float, delta: float, reports_per_client: int) -> float:
    """delta' = delta / sum_{i<k} e^{i eps0}: chaining k report changes (``composition.chain_composition``, the
    rule ``transforms.analyze.central_epsilon`` applies to k reports per device) at per-report (eps, delta')
    totals at most delta for every eps <= eps0, and a blanket epsilon never exceeds eps0."""
    k = check_int("reports_per_client", reports_per_client, 1)
    eps0 = check_epsilon("eps0", eps0)
    delta = check_delta("delta", delta)
    if k * eps0 > 700.0:
        return 0.0
    return delta * math.expm1(eps0) / math.expm1(k * eps0) if k > 1 else delta


def _bisect_epsilon(divergence: BlanketDivergence, delta: float, steps: int) -> float:
    """Smallest certified eps in [0, eps0] (upper end of the bisection, so D(result) <= delta)."""
    # eps0 when even it is not certified: only through the window's neglected mass (the local guarantee holds)
    return smallest_certified(divergence, divergence.eps0, delta, steps)


def epsilon_blanket(
    d: int,
    eps0: float,
    m: int,
    delta: float,
    reports_per_client: int = 1,
    *,
    steps: int = 64,
    randomizer: str = "grr",
    tail: float | None = WINDOW_TAIL,
) -> float:
    """Central epsilon (replacement) of a device's k reports (GRR or OUE over d, eps0) among m blanket dummies.

    Holds against an adversary who knows every other real report of the release exactly (any number of
    colluding devices). One report: the smallest eps with D_{e^eps} <= delta. k reports of one device change
    one at a time (the others, its own included, are post-processing), so the per-report value at
    ``per_report_delta`` is chained k times (``chain_composition``): k * eps at total delta <= ``delta``.
    """
    delta = check_delta("delta", delta)
    k = check_int("reports_per_client", reports_per_client, 1)
    steps = check_int("steps", steps, 1)
    divergence = BlanketDivergence(d, eps0, m, randomizer=randomizer, tail=tail)
    delta_one = per_report_delta(divergence.eps0, delta, k)
    if delta_one < 1e-300:
        return k * divergence.eps0  # nothing certifiable below the plain composition of local guarantees
    eps_one = _bisect_epsilon(divergence, delta_one, steps)
    eps_total, delta_total = chain_composition(eps_one, delta_one, k)
    if delta_total > delta * (1.0 + 1e-9):  # cannot happen while eps_one <= eps0; guard the accounting
        raise AssertionError(f"chained delta {delta_total!r} exceeds {delta!r}")
    return eps_total


def dummies_needed(
    d: int,
    eps0: float,
    eps_target: float,
    delta: float,
    reports_per_client: int = 1,
    *,
    max_dummies: int = MAX_DUMMIES,
    randomizer: str = "grr",
    tail: float | None = WINDOW_TAIL,
) -> int:
    """Smallest m with ``epsilon_blanket(d, eps0, m, delta, k) <= eps_target``: what an operator configures.

    The test at each m is one divergence, D_m(eps_target / k) <= per_report_delta, the exact condition for the
    bisection's result to land at or below the target. D never grows with m (a dummy is post-processing), so
    doubling then bisecting finds the smallest m. Raises if even ``max_dummies`` does not reach the target.
    """
    delta = check_delta("delta", delta)
    eps0 = check_epsilon("eps0", eps0)
    k = check_int("reports_per_client", reports_per_client, 1)
    eps_target = check_epsilon("eps_target", eps_target)
    max_dummies = check_int("max_dummies", max_dummies, 1)
    delta_one = per_report_delta(eps0, delta, k)
    per_report = eps_target / k
    while k * per_report > eps_target:  # k * (t / k) may round above t: keep the chained total within it
        per_report = math.nextafter(per_report, 0.0)
    if delta_one < 1e-300:  # epsilon_blanket reports k * eps0 here, whatever m is
        if eps_target >= k * eps0:
            return 0
        raise ValueError(f"k * eps0 = {k * eps0!r} leaves no per-report delta: no number of dummies helps")
    if per_report >= eps0:
        return 0

    def reaches(m: int) -> bool:
        return BlanketDivergence(d, eps0, m, randomizer=randomizer, tail=tail)(per_report) <= delta_one

    if reaches(0):
        return 0
    high = 1
    while not reaches(high):
        if high >= max_dummies:
            raise ValueError(
                f"more than {max_dummies} dummies would be needed for eps {eps_target!r} at delta {delta!r} "
                f"(d={d}, eps0={eps0!r}, k={k})"
            )
        high = min(2 * high, max_dummies)
    return smallest_int(reaches, high // 2, high)  # reaches(high // 2) is False (or it is 0, checked above)


def epsilon_against_colluders(eps_central_honest: float, eps_blanket: float) -> float:
    """Central epsilon (replacement) of a device when some enrolled devices collude with the analyst.

    With c colluders among n devices and m dummies, the release the adversary sees is a post-processing of
    (i) the n - c honest devices' reports alone (adding the m dummies, whose law is public and independent of
    every input, and the colluders' known reports), so the tight shuffle bound for n - c reports holds
    (``eps_central_honest``, the caller computes it with the existing accountant); and of (ii) the victim's
    report with the m dummies alone (adding everyone else's reports, all independent of the victim's value),
    so ``eps_blanket`` holds. Both are (eps, delta) guarantees at the same delta for the same neighbours, so
    the smaller one holds; (ii) needs no count of colluders at all.
    """
    honest = check_epsilon("eps_central_honest", eps_central_honest, allow_zero=True)
    blanket = check_epsilon("eps_blanket", eps_blanket, allow_zero=True)
    return min(honest, blanket)
