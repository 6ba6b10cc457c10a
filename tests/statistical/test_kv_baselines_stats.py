"""Unbiasedness and closed-form variances of PrivKV, PCKV-UE and PCKV-GRR (Monte-Carlo, docs/mathematics.md §3.3-3.4).

R independent runs on one fixed, deliberately skewed key-value data set (Zipf-like key popularity, key-dependent
sign bias), each encoded, accumulated (in two merged halves) and estimated through the real Mechanism/Accumulator
surface with fixed seeds. Checked per item (Bonferroni |z| < 4.5 over 2d items), summed (4 standard errors of
the summed squared error), and for the published standard errors (their mean square vs the closed form).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.statistical.stats_helpers import Z_MAX, assert_mean_and_variance
from transforms.mechanisms.base import KeyValueEstimate
from transforms.mechanisms.keyvalue.kv_baselines import PCKVGRR, PCKVUE, PrivKV
from transforms.mechanisms.randomness import seeded_rng
from transforms.privacy import kv_formulas

pytestmark = pytest.mark.slow

Mech = PrivKV | PCKVUE | PCKVGRR
# Z_MAX (stats_helpers): Bonferroni over <= 24 items: P(max |z| > 4.5) < 24 * 6.8e-6 ~ 2e-4


def skewed_items(d: int, s: int, n: int, seed: int) -> np.ndarray:
    """Each client holds s distinct keys drawn by Zipf-like weights, key j being +1 w.p. (j + 1)/(d + 1); a quarter
    of the clients hold only s - 1 keys (last slot empty, -1), so PCKV's padding with dummy keys is exercised."""
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, d + 1) ** 0.8
    keys = np.argsort(-np.log(rng.random((n, d))) / w, axis=1)[:, :s]  # weighted sampling without replacement
    plus = rng.random((n, s)) < (keys + 1) / (d + 1)
    items = 2 * keys + plus
    items[: n // 4, -1] = -1
    return items


def run(mech: Mech, items: np.ndarray, runs: int, seed: int) -> list[KeyValueEstimate]:
    n = items.shape[0]
    rng = seeded_rng(seed)
    per_call = max(1, 400_000 // n)
    out: list[KeyValueEstimate] = []
    for start in range(0, runs, per_call):
        k = min(per_call, runs - start)
        reports = mech.encode(np.tile(items, (k, 1)), rng)
        for j in range(k):
            acc, other = mech.new_accumulator(), mech.new_accumulator()
            acc.add(reports[j * n : j * n + n // 3])
            other.add(reports[j * n + n // 3 : (j + 1) * n])
            acc.merge(other)
            out.append(acc.estimate())
    return out


def truth(items: np.ndarray, d: int) -> np.ndarray:
    return np.bincount(items[items >= 0], minlength=2 * d) / items.shape[0]


def covariance(mech: Mech, f: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact covariance of (f_hat(k+), f_hat(k-)) across runs (PrivKV: averaged over the group sizes)."""
    if isinstance(mech, PrivKV):
        return mech.expected_covariance(f[1::2], f[0::2], n)
    return mech.covariance(f[1::2], f[0::2], n)


CASES = [
    (PrivKV(8, 2, 2.0), 8000, 300),
    (PrivKV(6, 3, 1.0, epsilon_key=0.4), 6000, 300),
    (PCKVUE(12, 3, 1.0), 4000, 300),
    (PCKVUE(10, 2, 2.0, ell=3), 4000, 300),
    (PCKVGRR(12, 3, 2.0), 4000, 300),
    (PCKVGRR(8, 2, 1.0, ell=3, epsilon_value=0.8), 4000, 300),
]


@pytest.mark.parametrize(("mech", "n", "runs"), CASES, ids=[repr(c[0]) for c in CASES])
def test_unbiased_with_closed_form_variance(mech: Mech, n: int, runs: int) -> None:
    items = skewed_items(mech.d, mech.s, n, seed=mech.d * 10 + mech.s)
    f = truth(items, mech.d)
    ests = run(mech, items, runs, seed=2000 + mech.d + n)
    var_a, var_b, cov = covariance(mech, f, n)
    freq = np.stack([e.frequency for e in ests])
    item_var = np.empty(2 * mech.d)
    item_var[0::2], item_var[1::2] = var_b, var_a
    np.testing.assert_allclose(item_var, mech.variance(f, n), rtol=1e-12)
    assert_mean_and_variance("frequency", freq, f, item_var)
    mean, nonmissing = np.stack([e.mean for e in ests]), np.stack([e.nonmissing for e in ests])
    assert_mean_and_variance("mean", mean, f[1::2] - f[0::2], var_a + var_b - 2 * cov)
    assert_mean_and_variance("nonmissing", nonmissing, f[1::2] + f[0::2], var_a + var_b + 2 * cov)
    # Published standard errors: plug-in closed form at the estimates, so their mean square tracks the truth.
    for field, var in (("frequency", item_var), ("mean", var_a + var_b - 2 * cov)):
        reported = np.mean([np.sum(getattr(e, f"{field}_stderr") ** 2) for e in ests])
        assert reported == pytest.approx(var.sum(), rel=0.05), field


def test_conditional_mean_delta_method() -> None:
    """Where the non-missing frequency is known to within ~1/8 (so the ratio is nearly linear and never clipped),
    the ratio estimator is nearly unbiased and its delta-method stderr matches the spread across runs."""
    mech, n, runs = PCKVUE(6, 2, 2.0), 12000, 300
    items = skewed_items(mech.d, mech.s, n, seed=3)
    f = truth(items, mech.d)
    ests = run(mech, items, runs, seed=31)
    nonmissing = f[1::2] + f[0::2]
    well = nonmissing > 8 * np.mean([e.nonmissing_stderr for e in ests], axis=0)
    assert well.sum() >= 3  # the test keeps its power
    cm = np.stack([e.conditional_mean for e in ests])[:, well]
    target = ((f[1::2] - f[0::2]) / nonmissing)[well]
    se = np.mean([e.conditional_mean_stderr for e in ests], axis=0)[well]
    assert np.max(np.abs(cm.mean(axis=0) - target) / (cm.std(axis=0) / np.sqrt(runs))) < Z_MAX
    np.testing.assert_allclose(se, cm.std(axis=0), rtol=0.15)


def test_privkv_key_nobody_sampled() -> None:
    """A key with an empty group is estimated as 0 with an infinite standard error (no information)."""
    mech = PrivKV(50, 1, 1.0)
    reports = np.array([(0, 1), (0, 0), (1, -1)], dtype=mech.report_dtype)
    acc = mech.new_accumulator()
    acc.add(reports)
    est = acc.estimate()
    assert est.frequency[2 * 7] == 0 and np.isinf(est.frequency_stderr[2 * 7])
    assert est.extras["group_size"].tolist()[:3] == [2, 1, 0]


@pytest.mark.parametrize(("d", "s", "eps"), [(32, 4, 1.5), (128, 8, 0.5), (16, 16, 2.0)])
def test_variances_agree_with_the_planner(d: int, s: int, eps: float) -> None:
    """kv_formulas (planner, independent code) gives n * sum Var on §3's uniform workload (f = s/(2d))."""
    n = 100_000
    f = np.full(2 * d, s / (2 * d))
    for mech, variant in ((PCKVUE(d, s, eps), "ue"), (PCKVGRR(d, s, eps), "grr")):
        var_a, var_b, cov = mech.covariance(f[1::2], f[0::2], n)
        ref = kv_formulas.pckv_error(variant, d, s, eps)
        assert n * mech.variance(f, n).sum() == pytest.approx(ref.frequency, rel=1e-10)
        assert n * np.sum(var_a + var_b - 2 * cov) == pytest.approx(ref.mean, rel=1e-10)
    mech = PrivKV(d, s, eps)
    var_a, var_b, cov = mech.expected_covariance(f[1::2], f[0::2], n)
    ref = kv_formulas.privkv_error(d, s, eps, n)  # replaces the random group size by n/d: O(d/n) apart
    assert n * mech.variance(f, n).sum() == pytest.approx(ref.frequency, rel=5 * d / n)
    assert n * np.sum(var_a + var_b - 2 * cov) == pytest.approx(ref.mean, rel=5 * d / n)
