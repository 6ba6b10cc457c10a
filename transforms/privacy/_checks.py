"""Argument checks shared by the accountants.

A privacy number computed from a mistyped argument is worse than an exception: it looks like a guarantee.
Every public function therefore validates its inputs here and raises ``ValueError`` naming the argument.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

# e^eps overflows a float64 beyond ~709.78; keep a margin so products such as e^eps * alpha stay finite.
MAX_EPSILON = 700.0


def check_int(name: str, value: object, minimum: int) -> int:
    """Return ``value`` as an int >= ``minimum``; integral floats (``1e6``) are accepted, booleans are not."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if isinstance(value, Integral):
        result = int(value)
    elif isinstance(value, Real) and math.isfinite(float(value)) and float(value).is_integer():
        result = int(float(value))
    else:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if result < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {result}")
    return result


def check_real(name: str, value: object) -> float:
    """Return ``value`` as a finite float."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    return float(value)


def check_epsilon(name: str, value: object, *, allow_zero: bool = False) -> float:
    """A privacy budget: > 0 (or >= 0 when ``allow_zero``) and <= MAX_EPSILON so that e^eps is finite."""
    eps = check_real(name, value)
    if eps < 0.0 or (eps == 0.0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound}, got {eps!r}")
    if eps > MAX_EPSILON:
        raise ValueError(f"{name} must be <= {MAX_EPSILON} (e^{name} would overflow), got {eps!r}")
    return eps


def check_delta(name: str, value: object) -> float:
    """A failure probability in the open interval (0, 1)."""
    delta = check_real(name, value)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"{name} must lie in (0, 1), got {delta!r}")
    return delta


def check_probability(name: str, value: object) -> float:
    """A probability in the closed interval [0, 1]."""
    p = check_real(name, value)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {p!r}")
    return p


def check_nonnegative(name: str, value: object) -> float:
    """A finite real >= 0 (used where large values are legitimate and handled in log space)."""
    x = check_real(name, value)
    if x < 0.0:
        raise ValueError(f"{name} must be >= 0, got {x!r}")
    return x
