"""The one search every accountant ends with: the smallest epsilon whose divergence is certified at delta.

A certified epsilon must satisfy ``divergence(eps) <= delta`` exactly as returned, so every search here
returns the upper end of its bracket: a valid guarantee, at worst slightly larger than the smallest one.
"""

from __future__ import annotations

import math
from collections.abc import Callable


def bisect_certified(divergence: Callable[[float], float], low: float, high: float, delta: float,
                     steps: int) -> float:
    """Bisection of a non-increasing divergence on [low, high] with ``divergence(high) <= delta``: the upper end
    after ``steps`` halvings."""
    for _ in range(steps):
        middle = 0.5 * (low + high)
        if divergence(middle) <= delta:
            high = middle
        else:
            low = middle
    return high


def smallest_certified(divergence: Callable[[float], float], upper: float, delta: float, steps: int) -> float:
    """Smallest certified epsilon in [0, upper]; ``upper`` itself when even it is not certified (the caller's
    fallback guarantee, e.g. the local epsilon, which shuffling never worsens)."""
    if divergence(upper) > delta:
        return upper
    return bisect_certified(divergence, 0.0, upper, delta, steps)


def smallest_int(reaches: Callable[[int], bool], low: int, high: int) -> int:
    """Smallest integer in (low, high] with ``reaches``, given ``reaches(high)`` and not ``reaches(low)``
    (monotone): what the dummy and blanket-message searches need."""
    while high - low > 1:
        middle = (low + high) // 2
        if reaches(middle):
            high = middle
        else:
            low = middle
    return high


def smallest_certified_fast(divergence: Callable[[float], float], upper: float, delta: float,
                            tolerance: float = 1e-9, max_steps: int = 80) -> float:
    """``smallest_certified`` in far fewer divergence evaluations: regula falsi (Illinois) on log D, which is
    nearly linear in epsilon, with a bisection step whenever interpolation is unusable. The bracket always
    keeps ``divergence(high) <= delta``, and ``high`` is returned once the bracket is narrower than
    ``tolerance`` (or after ``max_steps``): the same certified guarantee, at most ``tolerance`` looser."""
    d_high = divergence(upper)
    if d_high > delta:
        return upper
    low, high = 0.0, upper
    d_low = divergence(low)
    if d_low <= delta:
        return low
    log_delta = math.log(delta)
    f_low = math.log(d_low) - log_delta
    f_high = math.log(d_high) - log_delta if d_high > 0.0 else -math.inf
    side = 0
    for _ in range(max_steps):
        if high - low <= tolerance:
            break
        if math.isfinite(f_high) and f_low > f_high:
            middle = high - f_high * (high - low) / (f_high - f_low)
            # keep the step strictly inside the bracket, away from its ends
            middle = min(max(middle, low + 0.01 * (high - low)), high - 0.01 * (high - low))
        else:
            middle = 0.5 * (low + high)
        d_mid = divergence(middle)
        f_mid = math.log(d_mid) - log_delta if d_mid > 0.0 else -math.inf
        if d_mid <= delta:
            high, f_high = middle, f_mid
            if side == -1 and math.isfinite(f_low):
                f_low *= 0.5  # Illinois: the end that stayed put twice is pulled in
            side = -1
        else:
            low, f_low = middle, f_mid
            if side == 1 and math.isfinite(f_high):
                f_high *= 0.5
            side = 1
    return high
