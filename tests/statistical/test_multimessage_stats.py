"""Unbiasedness and variance of the [MultiMsg] multi-message protocols (Monte-Carlo, docs/mathematics.md §7.1, §7.2).

R independent runs on a fixed dataset through the real encode -> accumulate(clients) -> estimate surface,
with fixed seeds. Hadamard: the §7.1 estimator is exactly unbiased with a closed-form variance. Count-min:
the estimate's exact mean and variance given the public hashes and the data (collisions included) come from
``P[min_r (a_r + N_r) >= m] = prod_r P[N >= m - a_r]`` (``exact_moments``); for collision-free items they
reduce to the closed form the estimator reports (``variance``), which we test separately.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.statistical.stats_helpers import assert_mean, assert_summed_variance, zipf_counts
from transforms.mechanisms.multimessage.protocols import CountMinMultiRR, MultiMessageHadamard
from transforms.mechanisms.randomness import seeded_rng

pytestmark = pytest.mark.slow

# Z_MAX (stats_helpers): Bonferroni over <= 30 coordinates: P(max |z| > 4.5) < 30 * 6.8e-6 ~ 2e-4


def run_estimates(mech: MultiMessageHadamard | CountMinMultiRR, sets: np.ndarray, runs: int, seed: int,
                  per_call: int = 20) -> np.ndarray:
    """R x d count estimates; several runs are encoded per call, each run accumulated in two halves + merge."""
    n = len(sets)
    rng = seeded_rng(seed)
    out = np.empty((runs, mech.d))
    for start in range(0, runs, per_call):
        k = min(per_call, runs - start)
        reports, owner = mech.encode_sets(np.concatenate([sets] * k), rng)
        bounds = np.searchsorted(owner, np.arange(0, k * n + 1, n // 2 if n % 2 == 0 else n))
        step = 2 if n % 2 == 0 else 1
        for j in range(k):
            parts = []
            for h in range(step):
                acc = mech.new_accumulator()
                lo, hi = bounds[j * step + h], bounds[j * step + h + 1]
                acc.add(reports[lo:hi], n // step)
                parts.append(acc)
            for other in parts[1:]:
                parts[0].merge(other)
            out[start + j] = parts[0].estimate().count
    return out


def assert_variance(est: np.ndarray, mean: np.ndarray, var: np.ndarray) -> None:
    """Summed squared deviation from the exact mean vs summed variance (sharp enough to see a 25% error)."""
    assert_summed_variance(est, mean, float(np.sum(var)))


def test_hadamard_single_values() -> None:
    mech = MultiMessageHadamard(20, 1.0, 1e-6, n_expected=1000, rho=8)
    counts = zipf_counts(mech.d, 1000)
    est = run_estimates(mech, np.repeat(np.arange(mech.d), counts), runs=300, seed=11)
    var = mech.variance(counts, 1000)
    assert_mean(est, counts, var)
    assert_variance(est, counts, var)


def test_hadamard_sets() -> None:
    # n = 256, B' = 16, k_set = 2, rho = 4; sets of 1 or 2 elements (dummies pad them).
    mech = MultiMessageHadamard(13, 1.0, 1e-6, n_expected=256, k_set=2, rho=4)
    assert mech.order == 16
    rng = np.random.default_rng(5)
    first = rng.integers(0, 13, 256)
    second = np.where(rng.random(256) < 0.6, (first + 1 + rng.integers(0, 12, 256)) % 13, -1)
    sets = np.stack([first, second], axis=1)
    counts = np.bincount(sets[sets >= 0], minlength=13)
    est = run_estimates(mech, sets, runs=400, seed=12)
    var = mech.variance(counts, 256)
    assert_mean(est, counts, var)
    assert_variance(est, counts, var)


@pytest.mark.parametrize("estimator", ["debiased", "paper"])
def test_countmin_exact_moments_with_collisions(estimator: str) -> None:
    mech = CountMinMultiRR(30, 1.0, 1e-6, n_expected=500, rows=4, buckets=24, gamma=0.05, estimator=estimator)
    counts = zipf_counts(mech.d, 500)
    mean, var = mech.exact_moments(counts)
    assert np.any(mean - counts > 0.5)  # collisions with heavy items do bias some items upwards
    est = run_estimates(mech, np.repeat(np.arange(mech.d), counts), runs=400, seed=13)
    assert_mean(est, mean, var)
    assert_variance(est, mean, var)


def collision_free(estimator: str = "debiased") -> CountMinMultiRR:
    """A small table whose public hashes put the 12 items in distinct buckets of every row."""
    for seed in range(100):
        mech = CountMinMultiRR(12, 1.0, 1e-6, n_expected=400, rows=3, buckets=256, gamma=0.02, hash_seed=seed,
                               estimator=estimator)
        if all(len(set(mech.hash_table[r])) == mech.d for r in range(mech.rows_)):
            return mech
    raise AssertionError("no collision-free hash seed below 100")


def test_countmin_collision_free_closed_form() -> None:
    mech = collision_free()
    counts = zipf_counts(mech.d, 400)
    mean, var = mech.exact_moments(counts)
    np.testing.assert_allclose(mean, counts, atol=1e-9)  # the debiased estimator is unbiased without collisions
    np.testing.assert_allclose(var, mech.variance(counts, 400), rtol=1e-9)
    est = run_estimates(mech, np.repeat(np.arange(mech.d), counts), runs=400, seed=14)
    assert_mean(est, counts, var)
    assert_variance(est, counts, var)
    # the paper's gamma n offset is biased low by E[min_r N_r] - gamma n < 0 (min of 3 noises)
    paper = collision_free("paper")
    bias = paper.exact_moments(counts)[0] - counts
    assert np.all(bias < -0.5) and np.ptp(bias) < 1e-9


def test_countmin_reported_stderr_is_the_closed_form() -> None:
    mech = collision_free()
    reports, _ = mech.encode_messages(np.arange(400) % 12, seeded_rng(15))
    acc = mech.new_accumulator()
    acc.add(reports, 400)
    result = acc.estimate()
    np.testing.assert_allclose(result.stderr * 400, np.sqrt(mech.noise_min_moments(400)[1]), rtol=1e-12)
    assert result.extras["collision_free_bias"] == pytest.approx(0.0, abs=1e-9)
