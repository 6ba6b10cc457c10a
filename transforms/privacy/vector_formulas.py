"""Closed forms of [VecSum]'s single-message vector summation (docs/mathematics.md §4.1): the blanket probability gamma
and precision k_round that [VecSum] derives from a central target, the local budget of one message, its mixture
parameter alpha, and the per-report variances. Shared by the planner and the vector mechanism.

Notation of §4.1: d coordinates, t coordinates sampled per user, k = k_round (values 0..k), gamma = probability
that a reported value is replaced by a uniform one of the k + 1 values, eps = the CENTRAL epsilon ([VecSum] states
its rules in terms of the shuffled guarantee).
"""

from __future__ import annotations

import math

import numpy as np

from ._checks import check_delta, check_epsilon, check_int, check_real
from .mixture import alpha_grr

__all__ = [
    "EPS_002_LIMIT",
    "alpha_vector",
    "eps0_from_gamma",
    "gamma_002",
    "gamma_from_eps0",
    "k_round_002",
    "normalized_mse_bound_002",
    "report_variance",
    "report_variance_bound",
]

EPS_002_LIMIT = 6.0  # [VecSum]'s theorems cover eps < 1 and 1 <= eps < 6 only


def _regime(eps: float) -> bool:
    """True for eps < 1, False for 1 <= eps < 6; refuses eps >= 6 (no rule in [VecSum])."""
    if eps >= EPS_002_LIMIT:
        raise ValueError(f"[VecSum]'s parameter rules are stated for eps_c < {EPS_002_LIMIT:g}, got {eps:g}")
    return eps < 1.0


def _checked(d: int, n: int, eps: float, delta: float, t: int) -> tuple[int, int, float, float, int]:
    d, n = check_int("d", d, 1), check_int("n", n, 2)
    t = check_int("t", t, 1)
    if t > d:
        raise ValueError(f"t (coordinates per user) must be <= d, got t={t}, d={d}")
    return d, n, check_epsilon("eps", eps), check_delta("delta", delta), t


def gamma_002(d: int, k: int, n: int, eps: float, delta: float, t: int = 1) -> float:
    """[VecSum]'s blanket probability: §4.5 for t = 1 (no composition), Thm 4.1 (advanced composition) for t > 1.
    May exceed 1: the caller must refuse such a plan, never clamp it."""
    d, n, eps, delta, t = _checked(d, n, eps, delta, t)
    k = check_int("k", k, 1)
    small = _regime(eps)
    if t == 1:
        c1, c2 = (14.0, 27.0) if small else (80.0, 36.0)
        return max(c1 * d * k * math.log(2.0 / delta) / ((n - 1) * eps**2), c2 * d * k / ((n - 1) * eps))
    constant = 56.0 if small else 2016.0
    return constant * d * k * math.log(1.0 / delta) * math.log(2.0 * t / delta) / ((n - 1) * eps**2)


def k_round_002(d: int, n: int, eps: float, delta: float, t: int = 1) -> float:
    """[VecSum]'s continuous precision k* (round it to an integer >= 1 before use)."""
    d, n, eps, delta, t = _checked(d, n, eps, delta, t)
    small = _regime(eps)
    if t == 1:
        c1, c2 = (28.0, 54.0) if small else (160.0, 72.0)
        return min((n * eps**2 / (c1 * d * math.log(2.0 / delta))) ** (1 / 3), (n * eps / (c2 * d)) ** (1 / 3))
    a = 28.0 if small else 1008.0
    return ((n - 1) * eps**2 / (4.0 * a * d * math.log(1.0 / delta) * math.log(2.0 * t / delta))) ** (1 / 3)


def normalized_mse_bound_002(d: int, n: int, eps: float, delta: float, gamma: float, t: int = 1) -> float:
    """[VecSum]'s normalized-MSE bound (at its continuous k*), as re-derived in §4.1."""
    d, n, eps, delta, t = _checked(d, n, eps, delta, t)
    small = _regime(eps)
    scale = d ** (8 / 3) / ((1.0 - gamma) ** 2 * n ** (5 / 3))
    if t > 1:
        a = 28.0 if small else 1008.0
        logs = a * math.log(1 / delta) * math.log(2 * t / delta)
        return t * scale * 2 ** (1 / 3) * logs ** (2 / 3) / eps ** (4 / 3)
    log_term = math.log(2.0 / delta)
    if small:
        return scale * max(98 ** (1 / 3) * log_term ** (2 / 3) / eps ** (4 / 3), 18.0 / (4.0 * eps) ** (2 / 3))
    return scale * max(2.0 * (20.0 * log_term) ** (2 / 3) / eps ** (4 / 3), 2.0 * 9 ** (2 / 3) / eps ** (2 / 3))


def eps0_from_gamma(gamma: float, k: int) -> float:
    """Local budget of one report: (k + 1)-ary RR with blanket gamma, ``ln(1 + (k + 1)(1 - gamma)/gamma)``."""
    gamma = check_real("gamma", gamma)
    if not 0.0 < gamma < 1.0:
        raise ValueError(f"gamma must lie in (0, 1), got {gamma!r}")
    return math.log1p((check_int("k", k, 1) + 1) * (1.0 - gamma) / gamma)


def gamma_from_eps0(eps0: float, k: int) -> float:
    """Inverse of ``eps0_from_gamma``: gamma = (k + 1)/(e^eps0 + k)."""
    eps0 = check_epsilon("eps0", eps0)
    k = check_int("k", k, 1)
    return (k + 1) * math.exp(-eps0) / (1.0 + k * math.exp(-eps0))


def alpha_vector(eps0: float, k: int) -> float:
    """Mixture alpha of one [VecSum] report = gamma/(k + 1): the sampled coordinate is data-independent and the value
    goes through k-RR over k + 1 values (randomized rounding only randomises the k-RR input), so the k-RR alpha
    1/(e^eps0 + k) applies (§1.2 table)."""
    return alpha_grr(eps0, check_int("k", k, 1) + 1)


def report_variance(x: np.ndarray | float, k: int, gamma: float) -> np.ndarray | float:
    """Exact variance V(x) of one debiased report of value x in [0, 1] (§4.1, [D✓])."""
    x = np.asarray(x, dtype=float)
    f = x * k - np.floor(x * k)
    top = ((1 - gamma) * f * (1 - f) + gamma * (1 - gamma) * k * k * (x * x - x) + gamma * k * (2 * k + 1) / 6.0
           - gamma**2 * k * k / 4.0)
    out = top / (k * k * (1.0 - gamma) ** 2)
    return float(out) if out.ndim == 0 else out


def report_variance_bound(k: int, gamma: float) -> float:
    """[VecSum]'s per-report bound ``(1/(4k^2) + gamma/2)/(1 - gamma)^2`` (>= V(x) for every x in [0, 1])."""
    return (1.0 / (4.0 * k * k) + gamma / 2.0) / (1.0 - gamma) ** 2
