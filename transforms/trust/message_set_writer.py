"""A direct writer of the ``MessageSet`` Avro datum, byte for byte what fastavro writes, for the encoders' hot path.

Why: the edge encoder (and a device) writes one set per event; going through fastavro meant a dict per set
and per message and its generic writer, ~8 microseconds of a set's Python time. The layout of
``schemas/MessageSet.avsc`` is fixed and small: the single-object header, zig-zag varints for the ints and
longs, length-prefixed UTF-8 strings and bytes, the crowd union as branch 0 (null) or 1 (a string), and the
message array as one block (count, items, then 0; an empty array is the 0 alone), as fastavro writes it.
``tests/trust/test_trust_message_set_writer.py`` holds it to fastavro's bytes over generated sets.

Fields are written unchecked: callers check them first (``message_set.encode_message_set``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from schemas import SCHEMA_VERSION, load_schema, zigzag_varint

__all__ = ["write_message_set"]

_HEADER = load_schema("MessageSet").header


_VERSION = zigzag_varint(SCHEMA_VERSION)
_SHORT = [bytes(((n << 1) & 0x7F,)) for n in range(64)]  # one-byte length prefixes (0..63), precomputed


def _length(n: int) -> bytes:
    return _SHORT[n] if n < 64 else zigzag_varint(n)


def write_message_set(spec_id: str, crowd_id: str | None, device_id: str, event_time_ms: int, nonce: bytes,
                      key_id: str, messages: Sequence[Any], signature: bytes) -> bytes:
    """The single-object Avro encoding of a set's (already checked) fields; messages with ``channel``, ``sealed``."""
    spec, device, key = spec_id.encode("utf-8"), device_id.encode("utf-8"), key_id.encode("utf-8")
    parts = [_HEADER, _VERSION, _length(len(spec)), spec]
    if crowd_id is None:
        parts.append(b"\x00")
    else:
        crowd = crowd_id.encode("utf-8")
        parts += (b"\x02", _length(len(crowd)), crowd)
    parts += (_length(len(device)), device, zigzag_varint(event_time_ms), _length(len(nonce)), nonce,
              _length(len(key)), key)
    if messages:
        parts.append(zigzag_varint(len(messages)))
        for m in messages:
            channel, sealed = m.channel, m.sealed
            parts += (_SHORT[channel] if 0 <= channel < 64 else zigzag_varint(channel), _length(len(sealed)), sealed)
    parts += (b"\x00", _length(len(signature)), signature)
    return b"".join(parts)
