"""Sealed payload plaintexts of a whole batch at once: the bytes of ``records.encode_payload``, per field over all rows.

Why: the edge encoder pads thousands of payloads per batch and the analyzer decodes thousands per release
batch; fastavro takes ~6-14 microseconds per payload each way, this codec 0.05-0.4 (1-3 for the 14 integers
of a multi-message Hadamard payload; ``benchmarks/payload_codec.py``).

Encoding is byte-identical to ``encode_payload`` (2-byte big-endian length, schemaless Avro of the payload
union of ``schemas/Report.avsc``, zeros up to ``payload_pad_length``): the union branch index, zigzag varints,
bytes (length varint, then the bytes), arrays in one block (count varint, items, then 0; empty: just 0) and
little-endian doubles, written field after field at a per-row cursor (one numpy call per field and varint byte).

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

from schemas import load_schema, zigzag_varint
from transforms.mechanisms.base import Mechanism, channel_count, is_single_message
from transforms.wire.avro_payload import encode_payload, payload_pad_length
from transforms.wire.rows import CHANNEL, PAYLOAD_RECORDS, PRESENCE, array_to_rows, bit_length, wire_dtype

__all__ = ["decode_canonical", "encode_payloads", "is_vectorized"]

_SHIFTS = np.arange(0, 70, 7, dtype=np.uint64)  # the 7-bit groups of a 64-bit varint (at most 10 bytes)


class _Segment(NamedTuple):
    """One piece of a payload's layout: constant bytes, or a wire field's values in one Avro encoding."""

    op: str  # "const" | "varints" (zigzag longs) | "raw" (uint8 bytes) | "doubles"
    field: str | None = None
    count: int = 0  # values of the field per row
    const: bytes = b""


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
    out: list[_Segment] = [_Segment("const", const=zigzag_varint(branches.index(name)))]
    for field in record["fields"]:
        avro, fname = field["type"], field["name"]
        if fname == "length":  # payload_to_avro writes the mechanism's bit length, whatever the row holds
            out.append(_Segment("const", const=zigzag_varint(bit_length(mechanism))))
            continue
        if fname not in (dtype.names or ()) or fname == CHANNEL:
            return None
        sub = dtype.fields[fname][0]
        count = int(np.prod(sub.shape)) if sub.shape else 1
        integer = sub.base.kind == "i" or (sub.base.kind == "u" and sub.base.itemsize <= 4)
        if avro in ("long", "int") and not sub.shape and integer:
            out.append(_Segment("varints", fname, 1))
        elif avro == "bytes" and sub.shape and sub.base == np.uint8:
            out += [_Segment("const", const=zigzag_varint(count)), _Segment("raw", fname, count)]
        elif isinstance(avro, dict) and avro.get("type") == "array" and sub.shape:
            items = avro.get("items")
            if not ((items == "long" and integer) or (items == "double" and sub.base.kind == "f")):
                return None
            if count:
                out.append(_Segment("const", const=zigzag_varint(count)))
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


def _zigzag(values: np.ndarray) -> np.ndarray:
    v = values.astype(np.int64, copy=False)
    return ((v << 1) ^ (v >> 63)).view(np.uint64)


def _varint_lengths(u: np.ndarray) -> np.ndarray:
    """Bytes of the varint of each uint64 (1 to 10)."""
    length = np.ones(u.shape, dtype=np.int64)
    for j in range(1, 10):
        more = (u >> _SHIFTS[j]) != 0
        if not more.any():
            break
        length += more
    return length


class _TooLongError(Exception):
    """A row encodes past the mechanism's pad length (only for rows outside its domain): ``encode_payload``
    words the error."""


def _encode_layout(layout: Sequence[_Segment], rows: np.ndarray, width: int) -> np.ndarray:
    """(n, width) plaintexts of rows that all take this layout, written field after field at each row's cursor."""
    n = len(rows)
    out = np.zeros((n, width), dtype=np.uint8)
    flat, base = out.reshape(-1), np.arange(n) * width
    pos: int | np.ndarray = 2  # an int while every row's cursor is at the same byte
    for seg in layout:
        if seg.op == "varints":
            u = _zigzag(rows[seg.field].reshape(n, seg.count))
            length = _varint_lengths(u)
            size = length.sum(axis=1)
            if n and int((pos + size).max()) > width:
                raise _TooLongError
            at = (base + pos)[:, None] + np.cumsum(length, axis=1) - length  # each varint's first byte
            for j in range(int(length.max()) if n else 0):
                byte = ((u >> _SHIFTS[j]) & np.uint64(0x7F)).astype(np.uint8) | ((length - 1 > j) << 7).astype(np.uint8)
                if j == 0:
                    flat[at] = byte
                else:
                    used = length > j
                    flat[at[used] + j] = byte[used]
            pos = pos + size
            continue
        if seg.op == "const":
            data = np.frombuffer(seg.const, dtype=np.uint8)
        elif seg.op == "raw":
            data = rows[seg.field].reshape(n, seg.count)
        else:
            data = np.ascontiguousarray(rows[seg.field].reshape(n, seg.count), dtype="<f8").view(np.uint8)
        span = data.shape[-1]
        if isinstance(pos, int):
            out[:, pos:pos + span] = data
        else:
            if n and int(pos.max()) + span > width:
                raise _TooLongError
            flat[(base + pos)[:, None] + np.arange(span)] = data
        pos = pos + span
    size = np.broadcast_to(np.asarray(pos) - 2, (n,))
    if n and int(size.max()) > width - 2:
        raise _TooLongError
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
            if all(seg.op == "const" for seg in layouts[1]):  # a MarkPayload: the same bytes in every marker row
                out = _encode_layout(layouts[0], rows, width)
                out[marker] = _encode_layout(layouts[1], rows[:1], width)[0]
                return out
            out = np.empty((len(rows), width), dtype=np.uint8)
            out[marker] = _encode_layout(layouts[1], rows[marker], width)
            out[~marker] = _encode_layout(layouts[0], rows[~marker], width)
            return out
        except _TooLongError:
            pass  # the per-row encoder raises its own error
    encoded = [encode_payload(mechanism, row) for row in array_to_rows(rows)]
    return np.frombuffer(b"".join(encoded), dtype=np.uint8).reshape(len(rows), width).copy()


def _gather(flat: np.ndarray, start: np.ndarray, count: int) -> np.ndarray:
    """(m, count) bytes from each row's cursor (``flat`` is padded: bytes past a row are garbage, caught later)."""
    return flat[start[:, None] + np.arange(count)]


class _Ends:
    """Where the varints of each row can end: its bytes below 0x80, listed once per matrix, row after row.

    Only the columns up to the longest length prefix are scanned: a canonical row's varints end before its own.
    """

    def __init__(self, matrix: np.ndarray):
        width = matrix.shape[1]
        used = min(width, 2 + int(((matrix[:, 0].astype(np.int64) << 8) | matrix[:, 1]).max()))
        term = matrix[:, :used] < 0x80
        self.width, self.used = width, used
        self.before = np.cumsum(term, axis=1, dtype=np.int32) - term  # per column: terminators left of it
        totals = self.before[:, -1] + term[:, -1]
        self.first = np.concatenate([[0], np.cumsum(totals)[:-1]])  # the row's first terminator in ``flat``
        self.last = self.first + totals  # one past the row's last
        self.flat = np.flatnonzero(term)

    def columns(self, rows: np.ndarray, pos: np.ndarray, count: int) -> np.ndarray:
        """(m, count) columns of the next ``count`` terminators from ``pos`` on (the last column if none)."""
        index = (self.first + self.before[rows, np.minimum(pos, self.used - 1)])[:, None] + np.arange(count)
        if not len(self.flat):
            return np.full(index.shape, self.width - 1)
        found = self.flat[np.minimum(index, len(self.flat) - 1)] - (rows * self.used)[:, None]
        return np.where(index < self.last[:, None], found, self.width - 1)


def _read_varints(flat: np.ndarray, ends: _Ends, pos: np.ndarray, count: int, width: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(values (m, count), cursor after them) of ``count`` consecutive varints from ``pos`` on."""
    rows = np.arange(len(pos))
    stop = ends.columns(rows, pos, count)
    begin = np.concatenate([pos[:, None], stop[:, :-1] + 1], axis=1)
    length = np.clip(stop - begin + 1, 1, 10)  # garbage where not canonical: re-encoding disagrees
    at = (rows * width)[:, None] + begin
    u = (flat[at] & 0x7F).astype(np.uint64)
    for j in range(1, int(length.max()) if length.size else 0):
        u |= np.where(length > j, (flat[at + j] & 0x7F).astype(np.uint64) << _SHIFTS[j], np.uint64(0))
    values = ((u >> np.uint64(1)) ^ (np.uint64(0) - (u & np.uint64(1)))).view(np.int64)
    return values, stop[:, -1] + 1


def _read_layout(layout: Sequence[_Segment], matrix: np.ndarray, flat: np.ndarray, out: np.ndarray) -> None:
    """Read every field of ``layout`` from each row of ``matrix`` into ``out``, as if the row were canonical.

    ``flat`` holds the matrix's bytes and at least ``width + 16`` more, so a cursor past its row reads garbage
    (which re-encoding then refuses) rather than out of bounds."""
    m, width = matrix.shape
    start = np.arange(m) * width
    pos = np.full(m, 2, dtype=np.int64)
    ends = _Ends(matrix) if any(seg.op == "varints" for seg in layout) else None
    for seg in layout:
        pos = np.minimum(pos, width)
        if seg.op == "const":
            pos += len(seg.const)
        elif seg.op == "varints" and ends is not None:
            values, pos = _read_varints(flat, ends, pos, seg.count, width)
            out[seg.field] = values.reshape(out[seg.field].shape)
        elif seg.op == "raw":
            out[seg.field] = _gather(flat, start + pos, seg.count).reshape(out[seg.field].shape)
            pos += seg.count
        else:
            raw = np.ascontiguousarray(_gather(flat, start + pos, 8 * seg.count))
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
    chosen = plaintexts if len(index) == len(plaintexts) else [plaintexts[i] for i in index.tolist()]
    flat = np.frombuffer(b"".join([*chosen, bytes(width + 16)]), dtype=np.uint8)
    matrix = flat[:len(index) * width].reshape(-1, width)
    rows = np.zeros(len(index), dtype=dtype)
    if CHANNEL in dtype.names:
        rows[CHANNEL] = channel[index]
    if not len(index):
        return index, rows
    _read_layout(layouts[0], matrix, flat, rows)  # markers read as messages too, then made presence rows
    markers = np.flatnonzero(marker[index])
    if len(markers):
        rows[markers] = np.zeros(1, dtype=dtype)[0]
        rows[CHANNEL][markers] = PRESENCE
    try:
        encoded = encode_payloads(mechanism, rows)
    except ValueError:  # garbage too long to re-encode (cannot happen within the pad length): all per row
        return index[:0], rows[:0]
    if encoded.tobytes() == matrix.tobytes():  # an honest batch: one comparison
        return index, rows
    same = (encoded == matrix).all(axis=1)
    return index[same], rows[same]
