"""GRR's blanket role: the declared law is its uniform component, the dummies follow it, the privacy claim
survives an audit that refutes broken blankets, and the debiased estimator is unbiased with its closed-form
variance.

Audits. *Exact*: the adversary's view (victim + m dummies drawn from the mechanism's declared law) enumerated
multiset by multiset for every pair of inputs; its epsilon must equal the claimed ``blanket_epsilon``.
*Empirical*: ``encode`` and ``blanket_reports`` run as the shuffler would, N releases per input, events fixed
before sampling, Clopper-Pearson lower bounds on epsilon (tests/audit/ldp_audit.py) held to the claim.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.stats import chi2

from tests.audit.ldp_audit import ALPHA, epsilon_lower_bound
from tests.mechanisms.ldp_helpers import assert_counts_follow_law
from tests.privacy.test_blanket import brute_epsilon, view_laws
from transforms.mechanisms.base import Randomness
from transforms.mechanisms.blanket import BlanketRandomizer, require_blanket
from transforms.mechanisms.frequency.counting import rr_count_variance, structured
from transforms.mechanisms.frequency.oracles import GRR, OLH, OUE
from transforms.mechanisms.randomness import seeded_rng
from transforms.privacy.binomial import binom_pmf

# ---- deliberately broken blankets (each a plausible shuffler bug) -------------------------------------------


class OffByOneBlanket(GRR):
    """Dummies from integers(0, d - 1): value d - 1 never gets a dummy."""

    def blanket_reports(self, m: int, rng: Randomness) -> np.ndarray:
        return structured(self.report_dtype, value=np.asarray(rng.integers(0, self.d - 1, m), dtype=np.int64))


class NoDummies(GRR):
    """The dummies are never added (m ignored): the victim is not hidden."""

    def blanket_reports(self, m: int, rng: Randomness) -> np.ndarray:
        return structured(self.report_dtype, value=np.zeros(0, dtype=np.int64))


class OneDrawRepeated(GRR):
    """One uniform value copied m times: the right marginal law, but the dummies are not independent."""

    def blanket_reports(self, m: int, rng: Randomness) -> np.ndarray:
        return structured(self.report_dtype, value=np.repeat(rng.integers(0, self.d, 1), m).astype(np.int64))


class EncodedDefault(GRR):
    """Dummies are the randomizer applied to a default value 0 (declared consistently): not the blanket law."""

    @property
    def blanket_law(self) -> np.ndarray:
        return self.exact_output_distribution(0)

    def blanket_reports(self, m: int, rng: Randomness) -> np.ndarray:
        return self.encode(np.zeros(m, dtype=np.int64), rng)


# ---- the role ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("d", "eps"), [(2, 0.5), (4, 2.0), (64, 4.0)])
def test_declared_law_is_the_uniform_component_of_every_output(d: int, eps: float) -> None:
    """R(v) - gamma B is (1 - gamma) at v and 0 elsewhere: B really is the input-independent part."""
    mech = GRR(d=d, epsilon=eps)
    gamma, law = mech.blanket_weight, mech.blanket_law
    assert gamma == pytest.approx(d * mech.q, rel=1e-12) and law.sum() == pytest.approx(1.0)
    for v in range(d):
        rest = mech.exact_output_distribution(v) - gamma * law
        want = np.zeros(d)
        want[v] = 1.0 - gamma
        np.testing.assert_allclose(rest, want, atol=1e-15)


@pytest.mark.parametrize("cls", [GRR, OffByOneBlanket, OneDrawRepeated])
def test_dummies_follow_the_declared_law(cls: type[GRR]) -> None:
    """60,000 dummies (600 draws of 100) are i.i.d. with law 1/d per value (binomial z < 5 per value). Fails for
    the off-by-one sampler, and for the repeated draw (right marginal, but its counts spread like 600 draws)."""
    mech = cls(d=8, epsilon=1.0)
    rng = seeded_rng(11)
    draws = np.concatenate([mech.blanket_reports(100, rng)["value"] for _ in range(600)])
    assert mech.validate(structured(mech.report_dtype, value=draws)).all()
    if cls is not GRR:
        with pytest.raises(AssertionError):
            assert_counts_follow_law(np.bincount(draws, minlength=8), mech.blanket_law, draws.size)
    else:
        assert_counts_follow_law(np.bincount(draws, minlength=8), mech.blanket_law, draws.size)


def test_role_is_declared_not_probed() -> None:
    assert isinstance(GRR(d=4, epsilon=1.0), BlanketRandomizer)
    assert require_blanket(GRR(d=2, epsilon=1.0)).blanket_reports(0, seeded_rng(1)).size == 0
    for other in (OUE(d=4, epsilon=1.0), OLH(d=4, epsilon=1.0)):
        with pytest.raises(ValueError, match="no accounted blanket component"):
            require_blanket(other)
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="dummy reports"):
            GRR(d=4, epsilon=1.0).blanket_reports(bad, seeded_rng(1))  # type: ignore[arg-type]


# ---- (b) audits ----------------------------------------------------------------------------------------------


def exact_epsilon(mech: GRR, m: int, delta: float) -> float:
    """Worst pair's exact epsilon of (victim + m dummies of the mechanism's *declared* law), enumerated."""
    worst = 0.0
    for x, y in itertools.permutations(range(mech.d), 2):
        views = view_laws([mech.exact_output_distribution(x), mech.exact_output_distribution(y)], mech.blanket_law, m)
        worst = max(worst, brute_epsilon(*views, delta, mech.epsilon))
    return worst


def test_exact_audit_accepts_uniform_dummies_and_refutes_a_non_uniform_law() -> None:
    d, eps, m, delta = 3, 2.0, 6, 1e-3
    claim = GRR(d=d, epsilon=eps).blanket_epsilon(m, delta)
    assert exact_epsilon(GRR(d=d, epsilon=eps), m, delta) == pytest.approx(claim, abs=1e-12)
    broken = exact_epsilon(EncodedDefault(d=d, epsilon=eps), m, delta)
    assert broken > claim + 0.2, (broken, claim)


AUDIT_D, AUDIT_EPS, AUDIT_M, AUDIT_DELTA, AUDIT_RELEASES = 4, 2.0, 400, 1e-6, 20_000


def _count_pairs(mech: GRR, x: int, x0: int, x1: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """N releases (victim with value x + the mechanism's m dummies); counts at x0 and x1 of each."""
    at0, at1 = np.empty(AUDIT_RELEASES, np.int64), np.empty(AUDIT_RELEASES, np.int64)
    victims = mech.encode(np.full(AUDIT_RELEASES, x), rng)["value"]
    for i in range(AUDIT_RELEASES):
        values = mech.blanket_reports(AUDIT_M, rng)["value"]
        at0[i] = np.count_nonzero(values == x0) + (victims[i] == x0)
        at1[i] = np.count_nonzero(values == x1) + (victims[i] == x1)
    return at0, at1


def _difference_threshold(mech: GRR) -> int:
    """t maximising the audit's lower bound at the *expected* hit counts N P_x0[a - b >= t], N P_x1[a - b >= t],
    computed on the exact (a, b) law of the correct blanket before any sampling."""
    total, w = AUDIT_M + 1, 1.0 / mech.d
    a, b = np.meshgrid(np.arange(total + 1), np.arange(total + 1), indexing="ij")
    trin = binom_pmf(a, total, w) * binom_pmf(b, total - a, 1.0 / (mech.d - 1)) * mech.d / total
    p0 = trin * (mech.q * total + (mech.p - mech.q) * a)
    p1 = trin * (mech.q * total + (mech.p - mech.q) * b)
    def expected_bound(t: int) -> float:
        e0, e1 = (round(AUDIT_RELEASES * float(p[a - b >= t].sum())) for p in (p0, p1))
        return epsilon_lower_bound(e0, AUDIT_RELEASES, e1, AUDIT_RELEASES, AUDIT_DELTA, ALPHA / 2)

    return max(range(40), key=expected_bound)


@pytest.mark.slow
@pytest.mark.parametrize("cls", [GRR, OffByOneBlanket, NoDummies, OneDrawRepeated])
def test_empirical_audit_refutes_broken_blankets(cls: type[GRR]) -> None:
    """Victim 0 vs d - 1 among 400 dummies: the claim is 0.343. Two events (Bonferroni: each at ALPHA/2):
    "no report at d - 1" (what a missing or one-sided blanket exposes) and "count at 0 minus count at d - 1
    >= t". The correct blanket's lower bound stays below the claim; every broken one exceeds it."""
    mech = cls(d=AUDIT_D, epsilon=AUDIT_EPS)
    claim = GRR(d=AUDIT_D, epsilon=AUDIT_EPS).blanket_epsilon(AUDIT_M, AUDIT_DELTA)
    x0, x1 = 0, AUDIT_D - 1
    t = _difference_threshold(GRR(d=AUDIT_D, epsilon=AUDIT_EPS))
    rng = seeded_rng(2026)
    under0, under1 = _count_pairs(mech, x0, x0, x1, rng), _count_pairs(mech, x1, x0, x1, rng)
    bounds = []
    for event in (lambda c: c[1] == 0, lambda c: c[0] - c[1] >= t):
        hits0, hits1 = int(event(under0).sum()), int(event(under1).sum())
        bounds.append(epsilon_lower_bound(hits0, AUDIT_RELEASES, hits1, AUDIT_RELEASES, AUDIT_DELTA, ALPHA / 2))
    if cls is GRR:
        assert max(bounds) <= claim, (bounds, claim)
        # not vacuous: the event does separate x0 from x1 (far below the claim, which rests on events of
        # probability ~delta that 20,000 releases cannot see)
        assert bounds[1] > 0.01, bounds
    else:
        assert max(bounds) > claim + 0.5, (bounds, claim)


# ---- (d) the debiased estimator ------------------------------------------------------------------------------


def test_debiased_estimate_is_unbiased_with_the_closed_form_variance() -> None:
    """1,000 real GRR reports (d = 8, eps 2, a skewed histogram) + 4,000 dummies, 2,000 independent releases
    folded by the real accumulator. Per item: the mean estimate within 4.5 standard errors of the truth
    (Bonferroni over 8 items: P(miss) < 8 * 6.8e-6), and (R - 1) s^2 / sigma^2 inside its chi-square(R - 1)
    interval at 1e-5 per side per item, sigma^2 = closed form + 4000 (1/8)(7/8)/(p - q)^2. The dummies carry
    ~5/6 of the variance, so dropping their term or their mean fails by far more than the tolerance."""
    mech, n, m, reps = GRR(d=8, epsilon=2.0), 1000, 4000, 2000
    truth = np.array([400, 250, 150, 100, 50, 30, 20, 0])
    values = np.repeat(np.arange(8), truth)
    rng = seeded_rng(7)
    estimates = np.empty((reps, 8))
    stderrs = np.empty((reps, 8))
    for r in range(reps):
        acc = mech.new_accumulator()
        acc.add(mech.encode(values, rng))
        acc.add(mech.blanket_reports(m, rng))
        est = mech.blanket_estimate(acc.counts, acc.n, m)
        assert est.n == n and est.extras["blanket_dummies"] == m
        estimates[r], stderrs[r] = est.count, est.stderr * n
    gap = mech.p - mech.q
    sigma2 = rr_count_variance(truth, n, mech.p, mech.q) + m * (1 / 8) * (7 / 8) / gap**2
    mean = estimates.mean(axis=0)
    assert np.all(np.abs(mean - truth) < 4.5 * np.sqrt(sigma2 / reps)), (mean - truth) / np.sqrt(sigma2 / reps)
    ratio = (reps - 1) * estimates.var(axis=0, ddof=1) / sigma2
    low, high = chi2.ppf(1e-5, reps - 1), chi2.isf(1e-5, reps - 1)
    assert np.all((low < ratio) & (ratio < high)), ratio / (reps - 1)
    # the plug-in stderr is the closed form at the estimated counts: on average within 2% of the true sd
    np.testing.assert_allclose(np.sqrt((stderrs**2).mean(axis=0)), np.sqrt(sigma2), rtol=0.02)


def test_debias_refuses_impossible_releases() -> None:
    mech = GRR(d=4, epsilon=1.0)
    with pytest.raises(ValueError, match="no real report"):
        mech.blanket_estimate(np.array([3, 2, 0, 0]), 5, 5)
    with pytest.raises(ValueError, match="shape"):
        mech.blanket_estimate(np.array([3, 2, 0]), 10, 5)
    plain = mech.new_accumulator()
    plain.add(mech.encode(np.zeros(50, dtype=np.int64), seeded_rng(3)))
    np.testing.assert_allclose(mech.blanket_estimate(plain.counts, plain.n, 0).count, plain.estimate().count)
    assert math.isfinite(float(mech.blanket_estimate(plain.counts, plain.n, 0).stderr.sum()))
