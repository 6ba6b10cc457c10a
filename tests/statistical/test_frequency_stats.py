"""Unbiasedness and closed-form variance of GRR, OUE and OLH (Monte-Carlo, docs/mathematics.md §2.1-2.3).

R independent runs on a fixed Zipf-like dataset, each encoded, accumulated and estimated through the
real Mechanism/Accumulator surface, with a fixed seed (a failure is reproducible, not flaky by design).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.statistical.stats_helpers import Z_MAX, assert_mean, assert_summed_variance, zipf_counts
from transforms.mechanisms.frequency.oracles import GRR, OLH, OUE
from transforms.mechanisms.randomness import seeded_rng

pytestmark = pytest.mark.slow

Mech = GRR | OUE | OLH
# Z_MAX (stats_helpers): Bonferroni over <= 16 coordinates: P(max |z| > 4.5) < 16 * 6.8e-6 ~ 1e-4


def run_estimates(mech: Mech, counts: np.ndarray, runs: int, seed: int) -> np.ndarray:
    """R x d count estimates; clients are encoded many runs at a time (vectorised), decoded run by run."""
    n = int(counts.sum())
    values = np.repeat(np.arange(mech.d), counts)
    rng = seeded_rng(seed)
    per_call = max(1, 400_000 // (n * (mech.d if isinstance(mech, OUE) else 1) // 8 + 1))
    out = np.empty((runs, mech.d))
    for start in range(0, runs, per_call):
        k = min(per_call, runs - start)
        reports = mech.encode(np.tile(values, k), rng)
        for j in range(k):
            acc = mech.new_accumulator()
            acc.add(reports[j * n : (j + 1) * n])
            out[start + j] = acc.estimate().count
    return out


def assert_unbiased(mech: Mech, counts: np.ndarray, est: np.ndarray) -> None:
    assert_mean(est, counts, mech.variance(counts, int(counts.sum())), repr(mech))


def assert_variance(mech: Mech, counts: np.ndarray, est: np.ndarray) -> None:
    """Summed squared error vs summed closed-form variance.

    Centering on the truth (the estimators are unbiased), ``t_r = ||c_hat_r - c||^2`` are R i.i.d. draws
    with mean ``sum_v Var_v``; their sample mean has standard error ``std(t_r)/sqrt(R)`` by the CLT, which
    accounts for the correlations between coordinates that a per-coordinate ``sqrt(2/(R-1))`` rule would
    ignore. We allow 4 such standard errors.
    """
    expected = float(np.sum(mech.variance(counts, int(counts.sum()))))
    assert_summed_variance(est, counts, expected, repr(mech), sharpness=0.05)  # sees a 20% error


CASES = [
    (GRR(8, 1.0), 3000, 400),
    (GRR(16, 2.0), 4000, 400),
    (OUE(12, 0.5), 3000, 400),
    (OUE(16, 2.0), 3000, 400),
    (OLH(16, 1.0, seed_family=2**14), 3000, 300),  # large family: fully-random-hash variance applies
]


@pytest.mark.parametrize(("mech", "n", "runs"), CASES, ids=[repr(c[0]) for c in CASES])
def test_unbiased_with_closed_form_variance(mech: Mech, n: int, runs: int) -> None:
    counts = zipf_counts(mech.d, n)
    est = run_estimates(mech, counts, runs, seed=1000 + mech.d + n)
    assert_unbiased(mech, counts, est)
    assert_variance(mech, counts, est)


def test_olh_default_family_is_exactly_unbiased() -> None:
    """With the default 1024 seeds the textbook decoder is measurably biased; ours is not."""
    mech, n, runs = OLH(12, 1.5), 4000, 400
    counts = zipf_counts(mech.d, n)
    g = mech.buckets
    textbook_bias = (mech.expected_support(counts) - n / g) / (mech.p - 1 / g) - counts
    se_mean = np.sqrt(mech.variance(counts, n) / runs)
    assert np.max(np.abs(textbook_bias) / se_mean) > 2 * Z_MAX  # so this test has power against it
    est = run_estimates(mech, counts, runs, seed=77)
    assert_unbiased(mech, counts, est)
