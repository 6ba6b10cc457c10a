"""Device ids, the enrollment registry and the simulated fleet."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from transforms.trust import DeviceRegistry, KeyFileError, SimulatedFleet, device_id_of


def test_device_id_is_the_tagged_sha256_prefix() -> None:
    key = bytes(range(32))
    assert device_id_of(key) == hashlib.sha256(b"esa-device-v1" + key).hexdigest()[:32]
    assert device_id_of(key) != device_id_of(bytes(range(1, 33)))


def test_enroll_save_load_round_trip_and_idempotence(tmp_path: Path) -> None:
    keys = [Ed25519PrivateKey.generate().public_key().public_bytes_raw() for _ in range(5)]
    registry = DeviceRegistry()
    ids = registry.enroll(keys)
    assert ids == [device_id_of(k) for k in keys] and len(registry) == 5
    first_time = registry.enrolled_at_ms(ids[0])
    assert registry.enroll(keys[:2]) == ids[:2] and len(registry) == 5
    assert registry.enrolled_at_ms(ids[0]) == first_time
    path = tmp_path / "registry" / "devices.parquet"
    registry.save(path)
    assert os.stat(path).st_mode & 0o077 == 0
    loaded = DeviceRegistry.load(path)
    assert len(loaded) == 5 and all(i in loaded for i in ids) and "0" * 32 not in loaded
    assert [loaded.public_key(i) for i in ids] == keys
    assert loaded.enrolled_at_ms(ids[3]) == registry.enrolled_at_ms(ids[3])
    assert loaded.verifier(ids[1]).public_bytes_raw() == keys[1]
    assert loaded.verifier("f" * 32) is None and loaded.verifier("not hex") is None
    assert loaded.verifier("f" * 32) is None
    table = pq.read_table(path)
    assert table.schema.field("public_key").type == pa.binary(32)
    assert table.schema.field("enrolled_at_ms").type == pa.int64()


def test_missing_registry_is_empty(tmp_path: Path) -> None:
    assert len(DeviceRegistry.load(tmp_path / "nope.parquet")) == 0


@pytest.mark.parametrize("bad", [b"\x01" * 31, b"\x01" * 33, b"", "a" * 32])
def test_enroll_refuses_keys_that_are_not_32_bytes_and_adds_none(bad: object) -> None:
    registry = DeviceRegistry()
    good = Ed25519PrivateKey.generate().public_key().public_bytes_raw()
    with pytest.raises(ValueError, match="#1 is not 32 raw bytes"):
        registry.enroll([good, bad])
    assert len(registry) == 0


def test_load_refuses_a_row_whose_id_is_not_its_key_hash(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate().public_key().public_bytes_raw()
    path = tmp_path / "devices.parquet"
    pq.write_table(pa.table({"device_id": ["0" * 32], "public_key": pa.array([key], pa.binary(32)),
                             "enrolled_at_ms": pa.array([1], pa.int64())}), path)
    with pytest.raises(KeyFileError, match="does not match its public key"):
        DeviceRegistry.load(path)
    path.write_bytes(b"not parquet")
    with pytest.raises(KeyFileError, match="unreadable device registry"):
        DeviceRegistry.load(path)


def test_a_registry_of_1e5_devices_loads_in_seconds(tmp_path: Path) -> None:
    keys = [os.urandom(32) for _ in range(100_000)]  # any 32 bytes load as Ed25519 points
    path = tmp_path / "devices.parquet"
    pq.write_table(pa.table({"device_id": [device_id_of(k) for k in keys],
                             "public_key": pa.array(keys, pa.binary(32)),
                             "enrolled_at_ms": pa.array([0] * len(keys), pa.int64())}), path)
    t0 = time.perf_counter()
    registry = DeviceRegistry.load(path)
    elapsed = time.perf_counter() - t0
    assert len(registry) == 100_000
    assert registry.verifier(device_id_of(keys[-1])).public_bytes_raw() == keys[-1]
    assert elapsed < 3.0, f"loading 1e5 devices took {elapsed:.2f} s"


def test_fleet_keys_are_deterministic_per_client_and_master() -> None:
    master = b"m" * 32
    fleet, again, other = SimulatedFleet(master), SimulatedFleet(master), SimulatedFleet(b"o" * 32)
    assert fleet.public_key("c1") == again.public_key("c1")
    assert fleet.public_key("c1") != fleet.public_key("c2")
    assert fleet.public_key("c1") != other.public_key("c1")
    assert fleet.signing_key("c1").public_key().public_bytes_raw() == fleet.public_key("c1")
    assert fleet.device_id("c1") == device_id_of(fleet.public_key("c1"))
    registry = DeviceRegistry()
    assert fleet.enroll(registry, ["c1", "c2"]) == [fleet.device_id("c1"), fleet.device_id("c2")]
    signature = fleet.signing_key("c2").sign(b"x")
    registry.verifier(fleet.device_id("c2")).verify(signature, b"x")  # raises if wrong


def test_fleet_cache_is_bounded_and_refuses_a_short_master() -> None:
    fleet = SimulatedFleet(b"m" * 32, cache_size=4)
    first = fleet.public_key("c0")
    for i in range(10):
        fleet.device_id(f"c{i}")
    assert len(fleet._cache) == 4
    assert fleet.public_key("c0") == first  # evicted, then derived again identically
    with pytest.raises(ValueError, match="at least 16 bytes"):
        SimulatedFleet(b"short")


def test_loaded_registry_is_compact_and_exact_for_ids_ending_in_zero_bytes(tmp_path: Path) -> None:
    """Loaded rows sit in numpy arrays (numpy's bytes dtype drops trailing NULs: lookups must not)."""
    keys, zero_tail = [], None
    while zero_tail is None or len(keys) < 300:
        key = Ed25519PrivateKey.generate().public_key().public_bytes_raw()
        keys.append(key)
        if device_id_of(key).endswith("00") and zero_tail is None:
            zero_tail = key
    registry = DeviceRegistry()
    registry.enroll(keys)
    path = tmp_path / "devices.parquet"
    registry.save(path)
    loaded = DeviceRegistry.load(path)
    assert len(loaded) == len(keys) and sorted(loaded) == sorted(device_id_of(k) for k in keys)
    assert all(loaded.public_key(device_id_of(k)) == k for k in keys)
    zid = device_id_of(zero_tail)
    assert loaded.public_key(zid) == zero_tail and loaded.public_key(zid[:-2] + "01") != zero_tail
    assert loaded.public_key(zid[:-2]) is None  # 15 bytes: not an id, even if it is a prefix
    arrays = (loaded._ids, loaded._id_bytes, loaded._keys, loaded._times)
    assert sum(a.nbytes for a in arrays) / len(keys) <= 72  # 16 + 16 + 32 + 8 bytes per device


@pytest.mark.parametrize("client", ["alice", "", "ünïcode-client", "c" * 300])
def test_fleet_seeds_are_the_library_hkdf(client: str) -> None:
    """The one-HMAC seed equals HKDF-SHA256(master, salt=None, info=tag + client id) as ``cryptography`` computes
    it: simulated devices keep their keys (and the enrolled registry stays valid) across the change."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    from transforms.trust.devices import FLEET_TAG

    master = os.urandom(32)
    expected = HKDF(hashes.SHA256(), 32, salt=None, info=FLEET_TAG + client.encode("utf-8")).derive(master)
    assert SimulatedFleet(master)._seed(client) == expected
