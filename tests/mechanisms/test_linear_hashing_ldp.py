"""Linear local hashing (LLH): exact LDP per seed, the enumeration against encode, and exact FWHT decoding."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.mechanisms.ldp_helpers import assert_counts_follow_law, assert_exact_ldp
from transforms.mechanisms.frequency.linear_hashing import (
    LinearLocalHashing,
    fwht,
    linear_hash,
    llh_buckets,
)
from transforms.mechanisms.randomness import KeyedRandom, seeded_rng

CASES = [LinearLocalHashing(d, eps, g=g) for d, eps, g in ((2, 0.5, 2), (5, 1.0, 4), (8, 2.0, 8), (6, 2.0, 2))]
SEEDS = np.arange(0, 2**40, 2**40 // 64, dtype=np.int64)[:64]  # any data-independent set of seeds


def _table(m: LinearLocalHashing) -> np.ndarray:
    """P((seed, z) | x) for a seed uniform over SEEDS: rows x, columns seed * g + z."""
    return np.stack([(m.exact_output_distribution(x, SEEDS) / SEEDS.size).ravel() for x in range(m.d)])


@pytest.mark.parametrize("m", CASES, ids=repr)
def test_exact_ldp_ratio_is_tight(m: LinearLocalHashing) -> None:
    assert_exact_ldp(_table(m), m.epsilon_local)
    # per seed, GRR over g buckets: some seed separates some pair, so the bound is attained
    per_seed = np.stack([m.exact_output_distribution(x, SEEDS) for x in range(m.d)])
    assert float(np.max(per_seed[:, None] / per_seed[None, :])) == pytest.approx(math.exp(m.epsilon), rel=1e-12)


@pytest.mark.parametrize("m", CASES, ids=repr)
def test_mixture_alpha_bounds_total_variation(m: LinearLocalHashing) -> None:
    per_seed = np.stack([m.exact_output_distribution(x, SEEDS) for x in range(m.d)])  # x, seed, z
    tv = 0.5 * np.abs(per_seed[:, None] - per_seed[None, :]).sum(axis=-1)  # TV given each seed
    assert float(tv.max()) / math.expm1(m.epsilon) <= m.mixture_alpha * (1 + 1e-12)
    assert (1 + math.exp(m.epsilon)) * m.mixture_alpha <= 1 + 1e-12


@pytest.mark.parametrize("m", [CASES[1], CASES[2]], ids=repr)
def test_enumeration_matches_encode(m: LinearLocalHashing) -> None:
    """Seeds are 63-bit, so compare the law of the offset (z - H_seed(x)) mod g: p at 0, q' elsewhere."""
    rng = seeded_rng(77)
    draws = 100_000
    expected = np.full(m.buckets, m.q_other)
    expected[0] = m.p
    for x in range(m.d):
        reports = m.encode(np.full(draws, x), rng)
        assert m.validate(reports).all()
        offset = (reports["z"] - linear_hash(reports["seed"], np.full(draws, x), m.k)) % m.buckets
        assert_counts_follow_law(np.bincount(offset, minlength=m.buckets), expected, draws, x)
    # seeds are uniform 63-bit words: every bit is a fair coin
    bit_means = ((reports["seed"][:, None] >> np.arange(63)) & 1).mean(axis=0)
    assert np.max(np.abs(bit_means - 0.5)) < 5 * 0.5 / math.sqrt(draws)
    assert reports["seed"].min() >= 0


def test_hash_is_linear_over_gf2() -> None:
    rng = seeded_rng(3)
    seeds = rng.integers(0, 2**62, 1000)
    a, b = rng.integers(0, 2**20, 1000), rng.integers(0, 2**20, 1000)
    k = 7
    assert np.array_equal(linear_hash(seeds, a ^ b, k), linear_hash(seeds, a, k) ^ linear_hash(seeds, b, k))
    assert np.all(linear_hash(seeds, np.zeros(1000, dtype=np.int64), k) == 0)


def test_fwht_matches_hadamard_matrix() -> None:
    n = 16
    H = (-1) ** np.array([[bin(r & c).count("1") for c in range(n)] for r in range(n)])
    x = seeded_rng(1).integers(-50, 50, (3, n))
    assert np.array_equal(fwht(x), x @ H.T)
    assert np.array_equal(fwht(fwht(x)), n * x)


@pytest.mark.parametrize("d,eps", [(50, 2.0), (7, 0.4), (64, 5.0)])
def test_transform_decoding_equals_direct_support(d: int, eps: float) -> None:
    """FWHT(W)/g is exactly the number of reports consistent with each value (no approximation)."""
    m = LinearLocalHashing(d, eps)
    rng = seeded_rng(5)
    reports = m.encode(rng.integers(0, d, 3000), rng)
    acc = m.new_accumulator()
    acc.add(reports[:1000])
    other = m.new_accumulator()
    other.add(reports[1000:])
    acc.merge(other)
    domain = np.arange(1 << m.bits)
    direct = (linear_hash(reports["seed"][:, None], domain[None, :], m.k) == reports["z"][:, None]).sum(axis=0)
    assert np.array_equal(acc.counts.support(), direct)
    est = acc.estimate()
    np.testing.assert_allclose(est.count, (direct[:d] - 3000 / m.buckets) / (m.p - 1 / m.buckets))


def test_keyed_randomness_reproduces_reports_across_batches() -> None:
    m = LinearLocalHashing(100, 3.0)
    keys = np.arange(1, 501, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    values = seeded_rng(2).integers(0, 100, 500)
    whole = m.encode(values, KeyedRandom(keys))
    parts = np.concatenate([m.encode(values[:123], KeyedRandom(keys[:123])),
                            m.encode(values[123:], KeyedRandom(keys[123:]))])
    assert np.array_equal(whole, parts)


def test_validate_and_parameters() -> None:
    m = LinearLocalHashing(10, 2.0)
    good = m.encode(np.arange(10), seeded_rng(0))
    bad = good.copy()
    bad["z"][0], bad["seed"][1], bad["z"][2] = m.buckets, -1, -1
    assert m.validate(good).all()
    assert m.validate(bad).tolist() == [False, False, False] + [True] * 7
    assert not m.validate(np.zeros(3, dtype=[("seed", "<i8")])).any()
    acc = m.new_accumulator()
    with pytest.raises(ValueError, match="outside the llh output domain"):
        acc.add(bad)
    for g in (3, 1, 2**17):
        with pytest.raises(ValueError, match="power of two"):
            LinearLocalHashing(10, 2.0, g=g)
    with pytest.raises(ValueError, match="bits"):
        LinearLocalHashing(2**25, 2.0)


def test_default_buckets_are_the_better_power_of_two() -> None:
    for eps in (0.1, 1.0, 2.0, 4.0, 6.0):
        g = llh_buckets(eps)
        assert g & (g - 1) == 0 and g >= 2
        e = math.exp(eps)

        def factor(b: int, e: float = e) -> float:
            p = e / (e + b - 1)
            return (1 / b) * (1 - 1 / b) / (p - 1 / b) ** 2

        assert factor(g) <= min(factor(2 ** k) for k in range(1, 13)) * (1 + 1e-12)
