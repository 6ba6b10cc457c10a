"""Client-side encoder: real-valued key-value telemetry -> the ``[n, s]`` items of Collision / CoCo
(docs/mathematics.md §3).

An event is a mapping ``{key: value}`` over the spec's ordered key list, values in ``[lo, hi]``. Each step and
what it does to the estimates (``u`` = normalised value, ``x_j`` = fraction of clients holding key j):

1. **Normalise** ``u = 2 (v - lo)/(hi - lo) - 1`` in [-1, 1]: affine and exact. Estimates are in u units;
   :meth:`KeyValueEncoder.denormalise` maps a conditional mean (and its stderr) back. The unconditional mean
   counts a missing key as u = 0, i.e. the middle of the range, not the value 0.
2. **Stochastic ternary discretisation**: ``b = +1`` w.p. ``(1 + u)/2`` else -1, so ``E[b] = u`` (unbiased)
   and ``Var[b] = 1 - u^2``. The item frequencies become ``E f(j+-) = sum_i (1 +- u_ij)/(2n)``; the mean and
   conditional mean stay unbiased / consistent for the real-valued targets; the non-missing frequency is
   unaffected. Variance: ``Var[mean_j]`` gains ``sum_i (1 - u_ij^2)/n^2 <= x_j/n`` on top of the mechanism's
   variance, which is conditional on the signs (:func:`discretisation_variance_bound`; about 4 % of Collision's
   variance at eps = 1).
3. **Short events** (fewer than s keys): the empty slots are ``-1``, no dummy keys. Collision is exact and
   unbiased for rows with m <= s items, CoCo fills empty slots with phantom writers (``coco.py``): no bias and
   no variance added, and nothing for the analyzer to know.
4. **Key sampling** (only when ``max_keys = L > s``): the event is padded to L slots and s of them are kept
   uniformly at random, so *every* key survives with the same probability ``s/L`` whatever the event's size.
   Uncorrected, frequencies, means and non-missing frequencies shrink by ``s/L`` (conditional means do not);
   the mechanisms built with the same ``max_keys`` divide by it and use the exact variance with the holder's
   counting probability ``1/t + (s/L)(p - 1/t)`` (roughly ``(L/s)^2`` times the variance). Keeping all keys of
   events with L' <= s and sampling only larger ones would bias the estimate (a per-client factor the
   analyzer cannot undo). Events with more than ``max_keys`` keys are refused (dead letter).

Randomness: two draws of shape ``(n, max_keys)`` (discretisation, then sampling if L > s), never depending on
the batch's own widths, so :class:`~transforms.mechanisms.randomness.KeyedRandom` reproduces every client.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from transforms.mechanisms.base import Randomness

__all__ = ["KeyValueEncoder", "discretisation_variance_bound", "discretise", "sample_slots"]


def discretise(u: np.ndarray, uniform: np.ndarray) -> np.ndarray:
    """Stochastic ternary rounding of ``u`` in [-1, 1]: +1 where ``uniform < (1 + u)/2``, else -1 (int64)."""
    return np.where(uniform < (1.0 + u) / 2.0, 1, -1).astype(np.int64)


def sample_slots(items: np.ndarray, s: int, priorities: np.ndarray) -> np.ndarray:
    """Keep the s slots of each row with the smallest priorities (uniform s-subsets of the row's slots)."""
    keep = np.argsort(priorities, axis=1, kind="stable")[:, :s]
    return np.take_along_axis(items, keep, axis=1)


def discretisation_variance_bound(nonmissing: np.ndarray, n: int) -> np.ndarray:
    """Upper bound ``x_j / n`` of the variance discretisation adds to the mean of key j (``1 - u^2 <= 1``)."""
    return np.clip(np.asarray(nonmissing, dtype=np.float64), 0.0, 1.0) / n


@dataclass(frozen=True)
class KeyValueEncoder:
    """Turns ``{key: value}`` events into ``[n, s]`` items (``-1`` = empty slot) for Collision / CoCo.

    ``max_keys`` (default s) must equal the mechanism's ``max_keys``; ``clip=True`` clamps out-of-range values to
    ``value_range`` (a bias toward the range) instead of refusing the event.
    """

    keys: tuple[str, ...]
    s: int
    value_range: tuple[float, float] = (-1.0, 1.0)
    max_keys: int | None = None
    clip: bool = False
    key_index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        keys = tuple(self.keys)
        if not keys or not all(isinstance(k, str) and k for k in keys) or len(set(keys)) != len(keys):
            raise ValueError("keys must be a non-empty list of distinct non-empty strings")
        object.__setattr__(self, "keys", keys)
        if isinstance(self.s, bool) or int(self.s) != self.s or not 1 <= self.s <= len(keys):
            raise ValueError(f"s must be an integer in [1, number of keys = {len(keys)}], got {self.s!r}")
        lo, hi = (float(v) for v in self.value_range)
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"value_range must be [lo, hi] with finite lo < hi, got {self.value_range!r}")
        limit = self.s if self.max_keys is None else self.max_keys
        if isinstance(limit, bool) or int(limit) != limit or limit < self.s:
            raise ValueError(f"max_keys must be an integer >= s = {self.s} (or None for s), got {self.max_keys!r}")
        object.__setattr__(self, "s", int(self.s))
        object.__setattr__(self, "value_range", (lo, hi))
        object.__setattr__(self, "max_keys", int(limit))
        object.__setattr__(self, "key_index", {k: i for i, k in enumerate(keys)})

    @classmethod
    def for_mechanism(cls, mechanism: Any, keys: Sequence[str], value_range: tuple[float, float] = (-1.0, 1.0),
                      clip: bool = False) -> KeyValueEncoder:
        """An encoder sharing ``s`` and ``max_keys`` with ``mechanism`` (whose ``d`` must be ``len(keys)``)."""
        if mechanism.d != len(keys):
            raise ValueError(f"mechanism has d = {mechanism.d} keys, the key list has {len(keys)}")
        return cls(tuple(keys), mechanism.s, value_range, mechanism.max_keys, clip)

    @property
    def width(self) -> int:
        """Slots per client before sampling (``max_keys``)."""
        assert self.max_keys is not None
        return self.max_keys

    @property
    def keep_probability(self) -> float:
        """Probability that a held key is reported, ``s / max_keys``."""
        return self.s / self.width

    # -- validation ------------------------------------------------------------------------------------------

    def event_error(self, event: Any) -> str | None:
        """Why ``event`` cannot be encoded (a dead-letter reason), or None if it can."""
        if not isinstance(event, Mapping):
            return f"event must be a mapping of key -> value, got {type(event).__name__}"
        if len(event) > self.width:
            return f"event has {len(event)} keys, more than max_keys = {self.width}"
        lo, hi = self.value_range
        for key, value in event.items():
            if key not in self.key_index:
                return f"unknown key {key!r}"
            if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
                return f"value of key {key!r} is not a number ({value!r})"
            if not math.isfinite(value):
                return f"value of key {key!r} is not finite ({value!r})"
            if not self.clip and not lo <= value <= hi:
                return f"value {value!r} of key {key!r} outside value_range [{lo}, {hi}]"
        return None

    def row_errors(self, key_idx: np.ndarray, values: np.ndarray) -> list[str | None]:
        """Vectorised :meth:`event_error` for padded arrays (``key_idx`` -1 = padding): one reason or None per row."""
        k, v = self._arrays(key_idx, values)
        d, (lo, hi) = len(self.keys), self.value_range
        present = k >= 0
        checks = [
            ((k < -1) | (k >= d), lambda i, j: f"key index {k[i, j]} outside [0, {d})"),
            (present & ~np.isfinite(v), lambda i, j: f"value of key {self._name(k[i, j])} is not finite ({v[i, j]})"),
        ]
        if not self.clip:
            outside = present & np.isfinite(v) & ((v < lo) | (v > hi))
            checks.append((outside, lambda i, j: f"value {v[i, j]} of key {self._name(k[i, j])} outside "
                                                 f"value_range [{lo}, {hi}]"))
        ordered = np.sort(k, axis=1)
        twice = np.zeros_like(present)
        twice[:, 1:] = (ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)
        checks.append((twice, lambda i, j: f"key {self._name(ordered[i, j])} listed twice"))
        count = present.sum(axis=1)
        too_many = np.zeros_like(present)
        too_many[:, 0] = count > self.width
        checks.append((too_many, lambda i, j: f"event has {count[i]} keys, more than max_keys = {self.width}"))
        reasons: list[str | None] = [None] * k.shape[0]
        for mask, reason in checks:
            for i in np.flatnonzero(mask.any(axis=1)):
                if reasons[i] is None:
                    reasons[i] = reason(i, int(np.argmax(mask[i])))
        return reasons

    def _name(self, index: int) -> str:
        return repr(self.keys[index]) if 0 <= index < len(self.keys) else f"#{index}"

    def _arrays(self, key_idx: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k, v = np.asarray(key_idx), np.asarray(values, dtype=np.float64)
        if k.ndim != 2 or v.shape != k.shape:
            raise ValueError(f"key_idx and values must be 2-D arrays of one shape, got {k.shape} and {v.shape}")
        if k.size and not np.issubdtype(k.dtype, np.integer):
            raise TypeError(f"key_idx must be integer key indices (-1 = padding), got dtype {k.dtype}")
        return k.astype(np.int64, copy=False), v

    # -- encoding ----------------------------------------------------------------------------------------------

    def to_padded(self, events: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
        """``(key_idx, values)`` of shape ``[n, max_keys]`` (-1 / NaN padding); ValueError names a bad event."""
        n = len(events)
        k = np.full((n, self.width), -1, dtype=np.int64)
        v = np.full((n, self.width), np.nan)
        for i, event in enumerate(events):
            reason = self.event_error(event)
            if reason is not None:
                raise ValueError(f"event {i}: {reason}")
            for j, (key, value) in enumerate(event.items()):
                k[i, j], v[i, j] = self.key_index[key], float(value)
        return k, v

    def normalise(self, values: np.ndarray) -> np.ndarray:
        """``2 (v - lo)/(hi - lo) - 1``, clamped to [-1, 1] (rounding, or out-of-range values with ``clip``)."""
        lo, hi = self.value_range
        return np.clip(2.0 * (np.asarray(values, dtype=np.float64) - lo) / (hi - lo) - 1.0, -1.0, 1.0)

    def encode_padded(self, key_idx: np.ndarray, values: np.ndarray, rng: Randomness) -> np.ndarray:
        """Items ``[n, s]`` (``2 key + (b = +1)``, -1 = empty) from padded arrays of width <= ``max_keys``.

        Refuses (ValueError naming the first bad row and why) any batch with an invalid row: filter with
        :meth:`row_errors` first to dead-letter rows individually.
        """
        k, v = self._arrays(key_idx, values)
        for i, reason in enumerate(self.row_errors(k, v)):
            if reason is not None:
                raise ValueError(f"row {i}: {reason}")
        if k.shape[1] > self.width:  # every row has <= max_keys keys: move them left, drop padding columns
            left = np.argsort(k < 0, axis=1, kind="stable")[:, :self.width]
            k, v = np.take_along_axis(k, left, axis=1), np.take_along_axis(v, left, axis=1)
        n, pad = k.shape[0], self.width - k.shape[1]
        if pad:
            k = np.hstack([k, np.full((n, pad), -1, dtype=np.int64)])
            v = np.hstack([v, np.zeros((n, pad))])
        u = self.normalise(np.where(k >= 0, v, 0.0))
        signs = discretise(u, rng.random((n, self.width)))
        items = np.where(k >= 0, 2 * k + (signs > 0), -1)
        if self.width > self.s:
            items = sample_slots(items, self.s, rng.random((n, self.width)))
        return items

    def encode_events(self, events: Sequence[Any], rng: Randomness) -> np.ndarray:
        """:meth:`to_padded` then :meth:`encode_padded` (ValueError on the first bad event)."""
        return self.encode_padded(*self.to_padded(events), rng)

    def denormalise(self, u: np.ndarray, stderr: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Map a conditional mean in u units (and its stderr) back to value units: ``lo + (u + 1)(hi - lo)/2``."""
        lo, hi = self.value_range
        half = (hi - lo) / 2.0
        value = lo + (np.asarray(u, dtype=np.float64) + 1.0) * half
        return value, None if stderr is None else np.asarray(stderr, dtype=np.float64) * half
