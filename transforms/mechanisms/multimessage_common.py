"""Shared machinery of the multi-message protocols of seed 004 (``multimessage.py``).

Inputs are *sets* of at most ``k_set`` elements of [d] (004 §5.1; one value per client is ``k_set = 1``):
an int64 ``(n, k_set)`` array with ``-1`` in empty slots. Accumulators hold count arrays plus the number of
clients, which the analyzer cannot infer from anonymous messages: ``add`` requires it (n is public in 004's
analysis and the estimators subtract the expected blanket mass ``n * ...``).
"""

from __future__ import annotations

from numbers import Integral, Real
from typing import Any, Protocol

import numpy as np

from transforms.mechanisms.base import FrequencyEstimate, check_values

__all__ = [
    "MessageAccumulator",
    "ceil_log2",
    "check_calibration",
    "check_delta",
    "check_positive_int",
    "check_sets",
    "parity",
]

CALIBRATIONS = ("numeric", "paper")
_U64 = np.uint64


def check_positive_int(name: str, value: object, minimum: int = 1) -> int:
    """An integer >= ``minimum`` (integral floats accepted, booleans refused), with an error naming it."""
    ok = not isinstance(value, bool) and (
        isinstance(value, Integral) or (isinstance(value, Real) and float(value).is_integer())
    )
    if not ok or int(value) < minimum:  # type: ignore[call-overload]
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)  # type: ignore[call-overload]


def check_delta(delta: object) -> float:
    """The central delta target: a real in (0, 1)."""
    if isinstance(delta, bool) or not isinstance(delta, Real) or not 0.0 < float(delta) < 1.0:
        raise ValueError(f"delta must be a real number in (0, 1), got {delta!r}")
    return float(delta)


def check_calibration(calibration: str) -> str:
    if calibration not in CALIBRATIONS:
        raise ValueError(f"calibration must be one of {', '.join(CALIBRATIONS)}, got {calibration!r}")
    return calibration


def check_sets(sets: np.ndarray, d: int, k_set: int) -> np.ndarray:
    """``(n, k_set)`` int64 sets of distinct elements of [d], ``-1`` marking empty slots.

    A 1-D batch of values is one element per client (``k_set`` must then be 1, or the values fill slot 0).
    Duplicates inside a set are refused: the accuracy and privacy analyses count each element once.
    """
    arr = np.asarray(sets)
    if arr.ndim == 1:
        arr = check_values(arr, d)[:, None]
    if arr.ndim != 2:
        raise ValueError(f"sets must be a 1-D batch of values or an (n, k_set) array, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"set elements must be integer item indices, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.shape[1] > k_set:
        raise ValueError(f"sets hold at most k_set={k_set} elements, got {arr.shape[1]} slots")
    if arr.shape[1] < k_set:
        arr = np.concatenate([arr, np.full((arr.shape[0], k_set - arr.shape[1]), -1, np.int64)], axis=1)
    if arr.size and (arr.min() < -1 or arr.max() >= d):
        bad = arr[(arr < -1) | (arr >= d)][0]
        raise ValueError(f"set element {bad} outside the domain [0, {d}) (use -1 for an empty slot)")
    if k_set > 1 and arr.size:
        ordered = np.sort(arr, axis=1)
        if np.any((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)):
            raise ValueError("a set contains the same element twice")
    return arr


def parity(x: np.ndarray) -> np.ndarray:
    """Parity of the popcount of each non-negative int64 (XOR folding; portable across numpy versions)."""
    y = np.asarray(x).astype(_U64)
    for shift in (32, 16, 8, 4, 2, 1):
        y = y ^ (y >> _U64(shift))
    return (y & _U64(1)).astype(np.int64)


class _Counted(Protocol):
    name: str

    def validate(self, reports: np.ndarray) -> np.ndarray: ...

    def variance(self, counts: np.ndarray, n: int) -> np.ndarray: ...


class MessageAccumulator:
    """Count array + number of clients of a multi-message protocol; merged by addition.

    Subclasses say how messages become counts (``_count``) and counts become item counts (``_decode``).
    """

    def __init__(self, mechanism: _Counted, shape: tuple[int, ...]) -> None:
        self.mechanism = mechanism
        self.counts = np.zeros(shape, dtype=np.int64)
        self.n = 0
        self.messages = 0

    def _count(self, reports: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _decode(self) -> tuple[np.ndarray, dict[str, Any]]:
        raise NotImplementedError

    def add(self, reports: np.ndarray, clients: int | None = None) -> None:
        """Fold the messages of ``clients`` clients (required: the estimators need n) into the counts."""
        if clients is None:
            raise ValueError(f"{self.mechanism.name}: add(reports, clients) needs the number of clients whose "
                             "messages these are (the shuffler publishes it); it cannot be inferred from messages")
        clients = check_positive_int("clients", clients, 0)
        arr = np.asarray(reports)
        if arr.size:
            valid = self.mechanism.validate(arr)
            if not valid.all():
                raise ValueError(f"{int((~valid).sum())} of {arr.size} messages are outside the "
                                 f"{self.mechanism.name} output domain; filter them with validate() first")
            self.counts += self._count(arr)
            self.messages += int(arr.size)
        self.n += clients

    def merge(self, other: Any) -> None:
        """Add another accumulator of the *same* mechanism parameters into this one."""
        if type(other) is not type(self) or other.mechanism != self.mechanism:
            raise ValueError(f"cannot merge {other!r} into an accumulator of {self.mechanism!r}")
        self.counts += other.counts
        self.n += other.n
        self.messages += other.messages

    def estimate(self) -> FrequencyEstimate:
        """Item counts, frequencies (fractions of n clients) and closed-form standard errors."""
        if self.n == 0:
            raise ValueError("no clients")
        count, extras = self._decode()
        plug_in = np.clip(count, 0.0, float(self.n))
        stderr = np.sqrt(self.mechanism.variance(plug_in, self.n)) / self.n
        extras = {"messages": self.messages, **extras}
        return FrequencyEstimate(count=count, frequency=count / self.n, stderr=stderr, n=self.n, extras=extras)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.mechanism!r}, n={self.n})"


def ceil_log2(x: int) -> int:
    """Bits needed for values in [0, x): ceil(log2 x), 0 for x = 1 (exact integer arithmetic)."""
    return (int(x) - 1).bit_length()
