"""Mixture parameters alpha = max TV / (e^eps - 1), checked by enumerating each randomizer's output laws."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest

from transforms.privacy.mixture import (
    alpha_binary_rr,
    alpha_collision,
    alpha_from_tv,
    alpha_generic,
    alpha_grr,
    alpha_hadamard,
    alpha_olh,
    alpha_oue,
)
from transforms.privacy.shuffle_bound import check_mixture_alpha

EPSILONS = (0.3, 1.0, 2.5)


def max_tv(laws: np.ndarray) -> float:
    """Largest total variation between two rows (input values) of a conditional output law."""
    return max(
        0.5 * float(np.abs(laws[i] - laws[j]).sum()) for i, j in itertools.combinations(range(len(laws)), 2)
    )


def max_log_ratio(laws: np.ndarray) -> float:
    return float(np.max(np.log(laws[:, None, :] / laws[None, :, :])))


def grr_laws(eps: float, d: int) -> np.ndarray:
    p, q = math.exp(eps) / (math.exp(eps) + d - 1), 1.0 / (math.exp(eps) + d - 1)
    return np.where(np.eye(d, dtype=bool), p, q)


@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("d", [2, 3, 5, 8])
def test_alpha_grr_is_max_tv_over_expm1(eps: float, d: int) -> None:
    laws = grr_laws(eps, d)
    assert max_log_ratio(laws) == pytest.approx(eps)
    assert alpha_grr(eps, d) == pytest.approx(max_tv(laws) / math.expm1(eps), rel=1e-13)


@pytest.mark.parametrize("eps", EPSILONS)
def test_alpha_binary_rr_and_generic_are_the_binary_rr_worst_case(eps: float) -> None:
    tv = max_tv(grr_laws(eps, 2))
    assert tv == pytest.approx(math.tanh(eps / 2.0), rel=1e-13)  # the largest TV any eps-LDP randomizer has
    assert alpha_binary_rr(eps) == pytest.approx(tv / math.expm1(eps), rel=1e-13)
    assert alpha_generic(eps) == pytest.approx(tv / math.expm1(eps), rel=1e-13)


@pytest.mark.parametrize("eps", EPSILONS)
def test_alpha_oue_by_enumerating_all_outputs(eps: float) -> None:
    d, p, q = 3, 0.5, 1.0 / (1.0 + math.exp(eps))
    outputs = list(itertools.product((0, 1), repeat=d))
    laws = np.array(
        [
            [
                math.prod(
                    (p if j == v else q) if bit else (1 - (p if j == v else q)) for j, bit in enumerate(y)
                )
                for y in outputs
            ]
            for v in range(d)
        ]
    )
    assert laws.sum(axis=1) == pytest.approx(np.ones(d))
    assert max_log_ratio(laws) == pytest.approx(eps)  # OUE with these p, q is exactly eps-LDP
    assert alpha_oue(eps) == pytest.approx(max_tv(laws) / math.expm1(eps), rel=1e-13)


@pytest.mark.parametrize("eps", EPSILONS)
def test_alpha_hadamard_by_enumerating_codewords(eps: float) -> None:
    size = 8  # K for d = 7 inputs (rows 1..7 of the Sylvester matrix)
    hadamard = np.array([[(-1) ** bin(r & u).count("1") for u in range(size)] for r in range(size)])
    inside, outside = 2 * math.exp(eps) / (size * (1 + math.exp(eps))), 2 / (size * (1 + math.exp(eps)))
    laws = np.where(hadamard[1:] == 1, inside, outside)
    assert laws.sum(axis=1) == pytest.approx(np.ones(size - 1))
    assert max_log_ratio(laws) == pytest.approx(eps)
    assert alpha_hadamard(eps) == pytest.approx(max_tv(laws) / math.expm1(eps), rel=1e-13)


@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("g", [2, 3, 4])
def test_alpha_olh_is_the_worst_seed_tv(eps: float, g: int) -> None:
    d = 3
    per_seed_tv, joint_laws = [], []
    for hash_values in itertools.product(range(g), repeat=d):  # every hash function [d] -> [g], one per seed
        laws = grr_laws(eps, g)[list(hash_values)]  # row v: GRR over [g] of h(v)
        per_seed_tv.append(max_tv(laws))
        joint_laws.append(laws)
    expected = alpha_olh(eps, g) * math.expm1(eps)
    assert max(per_seed_tv) == pytest.approx(expected, rel=1e-13)
    # Over a uniformly random seed the TV is smaller still (colliding seeds hide the input): alpha is safe.
    joint = np.concatenate(joint_laws, axis=1) / len(joint_laws)
    assert max_tv(joint) <= expected


@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize(("s", "t"), [(1, 3), (2, 4), (2, 5)])
def test_alpha_collision_is_the_worst_hash_tv(eps: float, s: int, t: int) -> None:
    omega = s * math.exp(eps) + t - s
    items = range(2 * s)  # input x holds items 0..s-1, input x' holds s..2s-1

    def law(hashed: set[int]) -> np.ndarray:
        m = len(hashed)
        out = (omega - m * math.exp(eps)) / ((t - m) * omega)
        return np.array([math.exp(eps) / omega if a in hashed else out for a in range(t)])

    worst = 0.0
    for hash_values in itertools.product(range(t), repeat=len(items)):
        first, second = law(set(hash_values[:s])), law(set(hash_values[s:]))
        assert first.sum() == pytest.approx(1.0)
        worst = max(worst, 0.5 * float(np.abs(first - second).sum()))
    assert alpha_collision(eps, s, t) == pytest.approx(worst / math.expm1(eps), rel=1e-13)


def test_alpha_collision_reference_values() -> None:
    # The tight-bound regression rows use these alphas (and Omega = 23.873127 for the first).
    assert 4.0 / alpha_collision(1.0, 4, 17) == pytest.approx(23.873127, abs=1e-6)
    assert alpha_collision(1.0, 4, 17) == pytest.approx(0.16755241, abs=1e-8)
    assert alpha_collision(2.0, 4, 36) == pytest.approx(0.06498124, abs=1e-8)
    assert alpha_collision(2.0, 16, 149) == pytest.approx(0.06368796, abs=1e-8)
    assert alpha_collision(3.0, 64, 1412) == pytest.approx(0.02430250, abs=1e-8)
    assert alpha_collision(4.0, 8, 451) == pytest.approx(0.00909313, abs=1e-8)
    assert alpha_collision(2.0, 1, 9) == pytest.approx(alpha_olh(2.0, 9))  # OLH is Collision with s = 1


@pytest.mark.parametrize("eps", [0.01, 1.0, 5.0, 50.0, 700.0])
def test_every_alpha_is_admissible(eps: float) -> None:
    for alpha in (
        alpha_generic(eps),
        alpha_binary_rr(eps),
        alpha_grr(eps, 10),
        alpha_olh(eps, 2),
        alpha_hadamard(eps),
        alpha_oue(eps),
        alpha_collision(eps, 3, 7),
    ):
        assert math.isfinite(alpha) and alpha > 0.0
        assert check_mixture_alpha(alpha, eps) == alpha


def test_alpha_from_tv() -> None:
    assert alpha_from_tv(math.tanh(0.5), 1.0) == pytest.approx(alpha_generic(1.0), rel=1e-14)
    assert alpha_from_tv(0.0, 1.0) == 0.0
    with pytest.raises(ValueError, match="no eps-LDP randomizer has this TV"):
        alpha_from_tv(0.5, 1.0)  # tanh(1/2) = 0.462 < 0.5
    with pytest.raises(ValueError, match=r"tv must lie in \[0, 1\]"):
        alpha_from_tv(-0.1, 1.0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: alpha_grr(1.0, 1), "d must be an integer >= 2"),
        (lambda: alpha_olh(1.0, 1), "g must be an integer >= 2"),
        (lambda: alpha_collision(1.0, 3, 3), "t must be an integer >= 4"),
        (lambda: alpha_collision(1.0, 0, 3), "s must be an integer >= 1"),
        (lambda: alpha_generic(0.0), "eps must be > 0"),
        (lambda: alpha_generic(float("nan")), "eps must be a finite real number"),
        (lambda: alpha_oue(800.0), "eps must be <= 700"),
    ],
)
def test_alpha_arguments_are_validated(call: Callable[[], float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
