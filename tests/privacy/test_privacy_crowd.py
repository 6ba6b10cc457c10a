"""Crowd thresholding numbers (docs/mathematics.md §1.5) against reference values, and the discrete Laplace by
summation."""

from __future__ import annotations

import math

import pytest

from transforms.privacy.crowd import (
    abort_probability,
    crowd_threshold,
    deletion_variance,
    discrete_laplace_scale,
    discrete_laplace_variance,
    max_loss_bound,
)


def test_section_11_5_crowd_thresholding() -> None:
    # eps_cr = 1, delta_cr = 1e-6, P = 10 crowds.
    assert crowd_threshold(1.0, 1e-6) == pytest.approx(29.017315, abs=1e-6)
    assert deletion_variance(1.0) == 8.0
    assert abort_probability(1.0, 1e-6) == pytest.approx(2.5e-7, rel=1e-12)
    assert max_loss_bound(1.0, 1e-6, 10) == pytest.approx(67.244971, abs=1e-6)


@pytest.mark.parametrize(("eps_cr", "delta_cr"), [(0.5, 1e-9), (2.0, 1e-3), (1.3, 0.2)])
def test_abort_probability_is_a_quarter_of_delta(eps_cr: float, delta_cr: float) -> None:
    assert abort_probability(eps_cr, delta_cr) == pytest.approx(delta_cr / 4.0, rel=1e-12)


def two_sided_geometric_pmf(eps_cr: float, k: int) -> float:
    q = math.exp(-eps_cr / 2.0)
    return (1.0 - q) / (1.0 + q) * q ** abs(k)


@pytest.mark.parametrize("eps_cr", [0.2, 1.0, 3.0])
def test_discrete_laplace_by_summation(eps_cr: float) -> None:
    q = discrete_laplace_scale(eps_cr)
    assert q == pytest.approx(math.exp(-eps_cr / 2.0))
    support = range(-4000, 4001)
    pmf = [two_sided_geometric_pmf(eps_cr, k) for k in support]
    assert math.fsum(pmf) == pytest.approx(1.0, abs=1e-12)
    variance = math.fsum(p * k * k for p, k in zip(pmf, support, strict=True))
    assert discrete_laplace_variance(eps_cr) == pytest.approx(variance, rel=1e-10)
    assert discrete_laplace_variance(eps_cr) < deletion_variance(eps_cr)
    # eps_cr/2-DP for a sensitivity-1 count: neighbouring pmf values differ by at most e^{eps_cr/2}.
    ratios = [
        two_sided_geometric_pmf(eps_cr, k) / two_sided_geometric_pmf(eps_cr, k + 1) for k in range(-50, 50)
    ]
    assert max(ratios) == pytest.approx(math.exp(eps_cr / 2.0))
    # The abort tail of the discrete noise stays within the per-crowd delta_cr/2 of Thm V.1.
    delta_cr = 1e-4
    threshold = math.ceil(crowd_threshold(eps_cr, delta_cr))
    tail = math.fsum(two_sided_geometric_pmf(eps_cr, k) for k in range(threshold, 4001))
    assert tail <= delta_cr / 2.0


def test_crowd_arguments_are_validated() -> None:
    with pytest.raises(ValueError, match="eps_cr must be > 0"):
        crowd_threshold(0.0, 1e-6)
    with pytest.raises(ValueError, match=r"delta_cr must lie in \(0, 1\)"):
        abort_probability(1.0, 1.5)
    with pytest.raises(ValueError, match="crowds must be an integer >= 1"):
        max_loss_bound(1.0, 1e-6, 0)
