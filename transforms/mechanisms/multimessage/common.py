"""Shared machinery of the multi-message protocols of [MultiMsg] (``multimessage.py``).

Inputs are *sets* of at most ``k_set`` elements of [d] ([MultiMsg] §5.1; one value per client is ``k_set = 1``):
an int64 ``(n, k_set)`` array with ``-1`` in empty slots. Accumulators hold count arrays plus the number of
clients, which the analyzer cannot infer from anonymous messages: ``add`` requires it (n is public in [MultiMsg]'s
analysis and the estimators subtract the expected blanket mass ``n * ...``).
"""

from __future__ import annotations

from dataclasses import fields
from numbers import Integral, Real
from typing import Any, ClassVar, Protocol

import numpy as np

from transforms.mechanisms.base import Randomizer, Randomness, check_values
from transforms.mechanisms.frequency.counting import CountAccumulator, freeze_domain_and_epsilon, refuse_invalid

__all__ = [
    "MessageAccumulator",
    "ShuffleOnlyProtocol",
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


class MessageAccumulator(CountAccumulator):
    """Count array + number of clients of a multi-message protocol; merged by addition.

    Subclasses say how messages become counts (``_count``) and counts become item counts (``_decode``);
    unlike single-message accumulators, ``n`` counts clients (given to ``add``), not messages.
    """

    _empty = "no clients"

    def __init__(self, mechanism: _Counted, shape: tuple[int, ...]) -> None:
        super().__init__(mechanism, shape)  # type: ignore[arg-type]
        self.messages = 0

    def add(self, reports: np.ndarray, clients: int | None = None) -> None:
        """Fold the messages of ``clients`` clients (required: the estimators need n) into the counts."""
        if clients is None:
            raise ValueError(f"{self.mechanism.name}: add(reports, clients) needs the number of clients whose "
                             "messages these are (the shuffler publishes it); it cannot be inferred from messages")
        clients = check_positive_int("clients", clients, 0)
        arr = np.asarray(reports)
        if arr.size:
            m = self.mechanism
            refuse_invalid(m.validate(arr), f"messages are outside the {m.name} output domain")
            self.counts += self._count(arr)
            self.messages += int(arr.size)
        self.n += clients

    def merge(self, other: Any) -> None:
        """Add another accumulator of the *same* mechanism parameters into this one."""
        super().merge(other)
        self.messages += other.messages

    def _extras(self) -> dict[str, Any]:
        return {"messages": self.messages}


class ShuffleOnlyProtocol(Randomizer):
    """Mixin of the [MultiMsg] multi-message protocols (frozen dataclasses with ``d``, ``epsilon``, ``delta``,
    ``n_expected``, ``k_set``, ``calibration`` and an ``encode_sets`` method): parameter checks, pickling, the
    contract's non-LDP properties and the common part of the ledger."""

    calibrated_to_central: ClassVar[bool] = True  # epsilon is the central target its noise is sized to

    def _freeze_protocol(self) -> None:
        """Validate and normalise the parameters every protocol has (call first in ``__post_init__``)."""
        m: Any = self
        freeze_domain_and_epsilon(m)
        object.__setattr__(m, "delta", check_delta(m.delta))
        object.__setattr__(m, "n_expected", check_positive_int("n_expected", m.n_expected, 2))
        object.__setattr__(m, "k_set", check_positive_int("k_set", m.k_set))
        check_calibration(m.calibration)

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the public parameters only (hash tables and noise moments are rebuilt on demand)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]

    @property
    def epsilon_local(self) -> float:
        """Not locally private: a client's data messages are not eps-LDP for any finite eps (count-min sends
        them in the clear; a Hadamard data message always lies in C_j^tau and may lie outside C_j'^tau).
        Privacy comes from the shuffle only."""
        return float("inf")

    @property
    def mixture_alpha(self) -> float:
        """Not a single-message randomizer: use ``epsilon_central``."""
        return float("nan")

    def encode_messages(self, values: np.ndarray, rng: Randomness) -> tuple[np.ndarray, np.ndarray]:
        """One value per client (int64[n] in [0, d)) -> (messages, owner)."""
        return self.encode_sets(np.asarray(values), rng)  # type: ignore[attr-defined, no-any-return]

    def _ledger(self, protocol: str, n: int, expected: float, maximum: int, paper_claims: bool,
                **specific: Any) -> dict[str, Any]:
        """The ledger fields every protocol reports (messages, bits, target vs certified privacy), then its own."""
        m: Any = self
        return {
            "protocol": protocol,
            "calibration": m.calibration,
            "n": n,
            "messages_per_client_expected": expected,
            "messages_per_client_max": maximum,
            "bits_per_message": m.message_bits,
            "bytes_per_client_expected": expected * m.message_bits / 8.0,
            "epsilon_target": m.epsilon,
            "delta_target": m.delta,
            "epsilon_numeric": m.epsilon_central(n, m.delta),
            "delta_numeric": m.delta_central(n, m.epsilon),
            "epsilon_paper": m.epsilon if paper_claims else None,
            "delta_paper": m.delta if paper_claims else None,
            **specific,
        }


def ceil_log2(x: int) -> int:
    """Bits needed for values in [0, x): ceil(log2 x), 0 for x = 1 (exact integer arithmetic)."""
    return (int(x) - 1).bit_length()
