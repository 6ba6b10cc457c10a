"""Machinery shared by Collision and CoCo (docs/mathematics.md §3.1-3.2, §2.9): inputs, seed family, decoding.

**Input.** ``items`` int64 ``[n, s]``: row i lists the items ``item(j, b) = 2j + (1 if b = +1 else 0)`` client i
holds, at most one sign per key, and ``-1`` in unused slots (a client with fewer than s non-missing keys). Both
mechanisms stay exactly eps-LDP and unbiased for short rows: Collision needs nothing (its output law only needs
``m <= s`` distinct hashed cells), CoCo fills empty slots with phantom keys (see ``coco.py``).

**Seed family and count trick.** A client draws ``seed`` uniform on ``[S]`` (``S = seed_family``); cells are
``hash_to_buckets(hash_seed * 2^32 + seed, value, t)`` (``transforms.mechanisms.hashing``). The analyzer keeps
``counts[seed, z]`` (S x t, whatever n) and decodes each seed once: ``C_v = sum_seed counts[seed, H_seed(v)]``,
O(n + S * (number of hashed values)), never O(n d).

**Why no exact finite-family correction (unlike OLH).** OLH's support has expectation ``M c``, linear in the
histogram, so it can be inverted exactly. Here a non-holder of item y is counted with probability
``P[z = H(y)]``, which depends on whether ``H(y)`` hits *any* of the client's own cells and on how many distinct
cells they occupy (an OR over the whole set). Its average over a finite family is therefore a function of the
distribution of whole sets (co-occurrences), not of the item frequencies: no linear decoder of the S x t counts
is unbiased for every dataset (the expectation is linear only for s = 1, OLH's case). The textbook decoder is exactly
unbiased *averaged over a random family* (``hash_seed`` picks one); for the family in use, the first-order bias of
an item is a sum over the other items x of ``f_x (Pc[y, x] - 1/t)``, with ``Pc`` the empirical collision rate,
whose spread over families is

    Collision, item y:      (t - 1) sum_x f_x^2 / (S (t - s)^2)
    CoCo, mean of key j:     (2/t) sum_k mean_k^2 / (S (1 - P_ow)^2)
    CoCo, non-missing j:     2 (t - 2) sum_k nonmissing_k^2 / (S (t - 2s)^2)

(ratio to the sampling variance of an absent item, for Collision: ``n (e^eps - 1)^2 sum_x f_x^2 / (S Omega^2)``),
each multiplied by a calibration factor rho in (0, 1] that makes it exact when every client holds the same full
set: the linearisation ignores that collisions among a client's own cells (occupancy of s balls in t bins, or in
t/2 pairs for CoCo) blunt the bias; rho (0.6-0.85 for t ~ 5s, less for CoCo's non-missing estimator when t is
close to 2s) is computed exactly from the occupancy distribution.
Like Count-Mean Sketch, the published standard errors add this family variance (plug-in, with the sums of
squares debiased by the estimates' own variances), so they stay honest when many clients share the same keys;
``extras["family_share"]`` reports its size. Raise ``seed_family`` when it is large (decoding costs O(S d)).
For other datasets the calibrated formula is a first-order approximation (checked against exact expectations
under many families in ``tests/statistical/test_collision_stats.py``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from transforms.mechanisms.base import KeyValueEstimate, Randomizer
from transforms.mechanisms.frequency.counting import empty_mask_if_malformed, exp_epsilon
from transforms.mechanisms.hashing import hash_to_buckets
from transforms.mechanisms.keyvalue.kv_moments import KVAccumulator, check_sparse_items, freeze_sparsity
from transforms.mechanisms.postprocess import project_simplex
from transforms.privacy.mixture import alpha_collision

__all__ = [
    "DEFAULT_SEED_FAMILY",
    "CollisionAccumulator",
    "CollisionFamily",
    "check_sparse_items",
    "complement_rank",
    "debiased_square_sum",
    "family_cells",
    "family_share",
    "freeze_family",
    "gather_support",
    "occupancy",
    "postprocess_estimate",
    "project_total_at_most",
    "search_limit",
]

DEFAULT_SEED_FAMILY = 4096  # S x t counts; decoding hashes S x (2d) values, ~3 s for d = 10^4 (benchmark)
MAX_SEED_FAMILY = 2**32  # seeds travel as uint32
MAX_HASH_SEED = 2**32  # hash_seed * 2^32 + seed must fit in uint64
MAX_CELLS = 1 << 25  # S * t accumulator cells (256 MiB of int64)
MAX_T = 1 << 20
POSTPROCESS = ("none", "clip", "simplex")
T_RULES = ("variance", "paper")
_DECODE_PAIRS = 1 << 16  # (seed, value) pairs hashed per chunk: keeps temporaries in cache


def freeze_family(mech: Any) -> None:
    """Validate ``d``, ``epsilon``, ``s``, ``seed_family``, ``hash_seed`` and ``max_keys`` of a frozen mechanism."""
    freeze_sparsity(mech)
    for name, low, high in (("seed_family", 1, MAX_SEED_FAMILY), ("hash_seed", 0, MAX_HASH_SEED - 1)):
        v = getattr(mech, name)
        if isinstance(v, bool) or int(v) != v or not low <= v <= high:
            raise ValueError(f"{name} must be an integer in [{low}, {high}], got {v!r}")
        object.__setattr__(mech, name, int(v))
    keys = mech.s if mech.max_keys is None else mech.max_keys
    if isinstance(keys, bool) or int(keys) != keys or keys < mech.s:
        raise ValueError(f"max_keys must be an integer >= s = {mech.s} (or None for s), got {keys!r}")
    object.__setattr__(mech, "max_keys", int(keys))


def check_cells(t: int, seed_family: int) -> None:
    """Refuse accumulators too large to ship between Beam workers."""
    if t * seed_family > MAX_CELLS:
        raise ValueError(f"seed_family * t = {seed_family} * {t} exceeds {MAX_CELLS} accumulator cells: lower "
                         "seed_family or epsilon (t grows like s e^eps)")


def search_limit(s: int, epsilon: float) -> int:
    """Upper end of the search for the variance-optimal t (the optimum lies below ``2 s (e^eps + 3)``)."""
    hi = max(50 * s, math.ceil(4 * s * (math.exp(min(epsilon, 50.0)) + 3)))
    if hi > MAX_T:
        raise ValueError(f"the variance-optimal t for s = {s}, epsilon = {epsilon} may exceed {MAX_T}: lower "
                         "epsilon or set t explicitly")
    return hi


def family_cells(hash_seed: int, seeds: np.ndarray, values: np.ndarray, t: int) -> np.ndarray:
    """Cell ``H_seed(value)`` in [0, t) of the family selected by ``hash_seed`` (broadcasting; values >= 0)."""
    full = (np.uint64(hash_seed) << np.uint64(32)) | np.asarray(seeds).astype(np.uint64)
    return hash_to_buckets(full, values, t)


def gather_support(counts: np.ndarray, hash_seed: int, n_values: int, t: int,
                   shifts: tuple[int, ...] = (0,)) -> np.ndarray:
    """``out[k, v] = sum_seed counts[seed, (H_seed(v) + shifts[k]) mod t]``: the count trick, O(S n_values).

    Seeds without reports are skipped, so small crowds decode fast too.
    """
    S = counts.shape[0]
    flat = np.ascontiguousarray(counts).reshape(-1)  # int counts, or expected (float) counts in tests
    active = np.flatnonzero(counts.any(axis=1))
    values = np.arange(n_values, dtype=np.uint64)[None, :]
    out = np.zeros((len(shifts), n_values))
    chunk = max(1, _DECODE_PAIRS // max(n_values, 1))
    assert S * t < 2**62
    for start in range(0, active.size, chunk):
        seeds = active[start:start + chunk]
        local = family_cells(hash_seed, seeds[:, None], values, t)
        base = (seeds * t)[:, None]
        for k, shift in enumerate(shifts):
            cells = local if shift == 0 else np.where(local < t - shift, local + shift, local + shift - t)
            out[k] += flat[base + cells].sum(axis=0)
    return out


def complement_rank(taken: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """The ``rank``-th (0-based) integer not in row i of ``taken`` (``[n, k]``, sorted ascending, distinct among
    entries below the sentinel, padded with a sentinel larger than every answer); loops over k columns only."""
    out = np.asarray(rank, dtype=np.int64).copy()
    for c in range(taken.shape[1]):
        out += taken[:, c] <= out
    return out


def occupancy(balls: int, bins: int) -> np.ndarray:
    """``P[m]``, m = 0..balls: probability that ``balls`` uniform throws occupy exactly m of ``bins`` bins."""
    prob = np.zeros(balls + 1)
    prob[0] = 1.0
    m = np.arange(balls + 1)
    for _ in range(balls):
        grown = np.zeros_like(prob)
        grown[1:] = prob[:-1] * (bins - m[:-1]) / bins
        prob = prob * m / bins + grown
    return prob


def debiased_square_sum(estimates: np.ndarray, variances: np.ndarray, cap: float) -> float:
    """Plug-in ``sum_x f_x^2``: ``E[f_hat^2] = f^2 + Var``, so subtract the variances; clip to ``[0, cap]``."""
    return float(np.clip(np.sum(estimates**2 - variances), 0.0, cap))


def project_total_at_most(values: np.ndarray, cap: float) -> np.ndarray:
    """Euclidean projection onto ``{x >= 0, sum x <= cap}``.

    §2.9 projects onto the simplex of total s, which presumes every client holds exactly s items. With short rows
    (or key sampling) the truth only satisfies ``sum <= cap``; this set always contains it, so the projection
    never moves the estimate away from the truth (non-expansive). It equals §2.9's projection whenever the
    clipped estimate sums above ``cap`` (the usual case for full rows).
    """
    clipped = np.maximum(np.asarray(values, dtype=np.float64), 0.0)
    if clipped.sum() <= cap:
        return clipped
    return project_simplex(values, cap)


def postprocess_estimate(est: KeyValueEstimate, method: str, cap: float) -> KeyValueEstimate:
    """Post-process the item frequencies (``clip`` to [0, 1] or ``simplex``: :func:`project_total_at_most`) and
    re-derive mean, non-missing and conditional mean from them (§2.9); the raw arrays move to ``extras["raw"]``.

    Standard errors keep describing the raw estimates (post-processing has no closed-form standard error).
    """
    if method not in POSTPROCESS:
        raise ValueError(f"postprocess must be one of {', '.join(POSTPROCESS)}, got {method!r}")
    if method == "none":
        return est
    raw = np.asarray(est.frequency, dtype=np.float64)
    f = np.clip(raw, 0.0, 1.0) if method == "clip" else project_total_at_most(raw, cap)
    plus, minus = f[1::2], f[0::2]
    mean, nonmissing = plus - minus, plus + minus
    with np.errstate(divide="ignore", invalid="ignore"):
        conditional = np.where(nonmissing > 0, mean / nonmissing, np.nan)
    raw_arrays = {"frequency": raw, "mean": est.mean, "nonmissing": est.nonmissing,
                  "conditional_mean": est.conditional_mean}
    return dataclasses.replace(est, frequency=f, mean=mean, nonmissing=nonmissing, conditional_mean=conditional,
                               extras={**est.extras, "postprocess": method, "raw": raw_arrays})


def family_share(family: float, sampling: np.ndarray) -> float:
    """Median ratio of the family variance to the sampling variance (0 when there is no sampling variance)."""
    med = float(np.median(sampling)) if sampling.size else 0.0
    return family / med if med > 0 else math.inf if family > 0 else 0.0


class CollisionAccumulator(KVAccumulator):
    """``counts[seed, z]`` (S x t) plus n; merges by addition; ``estimate(postprocess=...)`` decodes once per seed."""

    def estimate(self, postprocess: str = "none") -> KeyValueEstimate:  # type: ignore[override]
        """Unbiased estimates with plug-in standard errors; ``postprocess`` as in :func:`postprocess_estimate`."""
        if self.n == 0:
            raise ValueError("no reports")
        return self.mechanism.decode_counts(self.counts.copy(), self.n, postprocess=postprocess)  # type: ignore[call-arg]


@dataclass(frozen=True)
class CollisionFamily(Randomizer):
    """Public parameters and (seed, z) report plumbing shared by Collision and CoCo.

    Both report one cell of [t] under a seed of the family, so validation, counting, wire size and the mixture
    alpha (every cell has probability in ``[1/Omega, e^eps/Omega]``) are the same; subclasses choose t
    (``_default_t``, ``_t_bounds``) and everything that depends on how cells are filled.
    """

    d: int
    s: int
    epsilon: float
    t: int | None = None
    t_rule: str = "variance"
    seed_family: int = DEFAULT_SEED_FAMILY
    hash_seed: int = 0
    max_keys: int | None = None

    def _default_t(self, rule: str) -> int:
        raise NotImplementedError

    def _t_bounds(self) -> tuple[int, str, bool]:
        """(least t, how to write it in terms of s, whether t must be even)."""
        raise NotImplementedError

    def __post_init__(self) -> None:
        freeze_family(self)
        if self.t_rule not in T_RULES:
            raise ValueError(f"t_rule must be one of {', '.join(T_RULES)}, got {self.t_rule!r}")
        t = self._default_t(self.t_rule) if self.t is None else self.t
        low, low_text, even = self._t_bounds()
        if isinstance(t, bool) or int(t) != t or (even and t % 2) or not low <= t <= MAX_T:
            raise ValueError(f"t must be an {'even ' if even else ''}integer in [{low_text}, {MAX_T}] = "
                             f"[{low}, {MAX_T}], got {t!r} (lower epsilon or set t explicitly)")
        object.__setattr__(self, "t", int(t))
        check_cells(self.cells, self.seed_family)

    @property
    def cells(self) -> int:
        """``t`` as an int (never None after construction)."""
        assert self.t is not None
        return self.t

    @property
    def omega(self) -> float:
        return self.s * exp_epsilon(self.epsilon) + self.cells - self.s

    @property
    def keep(self) -> float:
        """Probability that a held key is among the s reported ones, ``s / max_keys``."""
        assert self.max_keys is not None
        return self.s / self.max_keys

    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype([("seed", "<u4"), ("z", "<i8")])

    @property
    def epsilon_local(self) -> float:
        return self.epsilon  # replacement LDP, for every hash function and every m <= s

    @property
    def mixture_alpha(self) -> float:
        # every cell has probability >= 1/Omega, so TV <= 1 - t/Omega = s(e^eps - 1)/Omega
        return alpha_collision(self.epsilon, self.s, self.cells)

    @property
    def message_bits(self) -> int:
        return (self.seed_family - 1).bit_length() + (self.cells - 1).bit_length()

    def validate(self, reports: np.ndarray) -> np.ndarray:
        bad = empty_mask_if_malformed(reports, self.report_dtype)
        if bad is not None:
            return bad
        seed, z = reports["seed"], reports["z"]
        return (seed < self.seed_family) & (z >= 0) & (z < self.cells)

    def new_accumulator(self) -> CollisionAccumulator:
        return CollisionAccumulator(self, (self.seed_family, self.cells))

    def count_reports(self, reports: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        cell = reports["seed"].astype(np.int64) * self.cells + reports["z"]
        return np.bincount(cell, minlength=self.seed_family * self.cells).reshape(shape)

    def parameters(self) -> dict[str, Any]:
        return {"d": self.d, "s": self.s, "epsilon": self.epsilon, "t": self.cells, "t_rule": self.t_rule,
                "seed_family": self.seed_family, "hash_seed": self.hash_seed, "max_keys": self.max_keys}
