"""A report's payload in Avro: the record a device seals to the analyzer, and back, every check included.

The plaintext is padded to a fixed length per mechanism, because sealing hides contents, not lengths.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from schemas import SCHEMA_VERSION, load_schema
from transforms.mechanisms.base import Mechanism, channel_count, is_single_message
from transforms.wire.domain import domain_problems
from transforms.wire.elements import ReportElement
from transforms.wire.rows import (
    _KIND_OF_RECORD,
    CHANNEL,
    PAYLOAD_RECORDS,
    PRESENCE,
    PayloadRow,
    array_to_rows,
    bit_length,
    presence_row,
    row_channel,
    wire_dtype,
)


@cache
def _avro_fields(record_name: str) -> tuple[str, ...]:
    """Field names of a payload record of the Report union (parsed from the schema, not restated here)."""
    for field in load_schema("Report").parsed["fields"]:
        if field["name"] == "payload":
            for branch in field["type"]:
                if branch["name"] == record_name:
                    return tuple(f["name"] for f in branch["fields"])
    raise KeyError(f"no payload record {record_name} in schemas/Report.avsc")


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
    whole batch (``transforms.wire.payload_batch``; a one-row ``validate`` costs ~14 microseconds per report).
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
        problem = domain_problems(mechanism, [out], [channel])[0]
        if problem is not None:
            raise ValueError(problem)
    return out


def report_record(mechanism: Mechanism, report: ReportElement) -> dict[str, Any]:
    """A Report record (schemas/Report.avsc) of a randomized message, as a device would send it."""
    return {"schema_version": SCHEMA_VERSION, "spec_id": report.spec_id, "crowd_id": report.crowd_id,
            "channel": row_channel(mechanism, report.payload), "client_id": report.client_id,
            "event_time": report.event_time_ms, "payload": payload_to_avro(mechanism, report.payload)}


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
