"""Permanent randomization, memoized once per (device, spec, value) and reused by every later report.

[ESA]'s report fragmenting protects a value in the long run only if its backstop ``RR(x; eps_b)`` is drawn
once and kept: fresh backstops per window compose, and eps_b stops capping the loss. A mechanism opts in
by providing ``backstop_bits(values, rng)`` (the permanent draw, (n, cap) padded with d) and
``fragments_from_backstop(backstop, rng)`` (one report's messages from stored backstops), as
``ReportFragmentedRappor`` does.

Store: ``state_dir/memo/<sha256(spec_id)[:24]>.json`` = ``{"format": 1, "spec_id": ..., "mechanism": ...,
"backstops": {"<value>": [set bits, ascending]}}``, written atomically under the state lock before any
report that uses a new entry leaves ``Client.encode``. The spec id hashes every parameter, so a changed
spec (another eps_b, d or tau) gets a fresh store instead of reusing a backstop drawn under other rules.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from transforms.device.state import StateError, read_json, write_json

__all__ = ["MemoStore", "is_memoizing"]

FORMAT = 1


def is_memoizing(mechanism: Any) -> bool:
    """True if the mechanism's randomization has a permanent part the device must draw once and keep."""
    return callable(getattr(mechanism, "backstop_bits", None)) and callable(
        getattr(mechanism, "fragments_from_backstop", None))


class MemoStore:
    """The memoized backstops of one spec on one device (read and written under the state lock)."""

    def __init__(self, state_dir: Path, spec_id: str, mechanism: Any):
        digest = hashlib.sha256(spec_id.encode("utf-8")).hexdigest()[:24]
        self.path = Path(state_dir) / "memo" / f"{digest}.json"
        self.spec_id, self.mechanism = spec_id, mechanism

    def _load(self) -> dict[str, Any]:
        raw = read_json(self.path)
        if raw is None:
            return {"format": FORMAT, "spec_id": self.spec_id, "mechanism": self.mechanism.name, "backstops": {}}
        if raw.get("format") != FORMAT or raw.get("spec_id") != self.spec_id or not isinstance(
                raw.get("backstops"), dict):
            raise StateError(f"{self.path}: not the memo store of spec {self.spec_id}")
        return raw

    def backstop(self, value_key: str, value: int, rng: Any) -> np.ndarray:
        """The (1, backstop_cap) padded backstop of ``value``: the stored one, else drawn now and stored
        (durably, before the caller can use it)."""
        mech = self.mechanism
        cap, d = int(mech.backstop_cap), int(mech.d)
        store = self._load()
        bits = store["backstops"].get(value_key)
        if bits is None:
            row = mech.backstop_bits(np.array([value], dtype=np.int64), rng)[0]
            bits = [int(b) for b in row if b < d]
            store["backstops"][value_key] = bits
            write_json(self.path, store)
        elif (not isinstance(bits, list) or len(bits) > cap or any(not isinstance(b, int) or not 0 <= b < d
                                                                   for b in bits) or bits != sorted(set(bits))):
            raise StateError(f"{self.path}: corrupt backstop for value {value_key}")
        out = np.full((1, cap), d, dtype=np.int64)
        out[0, :len(bits)] = bits
        return out

    def __len__(self) -> int:
        raw = read_json(self.path)
        return 0 if raw is None else len(raw.get("backstops", {}))
