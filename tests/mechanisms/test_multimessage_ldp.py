"""Exact privacy of the [MultiMsg] multi-message protocols by enumeration (docs/mathematics.md §7.1, §7.2).

1. One client's whole message set: we enumerate its multiset distribution for every input and compute the
   local epsilon. It is infinite for both protocols (the data messages are sent in the clear), so:
2. the shuffled (central) guarantee is checked exactly on tiny n: we enumerate the multiset of ALL messages
   of n clients for neighbouring datasets and check the hockey-stick divergence against the accountant's
   delta at the claimed epsilon (and that the accountant is not vacuous: close to the enumerated value when
   the accountant's worst case is realised);
3. the enumerations are checked against ``encode`` empirically (one client, and n = 2 clients together).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from transforms.mechanisms.multimessage.common import parity
from transforms.mechanisms.multimessage.protocols import CountMinMultiRR, MultiMessageHadamard
from transforms.mechanisms.randomness import seeded_rng
from transforms.privacy.multimessage import hadamard_swap_divergence

Dist = dict[tuple, float]


def convolve(dists: list[Dist]) -> Dist:
    """Distribution of the union (multiset) of independent multisets."""
    out: Dist = {(): 1.0}
    for dist in dists:
        new: Dist = {}
        for a, pa in out.items():
            for b, pb in dist.items():
                key = tuple(sorted(a + b))
                new[key] = new.get(key, 0.0) + pa * pb
        out = new
    return out


def hockey_stick(p: Dist, q: Dist, eps: float) -> float:
    e = math.exp(eps)
    return sum(max(0.0, pv - e * q.get(k, 0.0)) for k, pv in p.items())


def local_epsilon(a: Dist, b: Dist) -> float:
    worst = 0.0
    for key, pa in a.items():
        pb = b.get(key, 0.0)
        if pa > 0 and pb == 0:
            return math.inf
        worst = max(worst, math.log(pa / pb))
    return worst


def central(mech: MultiMessageHadamard | CountMinMultiRR, dataset: list[int]) -> Dist:
    return convolve([mech.exact_message_distribution(v) for v in dataset])


def empirical_keys(codes: np.ndarray, owner: np.ndarray, clients: int) -> dict[tuple, int]:
    """Histogram of each client's sorted multiset of message codes."""
    counts = np.bincount(owner, minlength=clients)
    width = int(counts.max())
    rank = np.arange(owner.size) - np.repeat(np.cumsum(counts) - counts, counts)
    table = np.full((clients, width), -1, dtype=np.int64)
    table[owner, rank] = codes
    table.sort(axis=1)
    rows, freq = np.unique(table, axis=0, return_counts=True)
    return {tuple(int(c) for c in row if c >= 0): int(f) for row, f in zip(rows, freq, strict=True)}


def assert_matches(expected: Dist, observed: dict[tuple, int], draws: int) -> None:
    assert set(observed) <= set(expected), "encode produced a multiset outside the enumerated support"
    for key, p in expected.items():
        z = (observed.get(key, 0) - draws * p) / math.sqrt(draws * p * (1 - p))
        assert abs(z) < 5, (key, observed.get(key, 0), draws * p)


# -- Hadamard --------------------------------------------------------------------------------------------


def hadamard_code(mech: MultiMessageHadamard, values: np.ndarray) -> np.ndarray:
    return values @ (mech.order ** np.arange(mech.tau_))


def hadamard_key_codes(mech: MultiMessageHadamard, key: tuple) -> tuple:
    return tuple(sorted(sum(u * mech.order**r for r, u in enumerate(t)) for t in key))


TINY_HR = [
    MultiMessageHadamard(2, 1.0, 0.1, n_expected=2, rho=1, tau=1),
    MultiMessageHadamard(2, 1.0, 0.1, n_expected=2, rho=2, tau=1),
    MultiMessageHadamard(2, 1.0, 0.1, n_expected=2, rho=1, tau=2),
    MultiMessageHadamard(5, 1.0, 0.1, n_expected=3, rho=1, tau=1),
]


@pytest.mark.parametrize("mech", TINY_HR, ids=repr)
def test_hadamard_client_alone_is_not_locally_private(mech: MultiMessageHadamard) -> None:
    dists = [mech.exact_message_distribution(v) for v in range(mech.d)]
    for dist in dists:
        assert sum(dist.values()) == pytest.approx(1.0, abs=1e-12)
    eps = max(local_epsilon(a, b) for a in dists for b in dists if a is not b)
    assert eps == math.inf == mech.epsilon_local


@pytest.mark.parametrize("mech", TINY_HR, ids=repr)
@pytest.mark.parametrize("n", [2, 3])
def test_hadamard_shuffled_guarantee_exact(mech: MultiMessageHadamard, n: int) -> None:
    rest = [0] * (n - 1)
    items = range(min(mech.d, 3))
    shuffled = {x: central(mech, [x, *rest]) for x in items}
    for eps in (0.25, 1.0, 2.5):
        claimed = mech.delta_central(n, eps)
        assert claimed < 1.0
        for x, x2 in itertools.permutations(items, 2):
            assert hockey_stick(shuffled[x], shuffled[x2], eps) <= claimed + 1e-12


@pytest.mark.parametrize("mech", TINY_HR, ids=repr)
def test_hadamard_accountant_equals_enumerated_adversary_view(mech: MultiMessageHadamard) -> None:
    # [MultiMsg] Lemma 4.4's view: all n*rho blanket messages plus the target's one message, as a multiset.
    n = 2
    tuples = list(itertools.product(range(mech.order), repeat=mech.tau_))
    blanket = {(t,): 1.0 / len(tuples) for t in tuples}

    def data(j: int) -> Dist:
        inside = [t for t in tuples if all(parity(np.int64(u & (j + 1))) == 0 for u in t)]
        return {(t,): 1.0 / len(inside) for t in inside}

    view = {j: convolve([data(j)] + [blanket] * (n * mech.rho_)) for j in (0, 1)}
    for eps in (0.0, 0.4, 1.3):
        exact = hockey_stick(view[0], view[1], eps)
        assert hadamard_swap_divergence(n, mech.rho_, mech.tau_, eps) == pytest.approx(exact, rel=1e-10, abs=1e-14)
        assert hockey_stick(view[1], view[0], eps) == pytest.approx(exact, rel=1e-10, abs=1e-14)  # symmetric


def test_hadamard_sets_shuffled_guarantee_exact() -> None:
    mech = MultiMessageHadamard(3, 1.0, 0.1, n_expected=2, k_set=2, rho=1, tau=1)
    for eps in (0.5, 2.0):
        claimed = mech.delta_central(2, eps)
        for a, b in [([0, 1], [0, 2]), ([0, 1], [2]), ([0], [1, 2])]:
            p, q = central(mech, [a, [1]]), central(mech, [b, [1]])  # type: ignore[list-item]
            assert hockey_stick(p, q, eps) <= claimed + 1e-12


@pytest.mark.parametrize("mech", [TINY_HR[1], TINY_HR[2], MultiMessageHadamard(3, 1.0, 0.1, 2, k_set=2, rho=1,
                                                                                tau=1)], ids=repr)
def test_hadamard_enumeration_matches_encode(mech: MultiMessageHadamard) -> None:
    draws = 60_000
    rng = seeded_rng(7)
    inputs = [[0, 2], [1]] if mech.k_set == 2 else [0, 1]
    for x in inputs:
        expected = {hadamard_key_codes(mech, k): p for k, p in mech.exact_message_distribution(x).items()}
        sets = np.array([x + [-1] * (mech.k_set - len(x))] * draws) if isinstance(x, list) else np.full(draws, x)
        reports, owner = mech.encode_sets(sets, rng)
        assert mech.validate(reports).all()
        assert_matches(expected, empirical_keys(hadamard_code(mech, reports["values"]), owner, draws), draws)


def test_hadamard_shuffled_enumeration_matches_encode() -> None:
    mech, draws = TINY_HR[0], 60_000
    dataset = [0, 1]
    expected = {hadamard_key_codes(mech, k): p for k, p in central(mech, dataset).items()}
    reports, owner = mech.encode_messages(np.tile(dataset, draws), seeded_rng(8))
    run = owner // len(dataset)  # all messages of one run (both clients) form one shuffled multiset
    assert_matches(expected, empirical_keys(hadamard_code(mech, reports["values"]), run, draws), draws)


# -- count-min --------------------------------------------------------------------------------------------


def distinct_pair(mech: CountMinMultiRR) -> tuple[int, int]:
    """Two items whose buckets differ in every row (the accountant's worst case is then realised)."""
    h = mech.hash_table
    for a, b in itertools.combinations(range(mech.d), 2):
        if np.all(h[:, a] != h[:, b]):
            return a, b
    raise AssertionError("no fully separated pair")


def cm_codes(mech: CountMinMultiRR, reports: np.ndarray) -> np.ndarray:
    return reports["seed"].astype(np.int64) * mech.buckets_ + reports["z"]


def cm_key_codes(mech: CountMinMultiRR, key: tuple) -> tuple:
    return tuple(sorted(r * mech.buckets_ + z for r, z in key))


TINY_CM = [
    CountMinMultiRR(8, 1.0, 0.1, n_expected=2, rows=2, buckets=2, gamma=0.3),
    CountMinMultiRR(8, 2.0, 0.1, n_expected=2, rows=1, buckets=3, gamma=0.45),
    CountMinMultiRR(8, 1.0, 0.1, n_expected=2, rows=2, buckets=2, gamma=0.3, max_blanket=2),  # truncated
]


@pytest.mark.parametrize("mech", TINY_CM, ids=repr)
def test_countmin_client_alone_is_not_locally_private(mech: CountMinMultiRR) -> None:
    a, b = distinct_pair(mech)
    da, db = mech.exact_message_distribution(a), mech.exact_message_distribution(b)
    assert sum(da.values()) == pytest.approx(1.0, abs=1e-12)
    assert local_epsilon(da, db) == math.inf == mech.epsilon_local


@pytest.mark.parametrize("mech", TINY_CM, ids=repr)
@pytest.mark.parametrize("n", [2, 3])
def test_countmin_shuffled_guarantee_exact(mech: CountMinMultiRR, n: int) -> None:
    a, b = distinct_pair(mech)
    others = [c for c in range(mech.d) if c not in (a, b)][: n - 1]
    shuffled = {x: central(mech, [x, *others]) for x in {a, b, *range(4)}}
    for eps in (0.3, 1.0, 2.0):
        claimed = mech.delta_central(n, eps)
        exact = hockey_stick(shuffled[a], shuffled[b], eps)
        assert exact <= claimed + 1e-12
        if mech.max_blanket is None:  # not vacuous: the worst case for separated items, up to grid rounding
            assert claimed <= 1.02 * exact + 2e-3
        for x, y in itertools.permutations(range(4), 2):  # any pair, including shared buckets
            assert hockey_stick(shuffled[x], shuffled[y], eps) <= claimed + 1e-12


@pytest.mark.parametrize("mech", TINY_CM, ids=repr)
def test_countmin_enumeration_matches_encode(mech: CountMinMultiRR) -> None:
    draws = 60_000
    rng = seeded_rng(9)
    for x in distinct_pair(mech):
        expected = {cm_key_codes(mech, k): p for k, p in mech.exact_message_distribution(x).items()}
        reports, owner = mech.encode_messages(np.full(draws, x), rng)
        assert mech.validate(reports).all()
        assert np.bincount(owner, minlength=draws).max() <= mech.messages_per_channel
        assert_matches(expected, empirical_keys(cm_codes(mech, reports), owner, draws), draws)


def test_countmin_shuffled_enumeration_matches_encode() -> None:
    mech, draws = TINY_CM[0], 60_000
    dataset = list(distinct_pair(mech))
    expected = {cm_key_codes(mech, k): p for k, p in central(mech, dataset).items()}
    reports, owner = mech.encode_messages(np.tile(dataset, draws), seeded_rng(10))
    assert_matches(expected, empirical_keys(cm_codes(mech, reports), owner // 2, draws), draws)
