"""Collision mechanism for s-sparse ternary vectors / key-value data (docs/mathematics.md §3.1; [Collision]
Def. 3, [CoCo] Def. 5).

A client with item set Y (|Y| <= s, see ``collision_common`` for the ``[n, s]`` input) draws a seed from the
public family, hashes its items to the cells ``S = {H(y)}`` of [t] (m = |S| distinct) and reports ``(seed, z)``
with ``P[z = a] = e^eps/Omega`` on S and ``(Omega - m e^eps)/((t - m) Omega)`` elsewhere, ``Omega = s e^eps + t - s``.
Every probability lies in ``[1/Omega, e^eps/Omega]`` for every ``m <= s``, so short rows need no padding and the
mechanism is eps-LDP; for any fixed item y outside Y, ``H(y)`` is independent of z, hence
``P[H(y) = z] = 1/t`` exactly and ``f_hat(y) = (C_y/n - 1/t)/(p - 1/t)`` (``p = e^eps/Omega``) is unbiased.
Its variance is the exact §3.1 formula (no factor 2, which the papers' bound has from Var(a - b) <= 2 Var a + 2 Var b):
users are independent and within a report the indicators of ``j+`` and ``j-`` are uncorrelated, so
``Var[mean_j] = Var[f(j+)] + Var[f(j-)]``.

**Key sampling** (``max_keys = L > s``): a client holding up to L keys reports s of its L slots uniformly
(``kv_encoding``), so each key survives with probability ``pi = s/L`` and a holder is counted with probability
``p' = 1/t + pi (p - 1/t)``; dividing by ``p' - 1/t`` removes the factor pi exactly and the variance formula
holds with ``p'`` in place of p. The conditional mean is a ratio estimate (consistent, O(1/n) bias) with a
delta-method standard error (``kv_moments.kv_estimate``). The seed family and its bias term: ``collision_common``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from transforms.mechanisms.base import KeyValueEstimate, Randomness
from transforms.mechanisms.frequency.counting import exp_epsilon, rr_count_variance, structured
from transforms.mechanisms.keyvalue.coco import CoCo
from transforms.mechanisms.keyvalue.collision_common import (
    CollisionFamily,
    check_sparse_items,
    complement_rank,
    debiased_square_sum,
    family_cells,
    family_share,
    gather_support,
    occupancy,
    postprocess_estimate,
    search_limit,
)
from transforms.mechanisms.keyvalue.kv_moments import kv_estimate, plug_in_frequencies

__all__ = ["CoCo", "Collision", "collision_paper_t", "collision_total_variance", "collision_variance_t"]

MAX_ENUMERATED_OUTPUTS = 1 << 20


def collision_total_variance(d: int, s: int, epsilon: float, t: np.ndarray | int) -> np.ndarray:
    """``n * sum_y Var[f_hat(y)]`` for s items per user (§3.1, exact, fully random hash), vectorised over t."""
    t = np.asarray(t, dtype=np.float64)
    e = exp_epsilon(epsilon)
    p, q = e / (s * e + t - s), 1.0 / t
    return (s * p * (1 - p) + (2 * d - s) * q * (1 - q)) / (p - q) ** 2


def collision_paper_t(s: int, epsilon: float) -> int:
    """[CoCo]'s rule ``t* = floor(s e^eps + 2s - 1)`` ([Collision]: "about 2s - 1 + s e^eps")."""
    return math.floor(s * exp_epsilon(epsilon) + 2 * s - 1)


def collision_variance_t(d: int, s: int, epsilon: float) -> int:
    """The integer t >= s + 1 minimising :func:`collision_total_variance` [D] (the optimum is below
    ``2 s (e^eps + 3)``, from the large-d closed form of §3.1)."""
    ts = np.arange(s + 1, search_limit(s, epsilon) + 1)
    return int(ts[np.argmin(collision_total_variance(d, s, epsilon, ts))])


@dataclass(frozen=True)
class Collision(CollisionFamily):
    """Collision ([Collision], [CoCo]): one hashed cell per report, variance O(d s/(n eps^2)) for s-sparse ternary
    vectors.

    ``t`` defaults to ``t_rule``: ``"variance"`` (minimise the exact total variance) or ``"paper"`` ([CoCo]'s t*).
    ``seed_family`` seeds (uint32 on the wire) of the family ``hash_seed``; ``max_keys``: see the module docstring.
    Estimate extras: ``support`` [2d], ``family_variance`` (added to every item's variance), ``family_share``
    (its ratio to the median item sampling variance), ``t``.
    """

    name: ClassVar[str] = "collision"
    payload_kind: ClassVar[str] = "hashed"

    def _default_t(self, rule: str) -> int:
        if rule == "variance":
            return collision_variance_t(self.d, self.s, self.epsilon)
        return collision_paper_t(self.s, self.epsilon)

    def _t_bounds(self) -> tuple[int, str, bool]:
        return self.s + 1, "s + 1", False

    @property
    def p(self) -> float:
        """Probability that a reported item's cell is the output, ``e^eps/Omega``."""
        return exp_epsilon(self.epsilon) / self.omega

    @property
    def q(self) -> float:
        """Probability that an unreported item's cell is the output, ``1/t`` (fully random hash)."""
        return 1.0 / self.cells

    @property
    def p_held(self) -> float:
        """Probability that a holder of an item is counted for it, ``q + keep (p - q)``."""
        return self.q + self.keep * (self.p - self.q)

    def encode(self, items: np.ndarray, rng: Randomness) -> np.ndarray:
        """Seed, hash the row's items, then z from S w.p. ``m e^eps/Omega`` else uniform from [t] minus S.

        Four draws of shape (n,), whatever the data (seed, branch, index in S, rank in the complement)."""
        arr = check_sparse_items(items, self.d, self.s)
        n, t = arr.shape[0], self.cells
        seed = rng.integers(0, self.seed_family, n)
        branch = rng.random(n)
        pick = rng.random(n)
        h = np.where(arr >= 0, family_cells(self.hash_seed, seed[:, None], np.maximum(arr, 0), t), t)
        h.sort(axis=1)
        distinct = np.ones_like(h, dtype=bool)
        distinct[:, 1:] = h[:, 1:] != h[:, :-1]
        distinct &= h < t
        m = distinct.sum(axis=1)
        rank = rng.integers(0, t - m, n) if n else np.zeros(0, dtype=np.int64)
        cells = np.where(distinct, h, t)  # duplicates -> sentinel, order stays ascending among the distinct ones
        cells.sort(axis=1)
        k = np.minimum((pick * m).astype(np.int64), np.maximum(m - 1, 0))
        inside = cells[np.arange(n), k]
        outside = complement_rank(cells, rank)
        z = np.where(branch * self.omega < m * exp_epsilon(self.epsilon), inside, outside)
        return structured(self.report_dtype, seed=seed.astype(np.uint32), z=z)

    def variance(self, counts: np.ndarray, n: int) -> np.ndarray:
        """Per-item count variance (§3.1, exact for a fully random hash; ``p_held`` for key sampling), scaled back
        to pre-sampling counts."""
        return rr_count_variance(counts, n, self.p_held, self.q)

    @property
    def family_factor(self) -> float:
        """rho = exact / linearised variance over hash functions of ``P[z = H(y)]`` for an absent item y and a
        client with s items (``collision_common``), from the occupancy distribution of s items in t cells."""
        e, t, s, omega = exp_epsilon(self.epsilon), self.cells, self.s, self.omega
        m = np.arange(s + 1)
        w = (omega - m * e) / (t - m)
        second = np.sum(occupancy(s, t) * ((m / t) * e**2 + (1 - m / t) * w**2)) / omega**2
        return float((second - 1 / t**2) / (s * (1 / t) * (1 - 1 / t) * ((e - 1) / omega) ** 2))

    def family_variance(self, square_sum: float) -> float:
        """Spread of an item frequency's finite-family bias, ``rho (t-1) sum_x f_x^2 / (S (t-s)^2)``."""
        t = self.cells
        return self.family_factor * (t - 1) * square_sum / (self.seed_family * (t - self.s) ** 2)

    def decode_counts(self, counts: np.ndarray, n: int, postprocess: str = "none") -> KeyValueEstimate:
        """Count trick (one pass over the seed family), unbiased frequencies, per-key moments, standard errors."""
        support = gather_support(counts, self.hash_seed, 2 * self.d, self.cells)[0]
        freq = (support / n - self.q) / (self.p_held - self.q)
        plus, minus = plug_in_frequencies(freq[1::2], freq[0::2])
        plug = np.empty_like(freq)
        plug[1::2], plug[0::2] = plus, minus
        sampling = self.variance(plug * n, n) / n**2
        family = self.family_variance(debiased_square_sum(freq, sampling, float(self.max_keys or self.s)))
        var = sampling + family
        extras: dict[str, Any] = {"support": support, "family_variance": family,
                                  "family_share": family_share(family, sampling), "t": self.cells}
        est = kv_estimate(freq[1::2], freq[0::2], var[1::2], var[0::2], np.zeros(self.d), n, counts, extras)
        return postprocess_estimate(est, postprocess, float(self.max_keys or self.s))

    def exact_output_distribution(self, items: np.ndarray) -> np.ndarray:
        """P(report == (seed, z) | items) for every output, indexed ``seed * t + z`` (S * t outputs)."""
        size = self.seed_family * self.cells
        if size > MAX_ENUMERATED_OUTPUTS:
            raise ValueError(f"enumerating {size} outputs exceeds {MAX_ENUMERATED_OUTPUTS}")
        row = check_sparse_items(np.asarray(items).reshape(1, -1), self.d, self.s)[0]
        row = row[row >= 0]
        e, t, omega = exp_epsilon(self.epsilon), self.cells, self.omega
        seeds = np.arange(self.seed_family)
        occupied = np.zeros((self.seed_family, t), dtype=bool)
        if row.size:
            occupied[seeds[:, None], family_cells(self.hash_seed, seeds[:, None], row[None, :], t)] = True
        m = occupied.sum(axis=1, keepdims=True)
        out = np.where(occupied, e / omega, (omega - m * e) / ((t - m) * omega))
        return out.ravel() / self.seed_family
