"""The deterministic parts of range estimation: consistency, the adjoint behind every stderr, the dyadic cover,
bucketing, quantile definition and the Parquet-row round trip (``range_tree``, ``ranges``)."""

from __future__ import annotations

import numpy as np
import pytest

from transforms.mechanisms.randomness import seeded_rng
from transforms.mechanisms.ranges.dyadic import DyadicRange, bucket_bounds, bucketize, dyadic_cover
from transforms.mechanisms.ranges.range_tree import ROW_DTYPE, RangeTree

CONFIGS = [
    dict(bits=8, epsilon=2.0, oracle="llh", levels="sample"),
    dict(bits=8, epsilon=1.0, oracle="grr", levels="sample", branching=4),
    dict(bits=6, epsilon=4.0, oracle="llh", levels="all"),
    dict(bits=6, epsilon=2.0, oracle="grr", levels="all", prefix_lengths=(2, 3, 6)),
    dict(bits=4, epsilon=1.0, oracle="oue", levels="sample"),
]


def make_tree(config: dict, n: int = 4000, seed: int = 0) -> tuple[RangeTree, np.ndarray]:
    m = DyadicRange(**config)
    rng = seeded_rng(seed)
    values = np.minimum(rng.geometric(4.0 / m.d, n), m.d - 1)
    acc = m.new_accumulator()
    reports, _ = m.encode_messages(values, rng)
    acc.add(reports[: len(reports) // 2], None if m.levels == "sample" else n // 2)
    rest = m.new_accumulator()
    rest.add(reports[len(reports) // 2 :], None if m.levels == "sample" else n - n // 2)
    acc.merge(rest)
    return acc.estimate(), values


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_consistency_is_exact_and_a_projection(config: dict) -> None:
    tree, values = make_tree(config)
    u = tree.consistent
    assert u[0].sum() == pytest.approx(tree.n, rel=1e-12)
    for j in range(1, tree.levels):
        parents = u[j].reshape(u[j - 1].size, -1).sum(axis=1)
        np.testing.assert_allclose(parents, u[j - 1], rtol=1e-9, atol=1e-7)
    # a tree that is already consistent (with root n) is left unchanged
    leaves = np.bincount(values, minlength=1 << tree.bits).astype(np.float64)
    exact = [leaves.reshape(1 << b, -1).sum(axis=1) for b in tree.prefix_lengths]
    same = RangeTree(tree.prefix_lengths, tree.n, tree.clients, tuple(exact), tree.var_intercept, tree.var_slope,
                     tree.cov_beta)
    for got, want in zip(same.consistent, exact, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_adjoint_is_the_linear_map_of_the_answer(config: dict) -> None:
    """answer(raw + delta) - answer(raw) == sum_j a_j . delta_j for the adjoint a of the leaf weights."""
    tree, _ = make_tree(config)
    rng = seeded_rng(1)
    w = rng.normal(size=1 << tree.bits)
    a = tree._adjoint(w)
    delta = [rng.normal(size=x.size) * 10 for x in tree.raw]
    moved = RangeTree(tree.prefix_lengths, tree.n, tree.clients, tuple(x + d for x, d in zip(tree.raw, delta,
                      strict=True)), tree.var_intercept, tree.var_slope, tree.cov_beta)
    change = w @ moved.consistent[-1] - w @ tree.consistent[-1]
    assert change == pytest.approx(sum(float(aj @ dj) for aj, dj in zip(a, delta, strict=True)), rel=1e-9)


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_interval_variance_equals_dense_adjoint(config: dict) -> None:
    tree, _ = make_tree(config)
    rng = seeded_rng(2)
    size = 1 << tree.bits
    lo, hi = np.sort(rng.integers(0, size + 1, (40, 2)), axis=1).T
    lo, hi = np.append(lo, [0, 0, 3]), np.append(hi, [size, 1, 3])
    leaves = np.arange(size)
    dense = tree.variance_of(((leaves >= lo[:, None]) & (leaves < hi[:, None])).astype(np.float64))
    _, se = tree.answers(lo, hi)
    np.testing.assert_allclose(se**2, dense, rtol=1e-9, atol=1e-6)
    assert se[-3] == pytest.approx(0.0, abs=1e-6)  # the whole domain is n, exactly
    assert se[-1] == 0.0


def test_answers_are_sums_of_consistent_cover_nodes() -> None:
    tree, _ = make_tree(CONFIGS[1])
    for lo, hi in ((0, 256), (5, 200), (17, 18), (64, 128), (100, 100)):
        nodes = dyadic_cover(lo, hi, tree.prefix_lengths)
        lookup = dict(zip(tree.prefix_lengths, tree.consistent, strict=True))
        total = sum(tree.n if b == 0 else float(lookup[b][a:c].sum()) for b, a, c in nodes)
        assert tree.answer(lo, hi)[0] == pytest.approx(total, rel=1e-9, abs=1e-6)


@pytest.mark.parametrize("lengths", [(1, 2, 3, 4, 5, 6), (2, 4, 6), (3, 6), (1, 4, 6)])
def test_dyadic_cover_partitions_the_range(lengths: tuple[int, ...]) -> None:
    fan = dict(zip(lengths, np.diff((0, *lengths)), strict=True))
    for lo in range(0, 65, 3):
        for hi in range(lo, 65, 5):
            nodes = dyadic_cover(lo, hi, lengths)
            covered = np.zeros(64, dtype=int)
            per_level: dict[int, int] = {}
            for b, a, c in nodes:
                width = 64 >> b
                covered[a * width : c * width] += 1
                per_level[b] = per_level.get(b, 0) + (c - a)
            assert np.array_equal(covered, (np.arange(64) >= lo) & (np.arange(64) < hi))
            for b, count in per_level.items():
                assert b == 0 or count <= 2 * ((1 << fan[b]) - 1)


def test_rows_round_trip_answers_and_quantiles() -> None:
    tree, _ = make_tree(CONFIGS[1])
    rows = tree.to_rows()
    assert rows.dtype == ROW_DTYPE and rows[0]["level"] == 0 and rows[0]["estimate"] == tree.n
    shuffled = rows[seeded_rng(3).permutation(len(rows))]
    columns = {name: shuffled[name].tolist() for name in ROW_DTYPE.names}  # e.g. a Parquet table's columns
    for again in (RangeTree.from_rows(rows), RangeTree.from_rows(columns)):
        assert again.prefix_lengths == tree.prefix_lengths and again.clients == tree.clients
        for lo, hi in ((0, 77), (13, 250), (128, 256)):
            assert again.answer(lo, hi) == pytest.approx(tree.answer(lo, hi), rel=1e-12)
        assert again.median() == tree.median()
    level = rows["level"] == tree.prefix_lengths[0]
    np.testing.assert_allclose(rows["stderr"][level], tree.raw_stderr(0))
    with pytest.raises(ValueError, match="root row"):
        RangeTree.from_rows(rows[1:])
    with pytest.raises(ValueError, match="one row per index"):
        RangeTree.from_rows(rows[:-1])
    broken = rows.copy()
    broken["clients"][-1] += 1
    with pytest.raises(ValueError, match="constant within level"):
        RangeTree.from_rows(broken)


def test_quantile_definition_and_band() -> None:
    tree, _ = make_tree(CONFIGS[0], n=20_000)
    cum = tree.monotone_cdf
    assert np.all(np.diff(cum) >= 0) and cum[-1] == pytest.approx(tree.n)
    for q in (0.1, 0.5, 0.9, 1.0):
        est = tree.quantile(q)
        assert est.leaf == int(np.argmax(cum >= q * tree.n * (1 - 1e-12)))
        assert est.lower <= est.leaf <= est.upper
        assert est.rank_stderr == pytest.approx(tree.cdf(est.leaf + 1)[1])
        assert est.edge == est.leaf + 1
    with pytest.raises(ValueError, match="quantile level"):
        tree.quantile(0.0)


def test_bucketize_and_bounds() -> None:
    x = np.array([-5.0, 0.0, 0.49, 0.5, 9.99, 10.0, 42.0])
    leaf = bucketize(x, 0.0, 10.0, 4)
    assert leaf.tolist() == [0, 0, 0, 0, 15, 15, 15]
    lower, upper = bucket_bounds(leaf, 0.0, 10.0, 4)
    inside = (x >= 0) & (x < 10)
    assert np.all((lower[inside] <= x[inside]) & (x[inside] < upper[inside]))
    with pytest.raises(ValueError, match="NaN"):
        bucketize(np.array([np.nan]), 0, 1, 3)
    with pytest.raises(ValueError, match="lo < hi"):
        bucketize(x, 1.0, 1.0, 3)


def test_accumulator_needs_every_level() -> None:
    m = DyadicRange(10, 1.0)
    acc = m.new_accumulator()
    acc.add(m.encode(np.arange(3), seeded_rng(0)))
    with pytest.raises(ValueError, match="per level"):
        acc.estimate()
    with pytest.raises(ValueError, match="whole sets"):
        DyadicRange(4, 1.0, levels="all").new_accumulator().add(np.zeros(3, DyadicRange(4, 1.0).report_dtype))


def test_mechanisms_rebuild_from_parameters_and_pickle() -> None:
    import pickle

    from transforms.mechanisms.heavy_hitters.prefix_tree import PrefixHeavyHitters
    from transforms.mechanisms.ranges.rectangles import DyadicRectangle

    for m in (DyadicRange(8, 2.0, branching=4), DyadicRange(6, 1.0, oracle="olh", prefix_lengths=(3, 6)),
              DyadicRectangle(3, 4, 2.0, oracle="grr"), PrefixHeavyHitters(3.0, levels="all")):
        again = pickle.loads(pickle.dumps(m))
        assert again == m and hash(again) == hash(m)
        assert type(m)(**m.parameters()).parameters() == m.parameters()
        assert m.single_message is False and m.channels >= 2 and m.report_dtype.names[0] == "channel"
