"""Enrolment records: what the compacted devices topic carries, and how a record is checked.

The device registry is a compacted Kafka topic (``DEFAULT_DEVICES_TOPIC``) keyed by device id, so Kafka keeps
the newest record per device and a re-enrolment of the same key is idempotent. Both sides of the wire live
here, pure (no Kafka import): the writers (``python -m transforms.trust enroll``, the HTTP edge's
``POST /v1/enrol``, ``esa simulate``) call ``enrolment_record``; the shuffler calls ``decode_enrolment`` on
every record it reads and dead-letters what raises ``EnrolmentRecordError``.

Format, version 1:

* key: the device id as its 32 lowercase hex digits in ASCII (``device_id_of(public_key).encode()``), so
  ``kafka-console-consumer --property print.key=true`` shows the ids an operator knows;
* value: 37 bytes, ``b"ESAE"`` (magic: a report produced to the wrong topic is told apart from a damaged
  enrolment) + one version byte (``1``) + the raw 32-byte Ed25519 public key;
* a tombstone (value ``None``) revokes the device: compaction then drops the id altogether.

The record holds nothing else: no enrolment time, no request metadata (the edge sees IP addresses; none of it
may reach a topic). The key is self-certifying: the decoder refuses a record whose key is not the hash of its
public key, so a record cannot enrol a key under another device's id.
"""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .devices import PUBLIC_KEY_BYTES, device_id_of

__all__ = ["DEFAULT_DEVICES_TOPIC", "ENROLMENT_MAGIC", "ENROLMENT_VERSION", "EnrolmentRecordError",
           "decode_enrolment", "enrolment_record", "revocation_record"]

DEFAULT_DEVICES_TOPIC = "devices"
ENROLMENT_MAGIC = b"ESAE"
ENROLMENT_VERSION = 1
_HEADER = ENROLMENT_MAGIC + bytes([ENROLMENT_VERSION])
RECORD_BYTES = len(_HEADER) + PUBLIC_KEY_BYTES
_ID_DIGITS = 32
_LOWER_HEX = frozenset(b"0123456789abcdef")


class EnrolmentRecordError(ValueError):
    """A devices-topic record that is not a valid enrolment; the message is the dead-letter reason."""


def enrolment_record(public_key: bytes) -> tuple[bytes, bytes]:
    """The (Kafka key, value) that enrols a raw Ed25519 public key. Raises ``ValueError`` (one line) for
    anything that is not 32 bytes of a valid Ed25519 public key, so nothing unusable reaches the topic."""
    if not isinstance(public_key, bytes | bytearray | memoryview):
        raise ValueError(f"public key is {type(public_key).__name__}, not bytes")
    raw = bytes(public_key)
    if len(raw) != PUBLIC_KEY_BYTES:
        raise ValueError(f"public key is {len(raw)} bytes, not {PUBLIC_KEY_BYTES}")
    try:
        Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        raise ValueError("public key is not a valid Ed25519 public key") from None
    return device_id_of(raw).encode("ascii"), _HEADER + raw


def revocation_record(device_id: str) -> tuple[bytes, None]:
    """The tombstone that revokes ``device_id`` (32 lowercase hex digits)."""
    key = device_id.encode("ascii") if isinstance(device_id, str) and device_id.isascii() else b""
    _check_key(key)
    return key, None


def decode_enrolment(key: bytes | None, value: bytes | None) -> tuple[str, bytes | None]:
    """``(device_id, public key)`` of a record, or ``(device_id, None)`` for a revocation (tombstone).

    Raises ``EnrolmentRecordError`` naming what is wrong: a missing or malformed key, a value of the wrong
    length, magic or version, or a key that is not the device id of the public key.
    """
    _check_key(key)
    assert key is not None
    device_id = bytes(key).decode("ascii")
    if value is None:
        return device_id, None
    value = bytes(value)
    if value[:len(ENROLMENT_MAGIC)] != ENROLMENT_MAGIC:
        raise EnrolmentRecordError(f"device {device_id}: value does not start with {ENROLMENT_MAGIC!r} "
                                   "(not an enrolment record)")
    if len(value) < len(_HEADER) or value[len(ENROLMENT_MAGIC)] != ENROLMENT_VERSION:
        version = value[len(ENROLMENT_MAGIC)] if len(value) > len(ENROLMENT_MAGIC) else None
        raise EnrolmentRecordError(f"device {device_id}: enrolment record version {version} is not supported "
                                   f"(this reader knows {ENROLMENT_VERSION})")
    if len(value) != RECORD_BYTES:
        raise EnrolmentRecordError(f"device {device_id}: enrolment record is {len(value)} bytes, "
                                   f"not {RECORD_BYTES}")
    public_key = value[len(_HEADER):]
    if device_id_of(public_key) != device_id:
        raise EnrolmentRecordError(f"device {device_id}: key is not the device id of the record's public key")
    return device_id, public_key


def _check_key(key: bytes | None) -> None:
    if key is None:
        raise EnrolmentRecordError("enrolment record has no key (the key must be the device id)")
    raw = bytes(key)
    if len(raw) != _ID_DIGITS or not _LOWER_HEX.issuperset(raw):
        shown = raw[:40].decode("ascii", "replace")
        raise EnrolmentRecordError(f"enrolment record key {shown!r} is not a device id "
                                   f"({_ID_DIGITS} lowercase hex digits)")
