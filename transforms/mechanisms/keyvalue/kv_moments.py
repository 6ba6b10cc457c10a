"""Moment algebra shared by the key-value baselines PrivKV and PCKV (docs/mathematics.md §3.3-3.4).

Both analyzers see, for every key ``k``, two counts: ``n1`` = reports supporting ``<k, +1>`` and ``n2`` = reports
supporting ``<k, -1>``; a single report supports at most one of them. Each user falls into one of three classes
for key ``k`` (holder of ``k+``, holder of ``k-``, neither), and each class has its own pair of support
probabilities ``(P+, P-)``. A linear statistic ``w+ n1 + w- n2`` then has the categorical variance

    sum_classes count_c [w+^2 P+(1 - P+) + w-^2 P-(1 - P-) - 2 w+ w- P+ P-]

(and the analogous covariance of two such statistics), exactly, because users randomize independently.
This module turns per-key estimates of ``A = f(k+)`` and ``B = f(k-)`` with their 2x2 covariance into the
``KeyValueEstimate`` the analyze stage publishes: item frequencies, mean, non-missing frequency and conditional
mean, each with a standard error (delta method for the conditional-mean ratio).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from transforms.mechanisms.base import KeyValueEstimate
from transforms.mechanisms.frequency.counting import CountAccumulator, freeze_domain_and_epsilon

__all__ = [
    "KVAccumulator",
    "check_items",
    "check_sparse_items",
    "class_counts",
    "freeze_sparsity",
    "held_sign",
    "kv_estimate",
    "linear_covariance",
    "plug_in_frequencies",
    "sign_weights",
]


def check_sparse_items(items: np.ndarray, d: int, s: int) -> np.ndarray:
    """Validate ``[n, s]`` items (``-1`` = empty slot) and return them as int64.

    Refuses items outside ``[-1, 2d)``, an item listed twice, and a key listed with both signs.
    """
    arr = np.asarray(items)
    if arr.ndim != 2 or arr.shape[1] != s:
        raise ValueError(f"items must have shape [n, s] = [n, {s}], got {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"items must be integer item indices, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and (arr.min() < -1 or arr.max() >= 2 * d):
        bad = arr[(arr < -1) | (arr >= 2 * d)][0]
        raise ValueError(f"item {bad} outside [0, 2d) = [0, {2 * d}) (use -1 for an empty slot)")
    if s > 1 and arr.size:
        keys = np.sort(arr >> 1, axis=1)  # empty slots become key -1
        dup = np.any((keys[:, 1:] == keys[:, :-1]) & (keys[:, 1:] >= 0), axis=1)
        if dup.any():
            row = int(np.argmax(dup))
            raise ValueError(f"client {row} lists a key twice (items {arr[row].tolist()}); keys must be distinct "
                             "and hold one sign")
    return arr


def check_items(items: np.ndarray, d: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    """Validate a batch of key-value sets and return ``(keys, signs)``, both int64 ``[n, s]``.

    ``items[i]`` holds the item indices ``item(j, b) = 2 j + (1 if b = +1 else 0)`` of client i (docs/mathematics.md
    §3), ``-1`` marking an empty slot (a client with fewer than s keys, as for Collision); a key may appear only
    once per client (:func:`check_sparse_items`). Empty slots come back as key -1 and sign 0; other signs are -1/+1.
    """
    arr = check_sparse_items(items, d, s)
    return arr >> 1, np.where(arr >= 0, 2 * (arr & 1) - 1, 0)  # key -1 stays -1


def freeze_sparsity(mech: Any) -> None:
    """Validate and normalise ``d``, ``epsilon`` and the sparsity ``s`` (1 <= s <= d) of a frozen mechanism."""
    freeze_domain_and_epsilon(mech)
    s = mech.s
    if isinstance(s, bool) or int(s) != s or not 1 <= s <= mech.d:
        raise ValueError(f"sparsity s must be an integer in [1, d] = [1, {mech.d}], got {s!r}")
    object.__setattr__(mech, "s", int(s))


def held_sign(keys: np.ndarray, signs: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Sign (+1/-1) that each client holds for its sampled ``key``, 0 if it holds none (O(n s))."""
    return np.where(keys == key[:, None], signs, 0).sum(axis=1)


def class_counts(f_plus: np.ndarray, f_minus: np.ndarray, n: np.ndarray | float) -> np.ndarray:
    """``[..., 3]`` expected class sizes (holders of k+, holders of k-, neither) of a population of n users."""
    fp, fm = np.asarray(f_plus, dtype=np.float64), np.asarray(f_minus, dtype=np.float64)
    nn = np.asarray(n, dtype=np.float64)
    return np.stack(np.broadcast_arrays(nn * fp, nn * fm, nn * (1.0 - fp - fm)), axis=-1)


def linear_covariance(w1: tuple[float, float], w2: tuple[float, float], probs: np.ndarray,
                      counts: np.ndarray) -> np.ndarray:
    """Covariance of ``w1 . (n1, n2)`` and ``w2 . (n1, n2)`` for class sizes ``counts`` ``[..., 3]``.

    ``probs[c] = (P+, P-)`` of class c. Exact for independent users; linear in the class sizes, so expected
    class sizes give the expected covariance over a random composition.
    """
    p = np.asarray(probs, dtype=np.float64)
    pp, pm = p[:, 0], p[:, 1]
    per_user = (w1[0] * w2[0] * pp * (1 - pp) + w1[1] * w2[1] * pm * (1 - pm)
                - (w1[0] * w2[1] + w1[1] * w2[0]) * pp * pm)
    return np.asarray(counts, dtype=np.float64) @ per_user


def sign_weights(sum_scale: float, diff_scale: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """Weights on (n1, n2) of ``A = (S + D)/2`` and ``B = (S - D)/2`` where ``S = sum_scale (n1 + n2) + c`` and
    ``D = diff_scale (n1 - n2)`` (the linear inversions of §3.3-3.4)."""
    plus = (0.5 * (sum_scale + diff_scale), 0.5 * (sum_scale - diff_scale))
    return plus, (plus[1], plus[0])


def plug_in_frequencies(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Estimates projected onto ``{A, B >= 0, A + B <= 1}`` (crudely) for plugging into variance formulas."""
    fp, fm = np.clip(a, 0.0, 1.0), np.clip(b, 0.0, 1.0)
    total = fp + fm
    scale = np.where(total > 1.0, 1.0 / np.maximum(total, 1e-300), 1.0)
    return fp * scale, fm * scale


def kv_estimate(a: np.ndarray, b: np.ndarray, var_a: np.ndarray, var_b: np.ndarray, cov_ab: np.ndarray, n: int,
                counts: np.ndarray, extras: dict[str, Any]) -> KeyValueEstimate:
    """Assemble the published estimate from per-key ``A = f(k+)``, ``B = f(k-)`` and their covariance.

    mean = A - B, non-missing = A + B (variances from the 2x2 covariance); conditional mean = mean / non-missing,
    clipped to [-1, 1], with a delta-method standard error; NaN where the estimated non-missing frequency is <= 0
    (no holder seen: the ratio is undefined).
    """
    d = a.shape[0]
    frequency = np.empty(2 * d)
    frequency[0::2], frequency[1::2] = b, a
    freq_se = np.empty(2 * d)
    freq_se[0::2], freq_se[1::2] = np.sqrt(var_b), np.sqrt(var_a)
    mean, nonmissing = a - b, a + b
    var_mean = np.maximum(var_a + var_b - 2 * cov_ab, 0.0)
    var_nonmissing = np.maximum(var_a + var_b + 2 * cov_ab, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):  # inf - inf for a key nobody sampled (PrivKV)
        cov_mn = var_a - var_b
        ratio = np.where(nonmissing > 0, mean / nonmissing, np.nan)
        var_ratio = (var_mean - 2 * ratio * cov_mn + ratio**2 * var_nonmissing) / nonmissing**2
    conditional = np.clip(ratio, -1.0, 1.0)
    cond_se = np.where(nonmissing > 0, np.sqrt(np.maximum(var_ratio, 0.0)), np.nan)
    return KeyValueEstimate(
        frequency=frequency, frequency_stderr=freq_se,
        mean=mean, mean_stderr=np.sqrt(var_mean),
        nonmissing=nonmissing, nonmissing_stderr=np.sqrt(var_nonmissing),
        conditional_mean=conditional, conditional_mean_stderr=cond_se,
        n=int(n), counts=counts, extras=extras,
    )


class _KVMechanism(Protocol):
    name: str

    def validate(self, reports: np.ndarray) -> np.ndarray: ...

    def count_reports(self, reports: np.ndarray, shape: tuple[int, ...]) -> np.ndarray: ...

    def decode_counts(self, counts: np.ndarray, n: int) -> KeyValueEstimate: ...


class KVAccumulator(CountAccumulator):
    """Per-key count array of a key-value mechanism plus ``n``; merges by addition, decodes through the mechanism.

    The mechanism says how reports become counts (``count_reports``) and counts become a
    :class:`KeyValueEstimate` (``decode_counts``), so one accumulator serves PrivKV and both PCKV variants.
    """

    mechanism: _KVMechanism

    def __init__(self, mechanism: _KVMechanism, shape: tuple[int, ...]) -> None:
        super().__init__(mechanism, shape)  # type: ignore[arg-type]

    def _count(self, reports: np.ndarray) -> np.ndarray:
        return self.mechanism.count_reports(reports, self.counts.shape)

    def estimate(self) -> KeyValueEstimate:  # type: ignore[override]
        """Unbiased per-key estimates with plug-in standard errors (fractions of n)."""
        if self.n == 0:
            raise ValueError("no reports")
        return self.mechanism.decode_counts(self.counts.copy(), self.n)
