"""Checks shared by the exact-LDP tests: an enumerated output law against encode() draws.

Each outcome count of ``draws`` i.i.d. reports is Binomial(draws, p); its z-score must stay below 5 for every
outcome (Bonferroni over the few hundred outcomes a test enumerates: P(max |z| > 5) < 300 * 5.7e-7 ~ 2e-4).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from transforms.mechanisms.randomness import seeded_rng

__all__ = ["Z_LAW", "assert_counts_follow_law", "assert_encode_matches_table", "assert_exact_ldp"]

Z_LAW = 5.0


def assert_exact_ldp(table: np.ndarray, epsilon: float) -> float:
    """``table[x]`` is the exact output law for input x: each row is a distribution with full support, and every
    ratio ``table[x, y] / table[x', y]`` is at most ``e^epsilon`` (+1e-12 relative). Returns the worst ratio."""
    table = np.asarray(table, dtype=np.float64)
    np.testing.assert_allclose(table.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert np.all(table > 0)
    worst = float(np.max(table.max(axis=0) / table.min(axis=0)))
    assert worst <= math.exp(epsilon) * (1 + 1e-12), f"worst ratio {worst:.6g} > e^{epsilon:g}"
    return worst


def assert_counts_follow_law(freq: np.ndarray, law: np.ndarray, draws: int, label: object = "") -> None:
    """``freq`` (outcome counts of ``draws`` reports) matches the outcome probabilities ``law``.

    Outcomes of probability 0 must never occur; the others are compared by their binomial z-scores.
    """
    freq, law = np.asarray(freq), np.asarray(law, dtype=np.float64)
    assert freq.size == law.size, f"{label}: {freq.size} observed outcomes vs {law.size} enumerated"
    seen = law > 0
    assert not np.any(freq[~seen]), f"{label}: reports outside the enumerated support"
    expected = draws * law[seen]
    z = (freq[seen] - expected) / np.sqrt(expected * (1 - law[seen]))
    assert np.max(np.abs(z)) < Z_LAW, f"{label}: max |z| = {np.max(np.abs(z)):.2f}"


def assert_encode_matches_table(mech: Any, table: np.ndarray, outcome_index: Callable[[Any, np.ndarray], np.ndarray],
                                draws: int, seed: int) -> None:
    """For every input x (row of ``table``, the enumerated law of ``mech.encode``), ``draws`` valid reports whose
    outcomes (``outcome_index(mech, reports)``, columns of ``table``) follow ``table[x]``."""
    rng = seeded_rng(seed)
    for x in range(table.shape[0]):
        reports = mech.encode(np.full(draws, x), rng)
        assert mech.validate(reports).all()
        freq = np.bincount(outcome_index(mech, reports), minlength=table.shape[1])
        assert_counts_follow_law(freq, table[x], draws, x)
