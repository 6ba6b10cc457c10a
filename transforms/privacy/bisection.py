"""The one search every accountant ends with: the smallest epsilon whose divergence is certified at delta.

A certified epsilon must satisfy ``divergence(eps) <= delta`` exactly as returned, so every search here
returns the upper end of its bracket: a valid guarantee, at worst slightly larger than the smallest one.
"""

from __future__ import annotations

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
