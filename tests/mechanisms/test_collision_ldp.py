"""Exact LDP of Collision and CoCo by enumeration (docs/mathematics.md §3.1-3.2), the enumeration checked
against ``encode``, and the mechanisms' surface: parameters, t rules, reference constants, input validation,
reproducibility under KeyedRandom, accumulators."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from tests.mechanisms.ldp_helpers import assert_counts_follow_law
from transforms.mechanisms.keyvalue.coco import coco_paper_t, coco_probabilities, coco_total_variance
from transforms.mechanisms.keyvalue.collision import CoCo, Collision, collision_paper_t, collision_total_variance
from transforms.mechanisms.randomness import KeyedRandom, job_key_from_seed, seeded_rng
from transforms.privacy.mixture import alpha_collision
from transforms.privacy.shuffle_bound import epsilon_central

Mech = Collision | CoCo
CASES = [
    Collision(3, 2, 0.5, t=4, seed_family=4),
    Collision(3, 2, 2.0, t=5, seed_family=4),
    Collision(4, 1, 1.0, t=3, seed_family=6),
    CoCo(3, 2, 1.0, t=6, seed_family=3),
    CoCo(2, 1, 2.0, t=4, seed_family=4),
]


def all_inputs(d: int, s: int) -> list[np.ndarray]:
    """Every row a client may send: up to s distinct keys, one sign each, ``-1`` in unused slots."""
    rows = []
    for size in range(s + 1):
        for keys in itertools.combinations(range(d), size):
            for signs in itertools.product((0, 1), repeat=size):
                rows.append(np.array([2 * k + b for k, b in zip(keys, signs, strict=True)] + [-1] * (s - size)))
    return rows


def _ids(m: object) -> str:
    return repr(m)


@pytest.mark.parametrize("mech", CASES, ids=_ids)
def test_exact_ldp_ratio_over_every_input(mech: Mech) -> None:
    table = np.stack([mech.exact_output_distribution(row) for row in all_inputs(mech.d, mech.s)])
    np.testing.assert_allclose(table.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    # every output probability lies in [1/Omega, e^eps/Omega] / S: the LDP argument of §3.1-3.2, for short rows too
    assert table.min() * mech.seed_family * mech.omega >= 1 - 1e-12
    assert table.max() * mech.seed_family * mech.omega <= math.exp(mech.epsilon) * (1 + 1e-12)
    worst = float(np.max(table.max(axis=0) / table.min(axis=0)))
    assert worst <= math.exp(mech.epsilon_local) * (1 + 1e-12)
    assert worst > 1.0  # the output depends on the input at all


@pytest.mark.parametrize("mech", CASES, ids=_ids)
def test_mixture_alpha_bounds_total_variation(mech: Mech) -> None:
    table = np.stack([mech.exact_output_distribution(row) for row in all_inputs(mech.d, mech.s)])
    tv = max(0.5 * np.abs(a - b).sum() for a, b in itertools.combinations(table, 2))
    assert tv / math.expm1(mech.epsilon) <= mech.mixture_alpha * (1 + 1e-12)
    assert mech.mixture_alpha == pytest.approx(mech.s / mech.omega, rel=1e-12)
    assert (1 + math.exp(mech.epsilon)) * mech.mixture_alpha <= 1 + 1e-12


EMPIRICAL = [
    (Collision(4, 3, 1.5, t=5, seed_family=4), [[1, 2, 7], [6, -1, 3], [-1, -1, -1]]),
    (CoCo(4, 2, 1.0, t=6, seed_family=4), [[1, 6], [3, -1], [-1, -1]]),
    (CoCo(6, 3, 2.0, t=8, seed_family=2), [[0, 3, 11], [1, 5, 9]]),
]


@pytest.mark.parametrize(("mech", "rows"), EMPIRICAL, ids=[repr(c[0]) for c in EMPIRICAL])
def test_enumeration_matches_encode(mech: Mech, rows: list[list[int]]) -> None:
    draws = 200_000
    rng = seeded_rng(4321)
    for row in rows:
        law = mech.exact_output_distribution(np.array(row))
        reports = mech.encode(np.tile(row, (draws, 1)), rng)
        assert mech.validate(reports).all()
        freq = np.bincount(reports["seed"].astype(np.int64) * mech.cells + reports["z"], minlength=law.size)
        assert_counts_follow_law(freq, law, draws, row)


def test_spec_constants_11_5() -> None:
    for (d, s, eps, t), value in {(128, 8, 0.5, 28): 45_755.06, (256, 16, 1.0, 74): 39_920.06,
                                  (1024, 16, 2.0, 149): 27_172.92}.items():
        assert collision_paper_t(s, eps) == t
        assert float(collision_total_variance(d, s, eps, t)) == pytest.approx(value, abs=0.01)
    p_ow, pt, po, pf = coco_probabilities(8, 0.5, 24)
    assert (p_ow, pt, po, pf) == pytest.approx((0.247795, 0.053729, 0.037012, 1 / 24), abs=1e-6)
    # not the (e^eps + 1)/(2 Omega) printed in [CoCo]
    assert pt + po == pytest.approx((math.exp(0.5) + 1) / 29.189770, rel=1e-6)
    assert coco_paper_t(8, 0.5) == 24
    assert coco_total_variance(128, 8, 0.5, 24) == pytest.approx(38_372.28, abs=0.01)
    assert coco_total_variance(128, 8, 0.5, 24, "nonmissing") == pytest.approx(179_059.11, abs=0.01)
    assert coco_probabilities(8, 0.5, 54)[0] == pytest.approx(0.120459, abs=1e-6)
    assert coco_total_variance(128, 8, 0.5, 54, "nonmissing") == pytest.approx(77_697.97, abs=0.01)


def test_t_rules() -> None:
    assert Collision(256, 16, 1.0, t_rule="paper").t == 74
    assert Collision(256, 16, 1.0).t == 79  # §3.1: argmin of the exact variance
    var, paper = CoCo(128, 8, 0.5), CoCo(128, 8, 0.5, t_rule="paper")
    assert paper.t == 24 and var.t % 2 == 0 and var.t >= 18
    assert coco_total_variance(128, 8, 0.5, var.cells) <= coco_total_variance(128, 8, 0.5, 24)
    # CoCo's mean estimator beats Collision's ([CoCo]: about 15-20 %)
    assert coco_total_variance(128, 8, 0.5, 24) < 0.9 * float(collision_total_variance(128, 8, 0.5, 28))


def test_mixture_alpha_and_central_epsilon_11_4() -> None:
    for s, eps, t, alpha in [(4, 1.0, 17, 0.16755241), (4, 2.0, 36, 0.06498124), (16, 2.0, 149, 0.06368796),
                             (64, 3.0, 1412, 0.02430250), (8, 4.0, 451, 0.00909313)]:
        mech = Collision(max(s, 2), s, eps, t=t, seed_family=16)
        assert mech.mixture_alpha == pytest.approx(alpha, abs=1e-8)
        assert mech.mixture_alpha == alpha_collision(eps, s, t)
    mech = Collision(64, 4, 1.0, t=17)
    assert mech.omega == pytest.approx(23.873127, abs=1e-6)
    # Certified at the generic alpha (docs/mathematics.md §1.2): Collision's s/Omega leaves a victim leftover law.
    assert epsilon_central(10**4, mech.mixture_alpha, mech.epsilon_local, 1e-4) == pytest.approx(0.025582, abs=1e-6)


@pytest.mark.parametrize("cls", [Collision, CoCo])
def test_parameter_validation(cls: type[Mech]) -> None:
    cls(8, 2, 1.0)  # defaults are valid
    for kwargs in ({"t": 2}, {"t_rule": "best"}, {"seed_family": 0}, {"seed_family": 2**33}, {"max_keys": 1},
                   {"hash_seed": -1}, {"t": 10**7}, {"seed_family": 2**20, "t": 64}):
        with pytest.raises(ValueError):
            cls(8, 2, 1.0, **kwargs)
    for d, s, eps in ((8, 0, 1.0), (8, 9, 1.0), (1, 1, 1.0), (8, 2, 0.0), (8, 2, float("nan"))):
        with pytest.raises(ValueError):
            cls(d, s, eps)
    with pytest.raises(ValueError, match="even"):
        CoCo(8, 2, 1.0, t=7)
    with pytest.raises(ValueError, match="epsilon"):
        cls(8, 2, 30.0)  # t would exceed MAX_T: the message says what to change


@pytest.mark.parametrize("mech", [Collision(5, 2, 1.0), CoCo(5, 2, 1.0)], ids=_ids)
def test_items_are_validated(mech: Mech) -> None:
    rng = seeded_rng(1)
    for bad, err in (([[0, 10]], ValueError), ([[-2, 1]], ValueError), ([[2, 3]], ValueError),
                     ([[4, 4]], ValueError), ([[1, 2, 3]], ValueError), ([[0.0, 1.0]], TypeError)):
        with pytest.raises(err):
            mech.encode(np.array(bad), rng)
    assert mech.encode(np.array([[-1, -1], [9, 0]]), rng).size == 2  # short rows are fine
    assert mech.encode(np.zeros((0, 2), dtype=np.int64), rng).size == 0


@pytest.mark.parametrize("mech", [Collision(20, 4, 1.0), CoCo(20, 4, 1.0)], ids=_ids)
def test_keyed_randomness_is_batch_independent(mech: Mech) -> None:
    rng = np.random.default_rng(3)
    items = np.stack([np.r_[2 * rng.choice(20, 3, replace=False) + rng.integers(0, 2, 3), -1] for _ in range(50)])
    ids = np.arange(50, dtype=np.uint64)
    key = job_key_from_seed(9)
    whole = mech.encode(items, KeyedRandom.for_elements(key, ids))
    parts = np.concatenate([mech.encode(items[a:b], KeyedRandom.for_elements(key, ids[a:b]))
                            for a, b in ((0, 7), (7, 31), (31, 50))])
    assert np.array_equal(whole, parts)


@pytest.mark.parametrize("mech", [Collision(12, 3, 1.0, seed_family=64), CoCo(12, 3, 1.0, seed_family=64)],
                         ids=_ids)
def test_accumulator_surface(mech: Mech) -> None:
    assert mech.payload_kind == "hashed" and mech.report_dtype.names == ("seed", "z")
    assert mech.message_bits == 6 + (mech.cells - 1).bit_length()
    rng = seeded_rng(5)
    reports = mech.encode(np.tile([0, 5, 22], (300, 1)), rng)
    whole, left, right = mech.new_accumulator(), mech.new_accumulator(), mech.new_accumulator()
    whole.add(reports)
    left.add(reports[:120])
    right.add(reports[120:])
    left.merge(right)
    assert left.n == whole.n == 300 and np.array_equal(left.counts, whole.counts)
    a, b = left.estimate(), whole.estimate()
    np.testing.assert_array_equal(a.frequency, b.frequency)
    assert a.frequency.shape == (24,) and a.mean.shape == (12,) and a.conditional_mean_stderr.shape == (12,)
    assert np.all(a.frequency_stderr > 0) and a.n == 300
    bad = reports.copy()
    bad["z"][0] = mech.cells
    bad["seed"][1] = 64
    assert mech.validate(bad).tolist()[:3] == [False, False, True]
    with pytest.raises(ValueError):
        whole.add(bad)
    assert not mech.validate(np.zeros(2, dtype=[("seed", "<u4")])).any()
    proj = whole.estimate(postprocess="simplex")
    assert np.all(proj.frequency >= 0) and proj.frequency.sum() <= mech.s + 1e-9
    np.testing.assert_array_equal(proj.extras["raw"]["frequency"], b.frequency)
    np.testing.assert_allclose(proj.mean, proj.frequency[1::2] - proj.frequency[0::2])
    with pytest.raises(ValueError):
        whole.estimate(postprocess="magic")
