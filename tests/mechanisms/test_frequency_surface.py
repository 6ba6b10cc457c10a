"""The Mechanism surface of GRR, OUE, OLH: validation, accumulators, keyed determinism, parameters,
and the exactness of the finite-family OLH decoder."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from transforms.mechanisms.base import FrequencyEstimate
from transforms.mechanisms.frequency.oracles import (
    FREQUENCY_MECHANISMS,
    GRR,
    OLH,
    OUE,
    make_frequency_mechanism,
)
from transforms.mechanisms.hashing import hash_to_buckets
from transforms.mechanisms.randomness import KeyedRandom, job_key_from_seed, seeded_rng

Mech = GRR | OUE | OLH
MECHS: list[Mech] = [GRR(10, 1.0), OUE(10, 1.0), OUE(16, 1.0), OLH(10, 1.0), OLH(10, 2.0, g=4, seed_family=64)]


def _ids(m: object) -> str:
    return repr(m)


def _values(n: int, d: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, d, n)


@pytest.mark.parametrize("mech", MECHS, ids=_ids)
def test_encode_output_is_valid_and_typed(mech: Mech) -> None:
    reports = mech.encode(_values(500, mech.d), seeded_rng(1))
    assert reports.dtype == mech.report_dtype and reports.shape == (500,)
    assert mech.validate(reports).all()
    assert mech.encode(np.array([], dtype=np.int64), seeded_rng(1)).shape == (0,)
    with pytest.raises(ValueError, match="outside the domain"):
        mech.encode(np.array([0, mech.d]), seeded_rng(1))


def test_grr_validate_rejects_out_of_domain() -> None:
    m = GRR(5, 1.0)
    reports = np.array([(0,), (4,), (5,), (-1,)], dtype=m.report_dtype)
    np.testing.assert_array_equal(m.validate(reports), [True, True, False, False])
    assert not m.validate(np.zeros(3, dtype=[("other", "<i8")])).any()


def test_oue_validate_rejects_padding_bits_and_wrong_length() -> None:
    m = OUE(10, 1.0)  # 2 bytes, the 6 low bits of the second byte are padding
    reports = np.zeros(4, dtype=m.report_dtype)
    reports["bits"][1] = [0xFF, 0xC0]  # all 10 real bits set: valid
    reports["bits"][2, 1] = 0x01
    reports["bits"][3, 1] = 0x20
    np.testing.assert_array_equal(m.validate(reports), [True, True, False, False])
    assert not m.validate(np.zeros(2, dtype=[("bits", "u1", (3,))])).any()
    assert OUE(16, 1.0).validate(np.full(1, 255, dtype=[("bits", "u1", (2,))])).all()  # no padding


def test_olh_validate_rejects_bad_seed_and_bucket() -> None:
    m = OLH(10, 1.0, g=4, seed_family=64)
    reports = np.array([(0, 0), (63, 3), (64, 0), (0, 4), (0, -1)], dtype=m.report_dtype)
    np.testing.assert_array_equal(m.validate(reports), [True, True, False, False, False])


@pytest.mark.parametrize("mech", MECHS, ids=_ids)
def test_accumulator_refuses_invalid_reports(mech: Mech) -> None:
    reports = mech.encode(_values(10, mech.d), seeded_rng(2))
    if isinstance(mech, OUE) and mech.d % 8:
        reports["bits"][0, -1] |= 1  # a padding bit
    elif isinstance(mech, OUE):  # no padding bits: a report of the wrong length instead
        reports = np.zeros(10, dtype=[("bits", "u1", (mech.n_bytes + 1,))])
    else:
        reports[reports.dtype.names[-1]][0] = 10**6
    acc = mech.new_accumulator()
    with pytest.raises(ValueError, match="validate"):
        acc.add(reports)
    assert acc.n == 0


@pytest.mark.parametrize("mech", MECHS, ids=_ids)
def test_merge_equals_single_accumulator(mech: Mech) -> None:
    reports = mech.encode(_values(3000, mech.d, seed=3), seeded_rng(3))
    single = mech.new_accumulator()
    single.add(reports)
    parts = [mech.new_accumulator() for _ in range(3)]
    for acc, chunk in zip(parts, np.array_split(reports, [700, 2200]), strict=True):
        acc.add(chunk)
    parts[2].merge(parts[0])
    parts[2].merge(parts[1])
    np.testing.assert_array_equal(parts[2].counts, single.counts)
    assert parts[2].n == single.n == 3000
    a, b = single.estimate(), parts[2].estimate()
    assert isinstance(a, FrequencyEstimate) and a.n == 3000
    np.testing.assert_allclose(a.count, b.count, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(a.frequency, a.count / 3000)
    assert a.count.shape == a.stderr.shape == (mech.d,) and np.all(np.isfinite(a.stderr) & (a.stderr > 0))


def test_merge_refuses_other_parameters_or_mechanisms() -> None:
    acc = GRR(10, 1.0).new_accumulator()
    with pytest.raises(ValueError, match="cannot merge"):
        acc.merge(GRR(10, 2.0).new_accumulator())
    with pytest.raises(ValueError, match="cannot merge"):
        acc.merge(OUE(10, 1.0).new_accumulator())
    with pytest.raises(ValueError, match="cannot merge"):
        OLH(10, 1.0).new_accumulator().merge(OLH(10, 1.0, seed_family=2048).new_accumulator())


@pytest.mark.parametrize("mech", MECHS, ids=_ids)
def test_estimate_of_empty_crowd_raises(mech: Mech) -> None:
    with pytest.raises(ValueError, match="no reports"):
        mech.new_accumulator().estimate()


@pytest.mark.parametrize("mech", MECHS, ids=_ids)
def test_keyed_encode_is_independent_of_batch_split(mech: Mech) -> None:
    ids = np.arange(1000, dtype=np.uint64) * 7 + 11
    values = _values(1000, mech.d, seed=4)
    key = job_key_from_seed(99)
    whole = mech.encode(values, KeyedRandom.for_elements(key, ids))
    pieces = [
        mech.encode(values[a:b], KeyedRandom.for_elements(key, ids[a:b]))
        for a, b in ((0, 123), (123, 877), (877, 1000))
    ]
    np.testing.assert_array_equal(np.concatenate(pieces), whole)
    other = mech.encode(values, KeyedRandom.for_elements(job_key_from_seed(100), ids))
    assert not np.array_equal(other, whole)


@pytest.mark.parametrize(
    ("factory", "match"),
    [
        (lambda: GRR(1, 1.0), "domain size"),
        (lambda: GRR(2.5, 1.0), "domain size"),
        (lambda: OUE(10, 0.0), "epsilon"),
        (lambda: OUE(10, float("nan")), "epsilon"),
        (lambda: GRR(10, float("inf")), "epsilon"),
        (lambda: GRR(10, 800.0), "overflows"),
        (lambda: OLH(10, 1.0, g=1), "buckets"),
        (lambda: OLH(10, 1.0, seed_family=0), "seed_family"),
        (lambda: OLH(10, 1.0, seed_family=2**32 + 1), "seed_family"),
        (lambda: OLH(1000, 1.0, g=4, seed_family=64), "raise seed_family to at least 1000"),
        (lambda: make_frequency_mechanism("rappor", 10, 1.0), "valid names: grr, olh, oue"),
        (lambda: make_frequency_mechanism("grr", 10, 1.0, g=3), "bad parameters for 'grr'"),
    ],
)
def test_parameter_validation(factory: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        factory()  # type: ignore[operator]


@pytest.mark.parametrize("mech", MECHS, ids=_ids)
def test_parameters_roundtrip_and_pickle(mech: Mech) -> None:
    params = json.loads(json.dumps(mech.parameters()))
    assert make_frequency_mechanism(mech.name.upper(), **params) == mech
    assert FREQUENCY_MECHANISMS[mech.name] is type(mech)
    assert mech.epsilon_local == mech.epsilon
    if isinstance(mech, OLH):
        _ = mech.hash_table
        clone = pickle.loads(pickle.dumps(mech))
        assert "hash_table" not in clone.__dict__ and clone == mech
        np.testing.assert_array_equal(clone.hash_table, mech.hash_table)


def test_constants() -> None:
    e = np.exp(2.0)
    assert GRR(64, 2.0).message_bits == 6 and GRR(65, 2.0).message_bits == 7
    assert OUE(64, 2.0).message_bits == 64 and OUE(9, 2.0).report_dtype["bits"].shape == (2,)
    olh = OLH(64, 2.0)
    assert olh.buckets == 8 and olh.seed_family == 1024 and olh.message_bits == 10 + 3
    assert GRR(64, 2.0).mixture_alpha == pytest.approx(1 / (e + 63))
    assert OUE(64, 2.0).mixture_alpha == pytest.approx(1 / (2 * (e + 1)))
    assert olh.mixture_alpha == pytest.approx(1 / (e + 7))
    assert OLH(4, 0.1).buckets == 2  # round(e^0.1 + 1) = 2


def _dense_collision(mech: OLH) -> np.ndarray:
    """Pc[x, v] = fraction of seeds with H_s(x) == H_s(v), straight from the hash family."""
    table = hash_to_buckets(np.arange(mech.seed_family)[:, None], np.arange(mech.d)[None, :], mech.buckets)
    return (table[:, :, None] == table[:, None, :]).mean(axis=0)


@pytest.mark.parametrize("mech", [OLH(16, 1.0, g=3, seed_family=32), OLH(40, 2.0, seed_family=64)], ids=_ids)
def test_olh_decoder_exactly_inverts_expected_support(mech: OLH) -> None:
    c = np.random.default_rng(5).integers(0, 500, mech.d).astype(float)
    c[0] = 5000.0
    n = int(c.sum())
    p, q = mech.p, mech.q_other
    M = q * np.ones((mech.d, mech.d)) + (p - q) * _dense_collision(mech)
    expected = M @ c
    np.testing.assert_allclose(mech.expected_support(c), expected, rtol=1e-12)
    # the same expectation from the enumerated output distribution: E[C_v] = sum_x c_x P((s,z) consistent with v | x)
    consistent = np.zeros((mech.seed_family, mech.buckets, mech.d))
    consistent[np.arange(mech.seed_family)[:, None], mech.hash_table, np.arange(mech.d)[None, :]] = 1
    enum = sum(c[x] * mech.exact_output_distribution(x) @ consistent.reshape(-1, mech.d) for x in range(mech.d))
    np.testing.assert_allclose(enum, expected, rtol=1e-12)
    decoded, iterations = mech.decode_support(expected, n)
    assert np.max(np.abs(decoded - c)) <= 1e-8 * np.max(c)
    assert iterations > 0
    # the correction matters: the textbook (fully random hash) inverse is off by far more than that
    textbook = (expected - n / mech.buckets) / (p - 1 / mech.buckets)
    assert np.max(np.abs(textbook - c)) > 1.0


def test_olh_accumulator_support_counts_consistent_reports() -> None:
    mech = OLH(12, 1.0, g=3, seed_family=16)
    reports = mech.encode(_values(400, 12, seed=6), seeded_rng(6))
    acc = mech.new_accumulator()
    acc.add(reports)
    brute = np.array([np.sum(mech.hash_table[reports["seed"], v] == reports["z"]) for v in range(12)])
    np.testing.assert_array_equal(mech.support(acc.counts), brute)
    assert acc.estimate().extras["solver_iterations"] >= 0


def test_oue_byte_histogram_counts_equal_unpacked_bit_sums() -> None:
    mech = OUE(13, 1.0)  # 2 bytes with 3 padding bits; n spans several accumulation chunks
    reports = mech.encode(_values(150_000, 13, seed=7), seeded_rng(7))
    acc = mech.new_accumulator()
    acc.add(reports)
    unpacked = np.unpackbits(reports["bits"], axis=1, count=13).sum(axis=0, dtype=np.int64)
    np.testing.assert_array_equal(acc.counts, unpacked)
