"""[VecSum] vector summation and LDP-SGD: unbiasedness, exact variances, published standard errors (Monte-Carlo,
docs/mathematics.md §4.2, §4.1), the gamma >= 1 refusal, [VecSum]'s central guarantee, and reference values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.statistical.stats_helpers import Z_MAX, assert_mean_and_variance
from transforms.mechanisms.randomness import seeded_rng
from transforms.mechanisms.vector.ldp_sgd import LdpSgdRandomizer, kappa
from transforms.mechanisms.vector.summation import VectorSummation, epsilon_002, gamma_002, k_round_002

pytestmark = pytest.mark.slow

# Z_MAX (stats_helpers): Bonferroni over <= 2 x 12 coordinates


def data(n: int, d: int, seed: int) -> np.ndarray:
    """Values in [0, 1] with coordinate-dependent means and spreads, many off the rounding grid, some at 0 and 1."""
    rng = np.random.default_rng(seed)
    x = rng.beta(np.linspace(0.5, 4, d), 2.0, size=(n, d))
    x[: n // 10] = np.round(x[: n // 10])
    return x


VS_CASES = [
    (VectorSummation(12, 0.95, 0.5, 3000, t=1, k_round=3), 3000, 400),  # gamma ~0.29, as in [VecSum]'s experiments
    (VectorSummation(8, 0.9, 1e-3, 10**6, t=2, k_round=2), 2000, 400),
    (VectorSummation(5, 2.0, 1e-4, 10**7, t=1), 2000, 400),  # k_round from [VecSum]'s rule
]


@pytest.mark.parametrize(("mech", "n", "runs"), VS_CASES, ids=[repr(c[0]) for c in VS_CASES])
def test_vector_sum_unbiased_with_exact_variance(mech: VectorSummation, n: int, runs: int) -> None:
    x = data(n, mech.d, seed=mech.d)
    rng = seeded_rng(700 + mech.d)
    ratio, ht, se2 = (np.empty((runs, mech.d)) for _ in range(3))
    per_call = max(1, 200_000 // n)
    for start in range(0, runs, per_call):
        k = min(per_call, runs - start)
        reports = mech.encode(np.tile(x, (k, 1)), rng)
        for j in range(k):
            acc, other = mech.new_accumulator(), mech.new_accumulator()
            acc.add(reports[j * n : j * n + n // 2])
            other.add(reports[j * n + n // 2 : (j + 1) * n])
            acc.merge(other)
            est = acc.estimate()
            ratio[start + j], ht[start + j], se2[start + j] = est.mean, est.extras["horvitz_thompson"], est.stderr**2
    truth = x.mean(axis=0)
    assert_mean_and_variance("ratio", ratio, truth, mech.variance(x))
    assert_mean_and_variance("horvitz-thompson", ht, truth, mech.ht_variance(x))
    # Plug-in stderr: unbiased for the exact variance up to the factor n/(n - m) ~ d/(d - t) on its sampling part.
    reported, exact = se2.mean(axis=0).sum(), mech.variance(x).sum()
    assert exact * 0.95 < reported < exact * mech.d / (mech.d - mech.t) * 1.05


def test_report_variance_matches_monte_carlo() -> None:
    """§4.1's V(x) for single reports, including off-grid values and the endpoints (gamma ~0.43: every term of V
    matters)."""
    mech = VectorSummation(1, 0.95, 0.5, 200, t=1, k_round=3)
    assert 0.4 < mech.gamma < 0.5
    rng = seeded_rng(12)
    for x in (0.0, 0.1, 0.5, 2 / 3, 0.9, 1.0):
        reports = mech.encode(np.full((400_000, 1), x), rng)
        w = (reports["values"][:, 0] / 3 - mech.gamma / 2) / (1 - mech.gamma)
        v = float(mech.report_variance(np.array(x)))
        assert abs(w.mean() - x) < 5 * math.sqrt(v / w.size)
        assert w.var() == pytest.approx(v, rel=0.015)  # 4e5 draws: relative SE of a variance ~0.2-0.3 %


def test_infeasible_gamma_is_refused_with_what_to_change() -> None:
    """Reference value: d=100, k=3, n=50,000, eps=0.5, delta=1e-5 gives gamma = 4.10 -> must raise."""
    with pytest.raises(ValueError, match=r"gamma = 4\.10\d* >= 1") as info:
        VectorSummation(100, 0.5, 1e-5, 50_000, k_round=3)
    message = str(info.value)
    assert "raise n to at least" in message and "raise epsilon" in message and "lower t / k_round" in message
    n_min = int(message.split("raise n to at least ")[1].split(",")[0])
    assert VectorSummation(100, 0.5, 1e-5, n_min, k_round=3).gamma < 1  # the advice is right...
    with pytest.raises(ValueError, match="infeasible"):
        VectorSummation(100, 0.5, 1e-5, n_min - 1, k_round=3)  # ...and minimal
    with pytest.raises(ValueError, match="epsilon < 6"):
        VectorSummation(10, 6.0, 1e-5, 10**9)
    with pytest.raises(ValueError, match=r"t \(coordinates per client\)"):
        VectorSummation(10, 0.5, 1e-5, 10**9, t=11)


def test_reference_values_11_5() -> None:
    assert gamma_002(100, 3, 50_000, 0.95, 0.5) == pytest.approx(0.170530, abs=5e-7)
    assert k_round_002(100, 50_000, 0.95, 0.5) == pytest.approx(2.0643, abs=5e-5)
    assert gamma_002(100, 3, 50_000, 0.95, 0.5, t=2) == pytest.approx(0.536628, abs=5e-7)
    assert VectorSummation(100, 0.95, 0.5, 50_000).k_round == 2  # round(2.0643)
    # here the 27 d k/((n-1) eps) term sets gamma, so the inversion must use it
    assert VectorSummation(100, 0.95, 0.5, 50_000, k_round=3).central_guarantee()[0] == pytest.approx(0.95, rel=1e-12)
    assert [kappa(d) for d in (2, 3, 10)] == pytest.approx([math.pi / 2, 2.0, 3.8656316], abs=5e-8)


@pytest.mark.parametrize(("eps", "t"), [(0.3, 1), (0.95, 1), (1.0, 1), (2.5, 1), (5.9, 1), (0.5, 3), (3.0, 2)])
def test_central_guarantee_inverts_gamma(eps: float, t: int) -> None:
    """The certified epsilon is the smallest one whose [VecSum] gamma is <= ours: the target itself below 1; at or
    above 1 it can be smaller, because the eps >= 1 constants (80/36, 2016) jump above the eps < 1 ones."""
    mech = VectorSummation(20, eps, 1e-6, 10**9, t=t, k_round=4)
    eps_c, delta = mech.central_guarantee()
    assert delta == 1e-6 and eps_c <= eps * (1 + 1e-12)
    if eps < 1:
        assert eps_c == pytest.approx(eps, rel=1e-12)
    assert gamma_002(20, 4, 10**9, eps_c, 1e-6, t) <= mech.gamma * (1 + 1e-12)
    assert gamma_002(20, 4, 10**9, eps_c * (1 - 1e-6), 1e-6, t) > mech.gamma  # minimal
    # a larger gamma certifies a smaller epsilon, never a larger one
    assert epsilon_002(20, 4, 10**9, min(1.0, 1.5 * mech.gamma), 1e-6, t) <= eps_c


def test_local_guarantee_and_alpha() -> None:
    mech = VectorSummation(12, 0.95, 0.5, 3000, t=1, k_round=3)
    assert mech.epsilon_local == pytest.approx(math.log(1 + 4 * (1 - mech.gamma) / mech.gamma))
    assert mech.mixture_alpha == pytest.approx(mech.gamma / 4)
    multi = VectorSummation(8, 0.9, 1e-3, 10**6, t=2, k_round=2)
    assert multi.mixture_alpha == pytest.approx(1 / (math.exp(multi.epsilon_local) + 1))


LDP_SGD_CASES = [(LdpSgdRandomizer(3, 1.0, clip=1.0), 2000, 400), (LdpSgdRandomizer(10, 2.0, clip=0.5), 2000, 400),
                 (LdpSgdRandomizer(1, 0.5, clip=2.0), 2000, 1600)]


@pytest.mark.parametrize(("mech", "n", "runs"), LDP_SGD_CASES, ids=[repr(c[0]) for c in LDP_SGD_CASES])
def test_ldp_sgd_unbiased_with_exact_variance(mech: LdpSgdRandomizer, n: int, runs: int) -> None:
    """Gradients partly above the clip norm, with a non-zero mean direction; target = mean *clipped* gradient."""
    g = np.random.default_rng(mech.d).normal(loc=0.4 * mech.clip, scale=mech.clip, size=(n, mech.d))
    rng = seeded_rng(800 + mech.d)
    est, se = np.empty((runs, mech.d)), np.empty((runs, mech.d))
    per_call = max(1, 200_000 // (n * mech.d))
    for start in range(0, runs, per_call):
        k = min(per_call, runs - start)
        reports = mech.encode(np.tile(g, (k, 1)), rng)
        for j in range(k):
            acc = mech.new_accumulator()
            acc.add(reports[j * n : (j + 1) * n])
            out = acc.estimate()
            est[start + j], se[start + j] = out.mean, out.stderr
    var = mech.variance(g)
    assert_mean_and_variance("ldp-sgd", est, mech.clip_gradients(g).mean(axis=0), var)
    assert np.all(se**2 >= var)  # published stderr: the data-free upper bound c^2/(d n)
    assert se[0, 0] ** 2 <= var.min() * mech.scale**2 / (mech.scale**2 - mech.d * mech.clip**2)


def test_ldp_sgd_uncorrected_kappa_would_be_biased() -> None:
    """[ESA] prints kappa without the factor d; the estimator would then be off by 1/d (here d=4: 75 % low)."""
    mech = LdpSgdRandomizer(4, 1.0)
    printed = math.sqrt(math.pi) / 2 * math.exp(math.lgamma(2.5) - math.lgamma(3.0))
    assert kappa(4) == pytest.approx(4 * printed, rel=1e-12)
    g = np.tile([0.6, -0.3, 0.2, 0.0], (400_000, 1))
    acc = mech.new_accumulator()
    acc.add(mech.encode(g, seeded_rng(3)))
    est = acc.estimate()
    assert np.max(np.abs(est.mean - g[0]) / est.stderr) < Z_MAX
    assert abs(est.mean[0] / 4 - g[0, 0]) > 10 * est.stderr[0] / 4
