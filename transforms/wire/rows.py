"""Reports as numpy rows: a mechanism's wire dtype, payload rows and arrays, presence markers.

Rows use the *wire dtype* of a mechanism: its report dtype, plus an int64 ``channel`` field for
mechanisms whose clients send several messages. Such a client also sends one **presence marker** per
event (channel ``PRESENCE``, no payload): the shuffler counts, deletes and releases whole message sets,
and the analyzer counts released clients by their markers, because a client may send no other message at
all (e.g. a k-RAPPOR vector without set bits).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from transforms.mechanisms.base import Mechanism, is_single_message

PAYLOAD_RECORDS = {
    "category": "esa.telemetry.CategoryPayload",
    "bits": "esa.telemetry.BitsPayload",
    "hashed": "esa.telemetry.HashedPayload",
    "mark": "esa.telemetry.MarkPayload",
    "sketch": "esa.telemetry.SketchPayload",
    "key_value": "esa.telemetry.KeyValuePayload",
    "coordinates": "esa.telemetry.CoordinatesPayload",
    "vector": "esa.telemetry.VectorPayload",
    "integers": "esa.telemetry.IntegersPayload",
}


_KIND_OF_RECORD = {v: k for k, v in PAYLOAD_RECORDS.items()}


PRESENCE = -1  # channel of the per-event presence marker of multi-message mechanisms


CHANNEL = "channel"


# A payload row is a tuple in the field order of the wire dtype; sub-array fields are ``bytes`` (packed
# bits) or tuples, so rows stay cheap to pickle, hashable and totally ordered (the shuffler sorts them).
PayloadRow = tuple


def wire_dtype(mechanism: Mechanism) -> np.dtype:
    """The mechanism's report dtype, with a ``channel`` field added for multi-message mechanisms."""
    dtype = mechanism.report_dtype
    if is_single_message(mechanism) or CHANNEL in (dtype.names or ()):
        return dtype
    return np.dtype([*dtype.descr, (CHANNEL, "<i8")])


def payload_fields(mechanism: Mechanism) -> list[str]:
    """Wire dtype fields carried inside the Avro payload (all but ``channel``)."""
    return [f for f in wire_dtype(mechanism).names if f != CHANNEL]


def count_clients(mechanism: Mechanism, reports: np.ndarray) -> tuple[np.ndarray, int]:
    """(messages without presence markers, clients) of a released batch, for ``Accumulator.add``."""
    if is_single_message(mechanism):
        return reports, len(reports)
    marker = reports[CHANNEL] == PRESENCE
    messages = reports[~marker]
    names = mechanism.report_dtype.names
    if CHANNEL not in names:
        messages = np.ascontiguousarray(messages[list(names)]).astype(mechanism.report_dtype)
    return messages, int(marker.sum())


def presence_row(mechanism: Mechanism) -> PayloadRow:
    """The presence-marker row of a multi-message mechanism: channel PRESENCE, every payload field zero."""
    return array_to_rows(_presence_array(mechanism))[0]


@cache
def _presence_cached(mechanism: Mechanism) -> np.ndarray:
    out = np.zeros(1, dtype=wire_dtype(mechanism))
    out[CHANNEL] = PRESENCE
    return out


def _presence_array(mechanism: Mechanism) -> np.ndarray:
    return _presence_cached(mechanism).copy()


def bit_length(mechanism: Mechanism) -> int:
    """The bit count a ``length`` field of a packed-bits payload must hold."""
    return int(mechanism.bit_length if mechanism.bit_length is not None else mechanism.d)


def row_channel(mechanism: Mechanism, row: PayloadRow) -> int:
    """The channel a wire row travels on (0 for single-message mechanisms)."""
    names = wire_dtype(mechanism).names
    return int(row[names.index(CHANNEL)]) if CHANNEL in names else 0


def rows_to_array(mechanism: Mechanism, rows: list[PayloadRow]) -> np.ndarray:
    """Stack payload rows into the mechanism's wire array (one copy per field)."""
    dtype = wire_dtype(mechanism)
    out = np.empty(len(rows), dtype=dtype)
    for i, name in enumerate(dtype.names):
        sub = dtype.fields[name][0]
        if sub.shape and sub.base == np.uint8:  # packed bytes
            width = int(np.prod(sub.shape))
            blob = b"".join(r[i] for r in rows)
            if len(blob) != width * len(rows):
                raise ValueError(f"field {name} must hold {width} bytes per report")
            out[name] = np.frombuffer(blob, dtype=sub.base).reshape((len(rows), *sub.shape))
        elif sub.shape:
            out[name] = np.asarray([r[i] for r in rows], dtype=sub.base).reshape((len(rows), *sub.shape))
        else:
            out[name] = np.fromiter((r[i] for r in rows), dtype=sub, count=len(rows))
    return out


def array_to_rows(reports: np.ndarray) -> list[PayloadRow]:
    """Inverse of ``rows_to_array``: per-report tuples with packed fields as ``bytes``, arrays as tuples."""
    columns: list[list[Any]] = []
    for name in reports.dtype.names:
        col = reports[name]
        if col.ndim > 1 and col.dtype == np.uint8:
            width = int(np.prod(col.shape[1:]))
            blob = np.ascontiguousarray(col).tobytes()
            columns.append([blob[i * width:(i + 1) * width] for i in range(len(reports))])
        elif col.ndim > 1:  # an explicit width: reshape(0, -1) is ambiguous for an empty batch
            columns.append([tuple(r) for r in col.reshape(len(col), int(np.prod(col.shape[1:]))).tolist()])
        else:
            columns.append(col.tolist())
    return list(zip(*columns, strict=True))


def client_messages(mechanism: Mechanism, reports: np.ndarray, owner: np.ndarray,
                    n_clients: int) -> tuple[np.ndarray, np.ndarray]:
    """(wire array, owner) of a batch's messages; multi-message clients get their presence marker first.

    Rows of one client stay consecutive (marker, then its messages), in client order. ``n_clients`` (the
    batch's size) is required: a client with no message (a k-RAPPOR vector with no bit set) after the last one
    that has some is not in ``owner``, and without it would get no marker, vanishing from the count.
    """
    if is_single_message(mechanism):
        return reports, owner
    if len(owner) and int(owner.max()) >= n_clients:
        raise ValueError(f"owner names client {int(owner.max())} of a batch of {n_clients}")
    clients = n_clients
    dtype = wire_dtype(mechanism)
    wire = np.zeros(len(reports), dtype=dtype)
    for name in reports.dtype.names:
        wire[name] = reports[name]
    markers = np.zeros(clients, dtype=dtype)
    markers[CHANNEL] = PRESENCE
    all_owner = np.concatenate([np.arange(clients, dtype=np.int64), owner])
    order = np.argsort(all_owner, kind="stable")
    return np.concatenate([markers, wire])[order], all_owner[order]
