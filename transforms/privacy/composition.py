"""Composition tools (docs/mathematics.md §1.4) and post-processing composition of two randomizers (§1.4, §2.8).

Budgets are returned as ``(epsilon, delta)`` tuples. The post-processing formula is evaluated without ever
forming e^eps, because report fragmenting legitimately produces t * eps_f in the hundreds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ._checks import check_delta, check_epsilon, check_int, check_nonnegative

# Below this, e^eps is formed directly (accurate log1p form); above it the log-space form is exact enough
# (the result is then large, so an absolute rounding error of ~1e-13 is negligible relative to it).
_DIRECT_FORM_LIMIT = 30.0


def compose_post_processing(eps1: float, eps2: float) -> float:
    """Local epsilon of R2 o R1 for an eps1-DP R1 and an eps2-DP R2 ([ESA] Thm IV.1 / Cor. 2).

    ``ln((e^{eps1+eps2} + 1)/(e^{eps1} + e^{eps2}))`` <= min(eps1, eps2), tight for binary RR o binary RR.
    Small budgets use the identity ratio = 1 + (e^a - 1)(e^b - 1)/(e^a + e^b), scaled by e^-a (a >= b), which
    keeps full relative precision where the two logarithms of the log-space form would cancel; large budgets
    use ``logaddexp(eps1 + eps2, 0) - logaddexp(eps1, eps2)``, which cannot overflow.
    """
    a = check_nonnegative("eps1", eps1)
    b = check_nonnegative("eps2", eps2)
    a, b = max(a, b), min(a, b)
    if b <= _DIRECT_FORM_LIMIT:
        return math.log1p(-math.expm1(-a) * math.expm1(b) / (1.0 + math.exp(b - a)))
    return _logaddexp(a + b, 0.0) - _logaddexp(a, b)


def _logaddexp(x: float, y: float) -> float:
    """ln(e^x + e^y) without overflow."""
    high, low = max(x, y), min(x, y)
    return high + math.log1p(math.exp(low - high))


def fragment_epsilon(eps_b: float, eps_f: float, t: int) -> float:
    """Local epsilon against an adversary holding t fragments of report fragmenting ([ESA] Thm IV.1, §2.8).

    The t fragments are t independent eps_f-RR views of the same backstop output, together at most t*eps_f-DP
    as a post-processing of it, hence ``compose_post_processing(eps_b, t * eps_f)``; t = 0 gives 0.
    """
    eps_b = check_nonnegative("eps_b", eps_b)
    eps_f = check_nonnegative("eps_f", eps_f)
    t = check_int("t", t, 0)
    return compose_post_processing(eps_b, t * eps_f)


def basic_composition(budgets: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """(sum eps_i, sum delta_i): always valid, including adaptive composition of different mechanisms."""
    eps_total, delta_total = [], []
    for index, (eps, delta) in enumerate(budgets):
        eps_total.append(check_nonnegative(f"budgets[{index}].eps", eps))
        delta_total.append(check_nonnegative(f"budgets[{index}].delta", delta))
    return math.fsum(eps_total), math.fsum(delta_total)


def advanced_composition_drv(eps: float, delta: float, r: int, delta_slack: float) -> tuple[float, float]:
    """r-fold composition of (eps, delta) mechanisms, Dwork-Rothblum-Vadhan (used in [VecSum] Thm 4.2):
    ``(sqrt(2 r ln(1/slack)) eps + r eps (e^eps - 1), r delta + slack)``; beats basic composition when
    eps is small and r large, at the price of the extra slack delta."""
    eps = check_epsilon("eps", eps)
    delta = check_nonnegative("delta", delta)
    r = check_int("r", r, 1)
    slack = check_delta("delta_slack", delta_slack)
    epsilon = math.sqrt(2.0 * r * math.log(1.0 / slack)) * eps + r * eps * math.expm1(eps)
    return epsilon, r * delta + slack


def drv_step_epsilon(eps_total: float, r: int, delta_slack: float) -> float:
    """Per-step epsilon ``eps_total / (2 sqrt(2 r ln(1/slack)))`` that keeps r-fold DRV composition within
    eps_total ([VecSum] Cor. 4.3); the corollary needs eps_total < 1, so larger targets are refused."""
    eps_total = check_epsilon("eps_total", eps_total)
    if eps_total >= 1.0:
        raise ValueError(f"eps_total must be < 1 for [VecSum] Cor. 4.3, got {eps_total!r}")
    r = check_int("r", r, 1)
    slack = check_delta("delta_slack", delta_slack)
    return eps_total / (2.0 * math.sqrt(2.0 * r * math.log(1.0 / slack)))


def bun_steinke_composition(eps: float, delta: float, k: int, delta_prime: float) -> tuple[float, float]:
    """k-fold adaptive composition, Bun-Steinke form quoted as [ESA] Thm II.7:
    ``(k eps^2/2 + sqrt(k) eps sqrt(2 ln(sqrt(k pi/2) eps / delta')), delta' + k delta)``.

    The logarithm must be positive (sqrt(k pi/2) eps > delta'); otherwise the stated bound is undefined and
    basic composition should be used instead, so that case raises.
    """
    eps = check_epsilon("eps", eps)
    delta = check_nonnegative("delta", delta)
    k = check_int("k", k, 1)
    delta_prime = check_delta("delta_prime", delta_prime)
    log_term = math.log(math.sqrt(k * math.pi / 2.0) * eps / delta_prime)
    if log_term <= 0.0:
        raise ValueError(
            f"sqrt(k pi/2) * eps / delta_prime must exceed 1 (k={k}, eps={eps!r}, "
            f"delta_prime={delta_prime!r}); use basic_composition"
        )
    epsilon = k * eps * eps / 2.0 + math.sqrt(k) * eps * math.sqrt(2.0 * log_term)
    return epsilon, delta_prime + k * delta


def chain_composition(eps: float, delta: float, k: int) -> tuple[float, float]:
    """A change that decomposes into k elementary (eps, delta) changes (group privacy style, §1.4 [D]):
    ``(k eps, delta * sum_{i<k} e^{i eps})``. A delta of 1 or more is vacuous and is reported as 1.0."""
    eps = check_nonnegative("eps", eps)
    delta = check_nonnegative("delta", delta)
    k = check_int("k", k, 1)
    if delta == 0.0:
        return k * eps, 0.0
    # ln(sum_{i<k} e^{i eps}) = ln((e^{k eps} - 1)/(e^eps - 1)), or ln k when eps = 0.
    if eps == 0.0:
        log_sum = math.log(k)
    elif k * eps > _DIRECT_FORM_LIMIT:
        log_sum = k * eps + math.log1p(-math.exp(-k * eps)) - eps - math.log(-math.expm1(-eps))
    else:
        log_sum = math.log(math.expm1(k * eps) / math.expm1(eps))
    log_delta = math.log(delta) + log_sum
    return k * eps, 1.0 if log_delta >= 0.0 else math.exp(log_delta)
