"""An enrolment as a Kafka record of the compacted devices topic: key = device id, value = the public key.

Minimal form written by the ingestion edge (``esa edge``'s ``POST /v1/enrol``); the registry that reads the
topic defines the full record. Keyed by the self-certifying device id, so compaction keeps one record per
device and re-enrolling the same key writes the same record again (idempotent).
"""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .devices import PUBLIC_KEY_BYTES, device_id_of

__all__ = ["DEFAULT_DEVICES_TOPIC", "enrolment_record"]

DEFAULT_DEVICES_TOPIC = "devices"


def enrolment_record(public_key: bytes) -> tuple[bytes, bytes]:
    """(Kafka key, value) enrolling the raw Ed25519 ``public_key``; ValueError if it is not one."""
    if not isinstance(public_key, bytes | bytearray) or len(public_key) != PUBLIC_KEY_BYTES:
        raise ValueError(f"a public key is {PUBLIC_KEY_BYTES} raw bytes")
    raw = bytes(public_key)
    try:
        Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        raise ValueError("not a valid Ed25519 public key") from None
    return device_id_of(raw).encode("ascii"), raw
