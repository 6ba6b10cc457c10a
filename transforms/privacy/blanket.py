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

k-ary randomized response (GRR) over d values at local epsilon eps0 reports x w.p. p = e^eps0/(e^eps0 + d - 1)
and each other value w.p. q = 1/(e^eps0 + d - 1): R(x) = (1 - d q) [x] + d q Uniform[d], so the dummies are
uniform (w = 1/d per value). Write h for the histogram of the m + 1 values the adversary cannot attribute.
Summing over the victim's value y,

    P_x(h) = sum_y P(y | x) Mult_m(h - e_y; uniform) = C(h) (q (m+1) + (p - q) h_x),  C(h) = Mult_{m+1}(h) d/(m+1),

so the likelihood ratio depends on (a, b) = (h_x, h_x') only: (a, b) is sufficient, and the victim's leftover
and the dummies' leftover are exchangeable on the other d - 2 values because *both* are uniform there (the
victim puts q on each of them under x and under x'). With Trin_{m+1}(a, b) = Bin(a; m+1, w) Bin(b; m+1-a, r),
r = w/(1 - w) = 1/(d - 1), and L_a = q (m+1) + (p - q) a, the hockey-stick divergence is

    D_{e^eps}(P_x || P_x') = d/(m+1) sum_{a,b} Trin_{m+1}(a, b) max(0, L_a - e^eps L_b),

symmetric in x, x' (so this is the worst case over every pair). ``blanket_divergence_trinomial`` sums it over
the (a, b) grid in log space (O(m^2), a reference); ``BlanketDivergence`` sums b in closed form with binomial
tails (the positive part is the lower tail b <= B(a)), O(m) exact or O(sqrt(m)) on a window whose neglected
mass it adds (an upper bound). ``epsilon_blanket`` inverts by bisection; ``dummies_needed`` is the operator's
inverse (smallest m reaching a target). Adding a dummy is a post-processing (draw it and shuffle it in), so
the divergence never grows with m and the search over m is a bisection too.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import gammaln

from ._checks import check_delta, check_epsilon, check_int, check_real
from .binomial import binom_cdf, binom_pmf, binom_sf
from .composition import chain_composition

__all__ = [
    "MAX_DUMMIES",
    "BlanketDivergence",
    "blanket_divergence_trinomial",
    "dummies_needed",
    "epsilon_against_colluders",
    "epsilon_blanket",
    "grr_blanket_weight",
    "per_report_delta",
]

# Default window: the mass of Bin(m, w) left out on either side is at most this (Bernstein), and is added to
# the divergence anyway, so it trades only tightness (far below any delta in use) for speed.
WINDOW_TAIL = 1e-30
MAX_DUMMIES = 10**9  # the search for m gives up beyond this (a release of a billion dummies is not a plan)


def grr_blanket_weight(eps0: float, d: int) -> float:
    """gamma = d/(e^eps0 + d - 1): GRR's output is (1 - gamma) [x] + gamma Uniform[d], the weight of its blanket."""
    eps0 = check_epsilon("eps0", eps0)
    d = check_int("d", d, 2)
    tail = math.exp(-eps0)
    return d * tail / (1.0 + (d - 1) * tail)


def _grr_pq(eps0: float, d: int) -> tuple[float, float]:
    """(p, q) of GRR, without overflow for large eps0."""
    tail = math.exp(-eps0)
    q = tail / (1.0 + (d - 1) * tail)
    return 1.0 - (d - 1) * q, q


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
    """``eps -> D_{e^eps}(P_x || P_x')`` for GRR(d, eps0) hidden among m uniform dummies (replacement).

    ``tail=None`` sums every a in [0, m+1] (exact, O(m)); a number sums a window of the dummies' count at x
    and adds the exact binomial mass left out (``neglected_mass``), which bounds what the omitted terms
    contribute (each is at most P_x(a)): the value stays an upper bound.
    """

    def __init__(self, d: int, eps0: float, m: int, *, tail: float | None = WINDOW_TAIL) -> None:
        self.d = check_int("d", d, 2)
        self.eps0 = check_epsilon("eps0", eps0)
        self.m = check_int("m", m, 0)
        if tail is not None and not 0.0 < check_real("tail", tail) < 1.0:
            raise ValueError(f"tail must lie in (0, 1) or be None, got {tail!r}")
        self.p, self.q = _grr_pq(self.eps0, self.d)
        w = 1.0 / self.d
        total = self.m + 1
        lo_d, hi_d = _window(self.m, w, tail)  # window of the dummies' count A at x; a = A + [victim at x]
        a = np.arange(lo_d, min(hi_d + 1, total) + 1, dtype=np.int64)
        # a < lo_d means A < lo_d; a > hi_d + 1 means A > hi_d: the P_x-mass of the a left out.
        self.neglected_mass = float(binom_cdf(lo_d - 1, self.m, w) + binom_sf(hi_d, self.m, w)) if tail else 0.0
        self._a = a
        self._weight = binom_pmf(a, total, w) * (self.d / total)
        self._rest = total - a  # b ~ Bin(rest, 1/(d-1)) given a (for d = 2, b = rest)
        self._qm = self.q * total
        self._gap = self.p - self.q

    def __call__(self, eps: float) -> float:
        """The divergence (plus the neglected mass) at central epsilon ``eps`` >= 0."""
        eps = check_epsilon("eps", eps, allow_zero=True)
        e = math.exp(eps)
        a, rest, qm, gap = self._a, self._rest, self._qm, self._gap
        l_a = qm + gap * a
        if self.d == 2:  # b = m + 1 - a exactly
            inner = np.maximum(0.0, l_a - e * (qm + gap * rest))
        else:
            # L_a - e L_b > 0  <=>  b < beta = (L_a / e - q (m+1)) / (p - q); B = largest such integer.
            beta = (l_a / e - qm) / gap
            top = np.minimum(np.ceil(beta) - 1.0, rest).astype(np.int64)
            r = 1.0 / (self.d - 1)
            f_b = binom_cdf(top, rest, r)
            # sum_{b <= B} b Bin(b; N, r) = N r Pr[Bin(N - 1, r) <= B - 1]
            f_b1 = np.where(rest > 0, rest * r * binom_cdf(top - 1, np.maximum(rest - 1, 0), r), 0.0)
            inner = np.where(top >= 0, (l_a - e * qm) * f_b - e * gap * f_b1, 0.0)
            inner = np.maximum(inner, 0.0)  # every summand is >= 0; clip rounding only
        return float(np.sum(self._weight * inner)) + self.neglected_mass


def blanket_divergence_trinomial(d: int, eps0: float, m: int, eps: float) -> float:
    """The same divergence summed term by term over the (a, b) grid in log space: O(m^2), for checking.

    Each term is exp(log P_x(a, b)) * (-expm1(eps + log L_b - log L_a)), so no difference of two nearly equal
    probabilities is formed; for d = 2 only a + b = m + 1 has mass.
    """
    d = check_int("d", d, 2)
    eps0 = check_epsilon("eps0", eps0)
    m = check_int("m", m, 0)
    eps = check_epsilon("eps", eps, allow_zero=True)
    p, q = _grr_pq(eps0, d)
    total = m + 1
    a, b = np.meshgrid(np.arange(total + 1), np.arange(total + 1), indexing="ij")
    c = total - a - b
    valid = c >= 0 if d > 2 else c == 0
    a, b, c = a[valid], b[valid], c[valid]
    log_w = -math.log(d)
    log_rest = math.log1p(-2.0 / d) * c if d > 2 else np.zeros(c.shape)
    log_trin = gammaln(total + 1) - gammaln(a + 1) - gammaln(b + 1) - gammaln(c + 1) + (a + b) * log_w + log_rest
    log_la = np.log(q * total + (p - q) * a)
    log_lb = np.log(q * total + (p - q) * b)
    log_px = log_trin + math.log(d / total) + log_la
    exponent = eps + log_lb - log_la
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
    low, high = 0.0, divergence.eps0
    if divergence(high) > delta:
        return high  # only through the window's neglected mass: the local guarantee still holds
    for _ in range(steps):
        middle = 0.5 * (low + high)
        if divergence(middle) <= delta:
            high = middle
        else:
            low = middle
    return high


def epsilon_blanket(
    d: int,
    eps0: float,
    m: int,
    delta: float,
    reports_per_client: int = 1,
    *,
    steps: int = 64,
    tail: float | None = WINDOW_TAIL,
) -> float:
    """Central epsilon (replacement) of a device's k GRR(d, eps0) reports hidden among m uniform dummies.

    Holds against an adversary who knows every other real report of the release exactly (any number of
    colluding devices). One report: the smallest eps with D_{e^eps} <= delta. k reports of one device change
    one at a time (the others, its own included, are post-processing), so the per-report value at
    ``per_report_delta`` is chained k times (``chain_composition``): k * eps at total delta <= ``delta``.
    """
    delta = check_delta("delta", delta)
    k = check_int("reports_per_client", reports_per_client, 1)
    steps = check_int("steps", steps, 1)
    divergence = BlanketDivergence(d, eps0, m, tail=tail)
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
    if delta_one < 1e-300:  # epsilon_blanket reports k * eps0 here, whatever m is
        if eps_target >= k * eps0:
            return 0
        raise ValueError(f"k * eps0 = {k * eps0!r} leaves no per-report delta: no number of dummies helps")
    if per_report >= eps0:
        return 0

    def reaches(m: int) -> bool:
        return BlanketDivergence(d, eps0, m, tail=tail)(per_report) <= delta_one

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
    low = high // 2  # reaches(low) is False (or low = 0, checked above)
    while high - low > 1:
        middle = (low + high) // 2
        if reaches(middle):
            high = middle
        else:
            low = middle
    return high


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
