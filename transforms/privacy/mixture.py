"""Mixture parameters alpha of local randomizers (docs/mathematics.md §1.2).

A randomizer has mixture parameters (eps, alpha) when any two of its output distributions share the
decomposition of §1.2. For every eps-LDP randomizer ``alpha = max TV(R(x), R(x')) / (e^eps - 1)`` is valid
(docs/mathematics.md §1.2), so each function below is that ratio for one randomizer: the true worst-case
ratio or an *upper* bound on it, never a smaller guess. All satisfy ``(1 + e^eps) * alpha <= 1``.

The shuffle bound validates these values but certifies every randomizer at the generic 1/(e^eps + 1)
(``shuffle_bound.certified_alpha``): a smaller alpha leaves the victim a leftover law that the clone pair
does not account for, and the pair at that alpha under-reports epsilon. They still set the lone-report
loss distribution of the odometer and are reported beside the certified value.

Every ``1/(e^eps + c)`` is evaluated as ``e^-eps / (1 + c e^-eps)``: identical for moderate eps, finite for
eps up to the MAX_EPSILON guard instead of overflowing.
"""

from __future__ import annotations

import math

from ._checks import check_epsilon, check_int, check_probability


def _inverse_exp_plus(eps: float, offset: float) -> float:
    """``1 / (e^eps + offset)`` without overflow for large eps."""
    tail = math.exp(-eps)
    return tail / (1.0 + offset * tail)


def alpha_from_tv(tv: float, eps: float) -> float:
    """alpha = TV / (e^eps - 1), the mixture parameter of an eps-LDP randomizer with worst-case TV ``tv``.

    An eps-LDP randomizer has TV <= (e^eps - 1)/(e^eps + 1) = tanh(eps/2); a larger ``tv`` means the
    randomizer is not eps-LDP, and the resulting alpha would violate (1 + e^eps) alpha <= 1, so it is refused.
    """
    eps = check_epsilon("eps", eps)
    tv = check_probability("tv", tv)
    if tv > math.tanh(eps / 2.0) * (1.0 + 1e-12):
        raise ValueError(
            f"tv={tv!r} exceeds tanh(eps/2)={math.tanh(eps / 2.0)!r}: no eps-LDP randomizer has this TV"
        )
    return tv / math.expm1(eps)


def alpha_generic(eps: float) -> float:
    """1/(e^eps + 1): valid for *any* eps-LDP randomizer, because its TV is at most tanh(eps/2)."""
    return _inverse_exp_plus(check_epsilon("eps", eps), 1.0)


def alpha_binary_rr(eps: float) -> float:
    """1/(e^eps + 1): binary RR (one channel of attribute-fragmented k-RAPPOR) attains the generic worst-case
    TV (e^eps - 1)/(e^eps + 1), so it gains nothing over the generic value."""
    return _inverse_exp_plus(check_epsilon("eps", eps), 1.0)


def alpha_grr(eps: float, d: int) -> float:
    """1/(e^eps + d - 1): GRR outputs the input w.p. e^eps/(e^eps+d-1), each other value w.p. 1/(e^eps+d-1);
    two inputs differ only on their own two outputs, TV = (e^eps - 1)/(e^eps + d - 1)."""
    eps = check_epsilon("eps", eps)
    d = check_int("d", d, 2)
    return _inverse_exp_plus(eps, d - 1.0)


def alpha_olh(eps: float, g: int) -> float:
    """1/(e^eps + g - 1): OLH is GRR over g hash buckets given a data-independent seed; for each seed the TV
    is that of GRR over g values (or 0 if both inputs collide), so alpha is GRR's with d = g."""
    eps = check_epsilon("eps", eps)
    g = check_int("g", g, 2)
    return _inverse_exp_plus(eps, g - 1.0)


def alpha_hadamard(eps: float) -> float:
    """1/(2(e^eps + 1)): two Hadamard codeword supports (size K/2) overlap in K/4 outputs, so the outputs
    where the laws differ carry TV = (K/4) 2(e^eps - 1)/(K(1 + e^eps)) = (e^eps - 1)/(2(e^eps + 1))."""
    return 0.5 * _inverse_exp_plus(check_epsilon("eps", eps), 1.0)


def alpha_oue(eps: float) -> float:
    """1/(2(e^eps + 1)) for optimized unary encoding (p = 1/2, q = 1/(1 + e^eps)).

    Inputs v != v' produce product distributions that differ in exactly two bits (v and v'), each of which is
    Bern(1/2) under one input and Bern(q) under the other; the other d-2 bits are identical and drop out. The
    two differing bits have joint laws Bern(1/2) x Bern(q) versus Bern(q) x Bern(1/2): cells (0,0) and (1,1)
    agree, cell (1,0) has (1-q)/2 versus q/2 and cell (0,1) the reverse, so TV = (1 - 2q)/2 = 1/2 - q
    = (e^eps - 1)/(2(e^eps + 1)) and alpha = TV/(e^eps - 1) = 1/(2(e^eps + 1)).
    """
    return 0.5 * _inverse_exp_plus(check_epsilon("eps", eps), 1.0)


def alpha_collision(eps: float, s: int, t: int) -> float:
    """s/Omega with Omega = s e^eps + t - s, for Collision and CoCo ([CoCo]'s printed value is a TV, see
    docs/mathematics.md §1.2); it matches the lower-bound construction of [CoCo] Thm 6, so it is also tight.

    For t < 2s, s/Omega exceeds 1/(e^eps + 1) and breaks the mixture condition (1 + e^eps) alpha <= 1 of
    §1.2; the generic value, valid for every eps-LDP randomizer, is used there instead."""
    eps = check_epsilon("eps", eps)
    s = check_int("s", s, 1)
    t = check_int("t", t, s + 1)
    tail = math.exp(-eps)
    return min(s * tail / (s + (t - s) * tail), tail / (1.0 + tail))


def olh_buckets(eps: float) -> int:
    """OLH's number of hash buckets g = max(2, round(e^eps + 1)) (Wang et al. 2017, the variance-optimal
    choice). Shared so that the mechanism and its accounting can never disagree on g."""
    eps = check_epsilon("eps", eps)
    return max(2, round(math.exp(eps) + 1.0))
