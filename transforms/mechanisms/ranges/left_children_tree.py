"""Range answers from a frequency oracle on [MultiMsg]'s left-children node set (docs/mathematics.md §7.3, §5).

**Structure** (``B = 2^bits`` leaves). The kept nodes are the root and every left child ``(l, i)``, l >= 1,
i even, covering leaves ``[i 2^(bits-l), (i+1) 2^(bits-l))``; node ids run top-to-bottom, left-to-right:
root -> 0, ``(l, i) -> 2^(l-1) + i/2`` (``B`` ids in all). A client holding leaf x "holds" the kept nodes
that contain x (``user_sets``): the root plus, per level l, its level-l ancestor when that one is a left child
(bit bits-l of x is 0). The estimator of a frequency oracle on these sets gives an unbiased ``x_hat`` per node.

**Prefix counts** ``P(c) = #{leaf < c}`` are the sum of the left siblings on the root -> c path (for c < B),
and ``P(B) = n``, public and exact (the root's oracle estimate is kept in the rows but never needed). A range
``[lo, hi)`` is ``P(hi) - P(lo)``: coefficients in {-1, 0, +1} on <= 2 bits nodes. The full dyadic tree is the
same linear map (``consistent``: a right child is its parent minus its left sibling, the root is n), so node
counts, ranges and prefix sums all agree exactly.

**Variance** (private-coin Hadamard oracle, §7.1, exact). Every message not sent for node a lies in
``C_a^tau`` with probability ``p = 2^-tau``, independently across messages, so
``Var x_hat_a = (N - x_a) p/(1-p)`` with N the number of messages. Two supports ``C_a``, ``C_b`` are
independent under a blanket message or a data message of any item l, EXCEPT when ``(l+1) = (a+1) XOR (b+1)``
(the three codeword rows are then linearly dependent and a message of l is in C_a iff it is in C_b): so
``Cov(x_hat_a, x_hat_b) = x_l p/(1-p)`` with ``l = ((a+1) ^ (b+1)) - 1`` (0 if l is no item). The items l
include the protocol's dummies: slot s of a client's set holds its level-s node or, if it has none, dummy
``B + s``, so dummy ``B + s`` is held by the clients whose level-s ancestor is a right child, which the tree
gives linearly. Variances use plug-in counts clipped to [0, n].

**Rows** (``range_tree.ROW_DTYPE``, ``structure = "left_children"``): the root row (level 0, index 0,
estimate = the oracle's ``x_hat_root``, its stderr) and one row per left child (level l, even index i,
``x_hat``, stderr). Constant columns, equal on every row: ``clients`` = n, ``var_intercept`` =
``N p/(1-p)``, ``var_slope`` = ``-p/(1-p)`` (so ``Var x_hat = var_intercept + var_slope x``), ``cov_beta`` =
``p/(1-p)`` (``Cov = cov_beta x_l`` as above; NOT the GRR meaning it has in a dyadic tree).

The CDF search for quantiles (isotonic fit, band inversion) is ``RangeTree``'s own code, borrowed: it only
reads ``n``, ``bits``, ``_cumulative`` and ``answers``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from transforms.mechanisms.ranges.range_tree import ROW_DTYPE, QuantileEstimate, RangeTree

__all__ = ["LeftChildrenTree", "QuantileEstimate", "node_id", "prefix_terms", "range_terms", "user_sets"]

_CHUNK_CELLS = 1 << 22  # (ranges x terms x terms) covariance cells evaluated at once


def node_id(level: np.ndarray | int, index: np.ndarray | int) -> np.ndarray:
    """Id of kept node (level, index): 0 for the root, ``2^(level-1) + index/2`` for a left child."""
    lv, ix = np.asarray(level, dtype=np.int64), np.asarray(index, dtype=np.int64)
    if np.any((lv > 0) & (ix % 2 != 0)) or np.any((lv == 0) & (ix != 0)) or np.any(lv < 0):
        raise ValueError("only the root (0, 0) and left children (level >= 1, even index) are kept nodes")
    return np.where(lv == 0, 0, (np.int64(1) << np.maximum(lv - 1, 0)) + ix // 2)


def user_sets(leaves: np.ndarray, bits: int) -> np.ndarray:
    """``(n, bits + 1)`` node-id sets: slot 0 the root, slot l the level-l ancestor if it is a left child, else -1.

    Slot l is tied to level l so that the protocol's dummy for slot l (item ``2^bits + l``) marks "level-l
    ancestor is a right child"; its count is then a linear function of the tree (used by the covariance).
    """
    x = np.asarray(leaves, dtype=np.int64)
    levels = np.arange(1, bits + 1, dtype=np.int64)
    shift = bits - levels
    prefix = x[:, None] >> shift  # ancestor index at each level
    ids = (np.int64(1) << (levels - 1)) + (prefix >> 1)
    sets = np.where(prefix & 1, -1, ids)
    return np.concatenate([np.zeros((x.size, 1), np.int64), sets], axis=1)


def prefix_terms(c: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, coef)`` of shape ``(R, bits)`` with ``P(c) = sum coef * x_hat[ids]`` (c < 2^bits), all-zero at c = B
    (there ``P(B) = n``, exact). Unused terms have coefficient 0 and id 0."""
    cc = np.asarray(c, dtype=np.int64)[:, None]
    levels = np.arange(1, bits + 1, dtype=np.int64)
    used = ((cc >> (bits - levels)) & 1).astype(bool) & (cc < (1 << bits))
    ids = np.where(used, (np.int64(1) << (levels - 1)) + (cc >> (bits - levels + 1)), 0)
    return ids, used.astype(np.float64)


def range_terms(lo: np.ndarray, hi: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, coef)`` of shape ``(R, 2 bits)``: ``#[lo, hi) = P(hi) - P(lo) (+ n if hi = B, - n if lo = B)``."""
    ids_hi, coef_hi = prefix_terms(hi, bits)
    ids_lo, coef_lo = prefix_terms(lo, bits)
    return np.concatenate([ids_hi, ids_lo], axis=1), np.concatenate([coef_hi, -coef_lo], axis=1)


@dataclass(frozen=True, eq=False)
class LeftChildrenTree:
    """Node estimates of the left-children structure (indexed by node id) with the oracle's variance constants.

    Same query surface as :class:`RangeTree`: ``n``, ``answer``/``answers`` over leaves [lo, hi), ``cdf``,
    ``quantile``/``median`` (:class:`QuantileEstimate`), ``consistent``, ``prefix_lengths``, rows.
    """

    structure: ClassVar[str] = "left_children"
    bits: int
    n: int
    estimates: np.ndarray  # x_hat per node id, length 2^bits (id 0 = root)
    var_intercept: float  # N p / (1 - p)
    cov_beta: float  # p / (1 - p)

    def __post_init__(self) -> None:
        if isinstance(self.bits, bool) or int(self.bits) != self.bits or self.bits < 1:
            raise ValueError(f"bits must be an integer >= 1, got {self.bits!r}")
        object.__setattr__(self, "bits", int(self.bits))
        est = np.asarray(self.estimates, dtype=np.float64)
        if est.shape != (1 << self.bits,):
            raise ValueError(f"need one estimate per node id (2^{self.bits}), got shape {est.shape}")
        object.__setattr__(self, "estimates", est)
        if int(self.n) != self.n or self.n < 1:
            raise ValueError(f"n must be a positive integer (the clients analyzed), got {self.n!r}")
        object.__setattr__(self, "n", int(self.n))
        if not (np.isfinite(self.var_intercept) and np.isfinite(self.cov_beta) and self.cov_beta >= 0):
            raise ValueError(f"variance constants must be finite (cov_beta >= 0), got {self.var_intercept!r}, "
                             f"{self.cov_beta!r}")

    # -- structure ----------------------------------------------------------------------------------

    @property
    def prefix_lengths(self) -> tuple[int, ...]:
        return tuple(range(1, self.bits + 1))

    @property
    def levels(self) -> int:
        return self.bits

    @property
    def var_slope(self) -> float:
        return -float(self.cov_beta)

    def level_estimates(self, level: int) -> np.ndarray:
        """Raw ``x_hat`` of the left children of a level (indices 0, 2, 4, ...)."""
        return self.estimates[1 << (level - 1) : 1 << level]

    @cached_property
    def consistent(self) -> tuple[np.ndarray, ...]:
        """Every node of the dyadic tree, per level 1..bits, by the linear map: left child = its x_hat,
        right child = parent - left sibling, root = n. Children sum to parents exactly."""
        out, parent = [], np.array([float(self.n)])
        for level in self.prefix_lengths:
            left = self.level_estimates(level)
            nodes = np.empty(1 << level)
            nodes[0::2], nodes[1::2] = left, parent - left
            out.append(nodes)
            parent = nodes
        return tuple(out)

    @cached_property
    def _cumulative(self) -> np.ndarray:
        """P(c) for c = 0..2^bits (equals the left-sibling sums of §7.3 and P(B) = n)."""
        cum = np.concatenate(([0.0], np.cumsum(self.consistent[-1])))
        cum[-1] = self.n  # exactly (no round-off from the cumulative sum)
        return cum

    @cached_property
    def _plug_in_items(self) -> np.ndarray:
        """Plug-in count of every Hadamard item ``0 .. 2^(bits+1) - 1``: nodes, then the dummies of slot s
        (clients whose level-s ancestor is a right child; slot 0, the root, is never empty), then zeros."""
        size = 1 << self.bits
        items = np.zeros(2 * size + 1)
        items[:size] = self.estimates
        items[size + 1 : size + 1 + self.bits] = [c[1::2].sum() for c in self.consistent]
        return np.clip(items, 0.0, float(self.n))

    # -- variance -----------------------------------------------------------------------------------

    def _kernel(self, ids: np.ndarray) -> np.ndarray:
        """``Cov(x_hat[ids[..., i]], x_hat[ids[..., j]])`` at the plug-in, shape ``ids.shape + ids.shape[-1:]``."""
        x = self._plug_in_items
        rows = ids + 1
        xor = rows[..., :, None] ^ rows[..., None, :]  # (l + 1) of the item coupling each pair; 0 on equal ids
        diagonal = self.var_intercept + self.var_slope * x[ids]
        return np.where(xor == 0, diagonal[..., :, None], self.cov_beta * x[np.maximum(xor - 1, 0)])

    def node_covariance(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Covariance matrix of the node estimates ``x_hat[ids]`` (exact form, plug-in counts)."""
        return self._kernel(np.asarray(ids, dtype=np.int64))

    def terms_variance(self, ids: np.ndarray, coef: np.ndarray) -> np.ndarray:
        """Exact variance (at the plug-in) of ``sum coef * x_hat[ids]`` per row of ``(R, T)`` arrays."""
        ids, coef = np.atleast_2d(ids).astype(np.int64), np.atleast_2d(coef).astype(np.float64)
        out = np.empty(ids.shape[0])
        step = max(1, _CHUNK_CELLS // max(1, ids.shape[1] ** 2))
        for s in range(0, ids.shape[0], step):
            c = coef[s : s + step]
            out[s : s + step] = np.einsum("ri,rij,rj->r", c, self._kernel(ids[s : s + step]), c)
        return np.maximum(out, 0.0)

    def node_stderr(self) -> np.ndarray:
        """Marginal stderr of every node estimate (by id), plug-in at the clipped estimate."""
        x = np.clip(self.estimates, 0.0, float(self.n))
        return np.sqrt(np.maximum(self.var_intercept + self.var_slope * x, 0.0))

    # -- queries ------------------------------------------------------------------------------------

    def answers(self, lo: Sequence[int] | np.ndarray, hi: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Estimated counts of clients with leaf in [lo, hi) and their standard errors, for arrays of ranges."""
        lo_a, hi_a = np.atleast_1d(np.asarray(lo, dtype=np.int64)), np.atleast_1d(np.asarray(hi, dtype=np.int64))
        if lo_a.shape != hi_a.shape or np.any(lo_a < 0) or np.any(hi_a > (1 << self.bits)) or np.any(lo_a > hi_a):
            raise ValueError(f"ranges must satisfy 0 <= lo <= hi <= 2^{self.bits} (same shapes)")
        cum = self._cumulative
        ids, coef = range_terms(lo_a, hi_a, self.bits)
        return cum[hi_a] - cum[lo_a], np.sqrt(self.terms_variance(ids, coef))

    # Shared with RangeTree (they use only n, bits, _cumulative and answers): one quantile rule for both trees.
    answer = RangeTree.answer
    cdf = RangeTree.cdf
    cdf_stderr_profile = RangeTree.cdf_stderr_profile
    monotone_cdf = RangeTree.monotone_cdf
    quantile = RangeTree.quantile
    median = RangeTree.median

    # -- rows ---------------------------------------------------------------------------------------

    def to_rows(self) -> np.ndarray:
        """Root row then the left children level by level (index 0, 2, ...), with ``ROW_DTYPE``."""
        size = 1 << self.bits
        level = np.zeros(size, np.int64)
        index = np.zeros(size, np.int64)
        for length in self.prefix_lengths:
            level[1 << (length - 1) : 1 << length] = length
            index[1 << (length - 1) : 1 << length] = 2 * np.arange(1 << (length - 1))
        rows = np.zeros(size, dtype=ROW_DTYPE)
        rows["level"], rows["index"] = level, index
        rows["estimate"], rows["stderr"] = self.estimates, self.node_stderr()
        rows["clients"] = self.n
        rows["var_intercept"], rows["var_slope"], rows["cov_beta"] = self.var_intercept, self.var_slope, self.cov_beta
        return rows

    @classmethod
    def from_rows(cls, rows: np.ndarray | Mapping[str, Any]) -> LeftChildrenTree:
        """Rebuild from ``to_rows()`` output, or any mapping of its columns (e.g. a Parquet table's columns)."""
        cols = {name: np.asarray(rows[name]) for name in ROW_DTYPE.names}
        level, index = cols["level"].astype(np.int64), cols["index"].astype(np.int64)
        if level.size < 2 or level.min() != 0 or np.count_nonzero(level == 0) != 1:
            raise ValueError("rows need exactly one root row (level 0) and at least one level")
        bits = int(level.max())
        if level.size != 1 << bits:
            raise ValueError(f"a left-children tree of {bits} bits has {1 << bits} rows, got {level.size}")
        if np.any(index < 0) or np.any(index >= np.int64(1) << level):
            raise ValueError("a row's index must lie in [0, 2^level)")
        ids = node_id(level, index)
        estimates = np.full(1 << bits, np.nan)
        estimates[ids] = cols["estimate"].astype(np.float64)
        if np.isnan(estimates).any():
            raise ValueError("rows must hold every kept node once (root and each left child of levels 1..bits)")
        constants = {}
        for name in ("clients", "var_intercept", "cov_beta"):
            values = np.unique(cols[name])
            if values.size != 1:
                raise ValueError(f"column {name} must be the same on every row of a left-children tree")
            constants[name] = values[0].item()
        return cls(bits=bits, n=int(constants["clients"]), estimates=estimates,
                   var_intercept=float(constants["var_intercept"]), cov_beta=float(constants["cov_beta"]))
