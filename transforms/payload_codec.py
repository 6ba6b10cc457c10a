"""Sealed payload plaintexts of a whole batch at once: the bytes of ``records.encode_payload``, per field over all rows.

Why: the edge encoder pads thousands of payloads per batch and the analyzer decodes thousands per release
batch; fastavro takes ~6-13 microseconds per payload each way, the vectorized codec well under one.

Encoding is byte-identical to ``encode_payload`` (2-byte big-endian length, schemaless Avro of the payload
union of ``schemas/Report.avsc``, zeros up to ``payload_pad_length``): the union branch index, zigzag varints,
bytes (length varint, then the bytes), arrays in one block (count varint, items, then 0; empty: just 0) and
little-endian doubles are laid out per field as fixed-width byte columns with a keep mask, then compacted.

Decoding (``decode_canonical``) reads every field of every candidate row the way a canonical encoding lays it
out, without any check, and then vouches only for the rows whose re-encoding reproduces their input bytes
exactly. Whatever an attacker sends (overlong varints, another union branch, trailing bytes, bad padding, a
wrong length prefix), an accepted row *is* the canonical encoding of its decoded values, which per-row
decoding maps to the same values; every other row is left to the per-row decoder and its reasons.

A mechanism whose wire dtype does not fit the schema types handled here falls back to the per-row functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any, NamedTuple

import numpy as np

from schemas import load_schema
from transforms.mechanisms.base import Mechanism, channel_count, is_single_message
from transforms.records import (
    CHANNEL,
    PAYLOAD_RECORDS,
    PRESENCE,
    array_to_rows,
    bit_length,
    encode_payload,
    payload_pad_length,
    wire_dtype,
)

__all__ = ["decode_canonical", "encode_payloads", "is_vectorized"]

_SHIFTS = np.arange(0, 70, 7, dtype=np.uint64)  # the 7-bit groups of a 64-bit varint (at most 10 bytes)
_J = np.arange(10)


class _Segment(NamedTuple):
    """One piece of a payload's layout: constant bytes, or a wire field's values in one Avro encoding."""

    op: str  # "const" | "varints" (zigzag longs) | "raw" (uint8 bytes) | "doubles"
    field: str | None = None
    count: int = 0  # values of the field per row
    const: bytes = b""


def _varint(value: int) -> bytes:
    """Zigzag varint of a small Python int (constants of a layout)."""
    u = (value << 1) ^ (value >> 63)
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


@cache
def _union() -> list[dict[str, Any]]:
    for field in load_schema("Report").parsed["fields"]:
        if field["name"] == "payload":
            return list(field["type"])
    raise KeyError("no payload field in schemas/Report.avsc")


def _layout(mechanism: Mechanism, kind: str) -> tuple[_Segment, ...] | None:
    """The segments of a ``kind`` payload of ``mechanism``'s wire rows, or None if a field is not handled here."""
    name = PAYLOAD_RECORDS[kind]
    branches = [b["name"] for b in _union()]
    record = _union()[branches.index(name)]
    dtype = wire_dtype(mechanism)
    out: list[_Segment] = [_Segment("const", const=_varint(branches.index(name)))]
    for field in record["fields"]:
        avro, fname = field["type"], field["name"]
        if fname == "length":  # payload_to_avro writes the mechanism's bit length, whatever the row holds
            out.append(_Segment("const", const=_varint(bit_length(mechanism))))
            continue
        if fname not in (dtype.names or ()) or fname == CHANNEL:
            return None
        sub = dtype.fields[fname][0]
        count = int(np.prod(sub.shape)) if sub.shape else 1
        integer = sub.base.kind == "i" or (sub.base.kind == "u" and sub.base.itemsize <= 4)
        if avro in ("long", "int") and not sub.shape and integer:
            out.append(_Segment("varints", fname, 1))
        elif avro == "bytes" and sub.shape and sub.base == np.uint8:
            out += [_Segment("const", const=_varint(count)), _Segment("raw", fname, count)]
        elif isinstance(avro, dict) and avro.get("type") == "array" and sub.shape:
            items = avro.get("items")
            if not ((items == "long" and integer) or (items == "double" and sub.base.kind == "f")):
                return None
            if count:
                out.append(_Segment("const", const=_varint(count)))
                out.append(_Segment("varints" if items == "long" else "doubles", fname, count))
            out.append(_Segment("const", const=b"\x00"))
        else:
            return None
    merged: list[_Segment] = []
    for seg in out:  # adjacent constants become one
        if merged and seg.op == "const" and merged[-1].op == "const":
            merged[-1] = _Segment("const", const=merged[-1].const + seg.const)
        else:
            merged.append(seg)
    return tuple(merged)


@cache
def _layouts(mechanism: Mechanism) -> tuple[tuple[_Segment, ...], tuple[_Segment, ...]] | None:
    """(message layout, presence-marker layout) of a mechanism, or None if it is not vectorized."""
    message = _layout(mechanism, mechanism.payload_kind)
    if message is None or (mechanism.payload_kind == "mark" and set(wire_dtype(mechanism).names) != {CHANNEL}):
        return None  # a MarkPayload row carries only its channel (``payload_from_avro``)
    return message, _layout(mechanism, "mark") or ()


def is_vectorized(mechanism: Mechanism) -> bool:
    """True if ``encode_payloads`` and ``decode_canonical`` handle the mechanism without the per-row functions."""
    return _layouts(mechanism) is not None


def _marker_mask(mechanism: Mechanism, rows: np.ndarray) -> np.ndarray:
    if is_single_message(mechanism) or CHANNEL not in (rows.dtype.names or ()):
        return np.zeros(len(rows), dtype=bool)
    return np.asarray(rows[CHANNEL] == PRESENCE)


def _varint_columns(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, keep) of int64 values (n, k) as zigzag varints: (n, 10k) columns, 10 per value, keep marks used."""
    v = values.astype(np.int64, copy=False)
    groups = ((v << 1) ^ (v >> 63)).view(np.uint64)[..., None] >> _SHIFTS  # (n, k, 10)
    length = np.maximum(np.count_nonzero(groups, axis=-1), 1)[..., None]
    data = (groups & np.uint64(0x7F)).astype(np.uint8) | ((length - 1 > _J).astype(np.uint8) << 7)
    shape = (len(values), 10 * values.shape[1])
    return data.reshape(shape), (length > _J).reshape(shape)


class _TooLongError(Exception):
    """A row encodes past the mechanism's pad length (only for rows outside its domain): ``encode_payload``
    words the error."""


def _encode_layout(layout: Sequence[_Segment], rows: np.ndarray, width: int) -> np.ndarray:
    """(n, width) plaintexts of rows that all take this layout."""
    n = len(rows)
    parts: list[np.ndarray] = []
    keeps: list[np.ndarray] = []
    for seg in layout:
        if seg.op == "const":
            data, keep = np.broadcast_to(np.frombuffer(seg.const, dtype=np.uint8), (n, len(seg.const))), None
        elif seg.op == "varints":
            data, keep = _varint_columns(rows[seg.field].reshape(n, seg.count))
        elif seg.op == "raw":
            data, keep = rows[seg.field].reshape(n, seg.count), None
        else:
            data = np.ascontiguousarray(rows[seg.field].reshape(n, seg.count), dtype="<f8").view(np.uint8)
            keep = None
        parts.append(data)
        keeps.append(np.ones(data.shape, dtype=bool) if keep is None else keep)
    data, keep = np.concatenate(parts, axis=1), np.concatenate(keeps, axis=1)
    size = keep.sum(axis=1)
    if n and int(size.max()) > width - 2:
        raise _TooLongError
    out = np.zeros((n, width), dtype=np.uint8)
    dest = np.arange(n)[:, None] * width + 1 + np.cumsum(keep, axis=1)  # row start + 2 + rank of the byte
    out.reshape(-1)[dest[keep]] = data[keep]
    out[:, 0], out[:, 1] = size >> 8, size & 0xFF
    return out


def encode_payloads(mechanism: Mechanism, rows: np.ndarray) -> np.ndarray:
    """(n, 2 + pad) uint8 plaintexts of wire rows (``wire_dtype``); row i is ``encode_payload(mechanism, row i)``."""
    dtype, width = wire_dtype(mechanism), 2 + payload_pad_length(mechanism)
    if rows.dtype != dtype:
        raise ValueError(f"rows have dtype {rows.dtype}, expected the wire dtype {dtype} of {mechanism.name}")
    layouts = _layouts(mechanism)
    if not len(rows):
        return np.zeros((0, width), dtype=np.uint8)
    if layouts is not None:
        try:
            marker = _marker_mask(mechanism, rows)
            if not marker.any():
                return _encode_layout(layouts[0], rows, width)
            out = np.empty((len(rows), width), dtype=np.uint8)
            out[marker] = _encode_layout(layouts[1], rows[marker], width)
            out[~marker] = _encode_layout(layouts[0], rows[~marker], width)
            return out
        except _TooLongError:
            pass  # the per-row encoder raises its own error
    encoded = [encode_payload(mechanism, row) for row in array_to_rows(rows)]
    return np.frombuffer(b"".join(encoded), dtype=np.uint8).reshape(len(rows), width).copy()


def _gather(flat: np.ndarray, start: np.ndarray, pos: np.ndarray, count: int, width: int) -> np.ndarray:
    """(m, count) bytes of each row from its cursor on (clipped to the row: garbage past it is caught later)."""
    return flat[start[:, None] + np.minimum(pos[:, None] + np.arange(count), width - 1)]


def _read_layout(layout: Sequence[_Segment], matrix: np.ndarray, out: np.ndarray) -> None:
    """Read every field of ``layout`` from each row of ``matrix`` into ``out``, as if the row were canonical."""
    m, width = matrix.shape
    flat, start = matrix.reshape(-1), np.arange(m) * width
    pos = np.full(m, 2, dtype=np.int64)
    for seg in layout:
        if seg.op == "const":
            pos += len(seg.const)
        elif seg.op == "varints":
            values = np.empty((m, seg.count), dtype=np.int64)
            for c in range(seg.count):
                raw = _gather(flat, start, pos, 10, width)
                length = np.argmin(raw >= 0x80, axis=1) + 1  # no terminator: 1 (re-encoding will disagree)
                groups = np.where(length[:, None] > _J, (raw & 0x7F).astype(np.uint64) << _SHIFTS, np.uint64(0))
                u = np.bitwise_or.reduce(groups, axis=1)
                values[:, c] = ((u >> np.uint64(1)) ^ (np.uint64(0) - (u & np.uint64(1)))).view(np.int64)
                pos += length
            out[seg.field] = values.reshape(out[seg.field].shape)
        elif seg.op == "raw":
            out[seg.field] = _gather(flat, start, pos, seg.count, width).reshape(out[seg.field].shape)
            pos += seg.count
        else:
            raw = np.ascontiguousarray(_gather(flat, start, pos, 8 * seg.count, width))
            out[seg.field] = raw.view("<f8").reshape(out[seg.field].shape)
            pos += 8 * seg.count


def _channels(channels: Sequence[int]) -> np.ndarray:
    """int64 channels; one beyond int64 becomes an impossible channel (the per-row decoder words its refusal)."""
    try:
        return np.asarray(channels, dtype=np.int64).reshape(-1)
    except (OverflowError, TypeError, ValueError):
        return np.fromiter((c if isinstance(c, int) and -2**63 <= c < 2**63 else -2 for c in channels),
                           dtype=np.int64, count=len(channels))


def decode_canonical(mechanism: Mechanism, plaintexts: Sequence[bytes], channels: Sequence[int]
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(indices, wire rows) of the plaintexts that are exactly the canonical encoding of a row on a valid channel.

    Structure only (like ``decode_payload(..., check_domain=False)``): the value domain is the caller's. Every
    other plaintext (malformed, or well-formed but not canonical) is left out, for the per-row decoder.
    """
    dtype = wire_dtype(mechanism)
    layouts = _layouts(mechanism)
    if len(plaintexts) != len(channels):
        raise ValueError(f"{len(plaintexts)} plaintexts but {len(channels)} channels")
    if layouts is None or not len(plaintexts):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=dtype)
    width = 2 + payload_pad_length(mechanism)
    channel = _channels(channels)
    sizes = np.fromiter(map(len, plaintexts), dtype=np.int64, count=len(plaintexts))
    marker = np.zeros(len(channel), dtype=bool) if is_single_message(mechanism) else channel == PRESENCE
    ok = (sizes == width) & (marker | ((channel >= 0) & (channel < channel_count(mechanism))))
    index = np.flatnonzero(ok)
    matrix = np.frombuffer(b"".join([plaintexts[i] for i in index.tolist()]), dtype=np.uint8).reshape(-1, width)
    rows = np.zeros(len(index), dtype=dtype)
    if CHANNEL in dtype.names:
        rows[CHANNEL] = channel[index]
    message = ~marker[index]
    if message.all():
        _read_layout(layouts[0], matrix, rows)
    elif message.any():
        part = rows[message]
        _read_layout(layouts[0], matrix[message], part)
        rows[message] = part
    same = (encode_payloads(mechanism, rows) == matrix).all(axis=1)
    return index[same], rows[same]
