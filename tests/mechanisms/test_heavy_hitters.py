"""Prefix-tree heavy hitters (docs/mathematics.md §6): exact LDP of the message set, item hashing, candidate
decoding, the count-min style query, and the contract: Zipf(1.1) over 2^32 items, 1e5 clients, eps 6."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.mechanisms.ldp_helpers import assert_counts_follow_law, assert_exact_ldp
from transforms.mechanisms.hashing import hash_to_buckets
from transforms.mechanisms.heavy_hitters.prefix_tree import PrefixHeavyHitters, item_hash
from transforms.mechanisms.randomness import KeyedRandom, seeded_rng
from transforms.mechanisms.ranges.channel_oracles import central_epsilon_sampled, lower_level_clients
from transforms.privacy.mixture import alpha_olh
from transforms.privacy.shuffle_bound import epsilon_central

TINY = [PrefixHeavyHitters(eps, item_bits=4, level_bits=2, g=3, seed_family=4, levels=mode)
        for eps in (0.5, 2.0) for mode in ("sample", "all")]


def _table(m: PrefixHeavyHitters) -> np.ndarray:
    return np.stack([m.exact_message_distribution(x) for x in range(1 << m.item_bits)])


@pytest.mark.parametrize("m", TINY, ids=repr)
def test_exact_ldp_of_message_set(m: PrefixHeavyHitters) -> None:
    assert_exact_ldp(_table(m), m.epsilon_local)
    # per message (one level, at epsilon_message): TV / (e^eps_msg - 1) <= mixture_alpha
    for j in range(m.channels):
        laws = np.stack([_level_law(m, j, x) for x in range(1 << m.item_bits)])
        tv = 0.5 * np.abs(laws[:, None] - laws[None, :]).sum(axis=-1)
        assert float(tv.max()) / math.expm1(m.epsilon_message) <= m.mixture_alpha * (1 + 1e-12)


def _level_law(m: PrefixHeavyHitters, level: int, x: int) -> np.ndarray:
    """P((seed, z) | x) of one message on ``level``, written out independently of the mechanism's method."""
    prefix = np.uint64(x >> (m.item_bits - m.prefix_lengths[level]))
    law = np.full((m.seed_family, m.buckets), m.q_other)
    law[np.arange(m.seed_family), hash_to_buckets(np.arange(m.seed_family), np.full(m.seed_family, prefix),
                                                  m.buckets)] = m.p
    return law.ravel() / m.seed_family


@pytest.mark.parametrize("m", TINY[:2], ids=repr)
def test_enumeration_matches_encode(m: PrefixHeavyHitters) -> None:
    rng = seeded_rng(12)
    draws, size = 40_000, m.seed_family * m.buckets
    table = _table(m)
    for x in (0, 5, 15):
        reports, owner = m.encode_messages(np.full(draws, x), rng)
        assert m.validate(reports).all()
        if m.levels == "sample":
            index = reports["channel"] * size + reports["seed"] * m.buckets + reports["z"]
        else:
            assert np.array_equal(owner, np.repeat(np.arange(draws), m.channels))
            per = (reports["seed"] * m.buckets + reports["z"]).reshape(-1, m.channels)
            index = per[:, 0] * size + per[:, 1]
        assert_counts_follow_law(np.bincount(index, minlength=table.shape[1]), table[x], draws, x)
        # pooled: the fraction of messages reporting their true bucket is p (sensitive to a 2% error in p)
        prefix = m.prefixes(np.full(len(reports), x, dtype=np.uint64), reports["channel"])
        kept = reports["z"] == hash_to_buckets(reports["seed"], prefix, m.buckets)
        assert abs(kept.mean() - m.p) < 5 * math.sqrt(m.p * (1 - m.p) / len(reports))


def test_item_hash_is_vectorised_and_consistent() -> None:
    words = np.array(["alpha", "beta", "", "gamma ray", "ß", "alpha"])
    h = item_hash(words)
    assert h.dtype == np.uint64 and np.all(h < 2**32)
    assert h[0] == h[-1] and len(set(h[:-1].tolist())) == 5
    one_by_one = np.concatenate([item_hash(np.array([w])) for w in words])
    assert np.array_equal(h, one_by_one)
    assert np.array_equal(h, item_hash(np.char.encode(words, "utf-8")))
    assert np.array_equal(h, item_hash(np.array(list(words), dtype=object)))
    ints = np.arange(100_000)
    hashed = item_hash(ints, bits=32)
    assert np.unique(hashed).size > 99_990  # 2^32 buckets: ~1 collision expected
    assert np.all(item_hash(ints, bits=10) < 1024)
    assert np.array_equal(item_hash(ints, bits=64) >> np.uint64(32), hashed)


def test_keyed_randomness_and_validation() -> None:
    m = PrefixHeavyHitters(3.0, item_bits=16, level_bits=4, seed_family=64)
    keys = np.arange(1, 201, dtype=np.uint64) * np.uint64(0xA24BAED4963EE407)
    items = seeded_rng(0).integers(0, 2**16, 200)
    whole = m.encode(items, KeyedRandom(keys))
    split = np.concatenate([m.encode(items[:50], KeyedRandom(keys[:50])), m.encode(items[50:], KeyedRandom(keys[50:]))])
    assert np.array_equal(whole, split)
    bad = whole.copy()
    bad["channel"][0], bad["seed"][1], bad["z"][2] = 4, 64, m.buckets
    assert m.validate(bad).tolist()[:4] == [False, False, False, True]
    with pytest.raises(ValueError, match="below 2"):
        m.encode(np.array([2**16]), seeded_rng(0))
    with pytest.raises(ValueError, match="multiple of level_bits"):
        PrefixHeavyHitters(1.0, item_bits=32, level_bits=5)


def zipf_items(n: int, rng: np.random.Generator) -> np.ndarray:
    """Zipf(1.1) ranks (support truncated to 2^32 by redrawing), scattered over 2^32 by the item hash."""
    ranks = rng.zipf(1.1, n)
    while (too_big := ranks > 2**32).any():
        ranks[too_big] = rng.zipf(1.1, int(too_big.sum()))
    return item_hash(ranks.astype(np.uint64), 32)


def test_contract_zipf_top10_found_at_eps6() -> None:
    """Zipf(1.1) over 2^32 items, 1e5 clients, eps_local = 6, one random level of 8 bits per client: the true
    top 10 are all among the reported items, decoding only candidate prefixes, with honest stderrs."""
    rng = seeded_rng(20240611)
    n = 100_000
    items = zipf_items(n, rng)
    values, counts = np.unique(items, return_counts=True)
    order = np.argsort(-counts, kind="stable")
    top10 = values[order[:10]]
    m = PrefixHeavyHitters(6.0)
    acc = m.new_accumulator()
    reports, _ = m.encode_messages(items, rng)
    for chunk in np.array_split(np.arange(n), 3):
        part = m.new_accumulator()
        part.add(reports[chunk], len(chunk))
        acc.merge(part)
    hh = acc.estimate()
    assert np.isin(top10, hh.items).all(), np.isin(top10, hh.items)
    assert np.isin(top10, hh.items[:15]).all()  # and near the top of the ranking
    assert max(hh.candidates) <= m.width << m.level_bits  # never more than width * 2^8 prefixes per level
    true_of = dict(zip(values.tolist(), counts.tolist(), strict=True))
    z = (hh.count[:20] - np.array([true_of.get(int(i), 0) for i in hh.items[:20]])) / hh.stderr[:20]
    assert np.max(np.abs(z)) < 4.5, z
    # count-min style query: the bound is above the truth, the point estimate within a few stderr
    q = acc.query(top10)
    true_top = counts[order[:10]]
    assert np.all(q.upper >= true_top)
    assert np.max(np.abs((q.count - true_top) / q.stderr)) < 4.5
    # central epsilon: a client hides among the ~n/4 clients of its level (delta/2 lower quantile)
    delta = 1e-6
    eps_c = m.epsilon_central(n, delta)
    m_low = lower_level_clients(n, m.channels, delta / 2)
    assert 24_000 < m_low < 25_000
    assert eps_c == epsilon_central(m_low, alpha_olh(6.0, m.buckets), 6.0, delta / 2)
    assert eps_c == central_epsilon_sampled(n, 4, m.mixture_alpha, 6.0, delta)
    assert eps_c < 1.0


def test_all_levels_mode_and_threshold() -> None:
    rng = seeded_rng(8)
    n = 20_000
    heavy = np.array([123456789, 987654321, 5555555], dtype=np.uint64)
    items = np.concatenate([np.repeat(heavy, [4000, 3000, 2000]), rng.integers(0, 2**32, n - 9000).astype(np.uint64)])
    m = PrefixHeavyHitters(8.0, levels="all", seed_family=256, width=8)
    acc = m.new_accumulator()
    acc.add(m.encode(items, rng), n)
    assert acc.messages.tolist() == [n] * 4
    hh = acc.estimate(threshold=1000.0)
    assert set(hh.items.tolist()) == set(heavy.tolist())
    np.testing.assert_allclose(hh.count, [4000, 3000, 2000], atol=5 * hh.stderr.max())


def test_candidate_correction_removes_finite_family_bias() -> None:
    """With a small seed family, a heavy item's empirical collisions bias the textbook estimate of every other
    candidate by ~c_heavy / sqrt(g S); the candidate-restricted exact system removes it (fixed candidate set,
    so no winners' curse)."""
    rng = seeded_rng(3)
    n = 100_000
    items = np.concatenate([np.full(50_000, 40_000, dtype=np.uint64), rng.integers(0, 2**16, 50_000).astype(np.uint64)])
    true = np.bincount(items.astype(np.int64), minlength=2**16).astype(np.float64)
    m = PrefixHeavyHitters(6.0, item_bits=16, level_bits=8, seed_family=256)
    acc = m.new_accumulator()
    acc.add(m.encode(items, rng), n)
    candidates = (np.uint64(40_000 >> 8) << np.uint64(8)) | np.arange(256, dtype=np.uint64)
    rms = {}
    for exact in (False, True):
        counts, corrected = acc.level_counts(1, candidates, exact=exact)
        assert corrected == exact
        est, se = acc._population(1, counts)
        z = (est - true[candidates.astype(np.int64)]) / se
        rms[exact] = float(np.sqrt(np.mean(z**2)))
    assert rms[False] > 3.0, rms  # the bias this corrects is real
    assert rms[True] < 1.3, rms
