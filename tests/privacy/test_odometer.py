"""The privacy odometer: composed eps of shuffled windows (and crowd counts) by privacy loss distributions.

Reference values: the issue's composed values for shuffled k-RR (d = 64, eps0 = 4, total delta 1e-6).
Independent checks: the single-window tight bound of ``shuffle_bound`` (a different code path: bisection
on the hockey-stick divergence), an exact enumeration of the two-fold product pair at small n, basic
composition above and the optimistic (rounded-down) PLD below.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy.stats import binom

from transforms.privacy.crowd import crowd_threshold
from transforms.privacy.mixture import alpha_generic, alpha_grr, alpha_oue
from transforms.privacy.odometer import (
    PrivacyOdometer,
    WindowRelease,
    capped_clients,
    compose_releases,
    compose_with_delta,
    cumulative_epsilon,
    quantize_clients,
)
from transforms.privacy.shuffle_bound import certified_alpha, epsilon_central
from transforms.privacy.shuffle_pld import DEFAULT_INTERVAL, crowd_count_pmfs, shuffle_loss_pmf

ALPHA = alpha_grr(4.0, 64)
DELTA = 1e-6


def _krr(n: int) -> WindowRelease:
    return WindowRelease(ALPHA, 4.0, n)


# Measured with cumulative_epsilon (k-RR d = 64, eps0 = 4, delta = 1e-6; the pair at the generic alpha,
# docs/mathematics.md §1.2).
@pytest.mark.parametrize(("n", "windows", "quoted"), [
    (10**5, 1, 0.1186), (10**5, 10, 0.4057), (10**5, 30, 0.7307), (10**5, 365, 2.842),
    (10**6, 1, 0.03453), (10**6, 30, 0.2139), (10**6, 365, 0.8157),
])
def test_quoted_composed_values(n: int, windows: int, quoted: float) -> None:
    eps = cumulative_epsilon([_krr(n)] * windows, DELTA)
    assert abs(eps / quoted - 1.0) < 0.05


@pytest.mark.parametrize(("n", "alpha", "eps0"), [(10**5, ALPHA, 4.0), (20_000, alpha_oue(2.0), 2.0),
                                                  (500, alpha_grr(1.0, 8), 1.0)])
def test_single_window_equals_tight_bound(n: int, alpha: float, eps0: float) -> None:
    # One window is the tight bound at the odometer's (conservatively rounded-down) client count, to 1e-3;
    # against the exact count it can only be higher, by the rounding's at most 2% fewer clients.
    at_grid = epsilon_central(quantize_clients(n), alpha, eps0, DELTA)
    eps = cumulative_epsilon([WindowRelease(alpha, eps0, n)], DELTA)
    assert abs(eps / at_grid - 1.0) < 1e-3
    exact = epsilon_central(n, alpha, eps0, DELTA)
    assert exact - 1e-5 <= eps <= exact * 1.02


def _optimistic(n: int, windows: int) -> float:
    """The same pair's PLD (at the certified alpha) rounded *down* and without its infinite mass: a lower bound
    on the exact value."""
    loss, prob, _ = shuffle_loss_pmf(n, certified_alpha(ALPHA, 4.0), 4.0)
    interval = 1e-5
    index = np.floor(loss / interval).astype(np.int64)
    lo = int(index.min())
    mass = np.bincount(index - lo, weights=prob)
    pld = pld_lib.PrivacyLossDistribution.create_from_rounded_probability(
        {lo + i: float(v) for i, v in enumerate(mass) if v > 0}, 0.0, interval, pessimistic_estimate=False)
    return float(pld.self_compose(windows).get_epsilon_for_delta(DELTA))


def test_bounds_and_monotonicity() -> None:
    n = 10**5
    values = [cumulative_epsilon([_krr(n)] * w, DELTA) for w in (1, 2, 10, 30)]
    assert all(a < b for a, b in itertools.pairwise(values))
    for w, eps in zip((1, 2, 10, 30), values, strict=True):
        # delta split evenly over the windows, at the odometer's grid count (it rounds n down, conservatively)
        basic = w * epsilon_central(quantize_clients(n), ALPHA, 4.0, DELTA / w)
        assert eps <= basic + w * 1e-5  # up to the PLD's pessimistic rounding (one grid step per window)
        assert eps >= _optimistic(n, w) - 1e-12
    assert values[-1] <= 30 * 4.0
    # more clients per window: never more expensive
    assert cumulative_epsilon([_krr(2 * n)] * 10, DELTA) < values[2]


def _exact_pair(n: int, alpha: float, eps0: float) -> tuple[np.ndarray, np.ndarray]:
    """P and Q of docs/mathematics.md §1.2 over every outcome (m, x), from scipy.stats (not from the module tested)."""
    e_a = math.exp(eps0) * alpha
    rest = 1.0 - alpha - e_a
    p_out, q_out = [], []
    for m in range(n + 1):
        for x in range(m + 1):
            z = rest * binom.pmf(m, n - 1, 2 * alpha) * binom.pmf(x, m, 0.5)
            b = binom.pmf(m - 1, n - 1, 2 * alpha) if m >= 1 else 0.0
            one = b * binom.pmf(x - 1, m - 1, 0.5) if m >= 1 else 0.0
            two = b * binom.pmf(x, m - 1, 0.5) if m >= 1 else 0.0
            p_out.append(z + e_a * one + alpha * two)
            q_out.append(z + alpha * one + e_a * two)
    return np.array(p_out), np.array(q_out)


def test_two_windows_against_exact_enumeration() -> None:
    n, eps0 = 40, 2.0
    alpha = alpha_grr(eps0, 4)
    delta = 1e-3
    p, q = _exact_pair(n, alpha_generic(eps0), eps0)  # the pair the odometer certifies with (§1.2)
    pp, qq = np.outer(p, p).ravel(), np.outer(q, q).ravel()

    def hockey(eps: float) -> float:
        return float(np.maximum(pp - math.exp(eps) * qq, 0.0).sum())

    eps = cumulative_epsilon([WindowRelease(alpha, eps0, n)] * 2, delta)
    assert hockey(eps) <= delta * (1 + 1e-9)  # certified
    assert hockey(eps * (1 - 2e-3)) > delta   # and tight


def test_crowd_count_pair_and_cost() -> None:
    p, q = crowd_count_pmfs(1.0, 1e-9)
    assert math.isclose(sum(p.values()), 1.0) and math.isclose(sum(q.values()), 1.0)
    t = math.ceil(crowd_threshold(1.0, 1e-9))
    assert math.isclose(p["top"], (1 - math.exp(-0.5)) * math.exp(-0.5 * t) / (1 + math.exp(-0.5)))
    # count alone: the pair P x Q vs Q x P, hockey-stick by enumeration at the odometer's epsilon
    crowd_only = WindowRelease(ALPHA, 4.0, 0, 1.0, 1e-9)
    eps, delta_cum, _ = compose_with_delta([crowd_only], DELTA)
    keys = list(p)
    pp = np.array([p[a] * q[b] for a in keys for b in keys])
    qq = np.array([q[a] * p[b] for a in keys for b in keys])
    # read at DELTA plus the pair's own infinite-loss mass (the top outcome), no per-window allowance
    assert delta_cum == pytest.approx(DELTA + p["top"] * q["lo"] + p["top"] * q["mid"] + p["top"] * q["abort"],
                                      rel=1e-6)
    assert np.maximum(pp - math.exp(eps) * qq, 0).sum() <= delta_cum * (1 + 1e-9)
    assert np.maximum(pp - math.exp(eps - 1e-3) * qq, 0).sum() > delta_cum
    assert eps <= 1.0 + 1e-4  # Thm V.1's eps_cr, on the dot: two counts at eps_cr/2 each
    with_crowd = cumulative_epsilon([WindowRelease(ALPHA, 4.0, 10**5, 1.0, 1e-9)] * 3, DELTA)
    assert with_crowd > cumulative_epsilon([_krr(10**5)] * 3, DELTA)
    # the count's infinite-loss outcome (~7.5e-8 per window at delta_cr = 1e-6) is added, not delta_cr itself
    _, delta_cum, _ = compose_with_delta([WindowRelease(ALPHA, 4.0, 10**5, 1.0, 1e-6)] * 20, DELTA)
    assert DELTA + 20 * 7e-8 < delta_cum < DELTA + 20 * 8e-8


def test_odometer_incremental_json_and_method() -> None:
    odometer = PrivacyOdometer(DELTA)
    values = [odometer.add(_krr(n)) for n in (50_000, 50_000, 80_000, 50_123)]
    assert values == sorted(values)
    rebuilt = PrivacyOdometer.from_json(odometer.to_json())
    assert rebuilt.releases == odometer.releases
    assert abs(rebuilt.epsilon - values[-1]) < 1e-6
    assert "pld" in odometer.method
    mixed = WindowRelease.approximate(0.3, 1e-8, 1000)
    eps, method = compose_releases([_krr(50_000), mixed], DELTA)
    assert "(eps, delta)" in method and eps > values[0]


def test_approximate_windows_and_validation() -> None:
    pure = [WindowRelease.approximate(0.5, 0.0, 100)] * 4
    eps = cumulative_epsilon(pure, DELTA)
    assert eps < 4 * 0.5 and eps > 0.5
    assert abs(cumulative_epsilon(pure[:1], DELTA) - 0.5) < 1e-3
    assert cumulative_epsilon([WindowRelease(ALPHA, 4.0, 0)], DELTA) == 0.0  # nothing released
    assert quantize_clients(99) == 99 and quantize_clients(100) == 100
    for n in (101, 999, 1_234_567, 10**9):
        q = quantize_clients(n)
        assert n / 1.02 <= q <= n, (n, q)
    # windows whose sizes wander by a few percent share a few grid points
    assert len({quantize_clients(n) for n in range(950, 1051)}) <= 6
    with pytest.raises(ValueError):
        WindowRelease(0.5, 4.0, 100)  # (1 + e^4) alpha > 1
    with pytest.raises(ValueError):
        WindowRelease(ALPHA, 4.0, 100, crowd_epsilon=1.0)
    with pytest.raises(ValueError):
        PrivacyOdometer(0.0)


def test_too_large_windows_fall_back_validly(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a tiny point cap every window falls back to its tight bound's (eps, delta) pair: labelled, above
    the exact PLD value, and near basic composition (never far above it)."""
    from transforms.privacy import shuffle_pld as module

    exact = cumulative_epsilon([_krr(20_000)] * 10, DELTA)
    module.shuffle_pld.cache_clear()
    monkeypatch.setattr(module, "MAX_POINTS", 10)
    eps, method = compose_releases([_krr(20_000)] * 10, DELTA)
    module.shuffle_pld.cache_clear()
    assert "too large" in method
    assert exact < eps <= 1.01 * 10 * epsilon_central(20_000, ALPHA, 4.0, DELTA / 10)


@pytest.mark.parametrize(("n", "alpha", "group_interval"), [(20_000, alpha_oue(2.0), 1e-2),
                                                            (3_000, alpha_grr(2.0, 64), 1e-2)])
def test_grouped_masses_equal_the_four_cdf_formula(monkeypatch: pytest.MonkeyPatch, n: int, alpha: float,
                                                   group_interval: float) -> None:
    """Groups reuse their predecessor's cdf values (two binomial cdfs per group, not four): bit for bit the
    masses of the direct formula A1 Pr[B in [xs-1, xe-1]] + A2 Pr[B in [xs, xe]]."""
    import transforms.privacy.shuffle_pld as shuffle_pld_module
    from transforms.privacy.binomial import binom_cdf

    def direct(xs, xe, trials, row, a1, a2):
        return (a1 * (binom_cdf(xe - 1, trials, 0.5) - binom_cdf(xs - 2, trials, 0.5))
                + a2 * (binom_cdf(xe, trials, 0.5) - binom_cdf(xs - 1, trials, 0.5)))

    fast = shuffle_loss_pmf(n, alpha, 2.0, group_interval=group_interval)
    monkeypatch.setattr(shuffle_pld_module, "_grouped_mass", direct)
    reference = shuffle_loss_pmf(n, alpha, 2.0, group_interval=group_interval)
    assert fast[0].size == reference[0].size > 0
    assert np.array_equal(fast[0], reference[0]) and np.array_equal(fast[1], reference[1])
    assert fast[2] == reference[2]
    ungrouped = shuffle_loss_pmf(n, alpha, 2.0)
    assert ungrouped[0].size > fast[0].size  # the groups exist: the test exercises _grouped_mass


@pytest.mark.slow  # ~4 s: builds the PLDs of two crowds and composes 60 windows
def test_too_large_windows_may_enter_as_the_largest_crowd_that_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a cap that 20,000 clients exceed but 5,000 meet, a year-like run of windows is published as the
    exact PLD of the largest grid crowd that fits (fewer clients never certify more privacy): above the
    exact value at 20,000, equal to the uncapped value at the fitted crowd (so it beat the (eps, delta)
    pairs), below basic composition."""
    from transforms.privacy import shuffle_pld as module

    windows = 60
    exact = cumulative_epsilon([_krr(20_000)] * windows, DELTA)
    cap = module._layout(quantize_clients(5_000), certified_alpha(ALPHA, 4.0), 4.0, module.PLD_WINDOW_SDS,
                         DEFAULT_INTERVAL)[-1].sum()
    module.shuffle_pld.cache_clear()
    monkeypatch.setattr(module, "MAX_POINTS", int(cap))
    fit = capped_clients(_krr(20_000), DEFAULT_INTERVAL)
    eps, method = compose_releases([_krr(20_000)] * windows, DELTA)
    at_fit = cumulative_epsilon([_krr(fit)] * windows, DELTA)
    module.shuffle_pld.cache_clear()
    assert "too large" in method
    assert quantize_clients(5_000) <= fit < quantize_clients(20_000)
    assert not module.pld_fits(quantize_clients(20_000), ALPHA, 4.0)
    assert exact < eps == pytest.approx(at_fit, rel=1e-8)  # the same PLD, composed along another path
    assert eps < windows * epsilon_central(20_000, ALPHA, 4.0, DELTA / windows)  # below basic composition
