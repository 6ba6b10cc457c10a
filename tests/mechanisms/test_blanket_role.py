"""The blanket role of GRR and OUE: the declared law is the randomizer's input-independent component, the dummies
follow it, the privacy claim survives audits that refute broken blankets, and the debiased estimator is unbiased
with its closed-form variance.

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
from transforms.mechanisms.frequency.blanket import BlanketRandomizer, require_blanket
from transforms.mechanisms.frequency.counting import rr_count_variance, structured
from transforms.mechanisms.frequency.hadamard import HadamardResponse
from transforms.mechanisms.frequency.oracles import GRR, OLH, OUE
from transforms.mechanisms.frequency.unary import AttributeFragmentedRappor
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

    def blanket_output_distribution(self) -> np.ndarray:
        return self.exact_output_distribution(0)

    def blanket_reports(self, m: int, rng: Randomness) -> np.ndarray:
        return self.encode(np.zeros(m, dtype=np.int64), rng)


class OUEEncodedDefault(OUE):
    """OUE's dummies encoded from a default value 0 (declared consistently): bit 0 is a fair coin in every dummy."""

    def blanket_output_distribution(self) -> np.ndarray:
        return self.exact_output_distribution(0)

    def blanket_reports(self, m: int, rng: Randomness) -> np.ndarray:
        return self.encode(np.zeros(m, dtype=np.int64), rng)


class OUELastBitNeverSet(OUE):
    """Bits of columns 0 .. d-2 only: the last column gets no blanket."""

    def blanket_reports(self, m: int, rng: Randomness) -> np.ndarray:
        bits = rng.random((m, self.d)) < self.q
        bits[:, -1] = False
        return structured(self.report_dtype, bits=np.packbits(bits, axis=1))


class OUENoDummies(OUE):
    def blanket_reports(self, m: int, rng: Randomness) -> np.ndarray:
        return structured(self.report_dtype, bits=np.zeros((0, self.n_bytes), dtype=np.uint8))


def _indicator(mech: GRR | OUE, reports: np.ndarray, v: int) -> np.ndarray:
    """Whether each report counts towards item v in the mechanism's accumulator."""
    if isinstance(mech, OUE):
        return np.unpackbits(reports["bits"], axis=1)[:, v] == 1
    return reports["value"] == v


def _outcome(mech: GRR | OUE, reports: np.ndarray) -> np.ndarray:
    """Index of each report in ``exact_output_distribution`` (value, or bit pattern with bit j = item j)."""
    if isinstance(mech, OUE):
        return np.unpackbits(reports["bits"], axis=1)[:, : mech.d] @ (1 << np.arange(mech.d))
    return reports["value"]


# ---- the role ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("d", "eps"), [(2, 0.5), (4, 2.0), (64, 4.0)])
def test_grr_declared_law_is_the_uniform_component_of_every_output(d: int, eps: float) -> None:
    """R(v) - gamma B is (1 - gamma) at v and 0 elsewhere: B really is the input-independent part."""
    mech = GRR(d=d, epsilon=eps)
    gamma, law = mech.blanket_weight, mech.blanket_output_distribution()
    assert gamma == pytest.approx(d * mech.q, rel=1e-12) and law.sum() == pytest.approx(1.0)
    np.testing.assert_array_equal(mech.blanket_cell_probability, law)
    for v in range(d):
        rest = mech.exact_output_distribution(v) - gamma * law
        want = np.zeros(d)
        want[v] = 1.0 - gamma
        np.testing.assert_allclose(rest, want, atol=1e-15)


@pytest.mark.parametrize(("d", "eps"), [(2, 0.5), (5, 2.0), (8, 4.0)])
def test_oue_declared_law_is_the_independent_component_of_every_output(d: int, eps: float) -> None:
    """R(v) - gamma B = (1 - gamma) x (bit v set, every other bit Bern(q)): nothing of B depends on v."""
    mech = OUE(d=d, epsilon=eps)
    gamma, law, q = mech.blanket_weight, mech.blanket_output_distribution(), mech.q
    assert gamma == pytest.approx(1.0 / (2.0 * (1.0 - q)), rel=1e-12) and law.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(mech.blanket_cell_probability, q)
    patterns = (np.arange(2**d)[:, None] >> np.arange(d)[None, :]) & 1
    for v in range(d):
        others = np.prod(np.where(np.delete(patterns, v, axis=1) == 1, q, 1 - q), axis=1)
        want = (1.0 - gamma) * np.where(patterns[:, v] == 1, others, 0.0)
        np.testing.assert_allclose(mech.exact_output_distribution(v) - gamma * law, want, atol=1e-15)


@pytest.mark.parametrize("mech", [GRR(d=8, epsilon=1.0), OffByOneBlanket(d=8, epsilon=1.0),
                                  OneDrawRepeated(d=8, epsilon=1.0), OUE(d=3, epsilon=1.0),
                                  OUELastBitNeverSet(d=3, epsilon=1.0)], ids=lambda m: type(m).__name__)
def test_dummies_follow_the_declared_law(mech: GRR | OUE) -> None:
    """60,000 dummies (600 draws of 100) are i.i.d. with the declared law over the outputs (binomial z < 5 per
    outcome). Fails for the off-by-one samplers, and for the repeated draw (right marginal, but its counts
    spread like 600 draws)."""
    rng = seeded_rng(11)
    draws = [mech.blanket_reports(100, rng) for _ in range(600)]
    assert all(mech.validate(r).all() and len(r) == 100 for r in draws)
    outcomes = np.concatenate([_outcome(mech, r) for r in draws])
    law = mech.blanket_output_distribution()
    freq = np.bincount(outcomes, minlength=law.size)
    if type(mech) in (GRR, OUE):
        assert_counts_follow_law(freq, law, outcomes.size)
    else:
        with pytest.raises(AssertionError):
            assert_counts_follow_law(freq, law, outcomes.size)


def test_role_is_declared_not_probed() -> None:
    assert isinstance(GRR(d=4, epsilon=1.0), BlanketRandomizer) and isinstance(OUE(d=4, epsilon=1.0), BlanketRandomizer)
    assert require_blanket(GRR(d=2, epsilon=1.0)).blanket_reports(0, seeded_rng(1)).size == 0
    assert require_blanket(OUE(d=9, epsilon=1.0)).blanket_reports(0, seeded_rng(1)).shape == (0,)
    others = (OLH(d=4, epsilon=1.0), HadamardResponse(d=4, epsilon=1.0), AttributeFragmentedRappor(d=4, epsilon=1.0))
    for other in others:
        with pytest.raises(ValueError, match="no accounted blanket component"):
            require_blanket(other)
    for bad in (-1, 2.5, True):
        for mech in (GRR(d=4, epsilon=1.0), OUE(d=4, epsilon=1.0)):
            with pytest.raises(ValueError, match="dummy reports"):
                mech.blanket_reports(bad, seeded_rng(1))  # type: ignore[arg-type]


# ---- (b) audits ----------------------------------------------------------------------------------------------


def exact_epsilon(mech: GRR | OUE, m: int, delta: float) -> float:
    """Worst pair's exact epsilon of (victim + m dummies of the mechanism's *declared* law), enumerated over
    every multiset of outputs (values, or whole bit patterns)."""
    worst = 0.0
    for x, y in itertools.permutations(range(mech.d), 2):
        laws = [mech.exact_output_distribution(x), mech.exact_output_distribution(y)]
        views = view_laws(laws, mech.blanket_output_distribution(), m)
        worst = max(worst, brute_epsilon(*views, delta, mech.epsilon))
    return worst


@pytest.mark.parametrize(("cls", "broken", "d", "m"), [(GRR, EncodedDefault, 3, 6), (OUE, OUEEncodedDefault, 3, 3)])
def test_exact_audit_accepts_the_blanket_and_refutes_a_non_blanket_law(cls: type, broken: type, d: int, m: int) -> None:
    eps, delta = 2.0, 1e-3
    claim = cls(d=d, epsilon=eps).blanket_epsilon(m, delta)
    assert exact_epsilon(cls(d=d, epsilon=eps), m, delta) == pytest.approx(claim, abs=1e-12)
    refuted = exact_epsilon(broken(d=d, epsilon=eps), m, delta)
    assert refuted > claim + 0.1, (refuted, claim)


AUDIT_D, AUDIT_EPS, AUDIT_M, AUDIT_DELTA, AUDIT_RELEASES = 4, 2.0, 400, 1e-6, 20_000


def _count_pairs(mech: GRR | OUE, x: int, x0: int, x1: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """N releases (victim with value x + the mechanism's m dummies); the counts at x0 and x1 of each."""
    at0, at1 = np.empty(AUDIT_RELEASES, np.int64), np.empty(AUDIT_RELEASES, np.int64)
    victims = mech.encode(np.full(AUDIT_RELEASES, x), rng)
    v0, v1 = _indicator(mech, victims, x0), _indicator(mech, victims, x1)
    for i in range(AUDIT_RELEASES):
        dummies = mech.blanket_reports(AUDIT_M, rng)
        at0[i] = np.count_nonzero(_indicator(mech, dummies, x0)) + v0[i]
        at1[i] = np.count_nonzero(_indicator(mech, dummies, x1)) + v1[i]
    return at0, at1


def _difference_threshold(mech: GRR | OUE) -> int:
    """t maximising the audit's lower bound at the *expected* hit counts N P_x0[a - b >= t], N P_x1[a - b >= t],
    computed on the exact (a, b) law of the correct blanket before any sampling (GRR: counts of the two values
    among uniform dummies; OUE: set bits of the two columns, independent Bern(q) in the dummies)."""
    total = AUDIT_M + 1
    a, b = np.meshgrid(np.arange(total + 1), np.arange(total + 1), indexing="ij")
    if isinstance(mech, OUE):
        joint = binom_pmf(a, total, mech.q) * binom_pmf(b, total, mech.q) / total
        weight0 = a / (2 * mech.q) + (total - a) / (2 * (1 - mech.q))
        weight1 = b / (2 * mech.q) + (total - b) / (2 * (1 - mech.q))
    else:
        joint = binom_pmf(a, total, 1 / mech.d) * binom_pmf(b, total - a, 1 / (mech.d - 1)) * mech.d / total
        weight0, weight1 = (mech.q * total + (mech.p - mech.q) * c for c in (a, b))
    p0, p1 = joint * weight0, joint * weight1
    assert p0.sum() == pytest.approx(1.0) and p1.sum() == pytest.approx(1.0)

    def expected_bound(t: int) -> float:
        e0, e1 = (round(AUDIT_RELEASES * float(p[a - b >= t].sum())) for p in (p0, p1))
        return epsilon_lower_bound(e0, AUDIT_RELEASES, e1, AUDIT_RELEASES, AUDIT_DELTA, ALPHA / 2)

    return max(range(40), key=expected_bound)


@pytest.mark.slow
@pytest.mark.parametrize("cls", [GRR, OffByOneBlanket, NoDummies, OneDrawRepeated, OUE, OUELastBitNeverSet,
                                 OUENoDummies])
def test_empirical_audit_refutes_broken_blankets(cls: type) -> None:
    """Victim 0 vs d - 1 among 400 dummies (d = 4, eps 2, delta 1e-6: the claim is 0.343 for GRR, 0.325 for
    OUE). Two events (Bonferroni: each at ALPHA/2), fixed before sampling: "nothing counts at d - 1" (what a
    missing or one-sided blanket exposes) and "count at 0 minus count at d - 1 >= t". The correct blankets'
    lower bounds stay below the claim; every broken one exceeds it."""
    mech = cls(d=AUDIT_D, epsilon=AUDIT_EPS)
    correct = (OUE if isinstance(mech, OUE) else GRR)(d=AUDIT_D, epsilon=AUDIT_EPS)
    claim = correct.blanket_epsilon(AUDIT_M, AUDIT_DELTA)
    x0, x1 = 0, AUDIT_D - 1
    t = _difference_threshold(correct)
    rng = seeded_rng(2026)
    under0, under1 = _count_pairs(mech, x0, x0, x1, rng), _count_pairs(mech, x1, x0, x1, rng)
    bounds = []
    for event in (lambda c: c[1] == 0, lambda c: c[0] - c[1] >= t):
        hits0, hits1 = int(event(under0).sum()), int(event(under1).sum())
        bounds.append(epsilon_lower_bound(hits0, AUDIT_RELEASES, hits1, AUDIT_RELEASES, AUDIT_DELTA, ALPHA / 2))
    if cls in (GRR, OUE):
        assert max(bounds) <= claim, (bounds, claim)
        # not vacuous: the event does separate x0 from x1 (far below the claim, which rests on events of
        # probability ~delta that 20,000 releases cannot see)
        assert bounds[1] > 0.01, bounds
    else:
        assert max(bounds) > claim + 0.1, (bounds, claim)


# ---- (d) the debiased estimator ------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [GRR, OUE])
def test_debiased_estimate_is_unbiased_with_the_closed_form_variance(cls: type) -> None:
    """1,000 real reports (d = 8, eps 2, a skewed histogram) + 4,000 dummies, 2,000 independent releases folded
    by the real accumulator. Per item: the mean estimate within 4.5 standard errors of the truth (Bonferroni
    over 8 items: P(miss) < 8 * 6.8e-6), and (R - 1) s^2 / sigma^2 inside its chi-square(R - 1) interval at
    1e-5 per side per item, sigma^2 = closed form + 4000 B (1 - B)/(p - q)^2 (B = 1/8 for GRR, q for OUE).
    The dummies carry most of the variance (5/6 for GRR, 3/4 for OUE), so dropping their term or their mean
    fails by far more than the tolerance."""
    mech, n, m, reps = cls(d=8, epsilon=2.0), 1000, 4000, 2000
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
    cell = 1 / 8 if cls is GRR else mech.q
    sigma2 = rr_count_variance(truth, n, mech.p, mech.q) + m * cell * (1 - cell) / gap**2
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
