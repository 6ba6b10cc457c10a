"""Range counting on the multi-message Hadamard protocol (docs/mathematics.md §7.3, §5): unbiased range answers,
the exact (covariance-aware) variance against the empirical spread, the reported stderr, and quantiles.

R independent runs on a fixed dataset through encode -> accumulate -> estimate (merging is covered by
``test_mm_range``), with fixed seeds. The reference variances are the tree's exact formulas evaluated at the
TRUE node counts (a tree whose estimates are the true counts), so they are data-exact, not plug-in. rho = 1
makes the protocol's covariances large (correlation up to ~1/(bits + 2) between node estimates): the tests
then also show that a variance ignoring them would be rejected.
"""

from __future__ import annotations

import numpy as np
import pytest

from transforms.mechanisms.multimessage.range import MultiMessageRange
from transforms.mechanisms.randomness import seeded_rng
from transforms.mechanisms.ranges.left_children_tree import LeftChildrenTree, range_terms

pytestmark = pytest.mark.slow

Z_MAX = 4.5  # Bonferroni over <= 150 statistics: P(max |z| > 4.5) < 150 * 6.8e-6 ~ 1e-3
SE_MAX = 4.0
BITS, N, RHO, RUNS = 4, 400, 1, 2000
STDERR_RUNS = 300  # runs whose reported stderrs are computed (the plug-in barely moves)


def leaves_of(bits: int, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    size = 1 << bits
    return np.minimum(rng.geometric(2.5 / size, n) - 1, size - 1)


def exact_tree(mech: MultiMessageRange, leaves: np.ndarray) -> LeftChildrenTree:
    """The tree at the true node counts: its variances are the exact ones for this dataset."""
    sets = mech.user_sets(leaves)
    counts = np.bincount(sets[sets >= 0], minlength=mech.d).astype(np.float64)
    intercept, beta = mech.variance_constants(leaves.size)
    return LeftChildrenTree(mech.bits, leaves.size, counts, intercept, beta)


def all_ranges(bits: int) -> tuple[np.ndarray, np.ndarray]:
    size = 1 << bits
    return np.array([(a, b) for a in range(size + 1) for b in range(a + 1, size + 1)]).T


@pytest.fixture(scope="module")
def runs() -> dict:
    """RUNS estimates: node estimates and answers of every range (reported stderrs in the first STDERR_RUNS)."""
    mech = MultiMessageRange(BITS, 1.0, 1e-6, n_expected=N, rho=RHO)
    leaves = leaves_of(BITS, N, seed=1)
    lo, hi = all_ranges(BITS)
    rng = seeded_rng(21)
    nodes, answers, stderrs, per_call = [], [], [], 50
    for _ in range(RUNS // per_call):
        reports, owner = mech.encode_messages(np.tile(leaves, per_call), rng)
        bounds = np.searchsorted(owner, np.arange(0, per_call * N + 1, N))
        for j in range(per_call):
            acc = mech.new_accumulator()
            acc.add(reports[bounds[j] : bounds[j + 1]], N)
            tree = acc.estimate()
            nodes.append(tree.estimates)
            if len(stderrs) < STDERR_RUNS:
                est, se = tree.answers(lo, hi)
                stderrs.append(se)
            else:  # the same numbers without the stderr work (answers = differences of the consistent CDF)
                cdf = np.concatenate(([0.0], np.cumsum(tree.consistent[-1])))
                est = cdf[hi] - cdf[lo]
            answers.append(est)
    exact = exact_tree(mech, leaves)
    truth = np.concatenate(([0], np.cumsum(np.bincount(leaves, minlength=1 << BITS))))
    return dict(mech=mech, exact=exact, lo=lo, hi=hi, truth=truth[hi] - truth[lo], nodes=np.array(nodes),
                answers=np.array(answers), stderrs=np.array(stderrs), var=exact.answers(lo, hi)[1] ** 2)


def test_range_answers_unbiased(runs: dict) -> None:
    var, est = runs["var"], runs["answers"]
    whole = var == 0  # [0, 2^bits): n, exact
    assert whole.sum() == 1 and np.allclose(est[:, whole], N, rtol=0, atol=1e-9)
    z = (est[:, ~whole].mean(axis=0) - runs["truth"][~whole]) / np.sqrt(var[~whole] / RUNS)
    assert np.max(np.abs(z)) < Z_MAX, f"max |z| = {np.max(np.abs(z)):.2f}"


def test_node_covariance_matches_empirical(runs: dict) -> None:
    """Every entry of the empirical covariance matrix of the node estimates against the exact one (z-scores with
    the normal-theory standard error of a sample covariance, sqrt((s_aa s_bb + s_ab^2) / R))."""
    x, exact = runs["nodes"], runs["exact"]
    d = x.shape[1]
    sigma = exact.node_covariance(np.arange(d))
    np.testing.assert_allclose(x.mean(axis=0)[1:], exact.estimates[1:], atol=Z_MAX * np.sqrt(sigma[0, 0] / RUNS))
    empirical = np.cov(x, rowvar=False)
    se = np.sqrt((np.outer(np.diag(sigma), np.diag(sigma)) + sigma**2) / RUNS)
    upper = np.triu_indices(d)
    z = ((empirical - sigma) / se)[upper]
    assert np.max(np.abs(z)) < Z_MAX, f"max |z| = {np.max(np.abs(z)):.2f}"
    off = sigma - np.diag(np.diag(sigma))
    assert np.max(np.abs(off / se)) > Z_MAX + 3  # large enough that ignoring them would fail this test


def summed_check(deviation: np.ndarray, expected: float) -> tuple[float, float]:
    t = np.sum(deviation**2, axis=1)
    return t.mean() - expected, float(np.std(t, ddof=1) / np.sqrt(len(t)))


def test_range_variance_matches_empirical(runs: dict) -> None:
    """Summed squared errors of every range vs the summed exact variance, and on the ranges whose variance the
    covariances move most (there a diagonal-only variance is rejected)."""
    exact, lo, hi, var = runs["exact"], runs["lo"], runs["hi"], runs["var"]
    deviation = runs["answers"] - runs["truth"]
    gap, se = summed_check(deviation, float(var.sum()))
    assert abs(gap) < SE_MAX * se and se < 0.02 * var.sum(), (gap, se, var.sum())
    ids, coef = range_terms(lo, hi, BITS)
    dense = np.stack([np.bincount(i, weights=c, minlength=1 << BITS) for i, c in zip(ids, coef, strict=True)])
    diagonal_only = (dense**2) @ np.diag(exact.node_covariance(np.arange(1 << BITS)))
    moved = np.abs(diagonal_only / np.maximum(var, 1e-12) - 1) > 0.1
    assert 10 <= moved.sum() < lo.size
    gap, se = summed_check(deviation[:, moved], float(var[moved].sum()))
    assert abs(gap) < SE_MAX * se, (gap, se)
    assert abs(diagonal_only[moved].sum() - var[moved].sum()) > 1.5 * SE_MAX * se  # the two models are far apart
    wrong, _ = summed_check(deviation[:, moved], float(diagonal_only[moved].sum()))
    assert abs(wrong) > SE_MAX * se, (wrong, se)  # ... and the diagonal-only variance fails this test


def test_reported_stderr_is_the_exact_one(runs: dict) -> None:
    """The plug-in stderr of each run is close to the data-exact one (plug-in noise is O(1/sqrt(N)) relative)."""
    var, reported = runs["var"], runs["stderrs"] ** 2
    ok = var > 0
    ratio = reported[:, ok] / var[ok]
    assert np.max(np.abs(ratio.mean(axis=0) - 1)) < 0.01
    assert np.max(np.abs(ratio - 1)) < 0.1


def test_quantiles_cover_and_rank_error_within_stderr() -> None:
    """Median and quartiles over repeated runs: the rank error #{x <= leaf} - q n is centred (isotonic CDF), its
    spread is within the stated rank stderr, and the z = 2 interval contains the true quantile leaf ~95%."""
    bits, n, runs_ = 10, 2000, 60
    mech = MultiMessageRange(bits, 1.0, 1e-6, n_expected=n, rho=2)
    leaves = np.clip(np.random.default_rng(3).normal(400, 150, n), 0, 1023).astype(np.int64)
    true_cum = np.cumsum(np.bincount(leaves, minlength=1 << bits))
    rng = seeded_rng(22)
    levels = (0.25, 0.5, 0.9)
    errors, stated, covered = {q: [] for q in levels}, {q: [] for q in levels}, []
    for _ in range(runs_):
        acc = mech.new_accumulator()
        acc.add(mech.encode(leaves, rng), n)
        tree = acc.estimate()
        for q in levels:
            est = tree.quantile(q, z=2.0)
            errors[q].append(true_cum[est.leaf] - q * n)
            stated[q].append(est.rank_stderr)
            covered.append(est.lower <= int(np.argmax(true_cum >= q * n)) <= est.upper)
    for q in levels:
        e = np.asarray(errors[q])
        assert abs(e.mean()) < Z_MAX * e.std(ddof=1) / np.sqrt(runs_), (q, e.mean(), e.std(ddof=1))
        assert e.std(ddof=1) < 1.3 * np.mean(stated[q]), (q, e.std(ddof=1), np.mean(stated[q]))
    assert np.mean(covered) >= 0.85, np.mean(covered)
