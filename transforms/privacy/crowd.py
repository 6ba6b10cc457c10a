"""Crowd thresholding with randomized report deletion ([ESA] Alg. 3, Thm V.1, V.2; docs/mathematics.md §1.5).

The shuffler releases crowd i with ``n_hat = max(n_i + L - T, 0)`` reports, L a Laplace-like noise of scale
2/eps_cr and T the threshold below, and aborts the release if n_hat > n_i. Replacing one user changes two
crowd sizes by one each, so each crowd is handled at (eps_cr/2, delta_cr/2) and the released sizes are
(eps_cr, delta_cr)-DP (Thm V.1). These functions give the shuffler its parameters and the tests their
expected moments.
"""

from __future__ import annotations

import math

from ._checks import check_delta, check_epsilon, check_int


def crowd_threshold(eps_cr: float, delta_cr: float) -> float:
    """T = (2/eps_cr) ln(2/delta_cr): the shift that makes the noisy size exceed the true size (an abort,
    i.e. the delta event) with probability at most delta_cr/4 per crowd."""
    eps_cr = check_epsilon("eps_cr", eps_cr)
    delta_cr = check_delta("delta_cr", delta_cr)
    return 2.0 / eps_cr * math.log(2.0 / delta_cr)


def deletion_variance(eps_cr: float) -> float:
    """Var of the number of deleted reports, 8/eps_cr^2 = 2 (2/eps_cr)^2 (variance of Lap(2/eps_cr)); exact
    when the crowd is large enough that the clip at 0 never acts (n_i > T + 10 (2/eps_cr))."""
    eps_cr = check_epsilon("eps_cr", eps_cr)
    return 8.0 / eps_cr**2


def abort_probability(eps_cr: float, delta_cr: float) -> float:
    """Pr[L > T] = exp(-T eps_cr/2)/2 = delta_cr/4 for L ~ Lap(2/eps_cr): the per-crowd abort probability
    accounted by Thm V.1. Rounding n_hat down only shrinks it (an abort then needs L >= T + 1), so this is an
    upper bound on the implemented mechanism's abort rate."""
    threshold = crowd_threshold(eps_cr, delta_cr)
    return 0.5 * math.exp(-threshold * eps_cr / 2.0)


def max_loss_bound(eps_cr: float, delta_cr: float, crowds: int) -> float:
    """Thm V.2: with probability >= 1 - delta_cr every one of the P = ``crowds`` crowds loses at most
    (4/eps_cr) ln(2P/delta_cr) reports (T plus a union bound over the P Laplace lower tails)."""
    eps_cr = check_epsilon("eps_cr", eps_cr)
    delta_cr = check_delta("delta_cr", delta_cr)
    crowds = check_int("crowds", crowds, 1)
    return 4.0 / eps_cr * math.log(2.0 * crowds / delta_cr)


def discrete_laplace_scale(eps_cr: float) -> float:
    """Parameter q = exp(-eps_cr/2) of the two-sided geometric ("discrete Laplace") noise the shuffler uses.

    The shuffler samples L = G1 - G2 with G1, G2 independent Geometric(1 - q) counts of failures
    (Pr[G = k] = (1 - q) q^k), so Pr[L = k] = (1 - q)/(1 + q) q^|k|. Shifting a count by one changes any
    Pr[L = k] by a factor at most 1/q = e^{eps_cr/2}, hence the noisy size of a sensitivity-1 count is
    eps_cr/2-DP: exactly the per-crowd budget Thm V.1 needs (two crowds change per replacement). Integer noise
    avoids the floating-point Laplace attacks on the low-order bits (docs/mathematics.md §1.5). Its upper tail
    Pr[L >= T] <= q^T/(1 + q) = delta_cr/(2(1 + q)) < delta_cr/2 keeps the delta side of Thm V.1 as well.
    """
    eps_cr = check_epsilon("eps_cr", eps_cr)
    return math.exp(-eps_cr / 2.0)


def discrete_laplace_variance(eps_cr: float) -> float:
    """Var of the two-sided geometric noise with q = exp(-eps_cr/2): 2q/(1 - q)^2, slightly below the
    8/eps_cr^2 of the continuous Laplace it replaces: the deletion variance the shuffler actually realises."""
    q = discrete_laplace_scale(eps_cr)
    return 2.0 * q / (-math.expm1(-eps_cr / 2.0)) ** 2
