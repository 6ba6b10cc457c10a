"""The plaintext a device seals to the analyzer: one message's payload as schemaless Avro of the Report
payload union (``schemas/Report.avsc``), the same bytes ``transforms.records.encode_payload`` writes.

Kept private to this package until ``transforms.records`` provides ``encode_payload``; then this module
should simply re-export it.
"""

from __future__ import annotations

import io
from functools import cache
from typing import Any

import fastavro

from schemas import load_schema
from transforms.records import PayloadRow, payload_to_avro

__all__ = ["encode_payload"]


@cache
def _payload_union() -> Any:
    schema = load_schema("Report").parsed
    named = dict(schema.get("__named_schemas", {}))
    for field in schema["fields"]:
        if field["name"] == "payload":
            return fastavro.parse_schema(field["type"], named_schemas=named)
    raise KeyError("no payload field in schemas/Report.avsc")


def encode_payload(mechanism: Any, row: PayloadRow) -> bytes:
    """A wire row's payload (presence markers included) as schemaless Avro of the payload union."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, _payload_union(), payload_to_avro(mechanism, row))
    return out.getvalue()
