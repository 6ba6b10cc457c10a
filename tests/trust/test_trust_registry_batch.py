"""DeviceRegistry.public_keys, the shuffler's batch lookup: for any batch, exactly what public_key gives id by id.

The batch path hex-decodes the whole batch at once and binary-searches it in one call; these tests hold it to
the one-id path on the ids where the two could part: unknown, malformed (uppercase, whitespace, ids of 31 and
33 digits whose concatenation is valid hex, non-strings), ids past either end of the sorted rows, an empty
registry, and devices enrolled in this process but not saved yet.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transforms.trust import DeviceRegistry, device_id_of


def new_keys(n: int) -> list[bytes]:
    return [Ed25519PrivateKey.generate().public_key().public_bytes_raw() for _ in range(n)]


def one_by_one(registry: DeviceRegistry, ids: list) -> list[bytes | None]:
    return [registry.public_key(d) for d in ids]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[DeviceRegistry, list[bytes]]:
    """A registry of 200 devices as the shuffler has it: saved to Parquet and loaded back."""
    keys = new_keys(200)
    registry = DeviceRegistry()
    registry.enroll(keys)
    path = tmp_path_factory.mktemp("registry") / "devices.parquet"
    registry.save(path)
    return DeviceRegistry.load(path), keys


def test_a_batch_finds_every_enrolled_key_in_order_and_nothing_else(saved: tuple[DeviceRegistry, list[bytes]]
                                                                    ) -> None:
    loaded, keys = saved
    ids = [device_id_of(k) for k in keys]
    order = sorted(ids)
    unknown = [os.urandom(16).hex() for _ in range(20)]
    edges = ["0" * 32, "f" * 32, order[0][:-1] + "0", order[-1][:-1] + "f"]  # before, after and beside the ends
    batch = [*reversed(ids), *unknown, ids[3], ids[3], *edges, *order[:5]]
    found = loaded.public_keys(batch)
    assert found == one_by_one(loaded, batch)
    assert found[:200] == list(reversed(keys)) and found[200:220] == [None] * 20
    assert found[220] == found[221] == keys[3]
    assert loaded.public_keys([]) == []
    assert loaded.public_keys(iter(ids[:3])) == keys[:3]  # any iterable, not only a list


@pytest.mark.parametrize("malformed", [
    pytest.param(lambda i: i.upper(), id="uppercase (fromhex reads it: found, as one by one)"),
    pytest.param(lambda i: i[:10] + " " + i[11:], id="whitespace inside"),
    pytest.param(lambda i: i[:-1] + "g", id="not hex"),
    pytest.param(lambda i: i[:-2], id="15 bytes"),
    pytest.param(lambda i: i + "00", id="17 bytes"),
    pytest.param(lambda i: "", id="empty"),
    pytest.param(lambda i: None, id="None"),
    pytest.param(lambda i: bytes.fromhex(i), id="raw bytes"),
    pytest.param(lambda i: 17, id="an int"),
    pytest.param(lambda i: [i], id="unhashable"),
])
def test_malformed_ids_get_what_public_key_gives_and_spoil_nothing_else(
        saved: tuple[DeviceRegistry, list[bytes]], malformed) -> None:
    loaded, keys = saved
    ids = [device_id_of(k) for k in keys[:6]]
    batch = [ids[0], malformed(ids[1]), ids[2], os.urandom(16).hex(), ids[4]]
    found = loaded.public_keys(batch)
    assert found == one_by_one(loaded, batch)
    assert [found[0], found[2], found[3], found[4]] == [keys[0], keys[2], None, keys[4]]


def test_ids_of_31_and_33_digits_do_not_shift_into_each_others_bytes(saved: tuple[DeviceRegistry, list[bytes]]
                                                                    ) -> None:
    """Joined, "x[:-1]" and "x[-1] + y" are 64 valid hex digits that decode to two enrolled ids."""
    loaded, keys = saved
    a, b = device_id_of(keys[0]), device_id_of(keys[1])
    batch = [a[:-1], a[-1] + b]
    assert len("".join(batch)) == 64 and loaded.public_keys(batch) == one_by_one(loaded, batch) == [None, None]


def test_an_empty_registry_finds_nothing(tmp_path: Path) -> None:
    ids = [os.urandom(16).hex() for _ in range(5)] + ["not hex", None]
    for registry in (DeviceRegistry(), DeviceRegistry.load(tmp_path / "missing.parquet")):
        assert registry.public_keys(ids) == [None] * len(ids) and registry.public_keys([]) == []


def test_devices_enrolled_but_not_saved_are_found_beside_the_loaded_ones(
        saved: tuple[DeviceRegistry, list[bytes]], tmp_path: Path) -> None:
    loaded, keys = saved
    registry = DeviceRegistry.load(_resave(loaded, tmp_path))
    added = new_keys(4)
    registry.enroll(added)
    assert len(registry._added) == 4  # in memory only: the batch path must look there too
    batch = [device_id_of(added[0]), device_id_of(keys[0]), device_id_of(added[3]).upper(), device_id_of(added[1]),
             os.urandom(16).hex(), device_id_of(keys[1])]
    found = registry.public_keys(batch)
    assert found == one_by_one(registry, batch)
    assert found == [added[0], keys[0], None, added[1], None, keys[1]]  # an added id is matched as written
    only_added = DeviceRegistry()
    only_added.enroll(added)
    assert only_added.public_keys([device_id_of(k) for k in added]) == added


def _resave(registry: DeviceRegistry, tmp_path: Path) -> Path:
    path = tmp_path / "again.parquet"
    registry.save(path)
    return path


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_batch_equals_one_by_one(saved: tuple[DeviceRegistry, list[bytes]], data: st.DataObject) -> None:
    loaded, keys = saved
    enrolled = st.sampled_from([device_id_of(k) for k in keys])
    hexes = st.text("0123456789abcdefABCDEF \t", min_size=30, max_size=34)
    ids = data.draw(st.lists(st.one_of(enrolled, enrolled.map(str.upper), hexes, st.text(max_size=33),
                                       st.none(), st.binary(max_size=16)), max_size=12))
    assert loaded.public_keys(ids) == one_by_one(loaded, ids)
