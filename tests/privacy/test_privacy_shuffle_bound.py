"""Tight shuffle bound (docs/mathematics.md §1.2) against reference values and an independent brute-force
enumeration of the clone pair. The pair at any alpha checks the O(n) algorithm; the certified accountant
(``epsilon_central``, ``hockey_stick``) evaluates it at the generic alpha (tests/privacy/test_shuffle_exact.py
shows why)."""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict
from typing import Any

import pytest

from transforms.privacy.mixture import alpha_collision, alpha_generic, alpha_grr
from transforms.privacy.shuffle_bound import (
    ClonePairDivergence,
    ShuffleDivergence,
    epsilon_central,
    hockey_stick,
    pair_hockey_stick,
)

# Hockey-stick values: (n, alpha, eps_local, eps_central, D_{e^eps_c}(P || Q)), brute-force verified.
HOCKEY_STICK_VECTORS = [
    (30, 0.05, 2.0, 0.5, 0.015512975449754588),
    (50, 0.1, 1.0, 0.3, 7.657218778662201e-05),
    (80, 0.02, 3.0, 1.0, 9.101060723777351e-04),
    (40, 1.0 / (math.e + 1.0), 1.0, 0.2, 0.01842204924344625),
    (1000, 0.01, 2.0, 0.2, 1.2768247987997714e-14),
]

# The clone pair's central epsilon at exactly the given alpha, 60 bisection steps: (label, n, alpha, eps_local,
# delta, eps_central). Regression values of the O(n) algorithm; below the generic alpha NOT privacy bounds.
PAIR_EPSILON_VECTORS = [
    ("collision s=4 eps=1 t=17", 10**4, alpha_collision(1.0, 4, 17), 1.0, 1e-4, 0.019295),
    ("collision s=4 eps=2 t=36", 10**4, alpha_collision(2.0, 4, 36), 2.0, 1e-4, 0.051825),
    ("collision s=16 eps=2 t=149", 10**5, alpha_collision(2.0, 16, 149), 2.0, 1e-5, 0.018891),
    ("collision s=64 eps=3 t=1412", 10**5, alpha_collision(3.0, 64, 1412), 3.0, 1e-5, 0.037380),
    ("collision s=8 eps=4 t=451", 10**6, alpha_collision(4.0, 8, 451), 4.0, 1e-6, 0.023716),
    ("k-RR d=10", 10**4, alpha_grr(2.0, 10), 2.0, 1e-4, 0.049966),
    ("k-RR d=100", 10**5, alpha_grr(4.0, 100), 4.0, 1e-6, 0.068430),
]

# Certified central epsilon (replacement DP), 60 bisection steps: (label, n, alpha, eps_local, delta, eps_central).
# A mechanism-specific alpha certifies the generic value (the pair at 1/(e^eps + 1)).
EPSILON_CENTRAL_VECTORS = [
    ("collision s=4 eps=1 t=17", 10**4, alpha_collision(1.0, 4, 17), 1.0, 1e-4, 0.025582),
    ("collision s=4 eps=2 t=36", 10**4, alpha_collision(2.0, 4, 36), 2.0, 1e-4, 0.073586),
    ("collision s=16 eps=2 t=149", 10**5, alpha_collision(2.0, 16, 149), 2.0, 1e-5, 0.026812),
    ("collision s=64 eps=3 t=1412", 10**5, alpha_collision(3.0, 64, 1412), 3.0, 1e-5, 0.054104),
    ("collision s=8 eps=4 t=451", 10**6, alpha_collision(4.0, 8, 451), 4.0, 1e-6, 0.034280),
    ("generic eps0=1 n=1e4", 10**4, alpha_generic(1.0), 1.0, 1e-4, 0.025582),
    ("generic eps0=2 n=1e4", 10**4, alpha_generic(2.0), 2.0, 1e-4, 0.073586),
    ("generic eps0=1 n=1e5", 10**5, alpha_generic(1.0), 1.0, 1e-5, 0.009677),
    ("generic eps0=3 n=1e5", 10**5, alpha_generic(3.0), 3.0, 1e-5, 0.054104),
    ("k-RR d=10", 10**4, alpha_grr(2.0, 10), 2.0, 1e-4, 0.073586),
    ("k-RR d=100", 10**5, alpha_grr(4.0, 100), 4.0, 1e-6, 0.118153),
]


def pair_epsilon(n: int, alpha: float, eps: float, delta: float, steps: int = 60) -> float:
    """The pair's central epsilon at exactly ``alpha`` (windowed as ``epsilon_central``), by bisection."""
    divergence = ClonePairDivergence(n, alpha, eps, window_sds=12.0)
    low, high = 0.0, eps
    for _ in range(steps):
        middle = 0.5 * (low + high)
        low, high = (low, middle) if divergence(middle) <= delta else (middle, high)
    return high


def brute_force_hockey_stick(n: int, alpha: float, eps: float, eps_c: float) -> float:
    """Enumerate every outcome (C, A, Delta) of the pair (P_alpha, Q_alpha) and sum the positive part."""
    p_law: dict[tuple[int, int], float] = defaultdict(float)
    q_law: dict[tuple[int, int], float] = defaultdict(float)
    e_alpha = math.exp(eps) * alpha
    deltas = [((1, 0), e_alpha), ((0, 1), alpha), ((0, 0), 1.0 - alpha - e_alpha)]
    for c in range(n):
        p_c = math.comb(n - 1, c) * (2 * alpha) ** c * (1 - 2 * alpha) ** (n - 1 - c)
        for a in range(c + 1):
            p_ca = p_c * math.comb(c, a) / 2.0**c
            for (d1, d2), weight in deltas:
                p_law[(a + d1, c - a + d2)] += p_ca * weight
                q_law[(a + d2, c - a + d1)] += p_ca * weight
    e_c = math.exp(eps_c)
    keys = set(p_law) | set(q_law)
    return math.fsum(max(0.0, p_law[key] - e_c * q_law[key]) for key in keys)


@pytest.mark.parametrize(("n", "alpha", "eps", "eps_c", "expected"), HOCKEY_STICK_VECTORS)
def test_hockey_stick_reference_vectors(
    n: int, alpha: float, eps: float, eps_c: float, expected: float
) -> None:
    assert pair_hockey_stick(n, alpha, eps, eps_c) == pytest.approx(expected, rel=1e-10, abs=0.0)


def test_hockey_stick_matches_brute_force_enumeration() -> None:
    rng = random.Random(20240611)
    for _ in range(40):
        n = rng.randint(2, 40)
        eps = rng.uniform(0.1, 4.0)
        alpha = rng.uniform(0.05, 1.0) / (1.0 + math.exp(eps))
        eps_c = rng.uniform(0.0, eps)
        expected = brute_force_hockey_stick(n, alpha, eps, eps_c)
        assert pair_hockey_stick(n, alpha, eps, eps_c) == pytest.approx(expected, rel=0.0, abs=1e-13)


def test_hockey_stick_brute_force_reproduces_reference_vectors() -> None:
    # Guards the brute force itself: it must agree with the spec's independently computed vectors.
    for n, alpha, eps, eps_c, expected in HOCKEY_STICK_VECTORS[:4]:
        assert brute_force_hockey_stick(n, alpha, eps, eps_c) == pytest.approx(expected, rel=1e-10)


def test_hockey_stick_at_eps_local_is_zero_and_decreasing_in_eps_c() -> None:
    divergence = ShuffleDivergence(200, 0.1, 1.5)
    values = [divergence(eps_c) for eps_c in (0.0, 0.1, 0.3, 0.7, 1.2, 1.5)]
    assert values == sorted(values, reverse=True)
    assert values[-1] == 0.0
    # At eps_c = 0 the hockey stick is the total variation, which is positive here.
    assert values[0] > 0.0


@pytest.mark.parametrize(("n", "alpha", "eps"), [(3000, 0.2, 1.0), (5000, 0.05, 2.0), (20000, 0.01, 3.0)])
def test_windowed_path_is_a_tight_upper_bound(n: int, alpha: float, eps: float) -> None:
    windowed = ShuffleDivergence(n, alpha, eps, window_sds=12.0)
    exact = ShuffleDivergence(n, alpha, eps)
    assert windowed.neglected_mass >= 0.0
    assert exact.neglected_mass == 0.0
    for eps_c in (0.0, 0.02, 0.05, 0.1, 0.3):
        fast, full = windowed(eps_c), exact(eps_c)
        # >= up to summation order: the neglected mass (~1e-30 here) is below one ulp of the sum.
        assert fast >= full * (1.0 - 1e-14)
        assert fast - full <= 1e-12


def test_narrow_window_adds_its_neglected_mass() -> None:
    # With +-4 sd the neglected mass is visible; the bound must exceed the exact value by at most that mass.
    narrow = ShuffleDivergence(5000, 0.2, 1.0, window_sds=4.0)
    exact = ShuffleDivergence(5000, 0.2, 1.0)
    assert narrow.neglected_mass > 1e-6
    for eps_c in (0.0, 0.05, 0.2):
        assert exact(eps_c) < narrow(eps_c) <= exact(eps_c) + narrow.neglected_mass


def test_windowed_path_reuses_tails_without_changing_results() -> None:
    # The bisection caches binomial tails between calls; evaluating in any order must give fresh results.
    cached = ShuffleDivergence(10**5, alpha_generic(1.0), 1.0, window_sds=12.0)
    points = [0.5, 0.01, 0.0100001, 0.2, 0.01, 0.0]
    cached_values = [cached(eps_c) for eps_c in points]
    fresh_values = [ShuffleDivergence(10**5, alpha_generic(1.0), 1.0, window_sds=12.0)(e) for e in points]
    assert cached_values == fresh_values


@pytest.mark.parametrize(
    ("label", "n", "alpha", "eps", "delta", "expected"),
    [pytest.param(*row, id=row[0]) for row in EPSILON_CENTRAL_VECTORS],
)
def test_epsilon_central_reference_vectors(
    label: str, n: int, alpha: float, eps: float, delta: float, expected: float
) -> None:
    assert epsilon_central(n, alpha, eps, delta) == pytest.approx(expected, rel=1e-3)


@pytest.mark.parametrize(
    ("label", "n", "alpha", "eps", "delta", "expected"),
    [pytest.param(*row, id=row[0]) for row in PAIR_EPSILON_VECTORS],
)
def test_pair_epsilon_reference_vectors(label: str, n: int, alpha: float, eps: float, delta: float,
                                        expected: float) -> None:
    assert pair_epsilon(n, alpha, eps, delta) == pytest.approx(expected, rel=1e-3)


def test_certified_divergence_is_the_pair_at_the_generic_alpha() -> None:
    n, eps = 3000, 1.5
    for alpha in (alpha_grr(eps, 3), alpha_grr(eps, 64), alpha_generic(eps)):
        for eps_c in (0.0, 0.05, 0.2):
            assert hockey_stick(n, alpha, eps, eps_c) == pair_hockey_stick(n, alpha_generic(eps), eps, eps_c)
    assert pair_hockey_stick(n, alpha_grr(eps, 3), eps, 0.05) < hockey_stick(n, alpha_grr(eps, 3), eps, 0.05)


def test_epsilon_central_is_certified_by_the_exact_divergence() -> None:
    n, alpha, eps, delta = 5000, alpha_grr(2.0, 10), 2.0, 1e-5
    eps_c = epsilon_central(n, alpha, eps, delta)
    assert hockey_stick(n, alpha, eps, eps_c) <= delta
    assert hockey_stick(n, alpha, eps, eps_c * (1.0 - 1e-6)) > delta


def test_epsilon_central_without_amplification_returns_eps_local() -> None:
    # A window of half a standard deviation neglects most of the mass, so nothing below eps is certified.
    assert epsilon_central(1000, 0.1, 1.0, 1e-3, window_sds=0.5) == 1.0


def test_pair_epsilon_non_decreasing_in_alpha() -> None:
    eps, n, delta = 2.0, 20000, 1e-6
    alphas = [a / (1.0 + math.exp(eps)) for a in (0.05, 0.1, 0.2, 0.4, 0.7, 1.0)]
    values = [pair_epsilon(n, alpha, eps, delta) for alpha in alphas]
    assert values == sorted(values)
    # The certified value does not depend on alpha: every admissible alpha certifies the generic pair's.
    assert {epsilon_central(n, alpha, eps, delta) for alpha in alphas} == {values[-1]}


def test_epsilon_central_non_increasing_in_n() -> None:
    alpha, eps, delta = alpha_grr(1.0, 16), 1.0, 1e-6
    values = [epsilon_central(n, alpha, eps, delta) for n in (1000, 3000, 10**4, 3 * 10**4, 10**5)]
    assert values == sorted(values, reverse=True)


@pytest.mark.parametrize(
    ("label", "alpha", "eps"),
    [
        pytest.param("grr d=64 eps=2", alpha_grr(2.0, 64), 2.0, id="grr-d64-eps2"),
        pytest.param("generic eps=1", alpha_generic(1.0), 1.0, id="generic-eps1"),
    ],
)
def test_epsilon_central_for_a_million_users_is_fast(label: str, alpha: float, eps: float) -> None:
    start = time.perf_counter()
    eps_c = epsilon_central(10**6, alpha, eps, 1e-6)
    elapsed = time.perf_counter() - start
    print(f"epsilon_central n=1e6 {label} delta=1e-6: eps_c={eps_c:.6g} in {elapsed:.3f} s")
    assert 0.0 < eps_c < eps
    assert elapsed < 1.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": 1}, "n must be an integer >= 2"),
        ({"n": 2.5}, "n must be an integer"),
        ({"n": True}, "n must be an integer"),
        ({"alpha": 0.0}, "alpha must be > 0"),
        ({"alpha": 0.5}, r"\(1 \+ e\^eps_local\) \* alpha must be <= 1"),
        ({"eps_local": 0.0}, "eps_local must be > 0"),
        ({"eps_local": -1.0}, "eps_local must be > 0"),
        ({"delta": 0.0}, r"delta must lie in \(0, 1\)"),
        ({"delta": 1.0}, r"delta must lie in \(0, 1\)"),
        ({"steps": 0}, "steps must be an integer >= 1"),
    ],
)
def test_epsilon_central_rejects_invalid_arguments(kwargs: dict[str, object], message: str) -> None:
    arguments: dict[str, Any] = {"n": 1000, "alpha": 0.1, "eps_local": 1.0, "delta": 1e-6, "steps": 60}
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        epsilon_central(**arguments)


def test_integral_float_n_is_accepted() -> None:
    assert epsilon_central(1e4, alpha_generic(1.0), 1.0, 1e-4) == epsilon_central(
        10**4, alpha_generic(1.0), 1.0, 1e-4
    )


def test_alpha_at_the_admissible_limit_is_accepted() -> None:
    eps = 1.0
    assert hockey_stick(100, 1.0 / (1.0 + math.exp(eps)), eps, 0.5) > 0.0
