"""Linear local hashing (LLH): OLH with GF(2)-linear hashes, decoded by one Walsh-Hadamard transform.

Same randomizer as OLH (docs/mathematics.md §2.3): the client draws a public seed, hashes its value to
``h = H_seed(v)`` in [g] and reports ``(seed, z)`` with ``z`` = GRR(h) over g buckets. The difference is
the hash family: ``g = 2^k`` and ``H_seed(v) = R v`` over GF(2), where the k x bits matrix ``R`` (row i is an
``bits``-bit word) is expanded from a 63-bit seed by SplitMix64.

**Why.** The OLH decoder of ``olh.py`` aggregates reports by (seed, z) over a small seed family and needs
O(seed_family * d) work and memory with ``seed_family * g >= 4 d``, i.e. O(d^2 / g): infeasible for the
2^16-leaf level of a range tree. With a linear hash the support ``C_v = #{reports : R v = z}`` is a
Walsh-Hadamard transform of a d-array the analyzer can accumulate report by report,

    1[R v = z] = 2^-k sum_{u in GF(2)^k} (-1)^{u.z} (-1)^{(R^T u).v}
    =>  C = FWHT(W) / g,   W[w] = sum_reports sum_u (-1)^{u.z} 1[R^T u = w],

so the state is one int64 array of 2^bits entries (mergeable by addition), accumulation costs O(g) per
report and decoding O(d log d). For a uniformly random matrix, distinct x, v, w have ``R(x - v)`` and
``R(x - w)`` independent and uniform (two distinct non-zero vectors over GF(2) are linearly independent), so
every report is consistent with a non-held item with probability exactly 1/g independently of the others:
the textbook estimator ``(C - n/g)/(p - 1/g)`` is unbiased, ``rr_count_variance(c, n, p, 1/g)`` is its exact
variance and estimates of distinct items are uncorrelated. The SplitMix64 expansion stands in for a uniform
matrix (2^63 seeds, no aggregation by seed needed); privacy never depends on it, since for every fixed
seed the report is GRR over g buckets of a data-independent function of the value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from transforms.mechanisms.base import FrequencyEstimate, Randomness, check_values
from transforms.mechanisms.frequency.counting import (
    HashedGRR,
    check_mergeable,
    empty_mask_if_malformed,
    freeze_domain_and_epsilon,
    refuse_invalid,
    rr_count_variance,
    structured,
)
from transforms.mechanisms.randomness import splitmix64_mix

__all__ = [
    "MAX_LLH_BITS",
    "MAX_LLH_BUCKETS",
    "LinearHashCounts",
    "LinearLocalHashing",
    "draw_seeds",
    "fwht",
    "linear_hash",
    "llh_buckets",
]

MAX_LLH_BITS = 24  # state 2^24 int64 = 128 MiB per domain: beyond that use a prefix tree
MAX_LLH_BUCKETS = 1 << 16
DEFAULT_MAX_BUCKETS = 1 << 12  # accumulation is O(g) per report; above e^eps ~ 4096 the variance gain is small
SEED_BITS = 63  # seeds travel as non-negative Avro longs
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_CHUNK_CELLS = 1 << 22  # reports * g per accumulation pass


def llh_buckets(epsilon: float, cap: int = DEFAULT_MAX_BUCKETS) -> int:
    """The power of two g minimising the OLH variance factor ``(1/g)(1 - 1/g)/(p - 1/g)^2`` (at most ``cap``).

    OLH's optimum is g = e^eps + 1; we take the better of the two neighbouring powers of two.
    """
    e = math.exp(min(epsilon, 700.0))

    def factor(g: int) -> float:
        p = e / (e + g - 1)
        return (1 / g) * (1 - 1 / g) / (p - 1 / g) ** 2

    k = max(1, math.floor(math.log2(e + 1.0)))
    options = [g for g in (2**k, 2 ** (k + 1)) if g <= cap] or [cap]
    return min(options, key=factor)


def fwht(x: np.ndarray) -> np.ndarray:
    """Unnormalised Walsh-Hadamard transform along the last axis (length a power of two), natural order:
    ``out[v] = sum_w x[w] (-1)^{popcount(v & w)}``. Integer input stays integer (exact)."""
    a = np.array(x, copy=True)
    n = a.shape[-1]
    if n & (n - 1):
        raise ValueError(f"FWHT length must be a power of two, got {n}")
    lead = a.shape[:-1]
    h = 1
    while h < n:
        a = a.reshape(*lead, n // (2 * h), 2, h)
        top, bottom = a[..., 0, :], a[..., 1, :]
        a = np.stack((top + bottom, top - bottom), axis=-2)
        h *= 2
    return a.reshape(*lead, n)


def draw_seeds(rng: Randomness, n: int) -> np.ndarray:
    """n uniform 63-bit seeds as int64, from two 32-bit draws per client (batch-first, data-independent)."""
    w = rng.integers(0, 2**32, (n, 2)).astype(np.uint64)
    seeds = ((w[:, 0] & np.uint64(0x7FFFFFFF)) << np.uint64(32)) | w[:, 1]
    return seeds.astype(np.int64)


def hash_rows(seeds: np.ndarray, k: int) -> np.ndarray:
    """The k matrix rows (uint64 words, one per output bit) of each seed: SplitMix64 stream of the seed."""
    s = np.asarray(seeds).astype(np.uint64)[..., None]
    ctr = np.arange(1, k + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return splitmix64_mix(s + ctr * _GAMMA)


def _parity(x: np.ndarray) -> np.ndarray:
    """Parity of each uint64 (xor fold), as int64 0/1."""
    x = x.copy()
    for shift in (32, 16, 8, 4, 2, 1):
        x ^= x >> np.uint64(shift)
    return (x & np.uint64(1)).astype(np.int64)


def linear_hash(seeds: np.ndarray, values: np.ndarray, k: int) -> np.ndarray:
    """``H_seed(value) = R value`` over GF(2) in [0, 2^k), broadcasting ``seeds`` against ``values``.

    Bit i of the hash is the parity of ``row_i & value``; values must be non-negative integers (only their
    low bits meet the row, so one seed hashes every domain size consistently).
    """
    s, v = np.broadcast_arrays(np.asarray(seeds), np.asarray(values))
    rows = hash_rows(s, k)
    vv = v.astype(np.uint64)[..., None]
    bits = _parity(rows & vv)
    return (bits << np.arange(k, dtype=np.int64)).sum(axis=-1)


class LinearHashCounts:
    """The transform-domain state ``W`` (int64, 2^bits) of LLH reports over a ``bits``-bit domain.

    ``add`` costs O(g) per report; ``support()`` returns ``C_v`` (reports consistent with each value).
    """

    def __init__(self, bits: int, k: int) -> None:
        self.bits, self.k = int(bits), int(k)
        self.w = np.zeros(1 << self.bits, dtype=np.int64)

    def add(self, seeds: np.ndarray, z: np.ndarray) -> None:
        """Fold reports: for each report, the 2^k words ``R^T u`` with signs ``(-1)^{u.z}``.

        Each (word, sign) pair is coded as ``2 word + sign bit``; both parts are XOR-linear in u, so the
        2^k codes of a report are built by doubling (``code[u + 2^i] = code[u] ^ (2 row_i + z_i)``) and
        counted by one bincount over 2 * 2^bits cells.
        """
        size, g, k = self.w.size, 1 << self.k, self.k
        mask = np.uint64(size - 1)
        step = max(1, _CHUNK_CELLS // g)
        for start in range(0, len(seeds), step):
            rows = (hash_rows(seeds[start : start + step], k) & mask).astype(np.int64)
            zz = np.asarray(z[start : start + step], dtype=np.int64)
            gen = (rows << 1) | ((zz[:, None] >> np.arange(k)) & 1)
            codes = np.empty((len(rows), g), dtype=np.int64)
            codes[:, 0] = 0
            h = 1
            for i in range(k):
                np.bitwise_xor(codes[:, :h], gen[:, i : i + 1], out=codes[:, h : 2 * h])
                h *= 2
            cells = np.bincount(codes.ravel(), minlength=2 * size)
            self.w += cells[0::2] - cells[1::2]

    def merge(self, other: LinearHashCounts) -> None:
        if (other.bits, other.k) != (self.bits, self.k):
            raise ValueError(f"cannot merge LLH counts over {other.bits} bits, k={other.k} into {self.bits}, {self.k}")
        self.w += other.w

    def support(self) -> np.ndarray:
        """``C_v`` for every v in [0, 2^bits): an exact integer array."""
        total = fwht(self.w)
        g = 1 << self.k
        if np.any(total % g):
            raise RuntimeError("LLH transform state is corrupt: FWHT(W) must be divisible by g")
        return total // g


@dataclass(frozen=True)
class LinearLocalHashing(HashedGRR):
    """OLH with a GF(2)-linear hash family: one (seed, z) per report, exactly unbiased FWHT decoding.

    Variance as OLH's (~4 n e^eps/(e^eps - 1)^2 at the best g) for any d up to 2^24; the analyzer keeps
    2^ceil(log2 d) integers. ``g`` must be a power of two (default: ``llh_buckets(epsilon)``).
    """

    name: ClassVar[str] = "llh"
    payload_kind: ClassVar[str] = "hashed"
    d: int
    epsilon: float
    g: int | None = None

    def __post_init__(self) -> None:
        freeze_domain_and_epsilon(self)
        g = llh_buckets(self.epsilon) if self.g is None else self.g
        if isinstance(g, bool) or int(g) != g or g < 2 or g > MAX_LLH_BUCKETS or int(g) & (int(g) - 1):
            raise ValueError(f"LLH buckets g must be a power of two in [2, {MAX_LLH_BUCKETS}], got {g!r}")
        object.__setattr__(self, "g", int(g))
        if self.bits > MAX_LLH_BITS:
            raise ValueError(
                f"LLH keeps 2^ceil(log2 d) counts; d={self.d} needs {self.bits} bits > {MAX_LLH_BITS}: "
                "use a prefix tree (heavy_hitters.PrefixHeavyHitters) for larger domains"
            )

    @property
    def k(self) -> int:
        """Hash output bits, log2 g."""
        return self.buckets.bit_length() - 1

    @property
    def bits(self) -> int:
        """Domain bits: values live in [0, 2^bits) for the transform."""
        return max(1, (self.d - 1).bit_length())

    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype([("seed", "<i8"), ("z", "<i8")])

    @property
    def epsilon_local(self) -> float:
        return self.epsilon  # GRR over g buckets for every fixed seed

    @property
    def message_bits(self) -> int:
        return SEED_BITS + self.k

    def encode(self, values: np.ndarray, rng: Randomness) -> np.ndarray:
        """Seed (two 32-bit draws), keep coin, replacement bucket: three batch-first draws per call."""
        v = check_values(values, self.d)
        n = v.size
        seeds = draw_seeds(rng, n)
        keep = rng.random(n) < self.p
        r = rng.integers(0, self.buckets - 1, n)
        h = linear_hash(seeds, v, self.k)
        return structured(self.report_dtype, seed=seeds, z=np.where(keep, h, r + (r >= h)))

    def validate(self, reports: np.ndarray) -> np.ndarray:
        bad = empty_mask_if_malformed(reports, self.report_dtype)
        if bad is not None:
            return bad
        seed, z = reports["seed"], reports["z"]
        return (seed >= 0) & (z >= 0) & (z < self.buckets)

    def new_accumulator(self) -> LinearHashAccumulator:
        return LinearHashAccumulator(self)

    def variance(self, counts: np.ndarray, n: int) -> np.ndarray:
        """Exact per-item variance for a uniformly random linear hash (module docstring)."""
        return rr_count_variance(counts, n, self.p, 1.0 / self.buckets)

    def parameters(self) -> dict[str, Any]:
        return {"d": self.d, "epsilon": self.epsilon, "g": self.buckets}

    def decode_support(self, support: np.ndarray, n: int) -> np.ndarray:
        """Unbiased counts ``(C - n/g)/(p - 1/g)`` of the first d values."""
        g = self.buckets
        return (np.asarray(support[: self.d], dtype=np.float64) - n / g) / (self.p - 1.0 / g)

    def exact_output_distribution(self, value: int, seeds: np.ndarray) -> np.ndarray:
        """P(z | seed, value) for the given seeds (rows) and every z (columns): the seed is drawn independently
        of the value, so the LDP ratio of (seed, z) is the ratio of these conditional laws."""
        check_values(np.array([value]), self.d)
        s = np.asarray(seeds, dtype=np.int64)
        out = np.full((s.size, self.buckets), self.q_other)
        out[np.arange(s.size), linear_hash(s, np.full(s.size, value), self.k)] = self.p
        return out


class LinearHashAccumulator:
    """Transform-domain counts of LLH reports (2^bits int64) and the number of reports."""

    def __init__(self, mechanism: LinearLocalHashing) -> None:
        self.mechanism = mechanism
        self.counts = LinearHashCounts(mechanism.bits, mechanism.k)
        self.n = 0

    def add(self, reports: np.ndarray, clients: int | None = None) -> None:
        """Fold validated reports (``clients`` ignored: single message)."""
        arr = np.asarray(reports)
        if arr.size == 0:
            return
        refuse_invalid(self.mechanism.validate(arr), "reports are outside the llh output domain")
        self.counts.add(arr["seed"], arr["z"])
        self.n += int(arr.size)

    def merge(self, other: Any) -> None:
        check_mergeable(self, other)
        self.counts.merge(other.counts)
        self.n += other.n

    def estimate(self) -> FrequencyEstimate:
        if self.n == 0:
            raise ValueError("no reports")
        count = self.mechanism.decode_support(self.counts.support(), self.n)
        plug_in = np.clip(count, 0.0, float(self.n))
        stderr = np.sqrt(self.mechanism.variance(plug_in, self.n)) / self.n
        return FrequencyEstimate(count=count, frequency=count / self.n, stderr=stderr, n=self.n)

    def __repr__(self) -> str:
        return f"LinearHashAccumulator({self.mechanism!r}, n={self.n})"
