"""Composition tools (docs/mathematics.md §1.4) and post-processing composition (§1.4, §2.8, [ESA] Theorem IV.1
values)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from tests.privacy.spec_tables import TABLE_11_2
from transforms.privacy.composition import (
    advanced_composition_drv,
    basic_composition,
    bun_steinke_composition,
    chain_composition,
    compose_post_processing,
    drv_step_epsilon,
    fragment_epsilon,
)


@pytest.mark.parametrize(("eps_b", "eps_f", "t", "expected"), TABLE_11_2)
def test_table_11_2(eps_b: float, eps_f: float, t: int, expected: float) -> None:
    assert fragment_epsilon(eps_b, eps_f, t) == pytest.approx(expected, abs=1e-5)


def direct_post_processing(eps1: float, eps2: float) -> float:
    return math.log((math.exp(eps1 + eps2) + 1) / (math.exp(eps1) + math.exp(eps2)))


@pytest.mark.parametrize("eps1", [0.01, 0.1, 0.7, 2.0, 8.0, 20.0, 29.0, 31.0, 60.0])
@pytest.mark.parametrize("eps2", [0.01, 0.5, 3.0, 12.0, 35.0])
def test_post_processing_matches_direct_formula(eps1: float, eps2: float) -> None:
    value = compose_post_processing(eps1, eps2)
    assert value == pytest.approx(direct_post_processing(eps1, eps2), rel=1e-12)
    assert value == compose_post_processing(eps2, eps1)
    assert 0.0 <= value <= min(eps1, eps2)


@pytest.mark.parametrize(("eps1", "eps2"), [(0.3, 0.9), (1.0, 1.0), (2.0, 0.25), (4.0, 6.0)])
def test_post_processing_is_binary_rr_of_binary_rr(eps1: float, eps2: float) -> None:
    # Tightness: two chained binary RRs keep the bit w.p. p1 p2 + (1-p1)(1-p2), computed here exactly.
    p1 = Fraction(math.exp(eps1)) / (1 + Fraction(math.exp(eps1)))
    p2 = Fraction(math.exp(eps2)) / (1 + Fraction(math.exp(eps2)))
    keep = p1 * p2 + (1 - p1) * (1 - p2)
    assert compose_post_processing(eps1, eps2) == pytest.approx(math.log(keep / (1 - keep)), rel=1e-13)


def test_post_processing_in_log_space_does_not_overflow() -> None:
    assert compose_post_processing(800.0, 800.0) == pytest.approx(800.0 - math.log(2.0), rel=1e-15)
    assert compose_post_processing(800.0, 5.0) == pytest.approx(5.0, rel=1e-15)
    assert fragment_epsilon(8.55, 7.163, 200) == pytest.approx(8.55, rel=1e-12)  # t eps_f = 1432.6
    # Tiny budgets keep full relative precision: eps ~ eps1 eps2 / 2.
    assert compose_post_processing(1e-8, 2e-8) == pytest.approx(1e-16, rel=1e-6)


def test_fragment_epsilon_edge_cases() -> None:
    assert fragment_epsilon(2.0, 1.0, 0) == 0.0
    with pytest.raises(ValueError, match="t must be an integer >= 0"):
        fragment_epsilon(2.0, 1.0, -1)
    with pytest.raises(ValueError, match="eps_b must be >= 0"):
        fragment_epsilon(-2.0, 1.0, 1)


def test_basic_composition() -> None:
    assert basic_composition([(0.5, 1e-6), (0.25, 2e-6), (1.0, 0.0)]) == pytest.approx((1.75, 3e-6))
    assert basic_composition([]) == (0.0, 0.0)


def test_advanced_composition_drv() -> None:
    eps, delta, r, slack = 0.05, 1e-9, 100, 1e-6
    expected = math.sqrt(2 * r * math.log(1 / slack)) * eps + r * eps * (math.exp(eps) - 1)
    total = advanced_composition_drv(eps, delta, r, slack)
    assert total == pytest.approx((expected, r * delta + slack), rel=1e-13)
    assert total[0] < r * eps  # better than basic composition in this regime


@pytest.mark.parametrize(("eps_total", "r"), [(0.1, 10), (0.5, 100), (0.99, 3)])
def test_drv_step_epsilon_keeps_the_total(eps_total: float, r: int) -> None:
    slack = 1e-6
    step = drv_step_epsilon(eps_total, r, slack)
    assert step == pytest.approx(eps_total / (2 * math.sqrt(2 * r * math.log(1 / slack))))
    assert advanced_composition_drv(step, 0.0, r, slack)[0] <= eps_total
    with pytest.raises(ValueError, match="eps_total must be < 1"):
        drv_step_epsilon(1.0, r, slack)


def test_bun_steinke_composition() -> None:
    eps, delta, k, delta_prime = 0.1, 1e-8, 50, 1e-6
    expected = k * eps**2 / 2 + math.sqrt(k) * eps * math.sqrt(
        2 * math.log(math.sqrt(k * math.pi / 2) * eps / delta_prime)
    )
    assert bun_steinke_composition(eps, delta, k, delta_prime) == pytest.approx(
        (expected, delta_prime + k * delta)
    )
    with pytest.raises(ValueError, match="use basic_composition"):
        bun_steinke_composition(1e-7, delta, 1, 0.5)


def test_chain_composition() -> None:
    eps, delta = 0.3, 1e-7
    for k in (1, 2, 5, 40, 150):  # 40 * 0.3 and 150 * 0.3 exceed the direct-form limit
        expected_delta = delta * math.fsum(math.exp(i * eps) for i in range(k))
        eps_total, delta_total = chain_composition(eps, delta, k)
        assert eps_total == pytest.approx(k * eps)
        assert delta_total == pytest.approx(min(1.0, expected_delta), rel=1e-12)
    assert chain_composition(0.0, delta, 4) == pytest.approx((0.0, 4 * delta))
    assert chain_composition(1.0, 0.0, 4) == (4.0, 0.0)
    assert chain_composition(5.0, 1e-6, 1000) == (5000.0, 1.0)  # vacuous delta, reported as 1
