"""Permanent randomization, memoized once per (device, metric, backstop parameters, value) and reused by every
later report.

[ESA]'s report fragmenting protects a value in the long run only if its backstop ``RR(x; eps_b)`` is drawn
once and kept: fresh backstops per window compose, and eps_b stops capping the loss. A mechanism opts in
by providing ``backstop_bits(values, rng)`` (the permanent draw, (n, cap) padded with d),
``fragments_from_backstop(backstop, rng)`` (one report's messages from stored backstops) and
``backstop_parameters`` (what the backstop's law depends on), as ``ReportFragmentedRappor`` does.

Store: ``state_dir/memo/<sha256(identity)[:24]>.json`` = ``{"format": 2, "identity": ..., "backstops":
{"<value>": [set bits, ascending]}}``, written atomically under the state lock before any report that uses
a new entry leaves ``Client.encode``. ``identity`` is ``backstop.backstop_identity``: the metric and the
backstop parameters (mechanism, d, eps_b). An edit of anything else in the spec -- ``[crowd] epsilon``,
lateness, the fragments -- keeps the stored backstops; a new eps_b or d gets a fresh store, never a
backstop drawn under another law. Stores of format 1 (keyed by the whole spec hash) of the same spec are
adopted on first use, so an upgrade does not redraw.

A backstop lives as long as the state directory: wiping it (a reinstall) makes a new device -- new key,
new id, new backstops -- whose reports compose with the old device's (docs/device-privacy.md).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from transforms.device.backstop import backstop_identity, is_memoizing
from transforms.device.state import StateError, read_json, write_json

__all__ = ["MemoStore", "is_memoizing"]

FORMAT = 2
LEGACY_FORMAT = 1


def _store_path(state_dir: Path, text: str) -> Path:
    return Path(state_dir) / "memo" / f"{hashlib.sha256(text.encode('utf-8')).hexdigest()[:24]}.json"


class MemoStore:
    """The memoized backstops of one (metric, backstop parameters) on one device (read and written under the
    state lock); ``spec`` is any spec of that metric with this randomizer."""

    def __init__(self, state_dir: Path, spec: Any, mechanism: Any):
        self.identity = backstop_identity(spec.metric, mechanism)
        self.path = _store_path(state_dir, self.identity)
        self._legacy_path, self._spec_id = _store_path(state_dir, spec.spec_id), spec.spec_id
        self.mechanism = mechanism

    def _load(self) -> dict[str, Any]:
        raw = read_json(self.path)
        if raw is None:
            store = {"format": FORMAT, "identity": self.identity, "backstops": self._legacy_backstops()}
            if store["backstops"]:
                write_json(self.path, store)  # adopt now: a later spec edit no longer finds the old file
            return store
        if raw.get("format") != FORMAT or raw.get("identity") != self.identity or not isinstance(
                raw.get("backstops"), dict):
            raise StateError(f"{self.path}: not the memo store of {self.identity}")
        return raw

    def _legacy_backstops(self) -> dict[str, Any]:
        """Backstops a format-1 store of this very spec holds (same parameters, so the same law), else none."""
        raw = read_json(self._legacy_path)
        if raw is None:
            return {}
        if raw.get("format") != LEGACY_FORMAT or raw.get("spec_id") != self._spec_id or not isinstance(
                raw.get("backstops"), dict):
            raise StateError(f"{self._legacy_path}: not the memo store of spec {self._spec_id}")
        return dict(raw["backstops"])  # each entry is checked like any stored one when it is used

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
        return len(self._load()["backstops"])
