"""Release batches: what the shuffler publishes to the analyzer, many sealed messages per Kafka message.

A release is the shuffled output of one crowd (spec, crowd id, window end); it is cut into batches of
bounded encoded size, each signed by the shuffler's current key. The signature covers the routing fields,
the release counts and a SHA-256 digest of the batch's messages in order, so the analyzer can tell a
genuine release from one injected or reordered by anyone between the shuffler and itself.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from schemas import SCHEMA_VERSION, WireFormatError, decode_record, encode_record

from .canonical import i64, optional_i64, optional_text, tagged, text
from .message_set import (
    MAX_ID_CHARS,
    SIGNATURE_BYTES,
    AuthError,
    SealedMessage,
    check_messages,
    check_text,
    check_time,
    messages_bytes,
)

__all__ = [
    "ReleaseBatch",
    "decode_release_batch",
    "encode_release_batch",
    "release_id_of",
    "release_signing_bytes",
    "sign_release_batch",
    "split_into_batches",
    "verify_release_batch",
]

RELEASE_ID_TAG = b"esa-release-v1"
RELEASE_BATCH_TAG = b"esa-release-batch-v1"
#: Upper bound of everything but the messages in an encoded batch (ids at their maximum length).
BATCH_HEADER_BYTES = 10 + 3 * (MAX_ID_CHARS * 4 + 5) + 40 + 8 * 10 + SIGNATURE_BYTES + 4
MAX_BATCH_BYTES = 64 * 1024 * 1024
_HEX32 = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class ReleaseBatch:
    """One batch of a crowd's release; counts (n_sets, n_messages, deleted) are of the whole release."""

    release_id: str
    spec_id: str
    crowd_id: str | None
    window_end_ms: int
    batch_index: int
    batch_count: int
    n_sets: int
    n_messages: int
    deleted: int | None
    messages: tuple[SealedMessage, ...]
    key_id: str = ""
    signature: bytes = b""


def release_id_of(spec_id: str, crowd_id: str | None, window_end_ms: int) -> str:
    """Deterministic release id of a crowd: 32 hex digits of a domain-separated SHA-256."""
    data = tagged(RELEASE_ID_TAG, text(spec_id), optional_text(crowd_id), i64(window_end_ms))
    return hashlib.sha256(data).hexdigest()[:32]


def release_signing_bytes(batch: ReleaseBatch) -> bytes:
    """What the shuffler signs: every field but the signature, messages as a digest of their ordered list."""
    return signing_bytes_of(batch, len(batch.messages), hashlib.sha256(messages_bytes(batch.messages)).digest())


def signing_bytes_of(batch: ReleaseBatch, count: int, digest: bytes) -> bytes:
    """``release_signing_bytes`` of ``batch`` holding ``count`` messages whose ``messages_bytes`` hash to
    ``digest`` (``batch.messages`` is not read: ``transforms.trust.release_packed`` keeps them in arrays)."""
    return tagged(RELEASE_BATCH_TAG, text(batch.key_id), text(batch.release_id), text(batch.spec_id),
                  optional_text(batch.crowd_id), i64(batch.window_end_ms), i64(batch.batch_index),
                  i64(batch.batch_count), i64(batch.n_sets), i64(batch.n_messages), optional_i64(batch.deleted),
                  i64(count), digest)


def sign_release_batch(batch: ReleaseBatch, key_id: str, signer: Ed25519PrivateKey) -> ReleaseBatch:
    """``batch`` stamped with the shuffler key id and signed (the key id is covered by the signature)."""
    stamped = replace(batch, key_id=key_id)
    return replace(stamped, signature=signer.sign(release_signing_bytes(stamped)))


def verify_release_batch(batch: ReleaseBatch, verifiers: Mapping[str, Ed25519PublicKey]) -> None:
    """Raise AuthError unless ``batch`` is signed by the shuffler key its key id names (and nothing else)."""
    try:
        verifier = verifiers.get(batch.key_id)
    except Exception:
        verifier = None
    if verifier is None:
        raise AuthError("unknown shuffler key id")
    try:
        verifier.verify(bytes(batch.signature), release_signing_bytes(batch))
    except Exception:  # InvalidSignature, or fields of the wrong type or range
        raise AuthError("bad shuffler signature") from None


def _check(batch: ReleaseBatch) -> tuple[SealedMessage, ...]:
    if not isinstance(batch.release_id, str) or not _HEX32.fullmatch(batch.release_id):
        raise WireFormatError("release_id must be 32 lowercase hex digits")
    check_text("spec_id", batch.spec_id)
    if batch.crowd_id is not None:
        check_text("crowd_id", batch.crowd_id, min_chars=0)
    check_time("window_end", batch.window_end_ms)
    if batch.release_id != release_id_of(batch.spec_id, batch.crowd_id, batch.window_end_ms):
        raise WireFormatError("release_id does not match spec, crowd and window")
    if not 0 <= batch.batch_index < batch.batch_count:
        raise WireFormatError(f"batch_index {batch.batch_index} outside [0, batch_count {batch.batch_count})")
    if batch.n_sets < 0 or batch.n_messages < 0 or (batch.deleted is not None and batch.deleted < 0):
        raise WireFormatError("negative count")
    if batch.n_messages < len(batch.messages):
        raise WireFormatError(f"batch holds {len(batch.messages)} messages, release declares {batch.n_messages}")
    check_text("key_id", batch.key_id)
    if not isinstance(batch.signature, bytes) or len(batch.signature) != SIGNATURE_BYTES:
        raise WireFormatError(f"signature must be {SIGNATURE_BYTES} bytes")
    return check_messages(batch.messages, 0, None)


def encode_release_batch(batch: ReleaseBatch) -> bytes:
    """Single-object Avro ``ReleaseBatch``; refuses (WireFormatError) what a reader would refuse."""
    messages = _check(batch)
    record = {"schema_version": SCHEMA_VERSION, "release_id": batch.release_id, "spec_id": batch.spec_id,
              "crowd_id": batch.crowd_id, "window_end": batch.window_end_ms, "batch_index": batch.batch_index,
              "batch_count": batch.batch_count, "n_sets": batch.n_sets, "n_messages": batch.n_messages,
              "deleted": batch.deleted, "messages": [{"channel": m.channel, "sealed": m.sealed} for m in messages],
              "key_id": batch.key_id, "signature": batch.signature}
    return encode_record("ReleaseBatch", record, check=False)


def decode_release_batch(data: bytes) -> ReleaseBatch:
    """Read and range-check a ``ReleaseBatch``; any malformed input raises WireFormatError, nothing else."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireFormatError(f"not bytes ({type(data).__name__})")
    if len(data) > MAX_BATCH_BYTES:
        raise WireFormatError(f"release batch of {len(data)} bytes exceeds {MAX_BATCH_BYTES}")
    r = decode_record("ReleaseBatch", bytes(data))
    batch = ReleaseBatch(release_id=r["release_id"], spec_id=r["spec_id"], crowd_id=r["crowd_id"],
                         window_end_ms=r["window_end"], batch_index=r["batch_index"], batch_count=r["batch_count"],
                         n_sets=r["n_sets"], n_messages=r["n_messages"], deleted=r["deleted"],
                         messages=tuple(r["messages"]), key_id=r["key_id"], signature=r["signature"])
    return replace(batch, messages=_check(batch))


def _varint_bytes(value: int) -> int:
    """Length of Avro's zig-zag varint encoding of an int or long (channels may be -1: the presence marker)."""
    zz = (value << 1) ^ (value >> 63)
    n = 1
    while zz >= 0x80:
        zz >>= 7
        n += 1
    return n


def encoded_size(message: SealedMessage) -> int:
    """Exact bytes one message adds to an encoded batch's message array."""
    return _varint_bytes(message.channel) + _varint_bytes(len(message.sealed)) + len(message.sealed)


def split_into_batches(messages: Sequence[SealedMessage], max_bytes: int = 512 * 1024
                       ) -> list[tuple[SealedMessage, ...]]:
    """Cut ``messages`` (in order) into batches whose encoding stays within ``max_bytes``.

    Every batch holds at least one message (a message larger than the budget travels alone), and no
    messages give one empty batch, so an empty release is still announced.
    """
    budget = max_bytes - BATCH_HEADER_BYTES
    if budget < 1024:
        raise ValueError(f"max_bytes must be at least {BATCH_HEADER_BYTES + 1024}, got {max_bytes}")
    batches: list[tuple[SealedMessage, ...]] = []
    current: list[SealedMessage] = []
    used = 0
    for m in messages:
        size = encoded_size(m)
        if current and used + size > budget:
            batches.append(tuple(current))
            current, used = [], 0
        current.append(m)
        used += size
    if current or not batches:
        batches.append(tuple(current))
    return batches
