"""Randomness sources: SipHash-2-4 PRF, SplitMix64 keyed streams, seeded vs entropy generators."""

from __future__ import annotations

import hashlib
import logging

import numpy as np
import pytest

from transforms.mechanisms import randomness as rnd
from transforms.mechanisms.base import Randomness
from transforms.mechanisms.randomness import (
    KeyedRandom,
    element_id,
    job_key_from_entropy,
    job_key_from_seed,
    os_entropy_rng,
    seeded_rng,
    siphash24,
    splitmix64_mix,
    topic_hash,
)

MASK = (1 << 64) - 1
REF_KEY = bytes(range(16))


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & MASK


def _round(v: list[int]) -> None:
    v[0] = (v[0] + v[1]) & MASK
    v[1] = _rotl(v[1], 13) ^ v[0]
    v[0] = _rotl(v[0], 32)
    v[2] = (v[2] + v[3]) & MASK
    v[3] = _rotl(v[3], 16) ^ v[2]
    v[0] = (v[0] + v[3]) & MASK
    v[3] = _rotl(v[3], 21) ^ v[0]
    v[2] = (v[2] + v[1]) & MASK
    v[1] = _rotl(v[1], 17) ^ v[2]
    v[2] = _rotl(v[2], 32)


def siphash24_scalar(key: bytes, message: bytes) -> int:
    """Independent pure-Python SipHash-2-4 for any message length (straight from the paper)."""
    k0, k1 = int.from_bytes(key[:8], "little"), int.from_bytes(key[8:], "little")
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D, k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573]
    full = len(message) // 8 * 8
    blocks = [int.from_bytes(message[i : i + 8], "little") for i in range(0, full, 8)]
    blocks.append(((len(message) & 0xFF) << 56) | int.from_bytes(message[full:], "little"))
    for m in blocks:
        v[3] ^= m
        _round(v)
        _round(v)
        v[0] ^= m
    v[2] ^= 0xFF
    for _ in range(4):
        _round(v)
    return v[0] ^ v[1] ^ v[2] ^ v[3]


def test_scalar_reference_matches_published_vectors() -> None:
    # SipHash paper / reference implementation, key 00..0f: empty message, 00..07 and the paper's 00..0e.
    assert siphash24_scalar(REF_KEY, b"") == 0x726FDB47DD0E0E31
    assert siphash24_scalar(REF_KEY, bytes(range(8))) == 0x93F5F5799A932462
    assert siphash24_scalar(REF_KEY, bytes(range(15))) == 0xA129CA6149BE45E5


def test_vectorised_siphash_reference_vector() -> None:
    msg = np.array([int.from_bytes(bytes(range(8)), "little")], dtype=np.uint64)
    assert int(siphash24(REF_KEY, msg)[0]) == 0x93F5F5799A932462


def test_vectorised_siphash_matches_scalar_on_random_inputs() -> None:
    gen = np.random.default_rng(7)
    for _ in range(3):
        key = gen.bytes(16)
        msgs = gen.integers(0, 2**64, size=200, dtype=np.uint64)
        msgs[:3] = [0, 2**64 - 1, 1]
        out = siphash24(key, msgs)
        expected = [siphash24_scalar(key, int(m).to_bytes(8, "little")) for m in msgs]
        assert out.dtype == np.uint64
        assert [int(x) for x in out] == expected


def test_siphash_rejects_bad_key_and_dtype() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        siphash24(b"short", np.zeros(2, dtype=np.uint64))
    with pytest.raises(TypeError):
        siphash24(REF_KEY, np.zeros(2))


def test_splitmix_first_output_of_seed_zero() -> None:
    # Vigna's splitmix64.c seeded with 0: first output 0xE220A8397B1DCDAF.
    assert int(splitmix64_mix(np.array([0x9E3779B97F4A7C15], dtype=np.uint64))[0]) == 0xE220A8397B1DCDAF
    words = KeyedRandom(np.array([0], dtype=np.uint64))._words((1, 1))
    assert int(words[0, 0]) == 0xE220A8397B1DCDAF


def test_keyed_random_satisfies_protocol_and_rows_depend_only_on_their_key() -> None:
    keys = siphash24(job_key_from_seed(3), np.arange(50, dtype=np.uint64))
    whole = KeyedRandom(keys)
    assert isinstance(whole, Randomness)
    draws = [whole.random(50), whole.integers(0, 7, (50, 3)), whole.random((50, 2, 2))]
    for i in (0, 17, 49):
        alone = KeyedRandom(keys[i : i + 1])
        mine = [alone.random(1), alone.integers(0, 7, (1, 3)), alone.random((1, 2, 2))]
        for a, b in zip(draws, mine, strict=True):
            np.testing.assert_array_equal(a[i : i + 1], b)
    again = KeyedRandom(keys)
    np.testing.assert_array_equal(again.random(50), draws[0])
    assert not np.array_equal(again.random(50), draws[0])  # the counter advances between draws


def test_keyed_random_uniformity() -> None:
    n = 200_000
    kr = KeyedRandom.for_elements(job_key_from_seed(11), np.arange(n, dtype=np.uint64))
    u = kr.random((n, 2))
    assert u.min() >= 0.0 and u.max() < 1.0
    x = u[:, 0]
    assert abs(x.mean() - 0.5) < 5 * np.sqrt(1 / 12 / n)
    assert abs(x.var() - 1 / 12) < 5 * np.sqrt(1 / 180 / n)  # Var[(U - 1/2)^2] = 1/80 - 1/144
    assert abs(np.corrcoef(u[:, 0], u[:, 1])[0, 1]) < 5 / np.sqrt(n)
    k = kr.integers(0, 7, n)
    assert k.dtype == np.int64 and k.min() == 0 and k.max() == 6
    counts = np.bincount(k, minlength=7)
    assert np.max(np.abs(counts - n / 7) / np.sqrt(n * (1 / 7) * (6 / 7))) < 5


def test_keyed_integers_broadcast_high_and_refuse_large_ranges() -> None:
    kr = KeyedRandom(np.arange(1000, dtype=np.uint64))
    high = np.arange(1, 1001)
    k = kr.integers(0, high, 1000)
    assert np.all((k >= 0) & (k < high))
    with pytest.raises(ValueError, match="2\\^32"):
        kr.integers(0, 2**32 + 1, 1000)
    with pytest.raises(ValueError):
        kr.integers(3, 3, 1000)
    with pytest.raises(ValueError, match="first dimension"):
        kr.random(999)


def test_purpose_and_job_key_separate_streams() -> None:
    ids = np.arange(100, dtype=np.uint64)
    key = job_key_from_seed(5)
    a = KeyedRandom.for_elements(key, ids).random(100)
    b = KeyedRandom.for_elements(key, ids, purpose="shuffle").random(100)
    c = KeyedRandom.for_elements(job_key_from_seed(6), ids).random(100)
    np.testing.assert_array_equal(a, KeyedRandom.for_elements(key, ids).random(100))
    assert not np.any(a == b) and not np.any(a == c)


def test_seeded_sources_are_reproducible_and_logged(monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(rnd, "_seeded_warned", False)
    with caplog.at_level(logging.WARNING, logger=rnd.__name__):
        a = seeded_rng(42).random(5)
        b = seeded_rng(42).random(5)
        k1, k2 = job_key_from_seed(42), job_key_from_seed(42)
    np.testing.assert_array_equal(a, b)
    assert k1 == k2 and len(k1) == 16 and k1 != job_key_from_seed(43)
    warnings = [r for r in caplog.records if "tests and simulations only" in r.getMessage()]
    assert len(warnings) == 1  # loud, but once


def test_entropy_sources_differ_between_calls(monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(rnd, "_seeded_warned", False)
    with caplog.at_level(logging.WARNING, logger=rnd.__name__):
        assert not np.array_equal(os_entropy_rng().random(4), os_entropy_rng().random(4))
        k = job_key_from_entropy()
    assert len(k) == 16 and k != job_key_from_entropy()
    assert not caplog.records


def test_element_ids_and_topic_hash() -> None:
    th = topic_hash("reports")
    assert th == int.from_bytes(hashlib.blake2b(b"reports", digest_size=8).digest(), "little")
    assert th != topic_hash("reports2")
    offsets = np.arange(100_000)
    ids = element_id(np.full(offsets.size, 3), offsets, th)
    assert ids.dtype == np.uint64 and np.unique(ids).size == offsets.size
    other = element_id(np.full(offsets.size, 4), offsets, th)
    assert np.intersect1d(ids, other).size == 0
    np.testing.assert_array_equal(element_id(3, offsets[:5], th), ids[:5])
    np.testing.assert_array_equal(element_id(3, 7, th), ids[7:8])


def test_element_id_broadcasts_per_element_topic_hashes() -> None:
    th = np.array([topic_hash("a"), topic_hash("b"), topic_hash("a")], dtype=np.uint64)
    ids = element_id(np.array([0, 0, 1], dtype=np.uint64), np.array([5, 5, 5], dtype=np.uint64), th)
    np.testing.assert_array_equal(ids[0:1], element_id(0, 5, topic_hash("a")))
    np.testing.assert_array_equal(ids[1:2], element_id(0, 5, topic_hash("b")))
    assert np.unique(ids).size == 3


def test_keyed_indices_equal_keyed_index_text_by_text() -> None:
    """The shuffler ranks a window's devices in one call; each rank must be the scalar PRF's, or a rerun with
    the other code would order (and sub-key) the same crowd differently."""
    from transforms.mechanisms.randomness import keyed_index, keyed_indices

    key, prefix = bytes(range(32)), "spec/crowd/3600000/"
    suffixes = [bytes(np.random.default_rng(5).integers(0, 16, 32)).hex()[:32] for _ in range(3)]
    suffixes += ["0" * 32, "f" * 32]
    got = keyed_indices(key, prefix, "".join(suffixes).encode(), 32)
    assert got.dtype == np.uint64
    assert got.tolist() == [keyed_index(key, prefix + s, 1 << 64) for s in suffixes]
    assert len(keyed_indices(key, prefix, b"", 32)) == 0
