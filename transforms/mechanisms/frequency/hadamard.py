"""Hadamard response (HR, docs/mathematics.md §2.5): one integer of log2 K bits, decoded by a fast
Walsh-Hadamard transform.

With ``K = 2^ceil(log2(d + 1))`` and the Sylvester matrix ``H[r][u] = (-1)^popcount(r & u)``, item ``v`` owns
the codeword support ``C_v = {u : H[v + 1][u] = +1}`` (row 0, all ones, is skipped). A client reports a
uniform element of ``C_v`` w.p. ``p* = e^eps/(1 + e^eps)``, else a uniform element of its complement.

**Encoding without enumerating K** (the bijection trick). Let ``b`` be the lowest set bit of ``v + 1``.
``u -> u ^ b`` flips exactly one bit of ``(v + 1) & u``, hence the parity of its popcount: it is a bijection
between ``C_v`` and its complement. Draw ``u0`` uniform on [K]; of the pair ``{u0, u0 ^ b}`` exactly one lies
in ``C_v``, and it is uniform on ``C_v`` (the other uniform on the complement). Report the member in ``C_v``
w.p. ``p*``, the other one otherwise. Two draws of shape ``(n,)`` per batch, O(1) work per client.

**Decoding.** The analyzer keeps the histogram ``h`` of reported ``u`` over [K] (int64). Its Walsh-Hadamard
transform ``W = H h`` gives ``W[r] = #{u_i in C_r} - #{u_i not in C_r} = 2 N_r - n`` for every row at
once, in O(K log K) integer operations (exact), so ``c_hat_v = (N_v - n/2)/(p* - 1/2) = W[v + 1]/(2 p* - 1)``.
A holder of ``v' != v`` lands in ``C_v`` w.p. exactly 1/2 (``|C_v cap C_v'| = K/4``), hence the variance of
§2.5: ``[c_v p*(1 - p*) + (n - c_v)/4]/(p* - 1/2)^2``, about ``n ((e^eps + 1)/(e^eps - 1))^2``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from transforms.mechanisms.base import Randomizer, Randomness, check_values
from transforms.mechanisms.frequency.counting import (
    CountAccumulator,
    empty_mask_if_malformed,
    exp_epsilon,
    freeze_domain_and_epsilon,
    rr_count_variance,
    structured,
)
from transforms.privacy.blanket_shuffle import BlanketDecomposition, blanket_hadamard
from transforms.privacy.mixture import alpha_hadamard

__all__ = ["MAX_HADAMARD_DOMAIN", "HadamardAccumulator", "HadamardResponse", "fwht", "hadamard_order"]

# K <= 2^25: the analyzer's histogram is 8 K bytes (256 MiB at the cap) per window; beyond that use OLH or CMS.
MAX_HADAMARD_DOMAIN = 2**25 - 1


def hadamard_order(d: int) -> int:
    """``K = 2^ceil(log2(d + 1))``: the smallest Sylvester order that has rows 1..d."""
    return 1 << int(d).bit_length()


def fwht(x: np.ndarray) -> np.ndarray:
    """Walsh-Hadamard transform ``H x`` (Sylvester order, unnormalised) of a length-2^m vector, O(K log K).

    Butterfly stages over ``(blocks, 2, h)`` views: integer input stays integer, so counts transform exactly.
    """
    out = np.array(x, copy=True)
    size = out.shape[0]
    if out.ndim != 1 or size & (size - 1) or size == 0:
        raise ValueError(f"fwht needs a 1-D array whose length is a power of two, got shape {out.shape}")
    h = 1
    while h < size:
        view = out.reshape(-1, 2, h)
        top = view[:, 0, :].copy()
        view[:, 0, :] += view[:, 1, :]
        view[:, 1, :] = top - view[:, 1, :]
        h *= 2
    return out


def _in_support(rows: np.ndarray, u: np.ndarray) -> np.ndarray:
    """``H[rows][u] == +1``, i.e. ``popcount(rows & u)`` even (elementwise, broadcasting)."""
    return (np.bitwise_count(np.bitwise_and(rows, u)) & 1) == 0


@dataclass(frozen=True)
class HadamardResponse(Randomizer):
    """Hadamard response over [d]: report one of K ~ 2d integers; d-independent variance ~ n ((e^eps+1)/(e^eps-1))^2.

    Fewer bits than OUE (log2 K vs d) and an O(K log K) decoder; its variance is ~(e^eps+1)^2/(4 e^eps) times
    OUE's, i.e. equal at small eps and growing with eps (use OLH/OUE for large eps).
    """

    name: ClassVar[str] = "hadamard"
    payload_kind: ClassVar[str] = "category"
    d: int
    epsilon: float

    def __post_init__(self) -> None:
        freeze_domain_and_epsilon(self)
        if self.d > MAX_HADAMARD_DOMAIN:
            raise ValueError(
                f"Hadamard response needs d <= {MAX_HADAMARD_DOMAIN} (the analyzer keeps K = 2^ceil(log2(d+1)) "
                f"counts per window), got d={self.d}; use OLH or the count-mean sketch for larger domains"
            )

    @property
    def order(self) -> int:
        """``K``, the size of the output alphabet."""
        return hadamard_order(self.d)

    @property
    def p(self) -> float:
        """``p* = e^eps/(1 + e^eps)``: probability that the report lies in the item's codeword support."""
        e = exp_epsilon(self.epsilon)
        return e / (1.0 + e)

    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype([("value", "<i8")])

    @property
    def epsilon_local(self) -> float:
        return self.epsilon  # replacement LDP, tight: (2 e^eps / K(1+e^eps)) / (2 / K(1+e^eps)) = e^eps

    @property
    def mixture_alpha(self) -> float:
        return alpha_hadamard(self.epsilon)

    def blanket_decomposition(self) -> BlanketDecomposition:
        return blanket_hadamard(self.epsilon)

    @property
    def message_bits(self) -> int:
        return self.order.bit_length() - 1  # log2 K

    def encode(self, values: np.ndarray, rng: Randomness) -> np.ndarray:
        """Draw ``u0`` uniform on [K]; report the member of ``{u0, u0 ^ lowbit(v + 1)}`` in ``C_v`` w.p. p*."""
        v = check_values(values, self.d)
        n = v.size
        u0 = np.asarray(rng.integers(0, self.order, n), dtype=np.int64)
        keep_support = rng.random(n) < self.p
        row = v + 1
        partner = u0 ^ (row & -row)
        report = np.where(_in_support(row, u0) == keep_support, u0, partner)
        return structured(self.report_dtype, value=report)

    def validate(self, reports: np.ndarray) -> np.ndarray:
        bad = empty_mask_if_malformed(reports, self.report_dtype)
        if bad is not None:
            return bad
        value = reports["value"]
        return (value >= 0) & (value < self.order)

    def new_accumulator(self) -> HadamardAccumulator:
        return HadamardAccumulator(self)

    def variance(self, counts: np.ndarray, n: int) -> np.ndarray:
        """Exact per-item count variance (docs/mathematics.md §2.5): holders hit C_v w.p. p*, everyone else w.p. 1/2."""
        return rr_count_variance(counts, n, self.p, 0.5)

    def parameters(self) -> dict[str, Any]:
        return {"d": self.d, "epsilon": self.epsilon}

    def decode_transform(self, transform: np.ndarray) -> np.ndarray:
        """Unbiased counts from the Walsh-Hadamard transform ``W`` of the report histogram: ``W[v+1]/(2p* - 1)``."""
        e = exp_epsilon(self.epsilon)
        return np.asarray(transform[1 : self.d + 1], dtype=np.float64) * ((e + 1.0) / math.expm1(self.epsilon))

    def exact_output_distribution(self, value: int) -> np.ndarray:
        """P(report == u | value) for every u in [K]: ``2 e^eps/(K(1+e^eps))`` on C_v, ``2/(K(1+e^eps))`` off it."""
        check_values(np.array([value]), self.d)
        inside = _in_support(np.int64(value + 1), np.arange(self.order, dtype=np.int64))
        return np.where(inside, self.p, 1.0 - self.p) * (2.0 / self.order)


class HadamardAccumulator(CountAccumulator):
    """Histogram of reported ``u`` over [K]; decoded by one fast Walsh-Hadamard transform."""

    mechanism: HadamardResponse

    def __init__(self, mechanism: HadamardResponse) -> None:
        super().__init__(mechanism, (mechanism.order,))

    def _count(self, reports: np.ndarray) -> np.ndarray:
        return np.bincount(reports["value"], minlength=self.mechanism.order)

    def _decode(self) -> tuple[np.ndarray, dict[str, Any]]:
        return self.mechanism.decode_transform(fwht(self.counts)), {}
