"""Quantiles from the range tree (docs/mathematics.md §5): rank error centred on zero, spread within the stated
rank stderr, and intervals that cover the true quantile (replicated runs, fixed seeds)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.statistical.stats_helpers import lumpy_leaves
from transforms.mechanisms.randomness import seeded_rng
from transforms.mechanisms.ranges.dyadic import DyadicRange

pytestmark = pytest.mark.slow

Z_MAX = 4.5


def test_quantiles_unbiased_in_rank_and_intervals_cover() -> None:
    """Over repeated runs, the rank error #{x <= leaf} - q n of the quantile is centred on 0 (the isotonic CDF
    removes the early bias of a first crossing), its spread is within the stated rank stderr, and the
    z = 2 interval [lower, upper] contains the true quantile leaf in ~95% of the cases."""
    m = DyadicRange(16, 4.0)  # many leaves per rank stderr: where a first crossing of the raw CDF is biased
    n, runs = 20_000, 40
    values = lumpy_leaves(16, n, seed=3)
    true_cum = np.cumsum(np.bincount(values, minlength=1 << 16))
    rng = seeded_rng(77)
    errors, stated, covered = {q: [] for q in (0.25, 0.5, 0.9)}, {q: [] for q in (0.25, 0.5, 0.9)}, []
    for _ in range(runs):
        acc = m.new_accumulator()
        acc.add(m.encode(values, rng), n)
        tree = acc.estimate()
        for q in errors:
            est = tree.quantile(q, z=2.0)
            errors[q].append(true_cum[est.leaf] - q * n)
            stated[q].append(est.rank_stderr)
            true_leaf = int(np.argmax(true_cum >= q * n))
            covered.append(est.lower <= true_leaf <= est.upper)
    for q in errors:
        e = np.asarray(errors[q])
        assert abs(e.mean()) < Z_MAX * e.std(ddof=1) / np.sqrt(runs), (q, e.mean(), e.std(ddof=1))
        assert e.std(ddof=1) < 1.3 * np.mean(stated[q]), (q, e.std(ddof=1), np.mean(stated[q]))
    assert np.mean(covered) >= 0.85, np.mean(covered)
