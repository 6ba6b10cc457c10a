"""Range counting on the multi-message Hadamard protocol (docs/mathematics.md §7.3, §7.1): the matrix (user sets,
node ids, prefix/range coefficients) by brute force, the exact covariance of node estimates by enumeration,
the shuffled privacy guarantee exactly on tiny instances, and the mechanism/accumulator/rows surface.

Privacy: the mechanism IS the protocol on sets of size bits + 1 (the tests of ``test_multimessage_ldp`` cover
the protocol for generic sets); here we check that the sets it builds have that size (padding slots -1), that
``encode`` matches the enumerated law, and the hockey-stick divergence of whole shuffled outputs for every
pair of neighbouring leaves against the accountant, by enumeration.
"""

from __future__ import annotations

import itertools
import math
import pickle

import numpy as np
import pytest

from transforms.mechanisms.multimessage.hadamard import MultiMessageHadamard
from transforms.mechanisms.multimessage.range import MultiMessageRange
from transforms.mechanisms.randomness import KeyedRandom, job_key_from_seed, seeded_rng
from transforms.mechanisms.ranges.left_children_tree import (
    LeftChildrenTree,
    node_id,
    prefix_terms,
    range_terms,
    user_sets,
)
from transforms.mechanisms.ranges.range_tree import ROW_DTYPE, RangeTree
from transforms.privacy.multimessage import hadamard_delta

Dist = dict[tuple, float]


# -- the matrix, by brute force ---------------------------------------------------------------------------


def kept_nodes(bits: int) -> list[tuple[int, int]]:
    """Root then the left children, top-to-bottom, left-to-right (the enumeration order of §7.3's ids)."""
    return [(0, 0)] + [(level, i) for level in range(1, bits + 1) for i in range(0, 1 << level, 2)]


def covers(node: tuple[int, int], leaf: int, bits: int) -> bool:
    level, i = node
    width = 1 << (bits - level)
    return i * width <= leaf < (i + 1) * width


def true_node_counts(leaves: np.ndarray, bits: int) -> np.ndarray:
    """x_node for every kept node, by id (enumeration order)."""
    return np.array([sum(covers(v, int(x), bits) for x in leaves) for v in kept_nodes(bits)], dtype=np.float64)


@pytest.mark.parametrize("bits", [1, 2, 3, 5])
def test_node_ids_enumerate_kept_nodes_in_order(bits: int) -> None:
    nodes = kept_nodes(bits)
    assert len(nodes) == 1 << bits  # |T| = B
    level, index = np.array(nodes).T
    np.testing.assert_array_equal(node_id(level, index), np.arange(1 << bits))
    with pytest.raises(ValueError, match="left children"):
        node_id(2, 1)


@pytest.mark.parametrize("bits", [1, 2, 3, 5])
def test_user_sets_are_the_kept_nodes_holding_the_leaf(bits: int) -> None:
    leaves = np.arange(1 << bits)
    sets = user_sets(leaves, bits)
    assert sets.shape == (1 << bits, bits + 1)  # k_set = bits + 1 slots
    ids = {v: i for i, v in enumerate(kept_nodes(bits))}
    for x in leaves.tolist():
        expected = {ids[v] for v in kept_nodes(bits) if covers(v, x, bits)}
        row = sets[x]
        assert set(row[row >= 0].tolist()) == expected
        assert (row >= 0).sum() == 1 + bits - bin(x).count("1")  # Lemma 5.4: at most bits + 1
        assert row[0] == 0  # the root, always
        for level in range(1, bits + 1):  # slot l: the level-l ancestor, -1 when it is a right child
            ancestor = x >> (bits - level)
            assert row[level] == (-1 if ancestor & 1 else ids[(level, ancestor)])


@pytest.mark.parametrize("bits", [1, 2, 4, 5])
def test_exact_node_counts_give_exact_answers(bits: int) -> None:
    rng = np.random.default_rng(bits)
    leaves = rng.integers(0, 1 << bits, 60)
    n, size = leaves.size, 1 << bits
    x = true_node_counts(leaves, bits)
    tree = LeftChildrenTree(bits=bits, n=n, estimates=x, var_intercept=1.0, cov_beta=0.01)
    prefix = np.concatenate(([0], np.cumsum(np.bincount(leaves, minlength=size))))
    ids = {v: i for i, v in enumerate(kept_nodes(bits))}
    for c in range(size):  # §7.3: P(c) = sum of the left siblings along the root -> c path
        siblings = [ids[(level, (c >> (bits - level)) - 1)] for level in range(1, bits + 1)
                    if (c >> (bits - level)) & 1]
        assert x[siblings].sum() == prefix[c]
    lo, hi = np.array([(a, b) for a in range(size + 1) for b in range(a, size + 1)]).T
    est, _ = tree.answers(lo, hi)
    np.testing.assert_array_equal(est, prefix[hi] - prefix[lo])
    for level, nodes in zip(tree.prefix_lengths, tree.consistent, strict=True):  # every dyadic node, exactly
        np.testing.assert_array_equal(nodes, np.bincount(leaves >> (bits - level), minlength=1 << level))
    assert tree.cdf(size) == (n, 0.0)
    median = int(np.argmax(prefix[1:] >= n / 2))
    assert tree.median().leaf == median


@pytest.mark.parametrize("bits", [1, 3, 5])
def test_range_coefficients_are_few_and_signed(bits: int) -> None:
    size = 1 << bits
    lo, hi = np.array([(a, b) for a in range(size + 1) for b in range(a, size + 1)]).T
    ids, coef = range_terms(lo, hi, bits)
    x = true_node_counts(np.arange(size), bits)  # one client per leaf: a range counts its leaves
    for r in range(lo.size):
        dense = np.bincount(ids[r], weights=coef[r], minlength=size)
        assert set(np.unique(dense).tolist()) <= {-1.0, 0.0, 1.0}
        assert np.count_nonzero(dense) <= 2 * bits  # Lemma 5.5
        assert dense @ x + size * (hi[r] == size) - size * (lo[r] == size) == hi[r] - lo[r]
    _, coef_c = prefix_terms(np.array([size]), bits)
    assert not coef_c.any()  # P(B) = n is exact: no oracle term


# -- exact covariance of node estimates -------------------------------------------------------------------


def count_moments(mech: MultiMessageRange, leaf: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance of one client's per-node support counts c_a (messages in C_a^tau), by enumeration."""
    protocol = mech.protocol
    messages = np.array(list(itertools.product(range(protocol.order), repeat=protocol.tau_)))
    support = np.zeros((len(messages), mech.d))  # support[code, a] = 1 if message `code` lies in C_a^tau
    for code, message in enumerate(messages):
        support[code, protocol.supported_items(message[None, :])] = 1.0
    radix = protocol.order ** np.arange(protocol.tau_)
    dist = mech.exact_message_distribution(leaf)
    v = np.array([support[[int(np.dot(t, radix)) for t in key]].sum(axis=0) for key in dist])
    w = np.array(list(dist.values()))
    centred = v - w @ v
    return w @ v, (centred * w[:, None]).T @ centred


@pytest.mark.parametrize(("bits", "tau"), [(1, 2), (2, 1)])
def test_node_covariance_is_exact(bits: int, tau: int) -> None:
    """Cov(x_hat_a, x_hat_b) = p/(1-p) x_l for l + 1 = (a+1) XOR (b+1), dummies included: enumerated exactly."""
    mech = MultiMessageRange(bits, 1.0, 0.1, n_expected=4, rho=1, tau=tau)
    leaves = np.array([0, 1, 3, 3, 2, 3]) % (1 << bits)
    p = 2.0**-tau
    cov = np.zeros((mech.d, mech.d))
    for leaf, times in zip(*np.unique(leaves, return_counts=True), strict=True):  # clients are independent
        cov += times * count_moments(mech, int(leaf))[1]
    cov /= (1 - p) ** 2  # x_hat = (c - const) / (1 - p)
    tree = LeftChildrenTree(bits=bits, n=leaves.size, estimates=true_node_counts(leaves, bits),
                            var_intercept=mech.variance_constants(leaves.size)[0], cov_beta=p / (1 - p))
    np.testing.assert_allclose(tree.node_covariance(np.arange(mech.d)), cov, rtol=1e-9, atol=1e-9)
    if bits > 1:  # (with one bit the only coupled item is the never-used dummy of the root slot)
        assert np.abs(cov - np.diag(np.diag(cov))).max() > 0.1  # the off-diagonal terms are really there


# -- privacy ------------------------------------------------------------------------------------------------


def message_codes(mech: MultiMessageRange, dist: Dist) -> tuple[np.ndarray, np.ndarray]:
    """A client's law as (multiset code, probability): code = sum over messages of base^message (tau = 1), so the
    union of independent clients' multisets is the SUM of their codes (no carries while base > total messages)."""
    assert mech.protocol.tau_ == 1
    base = np.int64(4 * mech.messages_per_client)
    codes = np.array([sum(base ** t[0] for t in key) for key in dist], dtype=np.int64)
    return codes, np.array(list(dist.values()))


def convolve(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    codes, inverse = np.unique(np.add.outer(a[0], b[0]).ravel(), return_inverse=True)
    return codes, np.bincount(inverse.ravel(), weights=np.multiply.outer(a[1], b[1]).ravel())


def hockey_stick(p: tuple[np.ndarray, np.ndarray], q: tuple[np.ndarray, np.ndarray], eps: float) -> float:
    at = np.minimum(np.searchsorted(q[0], p[0]), q[0].size - 1)
    q_at_p = np.where(q[0][at] == p[0], q[1][at], 0.0)
    return float(np.maximum(p[1] - math.exp(eps) * q_at_p, 0.0).sum())


TINY = [MultiMessageRange(1, 1.0, 0.1, n_expected=2, rho=1, tau=1),
        MultiMessageRange(1, 1.0, 0.1, n_expected=2, rho=2, tau=1),
        MultiMessageRange(2, 1.0, 0.1, n_expected=2, rho=2, tau=1)]


@pytest.mark.parametrize("mech", TINY, ids=repr)
def test_one_client_is_not_locally_private(mech: MultiMessageRange) -> None:
    a, b = mech.exact_message_distribution(0), mech.exact_message_distribution(mech.d - 1)
    assert sum(a.values()) == pytest.approx(1.0, abs=1e-12)
    assert any(key not in b for key in a)  # a message set possible for one leaf only: infinite local epsilon
    assert mech.epsilon_local == math.inf


@pytest.mark.parametrize("mech", TINY, ids=repr)
def test_shuffled_guarantee_exact(mech: MultiMessageRange) -> None:
    """Other clients fixed, one changes its leaf: the enumerated hockey-stick divergence of the whole shuffled
    output is within the accountant's delta (bits + 1 chained swaps) at every epsilon where it is < 1. With two
    bits it EXCEEDS what a one-element (k_set = 1) accounting would claim: the set accounting is needed."""
    single = {x: message_codes(mech, mech.exact_message_distribution(x)) for x in range(mech.d)}
    checked, beyond_single_swap = 0, False
    for others in ([0], [1, 0])[: 3 - mech.bits]:  # n = 2 (and n = 3 when bits = 1)
        rest = single[others[0]]
        for y in others[1:]:
            rest = convolve(rest, single[y])
        n = len(others) + 1
        shuffled = {x: convolve(single[x], rest) for x in range(mech.d)}
        for eps in (0.5, 1.0, 2.0, 3.0):
            claimed = mech.delta_central(n, eps)
            pairs = itertools.permutations(range(mech.d), 2)
            worst = max(hockey_stick(shuffled[x], shuffled[y], eps) for x, y in pairs)
            beyond_single_swap |= worst > hadamard_delta(n, mech.rho, mech.tau, 1, eps)
            if claimed < 1.0:
                checked += 1
                assert worst <= claimed + 1e-12
    assert checked >= 2
    assert beyond_single_swap == (mech.bits == 2)


def empirical_keys(codes: np.ndarray, owner: np.ndarray, clients: int) -> dict[tuple, int]:
    counts = np.bincount(owner, minlength=clients)
    table = np.sort(codes.reshape(clients, int(counts.max())), axis=1)  # equal message counts per client
    rows, freq = np.unique(table, axis=0, return_counts=True)
    return {tuple(int(c) for c in row): int(f) for row, f in zip(rows, freq, strict=True)}


@pytest.mark.parametrize("mech", TINY[:2], ids=repr)
def test_enumeration_matches_encode(mech: MultiMessageRange) -> None:
    draws = 40_000
    rng = seeded_rng(3)
    for leaf in range(mech.d):
        expected = {tuple(sorted(t[0] for t in key)): p for key, p in mech.exact_message_distribution(leaf).items()}
        reports, owner = mech.encode_messages(np.full(draws, leaf), rng)
        assert mech.validate(reports).all()
        observed = empirical_keys(reports["values"][:, 0], owner, draws)
        assert set(observed) <= set(expected)
        for key, p in expected.items():
            z = (observed.get(key, 0) - draws * p) / math.sqrt(draws * p * (1 - p))
            assert abs(z) < 5, (leaf, key, observed.get(key, 0), draws * p)


# -- mechanism surface --------------------------------------------------------------------------------------


def test_mechanism_is_the_protocol_on_sets() -> None:
    mech = MultiMessageRange(6, 3.0, 1e-6, n_expected=2000)
    protocol = MultiMessageHadamard(64, 3.0, 1e-6, n_expected=2000, k_set=7)
    assert (mech.rho, mech.tau) == (protocol.rho, protocol.tau)  # resolved like the protocol with k_set = bits+1
    assert mech.k_set == 7 and mech.messages_per_channel == 7 + protocol.rho_ == protocol.messages_per_client
    assert mech.report_dtype == protocol.report_dtype and mech.payload_kind == protocol.payload_kind == "integers"
    assert mech.message_bits == protocol.message_bits and mech.channels == 1 and not mech.single_message
    assert mech.delta_central(2000, 3.0) == protocol.delta_central(2000, 3.0) <= 1e-6
    ledger = mech.ledger(2000)
    assert ledger["k_set"] == 7 and ledger["structure"] == "left_children"
    assert ledger["messages_per_client_max"] == mech.messages_per_client
    assert ledger["epsilon_numeric"] == mech.epsilon_central(2000, 1e-6) <= 3.0
    assert math.isinf(mech.epsilon_local) and math.isnan(mech.mixture_alpha)
    assert pickle.loads(pickle.dumps(mech)) == mech
    assert MultiMessageRange(**mech.parameters()) == mech


def test_encoded_sets_have_the_protocol_shape() -> None:
    mech = MultiMessageRange(4, 1.0, 1e-6, n_expected=100, rho=3)
    leaves = np.arange(16)
    reports, owner = mech.encode_messages(leaves, seeded_rng(4))
    np.testing.assert_array_equal(owner, np.repeat(leaves, mech.k_set + 3))
    assert reports.dtype == mech.report_dtype and mech.validate(reports).all()
    sets = mech.user_sets(leaves)
    assert sets.shape == (16, 5) and sets.min() == -1 and sets.max() < 16
    with pytest.raises(ValueError, match="outside"):
        mech.encode_messages(np.array([16]), seeded_rng(4))


def test_keyed_randomness_is_independent_of_batch_boundaries() -> None:
    mech = MultiMessageRange(5, 1.0, 1e-6, n_expected=100, rho=4)
    key, ids = job_key_from_seed(5), np.arange(50, dtype=np.uint64)
    leaves = np.arange(50) % 32
    whole, _ = mech.encode_messages(leaves, KeyedRandom.for_elements(key, ids))
    parts = [mech.encode_messages(leaves[a:b], KeyedRandom.for_elements(key, ids[a:b]))[0]
             for a, b in ((0, 17), (17, 50))]
    np.testing.assert_array_equal(whole, np.concatenate(parts))


@pytest.mark.parametrize("bad", [dict(bits=0), dict(bits=25), dict(bits=2.5), dict(epsilon=0.0), dict(delta=1.0),
                                 dict(rho=0), dict(calibration="exact"), dict(n_expected=1)])
def test_parameters_are_validated(bad: dict) -> None:
    args = dict(bits=4, epsilon=1.0, delta=1e-6, n_expected=100, rho=3) | bad
    with pytest.raises(ValueError):
        MultiMessageRange(**args)


def make_tree(n: int = 300, seed: int = 6) -> tuple[MultiMessageRange, LeftChildrenTree, np.ndarray]:
    mech = MultiMessageRange(5, 1.0, 1e-6, n_expected=n, rho=4)
    rng = seeded_rng(seed)
    leaves = np.minimum(rng.geometric(0.1, n), 31)
    reports, owner = mech.encode_messages(leaves, rng)
    half = int(np.searchsorted(owner, n // 2))
    a, b = mech.new_accumulator(), mech.new_accumulator()
    a.add(reports[:half], n // 2)
    b.add(reports[half:], n - n // 2)
    a.merge(b)
    return mech, a.estimate(), leaves


def test_accumulator_merges_and_needs_clients() -> None:
    mech, tree, leaves = make_tree()
    whole = mech.new_accumulator()
    reports, _ = mech.encode_messages(leaves, seeded_rng(6))
    with pytest.raises(ValueError, match="number of clients"):
        whole.add(reports)
    bad = reports.copy()
    bad["values"][0, 0] = mech.protocol.order
    with pytest.raises(ValueError, match="output domain"):
        whole.add(bad, leaves.size)
    with pytest.raises(ValueError, match="cannot merge"):
        whole.merge(MultiMessageRange(5, 1.0, 1e-6, n_expected=300, rho=5).new_accumulator())
    with pytest.raises(ValueError, match="no clients"):
        whole.estimate()
    assert tree.n == leaves.size and tree.structure == "left_children" and RangeTree.structure == "dyadic"
    assert tree.prefix_lengths == (1, 2, 3, 4, 5)
    p = 2.0**-mech.tau
    assert tree.var_intercept == pytest.approx(leaves.size * mech.messages_per_client * p / (1 - p))
    assert tree.cov_beta == pytest.approx(p / (1 - p))


def test_rows_round_trip() -> None:
    _, tree, _ = make_tree()
    rows = tree.to_rows()
    assert rows.dtype == ROW_DTYPE and rows.size == 32
    assert rows[0]["level"] == 0 and rows[0]["estimate"] == tree.estimates[0]  # the root row holds x_hat_root
    assert np.all(rows["index"][1:] % 2 == 0) and np.all(rows["clients"] == tree.n)
    for name in ("var_intercept", "var_slope", "cov_beta"):
        assert np.unique(rows[name]).size == 1
    assert rows["var_slope"][0] == -rows["cov_beta"][0]
    np.testing.assert_allclose(rows["stderr"] ** 2, np.diag(tree.node_covariance(node_id(rows["level"],
                                                                                         rows["index"]))))
    shuffled = rows[np.random.default_rng(0).permutation(rows.size)]
    again = LeftChildrenTree.from_rows({name: shuffled[name] for name in ROW_DTYPE.names})
    lo, hi = np.array([0, 3, 7, 0, 31]), np.array([32, 9, 8, 13, 32])
    for got, want in zip(again.answers(lo, hi), tree.answers(lo, hi), strict=True):
        np.testing.assert_array_equal(got, want)
    assert again.quantile(0.3) == tree.quantile(0.3)
    for got, want in zip(again.consistent, tree.consistent, strict=True):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="rows"):
        LeftChildrenTree.from_rows(rows[1:])
    odd = rows.copy()
    odd["index"][1] = 1
    with pytest.raises(ValueError, match="left children"):
        LeftChildrenTree.from_rows(odd)
    uneven = rows.copy()
    uneven["cov_beta"][3] *= 2
    with pytest.raises(ValueError, match="cov_beta"):
        LeftChildrenTree.from_rows(uneven)


def test_answers_reject_bad_ranges() -> None:
    _, tree, _ = make_tree()
    for lo, hi in ((-1, 3), (4, 3), (0, 33)):
        with pytest.raises(ValueError, match="ranges"):
            tree.answer(lo, hi)
    assert tree.answer(5, 5) == (0.0, 0.0)
