"""Arrow schemas derived from the Avro schemas, for Parquet files (no Beam import: the state library uses it)."""

from __future__ import annotations

import pyarrow as pa

from schemas import load_schema

_ARROW_TYPES = {"int": pa.int32(), "long": pa.int64(), "double": pa.float64(), "string": pa.string(),
                "boolean": pa.bool_()}


def arrow_schema_of(name: str) -> pa.Schema:
    """The Arrow schema of a flat Avro record schema (nullable unions become nullable columns).

    Derived, not restated, so the Parquet columns cannot drift from ``schemas/<name>.avsc``.
    """
    columns = []
    for field in load_schema(name).parsed["fields"]:
        avro_type = field["type"]
        nullable = isinstance(avro_type, list)
        if nullable:
            avro_type = next(t for t in avro_type if t != "null")
        if not isinstance(avro_type, str) or avro_type not in _ARROW_TYPES:
            raise TypeError(f"schema {name}: field {field['name']} of type {avro_type!r} has no flat Arrow column")
        columns.append(pa.field(field["name"], _ARROW_TYPES[avro_type], nullable=nullable))
    return pa.schema(columns)


ESTIMATE_ARROW_SCHEMA = arrow_schema_of("Estimate")
