"""Exact LDP of [VecSum]'s vector-summation randomizer and of the LDP-SGD client (docs/mathematics.md §4.2, §4.1).

Vector summation: on tiny (d, t, k) every message (sorted coordinate set, levels) is enumerated for a grid of
inputs that includes the extreme corners; inputs are continuous, but the output law is a mixture over the two
rounding levels of each value, so the corners (deterministic rounding) are where the worst ratio lives.
LDP-SGD: for d = 1 the output space {-1, +1} is enumerated exactly; for d = 2 the output density w.r.t. the
uniform measure on the circle is piecewise constant on two half-circles, so a grid of output angles that
hits both halves of every input's split evaluates the supremum exactly (documented numerical check), and the
density is checked against encode() by an angle histogram.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from transforms.mechanisms.randomness import KeyedRandom, job_key_from_seed, seeded_rng
from transforms.mechanisms.vector.ldp_sgd import LdpSgdRandomizer
from transforms.mechanisms.vector.summation import VectorSummation

VS_CASES = [
    VectorSummation(2, 0.9, 1e-3, 10**6, t=1, k_round=1),
    VectorSummation(2, 0.9, 1e-3, 10**6, t=2, k_round=2),
    VectorSummation(3, 2.0, 1e-4, 2 * 10**6, t=2, k_round=2),
    VectorSummation(3, 0.5, 1e-2, 2 * 10**5, t=1, k_round=3),
]
GRID = (0.0, 0.3, 0.5, 1.0)


def vs_outputs(mech: VectorSummation) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    subsets = list(itertools.combinations(range(mech.d), mech.t))
    return [(a, y) for a in subsets for y in itertools.product(range(mech.levels), repeat=mech.t)]


def vs_table(mech: VectorSummation, inputs: np.ndarray) -> np.ndarray:
    """P(message | x) for every input row and every (coordinate set, levels) message."""
    outs = vs_outputs(mech)
    n_sets = math.comb(mech.d, mech.t)
    tab = np.empty((len(inputs), len(outs)))
    for i, x in enumerate(inputs):
        levels = [mech.exact_level_distribution(float(v)) for v in x]
        for j, (a, y) in enumerate(outs):
            tab[i, j] = np.prod([levels[c][lv] for c, lv in zip(a, y, strict=True)]) / n_sets
    return tab


def vs_inputs(d: int) -> np.ndarray:
    return np.array(list(itertools.product(GRID, repeat=d)))


@pytest.mark.parametrize("mech", VS_CASES, ids=repr)
def test_vector_sum_exact_ldp_ratio(mech: VectorSummation) -> None:
    tab = vs_table(mech, vs_inputs(mech.d))
    np.testing.assert_allclose(tab.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert np.all(tab > 0)
    worst = float(np.max(tab[:, None, :] / tab[None, :, :]))
    assert worst <= math.exp(mech.epsilon_local) * (1 + 1e-12)
    assert worst == pytest.approx(math.exp(mech.epsilon_local), rel=1e-12)  # x = 0 vs 1 on all t coordinates


@pytest.mark.parametrize("mech", VS_CASES, ids=repr)
def test_vector_sum_per_coordinate_message(mech: VectorSummation) -> None:
    """One reported coordinate is (k+1)-ary RR with blanket gamma: worst ratio exactly e^eps0."""
    levels = np.stack([mech.exact_level_distribution(x) for x in np.linspace(0, 1, 21)])
    worst = float(np.max(levels[:, None, :] / levels[None, :, :]))
    assert worst == pytest.approx(math.exp(mech.epsilon0), rel=1e-12)


@pytest.mark.parametrize("mech", VS_CASES, ids=repr)
def test_vector_sum_mixture_alpha(mech: VectorSummation) -> None:
    tab = vs_table(mech, vs_inputs(mech.d))
    tv = float(np.max(0.5 * np.abs(tab[:, None, :] - tab[None, :, :]).sum(axis=2)))
    assert tv / math.expm1(mech.epsilon_local) <= mech.mixture_alpha * (1 + 1e-12)
    assert (1 + math.exp(mech.epsilon_local)) * mech.mixture_alpha <= 1 + 1e-12
    if mech.t == 1:  # gamma/(k+1): the GRR value, attained when x = 0 vs 1 on every coordinate
        assert tv / math.expm1(mech.epsilon_local) == pytest.approx(mech.mixture_alpha, rel=1e-12)
        assert mech.mixture_alpha == pytest.approx(mech.gamma / mech.levels, rel=1e-12)


@pytest.mark.parametrize("mech", [VS_CASES[1], VS_CASES[2]], ids=repr)
def test_vector_sum_enumeration_matches_encode(mech: VectorSummation) -> None:
    draws = 120_000
    rng = seeded_rng(99)
    # vs_outputs order: subset (itertools.combinations order) major, levels (itertools.product order) minor
    subset_of_mask = np.zeros(2**mech.d, dtype=np.int64)
    for j, a in enumerate(itertools.combinations(range(mech.d), mech.t)):
        subset_of_mask[sum(1 << c for c in a)] = j
    level_weights = mech.levels ** np.arange(mech.t - 1, -1, -1)
    for x in (np.full(mech.d, 0.3), np.linspace(0, 1, mech.d)):
        probs = vs_table(mech, x[None, :])[0]
        reports = mech.encode(np.tile(x, (draws, 1)), rng)
        assert mech.validate(reports).all()
        subset = subset_of_mask[(1 << reports["indices"]).sum(axis=1)]
        index = subset * mech.levels**mech.t + reports["values"].astype(np.int64) @ level_weights
        freq = np.bincount(index, minlength=probs.size)
        assert freq.size == probs.size
        z = (freq - draws * probs) / np.sqrt(draws * probs * (1 - probs))
        assert np.max(np.abs(z)) < 5, np.max(np.abs(z))


def test_vector_sum_reproducible_per_client_and_validated() -> None:
    mech = VectorSummation(6, 0.9, 1e-3, 10**6, t=3, k_round=2)
    x = np.random.default_rng(0).random((30, 6))
    ids, key = np.arange(30, dtype=np.uint64), job_key_from_seed(3)
    whole = mech.encode(x, KeyedRandom.for_elements(key, ids))
    parts = np.concatenate([mech.encode(x[s], KeyedRandom.for_elements(key, ids[s])) for s in (slice(0, 11),
                                                                                              slice(11, 30))])
    assert np.array_equal(whole, parts)
    bad = whole[:4].copy()
    bad["indices"][0] = [0, 0, 1]  # repeated coordinate
    bad["indices"][1] = [0, 1, 6]  # out of range
    bad["values"][2, 0] = 0.5  # not a level
    bad["values"][3, 0] = np.nan
    assert mech.validate(bad).tolist() == [False, False, False, False]
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        mech.encode(np.full((2, 6), 1.5), seeded_rng(1))


# --- LDP-SGD ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [0.5, 1.0, 3.0])
def test_ldp_sgd_d1_exact(eps: float) -> None:
    mech = LdpSgdRandomizer(1, eps, clip=2.0)
    inputs = np.linspace(-5.0, 5.0, 41)[:, None]  # beyond the clip on both sides, and 0
    w = np.array([[-1.0], [1.0]])
    tab = np.stack([0.5 * mech.exact_output_density(x, w) for x in inputs])
    np.testing.assert_allclose(tab.sum(axis=1), 1.0, atol=1e-12)
    worst = float(np.max(tab[:, None, :] / tab[None, :, :]))
    assert worst == pytest.approx(math.exp(eps), rel=1e-12)  # +L vs -L
    tv = float(np.max(0.5 * np.abs(tab[:, None, :] - tab[None, :, :]).sum(axis=2)))
    assert tv / math.expm1(eps) == pytest.approx(mech.mixture_alpha, rel=1e-12)  # generic alpha is exact
    rng, draws = seeded_rng(5), 100_000
    for x in (np.array([0.7]), np.array([-3.0]), np.array([0.0])):
        out = mech.encode(np.tile(x, (draws, 1)), rng)["values"][:, 0]
        assert set(np.unique(out).tolist()) <= {-1.0, 1.0}
        p_plus = 0.5 * mech.exact_output_density(x, np.array([[1.0]]))[0]
        assert abs((out > 0).mean() - p_plus) < 5 * math.sqrt(p_plus * (1 - p_plus) / draws)


def test_ldp_sgd_d2_density_ratio_and_encode() -> None:
    eps, bins, draws = 1.2, 8, 160_000
    mech = LdpSgdRandomizer(2, eps, clip=1.0)
    angles = (np.arange(720) + 0.5) * 2 * np.pi / 720
    w = np.column_stack([np.cos(angles), np.sin(angles)])
    inputs = [np.array([r * np.cos(a), r * np.sin(a)]) for r in (0.0, 0.4, 1.0, 3.0) for a in np.arange(8) * 0.79]
    dens = np.stack([mech.exact_output_density(x, w) for x in inputs])
    np.testing.assert_allclose(dens.mean(axis=1), 1.0, atol=1e-12)  # a probability density on the circle
    worst = float(np.max(dens[:, None, :] / dens[None, :, :]))
    assert worst <= math.exp(eps) * (1 + 1e-12)
    assert worst == pytest.approx(math.exp(eps), rel=1e-12)
    # Encode vs density: direction u on a bin edge, so each of 8 angle bins lies in one half-circle.
    rng = seeded_rng(8)
    for x in (np.array([0.6, 0.0]), np.array([0.0, -2.0])):
        out = mech.encode(np.tile(x, (draws, 1)), rng)["values"]
        assert mech.validate(np.rec.fromarrays([out], dtype=mech.report_dtype)).all()
        b = np.floor(np.mod(np.arctan2(out[:, 1], out[:, 0]), 2 * np.pi) / (2 * np.pi / bins)).astype(int)
        freq = np.bincount(b, minlength=bins)
        centres = (np.arange(bins) + 0.5) * 2 * np.pi / bins
        probs = mech.exact_output_density(x, np.column_stack([np.cos(centres), np.sin(centres)])) / bins
        z = (freq - draws * probs) / np.sqrt(draws * probs * (1 - probs))
        assert np.max(np.abs(z)) < 5, z


def test_ldp_sgd_validation_and_reproducibility() -> None:
    mech = LdpSgdRandomizer(4, 1.0, clip=0.5)
    g = np.random.default_rng(1).normal(size=(25, 4))
    ids, key = np.arange(25, dtype=np.uint64), job_key_from_seed(4)
    whole = mech.encode(g, KeyedRandom.for_elements(key, ids))
    parts = np.concatenate([mech.encode(g[s], KeyedRandom.for_elements(key, ids[s])) for s in (slice(0, 9),
                                                                                              slice(9, 25))])
    assert np.array_equal(whole, parts)
    assert mech.validate(whole).all()
    bad = whole[:3].copy()
    bad["values"][0] *= 1.01
    bad["values"][1, 0] = np.inf
    bad["values"][2] = 0.0
    assert not mech.validate(bad).any()
    with pytest.raises(ValueError, match="finite"):
        mech.encode(np.full((1, 4), np.nan), seeded_rng(1))
    with pytest.raises(ValueError, match="clip"):
        LdpSgdRandomizer(4, 1.0, clip=0.0)
