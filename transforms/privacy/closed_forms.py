"""Closed-form amplification-by-shuffling bounds (docs/mathematics.md §1.3), for comparison only.

Each bound holds only under its own conditions. Outside them a number would be an extrapolation that looks
like a guarantee, so every function returns a ``ClosedForm`` whose ``epsilon`` is None and whose ``reason``
says which condition failed. The pipeline's own accountant is the tight bound of ``shuffle_bound``.
Composition tools (§1.4, §1.4, §2.8) live in ``composition`` and are re-exported here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ._checks import check_delta, check_epsilon, check_int, check_real

__all__ = [
    "ClosedForm",
    "blanket_collision",
    "blanket_krr",
    "blanket_min_gamma",
    "blanket_omega",
    "efmrtt19",
    "fmt21_clones",
    "lemma_ii5",
    "lemma_ii6",
    "lemma_ii6_rappor",
    "rappor_flip_lambda",
    "theorem_iii1",
]


@dataclass(frozen=True)
class ClosedForm:
    """A closed-form central epsilon, or None with the human-readable ``reason`` it does not apply."""

    name: str
    epsilon: float | None
    reason: str | None = None

    @property
    def valid(self) -> bool:
        return self.epsilon is not None


def _refuse(name: str, reason: str) -> ClosedForm:
    return ClosedForm(name=name, epsilon=None, reason=reason)


def efmrtt19(n: int, eps0: float, delta: float) -> ClosedForm:
    """EFMRTT19 (SODA'19) §1.3: ``12 eps0 sqrt(ln(1/delta)/n)`` for any eps0-LDP randomizer, valid only for
    eps0 < 1/2, n >= 1000, delta < 1/100 (the conditions of Erlingsson et al. SODA 2019)."""
    n = check_int("n", n, 2)
    eps0 = check_epsilon("eps0", eps0)
    delta = check_delta("delta", delta)
    name = "efmrtt19"
    if eps0 >= 0.5:
        return _refuse(name, f"requires eps0 < 1/2 (got eps0={eps0:g})")
    if n < 1000:
        return _refuse(name, f"requires n >= 1000 (got n={n})")
    if delta >= 0.01:
        return _refuse(name, f"requires delta < 1/100 (got delta={delta:g})")
    return ClosedForm(name, 12.0 * eps0 * math.sqrt(math.log(1.0 / delta) / n))


def blanket_omega(n: int, omega: float, delta: float, name: str = "blanket") -> ClosedForm:
    """Privacy blanket (Balle et al. CRYPTO'19) §1.3 in terms of Omega (= e^eps0 + k - 1 for k-RR):
    ``sqrt(14 ln(2/delta) Omega/(n-1))``, valid only if that is <= 1 and n - 1 >= 27 Omega / eps_c."""
    n = check_int("n", n, 2)
    omega = check_real("omega", omega)
    if omega <= 0.0:
        raise ValueError(f"omega must be > 0, got {omega!r}")
    delta = check_delta("delta", delta)
    eps_c = math.sqrt(14.0 * math.log(2.0 / delta) * omega / (n - 1))
    if eps_c > 1.0:
        return _refuse(name, f"requires eps_c <= 1 (formula gives {eps_c:.6g}; n too small for this Omega)")
    if n - 1 < 27.0 * omega / eps_c:
        return _refuse(name, f"requires n - 1 >= 27 Omega / eps_c = {27.0 * omega / eps_c:.6g} (got n={n})")
    return ClosedForm(name, eps_c)


def blanket_krr(n: int, eps0: float, k: int, delta: float) -> ClosedForm:
    """Blanket bound for shuffled k-ary randomized response with local budget eps0: Omega = e^eps0 + k - 1."""
    eps0 = check_epsilon("eps0", eps0)
    k = check_int("k", k, 2)
    return blanket_omega(n, math.exp(eps0) + k - 1, delta, name="blanket_krr")


def blanket_collision(n: int, eps: float, s: int, t: int, delta: float) -> ClosedForm:
    """[Collision] Thm 3: the blanket bound applied to Collision with Omega = s e^eps + t - s (sqrt over everything
    and the validity n >= 27 Omega/eps_c + 1; [Collision] prints the k-RR case s = 1 of both)."""
    eps = check_epsilon("eps", eps)
    s = check_int("s", s, 1)
    t = check_int("t", t, s + 1)
    return blanket_omega(n, s * math.exp(eps) + t - s, delta, name="blanket_collision")


def blanket_min_gamma(n: int, k: int, eps_c: float, delta: float) -> float:
    """Smallest blanket probability gamma (replace the input by a uniform value of [k]) that makes shuffled
    k-RR (eps_c, delta)-DP: ``max(14 k ln(2/delta)/((n-1) eps_c^2), 27 k/((n-1) eps_c))``, for eps_c <= 1.
    A result above 1 means the target is infeasible for this n (callers must refuse, not clamp)."""
    n = check_int("n", n, 2)
    k = check_int("k", k, 2)
    eps_c = check_epsilon("eps_c", eps_c)
    if eps_c > 1.0:
        raise ValueError(f"the blanket theorem is stated for eps_c <= 1, got {eps_c!r}")
    delta = check_delta("delta", delta)
    return max(14.0 * k * math.log(2.0 / delta) / ((n - 1) * eps_c**2), 27.0 * k / ((n - 1) * eps_c))


def lemma_ii5(n: int, eps0: float, delta: float) -> ClosedForm:
    """[ESA] Lemma II.5 (Balle et al. Cor. 5.3.1) is O((e^eps0 - 1) sqrt(ln(1/delta)/n)) without a constant, so
    no number can be derived from it; arguments are still validated so that misuse fails loudly."""
    check_int("n", n, 2)
    check_epsilon("eps0", eps0)
    check_delta("delta", delta)
    return _refuse("lemma_ii5", "asymptotic only (no constant); use the tight bound")


def rappor_flip_lambda(n: int, eps: float) -> float:
    """lambda = 2n/(1 + e^eps): the expected number of flipped bits, times two, when each of n bits is flipped
    with probability 1/(1 + e^eps) (attribute-fragmented k-RAPPOR, §2.7); written 2n e^-eps/(1 + e^-eps)."""
    n = check_int("n", n, 2)
    eps = check_epsilon("eps", eps)
    tail = math.exp(-eps)
    return 2.0 * n * tail / (1.0 + tail)


def lemma_ii6(n: int, lam: float, delta: float) -> ClosedForm:
    """[ESA] Lemma II.6 (Cheu et al. Cor. 17) for n bits each flipped w.p. lambda/(2n):
    ``lambda' = lambda - sqrt(2 lambda ln(2/delta))``,
    ``eps_c = sqrt(32 ln(4/delta)/lambda') (1 - lambda'/n)``, valid for lambda in [14 ln(4/delta), n].
    This exact form, not Thm III.1, reproduces [ESA]'s tables."""
    n = check_int("n", n, 2)
    lam = check_real("lam", lam)
    delta = check_delta("delta", delta)
    name = "lemma_ii6"
    lower = 14.0 * math.log(4.0 / delta)
    if lam < lower:
        return _refuse(name, f"requires lambda >= 14 ln(4/delta) = {lower:.6g} (got lambda={lam:.6g})")
    if lam > n:
        return _refuse(name, f"requires lambda <= n = {n} (got lambda={lam:.6g})")
    lam_prime = lam - math.sqrt(2.0 * lam * math.log(2.0 / delta))
    return ClosedForm(name, math.sqrt(32.0 * math.log(4.0 / delta) / lam_prime) * (1.0 - lam_prime / n))


def lemma_ii6_rappor(n: int, eps: float, delta: float) -> ClosedForm:
    """Lemma II.6 for one channel of attribute-fragmented k-RAPPOR with removal budget eps, i.e.
    lambda = 2n/(1 + e^eps); removal central DP (replacement touches two channels: compose)."""
    return lemma_ii6(n, rappor_flip_lambda(n, eps), delta)


def theorem_iii1(n: int, eps: float, delta: float) -> ClosedForm:
    """[ESA] Thm III.1: ``sqrt(64 e^eps ln(4/delta)/n)``, a ~2x looser simplification of Lemma II.6, valid for
    eps in [1, ln n - ln(14 ln(4/delta))] and delta >= n^(-ln n)."""
    n = check_int("n", n, 2)
    eps = check_epsilon("eps", eps)
    delta = check_delta("delta", delta)
    name = "theorem_iii1"
    upper = math.log(n) - math.log(14.0 * math.log(4.0 / delta))
    if eps < 1.0:
        return _refuse(name, f"requires eps >= 1 (got eps={eps:g})")
    if eps > upper:
        return _refuse(name, f"requires eps <= ln n - ln(14 ln(4/delta)) = {upper:.6g} (got eps={eps:g})")
    if math.log(delta) < -(math.log(n) ** 2):
        return _refuse(name, f"requires delta >= n^(-ln n) (got delta={delta:g})")
    return ClosedForm(name, math.sqrt(64.0 * math.exp(eps) * math.log(4.0 / delta) / n))


def fmt21_clones(n: int, eps0: float, delta: float) -> ClosedForm:
    """Feldman-McMillan-Talwar FOCS'21 "hiding among the clones" closed form (§1.3), any eps0-LDP randomizer,
    valid for eps0 <= ln(n/(16 ln(4/delta))). A comparison baseline; looser than the tight bound."""
    n = check_int("n", n, 2)
    eps0 = check_epsilon("eps0", eps0)
    delta = check_delta("delta", delta)
    name = "fmt21_clones"
    limit = math.log(n / (16.0 * math.log(4.0 / delta)))
    if eps0 > limit:
        return _refuse(name, f"requires eps0 <= ln(n/(16 ln(4/delta))) = {limit:.6g} (got eps0={eps0:g})")
    a = 8.0 * math.sqrt(math.exp(eps0) * math.log(4.0 / delta) / n)
    c = 8.0 * math.exp(eps0) / n
    e = math.log1p(a + c)
    return ClosedForm(name, math.log1p((-math.expm1(-eps0)) / (1.0 + math.exp(-eps0 - e)) * (a + c)))
