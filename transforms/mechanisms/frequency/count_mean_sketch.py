"""Count-mean sketch (Apple, ±1 form; docs/mathematics.md §2.6): m bits + a row index per report, for huge domains.

Public hash functions ``h_j(v) = hash_to_buckets(seed_j, v, m)`` with ``seed_j = hash_seed * 2^32 + j``
(``transforms.mechanisms.hashing``: deterministic, shared by clients and analyzer, no table to ship). A client
draws a row ``j`` uniform on [k], sets ``w = -1`` everywhere but ``w[h_j(v)] = +1`` and flips every coordinate
independently w.p. ``q = 1/(1 + e^(eps/2))``; the report is ``(j, bits)`` with bit ``l`` = 1 iff
``w~[l] = +1`` (packed MSB-first like OUE). Two coordinates differ between any two inputs: eps-LDP.

**Analyzer.** Apple's sketch row update ``M[j] += k((c/2) w~ + 1/2)``, ``c = (e^(eps/2)+1)/(e^(eps/2)-1)``, is
affine in the bits, so we keep integer counts only: ``ones[j, l]`` (reports of row j with bit l set) and
``n_j`` (reports of row j), stored as one ``k x (m + 1)`` int64 array; ``M`` is recomputed exactly from
them. With ``S_v = sum_j ones[j, h_j(v)]`` the estimate of §2.6 reduces to

    c_hat(v) = (m/(m-1)) ((1/k) sum_j M[j][h_j(v)] - n/m) = (m/(m-1)) (c (S_v - n/2) + n/2 - n/m).

**Unbiased only over hash functions.** ``E[c_hat(v) | family] = c_v + (m/(m-1)) sum_{u != v} c_u (P[u,v] - 1/m)``
with ``P[u,v]`` the fraction of rows on which u and v collide: for a *fixed* public family the collision term
is a bias of order ``c_u / sqrt(k m)`` per heavy item ``u``; it vanishes only in expectation over the hash
family. ``variance`` is the [D✓] formula of §2.6, taken over the family as well, so the reported standard
error covers this bias on average (the ``c_u^2 / (k (m-1))`` term); ``conditional_mean`` and
``conditional_variance`` give the exact moments given this family (for tests and diagnostics).

**Defaults** k = 256 rows, m = 1024 columns. m = 1024 (Apple's width) keeps the collision variance
``~n/m`` below 2 % of the privacy variance ``n V1`` for eps <= 6 (V1 = e^(eps/2)/(e^(eps/2)-1)^2).
k trades accumulator size (k x m int64: 2 MiB) against the family term ``sum_u c_u^2 / (k (m-1))``: with
km = 2^18 it stays below ``n V1`` while ``n sum_u f_u^2 < 2^18 V1`` (e.g. n = 10^6, sum f^2 = 0.06,
eps = 2: +25 %); raise k for bigger crowds with heavier heads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from transforms.mechanisms.base import Randomizer, Randomness, check_values
from transforms.mechanisms.frequency.counting import (
    CountAccumulator,
    empty_mask_if_malformed,
    exp_epsilon,
    freeze_domain_and_epsilon,
    structured,
)
from transforms.mechanisms.hashing import hash_to_buckets
from transforms.privacy.mixture import alpha_from_tv

__all__ = ["CountMeanSketch", "CountMeanSketchAccumulator"]

DEFAULT_ROWS = 256
DEFAULT_WIDTH = 1024
MAX_ROWS = 2**32  # rows and hash seeds share one uint64 seed: hash_seed * 2^32 + j
MAX_HASH_SEED = 2**32
MAX_CELLS = 2**27  # analyzer counts per window
MAX_CACHED_TABLE = 1 << 23  # k * d entries (int32) kept in memory; larger tables are hashed row by row
MAX_ENUMERATED_OUTPUTS = 1 << 20
_DIRECT_BITS = 1 << 22  # batches of at most this many bits (n * m) are unpacked; larger ones histogrammed
_HIST_BINS = 1 << 22  # (row, byte column, byte value) bins per counting pass: 32 MiB of int64
_ACCUMULATE_CHUNK = 1 << 14  # reports per bincount call (bounds the intp temporaries)
# _BYTE_BITS[b, i] = bit i of byte b in numpy's default (big-endian) packbits order
_BYTE_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1).astype(np.float64)


@dataclass(frozen=True)
class CountMeanSketch(Randomizer):
    """Apple's count-mean sketch, ±1 form: a row j and m randomized bits per report; estimates via k x m counts."""

    name: ClassVar[str] = "cms"
    payload_kind: ClassVar[str] = "sketch"
    d: int
    epsilon: float
    k: int = DEFAULT_ROWS
    m: int = DEFAULT_WIDTH
    hash_seed: int = 0

    def __post_init__(self) -> None:
        freeze_domain_and_epsilon(self)
        for label, value, low, high in (("k (hash rows)", self.k, 1, MAX_ROWS),
                                        ("m (sketch width)", self.m, 2, 2**31 - 1),
                                        ("hash_seed", self.hash_seed, 0, MAX_HASH_SEED - 1)):
            if isinstance(value, bool) or int(value) != value or not low <= value <= high:
                raise ValueError(f"{label} must be an integer in [{low}, {high}], got {value!r}")
        for name in ("k", "m", "hash_seed"):
            object.__setattr__(self, name, int(getattr(self, name)))
        if self.k * (self.m + 1) > MAX_CELLS:
            raise ValueError(
                f"k * (m + 1) = {self.k * (self.m + 1)} counts exceed {MAX_CELLS} (1 GiB of int64 per window); "
                "lower k (hash rows) or m (sketch width)"
            )

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the public parameters only (Beam ships mechanisms to workers; hash tables are rebuilt)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def q(self) -> float:
        """Flip probability of every coordinate, ``1/(1 + e^(eps/2))``."""
        return 1.0 / (1.0 + exp_epsilon(self.epsilon / 2.0))

    @property
    def c_eps(self) -> float:
        """Apple's debiasing constant ``(e^(eps/2)+1)/(e^(eps/2)-1) = 1/(1 - 2q)``."""
        return (exp_epsilon(self.epsilon / 2.0) + 1.0) / math.expm1(self.epsilon / 2.0)

    @property
    def v1(self) -> float:
        """Per-report privacy variance ``e^(eps/2)/(e^(eps/2)-1)^2 = (c^2 - 1)/4``."""
        return exp_epsilon(self.epsilon / 2.0) / math.expm1(self.epsilon / 2.0) ** 2

    @property
    def n_bytes(self) -> int:
        return -(-self.m // 8)

    @property
    def bit_length(self) -> int:
        """Bits carried in the payload's ``bits`` field (its Avro ``length``)."""
        return self.m

    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype([("row", "<i8"), ("bits", "u1", (self.n_bytes,))])

    @property
    def epsilon_local(self) -> float:
        return self.epsilon  # two coordinates differ, each an (eps/2) flip: ratio ((1-q)/q)^2 = e^eps

    @property
    def mixture_alpha(self) -> float:
        """``tanh(eps/4)/(e^eps - 1)``: on a row where h_j(v) != h_j(v') the two laws differ in two ±1
        coordinates, TV = (1-q)^2 - q^2 = 1 - 2q = tanh(eps/4); averaged over rows the TV is that times the
        fraction of separating rows, at most 1 (our bound, valid for every hash family)."""
        return alpha_from_tv(math.tanh(self.epsilon / 4.0), self.epsilon)

    @property
    def message_bits(self) -> int:
        return self.m + (self.k - 1).bit_length()

    def row_seeds(self, rows: np.ndarray) -> np.ndarray:
        """The public hash seed of each row: ``hash_seed * 2^32 + j`` (uint64)."""
        return (np.uint64(self.hash_seed) << np.uint64(32)) | np.asarray(rows).astype(np.uint64)

    def hash(self, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
        """``h_rows(values)`` in [m], broadcasting ``rows`` against ``values``."""
        return hash_to_buckets(self.row_seeds(rows), np.asarray(values), self.m)

    def encode(self, values: np.ndarray, rng: Randomness) -> np.ndarray:
        """Row uniform on [k], then one uniform per coordinate: bit l is set iff u_l < (1-q if l = h_j(v) else q).

        Memory O(batch * m) floats (one draw of shape (n, m)): the Beam layer encodes bundles.
        """
        v = check_values(values, self.d)
        n = v.size
        row = np.asarray(rng.integers(0, self.k, n), dtype=np.int64)
        u = rng.random((n, self.m))
        bits = u < self.q
        idx = np.arange(n)
        col = self.hash(row, v)
        bits[idx, col] = u[idx, col] < 1.0 - self.q
        return structured(self.report_dtype, row=row, bits=np.packbits(bits, axis=1))

    def validate(self, reports: np.ndarray) -> np.ndarray:
        """Row in [k] and zero padding bits."""
        bad = empty_mask_if_malformed(reports, self.report_dtype)
        if bad is not None:
            return bad
        pad = 8 * self.n_bytes - self.m
        row = reports["row"]
        padding_clear = (reports["bits"][:, -1] & np.uint8((1 << pad) - 1)) == 0
        return (row >= 0) & (row < self.k) & padding_clear

    def new_accumulator(self) -> CountMeanSketchAccumulator:
        return CountMeanSketchAccumulator(self)

    def variance(self, counts: np.ndarray, n: int) -> np.ndarray:
        """[D✓] variance of §2.6 over reports *and* the hash family, with the c_u^2 term (plug-in counts):
        ``(m/(m-1))^2 n V1 + (1/(m-1)) sum_{u != v} (c_u (1 - 1/k) + c_u^2 / k)``."""
        c = np.asarray(counts, dtype=np.float64)
        k, m = self.k, self.m
        others = (n - c) * (1.0 - 1.0 / k) + (float(np.sum(c * c)) - c * c) / k
        return (m / (m - 1.0)) ** 2 * n * self.v1 + others / (m - 1.0)

    def parameters(self) -> dict[str, Any]:
        return {"d": self.d, "epsilon": self.epsilon, "k": self.k, "m": self.m, "hash_seed": self.hash_seed}

    # -- decoding ---------------------------------------------------------------------------------------

    @cached_property
    def _hash_table(self) -> np.ndarray | None:
        """``h_j(v)`` for all rows and items (k x d int32) if small enough to keep, else None."""
        if self.k * self.d > MAX_CACHED_TABLE:
            return None
        return self.hash(np.arange(self.k)[:, None], np.arange(self.d)[None, :]).astype(np.int32)

    def support(self, ones: np.ndarray) -> np.ndarray:
        """``S_v = sum_j ones[j, h_j(v)]`` for every item, O(k d).

        Small ``k d``: one gather through the cached table. Otherwise row by row (a 1-D hash of the domain per
        row, ~30 ns per (row, item): 8 s for d = 2^20, k = 256), never materialising k x d."""
        flat = np.ascontiguousarray(ones, dtype=np.int64).ravel()
        table = self._hash_table
        if table is not None:
            return flat.take(table + (np.arange(self.k, dtype=np.int32) * self.m)[:, None]).sum(axis=0)
        items = np.arange(self.d, dtype=np.uint64)
        total = np.zeros(self.d, dtype=np.int64)
        for j in range(self.k):
            total += flat[j * self.m : (j + 1) * self.m].take(self.hash(np.int64(j), items))
        return total

    def decode_support(self, support: np.ndarray, n: int) -> np.ndarray:
        """Apple's estimate ``(m/(m-1)) (c (S_v - n/2) + n/2 - n/m)`` from the supports S_v."""
        m = self.m
        s = np.asarray(support, dtype=np.float64)
        return (m / (m - 1.0)) * (self.c_eps * (s - n / 2.0) + n / 2.0 - n / m)

    def collision_fraction(self) -> np.ndarray:
        """``P[u, v]`` = fraction of rows on which u and v share a bucket (d x d; small d only)."""
        table = self.hash(np.arange(self.k)[:, None], np.arange(self.d)[None, :])
        return (table[:, :, None] == table[:, None, :]).mean(axis=0)

    def conditional_mean(self, true_counts: np.ndarray) -> np.ndarray:
        """``E[c_hat | this hash family] = (m/(m-1)) (P c - n/m)`` (exact; small d only)."""
        c = np.asarray(true_counts, dtype=np.float64)
        m = self.m
        return (m / (m - 1.0)) * (self.collision_fraction() @ c - c.sum() / m)

    def conditional_variance(self, true_counts: np.ndarray) -> np.ndarray:
        """``Var[c_hat | family] = (m/(m-1))^2 sum_u c_u (V1 + P[u,v](1 - P[u,v]))`` (exact; small d only).

        Per report of value u: ``Y = x~[h_J(v)]/k`` has mean P[u,v] and variance (c^2-1)/4 + P(1-P)."""
        c = np.asarray(true_counts, dtype=np.float64)
        p = self.collision_fraction()
        m = self.m
        return (m / (m - 1.0)) ** 2 * ((self.v1 + p * (1.0 - p)) @ c)

    def exact_output_distribution(self, value: int) -> np.ndarray:
        """P(report == (j, pattern) | value), indexed ``j * 2^m + pattern`` with bit l of pattern = bit l."""
        size = self.k << self.m
        if self.m > 20 or size > MAX_ENUMERATED_OUTPUTS:
            raise ValueError(f"enumerating k * 2^m = {self.k} * 2^{self.m} outputs exceeds {MAX_ENUMERATED_OUTPUTS}")
        check_values(np.array([value]), self.d)
        patterns = (np.arange(1 << self.m)[:, None] >> np.arange(self.m)[None, :]) & 1
        hot = self.hash(np.arange(self.k), np.full(self.k, value))
        one = np.full((self.k, self.m), self.q)
        one[np.arange(self.k), hot] = 1.0 - self.q
        probs = np.where(patterns[None, :, :] == 1, one[:, None, :], 1.0 - one[:, None, :]).prod(axis=2)
        return (probs / self.k).ravel()


class CountMeanSketchAccumulator(CountAccumulator):
    """``counts[j, :m]`` = reports of row j with each bit set, ``counts[j, m]`` = reports of row j (k x (m+1))."""

    mechanism: CountMeanSketch

    def __init__(self, mechanism: CountMeanSketch) -> None:
        super().__init__(mechanism, (mechanism.k, mechanism.m + 1))

    def _count(self, reports: np.ndarray) -> np.ndarray:
        """Set bits per (row, column) and reports per row of a batch, sorted by row first (rows contiguous)."""
        mech = self.mechanism
        out = np.zeros((mech.k, mech.m + 1), dtype=np.int64)
        order = np.argsort(reports["row"], kind="stable")
        rows = reports["row"][order]
        bits = reports["bits"][order]
        out[:, mech.m] = np.bincount(rows, minlength=mech.k)
        if rows.size * mech.m <= _DIRECT_BITS:
            _count_unpacked(rows, bits, out[:, : mech.m])
        else:
            _count_byte_histograms(rows, bits, out[:, : mech.m])
        return out

    @property
    def ones(self) -> np.ndarray:
        """Counts of set bits per (row, column), k x m."""
        return self.counts[:, : self.mechanism.m]

    @property
    def row_counts(self) -> np.ndarray:
        """Reports per row, k."""
        return self.counts[:, self.mechanism.m]

    def sketch(self) -> np.ndarray:
        """Apple's sketch matrix ``M[j] = sum k((c/2) w~ + 1/2) = k (c (ones - n_j/2) + n_j/2)`` (k x m floats)."""
        mech = self.mechanism
        nj = self.row_counts[:, None].astype(np.float64)
        return mech.k * (mech.c_eps * (self.ones - nj / 2.0) + nj / 2.0)

    def _decode(self) -> tuple[np.ndarray, dict[str, Any]]:
        mech = self.mechanism
        return mech.decode_support(mech.support(self.ones), self.n), {}


def _count_unpacked(rows: np.ndarray, bits: np.ndarray, ones: np.ndarray) -> None:
    """Small batches: unpack (n x m uint8) and sum each row's run with ``reduceat`` (~15 ns per bit)."""
    starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
    unpacked = np.unpackbits(bits, axis=1, count=ones.shape[1])
    ones[rows[starts]] += np.add.reduceat(unpacked, starts, axis=0, dtype=np.int64)


def _count_byte_histograms(rows: np.ndarray, bits: np.ndarray, ones: np.ndarray) -> None:
    """Large batches: per (row, byte column) histograms of byte values times a 256 x 8 bit table, as OUE counts
    bits (~2 ns per bit, plus ~0.1 s per call for the k x ceil(m/8) x 256 table); never n x m unpacked bits.
    Rows are processed in blocks of at most _HIST_BINS bins (``rows`` sorted, so each block is contiguous)."""
    k, m = ones.shape
    nb = bits.shape[1]
    bounds = np.searchsorted(rows, np.arange(k + 1))
    offsets = np.arange(nb, dtype=np.intp) * 256
    per_block = max(1, _HIST_BINS // (nb * 256))
    for first in range(0, k, per_block):
        last = min(first + per_block, k)
        lo, hi = int(bounds[first]), int(bounds[last])
        if lo == hi:
            continue
        hist = np.zeros((last - first) * nb * 256, dtype=np.int64)
        for start in range(lo, hi, _ACCUMULATE_CHUNK):
            stop = min(start + _ACCUMULATE_CHUNK, hi)
            cell = (rows[start:stop, None] - first) * (nb * 256) + offsets + bits[start:stop]
            hist += np.bincount(cell.ravel(), minlength=hist.size)
        block = hist.reshape(-1, 256).astype(np.float64) @ _BYTE_BITS  # exact: counts < 2^53
        ones[first:last] += np.rint(block).astype(np.int64).reshape(last - first, nb * 8)[:, :m]

