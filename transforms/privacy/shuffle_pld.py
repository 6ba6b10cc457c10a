"""Privacy loss distributions (PLDs) of one window's release: the shuffled reports and the crowd count.

Why PLDs: a device that reports every window is in every release of its population, so the analyst's
guarantee is the *composition* of all of them. Composing (eps, delta) pairs (basic or advanced composition)
throws away the shape of each window's privacy curve; composing privacy loss distributions by convolution
(Koskela, Jälkö and Honkela 2020; Meiser and Mohammadi 2018; Google's dp-accounting library) is tight up
to the discretisation, which is rounded pessimistically so the result stays an upper bound.

Shuffled reports. The tight shuffle bound (``shuffle_bound``) certifies that n shuffled reports of an
eps0-LDP randomizer are at least as private as the clone pair (P_alpha, Q_alpha) of docs/mathematics.md §1.2 at
the generic alpha = 1/(e^eps0 + 1) (``certified_alpha``: a mechanism-specific alpha below it leaves the victim
a leftover law and the pair no longer dominates). For a general alpha: the victim outputs 1 / 2 / 0 with
probabilities e^eps0 alpha / alpha / rest under P (1 and 2 swapped under Q) and each of the n - 1 others
outputs 1 or 2 with probability alpha each. The observation is
(m, x): m non-zero outputs of which x are ones. With C ~ Bin(n-1, 2 alpha), b_m = Pr[C = m] and
B_m(k) = Pr[Bin(m-1, 1/2) = k]:

    P(m, x) = A1 B_m(x-1) + A2 B_m(x),   Q(m, x) = A2 B_m(x-1) + A1 B_m(x),
    A1 = b_m (1 - alpha - e^eps0 alpha)/2 + b_{m-1} e^eps0 alpha,   A2 = same with alpha for e^eps0 alpha,

so the privacy loss is log((A1 x + A2 (m-x)) / (A2 x + A1 (m-x))) (B_m(x-1)/B_m(x) = x/(m-x)). Because any
post-processing of a dominating pair is dominated too, the PLD of this pair is a valid PLD for the window
and its hockey-stick curve is exactly the one ``shuffle_bound`` inverts. The pair is symmetric (x <-> m-x
swaps P and Q), so one PLD serves both neighbouring directions. Mass outside a window of ``window_sds``
standard deviations in m and in x is put on +infinity (it then counts fully towards delta): conservative.

Crowd count. The shuffler releases n_hat = floor(n + L - T) (L discrete Laplace with q = e^{-eps_cr/2},
``crowd``) and aborts when n_hat > n, i.e. when L > ceil(T); the abort does not depend on the data. For
counts c (Q) and c + 1 (P) the release has four outcomes, each of constant privacy loss:
``lo`` (n + L <= c), ``mid``, ``top`` (only possible under P: infinite loss, the delta of Thm V.1) and
``abort``. [ESA] Thm V.1 charges two crowds per replacement (a client moving between public partitions:
one count +1, the other -1), so the window's count PLD is that of (P x Q, Q x P), again symmetric. For one
unpartitioned crowd no count changes under replacement, so this is conservative there.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy.special import gammaln

from ._checks import check_delta, check_epsilon, check_int, check_real
from .binomial import binom_cdf, binom_pmf, binom_sf
from .crowd import crowd_threshold
from .crowd_count import count_log_pmfs
from .shuffle_bound import certified_alpha, check_mixture_alpha

__all__ = ["DEFAULT_INTERVAL", "MAX_POINTS", "PLD_WINDOW_SDS", "PLDTooLargeError", "binned_loss", "binned_points",
           "count_pld", "crowd_count_pld", "crowd_count_pmfs", "pld_fits", "pld_from_binned", "shuffle_loss_pmf",
           "shuffle_pld"]

# Loss grid of the PLDs. Pessimistic rounding moves each window's loss up by less than one step, so W
# composed windows overstate eps by at most W * interval (about half that on average): 1e-5 keeps the
# year of hourly windows (8760) within ~0.05 of the exact composition and 365 daily windows within 0.004.
DEFAULT_INTERVAL = 1e-5
# Half-width (standard deviations) of the (m, x) window summed exactly; the rest goes to +infinity.
PLD_WINDOW_SDS = 10.0  # beyond 10 sd: < 1e-22 of mass, counted as infinite loss
# Most (m, x) points one PLD may use (~1.5 s per 5e6). The count grows like n alpha (x grouping helps only
# where the loss is flat in x), so very large crowds at small eps_local exceed it; callers then fall back to
# a documented (eps, delta) pair (``odometer``) instead of running for minutes.
MAX_POINTS = 12_000_000


class PLDTooLargeError(ValueError):
    """The exact PLD would need more than ``MAX_POINTS`` points."""


def _log_binom_half(k: np.ndarray, trials: np.ndarray) -> np.ndarray:
    """log Pr[Bin(trials, 1/2) = k] (-inf outside the support), vectorised through log-gamma."""
    inside = (k >= 0) & (k <= trials)
    kk, tt = np.where(inside, k, 0), np.where(inside, trials, 0)
    out = gammaln(tt + 1.0) - gammaln(kk + 1.0) - gammaln(tt - kk + 1.0) - tt * math.log(2.0)
    return np.where(inside, out, -np.inf)


def _grouped_mass(xs: np.ndarray, xe: np.ndarray, trials: np.ndarray, row: np.ndarray, a1: np.ndarray,
                  a2: np.ndarray) -> np.ndarray:
    """P-mass of each group [xs, xe] of x: A1 Pr[B in [xs-1, xe-1]] + A2 Pr[B in [xs, xe]], B ~ Bin(trials, 1/2).

    The groups of one m tile its x window in order (each starts where the previous ended), so a group's lower
    cdf values are its predecessor's upper ones: two cdf evaluations per group instead of four, the same
    numbers bit for bit (binomial cdfs are most of the cost of a PLD: ~0.4 s per million here).
    """
    upper0, upper1 = binom_cdf(xe - 1, trials, 0.5), binom_cdf(xe, trials, 0.5)
    first = np.ones(xs.shape, dtype=bool)
    first[1:] = (row[1:] != row[:-1]) | (xs[1:] != xe[:-1] + 1)  # a new m (or a gap: then computed directly)
    lower0, lower1 = np.empty_like(upper0), np.empty_like(upper1)
    lower0[1:], lower1[1:] = upper0[:-1], upper1[:-1]
    lower0[first] = binom_cdf(xs[first] - 2, trials[first], 0.5)
    lower1[first] = binom_cdf(xs[first] - 1, trials[first], 0.5)
    return a1 * (upper0 - lower0) + a2 * (upper1 - lower1)


def _pair_rows(n: int, alpha: float, eps_local: float, window_sds: float) -> tuple:
    """(m, b_m, A1, A2, mass outside the m window, P-mass of the outcome m = 0) of the §1.2 clone pair."""
    n = check_int("n", n, 2)
    eps_local = check_epsilon("eps_local", eps_local)
    alpha = check_mixture_alpha(alpha, eps_local)
    width = check_real("window_sds", window_sds)
    trials, p = n - 1, 2.0 * alpha
    mean, sd = trials * p, math.sqrt(trials * p * (1.0 - p))
    c_lo, c_hi = max(0, math.floor(mean - width * sd)), min(trials, math.ceil(mean + width * sd))
    outside = float(binom_cdf(c_lo - 1, trials, p) + binom_sf(c_hi, trials, p))
    m = np.arange(c_lo, c_hi + 2, dtype=np.int64)
    b_m, b_m1 = binom_pmf(m, trials, p), binom_pmf(m - 1, trials, p)
    e_alpha = math.exp(eps_local + math.log(alpha))
    k = b_m * max(0.0, 1.0 - alpha - e_alpha) / 2.0
    zero = float(b_m[0] * max(0.0, 1.0 - alpha - e_alpha)) if m[0] == 0 else 0.0
    return alpha, m, b_m, e_alpha, k + b_m1 * e_alpha, k + b_m1 * alpha, outside, zero


def _x_layout(m: np.ndarray, a1: np.ndarray, a2: np.ndarray, width: float, group_interval: float | None
              ) -> tuple[float, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(P-mass outside the x windows, x_lo, x_hi, group width, points per m) of a pair's rows (m >= 0)."""
    # x window per m: m/2 +- width * sd of Bin(m - 1, 1/2), plus one for the shift between B(x-1) and B(x).
    half = np.ceil(width * np.sqrt(np.maximum(m - 1, 0)) / 2.0).astype(np.int64) + 1
    x_lo = np.maximum(0, m // 2 - half)
    x_hi = np.minimum(m, m // 2 + half)
    # P-mass of x outside [x_lo, x_hi]: A1 Pr[B not in [x_lo-1, x_hi-1]] + A2 Pr[B not in [x_lo, x_hi]].
    mt = np.maximum(m - 1, 0)
    tail1 = binom_cdf(x_lo - 2, mt, 0.5) + binom_sf(x_hi - 1, mt, 0.5)
    tail2 = binom_cdf(x_lo - 1, mt, 0.5) + binom_sf(x_hi, mt, 0.5)
    outside = float(np.sum(np.where(m > 0, a1 * tail1 + a2 * tail2, 0.0)))
    # Consecutive x may share one point (a "group") whose loss is the group's largest: the loss is
    # non-decreasing in x (A1 >= A2), so this only rounds losses up. The width keeps the rounding below
    # ``group_interval`` via the slope bound d loss/dx <= 2 (A1 - A2)/(m A2); None keeps every x.
    group = np.ones(m.shape, dtype=np.int64)
    if group_interval is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            w = np.floor(group_interval * m * a2 / (2.0 * (a1 - a2)))
        group = np.where(np.isfinite(w) & (w > 1), np.minimum(w, 2**40), 1).astype(np.int64)
    counts = np.where(m > 0, (x_hi - x_lo) // group + 1, 0)
    return outside, x_lo, x_hi, group, counts


def _layout(n: int, alpha: float, eps_local: float, window_sds: float, group_interval: float | None) -> tuple:
    """The (m, x) window of the §1.2 pair and its grouping: everything before the PLD's points are built."""
    alpha, m, b_m, e_alpha, a1, a2, outside, _ = _pair_rows(n, alpha, eps_local, window_sds)
    x_out, x_lo, x_hi, width, counts = _x_layout(m, a1, a2, check_real("window_sds", window_sds), group_interval)
    counts = np.where(m == 0, 1, counts)  # the outcome (0, 0): one point
    return alpha, outside + x_out, m, b_m, e_alpha, a1, a2, x_lo, x_hi, width, counts


def _points(m: np.ndarray, a1: np.ndarray, a2: np.ndarray, x_lo: np.ndarray, x_hi: np.ndarray,
            width: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(loss, P-probability) of every point of the rows given (m >= 1), grouped as ``_x_layout`` says."""
    total = int(counts.sum())
    rows = np.repeat(np.arange(m.size), counts)
    start = x_lo[rows] + (np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)) * width[rows]
    x = np.minimum(start + width[rows] - 1, x_hi[rows])  # the group's last x carries its (largest) loss
    mm, big1, big2 = m[rows], a1[rows], a2[rows]
    single = width[rows] == 1
    prob = big1 * np.exp(_log_binom_half(x - 1, mm - 1)) + big2 * np.exp(_log_binom_half(x, mm - 1))
    if not single.all():
        g = ~single
        prob[g] = _grouped_mass(start[g], x[g], np.maximum(mm[g] - 1, 0), rows[g], big1[g], big2[g])
    with np.errstate(divide="ignore", invalid="ignore"):  # A1 = A2 = 0 (underflow) only where prob = 0
        loss = np.log(big1 * x + big2 * (mm - x)) - np.log(big2 * x + big1 * (mm - x))
    keep = prob > 0.0
    return loss[keep], prob[keep]


CHUNK_POINTS = 1 << 18  # points built at once: a few MB of temporaries, whatever the crowd (peak memory)


def binned_loss(m: np.ndarray, a1: np.ndarray, a2: np.ndarray, interval: float, window_sds: float = PLD_WINDOW_SDS
                ) -> tuple[dict[int, float], float]:
    """The P-law of a clone pair's privacy loss (rows m >= 1 with weights A1, A2, possibly several pairs'
    concatenated) rounded UP to multiples of ``interval``, as {index: mass}, and the P-mass left outside the
    x windows (to be put on infinite loss). Built ``CHUNK_POINTS`` points at a time, so the peak memory is
    that of one chunk plus the binned result, not of all points at once."""
    outside, x_lo, x_hi, width, counts = _x_layout(m, a1, a2, window_sds, interval)
    if int(counts.sum()) > MAX_POINTS:
        raise PLDTooLargeError(f"the PLD needs {int(counts.sum()):,} points (> {MAX_POINTS:,})")
    live = (a1 > 0.0) & (a2 > 0.0) & (counts > 0)
    top = float(np.max(np.log(a1[live]) - np.log(a2[live]), initial=0.0))  # |loss| <= log(A1/A2)
    offset = math.ceil(top / interval) + 2
    mass = np.zeros(2 * offset + 1)
    bounds = np.searchsorted(np.cumsum(counts), np.arange(CHUNK_POINTS, int(counts.sum()) + CHUNK_POINTS,
                                                                   CHUNK_POINTS), side="right")
    start = 0
    for stop in np.unique(np.append(np.maximum(bounds, 1), m.size)):
        part = slice(start, max(int(stop), start + 1))
        keep = live[part]
        if keep.any():
            loss, prob = _points(m[part][keep], a1[part][keep], a2[part][keep], x_lo[part][keep], x_hi[part][keep],
                                 width[part][keep], counts[part][keep])
            index = np.ceil(loss / interval - 1e-9).astype(np.int64) + offset  # 1e-9: float noise on multiples
            mass += np.bincount(np.clip(index, 0, 2 * offset), weights=prob, minlength=2 * offset + 1)
        start = part.stop
        if start >= m.size:
            break
    nonzero = np.flatnonzero(mass)
    return {int(i) - offset: float(mass[i]) for i in nonzero}, outside


def binned_points(m: np.ndarray, a1: np.ndarray, a2: np.ndarray, interval: float,
                  window_sds: float = PLD_WINDOW_SDS) -> int:
    """The points ``binned_loss`` of these rows builds (counted, not built): above ``MAX_POINTS`` it raises."""
    return int(_x_layout(m, a1, a2, window_sds, interval)[-1].sum())


def pld_from_binned(pmf: dict[int, float], infinity: float, interval: float) -> pld_lib.PrivacyLossDistribution:
    """A symmetric pair's PLD from its binned loss law (pessimistic rounding already applied)."""
    return pld_lib.PrivacyLossDistribution.create_from_rounded_probability(
        pmf, infinity_mass=min(1.0, infinity), value_discretization_interval=interval, pessimistic_estimate=True)


def pld_fits(n: int, alpha: float, eps_local: float, interval: float = DEFAULT_INTERVAL) -> bool:
    """Whether ``shuffle_pld(n, alpha, eps_local, interval)`` fits ``MAX_POINTS`` (counted, not built)."""
    counts = _layout(n, certified_alpha(alpha, eps_local), eps_local, PLD_WINDOW_SDS, interval)[-1]
    return int(counts.sum()) <= MAX_POINTS


def shuffle_loss_pmf(n: int, alpha: float, eps_local: float, window_sds: float = PLD_WINDOW_SDS,
                     group_interval: float | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """The privacy loss of the clone pair (P_alpha, Q_alpha) at exactly this alpha, under P, as (loss values,
    P-probabilities, mass on +infinity); a privacy bound only at ``certified_alpha`` (what ``shuffle_pld`` uses).

    Exact on the (m, x) window (with ``group_interval``: losses rounded up by less than it, far fewer points
    at large n alpha); the P-mass outside the window is returned separately (an upper bound on it, from
    binomial tails) so the caller can count it as infinite loss. All points at once: for checks; the
    odometer's ``shuffle_pld`` builds the same points in chunks (``binned_loss``).
    """
    alpha, outside, m, b_m, e_alpha, a1, a2, x_lo, x_hi, width, counts = _layout(
        n, alpha, eps_local, window_sds, group_interval)
    if int(counts.sum()) > MAX_POINTS:
        raise PLDTooLargeError(f"the PLD of n={n}, alpha={alpha:g} needs {int(counts.sum()):,} points "
                               f"(> {MAX_POINTS:,})")
    live = m > 0
    loss, prob = _points(m[live], a1[live], a2[live], x_lo[live], x_hi[live], width[live], counts[live])
    if m[0] == 0:
        loss = np.append(loss, 0.0)  # the single outcome (0, 0): same probability under P and Q
        prob = np.append(prob, b_m[0] * max(0.0, 1.0 - alpha - e_alpha))
    keep = prob > 0.0
    return loss[keep], prob[keep], outside


@lru_cache(maxsize=64)
def shuffle_pld(n: int, alpha: float, eps_local: float, interval: float = DEFAULT_INTERVAL
                ) -> pld_lib.PrivacyLossDistribution:
    """PLD of one window of n shuffled reports of an (eps_local, alpha)-mixture randomizer (the clone pair at
    ``certified_alpha``), rounded up to multiples of ``interval`` (pessimistic; x grouped within one more
    ``interval``, so one window's loss is overstated by less than 2 interval), out-of-window mass at +infinity.
    Built in chunks (``binned_loss``). Cached: windows repeat."""
    _, m, _, _, a1, a2, outside, zero = _pair_rows(n, certified_alpha(alpha, eps_local), eps_local, PLD_WINDOW_SDS)
    live = m > 0
    pmf, x_out = binned_loss(m[live], a1[live], a2[live], interval)
    if zero > 0.0:
        pmf[0] = pmf.get(0, 0.0) + zero
    return pld_from_binned(pmf, outside + x_out, interval)


def crowd_count_pmfs(eps_cr: float, delta_cr: float) -> tuple[dict[str, float], dict[str, float]]:
    """The four-outcome release of one thresholded count, for true counts c + 1 (P) and c (Q)."""
    eps_cr = check_epsilon("eps_cr", eps_cr)
    delta_cr = check_delta("delta_cr", delta_cr)
    q = math.exp(-eps_cr / 2.0)
    t = math.ceil(crowd_threshold(eps_cr, delta_cr))  # n_hat = n + L - ceil(T); abort iff L > ceil(T)
    qt = q**t
    p = {"lo": q / (1 + q), "mid": (1 - qt) / (1 + q), "top": (1 - q) * qt / (1 + q), "abort": q * qt / (1 + q)}
    q_ = {"lo": 1 / (1 + q), "mid": (q - q * qt) / (1 + q), "top": 0.0, "abort": q * qt / (1 + q)}
    return p, q_


@lru_cache(maxsize=64)
def crowd_count_pld(eps_cr: float, delta_cr: float, interval: float = DEFAULT_INTERVAL
                    ) -> pld_lib.PrivacyLossDistribution:
    """PLD of one window's crowd count release (two counts change per replacement, [ESA] Thm V.1)."""
    p, q = crowd_count_pmfs(eps_cr, delta_cr)
    upper, lower = {}, {}
    for a in p:  # joint outcome (count +1, count -1): P x Q against Q x P
        for b in p:
            pu, pl = p[a] * q[b], q[a] * p[b]
            if pu > 0.0:
                upper[(a, b)] = math.log(pu)
            if pl > 0.0:
                lower[(a, b)] = math.log(pl)
    return pld_lib.from_two_probability_mass_functions(lower, upper, pessimistic_estimate=True,
                                                       value_discretization_interval=interval)


@lru_cache(maxsize=64)
def count_pld(sigma: float, threshold: int, charges: int, interval: float = DEFAULT_INTERVAL
              ) -> pld_lib.PrivacyLossDistribution:
    """PLD of one window's yearly-designed discrete Gaussian count (``crowd_count``), charged ``charges`` times.

    One charge (membership: one count changes) is the pair (count c + 1, count c) in both directions, which
    differ (only the larger count can show j = T + 1); two charges (a move across a partition: one count up,
    one down) are the pair (P x Q, Q x P), i.e. the add direction composed with the remove direction.
    """
    lower, upper = count_log_pmfs(sigma, threshold)
    one = pld_lib.from_two_probability_mass_functions(lower, upper, value_discretization_interval=interval,
                                                      symmetric=False)
    if charges == 1:
        return one
    reverse = pld_lib.from_two_probability_mass_functions(upper, lower, value_discretization_interval=interval,
                                                          symmetric=False)
    pair = one.compose(reverse)
    return pair if charges == 2 else pair.compose(count_pld(sigma, threshold, charges - 2, interval))
