"""``Client``: one device's reporting on one spec -- randomize, charge the budget, seal, sign.

``encode`` runs in two phases. Under the state directory's lock it checks the budget, draws the report's
randomness (and, the first time a value is seen, its permanent backstop, stored durably), and writes the
new spend to ``budget.json``. Only then, outside the lock, does it seal every message to the analyzer and
sign the message set. A crash after the spend is written loses that budget but can never exceed it; a
crash before it leaves no report behind. Sealing and signing need no lock, so concurrent clients overlap
on the expensive part.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from transforms.device.accounting import ReportCost, report_cost
from transforms.device.budget import BUDGET_FILE, Budget, BudgetExceeded, BudgetStatus, Ledger
from transforms.device.memo import MemoStore, is_memoizing
from transforms.device.policy import check_policy
from transforms.device.state import load_device_key, locked, state_directory
from transforms.device.wire import ShufflerKey, signed_message_set
from transforms.mechanisms.base import encode_messages, is_single_message
from transforms.mechanisms.randomness import os_entropy_rng
from transforms.spec import MAX_CROWD_ID_LENGTH, AnalysisSpec
from transforms.trust.devices import device_id_of
from transforms.trust.ed25519 import Signer
from transforms.wire.event_values import client_inputs, event_value
from transforms.wire.rows import CHANNEL, PRESENCE, PayloadRow, array_to_rows, wire_dtype

__all__ = ["Client"]

NONCE_BYTES = 16
EPHEMERAL_BYTES = 32
MAX_TIME_MS = 2**53


class Client:
    """A device reporting values of one spec; several clients (one per spec) may share a ``state_dir``, and
    then share its device key, its budget and its lock.

    ``budget``: the device's budget. The first budgeted client on a ``state_dir`` stores it there; every
    client on that state directory must then pass the same one (``stored_budget(state_dir)`` reads it, and
    ``change_budget`` changes it), or construction -- and any later ``encode`` -- raises ``BudgetConflict``.
    The budget in force in the state directory is what is accounted.

    ``rng``: a numpy Generator for tests and simulations only -- it then also draws the nonce and the
    sealing keys, so the output bytes are reproducible. The default draws everything from OS entropy.
    ``clock``: seconds since the Unix epoch (default ``time.time``); it decides the budget's epoch and the
    default event time. A Client is not thread-safe (its Generator is not): use one per thread; clients in
    several threads or processes may share one ``state_dir``.
    """

    def __init__(self, spec: AnalysisSpec, state_dir: Path | str, *, analyzer_public_key: X25519PublicKey,
                 analyzer_key_id: str, shuffler_public_key: X25519PublicKey, shuffler_key_id: str,
                 budget: Budget | None = None, signing_key: Signer | None = None,
                 rng: np.random.Generator | None = None, clock: Callable[[], float] | None = None):
        for name, key, key_id in (("analyzer", analyzer_public_key, analyzer_key_id),
                                  ("shuffler", shuffler_public_key, shuffler_key_id)):
            if not isinstance(key, X25519PublicKey):
                raise TypeError(f"{name}_public_key must be an X25519PublicKey, got {type(key).__name__}")
            if not (isinstance(key_id, str) and key_id.isascii() and 1 <= len(key_id) <= 200):
                raise ValueError(f"{name}_key_id must be 1..200 ascii characters, got {key_id!r}")
        if budget is not None and not isinstance(budget, Budget):
            raise TypeError(f"budget must be a Budget or None, got {type(budget).__name__}")
        self.spec = spec
        self.state_dir = state_directory(Path(state_dir))
        self.budget = budget
        self._mechanism = spec.randomizer
        self._signer = signing_key if signing_key is not None else load_device_key(self.state_dir)
        self.public_key: bytes = self._signer.public_key().public_bytes_raw()
        self.device_id: str = device_id_of(self.public_key)
        self._analyzer, self._key_id = analyzer_public_key, analyzer_key_id
        self._shuffler = ShufflerKey(shuffler_key_id, shuffler_public_key)
        self._seeded = rng is not None
        self._rng = rng if rng is not None else os_entropy_rng()
        self._clock = clock if clock is not None else time.time
        self._memo = MemoStore(self.state_dir, spec, self._mechanism) if is_memoizing(self._mechanism) else None
        self._window_ms = spec.window_seconds * 1000
        with locked(self.state_dir):
            check_policy(self.state_dir, budget, float(self._clock()))  # refuse a foreign budget before any use

    # -- public API ---------------------------------------------------------------------------------------

    def encode(self, value: Any, *, event_time_ms: int | None = None, crowd_id: str | None = None) -> bytes:
        """The signed ``MessageSet`` of one event sealed to the shuffler, ready to send.

        Raises ``ValueError`` for a value outside the spec's domain (or a bad crowd id / event time),
        ``BudgetExceeded`` when the report would exceed the epoch's budget and ``BudgetConflict`` when the
        device's stored budget is not this client's (another client set it meanwhile); nothing is spent then.
        """
        checked = self._check_value(value)
        crowd = self._crowd(crowd_id)
        now = float(self._clock())
        event_time_ms = self._event_time(event_time_ms, now)
        value_key = json.dumps(int(checked)) if self._memo is not None else None
        with locked(self.state_dir):  # also unbudgeted: a budgeted client may have claimed the device meanwhile
            budget = check_policy(self.state_dir, self.budget, now)
            ledger = Ledger.load(self._budget_path, budget, now) if budget is not None else None
            cost = self._cost(ledger, value_key)
            if ledger is not None and not ledger.fits(cost.epsilon, budget.epsilon_per_epoch):
                raise BudgetExceeded(cost.epsilon, cost.rule, ledger.status(budget.epsilon_per_epoch), now)
            rows = self._randomize(checked, value_key)
            if ledger is not None:
                ledger.charge(cost.epsilon, cost.count_key)
                ledger.save(self._budget_path)  # durable before the report exists outside this call
        return self._seal_and_sign(rows, event_time_ms, crowd)

    def cost(self, value: Any) -> ReportCost:
        """What reporting ``value`` now would cost (and why), without reporting it."""
        checked = self._check_value(value)
        value_key = json.dumps(int(checked)) if self._memo is not None else None
        return self._cost(self._ledger_now()[0], value_key)

    def status(self) -> BudgetStatus:
        """Spent and remaining budget of the current epoch under the device's budget in force (limit inf and
        nothing recorded without a budget)."""
        ledger, budget = self._ledger_now()
        if ledger is None or budget is None:
            now = float(self._clock())
            return BudgetStatus(limit=math.inf, spent=0.0, remaining=math.inf, reports=0, epoch_start=int(now),
                                renews_at=int(now))
        return ledger.status(budget.epsilon_per_epoch)

    @property
    def memoized_values(self) -> int:
        """How many values of this spec have a stored permanent randomization on this device."""
        if self._memo is None:
            return 0
        with locked(self.state_dir):
            return len(self._memo)

    # -- internals ----------------------------------------------------------------------------------------

    @property
    def _budget_path(self) -> Path:
        return self.state_dir / BUDGET_FILE

    def _ledger_now(self) -> tuple[Ledger | None, Budget | None]:
        """The ledger in force and the device's budget in force (None, None without a budget)."""
        now = float(self._clock())
        with locked(self.state_dir):
            budget = check_policy(self.state_dir, self.budget, now)
            return (Ledger.load(self._budget_path, budget, now) if budget is not None else None), budget

    def _cost(self, ledger: Ledger | None, value_key: str | None) -> ReportCost:
        key = f"{self.spec.spec_id}|{value_key}"
        earlier = ledger.counts.get(key, 0) if ledger is not None else 0
        return report_cost(self._mechanism, self.spec.spec_id, value_key, earlier)

    def _check_value(self, value: Any) -> Any:
        """The spec's own domain check (``event_values``); vectors may be given as plain sequences."""
        if self.spec.kind == "vector_mean" and isinstance(value, np.ndarray | Sequence) and not isinstance(
                value, str | tuple):
            value = ("esa.telemetry.DenseVector", {"values": [float(x) for x in np.ravel(value)]})
        return event_value(self.spec, value)

    def _crowd(self, crowd_id: str | None) -> str | None:
        """The crowd id the spec asks for (``AnalysisSpec.crowd_of``'s rule, stricter), else None."""
        partition = self.spec.crowd.partition
        if partition is None:
            if crowd_id is not None:
                raise ValueError(f"{self.spec.name} has no crowd partition: pass crowd_id=None")
            return None
        if not isinstance(crowd_id, str) or not crowd_id:
            raise ValueError(f"{self.spec.name} splits crowds by {partition}: pass its value as crowd_id")
        if len(crowd_id) > MAX_CROWD_ID_LENGTH:
            raise ValueError(f"crowd_id of {len(crowd_id)} characters (at most {MAX_CROWD_ID_LENGTH})")
        return crowd_id

    @staticmethod
    def _event_time(event_time_ms: int | None, now: float) -> int:
        if event_time_ms is None:
            return int(now * 1000)
        if isinstance(event_time_ms, bool) or not isinstance(event_time_ms, int | np.integer):
            raise ValueError(f"event_time_ms must be an int (milliseconds since the Unix epoch), got {event_time_ms!r}")
        if not 0 <= int(event_time_ms) < MAX_TIME_MS:
            raise ValueError(f"event_time_ms {event_time_ms} outside [0, 2^53)")
        return int(event_time_ms)

    def _randomize(self, checked: Any, value_key: str | None) -> list[PayloadRow]:
        """Wire rows of one report: the presence marker first for multi-message mechanisms."""
        mech, rng = self._mechanism, self._rng
        if self._memo is not None:
            assert value_key is not None
            backstop = self._memo.backstop(value_key, int(checked), rng)
            reports, _ = mech.fragments_from_backstop(backstop, rng)
        else:
            reports, _ = encode_messages(mech, client_inputs(self.spec, [checked], rng), rng)
        if is_single_message(mech):
            return array_to_rows(reports)
        wire = np.zeros(len(reports) + 1, dtype=wire_dtype(mech))
        wire[CHANNEL][0] = PRESENCE
        for name in reports.dtype.names:
            wire[name][1:] = reports[name]
        return array_to_rows(wire)

    def _random_bytes(self, size: int) -> bytes:
        return self._rng.bytes(size) if self._seeded else os.urandom(size)

    def _seal_and_sign(self, rows: list[PayloadRow], event_time_ms: int, crowd: str | None) -> bytes:
        ephemerals = [self._random_bytes(EPHEMERAL_BYTES) for _ in rows] if self._seeded else None
        return signed_message_set(self.spec, rows, event_time_ms=event_time_ms, crowd_id=crowd,
                                  device_id=self.device_id, signer=self._signer, analyzer=self._analyzer,
                                  key_id=self._key_id, shuffler=self._shuffler, nonce=self._random_bytes(NONCE_BYTES),
                                  ephemerals=ephemerals,
                                  envelope_ephemeral=self._random_bytes(EPHEMERAL_BYTES) if self._seeded else None)
