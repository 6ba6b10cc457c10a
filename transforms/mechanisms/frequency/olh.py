"""Optimized local hashing (OLH, docs/mathematics.md §2.3) with an exactly unbiased finite-family decoder.

A client draws a public seed ``s`` from a family of ``S = seed_family`` seeds, hashes its value to
``h = H_s(v)`` in [g] (``transforms.mechanisms.hashing``) and reports ``(s, z)`` with ``z`` = GRR(h) over [g].

**Why a finite family and an exact decoder.** The analyzer aggregates reports by ``(s, z)`` first (count
trick, docs/architecture.md §4): state ``S x g`` and decoding cost O(S*d), never O(n*d). The textbook estimator
``(C - n/g)/(p - 1/g)`` assumes a fully random hash, i.e. that values ``x != v`` collide with
probability exactly 1/g. With S seeds the empirical collision rate ``Pc[x, v]`` (fraction of seeds with
``H_s(x) == H_s(v)``) deviates from 1/g by ~sqrt(1/(g S)); the resulting bias is proportional to n while
the standard error grows like sqrt(n), so on large crowds the textbook estimator would be confidently
wrong. The exact expectation is

    E[C] = q' n 1 + (p - q') Pc c,         q' = (1 - p)/(g - 1)

(E[C] = M c with M = q' J + (p - q') Pc; using the known total ``sum(c) = n``):

    (p - q') (Pc - J/g) c = C - n/g,

whose solution is unbiased for every finite family and equals the textbook estimator when ``Pc`` is ideal
(``Pc = (1 - 1/g) I + J/g``). ``Pc - J/g`` is positive semi-definite (Cauchy-Schwarz over the buckets of
each seed) and generically definite once ``S (g - 1) >= d``; we require ``S g >= 4 d`` at construction.
We solve by conjugate gradients with an O(S*d) matrix-free product (bucket sums per seed, then gather),
warm-started at the textbook estimate, which is already within O(sqrt(d/(gS))) of the solution.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property, lru_cache
from typing import Any, ClassVar

import numpy as np
from scipy.sparse.linalg import LinearOperator, cg

from transforms.mechanisms.base import Randomness, check_values
from transforms.mechanisms.frequency.counting import (
    CountAccumulator,
    HashedGRR,
    empty_mask_if_malformed,
    freeze_domain_and_epsilon,
    rr_count_variance,
    seed_family_law,
    structured,
)
from transforms.mechanisms.hashing import hash_to_buckets
from transforms.privacy.blanket_shuffle import BlanketDecomposition, blanket_olh_classes
from transforms.privacy.mixture import olh_buckets

__all__ = ["OLH", "OLHAccumulator", "default_buckets"]

MAX_SEED_FAMILY = 2**32  # seeds travel as uint32
MIN_FAMILY_COVERAGE = 4  # require seed_family * g >= 4 d so that M is well conditioned
CG_RTOL = 1e-12
MAX_ENUMERATED_OUTPUTS = 1 << 20


def default_buckets(epsilon: float) -> int:
    """OLH's variance-optimal number of buckets, ``max(2, round(e^eps + 1))`` (Wang et al. 2017)."""
    return olh_buckets(epsilon)


@dataclass(frozen=True)
class OLH(HashedGRR):
    """Optimized local hashing: report a public seed and GRR over [g] of the seeded hash of the value.

    O(log S + log g) bits per report and variance independent of d (~4 n e^eps/(e^eps-1)^2), for any d.
    """

    name: ClassVar[str] = "olh"
    payload_kind: ClassVar[str] = "hashed"
    d: int
    epsilon: float
    g: int | None = None
    seed_family: int = 1024

    def __post_init__(self) -> None:
        freeze_domain_and_epsilon(self)
        g = default_buckets(self.epsilon) if self.g is None else self.g
        if isinstance(g, bool) or int(g) != g or g < 2:
            raise ValueError(f"number of buckets g must be an integer >= 2, got {g!r}")
        s = self.seed_family
        if isinstance(s, bool) or int(s) != s or not 1 <= s <= MAX_SEED_FAMILY:
            raise ValueError(f"seed_family must be an integer in [1, 2^32], got {s!r}")
        object.__setattr__(self, "g", int(g))
        object.__setattr__(self, "seed_family", int(s))
        if self.seed_family * self.buckets < MIN_FAMILY_COVERAGE * self.d:
            raise ValueError(
                f"seed_family * g = {self.seed_family * self.buckets} < {MIN_FAMILY_COVERAGE} * d = "
                f"{MIN_FAMILY_COVERAGE * self.d}: too few (seed, bucket) cells to identify a histogram over "
                f"{self.d} items; raise seed_family to at least {-(-MIN_FAMILY_COVERAGE * self.d // self.buckets)}"
            )

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the public parameters only (Beam ships mechanisms to workers; tables are rebuilt)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype([("seed", "<u4"), ("z", "<i8")])

    @property
    def epsilon_local(self) -> float:
        return self.epsilon  # replacement LDP for every fixed hash function

    @property
    def message_bits(self) -> int:
        return (self.seed_family - 1).bit_length() + (self.buckets - 1).bit_length()

    def encode(self, values: np.ndarray, rng: Randomness) -> np.ndarray:
        """Seed uniform in the family, hash, then GRR over the g buckets."""
        v = check_values(values, self.d)
        n = v.size
        seed = rng.integers(0, self.seed_family, n)
        keep = rng.random(n) < self.p
        r = rng.integers(0, self.buckets - 1, n)
        h = hash_to_buckets(seed, v, self.buckets)
        z = np.where(keep, h, r + (r >= h))
        return structured(self.report_dtype, seed=seed.astype(np.uint32), z=z)

    def validate(self, reports: np.ndarray) -> np.ndarray:
        bad = empty_mask_if_malformed(reports, self.report_dtype)
        if bad is not None:
            return bad
        seed, z = reports["seed"], reports["z"]
        return (seed >= 0) & (seed < self.seed_family) & (z >= 0) & (z < self.buckets)

    def new_accumulator(self) -> OLHAccumulator:
        return OLHAccumulator(self)

    @property
    def family_variance_factor(self) -> float:
        """``1/(1 - d/(S(g-1)))``: how much the finite-family decoder's variance exceeds the fully random
        hash's.

        The decoder inverts ``Pc - J/g = (1/S) sum_s (A_s^T A_s - J/g)``, an average of S independent
        projections of rank g - 1: a Wishart-like matrix with S(g - 1) degrees of freedom in dimension d.
        The noise of the support counts has (to leading order) the same shape, so the estimate's covariance
        is ``V_random (Pc - J/g)^{-1}`` up to scale, and the mean diagonal of the inverse of such a matrix is
        ``1/(1 - d/(S(g-1)))`` times the ideal one (inverse-Wishart mean). Ignoring it understated the
        variance by 1.5x at d = S = 1024, eps = 1 (coverage of +-1.96 se 89%); with it the calibration test
        (tests/statistical/test_calibration.py) holds at small and large d/S. ``S g >= 4 d`` keeps
        d/(S(g-1)) <= 1/2, so the factor is at most 2.
        """
        return 1.0 / (1.0 - self.d / (self.seed_family * (self.buckets - 1.0)))

    def variance(self, counts: np.ndarray, n: int) -> np.ndarray:
        """Per-item count variance of the decoder actually used: the fully random hash's (docs/mathematics.md §2.3)
        times ``family_variance_factor`` (the finite seed family's inflation)."""
        return rr_count_variance(counts, n, self.p, 1.0 / self.buckets) * self.family_variance_factor

    def parameters(self) -> dict[str, Any]:
        return {"d": self.d, "epsilon": self.epsilon, "g": self.buckets, "seed_family": self.seed_family}

    def blanket_decomposition(self) -> BlanketDecomposition | None:
        """The blanket pair of ``privacy.blanket_shuffle.blanket_olh`` over this family's range of pairwise
        collision rates (fraction of seeds on which two items share a bucket), counted exactly from the hash
        table; None (generic bound only) where counting every pair would cost more than MAX_PAIR_WORK."""
        return _olh_decomposition(self.epsilon, self.buckets, self.d, self.seed_family)

    # -- decoding ---------------------------------------------------------------------------------------

    @cached_property
    def hash_table(self) -> np.ndarray:
        """``H[s, v]`` for every seed of the family and item of the domain (S x d), computed once."""
        seeds = np.arange(self.seed_family, dtype=np.uint64)[:, None]
        return hash_to_buckets(seeds, np.arange(self.d)[None, :], self.buckets)

    @cached_property
    def _cell_index(self) -> np.ndarray:
        """Flat (seed, bucket) cell of every (seed, item): ``s * g + H[s, v]``, raveled (S*d,)."""
        rows = np.arange(self.seed_family, dtype=np.intp)[:, None] * self.buckets
        return (rows + self.hash_table).ravel()

    def support(self, counts: np.ndarray) -> np.ndarray:
        """``C_v = sum_s counts[s, H[s, v]]``: the number of reports consistent with each item, O(S*d)."""
        flat = np.asarray(counts).reshape(-1)
        return flat[self._cell_index].reshape(self.seed_family, self.d).sum(axis=0)

    def _collision_matvec(self, x: np.ndarray) -> np.ndarray:
        """``Pc @ x`` in O(S*d): per seed, sum ``x`` over each bucket, then read back each item's bucket."""
        S, g = self.seed_family, self.buckets
        weights = np.broadcast_to(x, (S, self.d)).ravel()
        bucket_sums = np.bincount(self._cell_index, weights=weights, minlength=S * g)
        return bucket_sums[self._cell_index].reshape(S, self.d).sum(axis=0) / S

    def expected_support(self, true_counts: np.ndarray) -> np.ndarray:
        """Exact ``E[C] = q' n 1 + (p - q') Pc c`` for true counts ``c`` (n = sum c)."""
        c = np.asarray(true_counts, dtype=np.float64)
        return self.q_other * c.sum() + (self.p - self.q_other) * self._collision_matvec(c)

    def decode_support(self, support: np.ndarray, n: int) -> tuple[np.ndarray, int]:
        """Solve ``(p - q')(Pc - J/g) c = C - n/g`` by CG; returns (unbiased counts, iterations)."""
        g, a = self.buckets, self.p - self.q_other
        rhs = np.asarray(support, dtype=np.float64) - n / g
        ideal = rhs / (self.p - 1.0 / g)
        if not np.any(rhs):
            return ideal, 0

        def matvec(x: np.ndarray) -> np.ndarray:
            x = np.ravel(x)
            return a * (self._collision_matvec(x) - x.sum() / g)

        operator = LinearOperator((self.d, self.d), matvec=matvec, dtype=np.float64)
        iterations = 0

        def count(_: np.ndarray) -> None:
            nonlocal iterations
            iterations += 1

        solution, info = cg(operator, rhs, x0=ideal, rtol=CG_RTOL, atol=0.0, maxiter=10 * self.d + 100,
                            callback=count)
        if info != 0:
            raise RuntimeError(
                f"OLH decoder did not converge (cg info={info}); the seed family ({self.seed_family} seeds, "
                f"g={g}) may not identify {self.d} items: increase seed_family"
            )
        return solution, iterations

    def exact_output_distribution(self, value: int) -> np.ndarray:
        """P(report == (s, z) | value) for every output, indexed ``s * g + z`` (S*g outputs)."""
        size = self.seed_family * self.buckets
        if size > MAX_ENUMERATED_OUTPUTS:
            raise ValueError(f"enumerating {size} outputs exceeds {MAX_ENUMERATED_OUTPUTS}")
        check_values(np.array([value]), self.d)
        return seed_family_law(self.hash_table[:, value], self.buckets, self.p, self.q_other)


MAX_PAIR_WORK = 1 << 27  # seed x item x item comparisons the collision range may take (~1 s)


@lru_cache(maxsize=32)
def _olh_decomposition(epsilon: float, g: int, d: int, seed_family: int) -> BlanketDecomposition | None:
    if d < 2 or seed_family * d * d > MAX_PAIR_WORK:
        return None
    table = hash_to_buckets(np.arange(seed_family, dtype=np.uint64)[:, None], np.arange(d)[None, :], g)
    same = np.zeros((d, d), dtype=np.int64)
    step = max(1, MAX_PAIR_WORK // (8 * d * d))
    for start in range(0, seed_family, step):
        block = table[start:start + step]
        same += (block[:, :, None] == block[:, None, :]).sum(axis=0)
    pairs = same[np.triu_indices(d, 1)] / seed_family
    return blanket_olh_classes(epsilon, g, pairs.tolist())


class OLHAccumulator(CountAccumulator):
    """Counts of reports per (seed, bucket) cell: S x g, whatever n."""

    mechanism: OLH

    def __init__(self, mechanism: OLH) -> None:
        super().__init__(mechanism, (mechanism.seed_family, mechanism.buckets))

    def _count(self, reports: np.ndarray) -> np.ndarray:
        m = self.mechanism
        cells = reports["seed"].astype(np.int64) * m.buckets + reports["z"]
        return np.bincount(cells, minlength=m.seed_family * m.buckets).reshape(m.seed_family, m.buckets)

    def _decode(self) -> tuple[np.ndarray, dict[str, Any]]:
        count, iterations = self.mechanism.decode_support(self.mechanism.support(self.counts), self.n)
        return count, {"solver_iterations": iterations}
