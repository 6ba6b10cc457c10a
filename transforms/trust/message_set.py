"""Message sets: what a device sends the shuffler for one event, signed with the device's enrolled key.

The signature covers every field (routing, device id, time, nonce, analyzer key id and every sealed
message with its channel), so the shuffler can authenticate the sender, refuse forgeries and floods, and
dedupe, while the sealed payloads stay opaque to it. Verification errors never name the device: dead
letters and logs leave the shuffler's trust domain.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, replace
from typing import Any

from schemas import WireFormatError, decode_record

from .canonical import blob, i64, optional_text, tagged, text
from .devices import DeviceRegistry
from .ed25519 import Signer, verify_detached
from .message_set_reader import read_message_set
from .message_set_writer import write_message_set

__all__ = [
    "MAX_MESSAGES",
    "MAX_SEALED_BYTES",
    "AuthError",
    "MessageSet",
    "SealedMessage",
    "decode_message_set",
    "decode_signed_set",
    "encode_message_set",
    "sign_message_set",
    "signature_inputs",
    "signed_inputs",
    "signed_parts",
    "signing_bytes",
    "verify_message_set",
]

MESSAGE_SET_TAG = b"esa-messageset-v1"
MAX_MESSAGES = 4096
MAX_SEALED_BYTES = 4096
MAX_ID_CHARS = 200
NONCE_BYTES = 16
SIGNATURE_BYTES = 64
MAX_TIME_MS = 2**53
MAX_CHANNEL = 2**31 - 1
MIN_CHANNEL = -1  # the presence marker of multi-message mechanisms (transforms.wire.rows.PRESENCE)
#: Largest well-formed encoding (every message at its maximum size, plus the header fields).
MAX_ENCODED_BYTES = MAX_MESSAGES * (MAX_SEALED_BYTES + 8) + 4 * MAX_ID_CHARS * 4 + 256
_DEVICE_ID = re.compile(r"[0-9a-f]{32}")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_I64_U32 = struct.Struct(">qI")  # a 64-bit value, then the 4-byte length of the blob that follows it
_TAG_BLOB = blob(MESSAGE_SET_TAG)


class AuthError(ValueError):
    """A set or batch whose sender cannot be authenticated; the reason never identifies a client."""


@dataclass(frozen=True)
class SealedMessage:
    """One message of a set: its (public) channel and its payload sealed to the analyzer."""

    channel: int
    sealed: bytes


@dataclass(frozen=True)
class MessageSet:
    """Every message a device sends for one event, with the device's signature over all of it."""

    spec_id: str
    crowd_id: str | None
    device_id: str
    event_time_ms: int
    nonce: bytes
    key_id: str
    messages: tuple[SealedMessage, ...]
    signature: bytes = b""


def messages_bytes(messages: tuple[SealedMessage, ...]) -> bytes:
    """Canonical encoding of an ordered message list (count, then channel and blob of each)."""
    parts = [_I64.pack(len(messages))]
    append = parts.append
    for m in messages:
        channel, sealed = m.channel, m.sealed
        if type(channel) is int and type(sealed) is bytes:  # exact types: i64 refuses bool
            append(_I64_U32.pack(channel, len(sealed)))
            append(sealed)
        else:  # anything else goes through the checked encoders (which raise on what cannot be signed)
            append(i64(channel) + blob(sealed))
    return b"".join(parts)


def signing_bytes(ms: MessageSet) -> bytes:
    """What the device signs: every field but the signature, canonical and domain-separated.

    The layout is ``tagged(tag, text(spec), optional_text(crowd), text(device), i64(time), blob(nonce),
    text(key_id), messages_bytes(messages))``; built with one join, not one bytes object per field (this runs
    for every set the shuffler admits), and through those checked encoders when a field is not of its plain type.
    """
    spec_id, crowd_id, device_id, event_time, nonce, key_id = (
        ms.spec_id, ms.crowd_id, ms.device_id, ms.event_time_ms, ms.nonce, ms.key_id)
    if not (type(spec_id) is str and type(device_id) is str and type(key_id) is str
            and type(event_time) is int and type(nonce) is bytes
            and (crowd_id is None or type(crowd_id) is str)):
        return tagged(MESSAGE_SET_TAG, text(spec_id), optional_text(crowd_id), text(device_id), i64(event_time),
                      blob(nonce), text(key_id), messages_bytes(ms.messages))
    return _plain_signing_bytes(spec_id, crowd_id, device_id, event_time, nonce, key_id, messages_bytes(ms.messages))


def _plain_signing_bytes(spec_id: str, crowd_id: str | None, device_id: str, event_time: int, nonce: bytes,
                         key_id: str, *messages: bytes) -> bytes:
    """``signing_bytes`` of fields of their plain types, ``messages`` the parts of ``messages_bytes``."""
    spec, device, key = spec_id.encode("utf-8"), device_id.encode("utf-8"), key_id.encode("utf-8")
    if crowd_id is None:
        crowd = b"\x00"
    else:
        raw = crowd_id.encode("utf-8")
        crowd = b"\x01" + _U32.pack(len(raw)) + raw
    return b"".join((_TAG_BLOB, _U32.pack(len(spec)), spec, crowd, _U32.pack(len(device)), device,
                     _I64_U32.pack(event_time, len(nonce)), nonce, _U32.pack(len(key)), key, *messages))


def sign_message_set(ms: MessageSet, signer: Signer) -> MessageSet:
    """``ms`` with the device's signature filled in."""
    return replace(ms, signature=signer.sign(signing_bytes(ms)))


def signature_inputs(ms: MessageSet, registry: DeviceRegistry) -> tuple[bytes, bytes, bytes]:
    """(enrolled public key, signature, signed bytes) of ``ms``, for ``verify_detached``; AuthError if its device
    is not enrolled or its fields cannot have been signed. Split from the verification itself so a caller can
    run the GIL-free part on a thread pool and everything else on one thread (``transforms.shuffler.ingress``)."""
    try:
        public = registry.public_key(ms.device_id)
    except Exception:  # an unhashable or odd device id from a malformed object
        raise AuthError("unknown device (not enrolled)") from None
    if public is None:
        raise AuthError("unknown device (not enrolled)")
    return signed_inputs(ms, public)


def signed_inputs(ms: MessageSet, public: bytes) -> tuple[bytes, bytes, bytes]:
    """``signature_inputs`` with the device's key already looked up (a batch looks its devices up at once)."""
    return (public, *signed_parts(ms))


def signed_parts(ms: MessageSet) -> tuple[bytes, bytes]:
    """(signature, signed bytes) of ``ms``; AuthError if its fields cannot have been signed."""
    try:
        return bytes(ms.signature), signing_bytes(ms)
    except Exception:  # fields of the wrong type or range cannot have been signed
        raise AuthError("bad signature (malformed message set)") from None


def verify_message_set(ms: MessageSet, registry: DeviceRegistry) -> None:
    """Raise AuthError unless ``ms`` is signed by the enrolled key of its device id (and nothing else)."""
    if not verify_detached(*signature_inputs(ms, registry)):
        raise AuthError("bad signature")


def check_text(name: str, value: Any, min_chars: int = 1) -> None:
    if not isinstance(value, str) or not min_chars <= len(value) <= MAX_ID_CHARS:
        raise WireFormatError(f"{name} must be {min_chars}..{MAX_ID_CHARS} characters")


def check_time(name: str, value: Any) -> None:
    if not isinstance(value, int) or not 0 <= value < MAX_TIME_MS:
        raise WireFormatError(f"{name} out of range [0, 2^53)")


def check_messages(messages: Any, min_count: int, max_count: int | None) -> tuple[SealedMessage, ...]:
    """Range-check a message list (Avro dicts or SealedMessage) and return it as SealedMessages."""
    if max_count is not None and not min_count <= len(messages) <= max_count:
        raise WireFormatError(f"message count {len(messages)} outside [{min_count}, {max_count}]")
    out = []
    append = out.append
    for m in messages:
        as_dict = isinstance(m, dict)
        channel, sealed = (m["channel"], m["sealed"]) if as_dict else (m.channel, m.sealed)
        if not isinstance(channel, int) or not MIN_CHANNEL <= channel <= MAX_CHANNEL:
            raise WireFormatError("channel out of range [-1, 2^31)")
        if not isinstance(sealed, bytes) or not 1 <= len(sealed) <= MAX_SEALED_BYTES:
            raise WireFormatError(f"sealed message must be 1..{MAX_SEALED_BYTES} bytes")
        append(SealedMessage(channel, sealed) if as_dict or not isinstance(m, SealedMessage) else m)
    return tuple(out)


def _checked_messages(spec_id: Any, crowd_id: Any, device_id: Any, event_time_ms: Any, nonce: Any, key_id: Any,
                      signature: Any, messages: Any) -> tuple[SealedMessage, ...]:
    """Every field of a set checked, in this order (the first failure is the reason); the messages as
    SealedMessages. Takes the fields, not a MessageSet, so the decoder builds its MessageSet once."""
    check_text("spec_id", spec_id)
    if crowd_id is not None:
        check_text("crowd_id", crowd_id, min_chars=0)
    if not isinstance(device_id, str) or not _DEVICE_ID.fullmatch(device_id):
        raise WireFormatError("device_id must be 32 lowercase hex digits")
    check_time("event_time", event_time_ms)
    if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES:
        raise WireFormatError(f"nonce must be {NONCE_BYTES} bytes")
    check_text("key_id", key_id)
    if not isinstance(signature, bytes) or len(signature) != SIGNATURE_BYTES:
        raise WireFormatError(f"signature must be {SIGNATURE_BYTES} bytes")
    return check_messages(messages, 1, MAX_MESSAGES)


def _check(ms: MessageSet) -> tuple[SealedMessage, ...]:
    return _checked_messages(ms.spec_id, ms.crowd_id, ms.device_id, ms.event_time_ms, ms.nonce, ms.key_id,
                             ms.signature, ms.messages)


def encode_message_set(ms: MessageSet) -> bytes:
    """Single-object Avro ``MessageSet``; refuses (WireFormatError) what a reader would refuse."""
    messages = _check(ms)
    return write_message_set(ms.spec_id, ms.crowd_id, ms.device_id, ms.event_time_ms, ms.nonce, ms.key_id,
                             messages, ms.signature)


def decode_message_set(data: bytes) -> MessageSet:
    """Read and range-check a ``MessageSet``; any malformed input raises WireFormatError, nothing else."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireFormatError(f"not bytes ({type(data).__name__})")
    if len(data) > MAX_ENCODED_BYTES:
        raise WireFormatError(f"message set of {len(data)} bytes exceeds {MAX_ENCODED_BYTES}")
    raw = bytes(data)
    fields = read_message_set(raw, SealedMessage)  # None: a datum only fastavro may judge
    if fields is None:
        r = decode_record("MessageSet", raw)
        fields = (r["spec_id"], r["crowd_id"], r["device_id"], r["event_time"], r["nonce"], r["key_id"],
                  r["messages"], r["signature"])
    spec_id, crowd_id, device_id, event_time_ms, nonce, key_id, messages, signature = fields
    checked = _checked_messages(spec_id, crowd_id, device_id, event_time_ms, nonce, key_id, signature, messages)
    return MessageSet(spec_id, crowd_id, device_id, event_time_ms, nonce, key_id, checked, signature)


def _pair(channel: int, sealed: bytes) -> tuple[int, bytes]:
    return channel, sealed


def decode_signed_set(data: bytes) -> tuple[str, str | None, str, int, tuple[tuple[int, bytes], ...], bytes,
                                            bytes] | None:
    """The shuffler's fast path: ``(spec_id, crowd_id, device_id, event_time_ms, messages, signature, signed
    bytes)`` of a set that ``decode_message_set`` accepts, each message as a ``(channel, sealed)`` pair, the
    signed bytes equal to ``signing_bytes`` of that MessageSet; None for anything else (the caller then takes
    ``decode_message_set`` and ``signed_parts``, whose outcome and reasons stay the reference).

    Why: ingress decodes every set it reads, and building a ``MessageSet`` and a ``SealedMessage`` per message
    (frozen dataclasses) only to take them apart again for the signed bytes and the packed sets cost ~2 of the
    ~14 microseconds of Python per set on its main thread. Same checks, same bounds, same bytes."""
    if type(data) is not bytes or len(data) > MAX_ENCODED_BYTES:
        return None
    fields = read_message_set(data, _pair)
    if fields is None:
        return None
    spec_id, crowd_id, device_id, event_time, nonce, key_id, messages, signature = fields
    if (not 1 <= len(spec_id) <= MAX_ID_CHARS or (crowd_id is not None and len(crowd_id) > MAX_ID_CHARS)
            or not _DEVICE_ID.fullmatch(device_id) or not 0 <= event_time < MAX_TIME_MS
            or len(nonce) != NONCE_BYTES or not 1 <= len(key_id) <= MAX_ID_CHARS
            or len(signature) != SIGNATURE_BYTES or not 1 <= len(messages) <= MAX_MESSAGES):
        return None
    parts = [_I64.pack(len(messages))]
    append = parts.append
    for channel, sealed in messages:
        if not MIN_CHANNEL <= channel <= MAX_CHANNEL or not 1 <= len(sealed) <= MAX_SEALED_BYTES:
            return None
        append(_I64_U32.pack(channel, len(sealed)))
        append(sealed)
    signed = _plain_signing_bytes(spec_id, crowd_id, device_id, event_time, nonce, key_id, *parts)
    return spec_id, crowd_id, device_id, event_time, tuple(messages), signature, signed
