"""Sealing report payloads to the analyzer, so the shuffler in between handles them blind.

An HPKE-style one-shot seal (base mode, in the spirit of RFC 9180 but not wire-compatible with it): a
fresh ephemeral X25519 key per message, key = HKDF-SHA256(shared secret, salt = eph_pub || recipient_pub,
info = b"esa-seal-v1"), then ChaCha20-Poly1305 under a zero nonce, which is safe because every key
encrypts exactly one message. A fresh ephemeral key per message means two messages of one device share
no bytes beyond the version and key id, so the sealed blobs cannot be linked to each other.

The routing fields that survive the shuffle (spec, crowd, window end, channel) are bound as associated
data: a shuffler that moves a blob to another crowd or channel makes it fail to open.

Blob layout: ``0x01 | u8 len(key_id) | key_id (ascii) | eph_pub (32) | ciphertext || tag (16)``.

The two X25519 scalar multiplications go through libsodium (PyNaCl) rather than OpenSSL: same curve, same
clamping, same bytes (tested against ``cryptography``), but libsodium releases the GIL while it computes,
so a worker's crypto threads (``transforms.runtime.parallel``) seal and open on every core, and its fixed-base
multiplication is faster. Keys stay ``cryptography`` objects everywhere else.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from nacl.bindings import crypto_scalarmult, crypto_scalarmult_base
from nacl.exceptions import CryptoError

from transforms.runtime.parallel import map_ordered

from .canonical import i64, optional_text, tagged, text

__all__ = ["SEAL_OVERHEAD", "SealError", "associated_data", "key_id_of", "open_many", "open_sealed", "seal",
           "seal_many"]

SEAL_TAG = b"esa-seal-v1"
SEAL_VERSION = 1
_KEY_BYTES = 32
_TAG_BYTES = 16
_NONCE = bytes(12)
#: Bytes a sealed blob adds to its plaintext, besides the key id.
SEAL_OVERHEAD = 2 + _KEY_BYTES + _TAG_BYTES


class SealError(ValueError):
    """A blob that cannot be opened; the message is a short reason fit for a dead letter."""


def associated_data(spec_id: str, crowd_id: str | None, window_end_ms: int, channel: int) -> bytes:
    """The routing fields that survive the shuffle, canonically encoded and domain-separated."""
    return tagged(SEAL_TAG, text(spec_id), optional_text(crowd_id), i64(window_end_ms), i64(channel))


def _derive(shared: bytes, eph_pub: bytes, recipient_pub: bytes) -> ChaCha20Poly1305:
    key = HKDF(hashes.SHA256(), 32, salt=eph_pub + recipient_pub, info=SEAL_TAG).derive(shared)
    return ChaCha20Poly1305(key)


def _header(key_id: str) -> bytes:
    try:
        raw = key_id.encode("ascii")
    except (UnicodeEncodeError, AttributeError):
        raise ValueError(f"key id must be ascii text, got {key_id!r}") from None
    if not 1 <= len(raw) <= 255:
        raise ValueError(f"key id must be 1..255 ascii characters, got {len(raw)}")
    return bytes((SEAL_VERSION, len(raw))) + raw


def seal(public_key: X25519PublicKey, key_id: str, plaintext: bytes, associated: bytes,
         ephemeral: bytes | None = None) -> bytes:
    """Seal ``plaintext`` to the analyzer key ``key_id``, bound to ``associated`` (see ``associated_data``).

    ``ephemeral``: 32 bytes of private key material when the output must be reproducible (the encoder
    derives it from a keyed PRF so a retried bundle is byte-identical); None draws it from OS entropy.
    Never reuse an ephemeral value for two different plaintexts.
    """
    if ephemeral is None:
        ephemeral = os.urandom(_KEY_BYTES)
    return seal_many(public_key, key_id, [plaintext], [associated], [ephemeral])[0]


def seal_many(public_key: X25519PublicKey, key_id: str, plaintexts: Sequence[bytes], associated: Sequence[bytes],
              ephemerals: Sequence[bytes], threads: int = 1) -> list[bytes]:
    """``seal`` of each plaintext with its associated data and ephemeral key material (32 bytes each, never
    reused), the same bytes one by one or batched; raises ValueError/TypeError on a bad argument.

    Only the two X25519 multiplications per message (~49 of its ~58 microseconds here) run on ``threads``
    (``transforms.runtime.parallel``), each message's pair in one call; the header, HKDF and AEAD stay on the calling
    thread (see ``open_many`` for why a pool running Python is slower than none).
    """
    header = _header(key_id)
    for ad in associated:
        if not isinstance(ad, bytes):
            raise TypeError(f"associated data must be bytes (see associated_data), got {type(ad).__name__}")
    for eph in ephemerals:
        if len(eph) != _KEY_BYTES:
            raise ValueError(f"ephemeral key material must be {_KEY_BYTES} bytes, got {len(eph)}")
    if not len(plaintexts) == len(associated) == len(ephemerals):
        raise ValueError("one associated data and one ephemeral per plaintext")
    recipient = public_key.public_bytes_raw()
    points = map_ordered(_ephemeral_points, [(bytes(e), recipient) for e in ephemerals], threads)
    out = []
    for plaintext, ad, point in zip(plaintexts, associated, points, strict=True):
        if point is None:  # only for a low-order recipient key, which no analyzer key is
            raise ValueError("invalid analyzer public key (low-order point)")
        eph_pub, shared = point
        out.append(header + eph_pub + _derive(shared, eph_pub, recipient).encrypt(_NONCE, bytes(plaintext), ad))
    return out


def _ephemeral_points(keys: tuple[bytes, bytes]) -> tuple[bytes, bytes] | None:
    """(ephemeral public key, shared secret with the recipient), or None for a low-order recipient. GIL-free."""
    eph, recipient = keys
    try:
        return crypto_scalarmult_base(eph), crypto_scalarmult(eph, recipient)
    except CryptoError:
        return None


def _parse(blob: bytes) -> tuple[str, bytes, bytes]:
    """``(key_id, eph_pub, ciphertext)`` of a blob, or SealError."""
    if not isinstance(blob, bytes | bytearray | memoryview):
        raise SealError(f"not bytes ({type(blob).__name__})")
    blob = bytes(blob)
    if len(blob) < 2:
        raise SealError("truncated")
    if blob[0] != SEAL_VERSION:
        raise SealError(f"unsupported version {blob[0]}")
    n = blob[1]
    if len(blob) < 2 + n + _KEY_BYTES + _TAG_BYTES:
        raise SealError("truncated")
    try:
        key_id = blob[2:2 + n].decode("ascii")
    except UnicodeDecodeError:
        raise SealError("malformed key id") from None
    return key_id, blob[2 + n:2 + n + _KEY_BYTES], blob[2 + n + _KEY_BYTES:]


def key_id_of(blob: bytes) -> str:
    """The analyzer key id a blob was sealed to (SealError if the header is malformed)."""
    return _parse(blob)[0]


def open_sealed(private_keys: Mapping[str, X25519PrivateKey], blob: bytes, associated: bytes) -> bytes:
    """Open a sealed blob with whichever of ``private_keys`` its key id names.

    Raises SealError, and nothing else, for any input bytes: unknown key id, truncated, malformed,
    authentication failed (tampered, or opened with other routing fields than it was sealed with).
    """
    result = open_many(private_keys, [blob], [associated])[0]
    if isinstance(result, SealError):
        raise result
    return result


def open_many(private_keys: Mapping[str, X25519PrivateKey], blobs: Sequence[bytes], associated: Sequence[bytes],
              threads: int = 1) -> list[bytes | SealError]:
    """``open_sealed`` on each blob with its associated data: the plaintext, or the SealError saying why not.

    Only the X25519 multiplications (31 of the 41 microseconds of an opening here) run on ``threads``
    (``transforms.runtime.parallel``); parsing, HKDF and the AEAD stay on the calling thread. Why: a thread coming
    back from libsodium waits for the GIL while another runs Python, so a pool that also ran the Python
    parts was slower than no pool at all (measured: 130 against 68 microseconds per message on 2 threads).
    """
    results: list[bytes | SealError | None] = [None] * len(blobs)
    raw_keys: dict[str, tuple[bytes, bytes]] = {}
    jobs: list[tuple[int, bytes, bytes, bytes, bytes]] = []  # index, private, recipient public, eph_pub, ct
    for i, (blob, ad) in enumerate(zip(blobs, associated, strict=True)):
        try:
            key_id, eph_pub, ciphertext = _parse(blob)
            if not isinstance(ad, bytes):
                raise SealError(f"associated data must be bytes, got {type(ad).__name__}")
            if key_id not in raw_keys:
                private = private_keys.get(key_id)
                if private is None:
                    raise SealError(f"unknown key id {key_id!r}")
                raw_keys[key_id] = (private.private_bytes_raw(), private.public_key().public_bytes_raw())
        except SealError as err:
            results[i] = err
            continue
        jobs.append((i, *raw_keys[key_id], eph_pub, ciphertext))
    shared = map_ordered(_shared_secret, [(job[1], job[3]) for job in jobs], threads)
    for (i, _, recipient, eph_pub, ciphertext), secret in zip(jobs, shared, strict=True):
        if secret is None:  # low-order ephemeral point: all-zero shared secret
            results[i] = SealError("invalid ephemeral key")
            continue
        try:
            results[i] = _derive(secret, eph_pub, recipient).decrypt(_NONCE, ciphertext, associated[i])
        except InvalidTag:
            results[i] = SealError("authentication failed (tampered or wrong routing fields)")
    return results  # type: ignore[return-value]  (every slot is filled above)


def _shared_secret(keys: tuple[bytes, bytes]) -> bytes | None:
    """X25519(private, peer public), or None for a low-order peer point. GIL-free in libsodium."""
    try:
        return crypto_scalarmult(*keys)
    except CryptoError:
        return None
