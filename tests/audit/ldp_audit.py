"""Empirical privacy audits (LDP-Auditor style: Arcolezi and Gambs 2024; Jagielski, Ullman and Oprea 2020).

Run a randomizer on two inputs many times, count how often a *fixed* test event E happens under each, and
turn the counts into a statistically valid lower bound on epsilon with Clopper-Pearson intervals:

    eps_lb = log((lower(P[E | x0]) - delta) / upper(P[E | x1])),

each one-sided interval at confidence 1 - ALPHA/2, so that eps_lb <= the true epsilon with probability
>= 1 - ALPHA. A claim is refuted when eps_lb exceeds it. The event must not be chosen from the same samples
(here it is fixed by the mechanism's structure, or chosen on exact distributions), or the bound is invalid.
"""

from __future__ import annotations

import math

from scipy.stats import beta

__all__ = ["ALPHA", "clopper_pearson", "epsilon_lower_bound"]

ALPHA = 1e-3  # the audit wrongly refutes a true claim with probability below 1e-3


def clopper_pearson(hits: int, trials: int, alpha: float = ALPHA) -> tuple[float, float]:
    """Two-sided (1 - alpha) Clopper-Pearson interval of a binomial proportion (each side alpha/2)."""
    lo = 0.0 if hits == 0 else float(beta.ppf(alpha / 2, hits, trials - hits + 1))
    hi = 1.0 if hits == trials else float(beta.ppf(1 - alpha / 2, hits + 1, trials - hits))
    return lo, hi


def epsilon_lower_bound(hits0: int, trials0: int, hits1: int, trials1: int, delta: float = 0.0,
                        alpha: float = ALPHA) -> float:
    """Lower confidence bound on eps from E's counts under x0 and x1 (both directions; 0 if none)."""
    lo0, hi0 = clopper_pearson(hits0, trials0, alpha)
    lo1, hi1 = clopper_pearson(hits1, trials1, alpha)
    best = 0.0
    for lo, hi in ((lo0, hi1), (lo1, hi0)):
        if lo - delta > 0.0 and hi > 0.0:
            best = max(best, math.log((lo - delta) / hi))
    return best
