"""Exact removal/replacement LDP of the fragmented unary encodings (docs/mathematics.md §1.1, §2.7, §2.8) by
enumeration, a check that the enumeration is what ``encode_messages`` does, keyed determinism, and the
mechanism surface (validation, accumulators, parameters)."""

from __future__ import annotations

import math
import pickle
from functools import cached_property

import numpy as np
import pytest

from tests.mechanisms.ldp_helpers import assert_counts_follow_law
from transforms.mechanisms.base import FrequencyEstimate, encode_messages
from transforms.mechanisms.frequency.unary import AttributeFragmentedRappor, ReportFragmentedRappor
from transforms.mechanisms.frequency.unary_sampling import OVERFLOW_TAIL, ones_cap
from transforms.mechanisms.randomness import KeyedRandom, seeded_rng
from transforms.privacy.binomial import binom_sf
from transforms.privacy.composition import fragment_epsilon


class CappedRappor(AttributeFragmentedRappor):
    """Same mechanism with a tiny cap, so that the truncation path (first K ones) is exercised."""

    @cached_property
    def cap(self) -> int:
        return 2


class CappedFragments(ReportFragmentedRappor):
    @cached_property
    def backstop_cap(self) -> int:
        return 1

    @cached_property
    def fragment_cap(self) -> int:
        return 2


ATTRIBUTE = [AttributeFragmentedRappor(d, eps) for d in (2, 3, 5) for eps in (0.5, 2.0, 8.55)]
FRAGMENTS = [
    ReportFragmentedRappor(2, 2.0, 1.0, fragments=2),
    ReportFragmentedRappor(3, 2.94, 1.5897, fragments=2),
    ReportFragmentedRappor(2, 1.0, 0.4, fragments=4),
    ReportFragmentedRappor(3, 5.0, 0.5, fragments=3),
    ReportFragmentedRappor(2, 3.0, fragments=3),  # default eps_f
]


def _ids(m: object) -> str:
    return repr(m)


def _table(mech: AttributeFragmentedRappor | ReportFragmentedRappor) -> np.ndarray:
    return np.stack([mech.exact_output_distribution(x) for x in range(mech.d)])


def _worst_ratio(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(a / b))


def _assert_bound(worst: float, eps: float, tight: bool = True) -> None:
    assert worst <= math.exp(eps) * (1 + 1e-12)
    if tight:
        assert worst == pytest.approx(math.exp(eps), rel=1e-9)


@pytest.mark.parametrize("mech", ATTRIBUTE, ids=_ids)
def test_attribute_exact_removal_and_replacement_ratios(mech: AttributeFragmentedRappor) -> None:
    assert mech.cap == mech.d  # small domains are never truncated: the enumeration is the ideal law
    table, ref = _table(mech), mech.exact_reference_distribution()
    np.testing.assert_allclose(table.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert np.all(table > 0) and np.all(ref > 0)
    removal = max(max(_worst_ratio(row, ref), _worst_ratio(ref, row)) for row in table)
    _assert_bound(removal, mech.epsilon_local)
    replacement = max(_worst_ratio(table[x], table[y]) for x in range(mech.d) for y in range(mech.d))
    _assert_bound(replacement, mech.epsilon_replacement)
    assert mech.epsilon_replacement == 2 * mech.epsilon_local


@pytest.mark.parametrize("mech", ATTRIBUTE, ids=_ids)
def test_attribute_alpha_is_per_channel_tv(mech: AttributeFragmentedRappor) -> None:
    # Channel j carries one bit: Bern(p) for the value j, Bern(q) otherwise; TV = p - q, alpha = TV/(e^eps - 1).
    table = _table(mech)
    bit0 = (np.arange(2**mech.d) & 1).astype(bool)
    marginal = table[:, bit0].sum(axis=1)  # P(channel 0 messaged | value)
    np.testing.assert_allclose(marginal, [mech.p] + [mech.q] * (mech.d - 1), rtol=1e-12)
    assert (mech.p - mech.q) / math.expm1(mech.epsilon) == pytest.approx(mech.mixture_alpha, rel=1e-12)
    assert (1 + math.exp(mech.epsilon)) * mech.mixture_alpha == pytest.approx(1.0, rel=1e-12)


def test_truncation_is_post_processing_and_keeps_lowest_ones() -> None:
    mech, ideal = CappedRappor(4, 1.0), AttributeFragmentedRappor(4, 1.0)
    table, ref = _table(mech), mech.exact_reference_distribution()
    assert not np.allclose(table, _table(ideal))  # the cap binds here
    popcount = np.array([bin(k).count("1") for k in range(16)])
    assert np.all(table[:, popcount > 2] == 0)
    # pattern 0b0011 collects every ideal pattern whose two lowest set bits are 0 and 1
    supersets = [k for k in range(16) if k & 0b11 == 0b11]
    assert table[2, 0b0011] == pytest.approx(_table(ideal)[2, supersets].sum(), rel=1e-12)
    removal = max(max(_worst_ratio(r[r > 0], ref[r > 0]), _worst_ratio(ref[r > 0], r[r > 0])) for r in table)
    _assert_bound(removal, mech.epsilon_local, tight=False)


def _messaged_patterns(reports: np.ndarray, owner: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(owner, weights=2.0 ** reports["channel"], minlength=n).astype(np.int64)


def _assert_matches(mech, table: np.ndarray, draws: int = 100_000) -> None:
    rng = seeded_rng(4321)
    for x in range(mech.d):
        reports, owner = mech.encode_messages(np.full(draws, x), rng)
        assert mech.validate(reports).all()
        assert np.all(np.diff(owner) >= 0)  # a client's messages are consecutive
        freq = np.bincount(_messaged_patterns(reports, owner, draws), minlength=table.shape[1])
        assert freq.size == table.shape[1]
        expected = draws * table[x]
        assert np.all(freq[expected == 0] == 0)  # nothing the enumeration calls impossible
        seen = expected > 0
        z = (freq[seen] - expected[seen]) / np.sqrt(expected[seen] * (1 - table[x][seen]))
        assert np.max(np.abs(z)) < 5, (x, np.max(np.abs(z)))


@pytest.mark.parametrize(
    "mech", [AttributeFragmentedRappor(3, 1.0), AttributeFragmentedRappor(4, 2.0), CappedRappor(4, 1.0)], ids=_ids
)
def test_attribute_enumeration_matches_encode(mech: AttributeFragmentedRappor) -> None:
    _assert_matches(mech, _table(mech))


def _marginal(table: np.ndarray, mech: ReportFragmentedRappor, kept: list[int]) -> np.ndarray:
    """Law of the fragments in ``kept`` (an adversary holding only those)."""
    shape = (table.shape[0],) + (2**mech.d,) * mech.fragments  # axis 1 is the highest fragment
    drop = tuple(1 + mech.fragments - 1 - i for i in range(mech.fragments) if i not in kept)
    return table.reshape(shape).sum(axis=drop).reshape(table.shape[0], -1)


@pytest.mark.parametrize("mech", FRAGMENTS, ids=_ids)
def test_fragments_exact_ratios_for_every_exposure(mech: ReportFragmentedRappor) -> None:
    assert mech.backstop_cap == mech.d and mech.fragment_cap == mech.d
    full = np.vstack([_table(mech), mech.exact_reference_distribution()])
    np.testing.assert_allclose(full.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    for t in range(1, mech.fragments + 1):
        for kept in (list(range(t)), list(range(mech.fragments - t, mech.fragments))):
            law = _marginal(full, mech, kept)
            values, ref = law[:-1], law[-1]
            removal = max(max(_worst_ratio(row, ref), _worst_ratio(ref, row)) for row in values)
            _assert_bound(removal, mech.epsilon_exposed(t))  # [ESA] Thm IV.1, tight for binary RR o binary RR
            replacement = max(_worst_ratio(values[x], values[y]) for x in range(mech.d) for y in range(mech.d))
            _assert_bound(replacement, 2 * mech.epsilon_exposed(t))
    assert mech.epsilon_local == mech.epsilon_exposed(mech.fragments) <= mech.epsilon_backstop
    assert mech.epsilon_one_fragment == fragment_epsilon(mech.epsilon_backstop, mech.epsilon_fragment, 1)


@pytest.mark.parametrize("mech", FRAGMENTS[:2], ids=_ids)
def test_one_fragment_bit_is_composite_rr(mech: ReportFragmentedRappor) -> None:
    law = _marginal(_table(mech), mech, [0])
    bit0 = (np.arange(2**mech.d) & 1).astype(bool)
    np.testing.assert_allclose(law[:, bit0].sum(axis=1), [1 - mech.q_composite] + [mech.q_composite] * (mech.d - 1))


def test_capped_fragments_keep_backstop_guarantee() -> None:
    mech = CappedFragments(3, 2.0, 1.0, fragments=2)
    table, ref = _table(mech), mech.exact_reference_distribution()
    assert not np.allclose(table, _table(ReportFragmentedRappor(3, 2.0, 1.0, fragments=2)))
    removal = max(max(_worst_ratio(r[r > 0], ref[r > 0]), _worst_ratio(ref[r > 0], r[r > 0])) for r in table)
    _assert_bound(removal, mech.epsilon_backstop, tight=False)  # the backstop cap is post-processing: eps_b exact
    _assert_matches(mech, table)


@pytest.mark.parametrize(
    "mech", [ReportFragmentedRappor(2, 2.0, 1.0, fragments=2), ReportFragmentedRappor(3, 1.0, 0.7, fragments=3)],
    ids=_ids,
)
def test_fragments_enumeration_matches_encode(mech: ReportFragmentedRappor) -> None:
    _assert_matches(mech, _table(mech))


def test_stored_backstop_makes_windows_share_it() -> None:
    # Two windows drawn from one stored backstop = one window of 2 tau fragments of that backstop.
    window, doubled = ReportFragmentedRappor(2, 2.0, 1.0, fragments=2), ReportFragmentedRappor(2, 2.0, 1.0, fragments=4)
    draws, rng = 100_000, seeded_rng(99)
    table = _table(doubled)
    for x in range(2):
        backstop = window.backstop_bits(np.full(draws, x), rng)
        first = _messaged_patterns(*window.fragments_from_backstop(backstop, rng), draws)
        second = _messaged_patterns(*window.fragments_from_backstop(backstop, rng), draws)
        assert_counts_follow_law(np.bincount(first | (second << 4), minlength=256), table[x], draws, x)


@pytest.mark.parametrize(
    "mech", [AttributeFragmentedRappor(1000, 4.0), AttributeFragmentedRappor(50, 0.5),
             ReportFragmentedRappor(500, 3.0, fragments=3)], ids=_ids
)
def test_keyed_randomness_is_independent_of_batch_boundaries(mech) -> None:
    keys = np.arange(600, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    values = np.random.default_rng(5).integers(0, mech.d, 600)
    whole, owner = mech.encode_messages(values, KeyedRandom(keys))
    for start, stop in [(0, 1), (1, 250), (250, 600)]:
        part, part_owner = mech.encode_messages(values[start:stop], KeyedRandom(keys[start:stop]))
        mask = (owner >= start) & (owner < stop)
        np.testing.assert_array_equal(part["channel"], whole["channel"][mask])
        np.testing.assert_array_equal(part_owner + start, owner[mask])


def test_caps_and_overflow_probabilities() -> None:
    horse = AttributeFragmentedRappor(87_680, 8.55)
    assert horse.cap < 100 and 0 < horse.overflow_probability < OVERFLOW_TAIL
    assert horse.expected_messages == pytest.approx(17.97, abs=0.005)  # [ESA]'s Horse experiment
    # ones_cap is the smallest K with P(Bin(d - 1, q) >= K) < tail: brute force on a small case
    d, q, tail = 40, 0.2, 1e-9
    tails = binom_sf(np.arange(-1, d - 1), d - 1, q)  # tails[k] = P(Bin >= k)
    assert ones_cap(d, q, tail) == int(np.argmax(tails < tail))
    assert ones_cap(5, 0.3) == 5
    frag = ReportFragmentedRappor(87_680, 8.55, fragments=4)
    assert frag.backstop_cap > horse.cap  # its tail is 2^-64/(1 + e^eps_b)
    assert frag.fragment_cap < 300


def test_attribute_surface() -> None:
    mech = AttributeFragmentedRappor(10, 2)
    assert mech.epsilon == 2.0 and isinstance(mech.epsilon, float)
    assert (mech.name, mech.payload_kind, mech.single_message, mech.channels) == ("rappor", "mark", False, 10)
    assert mech.messages_per_channel == 1 and mech.message_bits == 4
    assert mech.parameters() == {"d": 10, "epsilon": 2.0}
    assert pickle.loads(pickle.dumps(mech)) == mech
    reports = np.array([(0,), (9,), (10,), (-1,)], dtype=mech.report_dtype)
    np.testing.assert_array_equal(mech.validate(reports), [True, True, False, False])
    assert not mech.validate(np.zeros(2, dtype=[("value", "<i8")])).any()
    empty, owner = mech.encode_messages(np.array([], dtype=np.int64), seeded_rng(1))
    assert empty.shape == owner.shape == (0,)
    with pytest.raises(ValueError, match="outside the domain"):
        mech.encode(np.array([10]), seeded_rng(1))
    for bad in ({"d": 1, "epsilon": 1.0}, {"d": 10, "epsilon": 0.0}, {"d": 10, "epsilon": 21.0}):
        with pytest.raises(ValueError):
            AttributeFragmentedRappor(**bad)
    reports, owner = encode_messages(mech, np.arange(10), seeded_rng(2))
    assert owner.dtype == np.int64 and len(reports) == len(owner)


def test_accumulators_need_clients_merge_and_check_consistency() -> None:
    mech = AttributeFragmentedRappor(6, 1.0)
    values = np.arange(600) % 6
    reports, owner = mech.encode_messages(values, seeded_rng(3))
    acc = mech.new_accumulator()
    with pytest.raises(ValueError, match="clients"):
        acc.add(reports)
    half = int(np.searchsorted(owner, 300))
    acc.add(reports[:half], 300)
    other = mech.new_accumulator()
    other.add(reports[half:], 0)  # messages and client counts may arrive separately
    other.add(reports[:0], 300)
    acc.merge(other)
    whole = mech.new_accumulator()
    whole.add(reports, 600)
    est, ref = acc.estimate(), whole.estimate()
    assert isinstance(est, FrequencyEstimate) and est.n == 600
    np.testing.assert_array_equal(est.count, ref.count)
    np.testing.assert_allclose(est.stderr, math.sqrt(math.e / (600 * math.expm1(1.0) ** 2)), rtol=1e-12)
    wrong = mech.new_accumulator()
    wrong.add(reports, 10)
    with pytest.raises(ValueError, match="at most one message per channel"):
        wrong.estimate()
    with pytest.raises(ValueError, match="outside"):
        acc.add(np.array([(6,)], dtype=mech.report_dtype), 1)
    with pytest.raises(ValueError, match="cannot merge"):
        acc.merge(AttributeFragmentedRappor(6, 2.0).new_accumulator())
    with pytest.raises(ValueError, match="no clients"):
        mech.new_accumulator().estimate()


def test_fragments_surface() -> None:
    mech = ReportFragmentedRappor(8, 3.0, fragments=4)
    assert mech == ReportFragmentedRappor(8, 3.0, mech.epsilon_fragment, 4)  # the default is resolved
    assert mech.epsilon == 3.0 and mech.channels == 32 and mech.message_bits == 5
    assert mech.parameters() == {"d": 8, "epsilon_backstop": 3.0, "epsilon_fragment": mech.epsilon_fragment,
                                 "fragments": 4}
    assert pickle.loads(pickle.dumps(mech)) == mech
    assert mech.mixture_alpha == pytest.approx(1 / (math.exp(mech.epsilon_local) + 1), rel=1e-12)
    reports, _ = mech.encode_messages(np.arange(8), seeded_rng(1))
    assert mech.validate(reports).all() and reports["channel"].max() < 32
    with pytest.raises(ValueError, match="t must be"):
        mech.epsilon_exposed(5)
    with pytest.raises(ValueError, match="backstop must be"):
        mech.fragments_from_backstop(np.zeros((3, mech.backstop_cap + 1), dtype=np.int64), seeded_rng(1))
    with pytest.raises(ValueError, match="entries must lie"):
        mech.fragments_from_backstop(np.full((3, mech.backstop_cap), 9), seeded_rng(1))
    for bad in ({"fragments": 0}, {"epsilon_fragment": -1.0}, {"epsilon_backstop": 25.0}, {"d": 1}):
        with pytest.raises(ValueError):
            ReportFragmentedRappor(**{"d": 8, "epsilon_backstop": 3.0, **bad})
    acc = mech.new_accumulator()
    acc.add(reports, 8)
    assert acc.counts.shape == (32,) and acc.estimate().count.shape == (8,)
