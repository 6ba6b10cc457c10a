"""One frequency oracle per channel, encoded in one vectorised pass: the engine of the dyadic mechanisms.

A range tree (``ranges.py``) and a rectangle grid (``rectangles.py``) run one frequency oracle per
level (= channel, docs/mathematics.md §5), each over its own domain ``[0, 2^bits_j)``. Their messages share
one report dtype -- ``channel`` plus the oracle's payload fields -- so that the wire format and the
shuffler see one mechanism. Clients of one batch report on different channels (a uniformly drawn level in
"sample" mode), so the encoders below draw for *every* row with shapes that depend only on the batch size
(per-row parameters enter as arrays), as ``KeyedRandom`` requires; the randomizer of each row is exactly
the single-message oracle of its channel (GRR, OUE, OLH of ``frequency.py``/``olh.py``, or LLH of
``linear_hashing.py``). Decoding reuses those mechanisms' own accumulators, one per channel.

Which oracle where: ``llh`` (default) works for every level up to 2^24 with O(g) work per report; ``grr``
at any level but its variance grows with the level's domain (best while 2^bits < ~3 e^eps); ``oue`` only
up to 2^10 (one bit per leaf in every report); ``olh`` (finite seed family, exact decoder) only where its
decoding table ``seed_family * 2^bits`` stays below 2^24 entries and ``seed_family * g >= 4 * 2^bits``.

Accounting helpers for the two ways of spreading a client over channels close the module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from scipy.stats import binom

from transforms.mechanisms.base import Randomizer, Randomness
from transforms.mechanisms.frequency.counting import empty_mask_if_malformed, refuse_invalid
from transforms.mechanisms.frequency.linear_hashing import MAX_LLH_BITS, LinearLocalHashing, draw_seeds, linear_hash
from transforms.mechanisms.frequency.oracles import GRR, OLH, OUE
from transforms.mechanisms.hashing import hash_to_buckets
from transforms.privacy.shuffle_bound import epsilon_central

__all__ = [
    "MAX_OLH_TABLE",
    "MAX_OUE_BITS",
    "ORACLES",
    "ChannelCounts",
    "ChannelOracles",
    "central_epsilon_sampled",
    "central_epsilon_split",
    "lower_level_clients",
]

ORACLES = ("llh", "grr", "olh", "oue")
MAX_OUE_BITS = 10
MAX_GRR_BITS = MAX_LLH_BITS
MAX_OLH_TABLE = 1 << 24
ChannelMechanism = GRR | OUE | OLH | LinearLocalHashing


@dataclass(frozen=True)
class ChannelOracles(Randomizer):
    """Frequency oracle ``oracle`` at budget ``epsilon`` per message on channels of ``channel_bits`` bits each."""

    oracle: str
    channel_bits: tuple[int, ...]
    epsilon: float
    g: int | None = None
    seed_family: int = 1024

    def __post_init__(self) -> None:
        oracle = str(self.oracle).lower()
        if oracle not in ORACLES:
            raise ValueError(f"unknown oracle {self.oracle!r}; valid: {', '.join(ORACLES)}")
        object.__setattr__(self, "oracle", oracle)
        bits = tuple(int(b) for b in self.channel_bits)
        if not bits or min(bits) < 1:
            raise ValueError(f"every channel needs a domain of >= 1 bit, got {self.channel_bits!r}")
        object.__setattr__(self, "channel_bits", bits)
        top = max(bits)
        limit = {"llh": MAX_LLH_BITS, "grr": MAX_GRR_BITS, "oue": MAX_OUE_BITS, "olh": MAX_LLH_BITS}[oracle]
        if top > limit:
            raise ValueError(f"oracle {oracle!r} supports channel domains up to 2^{limit}, got 2^{top}: "
                             f"use oracle='llh' (or fewer bits)")
        if oracle == "olh" and self.seed_family * (1 << top) > MAX_OLH_TABLE:
            raise ValueError(f"oracle 'olh' decodes with a seed_family x 2^bits table: {self.seed_family} x 2^{top} "
                             f"exceeds {MAX_OLH_TABLE} entries; use oracle='llh' for large levels")
        if self.g is not None and oracle in ("grr", "oue"):
            raise ValueError(f"g (hash buckets) applies to the hashed oracles 'llh' and 'olh', not {oracle!r}")
        _ = self.mechanisms  # construct (and validate) every channel's oracle now

    @property
    def channels(self) -> int:
        return len(self.channel_bits)

    @cached_property
    def mechanisms(self) -> tuple[ChannelMechanism, ...]:
        """The single-message oracle of each channel (decoders and closed-form variances)."""
        eps = self.epsilon
        if self.oracle == "grr":
            return tuple(GRR(1 << b, eps) for b in self.channel_bits)
        if self.oracle == "oue":
            return tuple(OUE(1 << b, eps) for b in self.channel_bits)
        if self.oracle == "olh":
            return tuple(OLH(1 << b, eps, g=self.g, seed_family=self.seed_family) for b in self.channel_bits)
        return tuple(LinearLocalHashing(1 << b, eps, g=self.g) for b in self.channel_bits)

    @property
    def payload_kind(self) -> str:
        return self.mechanisms[0].payload_kind

    @property
    def buckets(self) -> int:
        """g of the hashed oracles (the same on every channel: same budget per message)."""
        m = self.mechanisms[0]
        if not isinstance(m, OLH | LinearLocalHashing):
            raise AttributeError(f"oracle {self.oracle!r} has no buckets")
        return m.buckets

    @property
    def oue_bytes(self) -> int:
        return -(-(1 << max(self.channel_bits)) // 8)

    @property
    def bit_length(self) -> int:
        """Length field of an OUE payload: every channel's vector is padded to the largest domain."""
        return 1 << max(self.channel_bits)

    @property
    def report_dtype(self) -> np.dtype:
        fields: list[tuple[Any, ...]] = [("channel", "<i8")]
        if self.oracle == "grr":
            fields.append(("value", "<i8"))
        elif self.oracle == "oue":
            fields.append(("bits", "u1", (self.oue_bytes,)))
        else:
            fields += [("seed", "<i8"), ("z", "<i8")]
        return np.dtype(fields)

    def rr_form(self, channel: int) -> tuple[float, float]:
        """(p, q): a holder of an item supports it w.p. p, anyone else w.p. q, independently per report."""
        m = self.mechanisms[channel]
        if isinstance(m, GRR):
            return m.p, m.q
        if isinstance(m, OUE):
            return m.p, m.q
        return m.p, 1.0 / m.buckets

    def cov_beta(self, channel: int) -> float:
        """GRR's reports support exactly one item, so its estimates covary: Cov(c_v, c_w) = -(n b^2 + b(c_v + c_w))
        with b = q/(p - q). The other oracles' supports are independent across items (b = 0)."""
        if self.oracle != "grr":
            return 0.0
        p, q = self.rr_form(channel)
        return q / (p - q)

    @property
    def mixture_alpha(self) -> float:
        """Worst (largest) mixture parameter over the channels: valid for any one message."""
        return max(m.mixture_alpha for m in self.mechanisms)

    @property
    def message_bits(self) -> int:
        return max(m.message_bits for m in self.mechanisms) + max(1, (self.channels - 1).bit_length())

    # -- client side ---------------------------------------------------------------------------------

    def encode(self, values: np.ndarray, channel: np.ndarray, rng: Randomness) -> np.ndarray:
        """Randomize ``values[i]`` (in [0, 2^bits of channel[i])) with channel ``channel[i]``'s oracle.

        Draw shapes depend on ``len(values)`` only (and on max bits for OUE), so row i is reproducible
        by a ``KeyedRandom`` whatever the batch.
        """
        v = np.asarray(values, dtype=np.int64)
        ch = np.asarray(channel, dtype=np.int64)
        n = v.size
        bits = np.asarray(self.channel_bits, dtype=np.int64)[ch]
        if v.size and (v.min() < 0 or np.any(v >= (1 << bits))):
            raise ValueError("a channel value lies outside its channel's domain")
        out = np.zeros(n, dtype=self.report_dtype)
        out["channel"] = ch
        if self.oracle == "oue":
            out["bits"] = self._encode_oue(v, bits, rng)
            return out
        p = np.array([self.rr_form(j)[0] for j in range(self.channels)])[ch]
        if self.oracle == "grr":
            keep = rng.random(n) < p
            r = rng.integers(0, (1 << bits) - 1, n)
            out["value"] = np.where(keep, v, r + (r >= v))
            return out
        g = self.buckets
        if self.oracle == "olh":  # same draws, in the same order, as OLH.encode
            seeds = rng.integers(0, self.seed_family, n)
            keep = rng.random(n) < p
            r = rng.integers(0, g - 1, n)
            h = hash_to_buckets(seeds, v, g)
        else:  # same draws, in the same order, as LinearLocalHashing.encode
            seeds = draw_seeds(rng, n)
            keep = rng.random(n) < p
            r = rng.integers(0, g - 1, n)
            h = linear_hash(seeds, v, g.bit_length() - 1)
        out["seed"] = seeds
        out["z"] = np.where(keep, h, r + (r >= h))
        return out

    def _encode_oue(self, v: np.ndarray, bits: np.ndarray, rng: Randomness) -> np.ndarray:
        """OUE over each row's domain, padded with zero bits to the largest domain (same draws as OUE.encode)."""
        n, width = v.size, 1 << max(self.channel_bits)
        q = 1.0 / (1.0 + math.exp(self.epsilon))
        u = rng.random((n, width))
        inside = np.arange(width)[None, :] < (1 << bits)[:, None]
        out = (u < q) & inside
        rows = np.arange(n)
        out[rows, v] = u[rows, v] < OUE.p
        return np.packbits(out, axis=1)

    # -- shuffler / analyzer side ----------------------------------------------------------------------

    @cached_property
    def _oue_allowed(self) -> np.ndarray:
        """Per channel, the packed mask of bits its vectors may set."""
        width = 1 << max(self.channel_bits)
        inside = np.arange(width)[None, :] < (1 << np.asarray(self.channel_bits))[:, None]
        return np.packbits(inside, axis=1)

    def validate(self, reports: np.ndarray) -> np.ndarray:
        bad = empty_mask_if_malformed(reports, self.report_dtype)
        if bad is not None:
            return bad
        ch = reports["channel"]
        ok = (ch >= 0) & (ch < self.channels)
        safe = np.where(ok, ch, 0)
        if self.oracle == "grr":
            value = reports["value"]
            return ok & (value >= 0) & (value < (1 << np.asarray(self.channel_bits)[safe]))
        if self.oracle == "oue":
            stray = reports["bits"] & ~self._oue_allowed[safe]
            return ok & ~np.any(stray, axis=1)
        seed, z = reports["seed"], reports["z"]
        ok &= (seed >= 0) & (z >= 0) & (z < self.buckets)
        if self.oracle == "olh":
            ok &= seed < self.seed_family
        return ok

    def channel_reports(self, reports: np.ndarray, channel: int) -> np.ndarray:
        """The rows of one channel, in that channel's single-message report dtype."""
        rows = reports[reports["channel"] == channel]
        m = self.mechanisms[channel]
        out = np.empty(len(rows), dtype=m.report_dtype)
        for name in m.report_dtype.names:
            column = rows[name]
            out[name] = column[:, : m.n_bytes] if isinstance(m, OUE) else column
        return out

    def new_counts(self) -> ChannelCounts:
        return ChannelCounts(self)

    # -- exact output laws (LDP tests) ---------------------------------------------------------------

    def exact_distribution(self, channel: int, value: int, seeds: np.ndarray | None = None) -> np.ndarray:
        """P(payload | value) of one channel's oracle, flattened in its mechanism's documented order.

        For ``llh`` the seed is drawn independently of the value; pass the seeds to enumerate, and the law
        returned is that of (seed, z) given a seed uniform over ``seeds`` (index ``i * g + z``).
        """
        m = self.mechanisms[channel]
        if isinstance(m, LinearLocalHashing):
            if seeds is None:
                raise ValueError("llh: pass the seeds to enumerate")
            return (m.exact_output_distribution(value, seeds) / len(seeds)).ravel()
        return m.exact_output_distribution(value)


class ChannelCounts:
    """Per-channel accumulators of the channel oracles (count arrays only; merge by addition)."""

    def __init__(self, oracles: ChannelOracles) -> None:
        self.oracles = oracles
        self.accumulators = [m.new_accumulator() for m in oracles.mechanisms]

    def add(self, reports: np.ndarray) -> None:
        refuse_invalid(self.oracles.validate(reports), "reports are outside the output domain")
        for j in np.unique(reports["channel"]):
            self.accumulators[int(j)].add(self.oracles.channel_reports(reports, int(j)))

    def merge(self, other: ChannelCounts) -> None:
        if other.oracles != self.oracles:
            raise ValueError("cannot merge counts of different channel oracles")
        for mine, theirs in zip(self.accumulators, other.accumulators, strict=True):
            mine.merge(theirs)

    @property
    def messages(self) -> np.ndarray:
        """Messages received on each channel."""
        return np.array([acc.n for acc in self.accumulators], dtype=np.int64)

    def counts(self, channel: int) -> np.ndarray:
        """Unbiased count estimates of channel ``channel`` (scale: that channel's messages)."""
        return np.asarray(self.accumulators[channel].estimate().count, dtype=np.float64)

    def variance_model(self, channel: int) -> tuple[float, float, float]:
        """(intercept, slope, beta): Var(c_v) = intercept + slope c_v on the channel's own scale (exact RR
        form, with c_v the true count among its messages), Cov(c_v, c_w) = -(n b^2 + b(c_v + c_w))."""
        p, q = self.oracles.rr_form(channel)
        n = self.accumulators[channel].n
        scale = (p - q) ** 2
        return n * q * (1 - q) / scale, (p * (1 - p) - q * (1 - q)) / scale, self.oracles.cov_beta(channel)


def lower_level_clients(n: int, channels: int, tail: float) -> int:
    """Largest m with P[1 + Bin(n - 1, 1/channels) < m] <= tail: the target client's channel holds at least m
    clients (itself included) except with probability ``tail``."""
    if channels == 1:
        return n
    k = int(binom.ppf(tail, n - 1, 1.0 / channels))  # smallest k with cdf(k) >= tail
    return max(1, k + 1)


def central_epsilon_sampled(n: int, channels: int, alpha: float, eps: float, delta: float) -> float:
    """Central epsilon when each of n clients sends ONE eps-LDP message on a uniformly drawn channel.

    The channel draw is independent of the data and each channel is shuffled on its own, so conditionally on
    the draws the target's message hides among the n_j messages of its channel; the bound of §1.2 is
    non-increasing in n_j, and joint convexity of the hockey-stick divergence averages over the draws:
    delta = P[n_j < m] + delta_shuffle(m), with m the delta/2 lower quantile of ``1 + Bin(n - 1, 1/channels)``.
    """
    m = lower_level_clients(n, channels, delta / 2)
    if m < 2:
        return eps
    return float(epsilon_central(m, alpha, eps, delta / 2))


def central_epsilon_split(n: int, alphas: list[float], eps_message: float, delta: float) -> float:
    """Central epsilon when every client sends one eps_message-LDP message on EACH channel (n per channel):
    each shuffled channel is (eps_j, delta/J)-DP; basic composition over the J channels (§1.4)."""
    if n < 2:
        return eps_message * len(alphas)
    per = delta / len(alphas)
    return float(sum(epsilon_central(n, a, eps_message, per) for a in alphas))

