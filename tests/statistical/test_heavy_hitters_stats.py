"""Heavy-hitter estimates are unbiased and their stated stderr (oracle + level sampling) matches the empirical
spread (Monte-Carlo, docs/mathematics.md §6), checked on the queried items of a planted dataset."""

from __future__ import annotations

import numpy as np
import pytest

from transforms.mechanisms.heavy_hitters.prefix_tree import PrefixHeavyHitters
from transforms.mechanisms.randomness import seeded_rng

pytestmark = pytest.mark.slow

Z_MAX = 4.5
SE_MAX = 4.0


@pytest.mark.parametrize("m", [PrefixHeavyHitters(6.0, item_bits=16, level_bits=8),
                               PrefixHeavyHitters(4.0, item_bits=16, level_bits=4, levels="all")], ids=repr)
def test_query_unbiased_with_stated_stderr(m: PrefixHeavyHitters) -> None:
    rng = seeded_rng(404)
    n, runs = 4000, 200
    planted = np.array([40_000, 1234, 777, 65_000, 9], dtype=np.uint64)
    sizes = [800, 400, 200, 100, 0]
    items = np.concatenate([np.repeat(planted, sizes), rng.integers(0, 2**16, n - sum(sizes)).astype(np.uint64)])
    exact = np.array([np.sum(items == x) for x in planted], dtype=np.float64)
    est, var = np.empty((runs, planted.size)), np.empty((runs, planted.size))
    for r in range(runs):
        acc = m.new_accumulator()
        acc.add(m.encode(items, rng), n)
        q = acc.query(planted)
        est[r], var[r] = q.count, q.stderr**2
    z = (est.mean(axis=0) - exact) / (est.std(axis=0, ddof=1) / np.sqrt(runs))
    assert np.max(np.abs(z)) < Z_MAX, z
    t = ((est - exact) ** 2).sum(axis=1) - var.sum(axis=1)
    se = t.std(ddof=1) / np.sqrt(runs)
    assert abs(t.mean()) < SE_MAX * se, (t.mean(), var.sum(axis=1).mean(), se)
    assert se < 0.12 * var.sum(axis=1).mean()
