"""Range counting over [0, 2^bits) by a dyadic tree of frequency oracles (docs/mathematics.md §5).

Level j of the tree is a frequency oracle over the 2^{l_j} prefixes of length ``l_j`` (``l_j`` = j * log2
branching, or an explicit ``prefix_lengths``); the root count is n, public. A client holding leaf x sends:

* ``levels="sample"`` (default): ONE message, on a uniformly drawn level j, of ``x >> (bits - l_j)`` with
  the full epsilon. The level sizes n_j vary, so the analyzer is told how many clients a batch holds
  (``add(reports, clients)``) and rescales each level by n / n_j; the tree's error then includes the
  sampling of the levels (``range_tree``).
* ``levels="all"``: one message per level, each with epsilon / L (basic composition: epsilon-LDP in total).

Messages carry their level as the ``channel`` (channel j = j-th prefix length); payload = the oracle's
fields (``channel_oracles``). The estimate is a :class:`~transforms.mechanisms.ranges.range_tree.RangeTree`:
consistent counts, ``answer(lo, hi)`` and ``quantile(q)`` with exact standard errors, and rows for storage.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise
from typing import Any, ClassVar

import numpy as np

from transforms.mechanisms.base import Randomness, check_epsilon, check_values
from transforms.mechanisms.ranges.channel_levels import ChannelAccumulator, OracleLevels, combine_channel_laws
from transforms.mechanisms.ranges.channel_oracles import ChannelOracles
from transforms.mechanisms.ranges.range_tree import RangeTree

__all__ = ["LEVEL_MODES", "DyadicRange", "DyadicRangeAccumulator", "bucket_bounds", "bucketize", "dyadic_cover"]

LEVEL_MODES = ("sample", "all")
MAX_TREE_BITS = 24


def bucketize(values: np.ndarray, lo: float, hi: float, bits: int) -> np.ndarray:
    """Leaf index of each number: 2^bits equal buckets over [lo, hi); values outside are clamped to the end
    buckets (a client never fails to report), NaN is refused."""
    if not (np.isfinite(lo) and np.isfinite(hi) and hi > lo):
        raise ValueError(f"need finite lo < hi, got [{lo!r}, {hi!r})")
    x = np.asarray(values, dtype=np.float64)
    if np.isnan(x).any():
        raise ValueError("cannot bucketize NaN values")
    size = 1 << int(bits)
    leaf = np.floor((x - lo) / (hi - lo) * size)
    return np.clip(leaf, 0, size - 1).astype(np.int64)


def bucket_bounds(leaf: np.ndarray | int, lo: float, hi: float, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """[lower, upper) edges of leaf buckets in the original units (inverse of :func:`bucketize`)."""
    width = (hi - lo) / (1 << int(bits))
    leaf_a = np.asarray(leaf, dtype=np.float64)
    return lo + leaf_a * width, lo + (leaf_a + 1) * width


def dyadic_cover(lo: int, hi: int, prefix_lengths: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """Disjoint tree nodes covering leaves [lo, hi): (prefix length, first index, end index) per run of
    siblings, at most 2 (fanout - 1) nodes per level; prefix length 0 is the root."""
    lengths = (0, *prefix_lengths)
    if not 0 <= lo <= hi <= 1 << lengths[-1]:
        raise ValueError(f"range [{lo}, {hi}) is not inside [0, 2^{lengths[-1]})")
    out: list[tuple[int, int, int]] = []
    a, b = int(lo), int(hi)
    for j in range(len(lengths) - 1, 0, -1):
        if a >= b:
            return out
        f = 1 << (lengths[j] - lengths[j - 1])
        pa, pb = -(-a // f), b // f
        if pa >= pb:
            out.append((lengths[j], a, b))
            return out
        if a < pa * f:
            out.append((lengths[j], a, pa * f))
        if pb * f < b:
            out.append((lengths[j], pb * f, b))
        a, b = pa, pb
    if a < b:
        out.append((0, 0, 1))
    return out


def _check_mode(levels: str) -> str:
    mode = str(levels).lower()
    if mode not in LEVEL_MODES:
        raise ValueError(f"levels must be one of {LEVEL_MODES} (how a client spreads over levels), got {levels!r}")
    return mode


def tree_prefix_lengths(bits: int, branching: int, prefix_lengths: tuple[int, ...] | None) -> tuple[int, ...]:
    """Prefix lengths of the levels: explicit (increasing, ending at bits) or every log2(branching) bits."""
    if prefix_lengths is not None:
        lengths = tuple(int(x) for x in prefix_lengths)
        if not lengths or lengths[-1] != bits or lengths[0] < 1 or any(b <= a for a, b in pairwise(lengths)):
            raise ValueError(f"prefix_lengths must increase from >= 1 to bits={bits}, got {prefix_lengths!r}")
        return lengths
    if isinstance(branching, bool) or int(branching) != branching or branching < 2 or branching & (branching - 1):
        raise ValueError(f"branching must be a power of two >= 2, got {branching!r}")
    step = int(branching).bit_length() - 1
    if bits % step:
        raise ValueError(f"bits={bits} is not a multiple of log2(branching)={step}; pass prefix_lengths instead")
    return tuple(range(step, bits + 1, step))


@dataclass(frozen=True)
class DyadicRange(OracleLevels):
    """Dyadic-tree range counting: one frequency oracle per level, levels sampled or budget-split.

    ``values`` for encode are leaf indices in [0, 2^bits) (see :func:`bucketize` for numbers).
    """

    name: ClassVar[str] = "dyadic_range"
    single_message: ClassVar[bool] = False
    messages_per_channel: ClassVar[int] = 1
    bits: int
    epsilon: float
    oracle: str = "llh"
    levels: str = "sample"
    branching: int = 2
    prefix_lengths: tuple[int, ...] | None = None
    g: int | None = None
    seed_family: int = 1024

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        object.__setattr__(self, "epsilon", float(self.epsilon))
        if isinstance(self.bits, bool) or int(self.bits) != self.bits or not 1 <= self.bits <= MAX_TREE_BITS:
            raise ValueError(f"bits must be an integer in [1, {MAX_TREE_BITS}], got {self.bits!r}")
        object.__setattr__(self, "bits", int(self.bits))
        object.__setattr__(self, "levels", _check_mode(self.levels))
        lengths = tree_prefix_lengths(self.bits, self.branching, self.prefix_lengths)
        object.__setattr__(self, "prefix_lengths", lengths)
        _ = self.oracles

    @property
    def channels(self) -> int:
        assert self.prefix_lengths is not None
        return len(self.prefix_lengths)

    @cached_property
    def oracles(self) -> ChannelOracles:
        assert self.prefix_lengths is not None
        return ChannelOracles(self.oracle, self.prefix_lengths, self.epsilon_message, g=self.g,
                              seed_family=self.seed_family)

    @property
    def d(self) -> int:
        return 1 << self.bits

    def encode_messages(self, values: np.ndarray, rng: Randomness) -> tuple[np.ndarray, np.ndarray]:
        """(reports, owner): one message per client ("sample") or L consecutive ones ("all")."""
        x = check_values(values, self.d)
        n, lengths = x.size, np.asarray(self.prefix_lengths, dtype=np.int64)
        if self.levels == "sample":
            channel = rng.integers(0, self.channels, n)
            prefix = x >> (self.bits - lengths[channel])
            return self.oracles.encode(prefix, channel, rng), np.arange(n, dtype=np.int64)
        parts = []
        for j, length in enumerate(lengths):
            parts.append(self.oracles.encode(x >> (self.bits - length), np.full(n, j), rng))
        reports = np.stack(parts, axis=1).reshape(-1)  # client-major: a client's messages are consecutive
        return reports, np.repeat(np.arange(n, dtype=np.int64), self.channels)

    def new_accumulator(self) -> DyadicRangeAccumulator:
        return DyadicRangeAccumulator(self)

    def parameters(self) -> dict[str, Any]:
        return {"bits": self.bits, "epsilon": self.epsilon, "oracle": self.oracle, "levels": self.levels,
                "branching": self.branching, "prefix_lengths": list(self.prefix_lengths or ()), "g": self.g,
                "seed_family": self.seed_family}

    def exact_message_distribution(self, value: int, seeds: np.ndarray | None = None) -> np.ndarray:
        """Law of a client's whole message set, flattened. "sample": index ``j * K + y`` over levels j and the
        oracle outcomes y of :meth:`ChannelOracles.exact_distribution` (K = the largest level's outcome count,
        zero-padded); "all": the outer product over levels (C order, level 0 slowest). Small bits only."""
        x = int(check_values(np.array([value]), self.d)[0])
        assert self.prefix_lengths is not None
        laws = [self.oracles.exact_distribution(j, x >> (self.bits - b), seeds)
                for j, b in enumerate(self.prefix_lengths)]
        return combine_channel_laws(laws, self.levels)


class DyadicRangeAccumulator(ChannelAccumulator):
    """Per-level oracle counts (count arrays) and the number of clients; merges by addition."""

    def estimate(self) -> RangeTree:
        """The tree of raw level estimates (population scale) with its variance model."""
        m = self.mechanism
        messages = self.counts.messages
        if self.n < 2 or messages.min() < 1:
            raise ValueError(f"need >= 2 clients and >= 1 message per level, got n={self.n}, per level "
                             f"{messages.tolist()}")
        raw, icpt, slope, beta = [], [], [], []
        for j in range(m.channels):
            raw.append(self.counts.counts(j) * (self.n / messages[j]))
            a, b, c = self.counts.variance_model(j)
            icpt.append(a)
            slope.append(b)
            beta.append(c)
        assert m.prefix_lengths is not None
        return RangeTree(prefix_lengths=m.prefix_lengths, n=self.n, clients=tuple(int(x) for x in messages),
                         raw=tuple(raw), var_intercept=tuple(icpt), var_slope=tuple(slope), cov_beta=tuple(beta))
