"""Canonical, injective byte encodings of the fields that are signed or bound as associated data.

Every variable-length field carries a 4-byte length and every optional field a presence byte, so two
different field tuples never encode to the same bytes (no ambiguity between ``("ab", "c")`` and
``("a", "bc")``, nor between a null crowd and an empty one). Each use starts with its own domain tag.
"""

from __future__ import annotations

import struct

_U32 = struct.Struct(">I")
#: What the shuffler signs for a keys document (``GET /v1/keys``): this tag, then the payload's UTF-8 bytes.
KEYS_DOCUMENT_TAG = b"esa-keys-v1\n"
_I64 = struct.Struct(">q")


def blob(data: bytes) -> bytes:
    """Length-prefixed bytes."""
    return _U32.pack(len(data)) + bytes(data)


def text(value: str) -> bytes:
    """Length-prefixed UTF-8 text."""
    return blob(value.encode("utf-8"))


def optional_text(value: str | None) -> bytes:
    """Presence byte, then the text if present."""
    return b"\x00" if value is None else b"\x01" + text(value)


def i64(value: int) -> bytes:
    """Big-endian signed 64-bit integer (raises on out-of-range or non-int values)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an int, got {type(value).__name__}")
    return _I64.pack(value)


def optional_i64(value: int | None) -> bytes:
    return b"\x00" if value is None else b"\x01" + i64(value)


def tagged(tag: bytes, *parts: bytes) -> bytes:
    """A domain tag (itself length-prefixed) followed by already-canonical parts."""
    return blob(tag) + b"".join(parts)
