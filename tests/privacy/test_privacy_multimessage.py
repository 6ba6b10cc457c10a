"""Accountants of the [MultiMsg] multi-message protocols (transforms.privacy.multimessage) against the formulas and
reference values of docs/mathematics.md §7.1, §7.2 and against independent brute-force computations."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.stats import binom

from transforms.privacy.composition import chain_composition
from transforms.privacy.multimessage import (
    CountMinLoss,
    blanket_cap,
    countmin_delta,
    countmin_epsilon,
    countmin_min_gamma,
    countmin_paper_buckets,
    countmin_paper_gamma,
    countmin_paper_rows,
    hadamard_default_tau,
    hadamard_delta,
    hadamard_epsilon,
    hadamard_min_rho,
    hadamard_paper_rho,
    hadamard_swap_divergence,
    truncation_delta,
)


def test_hadamard_paper_rule_reference_values() -> None:
    # eps=1, delta=1e-6, k_set=1 -> 534 with delta' = delta/(k e^eps); the plain 36 ln(1/delta)/eps^2 -> 498
    assert hadamard_paper_rho(1.0, 1e-6, 1) == 534
    assert math.ceil(36 * math.log(1e6)) == 498
    assert hadamard_paper_rho(1.0, 1e-6, 2) == math.ceil(36 * (math.log(1e6) + math.log(2) + 1) / 0.25)
    assert [hadamard_default_tau(n) for n in (2, 3, 4, 1000, 1024, 10**5)] == [1, 1, 2, 9, 10, 16]


def brute_hadamard(n: int, rho: int, tau: int, eps: float) -> float:
    """Direct multinomial sum over (both, only-j, only-j') blanket counts and the Bernoulli of §7.1."""
    trials = n * rho
    p_in = 2.0**-tau
    p2, p1 = p_in * p_in, p_in - p_in * p_in
    p0 = 1 - 2 * p1 - p2
    total = 0.0
    for c, a, a2 in itertools.product(range(trials + 1), repeat=3):
        rest = trials - c - a - a2
        if rest < 0:
            continue
        coef = math.factorial(trials) // (math.factorial(c) * math.factorial(a) * math.factorial(a2)
                                          * math.factorial(rest))
        pr = coef * p2**c * p1**a * p1**a2 * p0**rest
        for b, pb in ((0, 1 - p_in), (1, p_in)):
            total += pr * pb * max(0.0, 1 - math.exp(eps) * (a2 + c + b) / (a + c + 1))
    return total


@pytest.mark.parametrize(("n", "rho", "tau", "eps"), [(2, 1, 1, 0.5), (3, 2, 1, 1.0), (4, 3, 2, 0.7), (10, 3, 3, 1.0),
                                                       (20, 2, 3, 0.3), (6, 4, 2, 0.0)])
def test_hadamard_divergence_matches_brute_force(n: int, rho: int, tau: int, eps: float) -> None:
    assert hadamard_swap_divergence(n, rho, tau, eps) == pytest.approx(brute_hadamard(n, rho, tau, eps), rel=1e-10)


def test_hadamard_chain_and_inverse() -> None:
    n, rho, tau, k = 1000, 30, 9, 3
    eps = 1.5
    step = hadamard_swap_divergence(n, rho, tau, eps / k)
    assert hadamard_delta(n, rho, tau, k, eps) == pytest.approx(chain_composition(eps / k, step, k)[1], rel=1e-12)
    eps_c = hadamard_epsilon(n, rho, tau, 1, 1e-6)
    assert hadamard_delta(n, rho, tau, 1, eps_c) <= 1e-6
    assert hadamard_delta(n, rho, tau, 1, eps_c * 0.99) > 1e-6  # the bisection result is (nearly) the smallest
    assert hadamard_epsilon(2, 1, 1, 1, 1e-9) == math.inf  # nothing certifiable with so little blanket


def test_hadamard_tight_rho_is_minimal_and_far_below_the_paper_rule() -> None:
    for n in (10**4, 10**5):
        tau = hadamard_default_tau(n)
        rho = hadamard_min_rho(n, tau, 1, 1.0, 1e-6)
        assert hadamard_delta(n, rho, tau, 1, 1.0) <= 1e-6 < hadamard_delta(n, rho - 1, tau, 1, 1.0)
        assert rho < hadamard_paper_rho(1.0, 1e-6) / 10  # §7.1: the Chernoff rule is very conservative
    # §7.1: at eps' = 1 the paper-scale rho = 249 leaves a negligible delta
    assert hadamard_swap_divergence(10**4, 249, 13, 1.0) < 1e-25
    assert hadamard_min_rho(10**4, 13, 1, 1.0, 1e-6) == 35  # regression value


def brute_countmin(n: int, gamma: float, rows: int, eps: float) -> float:
    """Exact hockey-stick of the 2 tau-cell pair by enumerating every table."""
    pmf = binom.pmf(np.arange(n + 1), n, gamma)

    def p(x: int) -> float:
        return float(pmf[x]) if 0 <= x <= n else 0.0

    total = 0.0
    for o in itertools.product(range(n + 2), repeat=2 * rows):
        pp = math.prod(p(o[i] - 1) for i in range(rows)) * math.prod(p(o[rows + i]) for i in range(rows))
        qq = math.prod(p(o[i]) for i in range(rows)) * math.prod(p(o[rows + i] - 1) for i in range(rows))
        total += max(0.0, pp - math.exp(eps) * qq)
    return total


@pytest.mark.parametrize(("n", "gamma", "rows", "eps"), [(5, 0.3, 1, 0.5), (6, 0.4, 2, 1.0), (8, 0.5, 2, 2.0),
                                                         (4, 0.2, 1, 0.1), (7, 0.25, 2, 0.0)])
def test_countmin_loss_bounds_brute_force(n: int, gamma: float, rows: int, eps: float) -> None:
    exact = brute_countmin(n, gamma, rows, eps)
    for grid in (1e-2, 1e-4):
        bound = CountMinLoss(n, gamma, rows, grid).delta(eps)
        assert exact - 1e-12 <= bound <= exact + 2 * rows * grid * 1.5  # rounding up costs <= 2 tau grid in eps
    assert CountMinLoss(n, gamma, rows, 1e-5).delta(eps) == pytest.approx(exact, rel=2e-3, abs=1e-6)


def test_countmin_loss_large_n_matches_gaussian_limit() -> None:
    # Independent check at scale: for large lambda = n gamma the loss of 2 tau unit shifts is ~ N(mu^2/2, mu^2)
    # with mu^2 = 2 tau / (lambda (1 - gamma)), whose delta(eps) has the Gaussian-DP closed form.
    n, gamma, rows = 10**6, 0.01, 6
    mu = math.sqrt(2 * rows / (n * gamma * (1 - gamma)))
    loss = CountMinLoss(n, gamma, rows, 1e-4)
    for eps in (0.5, 1.0):
        from scipy.stats import norm
        gauss = norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)
        assert loss.delta(eps) == pytest.approx(gauss, rel=0.05)


def test_countmin_paper_rules() -> None:
    assert countmin_paper_rows(2**20, 0.01) == math.ceil(math.log2(2 * 2**20 / 0.01)) == 28
    assert countmin_paper_buckets(10**5, 2) == 4 * 10**5
    # §7.2: n = 1e5, B = 2^20, beta = 0.01, eps = 1, delta = 1e-6 -> gamma ~ 12.6 (k = 1 form, infeasible)
    tau = countmin_paper_rows(2**20, 0.01)
    assert countmin_paper_gamma(10**5, tau, 1, 1.0, 1e-6) == pytest.approx(
        90 * tau**2 * math.log(2 * tau / 1e-6) / 1e5, rel=1e-12)
    assert countmin_paper_gamma(10**5, tau, 1, 1.0, 1e-6) > 1


def test_countmin_calibration_and_truncation() -> None:
    n, rows, buckets, eps, delta = 10**4, 8, 2 * 10**4, 2.0, 1e-6
    grid = eps / (400 * rows)
    gamma = countmin_min_gamma(n, rows, buckets, 1, eps, delta, grid)
    cap = blanket_cap(rows * buckets, gamma, n, eps, 0.01 * delta)
    assert truncation_delta(rows * buckets, gamma, cap, n, eps) <= 0.01 * delta
    assert truncation_delta(rows * buckets, gamma, cap - 1, n, eps) > 0.01 * delta
    assert countmin_delta(n, gamma, rows, buckets, 1, cap, eps, grid) <= delta
    assert countmin_delta(n, gamma / 1.02, rows, buckets, 1, cap, eps, grid) > delta  # (nearly) least gamma
    assert countmin_epsilon(n, gamma, rows, buckets, 1, cap, delta, grid) <= eps
    # chained sets: k swaps at eps/k each
    two = countmin_delta(n, gamma, rows, buckets, 2, cap, eps, grid) - truncation_delta(rows * buckets, gamma, cap,
                                                                                       n, eps)
    step = CountMinLoss(n, gamma, rows, grid).delta(eps / 2)
    assert two == pytest.approx(chain_composition(eps / 2, step, 2)[1], rel=1e-9)
    # the paper's gamma, where feasible, is orders of magnitude above the numeric one
    assert countmin_paper_gamma(n, rows, 1, eps, delta) > 20 * gamma
