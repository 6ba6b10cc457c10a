"""Unbiasedness and closed-form variance of Hadamard response and the count-mean sketch (Monte-Carlo,
docs/mathematics.md §2.5, §2.6).

R independent runs through the real encode/accumulate/estimate surface, fixed seeds. The count-mean sketch
is unbiased only over the hash family (§2.6), so it is tested twice:

* **conditional on one family** (fixed ``hash_seed``): mean against the exact conditional expectation
  ``(m/(m-1))(P c - n/m)`` and variance against the exact conditional variance (both derived in
  ``count_mean_sketch``); a power check shows the bias ``conditional_mean - c`` is detectable here;
* **averaged over families** (run r uses ``hash_seed = r``): mean against the truth and summed variance
  against the [D✓] formula of §2.6 with its ``c_u^2`` term, with a power check against the naive formula.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.statistical.stats_helpers import SE_MAX, Z_MAX, assert_mean, assert_summed_variance, zipf_counts
from transforms.mechanisms.frequency.count_mean_sketch import CountMeanSketch
from transforms.mechanisms.frequency.hadamard import HadamardResponse
from transforms.mechanisms.randomness import seeded_rng

pytestmark = pytest.mark.slow

# Z_MAX (stats_helpers): Bonferroni over <= 16 coordinates: P(max |z| > 4.5) < 16 * 6.8e-6 ~ 1e-4


def estimates(mechs: list[HadamardResponse] | list[CountMeanSketch], counts: np.ndarray, seed: int) -> np.ndarray:
    """One run per mechanism instance (R x d count estimates); clients encoded in one vectorised call per run."""
    values = np.repeat(np.arange(len(counts)), counts)
    rng = seeded_rng(seed)
    out = np.empty((len(mechs), len(counts)))
    for r, mech in enumerate(mechs):
        acc = mech.new_accumulator()
        acc.add(mech.encode(values, rng))
        out[r] = acc.estimate().count
    return out


def summed_variance_check(est: np.ndarray, mean: np.ndarray, expected: float, label: str) -> float:
    """Summed variance within 4 CLT standard errors, sharp enough to see a 20 % error; returns the error."""
    return assert_summed_variance(est, mean, expected, label, sharpness=0.05)


@pytest.mark.parametrize(("d", "eps", "n", "runs"), [(15, 1.0, 3000, 400), (16, 2.0, 4000, 400), (5, 0.5, 2000, 400)])
def test_hadamard_unbiased_with_closed_form_variance(d: int, eps: float, n: int, runs: int) -> None:
    mech = HadamardResponse(d, eps)
    counts = zipf_counts(d, n)
    est = estimates([mech] * runs, counts, seed=2000 + d)
    var = mech.variance(counts, n)
    assert_mean(est, counts, var, repr(mech))
    summed_variance_check(est, counts, float(var.sum()), repr(mech))


def test_cms_conditional_on_a_fixed_hash_family() -> None:
    """Fixed family: E[c_hat] = (m/(m-1))(P c - n/m) != c, Var = (m/(m-1))^2 sum_u c_u (V1 + P(1-P))."""
    mech, n, runs = CountMeanSketch(12, 2.0, k=3, m=6, hash_seed=5), 3000, 500
    counts = zipf_counts(mech.d, n)
    mean, var = mech.conditional_mean(counts), mech.conditional_variance(counts)
    bias_z = np.abs(mean - counts) / np.sqrt(var / runs)
    assert bias_z.max() > 3 * Z_MAX  # power: testing against the truth would fail for this family
    est = estimates([mech] * runs, counts, seed=31)
    assert_mean(est, mean, var, repr(mech))
    summed_variance_check(est, mean, float(var.sum()), repr(mech))


def test_cms_over_hash_families_matches_corrected_variance() -> None:
    """Averaged over hash_seed: unbiased, and the variance has the c_u^2/(k(m-1)) term of §2.6 [D✓]."""
    d, n, runs, k, m = 12, 600, 3000, 4, 8
    mechs = [CountMeanSketch(d, 2.0, k=k, m=m, hash_seed=r) for r in range(runs)]
    counts = zipf_counts(d, n, s=2.0)  # a heavy head makes the c_u^2 term a large share of the variance
    est = estimates(mechs, counts, seed=57)
    var = mechs[0].variance(counts, n)
    assert_mean(est, counts, var, "cms over hash families")
    se = summed_variance_check(est, counts, float(var.sum()), "cms over hash families")
    naive = var - (float(np.sum(counts**2)) - counts**2) / (k * (m - 1)) + (n - counts) / (k * (m - 1))
    assert float(var.sum() - naive.sum()) > 2 * SE_MAX * se  # power: the naive (n - c_v)/(m-1) would fail
