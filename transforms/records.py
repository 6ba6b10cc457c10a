"""Elements that flow between the Beam stages, and conversions between Avro payloads and numpy rows.

Inside a pipeline a report is a ``ReportElement`` until the shuffler has deduplicated and counted its
client; from then on reports travel as numpy structured arrays of payloads with no client id, no Kafka
coordinates and no exact time -- only the window end and the public crowd id.

Rows use the *wire dtype* of a mechanism: its report dtype, plus an int64 ``channel`` field for
mechanisms whose clients send several messages (base.py). Such a client also sends one **presence
marker** per event (channel ``PRESENCE``, no payload): the shuffler counts, deletes and releases whole
message sets, and the analyzer counts released clients by their markers, because a client may send no
other message at all (e.g. a k-RAPPOR vector without set bits).

Payload records are converted generically: the Avro record's fields are the wire dtype's fields minus
``channel`` (see the "Payloads" paragraph of ``transforms/mechanisms/base.py``).
"""

from __future__ import annotations

from functools import cache
from typing import Any, NamedTuple

import numpy as np

from schemas import SCHEMA_VERSION, load_schema
from transforms.mechanisms.base import Mechanism, channel_count, is_single_message
from transforms.state.dead_letters import truncate_original

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


class SourceRef(NamedTuple):
    """Where a record was read, so a dead letter can point at it (never forwarded past the shuffler)."""

    topic: str
    partition: int
    offset: int


class ReportElement(NamedTuple):
    """One report (message) on its way into the shuffler (ingress: still carries the client id)."""

    spec_id: str
    channel: int
    client_id: str
    event_time_ms: int
    payload: PayloadRow
    source: SourceRef | None = None
    original: bytes | None = None
    crowd_id: str | None = None


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


def dead_letter(stage: str, reason: str, *, original: bytes | None = None, source: SourceRef | None = None,
                spec_id: str | None = None) -> dict[str, Any]:
    """A DeadLetter record (schemas/DeadLetter.avsc); the original is capped at 64 KiB (with its full digest)."""
    kept, digest = truncate_original(original)
    return {
        "schema_version": SCHEMA_VERSION,
        "original": kept,
        "topic": source.topic if source else None,
        "partition": source.partition if source else None,
        "offset": source.offset if source else None,
        "stage": stage,
        "reason": reason,
        "spec_id": spec_id,
        "original_length": None if original is None else len(original),
        "original_digest": digest,
    }


@cache
def _avro_fields(record_name: str) -> tuple[str, ...]:
    """Field names of a payload record of the Report union (parsed from the schema, not restated here)."""
    for field in load_schema("Report").parsed["fields"]:
        if field["name"] == "payload":
            for branch in field["type"]:
                if branch["name"] == record_name:
                    return tuple(f["name"] for f in branch["fields"])
    raise KeyError(f"no payload record {record_name} in schemas/Report.avsc")


def bit_length(mechanism: Mechanism) -> int:
    """The bit count a ``length`` field of a packed-bits payload must hold."""
    return int(getattr(mechanism, "bit_length", mechanism.d))


def row_channel(mechanism: Mechanism, row: PayloadRow) -> int:
    """The channel a wire row travels on (0 for single-message mechanisms)."""
    names = wire_dtype(mechanism).names
    return int(row[names.index(CHANNEL)]) if CHANNEL in names else 0


def payload_to_avro(mechanism: Mechanism, row: PayloadRow) -> tuple[str, dict[str, Any]]:
    """The (record name, record) of a row's payload, as fastavro writes a named union branch.

    The row's channel (``row_channel``) travels beside the payload, in ``Report.channel``.
    """
    dtype = wire_dtype(mechanism)
    values = dict(zip(dtype.names, row, strict=True))
    if values.get(CHANNEL, 0) == PRESENCE and not is_single_message(mechanism):
        return PAYLOAD_RECORDS["mark"], {}
    name = PAYLOAD_RECORDS[mechanism.payload_kind]
    record: dict[str, Any] = {}
    for field in _avro_fields(name):
        if field == "length":
            record[field] = bit_length(mechanism)
            continue
        value, sub = values[field], dtype.fields[field][0]
        if sub.shape:
            record[field] = bytes(value) if sub.base == np.uint8 else list(value)
        else:
            record[field] = float(value) if sub.kind == "f" else int(value)
    return name, record


def payload_from_avro(mechanism: Mechanism, payload: Any, channel: int = 0, check_domain: bool = True
                      ) -> PayloadRow:
    """Turn a decoded Avro payload (and its channel) into a wire row; ``ValueError`` says why it does not fit.

    Checks the record type, the channel and every field's shape here and the value domain with the
    mechanism's own vectorised ``validate`` (on a one-row array), so a malformed report never reaches a
    count array. ``check_domain=False`` skips only that last check, for a caller that runs it once over a
    whole batch (``transforms.payload_batch``; a one-row ``validate`` costs ~14 microseconds per report).
    """
    name, record = payload if isinstance(payload, tuple) else (None, payload)
    kind = _KIND_OF_RECORD.get(name)
    single = is_single_message(mechanism)
    if channel == PRESENCE and not single:
        if kind != "mark":
            raise ValueError(f"presence marker (channel {PRESENCE}) must carry a MarkPayload, not {name}")
        return presence_row(mechanism)
    channels = channel_count(mechanism)
    if not 0 <= channel < channels:
        raise ValueError(f"channel {channel} does not exist for {mechanism.name} (channels 0..{channels - 1})")
    if kind != mechanism.payload_kind:
        raise ValueError(f"payload {name} does not fit mechanism {mechanism.name} "
                         f"(expects {PAYLOAD_RECORDS[mechanism.payload_kind]})")
    dtype = wire_dtype(mechanism)
    row: list[Any] = []
    for field in dtype.names:
        if field == CHANNEL:
            row.append(channel)
            continue
        value, sub = record[field], dtype.fields[field][0]
        if sub.shape:
            width = int(np.prod(sub.shape)) * (sub.base.itemsize if sub.base == np.uint8 else 1)
            if len(value) != width:
                raise ValueError(f"payload outside the output domain of {mechanism.name}: field {field} holds "
                                 f"{len(value)} entries, expected {width}")
            value = bytes(value) if sub.base == np.uint8 else tuple(value)
        row.append(value)
    if "length" in record and record["length"] != bit_length(mechanism):
        raise ValueError(f"payload outside the output domain of {mechanism.name}: bit vector of length "
                         f"{record['length']}, expected {bit_length(mechanism)}")
    out = tuple(row)
    if check_domain:
        from transforms.payload_batch import domain_problems

        problem = domain_problems(mechanism, [out], [channel])[0]
        if problem is not None:
            raise ValueError(problem)
    return out


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


def report_record(mechanism: Mechanism, report: ReportElement) -> dict[str, Any]:
    """A Report record (schemas/Report.avsc) of a randomized message, as a device would send it."""
    return {"schema_version": SCHEMA_VERSION, "spec_id": report.spec_id, "crowd_id": report.crowd_id,
            "channel": row_channel(mechanism, report.payload), "client_id": report.client_id,
            "event_time": report.event_time_ms, "payload": payload_to_avro(mechanism, report.payload)}


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


@cache
def _payload_union() -> Any:
    """The parsed payload union of Report.avsc: what a sealed message's plaintext is written with."""
    import fastavro

    schema = load_schema("Report").parsed
    named = {n: s for n, s in schema["__named_schemas"].items()} if "__named_schemas" in schema else {}
    for field in schema["fields"]:
        if field["name"] == "payload":
            return fastavro.parse_schema(field["type"], named_schemas=dict(named))
    raise KeyError("no payload field in schemas/Report.avsc")


def encode_payload(mechanism: Mechanism, row: PayloadRow) -> bytes:
    """A row's payload as the plaintext a device seals to the analyzer: 2-byte length, schemaless Avro of the
    payload union, zero padding to the mechanism's fixed ``payload_pad_length``.

    Padding matters because sealing hides contents, not lengths: Avro varints are shorter for small values,
    so an unpadded ciphertext's length would tell the shuffler something about the randomized value.
    """
    import io

    import fastavro

    out = io.BytesIO()
    fastavro.schemaless_writer(out, _payload_union(), payload_to_avro(mechanism, row))
    data = out.getvalue()
    size = payload_pad_length(mechanism)
    if len(data) > size:
        raise ValueError(f"payload of {len(data)} bytes exceeds the {mechanism.name} bound of {size}")
    return len(data).to_bytes(2, "big") + data + bytes(size - len(data))


@cache
def payload_pad_length(mechanism: Mechanism) -> int:
    """The longest encoded payload the mechanism can produce: every integer at its longest varint (10 bytes)."""
    import io

    import fastavro

    dtype = wire_dtype(mechanism)
    row = np.zeros(1, dtype=dtype)
    for name in dtype.names:
        if name != CHANNEL and dtype.fields[name][0].base.kind in "iu":
            row[name] = np.iinfo(np.int64).min if dtype.fields[name][0].base.kind == "i" else 0
    out = io.BytesIO()
    fastavro.schemaless_writer(out, _payload_union(), payload_to_avro(mechanism, array_to_rows(row)[0]))
    return len(out.getvalue()) + 9 * sum(1 for n in dtype.names if dtype.fields[n][0].base.kind == "u")


def decode_payload(mechanism: Mechanism, data: bytes, channel: int, check_domain: bool = True) -> PayloadRow:
    """Inverse of ``encode_payload`` with every domain check of ``payload_from_avro``; ``ValueError`` says why."""
    import io

    import fastavro

    if not 2 <= len(data) <= MAX_PAYLOAD_BYTES:
        raise ValueError(f"payload of {len(data)} bytes (2 to {MAX_PAYLOAD_BYTES})")
    size = int.from_bytes(data[:2], "big")
    if size > len(data) - 2 or any(data[2 + size:]):
        raise ValueError("payload length prefix or padding is malformed")
    data = data[2:2 + size]
    buffer = io.BytesIO(data)
    try:
        payload = fastavro.schemaless_reader(buffer, _payload_union(), return_record_name=True)
    except Exception as err:  # fastavro raises many types on garbage: each is a malformed payload
        raise ValueError(f"undecodable payload ({type(err).__name__})") from None
    if buffer.tell() != len(data):
        raise ValueError(f"{len(data) - buffer.tell()} trailing bytes after the payload")
    return payload_from_avro(mechanism, payload, channel, check_domain)


MAX_PAYLOAD_BYTES = 4096
