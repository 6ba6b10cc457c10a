"""Exact central epsilon of a small shuffled crowd, by enumerating the law of the released multiset.

Independent of ``transforms.privacy.shuffle_bound`` and of any reduction: the analyst's view of n shuffled
single-message reports is the histogram of their outputs, whose law is the convolution of the n per-client
output laws. A histogram over K outputs is coded as the integer ``sum_y h_y (n + 1)^y``, so adding one client
adds ``(n + 1)^y`` to the code of every state for each output y; states with equal codes are merged with
``np.unique``. The exact epsilon at delta is the smallest eps with both hockey-stick divergences <= delta.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["exact_epsilon", "histogram_law", "shuffled_epsilon"]


def histogram_law(laws: Sequence[np.ndarray]) -> dict[int, float]:
    """Law of the output histogram of independent clients with output laws ``laws`` (each over [K])."""
    size = len(laws[0])
    base = len(laws) + 1
    steps = base ** np.arange(size, dtype=np.int64)
    assert float(base) ** size < 2**62, "histogram codes would overflow int64"
    codes, probs = np.zeros(1, dtype=np.int64), np.ones(1)
    for law in laws:
        law = np.asarray(law, dtype=np.float64)
        assert law.shape == (size,) and abs(law.sum() - 1.0) < 1e-12 and (law >= 0).all()
        live = np.flatnonzero(law > 0)
        new_codes = (codes[None, :] + steps[live, None]).ravel()
        new_probs = (law[live, None] * probs[None, :]).ravel()
        codes, inverse = np.unique(new_codes, return_inverse=True)
        probs = np.bincount(inverse, weights=new_probs)
    return dict(zip(codes.tolist(), probs.tolist(), strict=True))


def exact_epsilon(p_law: dict[int, float], q_law: dict[int, float], delta: float, steps: int = 100) -> float:
    """Smallest eps >= 0 with ``D_{e^eps}(P || Q) <= delta`` and ``D_{e^eps}(Q || P) <= delta``.

    Returns the lower end of a bisection bracket (the true value lies within eps_max 2^-steps above it), so a
    certified bound must be >= the returned value."""
    keys = sorted(set(p_law) | set(q_law))
    p = np.array([p_law.get(k, 0.0) for k in keys])
    q = np.array([q_law.get(k, 0.0) for k in keys])

    def divergence(eps: float) -> float:
        e = math.exp(eps)
        return max(float(np.maximum(p - e * q, 0.0).sum()), float(np.maximum(q - e * p, 0.0).sum()))

    if divergence(0.0) <= delta:
        return 0.0
    low, high = 0.0, 1.0
    while divergence(high) > delta:
        low, high = high, 2.0 * high
    for _ in range(steps):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if divergence(middle) > delta else (low, middle)
    return low


def shuffled_epsilon(victim: np.ndarray, victim_neighbour: np.ndarray, others: Sequence[np.ndarray],
                     delta: float) -> float:
    """Exact central epsilon of the shuffled reports of the victim (law ``victim`` vs ``victim_neighbour``, a
    replacement) among clients with the fixed laws ``others``."""
    return exact_epsilon(histogram_law([victim, *others]), histogram_law([victim_neighbour, *others]), delta)
