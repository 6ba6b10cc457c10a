"""Device identities: self-certifying device ids, the enrollment registry, and a simulated fleet.

A device id is a hash of the device's Ed25519 public key, so an id cannot be claimed by another key and
the registry can be checked on load. The registry lives in the shuffler's trust domain only: it links
device ids to keys, never to people.
"""

from __future__ import annotations

import hashlib
import io
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .files import KeyFileError, atomic_write, read_key_file

__all__ = ["DEVICE_ID_TAG", "DeviceRegistry", "SimulatedFleet", "device_id_of"]

DEVICE_ID_TAG = b"esa-device-v1"
FLEET_TAG = b"esa-fleet-v1|"
PUBLIC_KEY_BYTES = 32

_REGISTRY_SCHEMA = pa.schema([("device_id", pa.string()), ("public_key", pa.binary(PUBLIC_KEY_BYTES)),
                              ("enrolled_at_ms", pa.int64())])


def device_id_of(public_key: bytes) -> str:
    """Self-certifying id: the first 16 bytes of SHA-256(b"esa-device-v1" + public key), as 32 hex digits."""
    return hashlib.sha256(DEVICE_ID_TAG + bytes(public_key)).digest()[:16].hex()


class DeviceRegistry:
    """Enrolled devices: ``device_id -> raw public key`` with verifier objects built lazily and cached."""

    def __init__(self) -> None:
        self._keys: dict[str, bytes] = {}
        self._enrolled_at: dict[str, int] = {}
        self._verifiers: dict[str, Ed25519PublicKey] = {}

    @classmethod
    def load(cls, path: Path) -> DeviceRegistry:
        """Read ``devices.parquet``; a missing file is an empty registry. Refuses rows whose id is not the
        hash of their key (a tampered or corrupted registry)."""
        path = Path(path)
        registry = cls()
        if not path.exists():
            return registry
        try:
            table = pq.read_table(path, columns=["device_id", "public_key", "enrolled_at_ms"])
        except (pa.ArrowException, OSError) as err:
            raise KeyFileError(f"{path}: unreadable device registry ({err})") from None
        ids = table.column("device_id").to_pylist()
        keys = table.column("public_key").to_pylist()
        times = table.column("enrolled_at_ms").to_pylist()
        for device_id, key, at in zip(ids, keys, times, strict=True):
            if key is None or len(key) != PUBLIC_KEY_BYTES or device_id != device_id_of(key):
                raise KeyFileError(f"{path}: row for device {device_id!r} does not match its public key")
            registry._keys[device_id] = key
            registry._enrolled_at[device_id] = int(at)
        return registry

    def save(self, path: Path) -> None:
        """Write the registry atomically (owner-only: it is shuffler-domain data)."""
        ids = list(self._keys)
        table = pa.table({"device_id": pa.array(ids, pa.string()),
                          "public_key": pa.array([self._keys[i] for i in ids], pa.binary(PUBLIC_KEY_BYTES)),
                          "enrolled_at_ms": pa.array([self._enrolled_at[i] for i in ids], pa.int64())},
                         schema=_REGISTRY_SCHEMA)
        buf = io.BytesIO()
        pq.write_table(table, buf)
        atomic_write(Path(path), buf.getvalue())

    def enroll(self, public_keys: Iterable[bytes]) -> list[str]:
        """Enroll raw Ed25519 public keys; returns their device ids in order. Re-enrolling is a no-op that
        keeps the first enrollment time. Every key is checked before any is added."""
        checked: list[tuple[str, bytes, Ed25519PublicKey]] = []
        for i, key in enumerate(public_keys):
            if not isinstance(key, bytes | bytearray | memoryview) or len(key) != PUBLIC_KEY_BYTES:
                raise ValueError(f"public key #{i} is not {PUBLIC_KEY_BYTES} raw bytes")
            raw = bytes(key)
            try:
                verifier = Ed25519PublicKey.from_public_bytes(raw)
            except ValueError:
                raise ValueError(f"public key #{i} is not a valid Ed25519 public key") from None
            checked.append((device_id_of(raw), raw, verifier))
        now = time.time_ns() // 1_000_000
        for device_id, raw, verifier in checked:
            if device_id not in self._keys:
                self._keys[device_id] = raw
                self._enrolled_at[device_id] = now
                self._verifiers[device_id] = verifier
        return [device_id for device_id, _, _ in checked]

    def verifier(self, device_id: str) -> Ed25519PublicKey | None:
        """The enrolled device's public key object, or None if the id is not enrolled."""
        cached = self._verifiers.get(device_id)
        if cached is not None:
            return cached
        raw = self._keys.get(device_id)
        if raw is None:
            return None
        verifier = self._verifiers[device_id] = Ed25519PublicKey.from_public_bytes(raw)
        return verifier

    def public_key(self, device_id: str) -> bytes | None:
        return self._keys.get(device_id)

    def enrolled_at_ms(self, device_id: str) -> int | None:
        return self._enrolled_at.get(device_id)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, device_id: object) -> bool:
        return isinstance(device_id, str) and device_id in self._keys

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)


class SimulatedFleet:
    """Deterministic per-device keys derived from one master secret, for simulations and demos only.

    A real device generates its key on the device; a simulation of 10^5 devices cannot store 10^5 keys
    per run, so each simulated client's seed is HKDF-SHA256(master, info=b"esa-fleet-v1|" + client id).
    """

    def __init__(self, master: bytes, cache_size: int = 1 << 16) -> None:
        if not isinstance(master, bytes) or len(master) < 16:
            raise ValueError("fleet master secret must be at least 16 bytes")
        self._master = master
        self._cache_size = cache_size
        self._cache: OrderedDict[str, tuple[Ed25519PrivateKey, bytes, str]] = OrderedDict()

    @classmethod
    def from_keys_dir(cls, keys_dir: Path) -> SimulatedFleet:
        return cls(read_key_file(Path(keys_dir) / "encoder" / "fleet.key"))

    def _entry(self, client_id: str) -> tuple[Ed25519PrivateKey, bytes, str]:
        entry = self._cache.get(client_id)
        if entry is not None:
            self._cache.move_to_end(client_id)
            return entry
        seed = HKDF(hashes.SHA256(), 32, salt=None, info=FLEET_TAG + client_id.encode("utf-8")).derive(self._master)
        key = Ed25519PrivateKey.from_private_bytes(seed)
        public = key.public_key().public_bytes_raw()
        entry = (key, public, device_id_of(public))
        self._cache[client_id] = entry
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return entry

    def signing_key(self, client_id: str) -> Ed25519PrivateKey:
        return self._entry(client_id)[0]

    def public_key(self, client_id: str) -> bytes:
        return self._entry(client_id)[1]

    def device_id(self, client_id: str) -> str:
        return self._entry(client_id)[2]

    def enroll(self, registry: DeviceRegistry, client_ids: Iterable[str]) -> list[str]:
        """Enroll the simulated clients' keys; returns their device ids in order."""
        return registry.enroll(self.public_key(c) for c in client_ids)
