"""LLH is exactly unbiased, its closed-form variance is exact, and distinct items' estimates are uncorrelated
(Monte-Carlo against docs/mathematics.md §2.4; the claims of ``linear_hashing``'s docstring)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.statistical.stats_helpers import SE_MAX, assert_mean, assert_summed_variance, zipf_counts
from transforms.mechanisms.frequency.linear_hashing import LinearLocalHashing
from transforms.mechanisms.randomness import seeded_rng

pytestmark = pytest.mark.slow

# Z_MAX (stats_helpers): Bonferroni over <= 64 coordinates: P(max |z| > 4.5) < 64 * 6.8e-6 ~ 4e-4


def run(m: LinearLocalHashing, counts: np.ndarray, runs: int, seed: int) -> np.ndarray:
    n = int(counts.sum())
    values = np.repeat(np.arange(m.d), counts)
    rng = seeded_rng(seed)
    reports = m.encode(np.tile(values, runs), rng)
    out = np.empty((runs, m.d))
    for r in range(runs):
        acc = m.new_accumulator()
        acc.add(reports[r * n : (r + 1) * n])
        out[r] = acc.estimate().count
    return out


@pytest.mark.parametrize("m,n,runs", [(LinearLocalHashing(64, 1.0), 2000, 400),
                                      (LinearLocalHashing(50, 3.0), 2000, 400)], ids=repr)
def test_unbiased_exact_variance_and_uncorrelated(m: LinearLocalHashing, n: int, runs: int) -> None:
    counts = zipf_counts(m.d, n)
    est = run(m, counts, runs, seed=2024)
    var = m.variance(counts, n)
    assert_mean(est, counts, var, repr(m))
    assert_summed_variance(est, counts, var.sum(), repr(m), sharpness=0.05)
    # zero covariance: the error of the SUM of all items has variance sum_v Var_v (no cross terms)
    total = (est - counts).sum(axis=1)
    ratio = np.mean(total**2) / var.sum()
    assert abs(ratio - 1.0) < SE_MAX * np.sqrt(2.0 / runs), ratio
