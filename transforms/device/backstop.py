"""Which permanent randomization a report reuses, on a device and at the edge encoder.

[ESA]'s backstop caps a value's lifetime loss at eps_b only if every report of that value on that device
is a fresh view of *one* backstop. Two places draw it:

* the device client memoizes it in its state directory (``memo.py``), drawn from OS entropy once;
* the edge encoder (``esa encode``, ``run``, ``demo``) keeps no per-device state, so it derives it from a
  keyed PRF of (device, metric, backstop parameters, value) under the encoder's backstop sub-key
  (``transforms.encoder.keys``): the same backstop in every window, every retry and every rerun, and
  unpredictable to anyone without the key.

Both key the backstop by the *metric* and the parameters its law depends on (``backstop_parameters``:
mechanism, d, eps_b), not by the spec hash: an edit of ``[crowd]``, the window, lateness or the fragments
keeps it (a redraw would add a fresh eps_b of loss), while a new eps_b or d draws a new one (the old one
has another law).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from transforms.mechanisms.randomness import KeyedRandom

__all__ = ["backstop_identity", "is_memoizing", "prf_backstops"]

PRF_PERSON = b"esa-backstop-v1"  # BLAKE2b personalization: domain separation from every other PRF use


def is_memoizing(mechanism: Any) -> bool:
    """True if the mechanism's randomization has a permanent part that must be drawn once and kept."""
    return mechanism.backstop_parameters is not None


def backstop_identity(metric: str, mechanism: Any) -> str:
    """Canonical JSON of (metric, backstop parameters): what a stored or derived backstop is keyed by."""
    return json.dumps({"metric": metric, "randomizer": mechanism.backstop_parameters}, sort_keys=True,
                      separators=(",", ":"))


def _stream_key(key: bytes, prefix: bytes, device: str, value: int) -> int:
    """BLAKE2b PRF of (identity, device, value): length-prefixed fields, so no two tuples share an encoding."""
    name = device.encode("utf-8")
    message = b"".join((prefix, len(name).to_bytes(4, "little"), name, value.to_bytes(8, "little", signed=True)))
    return int.from_bytes(hashlib.blake2b(message, key=key, digest_size=8, person=PRF_PERSON).digest(), "little")


def prf_backstops(key: bytes, metric: str, mechanism: Any, devices: Sequence[str], values: np.ndarray) -> np.ndarray:
    """The (n, backstop_cap) backstops of n (device, value) pairs, each a function of (key, device, metric,
    backstop parameters, value) alone -- whatever batch, window or retry it is drawn in.

    Row i is ``backstop_bits`` fed by a ``KeyedRandom`` stream keyed by a BLAKE2b PRF of the tuple: since a
    KeyedRandom row depends only on its key and the draw shapes, it is the same backstop every time, and
    across devices or values the streams are independent, so each row follows RR(value; eps_b) exactly.
    """
    if len(key) < 16:
        raise ValueError(f"the backstop key must have at least 16 bytes, got {len(key)}")
    identity = backstop_identity(metric, mechanism).encode("utf-8")
    prefix = len(identity).to_bytes(4, "little") + identity
    v = np.asarray(values, dtype=np.int64)
    if v.ndim != 1 or v.size != len(devices):
        raise ValueError(f"{len(devices)} devices but values of shape {v.shape}")
    cache: dict[tuple[str, int], int] = {}  # a batch often repeats a device's value: hash each pair once
    keys = np.empty(v.size, dtype=np.uint64)
    for i, (device, value) in enumerate(zip(devices, v.tolist(), strict=True)):
        pair = (device, value)
        if pair not in cache:
            cache[pair] = _stream_key(key, prefix, device, value)
        keys[i] = cache[pair]
    return mechanism.backstop_bits(v, KeyedRandom(keys))
