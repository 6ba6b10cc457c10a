"""The crowd count designed for a year: a thresholded discrete Gaussian, charged only where it costs.

Under replacement DP with one crowd, the number of reports in a window does not change between neighbours,
so the shuffler's noisy count is free and the published odometer is the data part alone. The count costs
only under a claim that makes it data-dependent (docs/mathematics.md §1.5):

* a public ``[crowd] partition`` a device can move across: a replacement moves one device from crowd A to
  crowd B, so two counts change by one each (``charges = 2``);
* ``[crowd] membership = true`` (whether a device reported at all is protected): one count changes by one
  (``charges = 1``); with a partition as well, a window still changes at most two counts.

Where it costs, the count is a discrete Gaussian (Canonne, Kamath and Steinke, "The Discrete Gaussian for
Differential Privacy", 2020) with sigma sized so that one year of windows composes to the spec's
``[crowd] epsilon_year`` at ``delta_year``: Gaussian losses compose like one Gaussian of sigma / sqrt(W), so
a yearly budget buys far less noise -- hence far fewer deleted reports -- than W pure-DP Laplace counts
(measured in docs/mathematics.md §1.5). The release is n_hat = n + Z - T, withheld when Z > T (an abort, the
same under both neighbours). The only infinite-loss outcome is Z = T under the larger count, of mass p(T);
T is the smallest integer that keeps W charges of that mass within half of ``delta_year``.

sigma is first sized with the analytic Gaussian formula (Balle and Wang, "Improving the Gaussian Mechanism
for Differential Privacy", 2018) on the other half of ``delta_year``, then widened by ``SIGMA_MARGIN``
for the lattice; the published figure is never this calibration but the exact PLD composition of the
discrete release (``count_pld``) in the odometer, which tests hold to be <= epsilon_year.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy.special import ndtr

from ._checks import check_delta, check_epsilon, check_int

SECONDS_PER_YEAR = 365 * 86_400
LOW_TAIL_SDS = 12.0
SIGMA_MARGIN = 1.01  # the discrete Gaussian's profile is within a fraction of a percent of the continuous one
GRID_ROOM = 1e-5  # per window: the odometer's finest loss grid, which its pessimistic rounding may add


def count_charges(partition: bool, membership: bool) -> int:
    """Counts that change by one between neighbours in a window: 0 (replacement, one crowd), 1 or 2."""
    return 2 if partition else (1 if membership else 0)


def neighbouring_notion(partition: bool, membership: bool) -> str:
    """The name every published epsilon carries (the ``notion`` column)."""
    base = "replacement across partitions" if partition else "replacement"
    return base + (" + membership" if membership else "")


def windows_per_year(window_seconds: int) -> int:
    """W: the windows one year holds (the count's design horizon)."""
    window_seconds = check_int("window_seconds", window_seconds, 1)
    return max(1, math.ceil(SECONDS_PER_YEAR / window_seconds))


def _gaussian_delta(eps: float, mu: float) -> float:
    """delta(eps) of the Gaussian mechanism with sensitivity / sigma = mu (Balle and Wang 2018, Thm 8)."""
    return float(ndtr(-eps / mu + mu / 2.0) - math.exp(eps) * ndtr(-eps / mu - mu / 2.0))


@lru_cache(maxsize=128)
def design(epsilon_year: float, delta_year: float, windows: int, charges: int) -> tuple[float, int]:
    """(sigma, T) of the discrete Gaussian count meeting (epsilon_year, delta_year) over ``windows`` windows.

    ``charges`` counts of L2 sensitivity sqrt(charges) per window compose like one Gaussian with
    mu = sqrt(charges * windows) / sigma; mu is bisected on half of delta_year at epsilon_year less one
    grid step per window (the odometer's rounding), the other half bounds the windows' infinite-loss mass
    charges * windows * p(T).
    """
    eps = check_epsilon("epsilon_year", epsilon_year)
    delta = check_delta("delta_year", delta_year)
    windows = check_int("windows", windows, 1)
    charges = check_int("charges", charges, 1)
    # The odometer rounds each window's loss up to its grid (>= 1e-5): keep that room for a year of windows.
    target = max(eps / 2.0, eps - windows * GRID_ROOM)
    lo, hi = 1e-6, 50.0  # mu
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _gaussian_delta(target, mid) <= delta / 2.0 else (lo, mid)
    sigma = SIGMA_MARGIN * math.sqrt(charges * windows) / lo
    pmf, offset = _pmf(sigma)
    tail_budget = delta / 2.0 / (charges * windows)
    # p(T) <= budget; the smallest such T >= 0 (p is decreasing in |k|).
    ks = np.arange(pmf.size) - offset
    ok = np.nonzero((ks >= 0) & (pmf <= tail_budget))[0]
    if ok.size == 0:
        raise ValueError(f"delta_year={delta:g} too small for sigma={sigma:g}")
    return sigma, int(ks[ok[0]])


@lru_cache(maxsize=32)
def _pmf(sigma: float) -> tuple[np.ndarray, int]:
    """The discrete Gaussian's pmf on [-K, K], K = ceil(40 sigma) + 40 (the rest is below 1e-300)."""
    k_max = math.ceil(40.0 * sigma) + 40
    ks = np.arange(-k_max, k_max + 1, dtype=np.float64)
    weights = np.exp(-(ks * ks) / (2.0 * sigma * sigma))
    return weights / weights.sum(), k_max


def discrete_gaussian_variance(sigma: float) -> float:
    """E[Z^2] of the discrete Gaussian (slightly below sigma^2 for small sigma): the deletions' variance."""
    pmf, offset = _pmf(float(sigma))
    ks = np.arange(pmf.size) - offset
    return float(np.sum(pmf * ks * ks))


def discrete_gaussian(rng: np.random.Generator, sigma: float) -> int:
    """One draw of the discrete Gaussian N_Z(0, sigma^2) by Canonne-Kamath-Steinke's Algorithm 3.

    A discrete Laplace proposal of scale t = floor(sigma) + 1 accepted with probability
    exp(-(|y| - sigma^2/t)^2 / (2 sigma^2)); integer output, so no floating-point low bits reveal the count.
    """
    t = math.floor(sigma) + 1
    p = -math.expm1(-1.0 / t)
    while True:
        y = int(rng.geometric(p)) - int(rng.geometric(p))
        if rng.random() < math.exp(-((abs(y) - sigma * sigma / t) ** 2) / (2.0 * sigma * sigma)):
            return y


def count_log_pmfs(sigma: float, threshold: int) -> tuple[dict[int | str, float], dict[int | str, float]]:
    """log-pmfs of one thresholded count's release for true counts c + 1 (upper) and c (lower).

    Outcome j = n_hat - c + T (the released size relative to c), or ``"abort"`` (Z > T under either count,
    the same mass under both): under c, j = Z; under c + 1, j = Z + 1, so j = T + 1 exists only under c + 1.
    Outcomes j <= -12 sigma (mass below 1e-31) are merged into ``"low"``: a post-processing, so still an upper
    bound, and a third of the points.
    """
    pmf, offset = _pmf(float(sigma))
    ks = np.arange(pmf.size) - offset
    low = -math.ceil(LOW_TAIL_SDS * sigma)  # outcomes j <= low are merged into one (a post-processing)
    lower_keep = (ks > low) & (ks <= threshold)
    upper_keep = (ks >= low) & (ks <= threshold)
    lower = {int(k): math.log(v) for k, v in zip(ks[lower_keep], pmf[lower_keep], strict=True) if v > 0.0}
    upper = {int(k) + 1: math.log(v) for k, v in zip(ks[upper_keep], pmf[upper_keep], strict=True) if v > 0.0}
    for out, mass in ((lower, pmf[ks <= low].sum()), (upper, pmf[ks < low].sum())):
        if mass > 0.0:
            out["low"] = math.log(float(mass))
    abort = float(pmf[ks > threshold].sum())
    if abort > 0.0:
        lower["abort"] = upper["abort"] = math.log(abort)
    return lower, upper
