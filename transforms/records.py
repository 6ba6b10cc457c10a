"""Elements that flow between the Beam stages, and conversions between Avro payloads and numpy rows.

Inside a pipeline a report is a ``ReportElement`` until the shuffler has deduplicated and counted its
client; from then on reports travel as ``ShuffledBatch`` elements: a numpy structured array of payloads
with no client id, no Kafka coordinates and no exact time -- only the window end.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from schemas import SCHEMA_VERSION
from transforms.mechanisms.base import Mechanism

PAYLOAD_RECORDS = {
    "category": "esa.telemetry.CategoryPayload",
    "bits": "esa.telemetry.BitsPayload",
    "hashed": "esa.telemetry.HashedPayload",
}
_KIND_OF_RECORD = {v: k for k, v in PAYLOAD_RECORDS.items()}

# A payload row is a tuple in the field order of the mechanism's report dtype; sub-array fields
# (packed bits) are carried as ``bytes`` so rows stay cheap to pickle and to compare.
PayloadRow = tuple


class SourceRef(NamedTuple):
    """Where a record was read, so a dead letter can point at it (never forwarded past the shuffler)."""

    topic: str
    partition: int
    offset: int


class ReportElement(NamedTuple):
    """One report on its way into the shuffler (ingress: still carries the client id)."""

    spec_id: str
    channel: int
    client_id: str
    event_time_ms: int
    payload: PayloadRow
    source: SourceRef | None = None
    original: bytes | None = None


class ShuffledBatch(NamedTuple):
    """Released reports of one crowd, in random order: the only thing the analyzer ever sees."""

    spec_id: str
    channel: int
    window_end_ms: int
    reports: np.ndarray
    deleted: int | None = None  # reports the threshold deleted from this sub-crowd, if the spec publishes it


def dead_letter(stage: str, reason: str, *, original: bytes | None = None, source: SourceRef | None = None,
                spec_id: str | None = None) -> dict[str, Any]:
    """A DeadLetter record (schemas/DeadLetter.avsc)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "original": original,
        "topic": source.topic if source else None,
        "partition": source.partition if source else None,
        "offset": source.offset if source else None,
        "stage": stage,
        "reason": reason,
        "spec_id": spec_id,
    }


def payload_to_avro(mechanism: Mechanism, row: PayloadRow) -> tuple[str, dict[str, Any]]:
    """The (record name, record) of a payload row, as fastavro writes a named union branch."""
    kind = mechanism.payload_kind
    if kind == "category":
        return PAYLOAD_RECORDS[kind], {"value": int(row[0])}
    if kind == "bits":
        return PAYLOAD_RECORDS[kind], {"length": int(mechanism.d), "bits": bytes(row[0])}
    if kind == "hashed":
        return PAYLOAD_RECORDS[kind], {"seed": int(row[0]), "z": int(row[1])}
    raise ValueError(f"unknown payload kind {kind!r}")


def payload_from_avro(mechanism: Mechanism, payload: Any) -> PayloadRow:
    """Turn a decoded Avro payload into a row of ``mechanism``; ``ValueError`` says why it does not fit.

    Checks the payload record type and shape here and the value domain with the mechanism's own
    vectorised ``validate`` (on a one-row array), so a malformed report never reaches a count array.
    """
    name, record = payload if isinstance(payload, tuple) else (None, payload)
    kind = _KIND_OF_RECORD.get(name)
    if kind != mechanism.payload_kind:
        raise ValueError(f"payload {name} does not fit mechanism {mechanism.name} "
                         f"(expects {PAYLOAD_RECORDS[mechanism.payload_kind]})")
    if kind == "category":
        row: PayloadRow = (record["value"],)
    elif kind == "bits":
        if record["length"] != mechanism.d:
            raise ValueError(f"payload outside the output domain of {mechanism.name}: bit vector of length "
                             f"{record['length']}, expected {mechanism.d}")
        row = (record["bits"],)
    else:
        row = (record["seed"], record["z"])
    try:
        ok = bool(mechanism.validate(rows_to_array(mechanism, [row]))[0])
    except (ValueError, OverflowError, TypeError) as err:
        raise ValueError(f"payload outside the output domain of {mechanism.name}: {err}") from None
    if not ok:
        raise ValueError(f"payload {record} outside the output domain of {mechanism.name}(d={mechanism.d})")
    return row


def rows_to_array(mechanism: Mechanism, rows: list[PayloadRow]) -> np.ndarray:
    """Stack payload rows into the mechanism's structured report array (one copy per field)."""
    dtype = mechanism.report_dtype
    out = np.empty(len(rows), dtype=dtype)
    for i, name in enumerate(dtype.names):
        sub = dtype.fields[name][0]
        if sub.shape:  # packed bytes
            width = int(np.prod(sub.shape))
            blob = b"".join(r[i] for r in rows)
            if len(blob) != width * len(rows):
                raise ValueError(f"field {name} must hold {width} bytes per report")
            out[name] = np.frombuffer(blob, dtype=sub.base).reshape((len(rows), *sub.shape))
        else:
            out[name] = np.fromiter((r[i] for r in rows), dtype=sub, count=len(rows))
    return out


def array_to_rows(reports: np.ndarray) -> list[PayloadRow]:
    """Inverse of ``rows_to_array``: per-report tuples with packed fields as ``bytes``."""
    columns: list[list[Any]] = []
    for name in reports.dtype.names:
        col = reports[name]
        if col.ndim > 1:
            width = int(np.prod(col.shape[1:]))
            blob = np.ascontiguousarray(col).tobytes()
            columns.append([blob[i * width:(i + 1) * width] for i in range(len(reports))])
        else:
            columns.append(col.tolist())
    return list(zip(*columns, strict=True))


def report_record(mechanism: Mechanism, report: ReportElement) -> dict[str, Any]:
    """A Report record (schemas/Report.avsc) of a randomized report, as a device would send it."""
    return {"schema_version": SCHEMA_VERSION, "spec_id": report.spec_id, "channel": report.channel,
            "client_id": report.client_id, "event_time": report.event_time_ms,
            "payload": payload_to_avro(mechanism, report.payload)}


def shuffled_records(mechanism: Mechanism, batch: ShuffledBatch) -> list[dict[str, Any]]:
    """ShuffledReport records of a released batch, in its (random) order: no client, no key, no time."""
    common = {"schema_version": SCHEMA_VERSION, "spec_id": batch.spec_id, "channel": batch.channel,
              "window_end": batch.window_end_ms}
    return [{**common, "payload": payload_to_avro(mechanism, row)} for row in array_to_rows(batch.reports)]
