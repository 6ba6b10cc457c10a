"""Closed forms (docs/mathematics.md §1.3) against [ESA]'s tables and regression values, and their refusals
outside validity."""

from __future__ import annotations

import math

import pytest

from transforms.privacy.closed_forms import (
    ClosedForm,
    blanket_collision,
    blanket_krr,
    blanket_min_gamma,
    blanket_omega,
    efmrtt19,
    fmt21_clones,
    lemma_ii5,
    lemma_ii6,
    lemma_ii6_rappor,
    rappor_flip_lambda,
    theorem_iii1,
)
from transforms.privacy.mixture import alpha_generic, alpha_grr
from transforms.privacy.shuffle_bound import epsilon_central

# (n, delta, eps, Lemma II.6 eps_c, Thm III.1 eps_c); [ESA]'s tables, reproduced by Lemma II.6.
TABLE_11_1 = [
    (1_914_589, 5e-8, 2.94, 0.04992, 0.10727),
    (1_914_589, 5e-8, 8.55, 1.00177, 1.77283),
    (236_559_063, 5e-10, 7.385, 0.05012, 0.09971),
    (236_559_063, 5e-10, 13.14, 1.00189, 1.77185),
    (50_409_435, 5e-9, 10.435, 0.50036, 0.94112),
    (203_950_512, 5e-10, 1.78, 0.00251, 0.00651),
    (203_950_512, 5e-10, 12.99, 1.00093, 1.77037),
]


def refused(form: ClosedForm, fragment: str) -> bool:
    return form.epsilon is None and not form.valid and form.reason is not None and fragment in form.reason


# The printed values carry 5 decimals (3 significant digits for the heavy-hitter row), hence rel 2e-4 or
# half a unit of the last printed decimal, whichever is larger.
@pytest.mark.parametrize(("n", "delta", "eps", "lemma", "theorem"), TABLE_11_1)
def test_table_11_1(n: int, delta: float, eps: float, lemma: float, theorem: float) -> None:
    lemma_form, theorem_form = lemma_ii6_rappor(n, eps, delta), theorem_iii1(n, eps, delta)
    assert lemma_form.name == "lemma_ii6" and theorem_form.name == "theorem_iii1"
    assert lemma_form.epsilon == pytest.approx(lemma, rel=2e-4, abs=5e-6)
    assert theorem_form.epsilon == pytest.approx(theorem, rel=2e-4, abs=5e-6)
    assert theorem_form.epsilon > lemma_form.epsilon  # Thm III.1 is the looser simplification


def test_lemma_ii6_formula_by_hand() -> None:
    n, eps, delta = 10**6, 3.0, 1e-8
    lam = 2 * n / (1 + math.exp(eps))
    assert rappor_flip_lambda(n, eps) == pytest.approx(lam, rel=1e-14)
    lam_prime = lam - math.sqrt(2 * lam * math.log(2 / delta))
    expected = math.sqrt(32 * math.log(4 / delta) / lam_prime) * (1 - lam_prime / n)
    assert lemma_ii6(n, lam, delta).epsilon == pytest.approx(expected, rel=1e-14)


def test_lemma_ii6_refusals() -> None:
    delta = 1e-6
    lower = 14 * math.log(4 / delta)
    assert refused(lemma_ii6(10**4, lower * 0.99, delta), "lambda >= 14 ln(4/delta)")
    assert lemma_ii6(10**4, lower, delta).valid
    assert refused(lemma_ii6(10**4, 10**4 + 1, delta), "lambda <= n")
    assert refused(lemma_ii6_rappor(10**4, 6.0, delta), "lambda >= 14 ln(4/delta)")  # eps too large for n


def test_theorem_iii1_refusals() -> None:
    assert refused(theorem_iii1(10**6, 0.9, 1e-6), "eps >= 1")
    assert refused(theorem_iii1(10**6, 9.0, 1e-6), "eps <= ln n - ln(14 ln(4/delta))")
    # n^(-ln n) = e^-190.9 for n = 1e6; delta = 1e-200 is below it while eps = 2 is in range.
    assert refused(theorem_iii1(10**6, 2.0, 1e-200), "delta >= n^(-ln n)")


def test_section_11_4_closed_forms() -> None:
    assert blanket_krr(10**4, 2.0, 10, 1e-4).epsilon == pytest.approx(0.476713, abs=1e-6)
    assert efmrtt19(10**4, 0.4, 1e-4).epsilon == pytest.approx(0.145673, abs=1e-6)


def test_closed_forms_are_looser_than_the_tight_bound() -> None:
    n, delta = 10**4, 1e-4
    assert blanket_krr(n, 2.0, 10, delta).epsilon > epsilon_central(n, alpha_grr(2.0, 10), 2.0, delta)
    assert efmrtt19(n, 0.4, delta).epsilon > epsilon_central(n, alpha_generic(0.4), 0.4, delta)
    assert fmt21_clones(n, 1.0, delta).epsilon > epsilon_central(n, alpha_generic(1.0), 1.0, delta)


def test_efmrtt19_refusals() -> None:
    assert refused(efmrtt19(10**4, 1.0, 1e-4), "eps0 < 1/2")
    assert refused(efmrtt19(999, 0.4, 1e-4), "n >= 1000")
    assert refused(efmrtt19(10**4, 0.4, 0.05), "delta < 1/100")


def test_blanket_forms() -> None:
    n, delta = 10**5, 1e-6
    omega = math.exp(1.5) + 20 - 1
    expected = math.sqrt(14 * math.log(2 / delta) * omega / (n - 1))
    assert blanket_omega(n, omega, delta).epsilon == pytest.approx(expected, rel=1e-14)
    assert blanket_krr(n, 1.5, 20, delta).epsilon == pytest.approx(expected, rel=1e-14)
    collision = blanket_collision(n, 1.5, 4, 30, delta)
    assert collision.name == "blanket_collision"
    assert collision.epsilon == pytest.approx(
        math.sqrt(14 * math.log(2 / delta) * (4 * math.exp(1.5) + 26) / (n - 1))
    )
    # Collision with s = 1 is OLH, i.e. k-RR over t values.
    assert blanket_collision(n, 1.5, 1, 20, delta).epsilon == pytest.approx(
        blanket_krr(n, 1.5, 20, delta).epsilon
    )


def test_blanket_refusals() -> None:
    assert refused(blanket_krr(1000, 2.0, 10, 1e-6), "eps_c <= 1")
    # With delta = 0.9 the size condition binds before eps_c <= 1: eps_c = 0.6 needs n - 1 >= 27 Omega/0.6.
    omega = math.e + 1.0
    n = round(14 * math.log(2 / 0.9) * omega / 0.6**2) + 1
    assert refused(blanket_omega(n, omega, 0.9), "n - 1 >= 27 Omega / eps_c")


def test_blanket_min_gamma_inverts_blanket_krr() -> None:
    n, eps0, k, delta = 10**4, 2.0, 10, 1e-4
    eps_c = blanket_krr(n, eps0, k, delta).epsilon
    assert eps_c is not None
    gamma = k / (math.exp(eps0) + k - 1)  # the blanket probability of k-RR
    assert blanket_min_gamma(n, k, eps_c, delta) == pytest.approx(gamma, rel=1e-12)
    with pytest.raises(ValueError, match="eps_c <= 1"):
        blanket_min_gamma(n, k, 1.5, delta)


def test_fmt21_clones_formula_and_refusal() -> None:
    n, eps0, delta = 10**5, 2.0, 1e-6
    a = 8 * math.sqrt(math.exp(eps0) * math.log(4 / delta) / n)
    c = 8 * math.exp(eps0) / n
    e = math.log(1 + a + c)
    expected = math.log(1 + (1 - math.exp(-eps0)) / (1 + math.exp(-eps0 - e)) * (a + c))
    assert fmt21_clones(n, eps0, delta).epsilon == pytest.approx(expected, rel=1e-13)
    limit = math.log(n / (16 * math.log(4 / delta)))
    assert fmt21_clones(n, limit, delta).valid
    assert refused(fmt21_clones(n, limit + 0.01, delta), "eps0 <= ln(n/(16 ln(4/delta)))")


def test_lemma_ii5_is_asymptotic_only() -> None:
    form = lemma_ii5(10**6, 1.0, 1e-6)
    assert form == ClosedForm("lemma_ii5", None, "asymptotic only (no constant); use the tight bound")
    with pytest.raises(ValueError, match="delta"):
        lemma_ii5(10**6, 1.0, 2.0)


def test_closed_form_arguments_are_validated() -> None:
    with pytest.raises(ValueError, match="n must be an integer >= 2"):
        efmrtt19(1, 0.1, 1e-6)
    with pytest.raises(ValueError, match=r"delta must lie in \(0, 1\)"):
        theorem_iii1(10**6, 2.0, 0.0)
    with pytest.raises(ValueError, match="omega must be > 0"):
        blanket_omega(100, -1.0, 1e-6)
    with pytest.raises(ValueError, match="t must be an integer >= 5"):
        blanket_collision(100, 1.0, 4, 4, 1e-6)
