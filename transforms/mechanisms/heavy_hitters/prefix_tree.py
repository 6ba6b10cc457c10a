"""Heavy hitters over a huge item domain by prefix-tree expansion (docs/mathematics.md §6; [MultiMsg] App. D).

Items are hashed to ``item_bits`` bits (:func:`item_hash`). Level j (j = 1..L, L = item_bits / level_bits)
is an OLH frequency oracle over the prefixes of ``j * level_bits`` bits, with a finite public seed family so
that the analyzer keeps one ``seed_family x g`` count table per level (count trick). A client reports ONE
uniformly drawn level with the full epsilon (``levels="sample"``) or every level with epsilon / L ("all").

Decoding never enumerates the domain: level 1 is decoded for all 2^level_bits prefixes, every further
level only for the children of the ``width`` best candidates of the level above. A candidate's support
``C_v = sum_s T[s, H_s(v)]`` costs O(seed_family). With a finite family the textbook estimate
``(C - n/g)/(p - 1/g)`` is biased by the empirical collisions of v with the heavy items; we remove the part
due to the other candidates by solving OLH's exact system (``olh.py``) restricted to the candidates,
``(p - q')(Pc - J/g) c = C - n/g``, which is exact when all the mass sits on candidates (conjugate gradients
warm-started at the textbook estimate, O(seed_family * K) per iteration; skipped above MAX_EXACT_CELLS).
Kept candidates are the largest estimates, so their estimates carry the usual winners' curse.

``query(items)`` (on the accumulator) answers any item: the last level's estimate, and a count-min style
upper bound: an item's count is at most every one of its prefixes' counts, so ``min_j (x_j + z se_j)`` over
its L prefixes is a one-sided bound that never underestimates (up to the z-sigma noise), as [MultiMsg]'s count-min.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from scipy.sparse.linalg import LinearOperator, cg

from transforms.mechanisms.base import Randomness, check_epsilon
from transforms.mechanisms.frequency.counting import (
    HashedGRR,
    check_mergeable,
    refuse_invalid,
    rr_count_variance,
    seed_family_law,
)
from transforms.mechanisms.hashing import fmix64, hash_to_buckets
from transforms.mechanisms.ranges.channel_levels import central_epsilon_levels, clients_of_batch, combine_channel_laws
from transforms.privacy.mixture import olh_buckets

__all__ = ["FrequencyQuery", "HeavyHitters", "HeavyHittersAccumulator", "PrefixHeavyHitters", "item_hash"]

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_CANDIDATE_CHUNK = 1 << 22  # seeds * candidates per hashing pass
MAX_EXACT_CELLS = 1 << 24  # seeds * candidates of the exact correction (int32 lookup: 64 MiB)
CG_RTOL = 1e-4  # residual ~1e-4 of ||C - n/g||: far below the noise of any candidate
CG_MAXITER = 60
MAX_LEVEL_BITS = 16


def item_hash(items: Any, bits: int = 32) -> np.ndarray:
    """Hash items to ``bits``-bit uint64 values, vectorised over the batch.

    Integers: ``fmix64`` (a bijection) of the value. Strings/bytes: FNV-1a over the UTF-8 bytes, one pass
    per byte column of a fixed-width byte matrix, then the length and ``fmix64``. Trailing NUL bytes are
    not part of a numpy bytes value, so ``b"a"`` and ``b"a\\0"`` collide. Keeps the top ``bits`` bits.
    """
    if not 1 <= int(bits) <= 64:
        raise ValueError(f"bits must lie in [1, 64], got {bits!r}")
    arr = np.asarray(items)
    if arr.ndim != 1:
        raise ValueError(f"items must be a 1-D batch, got shape {arr.shape}")
    if arr.dtype.kind in "iub":
        h = fmix64(arr.astype(np.uint64) ^ _FNV_OFFSET)
    else:
        if arr.dtype.kind == "U":
            raw = np.char.encode(arr, "utf-8")
        elif arr.dtype.kind == "S":
            raw = arr
        else:  # object arrays (mixed str/bytes): one conversion per item, then vectorised hashing
            raw = np.array([x.encode("utf-8") if isinstance(x, str) else bytes(x) for x in arr], dtype="S")
        n, width = raw.size, max(1, raw.dtype.itemsize)
        lengths = np.char.str_len(raw).astype(np.uint64) if n else np.zeros(0, np.uint64)
        matrix = np.frombuffer(raw.tobytes(), dtype=np.uint8).reshape(n, width) if n else np.zeros((0, width))
        h = np.full(n, _FNV_OFFSET, dtype=np.uint64)
        with np.errstate(over="ignore"):
            for j in range(width):
                active = lengths > j
                h = np.where(active, (h ^ matrix[:, j].astype(np.uint64)) * _FNV_PRIME, h)
            h = fmix64(h ^ lengths)
    return h >> np.uint64(64 - int(bits)) if bits < 64 else h


@dataclass(frozen=True)
class HeavyHitters:
    """Top items (hashes) with population-scale count estimates and standard errors, best first.

    ``candidates[j]`` = how many prefixes were decoded at level j (work done, never the domain size).
    """

    items: np.ndarray
    count: np.ndarray
    stderr: np.ndarray
    n: int
    candidates: tuple[int, ...]
    extras: dict[str, Any]


@dataclass(frozen=True)
class FrequencyQuery:
    """Estimates of queried items: last-level ``count`` +- ``stderr``, and the count-min bound ``upper``."""

    items: np.ndarray
    count: np.ndarray
    stderr: np.ndarray
    upper: np.ndarray


@dataclass(frozen=True)
class PrefixHeavyHitters(HashedGRR):
    """Prefix-tree heavy hitters with an OLH oracle per level; ``encode`` takes item hashes (uint64 < 2^item_bits)."""

    accounts_central: ClassVar[bool] = True  # epsilon_central is its own accounting

    name: ClassVar[str] = "prefix_heavy_hitters"
    payload_kind: ClassVar[str] = "hashed"
    single_message: ClassVar[bool] = False
    messages_per_channel: ClassVar[int] = 1
    epsilon: float
    item_bits: int = 32
    level_bits: int = 8
    levels: str = "sample"
    g: int | None = None
    seed_family: int = 1024
    width: int = 32

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        object.__setattr__(self, "epsilon", float(self.epsilon))
        for name, low, high in (("item_bits", 2, 64), ("level_bits", 1, MAX_LEVEL_BITS), ("width", 1, 1 << 16),
                                ("seed_family", 1, 2**32)):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) != value or not low <= value <= high:
                raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
            object.__setattr__(self, name, int(value))
        if self.item_bits % self.level_bits:
            raise ValueError(f"item_bits={self.item_bits} must be a multiple of level_bits={self.level_bits}")
        if self.levels not in ("sample", "all"):
            raise ValueError(f"levels must be 'sample' or 'all', got {self.levels!r}")
        g = olh_buckets(self.epsilon_message) if self.g is None else self.g
        if isinstance(g, bool) or int(g) != g or g < 2:
            raise ValueError(f"g must be an integer >= 2, got {g!r}")
        object.__setattr__(self, "g", int(g))

    @property
    def channels(self) -> int:
        return self.item_bits // self.level_bits

    @property
    def d(self) -> int:
        """Size of the (hashed) item domain, 2^item_bits: never enumerated."""
        return 1 << self.item_bits

    @property
    def prefix_lengths(self) -> tuple[int, ...]:
        return tuple(self.level_bits * (j + 1) for j in range(self.channels))

    @property
    def epsilon_message(self) -> float:
        return self.epsilon if self.levels == "sample" else self.epsilon / self.channels

    @property
    def bucket_epsilon(self) -> float:
        return self.epsilon_message

    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype([("channel", "<i8"), ("seed", "<i8"), ("z", "<i8")])

    @property
    def epsilon_local(self) -> float:
        return self.epsilon

    @property
    def message_bits(self) -> int:
        return ((self.seed_family - 1).bit_length() + (self.buckets - 1).bit_length()
                + max(1, (self.channels - 1).bit_length()))

    def _check_items(self, items: np.ndarray) -> np.ndarray:
        arr = np.asarray(items)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise ValueError("items must be a 1-D integer batch of item hashes (see item_hash)")
        if arr.dtype.kind == "i" and arr.size and arr.min() < 0:
            raise ValueError("item hashes must be non-negative")
        out = arr.astype(np.uint64)
        if self.item_bits < 64 and out.size and out.max() >> np.uint64(self.item_bits):
            raise ValueError(f"item hashes must lie below 2^{self.item_bits}")
        return out

    def prefixes(self, items: np.ndarray, channel: np.ndarray | int) -> np.ndarray:
        """Prefix of each item at each given level (channel)."""
        shift = self.item_bits - np.asarray(self.prefix_lengths, dtype=np.int64)[channel]
        return np.asarray(items, dtype=np.uint64) >> np.asarray(shift).astype(np.uint64)

    def _randomize(self, prefix: np.ndarray, channel: np.ndarray, rng: Randomness) -> np.ndarray:
        n = prefix.size
        seeds = rng.integers(0, self.seed_family, n)
        keep = rng.random(n) < self.p
        r = rng.integers(0, self.buckets - 1, n)
        h = hash_to_buckets(seeds, prefix, self.buckets)
        out = np.empty(n, dtype=self.report_dtype)
        out["channel"], out["seed"], out["z"] = channel, seeds, np.where(keep, h, r + (r >= h))
        return out

    def encode_messages(self, items: np.ndarray, rng: Randomness) -> tuple[np.ndarray, np.ndarray]:
        """(reports, owner): one message on a random level ("sample") or one per level ("all")."""
        x = self._check_items(items)
        n = x.size
        if self.levels == "sample":
            channel = rng.integers(0, self.channels, n)
            return self._randomize(self.prefixes(x, channel), channel, rng), np.arange(n, dtype=np.int64)
        parts = [self._randomize(self.prefixes(x, j), np.full(n, j), rng) for j in range(self.channels)]
        return np.stack(parts, axis=1).reshape(-1), np.repeat(np.arange(n, dtype=np.int64), self.channels)

    def encode(self, items: np.ndarray, rng: Randomness) -> np.ndarray:
        return self.encode_messages(items, rng)[0]

    def validate(self, reports: np.ndarray) -> np.ndarray:
        arr = np.asarray(reports)
        names = arr.dtype.names or ()
        if any(f not in names for f in self.report_dtype.names):
            return np.zeros(arr.shape[:1], dtype=bool)
        ch, seed, z = arr["channel"], arr["seed"], arr["z"]
        return ((ch >= 0) & (ch < self.channels) & (seed >= 0) & (seed < self.seed_family)
                & (z >= 0) & (z < self.buckets))

    def new_accumulator(self) -> HeavyHittersAccumulator:
        return HeavyHittersAccumulator(self)

    def parameters(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "item_bits": self.item_bits, "level_bits": self.level_bits,
                "levels": self.levels, "g": self.buckets, "seed_family": self.seed_family, "width": self.width}

    def epsilon_central(self, n: int, delta: float) -> float:
        """As ``DyadicRange.epsilon_central``: "sample" hides a client among its level's clients (delta/2 lower
        quantile of 1 + Bin(n - 1, 1/L)); "all" composes L shuffled levels of n messages at eps/L."""
        return central_epsilon_levels(self, [self.mixture_alpha] * self.channels, n, delta)

    def exact_message_distribution(self, item: int) -> np.ndarray:
        """Law of a client's message set over (channel, seed, z), flattened as ``DyadicRange``'s (tiny setups)."""
        x = self._check_items(np.array([item]))
        laws = []
        for j in range(self.channels):
            h = hash_to_buckets(np.arange(self.seed_family), np.full(self.seed_family, self.prefixes(x, j)[0]),
                                self.buckets)
            laws.append(seed_family_law(h, self.buckets, self.p, self.q_other))
        return combine_channel_laws(laws, self.levels)


class HeavyHittersAccumulator:
    """One seed_family x g count table per level, messages per level, and clients; merges by addition."""

    def __init__(self, mechanism: PrefixHeavyHitters) -> None:
        self.mechanism = mechanism
        m = mechanism
        self.counts = np.zeros((m.channels, m.seed_family, m.buckets), dtype=np.int64)
        self.messages = np.zeros(m.channels, dtype=np.int64)
        self.n = 0

    def add(self, reports: np.ndarray, clients: int | None = None) -> None:
        """Fold messages of ``clients`` clients (default: one message per client in "sample" mode)."""
        arr = np.asarray(reports)
        m = self.mechanism
        clients = clients_of_batch(len(arr), m.channels, m.levels, clients)
        if arr.size:
            refuse_invalid(m.validate(arr), "reports are outside the output domain")
            cells = (arr["channel"] * m.seed_family + arr["seed"]) * m.buckets + arr["z"]
            self.counts += np.bincount(cells, minlength=self.counts.size).reshape(self.counts.shape)
            self.messages += np.bincount(arr["channel"], minlength=m.channels)
        self.n += int(clients)

    def merge(self, other: HeavyHittersAccumulator) -> None:
        check_mergeable(self, other)
        self.counts += other.counts
        self.messages += other.messages
        self.n += other.n

    # -- decoding -----------------------------------------------------------------------------------

    def _cells(self, candidates: np.ndarray) -> np.ndarray:
        """Flat (seed, bucket) cell of every (seed, candidate): S x K int32 (the count trick's lookup)."""
        m = self.mechanism
        seeds = np.arange(m.seed_family, dtype=np.uint64)[:, None]
        h = hash_to_buckets(seeds, candidates[None, :], m.buckets)
        return (h + np.arange(m.seed_family, dtype=np.int64)[:, None] * m.buckets).astype(np.int32)

    def _support(self, level: int, candidates: np.ndarray) -> np.ndarray:
        """``C_v = sum_s T[s, H_s(v)]`` of each candidate, in chunks of bounded memory."""
        table = self.counts[level].ravel()
        step = max(1, _CANDIDATE_CHUNK // self.mechanism.seed_family)
        parts = [table[self._cells(candidates[i : i + step])].sum(axis=0) for i in range(0, candidates.size, step)]
        return np.concatenate(parts).astype(np.float64) if parts else np.zeros(0)

    def level_counts(self, level: int, candidates: np.ndarray, exact: bool = True) -> tuple[np.ndarray, bool]:
        """Count estimates (the level's own scale) of candidate prefixes at ``level`` (0-based), and whether the
        candidate-restricted exact correction was applied (it needs seed_family x K <= MAX_EXACT_CELLS)."""
        m = self.mechanism
        nj, g, S = int(self.messages[level]), m.buckets, m.seed_family
        cand = np.asarray(candidates, dtype=np.uint64)
        K = cand.size
        exact = exact and K >= 2 and S * K <= MAX_EXACT_CELLS
        cells = self._cells(cand) if exact else None
        support = (self.counts[level].ravel()[cells].sum(axis=0).astype(np.float64) if cells is not None
                   else self._support(level, cand))
        rhs = support - nj / g
        textbook = rhs / (m.p - 1.0 / g)
        if cells is None or not np.any(rhs):
            return textbook, False
        a, flat = m.p - m.q_other, cells.ravel()

        def matvec(x: np.ndarray) -> np.ndarray:
            x = np.ravel(x)
            sums = np.bincount(flat, weights=np.broadcast_to(x, (S, K)).ravel(), minlength=S * g)
            return a * (sums[cells].sum(axis=0) / S - x.sum() / g)

        # The restricted system is exact only when all the mass sits on the candidates. When CG does not converge
        # (low epsilon: thousands of noise candidates make it ill-posed) its iterate ranked items worse than the
        # textbook estimate in benchmarks/heavy_hitters.py (top-10 precision 0.1 vs 0.5 at eps 2), so the
        # textbook estimate is kept then.
        solution, info = cg(LinearOperator((K, K), matvec=matvec, dtype=np.float64), rhs, x0=textbook,
                            rtol=CG_RTOL, atol=0.0, maxiter=CG_MAXITER)
        return (solution, True) if info == 0 else (textbook, False)

    def _population(self, level: int, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Scale level counts to the population; stderr = oracle (plug-in) + level sampling."""
        m, n, nj = self.mechanism, self.n, int(self.messages[level])
        s = n / nj
        var = s**2 * rr_count_variance(np.clip(counts, 0, nj), nj, m.p, 1.0 / m.buckets)
        if m.levels == "sample" and m.channels > 1:
            f = np.clip(counts / nj, 0.0, 1.0)
            var = var + n**2 / (n - 1) * (s - 1.0) * f * (1.0 - f)
        return counts * s, np.sqrt(var)

    def _check_ready(self) -> None:
        if self.n < 2 or self.messages.min() < 1:
            raise ValueError(f"need >= 2 clients and >= 1 message per level, got n={self.n}, per level "
                             f"{self.messages.tolist()}")

    def estimate(self, width: int | None = None, threshold: float | None = None, exact: bool = True) -> HeavyHitters:
        """Expand the prefix tree keeping the ``width`` best candidates per level (and, if given, only those
        with population-scale estimate >= ``threshold``); return the last level's kept items, best first."""
        self._check_ready()
        m = self.mechanism
        keep_width = m.width if width is None else int(width)
        fanout = np.arange(1 << m.level_bits, dtype=np.uint64)
        kept = np.zeros(1, dtype=np.uint64)
        decoded, corrected = [], []
        for level in range(m.channels):
            cand = ((kept[:, None] << np.uint64(m.level_bits)) | fanout[None, :]).ravel()
            decoded.append(int(cand.size))
            counts, done = self.level_counts(level, cand, exact)
            corrected.append(done)
            est, se = self._population(level, counts)
            order = np.argsort(-est, kind="stable")[:keep_width]
            if threshold is not None:
                order = order[est[order] >= threshold]
            kept, best, best_se = cand[order], est[order], se[order]
            if kept.size == 0:
                break
        return HeavyHitters(items=kept, count=best, stderr=best_se, n=self.n, candidates=tuple(decoded),
                            extras={"messages_per_level": self.messages.tolist(), "exact_correction": corrected})

    def query(self, items: np.ndarray, z: float = 3.0) -> FrequencyQuery:
        """Any items' counts (last level, textbook decoding) and the count-min bound min_j(x_j + z se_j)."""
        self._check_ready()
        m = self.mechanism
        x = m._check_items(items)
        upper = np.full(x.size, np.inf)
        count = stderr = np.zeros(x.size)
        for level in range(m.channels):
            est, se = self._population(level, self.level_counts(level, m.prefixes(x, level), exact=False)[0])
            upper = np.minimum(upper, est + z * se)
            count, stderr = est, se
        return FrequencyQuery(items=x, count=count, stderr=stderr, upper=upper)

    def __repr__(self) -> str:
        return f"HeavyHittersAccumulator({self.mechanism!r}, n={self.n})"
