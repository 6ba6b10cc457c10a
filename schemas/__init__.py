"""Avro wire formats of esa-telemetry (docs/architecture.md §7) and the one place that reads and writes them.

Every Kafka message is an Avro *single-object encoding*: the 2-byte marker ``C3 01``, the 8-byte
CRC-64-AVRO fingerprint of the writer schema, then the schemaless binary datum. The fingerprint tells
a reader exactly which schema wrote the bytes, so a message from an unknown schema is refused rather
than mis-decoded; inside, every record also carries ``schema_version``, and versions this build does not
know are refused too, never guessed.

Schemas are parsed once per process (``load_schema`` is cached).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form
from fastavro.validation import ValidationError, validate

#: Record layout version written by this build, and the versions it can read.
SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})

SCHEMA_NAMES = ("TelemetryEvent", "Report", "Estimate", "DeadLetter", "MessageSet", "ReleaseBatch")
_MAGIC = b"\xc3\x01"
_HEADER_LEN = len(_MAGIC) + 8


class WireFormatError(ValueError):
    """A message that cannot be read as the expected record; ``reason`` is what a dead letter carries."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class LoadedSchema:
    """A parsed schema with its fingerprint (the single-object header)."""

    name: str
    parsed: Any
    fingerprint: bytes

    @property
    def header(self) -> bytes:
        return _MAGIC + self.fingerprint


@cache
def load_schema(name: str) -> LoadedSchema:
    """Parse ``schemas/<name>.avsc`` once and compute its CRC-64-AVRO fingerprint."""
    if name not in SCHEMA_NAMES:
        raise KeyError(f"unknown schema {name!r}; known: {', '.join(SCHEMA_NAMES)}")
    text = resources.files(__name__).joinpath(f"{name}.avsc").read_text(encoding="utf-8")
    parsed = fastavro.parse_schema(json.loads(text))
    digest = fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO")
    return LoadedSchema(name=name, parsed=parsed, fingerprint=bytes.fromhex(digest))


@cache
def _by_fingerprint() -> dict[bytes, str]:
    return {load_schema(name).fingerprint: name for name in SCHEMA_NAMES}


def encode_record(name: str, record: dict[str, Any], *, check: bool = True) -> bytes:
    """Serialise ``record`` as a single-object Avro message of schema ``name``.

    ``check`` validates the record against the schema first, so a producer bug surfaces as a clear
    error naming the field instead of as an undecodable message downstream.
    """
    schema = load_schema(name)
    if check:
        try:
            validate(record, schema.parsed, raise_errors=True)
        except ValidationError as err:
            raise ValueError(f"record does not match schema {name}: {err}") from None
    buf = io.BytesIO()
    buf.write(schema.header)
    fastavro.schemaless_writer(buf, schema.parsed, record)
    return buf.getvalue()


def decode_record(expected: str, message: bytes | None) -> dict[str, Any]:
    """Read a single-object message that must be of schema ``expected`` and of a known version.

    Raises ``WireFormatError`` with a short reason for anything else: not Avro, another schema, an
    unknown writer schema, trailing or truncated bytes, or an unknown ``schema_version``.
    """
    if message is None or len(message) < _HEADER_LEN or message[:2] != _MAGIC:
        raise WireFormatError("not an Avro single-object message (missing C3 01 header)")
    writer = _by_fingerprint().get(bytes(message[2:_HEADER_LEN]))
    if writer is None:
        raise WireFormatError("unknown writer schema fingerprint " + message[2:_HEADER_LEN].hex())
    if writer != expected:
        raise WireFormatError(f"expected a {expected} record, got a {writer} record")
    buf = io.BytesIO(message)
    buf.seek(_HEADER_LEN)
    try:
        record = fastavro.schemaless_reader(buf, load_schema(expected).parsed, None, return_record_name=True)
    except Exception as err:  # fastavro raises EOFError, ValueError, IndexError... on garbage
        raise WireFormatError(f"corrupt {expected} datum: {type(err).__name__}: {err}") from None
    if buf.tell() != len(message):
        raise WireFormatError(f"{len(message) - buf.tell()} trailing bytes after the {expected} datum")
    version = record.get("schema_version")
    if version not in SUPPORTED_VERSIONS:
        raise WireFormatError(f"unknown {expected} schema_version {version} (supported: {sorted(SUPPORTED_VERSIONS)})")
    return record


def avro_file_schema(name: str) -> Any:
    """The parsed schema for Avro container files (e.g. ``beam.io.WriteToAvro``)."""
    return load_schema(name).parsed


def zigzag_varint(value: int) -> bytes:
    """Avro's encoding of an int or long: zig-zag, then 7 bits a byte, low bits first (for hand-written
    layouts that must match fastavro byte for byte: ``transforms.wire.payload_codec``,
    ``transforms.trust.message_set_writer``)."""
    u = (value << 1) ^ (value >> 63)
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)
