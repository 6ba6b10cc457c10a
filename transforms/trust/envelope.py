"""The outer layer of nested encryption: a device's whole signed message set sealed to the shuffler.

Why: the payloads inside a set are sealed to the analyzer, and the shuffler releases exactly those blobs.
Without an outer layer the reports topic holds them verbatim next to the device id, the exact event time
and a Kafka key naming the device, so anyone who reads both the reports topic and the shuffled topic (a
broker operator, a backup, an analyzer granted read on the reports topic) maps every released message back
to its device, and the shuffle protects nothing beyond local differential privacy. Sealing the encoded set
once more, to the shuffler's X25519 key, is the nested encryption of Prochlo ("Prochlo: Strong Privacy for
Analytics in the Crowd", Bittau, Erlingsson, Maniatis, Mironov, Raghunathan, Lie, Rudominer, Kode, Tinnes,
Seefeld, 2017): only the shuffler peels it, so the reports topic holds no byte string the analyzer receives
(and no device id, time or routing field in the clear either).

Same construction as ``sealing`` (fresh ephemeral X25519 per set, HKDF-SHA256, ChaCha20-Poly1305), with
its own domain tag as associated data, so an analyzer blob can never be passed off as an envelope or the
reverse. Key ids in the header let the shuffler's sealing key rotate: devices seal to the newest public
key, the shuffler keeps every private key it holds.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from .canonical import tagged
from .sealing import SealError, open_many, seal_many

__all__ = ["ENVELOPE_AD", "SealError", "open_envelope", "open_envelopes", "seal_envelope", "seal_envelopes"]

ENVELOPE_AD = tagged(b"esa-envelope-v1")


def seal_envelopes(public_key: X25519PublicKey, key_id: str, encoded_sets: Sequence[bytes],
                   ephemerals: Sequence[bytes] | None = None, threads: int = 1) -> list[bytes]:
    """Each encoded (signed) message set sealed to the shuffler key ``key_id``.

    ``ephemerals``: 32 bytes per set when a resend must be byte-identical (the edge encoder derives them from
    a keyed PRF of the event's position); None draws them from OS entropy. Never reuse one for two sets.
    """
    if ephemerals is None:
        ephemerals = [os.urandom(32) for _ in encoded_sets]
    return seal_many(public_key, key_id, encoded_sets, [ENVELOPE_AD] * len(encoded_sets), ephemerals, threads)


def seal_envelope(public_key: X25519PublicKey, key_id: str, encoded_set: bytes, ephemeral: bytes | None = None
                  ) -> bytes:
    """``seal_envelopes`` of one set."""
    return seal_envelopes(public_key, key_id, [encoded_set], None if ephemeral is None else [ephemeral])[0]


def open_envelopes(private_keys: Mapping[str, X25519PrivateKey], blobs: Sequence[bytes], threads: int = 1
                   ) -> list[bytes | SealError]:
    """The encoded message set inside each envelope, or the SealError saying why it does not open (a bare,
    unsealed set among them: its first byte is not the seal version, or it fails authentication)."""
    return open_many(private_keys, blobs, [ENVELOPE_AD] * len(blobs), threads)


def open_envelope(private_keys: Mapping[str, X25519PrivateKey], blob: bytes) -> bytes:
    """The encoded message set inside one envelope; SealError if it does not open."""
    result = open_envelopes(private_keys, [blob])[0]
    if isinstance(result, SealError):
        raise result
    return result
