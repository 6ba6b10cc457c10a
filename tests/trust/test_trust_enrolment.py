"""Enrolment records (the devices topic's wire): round trip, and one clear refusal per kind of damage."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from transforms.trust import device_id_of
from transforms.trust.enrolment import (
    DEFAULT_DEVICES_TOPIC,
    EnrolmentRecordError,
    decode_enrolment,
    enrolment_record,
    revocation_record,
)


def _public(seed: int) -> bytes:
    return Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32).public_key().public_bytes_raw()


def test_round_trip_and_key_is_the_device_id() -> None:
    public = _public(1)
    key, value = enrolment_record(public)
    assert key == device_id_of(public).encode("ascii")
    assert value == b"ESAE\x01" + public
    assert decode_enrolment(key, value) == (device_id_of(public), public)
    assert enrolment_record(public) == (key, value)  # deterministic: re-enrolment compacts to one record
    assert DEFAULT_DEVICES_TOPIC == "devices"


def test_revocation_is_a_tombstone() -> None:
    device = device_id_of(_public(2))
    key, value = revocation_record(device)
    assert value is None and decode_enrolment(key, value) == (device, None)
    with pytest.raises(EnrolmentRecordError):
        revocation_record("not-a-device")


@pytest.mark.parametrize("bad", [b"", b"\x00" * 31, b"\x00" * 33, "ab" * 16])
def test_writer_refuses_what_is_not_a_key(bad: object) -> None:
    with pytest.raises(ValueError):
        enrolment_record(bad)  # type: ignore[arg-type]


def test_decoder_names_the_damage() -> None:
    public, other = _public(3), _public(4)
    key, value = enrolment_record(public)
    cases = {
        "no key": (None, value),
        "not a device id": (b"ABC", value),
        "not an enrolment record": (key, b"\x00" * 37),
        "version 2": (key, b"ESAE\x02" + public),
        "36 bytes": (key, value[:-1]),
        "not the device id of": (key, b"ESAE\x01" + other),
    }
    for reason, (k, v) in cases.items():
        with pytest.raises(EnrolmentRecordError, match=reason):
            decode_enrolment(k, v)
    uppercase = key.upper()
    with pytest.raises(EnrolmentRecordError, match="not a device id"):
        decode_enrolment(uppercase, value)
