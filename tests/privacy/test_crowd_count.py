"""The yearly crowd count: design formulas, the sampler's law, and the odometer's count PLD against an exact
integer-lattice composition computed here (numpy convolutions of the privacy loss, not dp_accounting).

Lattice: under the larger count c + 1 the released outcome j = Z + 1 has privacy loss (2Z + 1)/(2 sigma^2) for
Z < T, infinite loss at Z = T, 0 on an abort (Z > T); under c it is -(2Z - 1)/(2 sigma^2) for Z <= T. So every
finite loss is an integer multiple of u = 1/(2 sigma^2) and W windows compose exactly by convolving integers.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.signal import fftconvolve
from scipy.special import ndtr

from transforms.privacy.crowd_count import (
    count_charges,
    design,
    discrete_gaussian,
    discrete_gaussian_variance,
    neighbouring_notion,
    windows_per_year,
)
from transforms.privacy.odometer import WindowRelease, compose_with_delta
from transforms.privacy.shuffle_pld import count_pld

DELTA = 1e-6


def _dg_pmf(sigma: float, half: int) -> tuple[np.ndarray, np.ndarray]:
    k = np.arange(-half, half + 1)
    w = np.exp(-(k.astype(float) ** 2) / (2 * sigma * sigma))
    return k, w / w.sum()


def _lattice(sigma: float, threshold: int, charges: int) -> list[tuple[np.ndarray, int, float]]:
    """Per direction: (pmf of the loss in units u over integers from ``offset``, offset, infinite mass)."""
    k, p = _dg_pmf(sigma, math.ceil(30 * sigma))
    # remove direction (under c + 1): loss 2Z + 1 for Z < T, inf at Z = T, 0 on abort
    up_loss = np.where(k < threshold, 2 * k + 1, 0)
    up_mass = np.where(k < threshold, p, 0.0)
    up_inf, abort = float(p[k == threshold].sum()), float(p[k > threshold].sum())
    # add direction (under c): loss -(2Z - 1) for Z <= T, 0 on abort
    down_loss = np.where(k <= threshold, -(2 * k - 1), 0)
    down_mass = np.where(k <= threshold, p, 0.0)

    def pmf(loss: np.ndarray, mass: np.ndarray, extra_zero: float) -> tuple[np.ndarray, int]:
        lo = int(loss.min())
        out = np.bincount(loss - lo, weights=mass)
        out[-lo] += extra_zero
        return out, lo

    up, down = pmf(up_loss, up_mass, abort), pmf(down_loss, down_mass, abort)
    if charges == 1:
        return [(up[0], up[1], up_inf), (down[0], down[1], 0.0)]
    # two counts: (P x Q, Q x P) -- one count's remove direction plus the other's add direction, both ways
    both = fftconvolve(up[0], down[0])
    return [(np.maximum(both, 0.0), up[1] + down[1], up_inf)]


def _power(pmf: np.ndarray, offset: int, inf: float, times: int) -> tuple[np.ndarray, int, float]:
    result, r_off, r_fin = np.array([1.0]), 0, 1.0
    base, b_off, b_fin = pmf / pmf.sum() * (1 - inf), offset, 1.0 - inf
    while times:
        if times & 1:
            result, r_off, r_fin = np.maximum(fftconvolve(result, base), 0.0), r_off + b_off, r_fin * b_fin
        times >>= 1
        if times:
            base, b_off, b_fin = np.maximum(fftconvolve(base, base), 0.0), 2 * b_off, b_fin * b_fin
    return result, r_off, 1.0 - r_fin


def _delta(eps: float, sigma: float, threshold: int, charges: int, windows: int) -> float:
    """Exact hockey-stick divergence of W composed count releases at eps (the worse direction)."""
    u = 1.0 / (2 * sigma * sigma)
    worst = 0.0
    for pmf, offset, inf in _lattice(sigma, threshold, charges):
        composed, off, inf_w = _power(pmf, offset, inf, windows)
        loss = (np.arange(composed.size) + off) * u
        above = loss > eps
        worst = max(worst, inf_w + float(np.sum(composed[above] * -np.expm1(eps - loss[above]))))
    return worst


def test_notions_and_charges() -> None:
    assert count_charges(False, False) == 0 and neighbouring_notion(False, False) == "replacement"
    assert count_charges(True, False) == 2 and count_charges(False, True) == 1 and count_charges(True, True) == 2
    assert neighbouring_notion(True, True) == "replacement across partitions + membership"
    assert windows_per_year(86_400) == 365 and windows_per_year(3600) == 8760


@pytest.mark.parametrize(("windows", "charges"), [(365, 1), (365, 2), (8760, 2)])
def test_design_meets_its_formulas(windows: int, charges: int) -> None:
    sigma, threshold = design(1.0, DELTA, windows, charges)
    mu = math.sqrt(charges * windows) / sigma
    # analytic Gaussian (Balle and Wang 2018) of the composed mechanism, at half of delta_year
    analytic = ndtr(-1.0 / mu + mu / 2) - math.e * ndtr(-1.0 / mu - mu / 2)
    assert analytic <= DELTA / 2
    k, p = _dg_pmf(sigma, math.ceil(30 * sigma))
    at = {int(a): float(b) for a, b in zip(k, p, strict=True)}
    budget = DELTA / 2 / (charges * windows)
    assert at[threshold] <= budget < at[threshold - 1]  # the smallest threshold whose top mass fits


@pytest.mark.parametrize(("charges", "windows"), [pytest.param(1, 365, marks=pytest.mark.slow),
                                                  pytest.param(2, 365, marks=pytest.mark.slow), (2, 30)])
def test_count_pld_against_the_exact_lattice(charges: int, windows: int) -> None:
    """The odometer's yearly count cost is certified by the exact lattice composition (delta at its epsilon
    within the delta it reports) and tight (1% less epsilon needs more delta); at the default design it is
    <= the spec's epsilon_year = 1."""
    sigma, threshold = design(1.0, DELTA, 365, charges)
    only = WindowRelease(None, None, 0, approx_epsilon=0.0, approx_delta=0.0, count_sigma=sigma,
                         count_threshold=threshold, count_charges=charges)
    eps, delta_cum, _ = compose_with_delta([only] * windows, DELTA)
    assert _delta(eps, sigma, threshold, charges, windows) <= delta_cum * (1 + 1e-6)
    assert _delta(eps * 0.99, sigma, threshold, charges, windows) > delta_cum
    if windows == 365:
        assert eps <= 1.0
        assert delta_cum <= 2 * DELTA


@pytest.mark.slow
def test_a_20_percent_optimistic_count_accountant_is_caught() -> None:
    """The lattice check above is not vacuous: 20% less epsilon than the odometer's is not certified."""
    sigma, threshold = design(1.0, DELTA, 365, 2)
    only = WindowRelease(None, None, 0, approx_epsilon=0.0, approx_delta=0.0, count_sigma=sigma,
                         count_threshold=threshold, count_charges=2)
    eps, delta_cum, _ = compose_with_delta([only] * 365, DELTA)
    assert _delta(0.8 * eps, sigma, threshold, 2, 365) > 3 * delta_cum


def test_count_pld_is_asymmetric_for_one_count() -> None:
    sigma, threshold = design(1.0, DELTA, 365, 1)
    pld = count_pld(sigma, threshold, 1)
    assert pld._pmf_add is not None


DRAWS = 20_000


@pytest.mark.parametrize(("sigma", "seed"), [(3.3, 11), (119.1, 12)])
def test_discrete_gaussian_law(sigma: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    draws = np.array([discrete_gaussian(rng, sigma) for _ in range(DRAWS)], dtype=np.int64)
    k, p = _dg_pmf(sigma, math.ceil(30 * sigma))
    var = float(np.sum(p * k * k))
    mu4 = float(np.sum(p * k**4))
    assert var == pytest.approx(discrete_gaussian_variance(sigma), rel=1e-9)
    # 4 standard errors on the mean and on the sample variance ((mu4 - var^2)/N), fixed seed
    assert abs(draws.mean()) < 4 * math.sqrt(var / DRAWS)
    assert abs(draws.var(ddof=1) - var) < 4 * math.sqrt((mu4 - var**2) / DRAWS)
    # Pr[Z = 0] and Pr[|Z| <= sigma]: binomial standard errors, 4.5 SE
    events = ((draws == 0, float(p[k == 0][0])), (np.abs(draws) <= sigma, float(p[np.abs(k) <= sigma].sum())))
    for event, prob in events:
        assert abs(event.mean() - prob) < 4.5 * math.sqrt(prob * (1 - prob) / DRAWS)
