"""The shuffler's device registry on disk: a SQLite table of 10^7 keys in bounded memory.

Why SQLite (the standard library's): the registry must hold ten million devices, change by a few rows at a
time and be looked up by every ingress worker. The Parquet registry (``devices.DeviceRegistry``) is loaded
whole into each worker (56 bytes per device: 0.56 GB at 10^7) and rewritten whole on every enrolment (~800
MB). Here a device is one row of a B-tree keyed by its raw 16-byte id (``WITHOUT ROWID``: the key is the
table), an enrolment is one insert, and a process holds at most its page cache (``CACHE_KIB`` per
connection) whatever the number of devices; the operating system's file cache does the rest.

What is in the file: ``devices`` (raw id -> raw Ed25519 public key), ``offsets`` (per devices-topic
partition, the next offset to read: kept in the same transaction as the rows it covers, so a crash between
two catch-ups re-reads at most one batch and applying it again changes nothing) and ``meta`` (the row count,
the legacy Parquet file last imported). One writer, the shuffler's driver under its state lock; readers
(ingress workers) open it read-only. WAL journaling lets readers run beside the writer; ``synchronous=NORMAL``
may lose the last commits on a power cut, which only means reading them from the topic again.

The store does not verify that a key is an Ed25519 point: ``enrolment.decode_enrolment`` checks each record's
id against its key, and a device whose key is not a point cannot sign anything that verifies.
"""

from __future__ import annotations

import errno
import re
import sqlite3
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from .devices import PUBLIC_KEY_BYTES

__all__ = ["CACHE_KIB", "DeviceStore"]

CACHE_KIB = 32 * 1024  # SQLite page cache per connection: the bound on a process's registry memory
_NO_ROOM = re.compile(r"disk I/O error|database or disk is full")  # SQLITE_IOERR, SQLITE_FULL
_LOOKUP_CHUNK = 500  # ids per SELECT ... IN (...): well under SQLite's 32,766 parameters
_SCHEMA = """
CREATE TABLE IF NOT EXISTS devices (id BLOB PRIMARY KEY, key BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS offsets (topic TEXT NOT NULL, part INTEGER NOT NULL, next INTEGER NOT NULL,
                                    PRIMARY KEY (topic, part)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value) WITHOUT ROWID;
INSERT OR IGNORE INTO meta VALUES ('format', 1), ('count', 0);
"""


class DeviceStore:
    """``device_id -> public key`` on disk (see the module doc). ``public_keys`` and ``public_key`` answer as
    ``DeviceRegistry``'s do, so verification takes either."""

    def __init__(self, path: Path | str, *, readonly: bool = False, cache_kib: int = CACHE_KIB) -> None:
        self.path = Path(path)
        self.readonly = readonly
        if readonly:
            if not self.path.exists():
                raise FileNotFoundError(f"{self.path}: no device store (the shuffler creates it when it starts)")
            uri = f"file:{self.path}?mode=ro"
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            uri = f"file:{self.path}?mode=rwc"
        # check_same_thread=False with our own lock: a runner may call one worker's DoFns from several threads
        self._db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=60.0)
        self._lock = threading.Lock()
        self._db.execute(f"PRAGMA cache_size = -{int(cache_kib)}")
        self._db.execute("PRAGMA mmap_size = 0")  # pages in the bounded cache only, never mapped whole
        if not readonly:
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")
            self._db.executescript(_SCHEMA)
            self.path.chmod(0o600)  # shuffler-domain data: owner only

    # ---------------------------------------------------------------- reading

    def public_keys(self, device_ids: Sequence[object]) -> list[bytes | None]:
        """Each id's enrolled public key, or None (unknown, or not an id), one query per 500 ids."""
        ids = device_ids if isinstance(device_ids, list) else list(device_ids)
        raw = [_raw_id(d) for d in ids]
        # In key order: each chunk then walks the B-tree left to right, its pages found in the cache the
        # previous id brought in (25% less CPU per id at 10^5 devices; more where the tree outgrows the cache).
        wanted = sorted({r for r in raw if r is not None})
        found: dict[bytes, bytes] = {}
        with self._lock:
            for start in range(0, len(wanted), _LOOKUP_CHUNK):
                chunk = wanted[start:start + _LOOKUP_CHUNK]
                marks = ",".join("?" * len(chunk))
                found.update(self._db.execute(f"SELECT id, key FROM devices WHERE id IN ({marks})", chunk))
        return [None if r is None else found.get(r) for r in raw]

    def public_key(self, device_id: object) -> bytes | None:
        return self.public_keys([device_id])[0]

    def __contains__(self, device_id: object) -> bool:
        return self.public_key(device_id) is not None

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT value FROM meta WHERE name = 'count'").fetchone()[0])

    def offsets(self, topic: str) -> dict[int, int]:
        """Per partition of ``topic``, the next offset to read (empty: read from the beginning)."""
        with self._lock:
            return dict(self._db.execute("SELECT part, next FROM offsets WHERE topic = ?", (topic,)))

    def meta(self, name: str) -> object:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return None if row is None else row[0]

    # ---------------------------------------------------------------- writing (one writer)

    def apply(self, changes: Iterable[tuple[str, bytes | None]], *, topic: str | None = None,
              offsets: Mapping[int, int] | None = None, meta: Mapping[str, object] | None = None) -> int:
        """Apply ``(device_id, public key)`` enrolments and ``(device_id, None)`` revocations in order, and
        record ``offsets`` of ``topic`` (the next offset to read), in one transaction; returns the change in
        the number of devices. Re-enrolling an enrolled key is a no-op (a device id is the hash of its key)."""
        if offsets and topic is None:
            raise ValueError("offsets given without their topic")

        def write(db: sqlite3.Connection) -> int:
            added = removed = 0
            for kind, rows in _runs(changes):
                mark = db.total_changes
                if kind == "add":
                    db.executemany("INSERT OR IGNORE INTO devices VALUES (?, ?)", rows)
                    added += db.total_changes - mark
                else:
                    db.executemany("DELETE FROM devices WHERE id = ?", rows)
                    removed += db.total_changes - mark
            if offsets:
                db.executemany("INSERT OR REPLACE INTO offsets VALUES (?, ?, ?)",
                               [(topic, int(p), int(o)) for p, o in offsets.items()])
            for name, value in (meta or {}).items():
                db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (name, value))
            return added - removed

        return self._transaction(write)

    def add_raw(self, ids: np.ndarray, keys: np.ndarray) -> int:
        """Enrol ``ids`` (n x 16 raw id bytes) with ``keys`` (n x 32 raw public keys) in one transaction, in
        id order; returns the devices added (an enrolled id is left as it is). The legacy import's path: no
        hex string per device, and inserts in key order append to the B-tree instead of splitting it at
        random (``apply`` of the same rows took 3 microseconds a device)."""
        ids = np.ascontiguousarray(ids, dtype=np.uint8).reshape(-1, 16)
        keys = np.ascontiguousarray(keys, dtype=np.uint8).reshape(-1, PUBLIC_KEY_BYTES)
        if len(ids) != len(keys):
            raise ValueError(f"{len(ids)} device ids for {len(keys)} public keys")
        order = np.argsort(ids.view("S16").ravel(), kind="stable")  # an id given twice is added once
        id_bytes, key_bytes = ids[order].tobytes(), keys[order].tobytes()
        k = PUBLIC_KEY_BYTES
        rows = [(id_bytes[16 * i:16 * i + 16], key_bytes[k * i:k * i + k]) for i in range(len(order))]

        def write(db: sqlite3.Connection) -> int:
            mark = db.total_changes
            db.executemany("INSERT OR IGNORE INTO devices VALUES (?, ?)", rows)
            return db.total_changes - mark

        return self._transaction(write)

    def _transaction(self, write: Callable[[sqlite3.Connection], int]) -> int:
        """``write(db)`` (returning the change in the number of devices) and the count's update, in one
        transaction; a write refused for room raises ``OSError(ENOSPC)``."""
        if self.readonly:
            raise PermissionError(f"{self.path}: opened read-only")
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                change = write(db)
                db.execute("UPDATE meta SET value = value + ? WHERE name = 'count'", (change,))
                db.execute("COMMIT")
            except BaseException as exc:
                if db.in_transaction:  # a failed COMMIT has already ended it; a second error would hide the first
                    db.execute("ROLLBACK")
                if isinstance(exc, sqlite3.OperationalError) and _NO_ROOM.search(str(exc)):
                    # SQLite reports a write refused by a full disk, a quota or a file-size limit as one of
                    # these: say it as the OS would, so the job exits "out of space" (7), not "internal error"
                    raise OSError(errno.ENOSPC, f"the device store could not be written: {exc}") from exc
                raise
        return change

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> DeviceStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _raw_id(device_id: object) -> bytes | None:
    if type(device_id) is not str or len(device_id) != 32:
        return None
    try:
        return bytes.fromhex(device_id)
    except ValueError:
        return None


def _runs(changes: Iterable[tuple[str, bytes | None]]) -> Iterable[tuple[str, list[tuple[bytes, ...]]]]:
    """Consecutive enrolments and consecutive revocations grouped (order between the two kinds kept)."""
    kind: str | None = None
    rows: list[tuple[bytes, ...]] = []
    for device_id, key in changes:
        raw = _raw_id(device_id)
        if raw is None:
            raise ValueError(f"{device_id!r} is not a device id")
        now = "del" if key is None else "add"
        if key is not None and len(key) != PUBLIC_KEY_BYTES:
            raise ValueError(f"device {device_id}: public key is not {PUBLIC_KEY_BYTES} bytes")
        if now != kind and rows:
            yield kind, rows  # type: ignore[misc]
            rows = []
        kind = now
        rows.append((raw, bytes(key)) if key is not None else (raw,))
    if rows:
        yield kind, rows  # type: ignore[misc]
