"""Exact LDP of Hadamard response and the count-mean sketch by enumeration (docs/mathematics.md §2.5, §2.6),
checks that the enumeration describes what ``encode`` does, and the report surface (validate, keyed
reproducibility, large domains)."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from scipy.linalg import hadamard

import transforms.mechanisms.frequency.count_mean_sketch as cms_module
from tests.mechanisms.ldp_helpers import assert_encode_matches_table, assert_exact_ldp
from transforms.mechanisms.base import FrequencyEstimate
from transforms.mechanisms.frequency.count_mean_sketch import CountMeanSketch
from transforms.mechanisms.frequency.hadamard import HadamardResponse, fwht, hadamard_order
from transforms.mechanisms.randomness import KeyedRandom, job_key_from_seed, seeded_rng

Mech = HadamardResponse | CountMeanSketch

HR_CASES = [HadamardResponse(d, eps) for d in (2, 3, 5, 7, 8) for eps in (0.5, 2.0)]
CMS_CASES = [
    CountMeanSketch(3, 0.5, k=1, m=2, hash_seed=1),
    CountMeanSketch(4, 2.0, k=2, m=3),
    CountMeanSketch(5, 1.0, k=3, m=4),
    CountMeanSketch(6, 3.0, k=4, m=4, hash_seed=7),
]
EMPIRICAL = [HadamardResponse(5, 0.5), HadamardResponse(7, 2.0), CountMeanSketch(4, 2.0, k=2, m=3),
             CountMeanSketch(5, 1.0, k=3, m=4)]


def _ids(m: object) -> str:
    return repr(m)


def outcome_index(mech: Mech, reports: np.ndarray) -> np.ndarray:
    """Map reports to the order documented by ``exact_output_distribution``."""
    if isinstance(mech, HadamardResponse):
        return reports["value"]
    bits = np.unpackbits(reports["bits"], axis=1, count=mech.m).astype(np.int64)
    return reports["row"] * (1 << mech.m) + bits @ (1 << np.arange(mech.m))


def _table(mech: Mech) -> np.ndarray:
    return np.stack([mech.exact_output_distribution(x) for x in range(mech.d)])


def _separating_fraction(mech: CountMeanSketch) -> np.ndarray:
    """Fraction of hash rows on which each pair of items lands in different columns (d x d)."""
    return 1.0 - mech.collision_fraction()


@pytest.mark.parametrize("mech", HR_CASES + CMS_CASES, ids=_ids)
def test_exact_ldp_ratio(mech: Mech) -> None:
    worst = assert_exact_ldp(_table(mech), mech.epsilon_local)
    bound = math.exp(mech.epsilon_local)
    if isinstance(mech, CountMeanSketch) and not np.any(_separating_fraction(mech) > 0):
        pytest.fail("test case has no pair separated by any hash row: pick another hash_seed")
    assert worst == pytest.approx(bound, rel=1e-12)  # tight: some row separates some pair


@pytest.mark.parametrize("mech", HR_CASES + CMS_CASES, ids=_ids)
def test_mixture_alpha_bounds_total_variation(mech: Mech) -> None:
    # docs/mathematics.md §1.2, §2.5: alpha = max TV(R(x), R(x')) / (e^eps - 1); HR: exactly 1/(2(e^eps + 1)).
    table = _table(mech)
    tv = np.array([[0.5 * np.abs(table[x] - table[x2]).sum() for x2 in range(mech.d)] for x in range(mech.d)])
    alpha = tv.max() / math.expm1(mech.epsilon)
    assert alpha <= mech.mixture_alpha * (1 + 1e-12)
    assert (1 + math.exp(mech.epsilon)) * mech.mixture_alpha <= 1 + 1e-12
    if isinstance(mech, HadamardResponse):
        assert alpha == pytest.approx(1 / (2 * (math.exp(mech.epsilon) + 1)), rel=1e-12)
        assert alpha == pytest.approx(mech.mixture_alpha, rel=1e-12)
        off_diagonal = tv[~np.eye(mech.d, dtype=bool)]
        np.testing.assert_allclose(off_diagonal, tv.max(), rtol=1e-12)  # every pair: |C_v cap C_v'| = K/4
    else:  # TV of a pair = tanh(eps/4) x fraction of rows that separate it; alpha uses fraction 1
        np.testing.assert_allclose(tv, math.tanh(mech.epsilon / 4) * _separating_fraction(mech), atol=1e-12)


@pytest.mark.parametrize("mech", EMPIRICAL, ids=_ids)
def test_enumeration_matches_encode(mech: Mech) -> None:
    assert_encode_matches_table(mech, _table(mech), outcome_index, draws=100_000, seed=4321)


def test_hadamard_supports_are_rows_of_the_sylvester_matrix() -> None:
    mech = HadamardResponse(11, 1.0)
    K = mech.order
    assert K == 16 and mech.message_bits == 4
    H = hadamard(K)
    for v in range(mech.d):
        high = mech.exact_output_distribution(v) > 1.0 / K
        np.testing.assert_array_equal(high, H[v + 1] == 1)
    assert [hadamard_order(d) for d in (2, 3, 4, 7, 8, 2**20)] == [4, 4, 8, 8, 16, 2**21]


def test_fwht_matches_dense_transform() -> None:
    rng = seeded_rng(5)
    for K in (1, 2, 8, 64):
        x = rng.integers(-50, 50, K)
        np.testing.assert_array_equal(fwht(x), hadamard(K) @ x)
    with pytest.raises(ValueError, match="power of two"):
        fwht(np.zeros(12))


def test_hadamard_large_domain() -> None:
    """d = 2^20: O(1) encoding, O(K log K) decoding, estimates within their standard errors."""
    mech = HadamardResponse(2**20, 2.0)
    rng = seeded_rng(11)
    values = rng.integers(0, 64, 50_000) * 16_411 % mech.d  # 64 distinct items spread over the domain
    reports = mech.encode(values, rng)
    assert mech.validate(reports).all() and mech.message_bits == 21
    acc = mech.new_accumulator()
    acc.add(reports)
    est = acc.estimate()
    truth = np.bincount(values, minlength=mech.d)
    z = (est.count - truth) / (est.stderr * est.n)
    assert np.max(np.abs(z)) < 6.5  # Bonferroni over 2^20 items: P(max > 6.5) ~ 1e-4
    dist = mech.exact_output_distribution(mech.d - 1)
    assert dist.size == 2**21 and dist.sum() == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("mech", [HadamardResponse(9, 1.0), CountMeanSketch(50, 2.0, k=16, m=20)], ids=_ids)
def test_keyed_randomness_ignores_batch_boundaries(mech: Mech) -> None:
    values = seeded_rng(3).integers(0, mech.d, 500)
    ids = np.arange(500, dtype=np.uint64)
    key = job_key_from_seed(9)
    whole = mech.encode(values, KeyedRandom.for_elements(key, ids))
    parts = np.concatenate([mech.encode(values[a:b], KeyedRandom.for_elements(key, ids[a:b]))
                            for a, b in ((0, 7), (7, 300), (300, 500))])
    np.testing.assert_array_equal(whole, parts)


def test_pickled_mechanisms_carry_public_parameters_only() -> None:
    cms = CountMeanSketch(30, 1.0, k=5, m=9, hash_seed=3)
    ones = np.arange(45).reshape(5, 9)
    support = cms.support(ones)  # builds the cached hash table
    clone = pickle.loads(pickle.dumps(cms))
    assert clone == cms and "_hash_table" not in vars(clone)
    np.testing.assert_array_equal(clone.support(ones), support)
    acc = cms.new_accumulator()
    acc.add(cms.encode(np.arange(30), seeded_rng(4)))
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(acc)).estimate().count, acc.estimate().count)


def test_validate_rejects_outputs_outside_the_domain() -> None:
    hr = HadamardResponse(5, 1.0)
    good = hr.encode(np.arange(5), seeded_rng(1))
    bad = good.copy()
    bad["value"][[0, 1]] = [-1, hr.order]
    np.testing.assert_array_equal(hr.validate(bad), [False, False, True, True, True])
    assert not hr.validate(np.zeros(2, dtype=[("z", "<i8")])).any()

    cms = CountMeanSketch(10, 1.0, k=4, m=12)
    assert cms.report_dtype["bits"].shape == (2,) and cms.bit_length == 12 and cms.message_bits == 14
    good = cms.encode(np.arange(10), seeded_rng(2))
    assert cms.validate(good).all()
    bad = good.copy()
    bad["row"][0] = 4
    bad["bits"][1, -1] |= 1  # a padding bit (bits 12..15 are padding)
    np.testing.assert_array_equal(cms.validate(bad)[:3], [False, False, True])
    acc = cms.new_accumulator()
    with pytest.raises(ValueError, match="outside the cms output domain"):
        acc.add(bad)


def test_cms_accumulator_counts_bits_exactly_and_merges() -> None:
    """Both counting paths (small batches unpacked, large ones histogrammed) equal a brute-force count."""
    mech = CountMeanSketch(40, 1.0, k=8, m=1030)
    rng = seeded_rng(6)
    reports = mech.encode(rng.integers(0, 40, 6000), rng)
    bits = np.unpackbits(reports["bits"], axis=1, count=mech.m).astype(np.int64)
    brute = np.zeros((mech.k, mech.m), dtype=np.int64)
    np.add.at(brute, reports["row"], bits)
    small, large, merged = mech.new_accumulator(), mech.new_accumulator(), mech.new_accumulator()
    for start in range(0, 6000, 1000):
        small.add(reports[start : start + 1000])
    large.add(reports)
    merged.add(reports[:10])
    other = mech.new_accumulator()
    other.add(reports[10:])
    merged.merge(other)
    for acc in (small, large, merged):
        np.testing.assert_array_equal(acc.ones, brute)
        np.testing.assert_array_equal(acc.row_counts, np.bincount(reports["row"], minlength=mech.k))
        assert acc.n == 6000
    # Apple's per-report update summed, against the sketch recomputed from counts.
    apple = np.zeros((mech.k, mech.m))
    np.add.at(apple, reports["row"], mech.k * (mech.c_eps / 2 * (2 * bits - 1) + 0.5))
    np.testing.assert_allclose(large.sketch(), apple, rtol=1e-9, atol=1e-9 * np.abs(apple).max())
    est = large.estimate()
    assert isinstance(est, FrequencyEstimate)
    table = mech.hash(np.arange(mech.k)[:, None], np.arange(mech.d)[None, :])
    apple_estimate = mech.m / (mech.m - 1) * (apple[np.arange(mech.k)[:, None], table].sum(0) / mech.k
                                              - 6000 / mech.m)
    np.testing.assert_allclose(est.count, apple_estimate, rtol=1e-9, atol=1e-6)


def test_cms_large_domain_decodes_row_by_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """k d above the cached-table limit: the row-by-row decoder gives the cached decoder's answer."""
    cached = CountMeanSketch(3000, 2.0, k=20, m=64)
    ones = seeded_rng(8).integers(0, 1000, (20, 64))
    expected = cached.support(ones)
    assert cached._hash_table is not None
    monkeypatch.setattr(cms_module, "MAX_CACHED_TABLE", 1000)
    row_by_row = CountMeanSketch(3000, 2.0, k=20, m=64)
    assert row_by_row._hash_table is None
    np.testing.assert_array_equal(row_by_row.support(ones), expected)
    table = cached.hash(np.arange(20)[:, None], np.arange(3000)[None, :])
    np.testing.assert_array_equal(expected, ones[np.arange(20)[:, None], table].sum(axis=0))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"k": 0}, "k \\(hash rows\\)"), ({"m": 1}, "m \\(sketch width\\)"), ({"hash_seed": -1}, "hash_seed"),
     ({"k": 2.5}, "k \\(hash rows\\)"), ({"epsilon": 0.0}, "epsilon"), ({"d": 1}, "domain size"),
     ({"k": 2**20, "m": 1024}, "lower k")],
)
def test_cms_parameter_errors(kwargs: dict[str, float], match: str) -> None:
    params = {"d": 10, "epsilon": 1.0, **kwargs}
    with pytest.raises(ValueError, match=match):
        CountMeanSketch(**params)


def test_hadamard_parameter_errors() -> None:
    with pytest.raises(ValueError, match="use OLH or the count-mean sketch"):
        HadamardResponse(2**25, 1.0)
    with pytest.raises(ValueError, match="epsilon"):
        HadamardResponse(4, -1.0)
    assert HadamardResponse(4.0, 1).parameters() == {"d": 4, "epsilon": 1.0}  # type: ignore[arg-type]
