"""Exact LDP of PrivKV, PCKV-UE and PCKV-GRR by enumerating every key-value set of tiny (d, s) (docs/mathematics.md
§3.3-3.4), the mixture alphas against the enumerated total variation, and a check that the enumeration
describes what ``encode`` really does. Also the input/report validation of the three mechanisms."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from tests.mechanisms.ldp_helpers import assert_counts_follow_law
from transforms.mechanisms.keyvalue.kv_baselines import PCKVGRR, PCKVUE, PrivKV
from transforms.mechanisms.randomness import seeded_rng
from transforms.privacy import kv_formulas

Mech = PrivKV | PCKVUE | PCKVGRR

CASES: list[Mech] = [
    PrivKV(3, 1, 1.0), PrivKV(4, 2, 2.0), PrivKV(3, 2, 1.0, epsilon_key=0.3), PrivKV(2, 2, 0.7),
    PCKVUE(3, 1, 1.0), PCKVUE(4, 2, 2.0), PCKVUE(3, 2, 1.0), PCKVUE(3, 1, 1.5, ell=2),
    PCKVUE(4, 2, 1.0, epsilon_value=0.6),
    PCKVGRR(3, 1, 1.0), PCKVGRR(4, 2, 2.0), PCKVGRR(3, 2, 1.5), PCKVGRR(3, 1, 1.0, ell=3),
    PCKVGRR(4, 2, 1.0, epsilon_value=0.6),
]


def all_inputs(d: int, s: int) -> np.ndarray:
    """Every set of at most s items over distinct keys (key sets x sign patterns), padded with -1 to ``[m, s]``."""
    rows = [[2 * k + b for k, b in zip(keys, bits, strict=True)] + [-1] * (s - size)
            for size in range(s + 1) for keys in itertools.combinations(range(d), size)
            for bits in itertools.product((0, 1), repeat=size)]
    return np.array(rows, dtype=np.int64)


def table(mech: Mech) -> np.ndarray:
    return np.stack([mech.exact_output_distribution(row) for row in all_inputs(mech.d, mech.s)])


def outcome_index(mech: Mech, reports: np.ndarray) -> np.ndarray:
    """Reports -> the enumeration order documented by ``exact_output_distribution``."""
    if isinstance(mech, PrivKV):
        return reports["key"] * 3 + reports["value"] + 1
    if isinstance(mech, PCKVGRR):
        return reports["key"] * 2 + (reports["value"] > 0)
    bits = np.unpackbits(reports["bits"], axis=1, count=2 * mech.d).astype(np.int64)
    y = bits[:, 1::2] - bits[:, 0::2]
    return (y + 1) @ (3 ** np.arange(mech.d))


def worst_ratio(tab: np.ndarray) -> float:
    return float(np.max(tab[:, None, :] / tab[None, :, :]))


@pytest.mark.parametrize("mech", CASES, ids=repr)
def test_exact_ldp_ratio(mech: Mech) -> None:
    tab = table(mech)
    np.testing.assert_allclose(tab.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert np.all(tab > 0)
    worst = worst_ratio(tab)
    assert worst <= math.exp(mech.epsilon_local) * (1 + 1e-12)
    if isinstance(mech, PrivKV):  # holder vs non-holder of a key
        assert worst == pytest.approx(math.exp(mech.tight_epsilon), rel=1e-12)
    if isinstance(mech, PCKVUE) and mech.d >= 2 * mech.s and mech.ell == mech.s:
        assert worst == pytest.approx(math.exp(mech.epsilon), rel=1e-12)  # the allocation is tight
    if isinstance(mech, PCKVGRR):
        assert worst == pytest.approx(math.exp(mech.sampled_epsilon), rel=1e-12)


def test_privkv_loose_accounting_is_above_the_tight_value() -> None:
    mech = PrivKV(4, 2, 2.0)
    assert mech.tight_epsilon < mech.epsilon_local == mech.epsilon
    assert worst_ratio(table(mech)) < math.exp(mech.epsilon) * (1 - 1e-3)


@pytest.mark.parametrize("mech", CASES, ids=repr)
def test_mixture_alpha_bounds_total_variation(mech: Mech) -> None:
    """alpha = max TV / (e^eps - 1) is valid (docs/mathematics.md §1.2); the stated alpha may not be smaller."""
    tab = table(mech)
    tv = float(np.max(0.5 * np.abs(tab[:, None, :] - tab[None, :, :]).sum(axis=2)))
    alpha = tv / math.expm1(mech.epsilon_local)
    assert alpha <= mech.mixture_alpha * (1 + 1e-12)
    assert (1 + math.exp(mech.epsilon_local)) * mech.mixture_alpha <= 1 + 1e-12
    if isinstance(mech, PCKVGRR):  # the closed form is the exact worst case, sampling and padding included
        assert alpha == pytest.approx(mech.mixture_alpha, rel=1e-12)


@pytest.mark.parametrize(("d", "s", "eps"), [(8, 2, 1.0), (32, 4, 2.0), (5, 5, 0.5)])
def test_alphas_agree_with_the_planner(d: int, s: int, eps: float) -> None:
    """transforms.privacy.kv_formulas is an independent copy for the planner: the mechanisms must agree."""
    assert PrivKV(d, s, eps).mixture_alpha == pytest.approx(kv_formulas.alpha_privkv(eps), rel=1e-12)
    assert PCKVUE(d, s, eps).mixture_alpha == pytest.approx(kv_formulas.alpha_pckv_ue(eps), rel=1e-12)
    assert PCKVGRR(d, s, eps).mixture_alpha == pytest.approx(kv_formulas.alpha_pckv_grr(eps, d, s), rel=1e-12)


EMPIRICAL = [PrivKV(3, 2, 1.0, epsilon_key=0.3), PCKVUE(3, 1, 1.5, ell=2), PCKVUE(4, 2, 2.0),
             PCKVGRR(3, 1, 1.0, ell=3), PCKVGRR(4, 2, 2.0)]  # inputs: empty, a middle one, a full one


@pytest.mark.parametrize("mech", EMPIRICAL, ids=repr)
def test_enumeration_matches_encode(mech: Mech) -> None:
    draws = 100_000
    rng = seeded_rng(4321)
    inputs = all_inputs(mech.d, mech.s)
    for row in inputs[[0, len(inputs) // 2, -1]]:
        probs = mech.exact_output_distribution(row)
        reports = mech.encode(np.tile(row, (draws, 1)), rng)
        assert mech.validate(reports).all()
        freq = np.bincount(outcome_index(mech, reports), minlength=probs.size)
        assert_counts_follow_law(freq, probs, draws, row)


def test_encode_is_reproducible_per_client_whatever_the_batch() -> None:
    """Draw shapes do not depend on other rows: a KeyedRandom per client reproduces the same report."""
    from transforms.mechanisms.randomness import KeyedRandom, job_key_from_seed

    items = all_inputs(5, 2)[:40]
    ids = np.arange(40, dtype=np.uint64) + 7
    key = job_key_from_seed(9)
    for mech in (PrivKV(5, 2, 1.0), PCKVUE(5, 2, 1.0, ell=3), PCKVGRR(5, 2, 1.0, ell=3)):
        whole = mech.encode(items, KeyedRandom.for_elements(key, ids))
        parts = [mech.encode(items[sl], KeyedRandom.for_elements(key, ids[sl])) for sl in (slice(0, 13),
                                                                                            slice(13, 40))]
        assert np.array_equal(whole, np.concatenate(parts))


def test_validate_rejects_reports_outside_the_output_domain() -> None:
    privkv, grr, ue = PrivKV(4, 2, 1.0), PCKVGRR(4, 2, 1.0), PCKVUE(4, 2, 1.0)
    kv = np.array([(0, 1), (3, 0), (4, 1), (1, 2), (-1, 0)], dtype=privkv.report_dtype)
    assert privkv.validate(kv).tolist() == [True, True, False, False, False]
    kv = np.array([(5, -1), (6, 1), (1, 0), (0, 2)], dtype=grr.report_dtype)  # d' = 6
    assert grr.validate(kv).tolist() == [True, False, False, False]
    bits = np.zeros(4, dtype=ue.report_dtype)  # 2d = 8 bits = 1 byte
    bits["bits"][:, 0] = [0b10010110, 0b11000000, 0b00000011, 0b01101001]
    assert ue.validate(bits).tolist() == [True, False, False, True]
    wrong = np.zeros(2, dtype=[("key", "<i8")])
    assert not privkv.validate(wrong).any()
    acc = privkv.new_accumulator()
    with pytest.raises(ValueError, match="outside the privkv output domain"):
        acc.add(np.array([(9, 1)], dtype=privkv.report_dtype))


@pytest.mark.parametrize("mech", [PrivKV(4, 2, 1.0), PCKVUE(4, 2, 1.0), PCKVGRR(4, 2, 1.0)], ids=repr)
def test_encode_refuses_malformed_items(mech: Mech) -> None:
    rng = seeded_rng(1)
    with pytest.raises(ValueError, match="keys must be distinct"):
        mech.encode(np.array([[2, 3]]), rng)  # key 1 with both signs
    with pytest.raises(ValueError, match="outside"):
        mech.encode(np.array([[0, 8]]), rng)
    with pytest.raises(ValueError, match="outside"):
        mech.encode(np.array([[0, -2]]), rng)
    assert mech.validate(mech.encode(np.array([[-1, -1], [5, -1]]), rng)).all()  # empty slots are allowed
    with pytest.raises(ValueError, match="shape"):
        mech.encode(np.array([0, 2]), rng)
    with pytest.raises(TypeError):
        mech.encode(np.array([[0.0, 2.0]]), rng)


def test_parameters_are_validated_with_clear_errors() -> None:
    with pytest.raises(ValueError, match="sparsity s"):
        PrivKV(4, 5, 1.0)
    with pytest.raises(ValueError, match="epsilon_key"):
        PrivKV(4, 2, 1.0, epsilon_key=1.0)
    with pytest.raises(ValueError, match="ell must be"):
        PCKVUE(4, 2, 1.0, ell=1)
    with pytest.raises(ValueError, match="epsilon_value"):
        PCKVGRR(4, 2, 1.0, epsilon_value=1.5)
    with pytest.raises(ValueError, match="epsilon"):
        PCKVGRR(4, 2, 0.0)
    assert PCKVUE(4, 2, 1.0).epsilon_key == pytest.approx(math.log((math.e + 1) / 2))
