"""PrivKV (Ye, Hu, Meng, Zheng, S&P'19) as the [Collision]/[CoCo] baseline, docs/mathematics.md §3.3 -- a
reconstruction [R-M].

The implementation was not checked against the paper's text: the local perturbation protocol (LPP: uniform key
sampling, key-bit RR with eps_k, value RR with eps_v, fake uniform value for non-holders) is reconstructed from its
description in later work; the default budget split eps_k = eps_v = eps/2 is [R-L]. The published estimates are the
unbiased per-sign inversion of §3.3 [D] with exact conditional variances [D]; the paper-faithful estimator (mean
biased toward 0 by non-holders' fake values) is kept in ``extras`` for comparison with the papers' plots.
Input format as for every key-value mechanism: ``items`` int64 ``[n, s]``, see ``kv_moments.check_items``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from scipy.stats import binom

from transforms.mechanisms.base import KeyValueEstimate, Randomizer, Randomness
from transforms.mechanisms.frequency.counting import empty_mask_if_malformed, structured
from transforms.mechanisms.keyvalue.kv_moments import (
    KVAccumulator,
    check_items,
    class_counts,
    freeze_sparsity,
    held_sign,
    kv_estimate,
    linear_covariance,
    plug_in_frequencies,
    sign_weights,
)
from transforms.privacy.mixture import alpha_generic

__all__ = ["PrivKV"]


@dataclass(frozen=True)
class PrivKV(Randomizer):
    """PrivKV (Ye et al. S&P'19) [R-M]: sample a key uniformly (data-independent), then a 3-ary response.

    Holder of ``x_j``: ``(j, x_j)`` w.p. p1 p2, ``(j, -x_j)`` w.p. p1 (1 - p2), ``(j, 0)`` w.p. 1 - p1; non-holder:
    ``(j, 0)`` w.p. p1, else ``(j, +-1)`` uniformly. Report value code 0 means "key bit 0". ``epsilon_key`` defaults
    to epsilon/2 [R-L]. Accounted at the loose eps_k + eps_v (§3.3); ``tight_epsilon`` is the exact value.
    """

    name: ClassVar[str] = "privkv"
    payload_kind: ClassVar[str] = "key_value"
    d: int
    s: int
    epsilon: float
    epsilon_key: float | None = None

    def __post_init__(self) -> None:
        freeze_sparsity(self)
        ek = self.epsilon / 2 if self.epsilon_key is None else float(self.epsilon_key)
        if not 0 < ek < self.epsilon:
            raise ValueError(f"epsilon_key must lie strictly between 0 and epsilon={self.epsilon}, got {ek!r}")
        object.__setattr__(self, "epsilon_key", ek)

    @property
    def epsilon_value(self) -> float:
        assert self.epsilon_key is not None
        return self.epsilon - self.epsilon_key

    @property
    def p1(self) -> float:
        """Key-bit keep probability e^eps_k/(1 + e^eps_k)."""
        assert self.epsilon_key is not None
        return 1.0 / (1.0 + math.exp(-self.epsilon_key))

    @property
    def p2(self) -> float:
        """Value keep probability e^eps_v/(1 + e^eps_v)."""
        return 1.0 / (1.0 + math.exp(-self.epsilon_value))

    @property
    def tight_epsilon(self) -> float:
        """``max{eps_v, eps_k + ln(2 p2)}`` (PCKV's observation, §3.3); never above epsilon."""
        assert self.epsilon_key is not None
        return max(self.epsilon_value, self.epsilon_key + math.log(2 * self.p2))

    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype([("key", "<i8"), ("value", "<i8")])

    @property
    def epsilon_local(self) -> float:
        return self.epsilon  # sequential composition eps_k + eps_v, as PrivKV accounts it

    @property
    def mixture_alpha(self) -> float:
        return alpha_generic(self.epsilon)  # §8.6: generic for PrivKV

    @property
    def message_bits(self) -> int:
        return (self.d - 1).bit_length() + 2

    def class_probabilities(self) -> np.ndarray:
        """``(P+, P-)`` of a group member reporting (j, +1) / (j, -1): holder of j+, of j-, of neither."""
        p1, p2 = self.p1, self.p2
        return np.array([[p1 * p2, p1 * (1 - p2)], [p1 * (1 - p2), p1 * p2], [(1 - p1) / 2, (1 - p1) / 2]])

    def encode(self, items: np.ndarray, rng: Randomness) -> np.ndarray:
        keys, signs = check_items(items, self.d, self.s)
        n = keys.shape[0]
        key = rng.integers(0, self.d, n)
        u_key, u_value = rng.random(n), rng.random(n)
        held = held_sign(keys, signs, key)
        holder_value = np.where(u_key < self.p1, np.where(u_value < self.p2, held, -held), 0)
        fake_value = np.where(u_key < self.p1, 0, np.where(u_value < 0.5, 1, -1))
        return structured(self.report_dtype, key=key, value=np.where(held != 0, holder_value, fake_value))

    def validate(self, reports: np.ndarray) -> np.ndarray:
        bad = empty_mask_if_malformed(reports, self.report_dtype)
        if bad is not None:
            return bad
        key, value = reports["key"], reports["value"]
        return (key >= 0) & (key < self.d) & (np.abs(value) <= 1)

    def new_accumulator(self) -> KVAccumulator:
        return KVAccumulator(self, (self.d, 3))

    def count_reports(self, reports: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """Counts ``[d, 3]`` of (key, value code -1/0/+1)."""
        return np.bincount(reports["key"] * 3 + reports["value"] + 1, minlength=3 * self.d).reshape(shape)

    def weights(self) -> tuple[tuple[float, float], tuple[float, float]]:
        """Weights on (n+, n-) of the group counts of holders of j+ and j- (§3.3 unbiased inversion)."""
        return sign_weights(1 / (2 * self.p1 - 1), 1 / (self.p1 * (2 * self.p2 - 1)))

    def covariance(self, f_plus: np.ndarray, f_minus: np.ndarray, group: np.ndarray,
                   n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(Var A, Var B, Cov AB) of ``A = f_hat(j+)``, ``B = f_hat(j-)`` given the group sizes ``N_j >= 1``.

        Randomization term with the expected group composition, plus the hypergeometric term of drawing the
        group from the n users (§3.3 [D]).
        """
        wp, wm = self.weights()
        probs, unit = self.class_probabilities(), class_counts(f_plus, f_minus, 1.0)
        g = np.asarray(group, dtype=np.float64)
        fpc = (n - g) / (g * max(n - 1, 1))
        fp, fm = np.asarray(f_plus, dtype=np.float64), np.asarray(f_minus, dtype=np.float64)
        return (linear_covariance(wp, wp, probs, unit) / g + fp * (1 - fp) * fpc,
                linear_covariance(wm, wm, probs, unit) / g + fm * (1 - fm) * fpc,
                linear_covariance(wp, wm, probs, unit) / g - fp * fm * fpc)

    def expected_covariance(self, f_plus: np.ndarray, f_minus: np.ndarray,
                            n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``covariance`` averaged over ``N_j ~ Bin(n, 1/d)`` conditioned on ``N_j >= 1`` (what repeated runs see)."""
        sizes = np.arange(1, n + 1)
        pmf = binom.pmf(sizes, n, 1.0 / self.d)
        keep = pmf > 1e-300
        sizes, pmf = sizes[keep], pmf[keep] / pmf[keep].sum()
        inv_n = float(pmf @ (1.0 / sizes))
        inv_fpc = float(pmf @ ((n - sizes) / (sizes * max(n - 1, 1))))
        wp, wm = self.weights()
        probs, unit = self.class_probabilities(), class_counts(f_plus, f_minus, 1.0)
        fp, fm = np.asarray(f_plus, dtype=np.float64), np.asarray(f_minus, dtype=np.float64)
        return (linear_covariance(wp, wp, probs, unit) * inv_n + fp * (1 - fp) * inv_fpc,
                linear_covariance(wm, wm, probs, unit) * inv_n + fm * (1 - fm) * inv_fpc,
                linear_covariance(wp, wm, probs, unit) * inv_n - fp * fm * inv_fpc)

    def variance(self, frequency: np.ndarray, n: int) -> np.ndarray:
        """Expected variance ``[2d]`` of the item-frequency estimates at true item frequencies ``frequency``."""
        f = np.asarray(frequency, dtype=np.float64)
        var_a, var_b, _ = self.expected_covariance(f[1::2], f[0::2], n)
        out = np.empty(2 * self.d)
        out[0::2], out[1::2] = var_b, var_a
        return out

    def parameters(self) -> dict[str, Any]:
        return {"d": self.d, "s": self.s, "epsilon": self.epsilon, "epsilon_key": self.epsilon_key}

    def decode_counts(self, counts: np.ndarray, n: int) -> KeyValueEstimate:
        """§3.3 unbiased per-sign inversion within each key group (conditionally unbiased given ``N_j``; 0 and an
        infinite standard error for a key nobody sampled); paper-faithful PrivKV estimates in ``extras``."""
        n_minus, n_plus = counts[:, 0].astype(np.float64), counts[:, 2].astype(np.float64)
        group = counts.sum(axis=1).astype(np.float64)
        seen = group > 0
        g = np.where(seen, group, 1.0)
        p1, p2 = self.p1, self.p2
        total = (n_plus + n_minus - group * (1 - p1)) / (2 * p1 - 1)
        diff = (n_plus - n_minus) / (p1 * (2 * p2 - 1))
        a = np.where(seen, (total + diff) / (2 * g), 0.0)
        b = np.where(seen, (total - diff) / (2 * g), 0.0)
        var_a, var_b, cov = self.covariance(*plug_in_frequencies(a, b), g, n)
        var_a, var_b = np.where(seen, var_a, np.inf), np.where(seen, var_b, np.inf)
        # Paper-faithful PrivKV [R-M]: key frequency and mean among reported holders (biased toward 0).
        reported = n_plus + n_minus
        r = np.where(reported > 0, reported, 1.0)
        h1 = np.clip((reported * (p2 - 1) + n_plus) / (2 * p2 - 1), 0.0, reported)
        h2 = np.clip((reported * (p2 - 1) + n_minus) / (2 * p2 - 1), 0.0, reported)
        extras = {"group_size": group.astype(np.int64),
                  "paper_key_frequency": np.where(seen, (p1 - 1 + reported / g) / (2 * p1 - 1), 0.0),
                  "paper_conditional_mean": np.where(reported > 0, (h1 - h2) / r, 0.0)}
        return kv_estimate(a, b, var_a, var_b, cov, n, counts, extras)

    def exact_output_distribution(self, items_row: np.ndarray) -> np.ndarray:
        """P(report = (key, value) | items) at index ``3 key + value + 1``."""
        keys, signs = check_items(np.asarray(items_row).reshape(1, -1), self.d, self.s)
        p1, p2 = self.p1, self.p2
        table = np.tile([(1 - p1) / 2, p1, (1 - p1) / 2], (self.d, 1))
        for k, sgn in zip(keys[0], signs[0], strict=True):
            if k < 0:
                continue  # empty slot
            table[k, 1 + sgn], table[k, 1 - sgn], table[k, 1] = p1 * p2, p1 * (1 - p2), 1 - p1
        return table.ravel() / self.d
