"""A direct reader of the ``MessageSet`` Avro datum for the shuffler's hot path, with fastavro as its reference.

Why: the shuffler decodes every set it reads, and fastavro's generic reader (a file object read byte by byte,
a dict per record and per message, the caller's second pass over them) cost ~4.7 microseconds of the ~20 that
ingress spent on a set on its main thread. This reads the one layout of ``schemas/MessageSet.avsc`` with
slices of the buffer and returns the fields.

It only ever accepts what fastavro reads to the very same values: varints of at most 9 bytes (fastavro's
64-bit arithmetic agrees with Python's there, overlong encodings included), ids and the nonce of at most 63
bytes behind a one-byte length, sealed messages and the signature of at most 8191 bytes behind a one- or
two-byte length, every length within what is left, union index 0 or 1, positive array block counts, valid
UTF-8, no byte left over, a supported ``schema_version`` (below 64), the MessageSet header. On anything
else it returns None and the caller decodes with fastavro, whose result or error (a dead letter's reason)
stays the reference: the reader can make a set faster to read, never read differently.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from schemas import SUPPORTED_VERSIONS, load_schema

__all__ = ["read_message_set"]

_HEADER = load_schema("MessageSet").header
_START = len(_HEADER)
_MAX_VARINT_BYTES = 9  # 63 bits: beyond, fastavro's unsigned 64-bit shifts may disagree with Python's ints


class _ReferError(Exception):
    """Not provably read like fastavro: leave this datum to it."""


def _long(data: bytes, pos: int) -> tuple[int, int]:
    """A zig-zag varint at ``pos`` and the position after it (IndexError past the end)."""
    b = data[pos]
    n = b & 0x7F
    shift = 7
    while b & 0x80:
        pos += 1
        if shift >= 7 * _MAX_VARINT_BYTES:
            raise _ReferError
        b = data[pos]
        n |= (b & 0x7F) << shift
        shift += 7
    return (n >> 1) ^ -(n & 1), pos + 1


def _short(data: bytes, pos: int) -> tuple[bytes, int]:
    """Bytes at ``pos`` behind a one-byte length (0..63: ids, nonce), and the position after them."""
    size = data[pos]
    if size & 0x81:  # a longer or negative length: not this fast path
        raise _ReferError
    stop = pos + 1 + (size >> 1)
    if stop > len(data):
        raise _ReferError
    return data[pos + 1:stop], stop


def _blob(data: bytes, pos: int) -> tuple[bytes, int]:
    """Bytes at ``pos`` behind a one- or two-byte length (0..8191: sealed messages, the signature)."""
    size = data[pos]
    if size & 0x80:
        high = data[pos + 1]
        if high & 0x80:
            raise _ReferError
        size = (high << 7) | (size & 0x7F)
        pos += 1
    if size & 1:  # negative
        raise _ReferError
    stop = pos + 1 + (size >> 1)
    if stop > len(data):
        raise _ReferError
    return data[pos + 1:stop], stop


def read_message_set(data: bytes, message: Callable[[int, bytes], Any]) -> tuple[Any, ...] | None:
    """(spec_id, crowd_id, device_id, event_time, nonce, key_id, messages, signature) of a single-object
    ``MessageSet`` encoding, unchecked (ranges are the caller's), each message as ``message(channel, sealed)``;
    or None: read it with fastavro."""
    if data[:_START] != _HEADER:
        return None
    try:
        version = data[_START]  # a one-byte varint, as every version below 64
        if version & 0x80 or (version >> 1) ^ -(version & 1) not in SUPPORTED_VERSIONS:
            return None
        spec_id, pos = _short(data, _START + 1)
        union = data[pos]
        if union == 0:  # zig-zag 0: null
            crowd_id, pos = None, pos + 1
        elif union == 2:  # zig-zag 1: a string
            crowd, pos = _short(data, pos + 1)
            crowd_id = crowd.decode()
        else:
            return None
        device_id, pos = _short(data, pos)
        event_time, pos = _long(data, pos)
        nonce, pos = _short(data, pos)
        key_id, pos = _short(data, pos)
        messages: list[Any] = []
        append = messages.append
        count, pos = _long(data, pos)
        while count:
            if count < 0:  # a block with its size in bytes: legal Avro, never written by fastavro
                return None
            for _ in range(count):
                b = data[pos]
                if b < 0x80:  # a one-byte channel (-32..63): every mechanism's but the widest
                    channel, pos = (b >> 1) ^ -(b & 1), pos + 1
                else:
                    channel, pos = _long(data, pos)
                sealed, pos = _blob(data, pos)
                append(message(channel, sealed))
            count, pos = _long(data, pos)
        signature, pos = _blob(data, pos)
        if pos != len(data):
            return None
        return (spec_id.decode(), crowd_id, device_id.decode(), event_time, nonce, key_id.decode(), messages,
                signature)
    except (_ReferError, IndexError, UnicodeDecodeError):
        return None
