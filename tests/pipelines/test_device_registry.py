"""The device registry on a real broker: enrolment through the compacted devices topic, the shuffler's
incremental catch-up into its on-disk store, idempotent re-enrolment, revocation, dead letters for records
that are not enrolments, and the one-shot import of the legacy Parquet registry."""

from __future__ import annotations

import json
from pathlib import Path

import fastavro
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pipelines.registry import catch_up, import_legacy, store_path
from transforms.io.kafka.bounded import produce_records
from transforms.trust.__main__ import main as trust_cli
from transforms.trust.device_store import DeviceStore
from transforms.trust.devices import DeviceRegistry, device_id_of
from transforms.trust.enrolment import enrolment_record, revocation_record


def _keys(n: int) -> list[bytes]:
    return [Ed25519PrivateKey.generate().public_key().public_bytes_raw() for _ in range(n)]


def _letters(state: Path) -> list[dict]:
    out: list[dict] = []
    for path in sorted((state / "dead_letters").glob("dead-letters-*.avro")):
        with path.open("rb") as f:
            out.extend(fastavro.reader(f))
    return out


def test_enrol_catch_up_restart_reenrol_revoke_and_dead_letters(broker, topic_name: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    state, keys = tmp_path / "state", _keys(8)
    listing = tmp_path / "keys.hex"
    listing.write_text("\n".join(k.hex() for k in keys[:5]) + "\n")
    assert trust_cli(["enroll", str(tmp_path / "keys"), str(listing), "--kafka_bootstrap", broker.bootstrap,
                      "--devices_topic", topic_name]) == 0
    assert json.loads(capsys.readouterr().out)["written"] == 5

    def run() -> dict:
        return catch_up(state, bootstrap=broker.bootstrap, topic=topic_name, legacy_registry=None).as_dict()

    first = run()
    assert (first["read"], first["changed"], first["devices"], first["dead_lettered"]) == (5, 5, 5, 0)
    with DeviceStore(store_path(state), readonly=True) as store:
        ids = [device_id_of(k) for k in keys]
        assert store.public_keys(ids) == [*keys[:5], None, None, None]
    assert run()["read"] == 0  # a restart reads from the offsets kept in the store: nothing new

    # a re-enrolment of an enrolled key (the same record again, as compaction may or may not have merged it)
    produce_records(broker.bootstrap, topic_name, [enrolment_record(keys[0]), enrolment_record(keys[5])])
    again = run()
    assert (again["read"], again["changed"], again["devices"]) == (2, 1, 6)

    # records that are not enrolments: dead-lettered with the reason; the good record after them still counts
    other_key, other_value = enrolment_record(keys[7])
    produce_records(broker.bootstrap, topic_name, [
        (b"not-a-device-id", b"whatever"),
        (device_id_of(keys[6]).encode(), other_value),  # someone else's key under this id
        (other_key, b"ESAE\x02" + keys[7]),  # a version this reader does not know
        enrolment_record(keys[6]),
    ])
    bad = run()
    assert (bad["read"], bad["dead_lettered"], bad["devices"]) == (4, 3, 7)
    letters = _letters(state)
    assert len(letters) == 3 and {letter["stage"] for letter in letters} == {"registry"}
    text = " | ".join(letter["reason"] for letter in letters)
    assert "is not a device id" in text and "not the device id of the record's public key" in text
    assert "version 2 is not supported" in text
    assert all(letter["topic"] == topic_name and letter["original"] is not None for letter in letters)
    assert run()["read"] == 0 and len(_letters(state)) == 3  # read once: no second letter for the same record

    produce_records(broker.bootstrap, topic_name, [revocation_record(device_id_of(keys[1]))])
    assert run()["devices"] == 6
    with DeviceStore(store_path(state), readonly=True) as store:
        assert store.public_key(device_id_of(keys[1])) is None and store.public_key(device_id_of(keys[6])) == keys[6]
        assert len(store) == 6


def test_the_devices_topic_is_created_compacted(broker, topic_name: str) -> None:
    from confluent_kafka.admin import AdminClient, ConfigResource

    from pipelines.enrolment import enrol_keys

    assert enrol_keys(broker.bootstrap, topic_name, _keys(2)) == 2
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic_name)
    configs = admin.describe_configs([resource])[resource].result(timeout=30)
    assert configs["cleanup.policy"].value == "compact" and configs["retention.ms"].value == "-1"
    assert configs["delete.retention.ms"].value == str(30 * 86_400_000)


def test_a_bad_key_writes_nothing(broker, topic_name: str, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    listing = tmp_path / "keys.hex"
    listing.write_text(_keys(1)[0].hex() + "\n" + "ab" * 31 + "\n")
    code = trust_cli(["enroll", str(tmp_path / "keys"), str(listing), "--kafka_bootstrap", broker.bootstrap,
                      "--devices_topic", topic_name])
    assert code == 2 and "public key is 31 bytes, not 32" in capsys.readouterr().err
    from transforms.io.kafka.devices import devices_topic_exists

    assert not devices_topic_exists(broker.bootstrap, topic_name)  # checked before anything was created


def test_the_legacy_parquet_registry_is_imported_once_per_version(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "registry" / "devices.parquet"
    legacy = DeviceRegistry()
    keys = _keys(4)
    legacy.enroll(keys[:3])
    legacy.save(path)
    with DeviceStore(tmp_path / "store.sqlite") as store:
        assert import_legacy(store, path) == 3 and len(store) == 3
        assert import_legacy(store, path) is None  # the same file: nothing read
        assert store.public_keys([device_id_of(k) for k in keys]) == [*keys[:3], None]
        legacy.enroll(keys[3:])
        legacy.save(path)
        assert import_legacy(store, path) == 1 and len(store) == 4
