"""Closed forms shared by the planner and the mechanisms (``kv_formulas``, ``vector_formulas``): reference constants,
t optimisers against brute force, alphas against exact output tables, and the PCKV / PrivKV variances against
independent Monte-Carlo re-implementations of docs/mathematics.md §3.3-3.4 (fixed seeds; 4.5 standard errors).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from transforms.privacy.kv_formulas import (
    _coco_sums,
    alpha_pckv_grr,
    alpha_pckv_ue,
    coco_best_t,
    coco_error,
    coco_rates,
    coco_t_mean_rule,
    collision_best_t,
    collision_error,
    collision_item_variance,
    collision_t_paper,
    pckv_error,
    pckv_grr_probabilities,
    pckv_ue_probabilities,
    privkv_error,
    privkv_probabilities,
)
from transforms.privacy.mixture import alpha_grr
from transforms.privacy.vector_formulas import (
    alpha_vector,
    eps0_from_gamma,
    gamma_002,
    gamma_from_eps0,
    k_round_002,
    report_variance,
    report_variance_bound,
)


def test_spec_11_5_coco_constants() -> None:
    p_ow, p_t, p_o, p_f = coco_rates(8, 0.5, 24)
    assert (float(p_ow), float(p_t), float(p_o), float(p_f)) == pytest.approx(
        (0.247795, 0.053729, 0.037012, 1 / 24), abs=1e-6)
    assert coco_t_mean_rule(0.5, 8) == 24
    error = coco_error(128, 8, 0.5, 24)
    assert error.mean == pytest.approx(38_372.28, abs=0.01)
    assert 2 * error.frequency - error.mean == pytest.approx(179_059.11, abs=0.01)  # non-missing sum
    assert float(_coco_sums(128, 8, 0.5, 54)[1]) == pytest.approx(77_697.97, abs=0.01)
    assert float(coco_rates(8, 0.5, 54)[0]) == pytest.approx(0.120459, abs=1e-6)


@pytest.mark.parametrize(("d", "s", "eps", "t", "expected"),
                         [(128, 8, 0.5, 28, 45_755.06), (256, 16, 1.0, 74, 39_920.06), (1024, 16, 2.0, 149, 27_172.92)])
def test_spec_11_5_collision_constants(d: int, s: int, eps: float, t: int, expected: float) -> None:
    assert collision_t_paper(eps, s) == t
    error = collision_error(d, s, eps, t)
    assert error.frequency == pytest.approx(expected, abs=0.01)
    assert error.mean == error.frequency  # no factor 2 (the papers' bound has one)


@pytest.mark.parametrize(("d", "s", "eps"), [(256, 16, 1.0), (128, 8, 0.5), (4, 4, 0.3), (1000, 1, 5.0),
                                             (20, 10, 0.1), (1024, 64, 3.0), (50, 3, 7.0)])
def test_best_t_matches_brute_force(d: int, s: int, eps: float) -> None:
    ts = np.arange(s + 1, 60 * s + int(20 * s * math.exp(eps)))
    assert collision_best_t(d, s, eps) == ts[np.argmin(collision_item_variance(d, s, eps, ts))]
    even = np.arange(2 * s + 2, ts[-1], 2)
    assert coco_best_t(d, s, eps) == even[np.argmin(_coco_sums(d, s, eps, even)[0])]


def test_best_t_spec_example_and_large_budgets() -> None:
    assert collision_best_t(256, 16, 1.0) == 79  # §3.1: t* = 74, argmin 79
    # for eps = 30 the optimum ~ sqrt(2 d s e^eps) is far beyond any arange; the zooming search still finds
    # a point no integer neighbour improves on
    t = collision_best_t(100, 16, 30.0)
    values = collision_item_variance(100, 16, 30.0, np.array([t - 1, t, t + 1], dtype=float))
    assert values[1] <= values.min() and 1e7 < t < 1e9


def test_pckv_grr_is_krr_over_2d_prime_outputs() -> None:
    # output table of PCKV-GRR for a sampled pair <k, v>, built from (a, b, p), against k-RR over 2d' cells
    d, s, eps = 5, 2, 1.3
    a, b, p = pckv_grr_probabilities(eps, d, s)
    d_prime = d + s
    for key, value in itertools.product(range(d_prime), (1, -1)):
        table = np.full((d_prime, 2), b / 2.0)
        table[key, 0 if value == 1 else 1] = a * p
        table[key, 1 if value == 1 else 0] = a * (1.0 - p)
        assert table.sum() == pytest.approx(1.0, abs=1e-12)
        # k-RR over the 2d' cells (key, sign): the input cell has weight e^eps, every other cell weight 1
        assert sorted(table.ravel() / (b / 2.0)) == pytest.approx([1.0] * (2 * d_prime - 1) + [math.exp(eps)],
                                                                   rel=1e-12)
    assert alpha_pckv_grr(eps, d, s) == alpha_grr(eps, 2 * d_prime)


def _ue_law(cell: tuple[int, int], positions: int, eps: float) -> np.ndarray:
    """Exact joint law of PCKV-UE over the first ``positions`` symbols (+1, -1, 0) for a sampled pair."""
    a, b, p = pckv_ue_probabilities(eps)
    key, value = cell
    law = np.ones(1)
    for position in range(positions):
        if position == key:
            symbol = [a * p, a * (1 - p), 1 - a] if value == 1 else [a * (1 - p), a * p, 1 - a]
        else:
            symbol = [b / 2, b / 2, 1 - b]
        law = np.multiply.outer(law, symbol).ravel()
    return law


@pytest.mark.parametrize("eps", [0.3, 1.0, 2.5, 6.0])
def test_pckv_ue_alpha_by_enumeration(eps: float) -> None:
    cells = [(key, value) for key in range(3) for value in (1, -1)]
    laws = {cell: _ue_law(cell, 3, eps) for cell in cells}
    worst_tv = max(0.5 * np.abs(laws[x] - laws[y]).sum() for x, y in itertools.permutations(cells, 2))
    assert alpha_pckv_ue(eps) == pytest.approx(worst_tv / math.expm1(eps), rel=1e-12)
    assert alpha_pckv_ue(eps) == pytest.approx(0.5 / (math.exp(eps) + 1), rel=1e-12)
    for x, y in itertools.permutations(cells, 2):
        ratio = laws[x] / laws[y]
        assert ratio.max() <= math.exp(eps) * (1 + 1e-12)  # eps-LDP with the default allocation
        # mixture condition of §1.2 for every third input: R(x_i) >= |R(x1) - R(x1')|/(e^eps - 1)
        gap = np.abs(laws[x] - laws[y]) / math.expm1(eps)
        for z in cells:
            assert (laws[z] - gap).min() >= -1e-15


def _balanced_dataset(n: int, d: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    """Each key held by exactly n s/d users, half with +1 and half with -1 (the worst case of privkv_error)."""
    users = np.arange(n)
    keys = (users[:, None] * s + np.arange(s)[None, :]) % d
    signs = np.where((users // d) % 2 == 0, 1, -1)[:, None] * np.ones((1, s), dtype=int)
    return keys, signs


def _truth(keys: np.ndarray, signs: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    n = keys.shape[0]
    plus = np.bincount(keys[signs == 1], minlength=d) / n
    minus = np.bincount(keys[signs == -1], minlength=d) / n
    return plus, minus


def _errors(plus_hat, minus_hat, plus, minus) -> tuple[float, float]:
    frequency = float(np.sum((plus_hat - plus) ** 2) + np.sum((minus_hat - minus) ** 2))
    return frequency, float(np.sum((plus_hat - minus_hat - plus + minus) ** 2))


def _pckv_run(variant: str, keys, signs, d: int, eps: float, rng) -> tuple[np.ndarray, np.ndarray]:
    n, s = keys.shape
    d_prime = d + s
    a, b, p = pckv_ue_probabilities(eps) if variant == "ue" else pckv_grr_probabilities(eps, d, s)
    pick = rng.integers(0, s, n)
    key, value = keys[np.arange(n), pick], signs[np.arange(n), pick]
    u = rng.random(n)
    own = np.where(u < a * p, value, np.where(u < a, -value, 0))
    if variant == "ue":
        noise = rng.random((n, d_prime))
        y = np.where(noise < b / 2, 1, np.where(noise < b, -1, 0))
        y[np.arange(n), key] = own
        n1, n2 = (y[:, :d] == 1).sum(axis=0), (y[:, :d] == -1).sum(axis=0)
    else:
        other = rng.integers(0, d_prime - 1, n)
        other = other + (other >= key)
        out_key = np.where(own != 0, key, other)
        out_sign = np.where(own != 0, own, np.where(rng.random(n) < 0.5, 1, -1))
        n1 = np.bincount(out_key[out_sign == 1], minlength=d_prime)[:d]
        n2 = np.bincount(out_key[out_sign == -1], minlength=d_prime)[:d]
    total = s * (n1 + n2 - n * b) / (a - b)
    diff = s * (n1 - n2) / (a * (2 * p - 1))
    return (total + diff) / (2 * n), (total - diff) / (2 * n)


def _privkv_run(keys, signs, d: int, eps: float, rng) -> tuple[np.ndarray, np.ndarray]:
    n, _ = keys.shape
    p1, p2 = privkv_probabilities(eps)
    j = rng.integers(0, d, n)
    held = keys == j[:, None]
    holder = held.any(axis=1)
    value = np.where(holder, (signs * held).sum(axis=1), 0)
    value = np.where(rng.random(n) < p2, value, -value)
    report = rng.random(n) < p1
    fake = np.where(rng.random(n) < 0.5, 1, -1)
    bit = np.where(holder, report, ~report)
    sign = np.where(bit, np.where(holder, value, fake), 0)
    size = np.bincount(j, minlength=d)
    n_plus, n_minus = np.bincount(j[sign == 1], minlength=d), np.bincount(j[sign == -1], minlength=d)
    total = (n_plus + n_minus - size * (1 - p1)) / (2 * p1 - 1)
    diff = (n_plus - n_minus) / (p1 * (2 * p2 - 1))
    return (total + diff) / (2 * size), (total - diff) / (2 * size)


@pytest.mark.parametrize(("mechanism", "eps", "runs"),
                         # privkv at eps = 5: the data-sampling term is half of the error, so it is tested too
                         [("ue", 1.0, 500), ("grr", 2.0, 800), ("privkv", 1.5, 800), ("privkv", 5.0, 1200)])
def test_kv_variances_against_monte_carlo(mechanism: str, eps: float, runs: int) -> None:
    n, d, s = 4000, 8, 2
    keys, signs = _balanced_dataset(n, d, s)
    plus, minus = _truth(keys, signs, d)
    assert np.allclose(plus, s / (2 * d)) and np.allclose(minus, s / (2 * d))
    rng = np.random.default_rng(20240611 + runs)
    samples = []
    for _ in range(runs):
        if mechanism == "privkv":
            plus_hat, minus_hat = _privkv_run(keys, signs, d, eps, rng)
        else:
            plus_hat, minus_hat = _pckv_run(mechanism, keys, signs, d, eps, rng)
        samples.append(_errors(plus_hat, minus_hat, plus, minus))
    observed = np.array(samples)
    error = privkv_error(d, s, eps, n) if mechanism == "privkv" else pckv_error(mechanism, d, s, eps)
    for column, expected in enumerate((error.frequency / n, error.mean / n)):
        mean, se = observed[:, column].mean(), observed[:, column].std(ddof=1) / math.sqrt(runs)
        # PrivKV's formula replaces N_j by n/d (relative error ~ d/n = 0.2 %, far below the 4.5 SE ~ 10 %)
        assert abs(mean - expected) < 4.5 * se, (column, mean, expected, se)


# --- vector ([VecSum]) -----------------------------------------------------------------------------------------


def _exact_report_variance(x: float, k: int, gamma: float) -> float:
    """Variance of (y/k - gamma/2)/(1 - gamma) by enumerating the rounding and the k-RR output."""
    low = math.floor(x * k)
    frac = x * k - low
    law = np.zeros(k + 1)
    for rounded, weight in ((low, 1 - frac), (min(low + 1, k), frac)):
        law += weight * gamma / (k + 1)
        law[rounded] += weight * (1 - gamma)
    values = (np.arange(k + 1) / k - gamma / 2) / (1 - gamma)
    mean = float(law @ values)
    assert mean == pytest.approx(x, abs=1e-12)  # DeBias is unbiased
    return float(law @ (values - mean) ** 2)


@pytest.mark.parametrize(("k", "gamma"), [(1, 0.3), (3, 0.17053), (8, 0.02), (20, 0.6)])
def test_report_variance_by_enumeration(k: int, gamma: float) -> None:
    for x in np.linspace(0.0, 1.0, 23):
        exact = _exact_report_variance(float(x), k, gamma)
        assert report_variance(float(x), k, gamma) == pytest.approx(exact, rel=1e-10, abs=1e-14)
        assert report_variance_bound(k, gamma) >= exact * (1 - 1e-12)


def test_vector_constants_and_inverses() -> None:
    assert gamma_002(100, 3, 50_000, 0.95, 0.5) == pytest.approx(0.170530, abs=1e-6)
    assert gamma_002(100, 3, 50_000, 0.95, 0.5, t=2) == pytest.approx(0.536628, abs=1e-6)
    assert gamma_002(100, 3, 50_000, 0.5, 1e-5) == pytest.approx(4.10, abs=0.005)
    assert k_round_002(100, 50_000, 0.95, 0.5) == pytest.approx(2.0643, abs=1e-4)
    for k, gamma in ((1, 0.3), (3, 0.17053), (8, 0.02)):
        eps0 = eps0_from_gamma(gamma, k)
        assert gamma_from_eps0(eps0, k) == pytest.approx(gamma, rel=1e-12)
        assert alpha_vector(eps0, k) == pytest.approx(gamma / (k + 1), rel=1e-12)
        # the k-RR behind a report: keep-probability ratio e^eps0
        assert ((1 - gamma) + gamma / (k + 1)) / (gamma / (k + 1)) == pytest.approx(math.exp(eps0), rel=1e-12)
    with pytest.raises(ValueError, match="eps_c < 6"):
        gamma_002(100, 3, 50_000, 6.0, 1e-5)
    with pytest.raises(ValueError, match="gamma must lie in"):
        eps0_from_gamma(1.0, 3)
