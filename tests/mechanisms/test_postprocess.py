"""Post-processing (docs/mathematics.md §2.9): simplex projection against its KKT conditions, an exact active-set
brute force and a generic QP solver; clipping; the name dispatcher."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.optimize import minimize

from transforms.mechanisms.base import FrequencyEstimate
from transforms.mechanisms.postprocess import POSTPROCESSORS, clip_nonnegative, postprocess, project_simplex

RNG = np.random.default_rng(20240607)  # fixed: a failure is reproducible
INPUTS = [RNG.normal(0.0, scale, size) for size, scale in itertools.product((1, 2, 3, 5, 8, 40), (0.05, 0.5, 3.0))]
TOTALS = (1.0, 0.3, 7.5)


def brute_force_projection(y: np.ndarray, z: float) -> np.ndarray:
    """Exact projection by enumerating supports S: x_S = y_S + (z - sum y_S)/|S|, 0 elsewhere; keep the nearest
    feasible candidate (the optimum is one of them: on its support the KKT system is linear)."""
    best, best_dist = None, np.inf
    for size in range(1, y.size + 1):
        for support in itertools.combinations(range(y.size), size):
            idx = list(support)
            x = np.zeros_like(y)
            x[idx] = y[idx] + (z - y[idx].sum()) / size
            if np.all(x >= -1e-12) and np.sum((x - y) ** 2) < best_dist:
                best, best_dist = np.maximum(x, 0.0), float(np.sum((x - y) ** 2))
    assert best is not None
    return best


@pytest.mark.parametrize("total", TOTALS)
def test_projection_is_on_the_simplex_and_idempotent(total: float) -> None:
    for y in INPUTS:
        x = project_simplex(y, total)
        assert x.shape == y.shape and np.all(x >= 0)
        assert x.sum() == pytest.approx(total, abs=1e-9)
        np.testing.assert_allclose(project_simplex(x, total), x, atol=1e-12)


@pytest.mark.parametrize("total", TOTALS)
def test_projection_satisfies_kkt(total: float) -> None:
    """x = max(y + lam, 0): x_i - y_i = lam on the support, y_i + lam <= 0 off it."""
    for y in INPUTS:
        x = project_simplex(y, total)
        on = x > 0
        lam = float(np.mean(x[on] - y[on]))
        np.testing.assert_allclose(x[on] - y[on], lam, atol=1e-9)
        assert np.all(y[~on] + lam <= 1e-9)


def test_projection_matches_brute_force_and_a_qp_solver() -> None:
    for y in INPUTS:
        if y.size > 8:
            continue
        for total in TOTALS:
            x = project_simplex(y, total)
            np.testing.assert_allclose(x, brute_force_projection(y, total), atol=1e-10)
            res = minimize(lambda w, y=y: 0.5 * np.sum((w - y) ** 2), np.full(y.size, total / y.size),
                           jac=lambda w, y=y: w - y, method="SLSQP", bounds=[(0, None)] * y.size,
                           constraints=[{"type": "eq", "fun": lambda w, t=total: w.sum() - t,
                                         "jac": lambda w: np.ones_like(w)}],
                           options={"ftol": 1e-14, "maxiter": 500})
            assert res.success, res.message
            np.testing.assert_allclose(x, res.x, atol=1e-6)


def test_projection_keeps_feasible_points_and_handles_stacks() -> None:
    feasible = np.array([0.1, 0.0, 0.6, 0.3])
    np.testing.assert_allclose(project_simplex(feasible), feasible, atol=1e-15)
    stack = np.stack([y for y in INPUTS if y.size == 5])
    rows = np.stack([project_simplex(y, 2.0) for y in stack])
    np.testing.assert_allclose(project_simplex(stack, 2.0), rows, atol=1e-12)
    np.testing.assert_allclose(project_simplex([-5.0, -5.0, -5.0]), [1 / 3] * 3)
    np.testing.assert_allclose(project_simplex([1e300, 0.0]), [1.0, 0.0])  # no overflow/NaN at extreme scales


def test_projection_is_fast_for_large_domains() -> None:
    y = RNG.normal(0.0, 1e-3, 2**20)
    x = project_simplex(y)
    assert x.sum() == pytest.approx(1.0, abs=1e-9) and np.all(x >= 0)


def test_clip_nonnegative() -> None:
    np.testing.assert_array_equal(clip_nonnegative([-1.0, 2.0, 0.5]), [0.0, 2.0, 0.5])
    np.testing.assert_allclose(clip_nonnegative([-1.0, 3.0, 1.0], total=2.0), [0.0, 1.5, 0.5])
    np.testing.assert_allclose(clip_nonnegative([-1.0, -3.0], total=1.0), [0.5, 0.5])  # nothing left: uniform
    np.testing.assert_allclose(clip_nonnegative([[-1.0, 1.0], [2.0, 2.0]], total=1.0), [[0.0, 1.0], [0.5, 0.5]])


@pytest.mark.parametrize("bad", [[np.nan, 1.0], [np.inf], []])
def test_non_finite_or_empty_inputs_are_refused(bad: list[float]) -> None:
    for fn in (project_simplex, clip_nonnegative):
        with pytest.raises(ValueError, match=r"NaN|non-empty"):
            fn(bad)


@pytest.mark.parametrize("total", [0.0, -1.0, np.nan])
def test_bad_totals_are_refused(total: float) -> None:
    with pytest.raises(ValueError, match="total must be"):
        project_simplex([0.2, 0.8], total)
    with pytest.raises(ValueError, match="total must be"):
        clip_nonnegative([0.2, 0.8], total)


def test_dispatcher_on_arrays() -> None:
    y = np.array([0.7, -0.2, 0.6])
    assert POSTPROCESSORS == ("none", "clip", "simplex")
    out = postprocess("none", y)
    np.testing.assert_array_equal(out, y)
    assert out is not y
    np.testing.assert_array_equal(postprocess("clip", y), clip_nonnegative(y))
    np.testing.assert_array_equal(postprocess("Simplex", y), project_simplex(y))
    np.testing.assert_array_equal(postprocess("simplex", y, total=3.0), project_simplex(y, 3.0))
    with pytest.raises(ValueError, match="unknown post-processing 'round'; valid names: none, clip, simplex"):
        postprocess("round", y)


def test_dispatcher_on_frequency_estimates() -> None:
    est = FrequencyEstimate(count=np.array([70.0, -20.0, 50.0]), frequency=np.array([0.7, -0.2, 0.5]),
                            stderr=np.array([0.1, 0.1, 0.1]), n=100, extras={"solver_iterations": 3})
    out = postprocess("simplex", est)
    assert isinstance(out, FrequencyEstimate)
    np.testing.assert_allclose(out.frequency, [0.6, 0.0, 0.4])
    np.testing.assert_allclose(out.count, [60.0, 0.0, 40.0])
    np.testing.assert_array_equal(out.stderr, est.stderr)
    assert out.n == 100 and out.extras == {"solver_iterations": 3, "postprocess": "simplex"}
    assert est.extras == {"solver_iterations": 3}  # the input is not modified
