"""Device identities: self-certifying device ids, the enrollment registry, and a simulated fleet.

A device id is a hash of the device's Ed25519 public key, so an id cannot be claimed by another key and
the registry can be checked on load. The registry lives in the shuffler's trust domain only: it links
device ids to keys, never to people.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .ed25519 import SodiumSigner
from .files import KeyFileError, atomic_write, read_key_file
from .layout import KeysDir

__all__ = ["DEVICE_ID_TAG", "DeviceRegistry", "SimulatedFleet", "device_id_of"]

DEVICE_ID_TAG = b"esa-device-v1"
FLEET_TAG = b"esa-fleet-v1|"
PUBLIC_KEY_BYTES = 32

_REGISTRY_SCHEMA = pa.schema([("device_id", pa.string()), ("public_key", pa.binary(PUBLIC_KEY_BYTES)),
                              ("enrolled_at_ms", pa.int64())])


def device_id_of(public_key: bytes) -> str:
    """Self-certifying id: the first 16 bytes of SHA-256(b"esa-device-v1" + public key), as 32 hex digits."""
    return hashlib.sha256(DEVICE_ID_TAG + bytes(public_key)).digest()[:16].hex()


_LOAD_BATCH = 65_536  # registry rows per record batch while loading


def _checked_rows(path: Path, batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
    """A batch's (raw ids (n, 16), keys (n, 32)), every id checked to be the hash of its key."""
    try:
        ids = _fixed_width(batch.column(0), 32)
        keys = _fixed_width(batch.column(1), PUBLIC_KEY_BYTES)
    except ValueError as err:
        raise KeyFileError(f"{path}: {err}") from None
    id_bytes, not_hex = _hex_rows(ids)
    # The self-certifying check, one hash a row over one bytes object of all the keys (indexing a numpy row
    # per device doubled the cost of loading), compared at once; a mismatch is then found row by row.
    raw_keys, width = keys.tobytes(), PUBLIC_KEY_BYTES
    expected = b"".join([hashlib.sha256(DEVICE_ID_TAG + raw_keys[i:i + width]).digest()[:16]
                         for i in range(0, len(raw_keys), width)])
    if not_hex.any() or expected != id_bytes.tobytes():
        for row in range(len(keys)):
            if not_hex[row] or id_bytes[row].tobytes() != expected[16 * row:16 * row + 16]:
                shown = ids[row].tobytes().decode("ascii", "replace")
                raise KeyFileError(f"{path}: row for device {shown!r} does not match its public key")
    return id_bytes, keys


def _fixed_width(column: pa.Array, width: int) -> np.ndarray:
    """A string or binary column whose every value has ``width`` bytes, as an (n, width) uint8 array."""
    try:
        fixed = column.cast(pa.binary()).cast(pa.binary(width))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
        raise ValueError(f"a row's {column.type} value is not {width} bytes long ({err})") from None
    if fixed.null_count:
        raise ValueError("a row has no device id or no public key")
    data = np.frombuffer(fixed.buffers()[1], dtype=np.uint8)
    return data[fixed.offset * width:(fixed.offset + len(fixed)) * width].reshape(-1, width)


_HEX = np.full(256, 255, dtype=np.uint8)
_HEX[np.frombuffer(b"0123456789abcdef", np.uint8)] = np.arange(16, dtype=np.uint8)


def _hex_rows(text: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, 32) lowercase hex digits -> ((n, 16) bytes, rows with a digit that is not lowercase hex)."""
    nibbles = _HEX[text]
    return (nibbles[:, 0::2] << 4) | nibbles[:, 1::2], (nibbles == 255).any(axis=1)


class DeviceRegistry:
    """Enrolled devices: ``device_id -> raw public key``.

    Why arrays: the shuffler loads the whole registry into every worker, and as Python dicts of str and bytes
    (plus a cached key object per device) it cost ~530 bytes per enrolled device -- 0.5 GB for a million
    devices. Loaded rows live in sorted numpy arrays (16-byte id, 32-byte key, time: 56 bytes per device),
    looked up by binary search; devices enrolled in this process sit in a small dict until saved.
    """

    def __init__(self) -> None:
        self._ids = np.zeros(0, dtype="S16")  # sorted raw ids of the loaded rows
        self._id_bytes = np.zeros((0, 16), dtype=np.uint8)  # the same, exact (numpy strips trailing NULs)
        self._keys = np.zeros((0, PUBLIC_KEY_BYTES), dtype=np.uint8)
        self._times = np.zeros(0, dtype=np.int64)
        self._added: dict[str, tuple[bytes, int]] = {}  # enrolled here, not saved yet

    @classmethod
    def load(cls, path: Path) -> DeviceRegistry:
        """Read ``devices.parquet``; a missing file is an empty registry. Refuses rows whose id is not the
        hash of their key (a tampered or corrupted registry)."""
        path = Path(path)
        registry = cls()
        if not path.exists():
            return registry
        # Streamed in record batches into preallocated arrays, no Python object per device: reading the
        # table whole and going through to_pylist() peaked at ~570 bytes per enrolled device (0.6 GB for a
        # million), in every process that loads the registry.
        try:
            source = pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20)
            n = source.metadata.num_rows
            id_bytes = np.empty((n, 16), dtype=np.uint8)
            keys = np.empty((n, PUBLIC_KEY_BYTES), dtype=np.uint8)
            times = np.empty(n, dtype=np.int64)
            done = 0
            for batch in source.iter_batches(batch_size=_LOAD_BATCH, use_threads=False,
                                             columns=["device_id", "public_key", "enrolled_at_ms"]):
                stop = done + batch.num_rows
                if stop > n:
                    raise KeyFileError(f"{path}: more rows than its metadata says")
                id_bytes[done:stop], keys[done:stop] = _checked_rows(path, batch)
                times[done:stop] = batch.column(2).to_numpy(zero_copy_only=False)
                done = stop
        except (pa.ArrowException, OSError) as err:
            raise KeyFileError(f"{path}: unreadable device registry ({err})") from None
        finally:
            pa.default_memory_pool().release_unused()  # Arrow's buffers back to the system, not kept in a pool
        if done != n:
            raise KeyFileError(f"{path}: fewer rows than its metadata says")
        order = np.argsort(id_bytes.view("S16").ravel(), kind="stable")
        registry._id_bytes = np.ascontiguousarray(id_bytes[order])
        registry._ids = registry._id_bytes.view("S16").ravel()
        registry._keys = np.ascontiguousarray(keys[order])
        registry._times = times[order]
        del id_bytes, keys, times
        if len(order) > 1 and not (registry._ids[1:] != registry._ids[:-1]).all():
            raise KeyFileError(f"{path}: a device is enrolled twice")
        return registry

    def _row(self, device_id: str) -> int | None:
        try:
            raw = bytes.fromhex(device_id)
        except (TypeError, ValueError):
            return None
        if len(raw) != 16 or not len(self._ids):
            return None
        i = int(np.searchsorted(self._ids, raw))
        return i if i < len(self._ids) and self._id_bytes[i].tobytes() == raw else None

    def _rows(self, device_ids: Sequence[Any]) -> np.ndarray:
        """Loaded row of each id (-1: not among the loaded rows), with one binary search over the batch when
        every id is a 32-digit hex string (one ``bytes.fromhex`` of them all), else ``_row`` one id at a time."""
        n = len(device_ids)
        if not len(self._ids):
            return np.full(n, -1, dtype=np.int64)
        raw = None
        if all(type(d) is str and len(d) == 32 for d in device_ids):
            try:
                raw = bytes.fromhex("".join(device_ids))
            except ValueError:  # a character that is not hex: each id on its own says which
                raw = None
        if raw is None or len(raw) != 16 * n:  # shorter: whitespace, which fromhex skips
            return np.fromiter((-1 if (i := self._row(d) if isinstance(d, str) else None) is None else i
                                for d in device_ids), np.int64, n)
        wanted = np.frombuffer(raw, dtype=np.uint8).reshape(n, 16)
        rows = np.minimum(np.searchsorted(self._ids, wanted.view("S16").ravel()), len(self._ids) - 1)
        return np.where((self._id_bytes[rows] == wanted).all(axis=1), rows, -1)

    def public_keys(self, device_ids: Iterable[Any]) -> list[bytes | None]:
        """``[self.public_key(d) for d in device_ids]``, vectorized: the shuffler looks up every set of a
        batch, and one binary search per id (with its hex decoding) cost ~2 microseconds a set."""
        ids = device_ids if isinstance(device_ids, list) else list(device_ids)
        out: list[bytes | None] = [None] * len(ids)
        rows = self._rows(ids)
        found = np.flatnonzero(rows >= 0)
        if len(found):
            keys = self._keys[rows[found]].tobytes()
            for j, i in enumerate(found.tolist()):
                out[i] = keys[j * PUBLIC_KEY_BYTES:(j + 1) * PUBLIC_KEY_BYTES]
        if self._added:  # enrolled here and not saved yet: these win, as in public_key
            for i, d in enumerate(ids):
                added = self._added.get(d) if isinstance(d, str) else None
                if added is not None:
                    out[i] = added[0]
        return out

    def save(self, path: Path) -> None:
        """Write the registry atomically (owner-only: it is shuffler-domain data)."""
        ids = [row.tobytes().hex() for row in self._id_bytes] + list(self._added)
        keys = [row.tobytes() for row in self._keys] + [key for key, _ in self._added.values()]
        times = [int(t) for t in self._times] + [at for _, at in self._added.values()]
        table = pa.table({"device_id": pa.array(ids, pa.string()),
                          "public_key": pa.array(keys, pa.binary(PUBLIC_KEY_BYTES)),
                          "enrolled_at_ms": pa.array(times, pa.int64())},
                         schema=_REGISTRY_SCHEMA)
        buf = io.BytesIO()
        pq.write_table(table, buf)
        atomic_write(Path(path), buf.getvalue())

    def enroll(self, public_keys: Iterable[bytes]) -> list[str]:
        """Enroll raw Ed25519 public keys; returns their device ids in order. Re-enrolling is a no-op that
        keeps the first enrollment time. Every key is checked before any is added."""
        checked: list[tuple[str, bytes]] = []
        for i, key in enumerate(public_keys):
            if not isinstance(key, bytes | bytearray | memoryview) or len(key) != PUBLIC_KEY_BYTES:
                raise ValueError(f"public key #{i} is not {PUBLIC_KEY_BYTES} raw bytes")
            raw = bytes(key)
            try:
                Ed25519PublicKey.from_public_bytes(raw)
            except ValueError:
                raise ValueError(f"public key #{i} is not a valid Ed25519 public key") from None
            checked.append((device_id_of(raw), raw))
        now = time.time_ns() // 1_000_000
        for device_id, raw in checked:
            if device_id not in self:
                self._added[device_id] = (raw, now)
        return [device_id for device_id, _ in checked]

    def verifier(self, device_id: str) -> Ed25519PublicKey | None:
        """The enrolled device's public key object, or None if the id is not enrolled."""
        raw = self.public_key(device_id)
        return None if raw is None else Ed25519PublicKey.from_public_bytes(raw)

    def public_key(self, device_id: str) -> bytes | None:
        added = self._added.get(device_id) if isinstance(device_id, str) else None
        if added is not None:
            return added[0]
        i = self._row(device_id) if isinstance(device_id, str) else None
        return None if i is None else self._keys[i].tobytes()

    def enrolled_at_ms(self, device_id: str) -> int | None:
        added = self._added.get(device_id) if isinstance(device_id, str) else None
        if added is not None:
            return added[1]
        i = self._row(device_id) if isinstance(device_id, str) else None
        return None if i is None else int(self._times[i])

    def __len__(self) -> int:
        return len(self._ids) + len(self._added)

    def __contains__(self, device_id: object) -> bool:
        return isinstance(device_id, str) and (device_id in self._added or self._row(device_id) is not None)

    def raw_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """Every device as arrays: (n x 16 raw ids, n x 32 raw public keys), the loaded rows in id order, then
        those enrolled here and not saved; what a bulk copy into the device store takes (no hex per device)."""
        if not self._added:
            return self._id_bytes, self._keys
        added = np.frombuffer(bytes.fromhex("".join(self._added)), np.uint8).reshape(-1, 16)
        keys = np.frombuffer(b"".join(k for k, _ in self._added.values()), np.uint8).reshape(-1, PUBLIC_KEY_BYTES)
        return np.concatenate([self._id_bytes, added]), np.concatenate([self._keys, keys])

    def __iter__(self) -> Iterator[str]:
        yield from (row.tobytes().hex() for row in self._id_bytes)
        yield from self._added


class SimulatedFleet:
    """Deterministic per-device keys derived from one master secret, for simulations and demos only.

    A real device generates its key on the device; a simulation of 10^5 devices cannot store 10^5 keys
    per run, so each simulated client's seed is HKDF-SHA256(master, info=b"esa-fleet-v1|" + client id).
    """

    def __init__(self, master: bytes, cache_size: int = 1 << 16) -> None:
        if not isinstance(master, bytes) or len(master) < 16:
            raise ValueError("fleet master secret must be at least 16 bytes")
        self._master = master
        self._prk = hmac.digest(bytes(32), master, "sha256")  # HKDF-Extract with the default (all-zero) salt
        self._cache_size = cache_size
        self._cache: OrderedDict[str, tuple[SodiumSigner, bytes, str]] = OrderedDict()

    @classmethod
    def from_keys_dir(cls, keys_dir: Path) -> SimulatedFleet:
        return cls(read_key_file(KeysDir(Path(keys_dir)).fleet_key))

    def _entry(self, client_id: str) -> tuple[SodiumSigner, bytes, str]:
        entry = self._cache.get(client_id)
        if entry is not None:
            self._cache.move_to_end(client_id)
            return entry
        key = SodiumSigner(self._seed(client_id))  # libsodium: 18 microseconds per key here against 31 for OpenSSL
        public = key.public_bytes_raw()
        entry = (key, public, device_id_of(public))
        self._cache[client_id] = entry
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return entry

    def prepare(self, client_ids: Iterable[str], threads: int = 1) -> None:
        """Derive the keys of the clients not cached yet in one go, their expansion on ``threads``: an encoder
        batch then finds every key it needs (at most the cache size; the rest are derived when asked)."""
        from .ed25519 import derive_signers

        missing = list(dict.fromkeys(c for c in client_ids if c not in self._cache))[:self._cache_size]
        seeds = [self._seed(c) for c in missing]
        for client_id, key in zip(missing, derive_signers(seeds, threads), strict=True):
            public = key.public_bytes_raw()
            self._cache[client_id] = (key, public, device_id_of(public))
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def _seed(self, client_id: str) -> bytes:
        # HKDF-SHA256(master, salt=None, info, 32 bytes) spelled out (RFC 5869): the extract step does not depend
        # on the client, so it is done once (``_prk``) and a seed is one HMAC (~1 microsecond, not ~3).
        return hmac.digest(self._prk, FLEET_TAG + client_id.encode("utf-8") + b"\x01", "sha256")

    def signing_key(self, client_id: str) -> SodiumSigner:
        return self._entry(client_id)[0]

    def public_key(self, client_id: str) -> bytes:
        return self._entry(client_id)[1]

    def device_id(self, client_id: str) -> str:
        return self._entry(client_id)[2]

    def enroll(self, registry: DeviceRegistry, client_ids: Iterable[str]) -> list[str]:
        """Enroll the simulated clients' keys; returns their device ids in order."""
        return registry.enroll(self.public_key(c) for c in client_ids)
