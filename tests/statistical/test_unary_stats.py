"""Unbiasedness, closed-form variance and message counts of the fragmented unary encodings (Monte-Carlo,
docs/mathematics.md §2.7, §2.8), through the real encode_messages / accumulator / estimate surface, fixed seeds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.statistical.stats_helpers import Z_MAX, assert_mean, assert_summed_variance, zipf_counts
from transforms.mechanisms.frequency.unary import AttributeFragmentedRappor, ReportFragmentedRappor
from transforms.mechanisms.randomness import seeded_rng

pytestmark = pytest.mark.slow

Mech = AttributeFragmentedRappor | ReportFragmentedRappor
# Z_MAX (stats_helpers): Bonferroni over <= 64 coordinates: P(max |z| > 4.5) < 64 * 6.8e-6 ~ 4e-4
MAX_CELLS = 6_000_000  # clients x cap per encode call (memory of the padded rows)


def _width(mech: Mech) -> int:
    return mech.cap if isinstance(mech, AttributeFragmentedRappor) else mech.fragments * mech.fragment_cap


def run_estimates(mech: Mech, counts: np.ndarray, runs: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(R x d count estimates, R x n messages per client); many runs per encode call, one accumulator per run."""
    n = int(counts.sum())
    values = np.repeat(np.arange(mech.d), counts)
    rng = seeded_rng(seed)
    per_call = max(1, MAX_CELLS // (n * _width(mech)))
    est, sent = np.empty((runs, mech.d)), np.empty((runs, n), dtype=np.int64)
    for start in range(0, runs, per_call):
        k = min(per_call, runs - start)
        reports, owner = mech.encode_messages(np.tile(values, k), rng)
        bounds = np.searchsorted(owner, np.arange(k + 1) * n)
        sent[start : start + k] = np.bincount(owner, minlength=k * n).reshape(k, n)
        for j in range(k):
            acc = mech.new_accumulator()
            acc.add(reports[bounds[j] : bounds[j + 1]], n)
            out = acc.estimate()
            est[start + j] = out.count
            np.testing.assert_allclose(out.stderr, np.sqrt(mech.variance(out.count, n)) / n)
    return est, sent


def assert_unbiased(mech: Mech, counts: np.ndarray, est: np.ndarray) -> None:
    assert_mean(est, counts, mech.variance(counts, int(counts.sum())), repr(mech))


def assert_variance(mech: Mech, counts: np.ndarray, est: np.ndarray) -> None:
    """Summed squared error vs summed closed-form variance, with the CLT standard error of the mean of
    ``t_r = ||c_hat_r - c||^2`` (accounts for correlations between coordinates); 4 standard errors."""
    expected = float(np.sum(mech.variance(counts, int(counts.sum()))))
    assert_summed_variance(est, counts, expected, repr(mech), sharpness=0.05)  # sees a 20% error


def assert_messages(mech: Mech, sent: np.ndarray, variance_per_client: float) -> None:
    z = (sent.mean() - mech.expected_messages) / math.sqrt(variance_per_client / sent.size)
    assert abs(z) < Z_MAX, f"{mech!r}: {sent.mean():.4f} messages/client vs {mech.expected_messages:.4f} (z={z:.2f})"


def _unary_message_variance(d: int, p: float, q: float) -> float:
    return p * (1 - p) + (d - 1) * q * (1 - q)


ATTRIBUTE_CASES = [
    (AttributeFragmentedRappor(16, 1.0), 2000, 400),  # cap = d: no truncation possible
    (AttributeFragmentedRappor(48, 3.0), 2000, 400),  # cap < d: the geometric-skipping path
    (AttributeFragmentedRappor(64, 8.55), 3000, 400),  # [ESA]'s high-epsilon regime
]


@pytest.mark.parametrize(("mech", "n", "runs"), ATTRIBUTE_CASES, ids=lambda x: repr(x))
def test_attribute_unbiased_variance_and_messages(mech: AttributeFragmentedRappor, n: int, runs: int) -> None:
    counts = zipf_counts(mech.d, n)
    est, sent = run_estimates(mech, counts, runs, seed=11)
    assert_unbiased(mech, counts, est)
    assert_variance(mech, counts, est)
    # §2.7 [D✓]: Var[h_j] = e^eps / (n (e^eps - 1)^2), the same for every item
    np.testing.assert_allclose(mech.variance(counts, n), n * math.exp(mech.epsilon) / math.expm1(mech.epsilon) ** 2)
    assert_messages(mech, sent, _unary_message_variance(mech.d, mech.p, mech.q))


def test_attribute_messages_on_large_domains() -> None:
    """O(#ones) encoding on [ESA]'s Horse domain (d = 87,680, eps = 8.55: 17.97 messages per client) and on a
    65,536-cell grid at eps = 6: message counts, their spread and the estimate of a heavy item."""
    for mech, heavy in ((AttributeFragmentedRappor(87_680, 8.55), 0.3), (AttributeFragmentedRappor(65_536, 6.0), 0.2)):
        n = 30_000
        values = np.where(np.arange(n) < heavy * n, 7, np.arange(n) % mech.d)
        reports, owner = mech.encode_messages(values, seeded_rng(5))
        sent = np.bincount(owner, minlength=n)
        assert sent.max() <= mech.cap
        var = _unary_message_variance(mech.d, mech.p, mech.q)
        assert_messages(mech, sent[None, :], var)
        assert np.var(sent) == pytest.approx(var, rel=0.1)  # Bern(p) + Bin(d - 1, q) spread
        acc = mech.new_accumulator()
        acc.add(reports, n)
        out = acc.estimate()
        truth = np.bincount(values, minlength=mech.d) / n
        z = (out.frequency[[7, 8, mech.d - 1]] - truth[[7, 8, mech.d - 1]]) / out.stderr[[7, 8, mech.d - 1]]
        assert np.max(np.abs(z)) < Z_MAX


FRAGMENT_CASES = [
    (ReportFragmentedRappor(16, 2.0, 1.0, fragments=4), 2000, 200),  # independent Monte-Carlo: var 2.889e-4
    (ReportFragmentedRappor(40, 4.0, fragments=3), 1000, 200),  # default eps_f; caps < d
]


@pytest.mark.parametrize(("mech", "n", "runs"), FRAGMENT_CASES, ids=lambda x: repr(x))
def test_fragments_unbiased_variance_and_messages(mech: ReportFragmentedRappor, n: int, runs: int) -> None:
    counts = zipf_counts(mech.d, n)
    est, sent = run_estimates(mech, counts, runs, seed=23)
    assert_unbiased(mech, counts, est)
    assert_variance(mech, counts, est)
    if mech.epsilon_fragment == 1.0:
        assert mech.scaled_variance() / n == pytest.approx(2.889e-4, rel=1e-3)
    # messages: tau fragments of the same backstop are correlated, so use the empirical spread for the SE
    z = (sent.mean() - mech.expected_messages) / (sent.std() / math.sqrt(sent.size))
    assert abs(z) < Z_MAX
