"""Range answers are unbiased and their stated standard errors match the empirical spread (Monte-Carlo,
docs/mathematics.md §5), plus the contract: 1e5 clients on [0, 2^16), median and random ranges.

Every configuration is replicated R times on a fixed dataset with fixed seeds; the stated stderr is a plug-in,
so we compare the mean squared error with the mean stated variance (summed over a set of queries, whose
sample mean has a CLT standard error that accounts for the correlation between queries).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.statistical.stats_helpers import lumpy_leaves
from transforms.mechanisms.randomness import seeded_rng
from transforms.mechanisms.ranges.dyadic import DyadicRange, bucketize
from transforms.mechanisms.ranges.rectangles import DyadicRectangle

pytestmark = pytest.mark.slow

Z_MAX = 4.5  # Bonferroni over <= 12 queries
SE_MAX = 4.0


def queries(bits: int) -> tuple[np.ndarray, np.ndarray]:
    size = 1 << bits
    lo = np.array([0, 0, 0, size // 4, size // 3, 5, size // 2, size - 7, 1, size // 8, 0])
    hi = np.array([size // 2, size // 3, 1, 3 * size // 4, size // 3 + 3, size - 5, size, size, 2, size // 8 + 1,
                   size * 3 // 10])
    return lo, hi


def truth(values: np.ndarray, bits: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    cum = np.concatenate(([0], np.cumsum(np.bincount(values, minlength=1 << bits))))
    return (cum[hi] - cum[lo]).astype(np.float64)


def check(est: np.ndarray, var: np.ndarray, exact: np.ndarray, label: str) -> None:
    runs = est.shape[0]
    spread = est.std(axis=0, ddof=1)
    moving = spread > 0
    z = (est.mean(axis=0) - exact)[moving] / (spread[moving] / np.sqrt(runs))
    assert np.max(np.abs(z)) < Z_MAX, f"{label}: bias z = {np.round(z, 2)}"
    t = ((est - exact) ** 2).sum(axis=1)
    stated = var.sum(axis=1)
    diff = t - stated
    se = diff.std(ddof=1) / np.sqrt(runs)
    assert abs(diff.mean()) < SE_MAX * se, f"{label}: MSE {t.mean():.1f} vs stated {stated.mean():.1f} (se {se:.1f})"
    assert se < 0.12 * stated.mean(), f"{label}: too few runs to see a 50% error in the stderr"


CONFIGS = [
    (dict(bits=8, epsilon=2.0, oracle="llh", levels="sample"), 3000, 250),
    (dict(bits=6, epsilon=6.0, oracle="llh", levels="sample"), 2000, 250),  # level sampling dominates
    (dict(bits=8, epsilon=1.0, oracle="grr", levels="sample", branching=4), 3000, 250),
    (dict(bits=6, epsilon=4.0, oracle="llh", levels="all"), 2000, 250),
    (dict(bits=6, epsilon=3.0, oracle="grr", levels="all"), 2000, 250),
    (dict(bits=4, epsilon=1.0, oracle="oue", levels="sample"), 2000, 250),
]


@pytest.mark.parametrize("config,n,runs", CONFIGS, ids=[str(c[0]) for c in CONFIGS])
def test_range_answers_unbiased_with_exact_stderr(config: dict, n: int, runs: int) -> None:
    m = DyadicRange(**config)
    values = lumpy_leaves(m.bits, n, seed=7)
    lo, hi = queries(m.bits)
    exact = truth(values, m.bits, lo, hi)
    rng = seeded_rng(1000 + m.bits)
    est, var = np.empty((runs, lo.size)), np.empty((runs, lo.size))
    for r in range(runs):
        acc = m.new_accumulator()
        acc.add(m.encode(values, rng), n)
        e, s = acc.estimate().answers(lo, hi)
        est[r], var[r] = e, s**2
    check(est, var, exact, str(config))


@pytest.mark.parametrize("oracle,eps,branching", [("grr", 2.0, 2), ("llh", 6.0, 4)])
def test_rectangle_answers_unbiased_with_exact_stderr(oracle: str, eps: float, branching: int) -> None:
    m = DyadicRectangle(4, 4, eps, oracle=oracle, branching=branching)
    rng = seeded_rng(31)
    n, runs = 3000, 200
    points = np.stack([lumpy_leaves(4, n, seed=1), lumpy_leaves(4, n, seed=2)[::-1]], axis=1)
    rects = [(0, 8, 0, 8), (3, 13, 2, 9), (0, 16, 5, 6), (7, 8, 0, 16), (1, 15, 1, 15), (0, 16, 0, 16)]
    exact = np.array([np.sum((points[:, 0] >= a) & (points[:, 0] < b) & (points[:, 1] >= c) & (points[:, 1] < d))
                      for a, b, c, d in rects], dtype=np.float64)
    est, var = np.empty((runs, len(rects))), np.empty((runs, len(rects)))
    for r in range(runs):
        acc = m.new_accumulator()
        acc.add(m.encode(points, rng), n)
        result = acc.estimate()
        for k, rect in enumerate(rects):
            e, s = result.answer(*rect)
            est[r, k], var[r, k] = e, s**2
    assert np.allclose(est[:, -1], n) and np.allclose(var[:, -1], 0.0)
    check(est[:, :-1], var[:, :-1], exact[:-1], f"rectangle {oracle}")


def test_contract_1e5_clients_on_16_bits() -> None:
    """1e5 clients, values on [0, 2^16) (bucketized reals), eps = 4 sampled levels: the median lies in its stated
    interval and its rank error within 3 rank stderr (+ its bucket's mass); >= 95% of 300 random ranges are
    within 3 stderr of the truth."""
    rng = seeded_rng(2026)
    n, bits = 100_000, 16
    real = np.concatenate([rng.lognormal(3.0, 0.6, 70_000), rng.normal(80.0, 5.0, 30_000)])
    values = bucketize(real, 0.0, 120.0, bits)
    m = DyadicRange(bits, 4.0)
    acc = m.new_accumulator()
    reports, _ = m.encode_messages(values, rng)
    for chunk in np.array_split(np.arange(n), 4):  # as the Beam combiner would: several batches, merged
        part = m.new_accumulator()
        part.add(reports[chunk], len(chunk))
        acc.merge(part)
    tree = acc.estimate()
    median = tree.median(z=3.0)
    leaf_counts = np.bincount(values, minlength=1 << bits)
    true_leaf = int(np.argmax(np.cumsum(leaf_counts) >= n / 2))
    assert median.lower <= true_leaf <= median.upper, (median, true_leaf)
    rank_error = abs(np.cumsum(leaf_counts)[median.leaf] - n / 2)
    assert rank_error <= 3 * median.rank_stderr + leaf_counts[median.leaf], (rank_error, median)
    lo, hi = np.sort(rng.integers(0, (1 << bits) + 1, (300, 2)), axis=1).T
    est, se = tree.answers(lo, hi)
    z = (est - truth(values, bits, lo, hi)) / np.maximum(se, 1e-9)
    assert np.mean(np.abs(z) <= 3) >= 0.95, np.mean(np.abs(z) <= 3)
    assert 0.6 < np.sqrt(np.mean(z**2)) < 1.5  # the stderr is neither wildly optimistic nor vacuous

