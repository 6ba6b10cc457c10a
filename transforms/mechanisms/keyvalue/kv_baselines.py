"""Key-value baselines of [Collision]/[CoCo]: PCKV-UE / PCKV-GRR (docs/mathematics.md §3.4) here, PrivKV
(§3.3) in ``privkv``.

Input of every ``encode`` (same as Collision): an int64 array ``[n, s]`` of item indices in [2d],
``item(j, b) = 2 j + (1 if b = +1 else 0)``, at most one sign per key. One report per client.

**Provenance.** Both mechanisms are reconstructions, not checked against the papers' text **[R-M]**
(docs/mathematics.md §3.3-3.4): PrivKV's budget split (default eps/2 each) is [R-L]; PCKV's budget allocation
``eps2 = eps, eps1 = ln((e^eps + 1)/2)`` and padding-and-sampling are [R-M]/[R-H]. The analyzers are the unbiased
linear inversions of §3.3-3.4 **[D]**; PrivKV's paper-faithful (biased) estimates are in ``extras``.
Variances are exact categorical variances (``kv_moments``) **[D]**.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from transforms.mechanisms.base import KeyValueEstimate, Randomizer, Randomness
from transforms.mechanisms.frequency.counting import empty_mask_if_malformed, exp_epsilon, structured
from transforms.mechanisms.keyvalue.kv_moments import (
    KVAccumulator,
    check_items,
    class_counts,
    freeze_sparsity,
    kv_estimate,
    linear_covariance,
    plug_in_frequencies,
    sign_weights,
)
from transforms.mechanisms.keyvalue.privkv import PrivKV
from transforms.privacy.mixture import alpha_from_tv

__all__ = ["PCKVGRR", "PCKVUE", "KVAccumulator", "PrivKV"]

MAX_ENUMERATED_UE_DOMAIN = 8  # 3^d output patterns
_ACCUMULATE_CHUNK = 1 << 16  # rows per bincount pass: bounds the intp temporaries of PCKV-UE counting
_BYTE_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1).astype(np.int64)
_PAIR_BITS = np.uint8(0x55)  # low bit of each (2j, 2j+1) pair inside a packed byte


@dataclass(frozen=True)
class _PCKV(Randomizer):
    """Shared part of PCKV-UE / PCKV-GRR (Gu et al. USENIX Sec'20) [R-M]: padding-and-sampling, budget, analyzer.

    Pad to ``ell`` pairs with dummy keys d..d+ell-1 (value 0), sample one pair, discretise its value, perturb.
    Budget: ``eps2 = epsilon_value`` (default epsilon) and ``eps1 = eps - ln(2/(1 + e^-eps2))``, so the tight
    guarantee ``max{eps2, eps1 + ln(2/(1 + e^-eps2))}`` is exactly epsilon [R-M].
    """

    payload_kind: ClassVar[str] = ""
    d: int
    s: int
    epsilon: float
    ell: int | None = None
    epsilon_value: float | None = None

    def __post_init__(self) -> None:
        freeze_sparsity(self)
        ell = self.s if self.ell is None else self.ell
        if isinstance(ell, bool) or int(ell) != ell or ell < self.s:
            raise ValueError(f"ell must be an integer >= s={self.s} (fewer would bias the estimator), got {ell!r}")
        e2 = self.epsilon if self.epsilon_value is None else float(self.epsilon_value)
        if not 0 < e2 <= self.epsilon:
            raise ValueError(f"epsilon_value must lie in (0, epsilon={self.epsilon}], got {e2!r}")
        object.__setattr__(self, "ell", int(ell))
        object.__setattr__(self, "epsilon_value", e2)

    @property
    def pairs(self) -> int:
        assert self.ell is not None
        return self.ell

    @property
    def d_prime(self) -> int:
        """Keys including the ell dummy keys."""
        return self.d + self.pairs

    @property
    def epsilon_key(self) -> float:
        """eps1 of the key perturbation."""
        assert self.epsilon_value is not None
        return self.epsilon - math.log(2.0 / (1.0 + math.exp(-self.epsilon_value)))

    @property
    def p(self) -> float:
        """Value keep probability e^eps2/(1 + e^eps2)."""
        assert self.epsilon_value is not None
        return 1.0 / (1.0 + math.exp(-self.epsilon_value))

    @property
    def a(self) -> float:
        raise NotImplementedError

    @property
    def b(self) -> float:
        raise NotImplementedError

    @property
    def epsilon_local(self) -> float:
        return self.epsilon  # tight for the perturbation; sampling can only lower it (see PCKVGRR.sampled_epsilon)

    def sample_pairs(self, items: np.ndarray, rng: Randomness) -> tuple[np.ndarray, np.ndarray]:
        """Padding-and-sampling: ``(key, v*)`` per client. A client with m <= s real items (empty slots -1) is padded
        with ell - m distinct random dummies; a sampled dummy therefore has a uniform dummy key and v* a fair coin."""
        keys, signs = check_items(items, self.d, self.s)
        n = keys.shape[0]
        pick, dummy, coin = rng.integers(0, self.pairs, n), rng.integers(0, self.pairs, n), rng.random(n)
        col = np.minimum(pick, self.s - 1)[:, None]
        slot_key = np.take_along_axis(keys, col, axis=1)[:, 0]
        real = (pick < self.s) & (slot_key >= 0)  # an empty slot is padded like the slots beyond s
        key = np.where(real, slot_key, self.d + dummy)
        vstar = np.where(real, np.take_along_axis(signs, col, axis=1)[:, 0], np.where(coin < 0.5, 1, -1))
        return key, vstar

    def class_probabilities(self) -> np.ndarray:
        """``(P+, P-)`` of supporting (k, +1) / (k, -1): holder of k+, of k-, of neither (§3.4 [D])."""
        a, b, p, ell = self.a, self.b, self.p, self.pairs
        hit, miss = a * p / ell + (1 - 1 / ell) * b / 2, a * (1 - p) / ell + (1 - 1 / ell) * b / 2
        return np.array([[hit, miss], [miss, hit], [b / 2, b / 2]])

    def weights(self) -> tuple[tuple[float, float], tuple[float, float]]:
        """Weights on (n1, n2) of the count estimates of holders of k+ and k- (§3.4)."""
        return sign_weights(self.pairs / (self.a - self.b), self.pairs / (self.a * (2 * self.p - 1)))

    def covariance(self, f_plus: np.ndarray, f_minus: np.ndarray,
                   n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Exact (Var A, Var B, Cov AB) of ``A = f_hat(k+)``, ``B = f_hat(k-)`` for n users."""
        wp, wm = self.weights()
        probs, counts = self.class_probabilities(), class_counts(f_plus, f_minus, n)
        return tuple(linear_covariance(u, v, probs, counts) / n**2 for u, v in ((wp, wp), (wm, wm), (wp, wm)))

    def variance(self, frequency: np.ndarray, n: int) -> np.ndarray:
        """Exact variance ``[2d]`` of the item-frequency estimates at true item frequencies ``frequency``."""
        f = np.asarray(frequency, dtype=np.float64)
        var_a, var_b, _ = self.covariance(f[1::2], f[0::2], n)
        out = np.empty(2 * self.d)
        out[0::2], out[1::2] = var_b, var_a
        return out

    def support_counts(self, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(n1, n2): reports supporting (k, +1) and (k, -1) for the d real keys."""
        raise NotImplementedError

    def decode_counts(self, counts: np.ndarray, n: int) -> KeyValueEstimate:
        """Unbiased inversion: ``A + B = ell (n1 + n2 - n b)/(a - b)``, ``A - B = ell (n1 - n2)/(a (2p - 1))``."""
        n1, n2 = self.support_counts(counts)
        c1, c2 = n1.astype(np.float64), n2.astype(np.float64)
        total = self.pairs * (c1 + c2 - n * self.b) / (self.a - self.b)
        diff = self.pairs * (c1 - c2) / (self.a * (2 * self.p - 1))
        a, b = (total + diff) / (2 * n), (total - diff) / (2 * n)
        var_a, var_b, cov = self.covariance(*plug_in_frequencies(a, b), n)
        return kv_estimate(a, b, var_a, var_b, cov, n, counts, {})

    def parameters(self) -> dict[str, Any]:
        return {"d": self.d, "s": self.s, "epsilon": self.epsilon, "ell": self.ell,
                "epsilon_value": self.epsilon_value}

    def _pair_mixture(self, items_row: np.ndarray) -> list[tuple[float, int, int]]:
        """(weight, key, v*) of the sampled pair, dummies spread over their keys and coins."""
        keys, signs = check_items(np.asarray(items_row).reshape(1, -1), self.d, self.s)
        out = [(1 / self.pairs, int(k), int(v)) for k, v in zip(keys[0], signs[0], strict=True) if k >= 0]
        w = (self.pairs - len(out)) / self.pairs / (2 * self.pairs)
        if w > 0:
            out += [(w, self.d + j, v) for j in range(self.pairs) for v in (-1, 1)]
        return out


@dataclass(frozen=True)
class PCKVUE(_PCKV):
    """PCKV with unary encoding: a ternary symbol per key; the sampled key keeps its sign w.p. a p, a = 1/2.

    Message: 2d bits, bit ``item(j, b)`` set iff ``y_j = b`` (dummy positions carry no information and are not
    sent -- post-processing). Best PCKV variant for large d; O(d) per report.
    """

    name: ClassVar[str] = "pckv-ue"
    payload_kind: ClassVar[str] = "bits"

    @property
    def a(self) -> float:
        return 0.5

    @property
    def b(self) -> float:
        return 1.0 / (exp_epsilon(self.epsilon_key) + 1.0)

    @property
    def bit_length(self) -> int:
        return 2 * self.d

    @property
    def n_bytes(self) -> int:
        return -(-self.bit_length // 8)

    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype([("bits", "u1", (self.n_bytes,))])

    @property
    def mixture_alpha(self) -> float:
        """``max TV / (e^eps - 1)`` over pairs of *sampled pairs* (a mixture's TV is at most that, convexity):
        laws differ only on the two keys' positions -- same key with opposite values, or two keys."""
        plus = np.array([self.a * self.p, self.a * (1 - self.p), 1 - self.a])  # P(y_k = v*, -v*, 0)
        minus, other = plus[[1, 0, 2]], np.array([self.b / 2, self.b / 2, 1 - self.b])
        same_key = 0.5 * float(np.abs(plus - minus).sum())
        two_keys = 0.5 * float(np.abs(np.outer(plus, other) - np.outer(other, minus)).sum())
        return alpha_from_tv(max(same_key, two_keys), self.epsilon)

    @property
    def message_bits(self) -> int:
        return self.bit_length

    def ternary(self, items: np.ndarray, rng: Randomness) -> np.ndarray:
        """The perturbed vector y in {-1, 0, 1}^d, int8 ``[n, d]``."""
        key, vstar = self.sample_pairs(items, rng)
        n = key.size
        u = rng.random((n, self.d))
        y = np.where(u < self.b / 2, 1, np.where(u < self.b, -1, 0)).astype(np.int8)
        rows = np.flatnonzero(key < self.d)
        uk, vk = u[rows, key[rows]], vstar[rows]
        y[rows, key[rows]] = np.where(uk < self.a * self.p, vk, np.where(uk < self.a, -vk, 0))
        return y

    def encode(self, items: np.ndarray, rng: Randomness) -> np.ndarray:
        y = self.ternary(items, rng)
        bits = np.zeros((y.shape[0], self.bit_length), dtype=bool)
        bits[:, 0::2], bits[:, 1::2] = y < 0, y > 0
        return structured(self.report_dtype, bits=np.packbits(bits, axis=1))

    def validate(self, reports: np.ndarray) -> np.ndarray:
        """Right length, zero padding bits, and never both signs of one key."""
        bad = empty_mask_if_malformed(reports, self.report_dtype)
        if bad is not None:
            return bad
        raw = reports["bits"]
        pad = 8 * self.n_bytes - self.bit_length
        both = np.any(raw & (raw >> 1) & _PAIR_BITS, axis=1)
        return ((raw[:, -1] & np.uint8((1 << pad) - 1)) == 0) & ~both

    def new_accumulator(self) -> KVAccumulator:
        return KVAccumulator(self, (self.bit_length,))

    def count_reports(self, reports: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """Set bits per item ``[2d]``: per-column byte histograms times a 256 x 8 bit table (no n x 2d unpack)."""
        nb = self.n_bytes
        offsets = np.arange(nb, dtype=np.intp) * 256
        hist = np.zeros(nb * 256, dtype=np.int64)
        for start in range(0, len(reports), _ACCUMULATE_CHUNK):
            chunk = reports["bits"][start : start + _ACCUMULATE_CHUNK].astype(np.intp) + offsets
            hist += np.bincount(chunk.ravel(), minlength=nb * 256)
        return (hist.reshape(nb, 256) @ _BYTE_BITS).ravel()[: self.bit_length]

    def support_counts(self, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return counts[1::2], counts[0::2]

    def exact_output_distribution(self, items_row: np.ndarray) -> np.ndarray:
        """P(y | items) for the 3^d ternary vectors, index ``sum_j (y_j + 1) 3^j`` (d <= 8)."""
        if self.d > MAX_ENUMERATED_UE_DOMAIN:
            raise ValueError(f"enumerating 3^d outputs needs d <= {MAX_ENUMERATED_UE_DOMAIN}, got {self.d}")
        patterns = (np.arange(3**self.d)[:, None] // 3 ** np.arange(self.d)[None, :]) % 3 - 1
        other = np.array([self.b / 2, 1 - self.b, self.b / 2])  # P(y_j = -1, 0, +1)
        out = np.zeros(3**self.d)
        for w, k, v in self._pair_mixture(items_row):
            probs = np.tile(other, (self.d, 1))
            if k < self.d:
                probs[k] = [0.0, 1 - self.a, 0.0]
                probs[k, 1 + v], probs[k, 1 - v] = self.a * self.p, self.a * (1 - self.p)
            out += w * np.prod(probs[np.arange(self.d), patterns + 1], axis=1)
        return out


@dataclass(frozen=True)
class PCKVGRR(_PCKV):
    """PCKV with generalized randomized response over the d + ell keys: one (key, sign) pair per report.

    O(1) per report and O(log d) bits; variance grows with d (the UE variant wins for large d).
    """

    name: ClassVar[str] = "pckv-grr"
    payload_kind: ClassVar[str] = "key_value"

    @property
    def a(self) -> float:
        e1 = exp_epsilon(self.epsilon_key)
        return e1 / (e1 + self.d_prime - 1)

    @property
    def b(self) -> float:
        return (1 - self.a) / (self.d_prime - 1)

    @property
    def sampled_epsilon(self) -> float:
        """The exact LDP of sampling + GRR, ``ln((e^eps + ell - 1)/ell)`` (< epsilon when ell > 1) [D].

        The largest ratio is a report (k, v) from a holder of (k, v) versus a non-holder of k; with this
        allocation ``a (1 - p) >= b/2``, so no other output is more revealing.
        """
        return math.log((exp_epsilon(self.epsilon) + self.pairs - 1) / self.pairs)

    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype([("key", "<i8"), ("value", "<i8")])

    @property
    def mixture_alpha(self) -> float:
        """``max TV / (e^eps - 1)`` from the output table (§8.6) [D]: a client's law is ``b/2`` everywhere plus
        ``1/ell`` times a bump per real item (``a p - b/2`` on (k, v*), ``a(1-p) - b/2`` on (k, -v*)) plus the
        dummy share spread over the dummy outputs. Worst pair: s real items against none (or s disjoint ones),
        ``TV = (s/ell)(a - b)`` because ``a (1-p) >= b/2`` under every allowed allocation. With the default
        allocation and ell = s this is k-RR's ``1/(e^eps + 2d' - 1)`` (kv_formulas.alpha_pckv_grr)."""
        return alpha_from_tv(self.s / self.pairs * (self.a - self.b), self.epsilon)

    @property
    def message_bits(self) -> int:
        return (self.d_prime - 1).bit_length() + 1

    def encode(self, items: np.ndarray, rng: Randomness) -> np.ndarray:
        key, vstar = self.sample_pairs(items, rng)
        n = key.size
        u, other, coin = rng.random(n), rng.integers(0, self.d_prime - 1, n), rng.random(n)
        other = other + (other >= key)
        out_key = np.where(u < self.a, key, other)
        value = np.where(u < self.a * self.p, vstar, np.where(u < self.a, -vstar, np.where(coin < 0.5, 1, -1)))
        return structured(self.report_dtype, key=out_key, value=value)

    def validate(self, reports: np.ndarray) -> np.ndarray:
        bad = empty_mask_if_malformed(reports, self.report_dtype)
        if bad is not None:
            return bad
        key, value = reports["key"], reports["value"]
        return (key >= 0) & (key < self.d_prime) & (np.abs(value) == 1)

    def new_accumulator(self) -> KVAccumulator:
        return KVAccumulator(self, (self.d_prime, 2))

    def count_reports(self, reports: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """Counts ``[d + ell, 2]`` of (key, sign -1/+1); dummy keys are counted but never decoded."""
        flat = reports["key"] * 2 + (reports["value"] > 0)
        return np.bincount(flat, minlength=2 * self.d_prime).reshape(shape)

    def support_counts(self, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return counts[: self.d, 1], counts[: self.d, 0]

    def exact_output_distribution(self, items_row: np.ndarray) -> np.ndarray:
        """P(report = (key, value) | items) at index ``2 key + (value > 0)``, keys in [d + ell]."""
        out = np.zeros((self.d_prime, 2))
        for w, k, v in self._pair_mixture(items_row):
            table = np.full((self.d_prime, 2), self.b / 2)
            table[k, int(v > 0)], table[k, int(v < 0)] = self.a * self.p, self.a * (1 - self.p)
            out += w * table
        return out.ravel()
