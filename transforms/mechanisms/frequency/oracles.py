"""Single-message frequency oracles: GRR and OUE here, OLH in ``olh.py``, and their registry.

Each mechanism is a frozen dataclass of its public parameters implementing ``base.Mechanism``
(docs/mathematics.md §2.1, §2.2, §2.3). Encoders are vectorised over the batch and draw only through the
``base.Randomness`` protocol with the batch as first dimension, so a :class:`KeyedRandom` reproduces
every client's report whatever the batch boundaries (docs/mathematics.md §8). Analyzers keep count arrays only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from transforms.mechanisms.base import Randomizer, Randomness, check_values
from transforms.mechanisms.frequency.blanket import BlanketRandomizer, check_dummies
from transforms.mechanisms.frequency.counting import (
    CountAccumulator,
    empty_mask_if_malformed,
    exp_epsilon,
    freeze_domain_and_epsilon,
    grr_probabilities,
    rr_count_variance,
    structured,
)
from transforms.mechanisms.frequency.olh import OLH, OLHAccumulator
from transforms.privacy.blanket import grr_blanket_weight, oue_blanket_weight
from transforms.privacy.blanket_shuffle import BlanketDecomposition, blanket_grr, blanket_oue
from transforms.privacy.mixture import alpha_grr, alpha_oue

__all__ = [
    "FREQUENCY_MECHANISMS",
    "GRR",
    "OLH",
    "OUE",
    "GRRAccumulator",
    "OLHAccumulator",
    "OUEAccumulator",
    "make_frequency_mechanism",
]

MAX_ENUMERATED_OUE_DOMAIN = 12
_ACCUMULATE_CHUNK = 1 << 16  # rows per bincount pass: bounds the int temporaries of OUE counting
# _BYTE_BITS[b, k] = bit k of byte b in numpy's default (big-endian) packbits order
_BYTE_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1).astype(np.int64)


@dataclass(frozen=True)
class GRR(Randomizer, BlanketRandomizer):
    """Generalized randomized response over [d]: keep the value w.p. ``p``, else a uniform other value.

    Best of the three for small domains (variance grows with ``d``); one integer per report. Its output is
    (1 - d q) [v] + d q Uniform[d], so it has a blanket: dummies uniform over [d] (``frequency.blanket``).
    """

    name: ClassVar[str] = "grr"
    payload_kind: ClassVar[str] = "category"
    d: int
    epsilon: float

    def __post_init__(self) -> None:
        freeze_domain_and_epsilon(self)

    @property
    def p(self) -> float:
        """Probability of reporting the true value."""
        return grr_probabilities(self.epsilon, self.d)[0]

    @property
    def q(self) -> float:
        """Probability of reporting any one given other value."""
        return grr_probabilities(self.epsilon, self.d)[1]

    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype([("value", "<i8")])

    @property
    def epsilon_local(self) -> float:
        return self.epsilon  # replacement LDP, tight: p / q = e^eps

    @property
    def mixture_alpha(self) -> float:
        return alpha_grr(self.epsilon, self.d)

    def blanket_decomposition(self) -> BlanketDecomposition:
        return blanket_grr(self.epsilon, self.d)

    @property
    def message_bits(self) -> int:
        return (self.d - 1).bit_length()

    def encode(self, values: np.ndarray, rng: Randomness) -> np.ndarray:
        """Randomize a batch; a replacement ``y = r + (r >= v)`` is uniform over the d - 1 other values."""
        v = check_values(values, self.d)
        n = v.size
        keep = rng.random(n) < self.p
        r = rng.integers(0, self.d - 1, n)
        return structured(self.report_dtype, value=np.where(keep, v, r + (r >= v)))

    def validate(self, reports: np.ndarray) -> np.ndarray:
        bad = empty_mask_if_malformed(reports, self.report_dtype)
        if bad is not None:
            return bad
        value = reports["value"]
        return (value >= 0) & (value < self.d)

    def new_accumulator(self) -> GRRAccumulator:
        return GRRAccumulator(self)

    def variance(self, counts: np.ndarray, n: int) -> np.ndarray:
        """Exact per-item variance of the count estimator (docs/mathematics.md §2.1)."""
        return rr_count_variance(counts, n, self.p, self.q)

    def parameters(self) -> dict[str, Any]:
        return {"d": self.d, "epsilon": self.epsilon}

    def exact_output_distribution(self, value: int) -> np.ndarray:
        """P(report == y | value) for every y in [d] (index = reported value)."""
        check_values(np.array([value]), self.d)
        out = np.full(self.d, self.q)
        out[value] = self.p
        return out

    # The blanket role (transforms.mechanisms.frequency.blanket): the uniform component, exactly accounted.
    blanket_accounting: ClassVar[str] = "grr"

    @property
    def blanket_weight(self) -> float:
        return grr_blanket_weight(self.epsilon, self.d)  # d q

    @property
    def blanket_cell_probability(self) -> np.ndarray:
        return np.full(self.d, 1.0 / self.d)

    def blanket_output_distribution(self) -> np.ndarray:
        return np.full(self.d, 1.0 / self.d)

    def blanket_reports(self, m: int, rng: Randomness) -> np.ndarray:
        """m values uniform over [d], drawn through ``rng`` (OS entropy in production)."""
        m = check_dummies(m)
        return structured(self.report_dtype, value=np.asarray(rng.integers(0, self.d, m), dtype=np.int64))


class GRRAccumulator(CountAccumulator):
    """Counts of each reported value; decoded by ``(C - n q)/(p - q)``."""

    mechanism: GRR

    def __init__(self, mechanism: GRR) -> None:
        super().__init__(mechanism, (mechanism.d,))

    def _count(self, reports: np.ndarray) -> np.ndarray:
        return np.bincount(reports["value"], minlength=self.mechanism.d)

    def _decode(self) -> tuple[np.ndarray, dict[str, Any]]:
        m = self.mechanism
        return (self.counts - self.n * m.q) / (m.p - m.q), {}


@dataclass(frozen=True)
class OUE(Randomizer, BlanketRandomizer):
    """Optimized unary encoding: the true bit is a fair coin, every other bit is 1 w.p. 1/(1+e^eps).

    Variance independent of ``d`` (~4 n e^eps/(e^eps-1)^2) at the price of d bits per report. Its blanket
    sets every bit w.p. q independently (``transforms.mechanisms.frequency.blanket``).
    """

    name: ClassVar[str] = "oue"
    payload_kind: ClassVar[str] = "bits"
    p: ClassVar[float] = 0.5  # probability that the true item's bit is set
    d: int
    epsilon: float

    def __post_init__(self) -> None:
        freeze_domain_and_epsilon(self)

    @property
    def q(self) -> float:
        """Probability that a bit other than the true one is set."""
        return 1.0 / (1.0 + exp_epsilon(self.epsilon))

    @property
    def n_bytes(self) -> int:
        return -(-self.d // 8)

    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype([("bits", "u1", (self.n_bytes,))])

    @property
    def epsilon_local(self) -> float:
        return self.epsilon  # replacement LDP, tight: (p / q) * ((1 - q) / (1 - p)) = e^eps

    @property
    def mixture_alpha(self) -> float:
        return alpha_oue(self.epsilon)

    def blanket_decomposition(self) -> BlanketDecomposition:
        return blanket_oue(self.epsilon)

    @property
    def message_bits(self) -> int:
        return self.d

    def encode(self, values: np.ndarray, rng: Randomness) -> np.ndarray:
        """One uniform per bit: bit j is set iff u_j < (1/2 if j is the value else q); packed MSB-first.

        Memory is O(batch * d) floats: the Beam layer encodes bundles, not whole crowds.
        """
        v = check_values(values, self.d)
        n = v.size
        u = rng.random((n, self.d))
        bits = u < self.q
        rows = np.arange(n)
        bits[rows, v] = u[rows, v] < self.p
        return structured(self.report_dtype, bits=np.packbits(bits, axis=1))

    def validate(self, reports: np.ndarray) -> np.ndarray:
        """Right byte length and zero padding bits (a set padding bit is not an OUE output)."""
        bad = empty_mask_if_malformed(reports, self.report_dtype)
        if bad is not None:
            return bad
        pad = 8 * self.n_bytes - self.d
        last = reports["bits"][:, -1]
        return (last & np.uint8((1 << pad) - 1)) == 0

    def new_accumulator(self) -> OUEAccumulator:
        return OUEAccumulator(self)

    def variance(self, counts: np.ndarray, n: int) -> np.ndarray:
        """Exact per-item variance, docs/mathematics.md §2.2 with p = 1/2."""
        return rr_count_variance(counts, n, self.p, self.q)

    def parameters(self) -> dict[str, Any]:
        return {"d": self.d, "epsilon": self.epsilon}

    def exact_output_distribution(self, value: int) -> np.ndarray:
        """P(bit pattern k | value) for k in [2^d], where bit j of k is the bit of item j (d <= 12)."""
        if self.d > MAX_ENUMERATED_OUE_DOMAIN:
            raise ValueError(f"enumerating 2^d patterns needs d <= {MAX_ENUMERATED_OUE_DOMAIN}, got {self.d}")
        check_values(np.array([value]), self.d)
        patterns = (np.arange(2**self.d)[:, None] >> np.arange(self.d)[None, :]) & 1
        one = np.full(self.d, self.q)
        one[value] = self.p
        return np.prod(np.where(patterns == 1, one, 1.0 - one), axis=1)

    # The blanket role (transforms.mechanisms.frequency.blanket): every bit Bern(q), exactly accounted.
    blanket_accounting: ClassVar[str] = "oue"

    @property
    def blanket_weight(self) -> float:
        return oue_blanket_weight(self.epsilon)  # 1 / (2 (1 - q))

    @property
    def blanket_cell_probability(self) -> np.ndarray:
        return np.full(self.d, self.q)

    def blanket_output_distribution(self) -> np.ndarray:
        """P(bit pattern k) for one dummy, indexed like ``exact_output_distribution`` (d <= 12)."""
        if self.d > MAX_ENUMERATED_OUE_DOMAIN:
            raise ValueError(f"enumerating 2^d patterns needs d <= {MAX_ENUMERATED_OUE_DOMAIN}, got {self.d}")
        patterns = (np.arange(2**self.d)[:, None] >> np.arange(self.d)[None, :]) & 1
        return np.prod(np.where(patterns == 1, self.q, 1.0 - self.q), axis=1)

    def blanket_reports(self, m: int, rng: Randomness) -> np.ndarray:
        """m reports whose every bit is set w.p. q, independently; packed like ``encode``'s."""
        m = check_dummies(m)
        return structured(self.report_dtype, bits=np.packbits(rng.random((m, self.d)) < self.q, axis=1))


class OUEAccumulator(CountAccumulator):
    """Per-item bit counts; decoded by ``(C - n q)/(1/2 - q)``.

    Counting uses per-column byte histograms (one bincount over n * ceil(d/8) bytes, in chunks) and a
    256 x 8 bit table, which equals unpacking the bits and summing them but never materialises n x d.
    """

    mechanism: OUE

    def __init__(self, mechanism: OUE) -> None:
        super().__init__(mechanism, (mechanism.d,))

    def _count(self, reports: np.ndarray) -> np.ndarray:
        nb = self.mechanism.n_bytes
        bits = reports["bits"]
        offsets = np.arange(nb, dtype=np.intp) * 256
        hist = np.zeros(nb * 256, dtype=np.int64)
        for start in range(0, len(bits), _ACCUMULATE_CHUNK):
            chunk = bits[start : start + _ACCUMULATE_CHUNK].astype(np.intp) + offsets
            hist += np.bincount(chunk.ravel(), minlength=nb * 256)
        return (hist.reshape(nb, 256) @ _BYTE_BITS).ravel()[: self.mechanism.d]

    def _decode(self) -> tuple[np.ndarray, dict[str, Any]]:
        m = self.mechanism
        return (self.counts - self.n * m.q) / (m.p - m.q), {}


FREQUENCY_MECHANISMS: dict[str, type[GRR] | type[OUE] | type[OLH]] = {"grr": GRR, "oue": OUE, "olh": OLH}


def make_frequency_mechanism(name: str, d: int, epsilon: float, **params: Any) -> GRR | OUE | OLH:
    """Build a frequency oracle by name, e.g. from an analysis spec (``params``: OLH's g, seed_family)."""
    try:
        cls = FREQUENCY_MECHANISMS[name.lower()]
    except KeyError:
        raise ValueError(
            f"unknown frequency mechanism {name!r}; valid names: {', '.join(sorted(FREQUENCY_MECHANISMS))}"
        ) from None
    try:
        return cls(d=d, epsilon=epsilon, **params)
    except TypeError as exc:  # an unexpected keyword: say which mechanism refused it
        raise ValueError(f"bad parameters for {name!r}: {exc}") from None
