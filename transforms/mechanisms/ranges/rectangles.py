"""2-D range counting: products of dyadic intervals (docs/mathematics.md §5, "D-dimensional"; [MultiMsg] §5.4).

Each axis has the levels of a 1-D tree plus its root (prefix length 0). Channel (lx, ly) is a frequency
oracle over the 2^(lx + ly) cells ``(x >> (bits_x - lx), y >> (bits_y - ly))`` for every pair except (0, 0),
whose count is n. A rectangle [x0, x1) x [y0, y1) is the disjoint union of the products of the two axes'
dyadic covers, so its count is a sum of raw cell estimates with coefficients in {0, 1} (no consistency
post-processing in 2-D: the raw sum is unbiased and its variance exact). Levels are sampled or budget-split
as in ``ranges.DyadicRange``; the standard error has the same two parts (oracle, level sampling).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from transforms.mechanisms.base import Randomness, check_epsilon
from transforms.mechanisms.ranges.channel_levels import ChannelAccumulator, OracleLevels
from transforms.mechanisms.ranges.channel_oracles import ChannelOracles
from transforms.mechanisms.ranges.dyadic import MAX_TREE_BITS, _check_mode, dyadic_cover, tree_prefix_lengths

__all__ = ["DyadicRectangle", "DyadicRectangleAccumulator", "RectangleCounts"]


@dataclass(frozen=True)
class DyadicRectangle(OracleLevels):
    """Rectangle counts over [0, 2^bits_x) x [0, 2^bits_y); ``encode`` takes an (n, 2) integer array of leaves."""

    name: ClassVar[str] = "dyadic_rectangle"
    single_message: ClassVar[bool] = False
    messages_per_channel: ClassVar[int] = 1
    bits_x: int
    bits_y: int
    epsilon: float
    oracle: str = "llh"
    levels: str = "sample"
    branching: int = 2
    g: int | None = None
    seed_family: int = 1024

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        object.__setattr__(self, "epsilon", float(self.epsilon))
        for name in ("bits_x", "bits_y"):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.bits_x + self.bits_y > MAX_TREE_BITS:
            raise ValueError(f"bits_x + bits_y must be <= {MAX_TREE_BITS} (the finest channel's domain)")
        object.__setattr__(self, "levels", _check_mode(self.levels))
        _ = self.oracles

    @cached_property
    def axis_lengths(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Prefix lengths of each axis (without the root)."""
        return (tree_prefix_lengths(self.bits_x, self.branching, None),
                tree_prefix_lengths(self.bits_y, self.branching, None))

    @cached_property
    def pairs(self) -> tuple[tuple[int, int], ...]:
        """(lx, ly) of each channel, x-major, the (0, 0) root excluded."""
        xs, ys = ((0, *axis) for axis in self.axis_lengths)
        return tuple((lx, ly) for lx in xs for ly in ys if lx or ly)

    @property
    def channels(self) -> int:
        return len(self.pairs)

    @property
    def d(self) -> int:
        """Cells of the finest grid, 2^(bits_x + bits_y)."""
        return 1 << (self.bits_x + self.bits_y)

    @cached_property
    def oracles(self) -> ChannelOracles:
        return ChannelOracles(self.oracle, tuple(lx + ly for lx, ly in self.pairs), self.epsilon_message,
                              g=self.g, seed_family=self.seed_family)

    def _check_points(self, values: np.ndarray) -> np.ndarray:
        pts = np.asarray(values)
        if pts.ndim != 2 or pts.shape[1] != 2 or (pts.size and pts.dtype.kind not in "iu"):
            raise ValueError(f"values must be an (n, 2) integer array of (x, y) leaves, got {pts.shape} {pts.dtype}")
        pts = pts.astype(np.int64)
        if pts.size and (pts.min() < 0 or pts[:, 0].max() >= 1 << self.bits_x or pts[:, 1].max() >= 1 << self.bits_y):
            raise ValueError(f"points must lie in [0, 2^{self.bits_x}) x [0, 2^{self.bits_y})")
        return pts

    def cells(self, points: np.ndarray, channel: np.ndarray | int) -> np.ndarray:
        """Cell index ``(x prefix) * 2^ly + (y prefix)`` of each point on each given channel."""
        lx = np.asarray([p[0] for p in self.pairs], dtype=np.int64)[channel]
        ly = np.asarray([p[1] for p in self.pairs], dtype=np.int64)[channel]
        return ((points[:, 0] >> (self.bits_x - lx)) << ly) | (points[:, 1] >> (self.bits_y - ly))

    def encode_messages(self, values: np.ndarray, rng: Randomness) -> tuple[np.ndarray, np.ndarray]:
        pts = self._check_points(values)
        n = len(pts)
        if self.levels == "sample":
            channel = rng.integers(0, self.channels, n)
            return self.oracles.encode(self.cells(pts, channel), channel, rng), np.arange(n, dtype=np.int64)
        parts = [self.oracles.encode(self.cells(pts, j), np.full(n, j), rng) for j in range(self.channels)]
        return np.stack(parts, axis=1).reshape(-1), np.repeat(np.arange(n, dtype=np.int64), self.channels)

    def new_accumulator(self) -> DyadicRectangleAccumulator:
        return DyadicRectangleAccumulator(self)

    def parameters(self) -> dict[str, Any]:
        return {"bits_x": self.bits_x, "bits_y": self.bits_y, "epsilon": self.epsilon, "oracle": self.oracle,
                "levels": self.levels, "branching": self.branching, "g": self.g, "seed_family": self.seed_family}

class DyadicRectangleAccumulator(ChannelAccumulator):
    """Per-channel oracle counts and the number of clients."""

    def estimate(self) -> RectangleCounts:
        m = self.mechanism
        messages = self.counts.messages
        if self.n < 2 or messages.min() < 1:
            raise ValueError(f"need >= 2 clients and >= 1 message per channel, got n={self.n}")
        raw, model = [], []
        for j, (lx, ly) in enumerate(m.pairs):
            raw.append((self.counts.counts(j) * (self.n / messages[j])).reshape(1 << lx, 1 << ly))
            model.append(self.counts.variance_model(j))
        return RectangleCounts(axis_lengths=m.axis_lengths, pairs=m.pairs, n=self.n,
                               clients=tuple(int(x) for x in messages), raw=tuple(raw), model=tuple(model))


@dataclass(frozen=True, eq=False)
class RectangleCounts:
    """Raw per-channel cell estimates (population scale) and their variance models (as ``RangeTree``)."""

    axis_lengths: tuple[tuple[int, ...], tuple[int, ...]]
    pairs: tuple[tuple[int, int], ...]
    n: int
    clients: tuple[int, ...]
    raw: tuple[np.ndarray, ...]
    model: tuple[tuple[float, float, float], ...]  # (var_intercept, var_slope, cov_beta) per channel

    @property
    def sampled(self) -> bool:
        return len(self.pairs) > 1 and sum(self.clients) == self.n

    def answer(self, x0: int, x1: int, y0: int, y1: int) -> tuple[float, float]:
        """(estimate, stderr) of the clients with x in [x0, x1) and y in [y0, y1)."""
        cover_x = dyadic_cover(x0, x1, self.axis_lengths[0])
        cover_y = dyadic_cover(y0, y1, self.axis_lengths[1])
        index = {pair: j for j, pair in enumerate(self.pairs)}
        estimate = 0.0
        per_channel: dict[int, list[float]] = {}  # channel -> [cells selected, plug-in mass selected]
        for lx, ax, bx in cover_x:
            for ly, ay, by in cover_y:
                if (lx, ly) == (0, 0):
                    estimate += self.n
                    continue
                j = index[(lx, ly)]
                block = self.raw[j][ax:bx, ay:by]
                estimate += float(block.sum())
                plug = np.clip(self.raw[j], 0.0, None)
                total = plug.sum()
                mass = float(plug[ax:bx, ay:by].sum() / total) if total > 0 else block.size / plug.size
                entry = per_channel.setdefault(j, [0.0, 0.0])
                entry[0] += block.size
                entry[1] += mass
        var = full = 0.0
        for j, (size, mass) in per_channel.items():
            # coefficients are 1 on `size` disjoint cells of channel j holding `mass` of its clients
            s, nj = self.n / self.clients[j], self.clients[j]
            icpt, slope, beta = self.model[j]
            c = mass * nj
            ldp = icpt * size + slope * c
            if beta:
                ldp -= nj * beta**2 * (size**2 - size) + 2 * beta * (size * c - c)
            var += s**2 * ldp
            full += s * mass * (1.0 - mass)
        if self.sampled:
            f_range = float(np.clip(estimate / self.n, 0.0, 1.0))
            var += self.n**2 / (self.n - 1) * (full - f_range * (1.0 - f_range))
        return estimate, float(np.sqrt(max(var, 0.0)))
