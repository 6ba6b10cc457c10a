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


# Descriptions of the Estimate fields whose Avro schema has no ``doc`` (the others use theirs).
_DESCRIPTIONS = {
    "schema_version": "Version of the Estimate schema this row was written with.",
    "spec_id": "The analysis spec: name@hash of its parameters (one id per parameter version).",
    "analysis": "The spec's name.",
    "window_start": "Start of the event-time window, milliseconds since the Unix epoch (UTC); see window_start_utc.",
    "window_end": "End (exclusive) of the event-time window, milliseconds since the Unix epoch; see window_end_utc.",
    "item": "What is estimated: a category, a key:statistic (kv_mean), a coordinate, a tree node level/index "
            "(range, quantile), quantile:q, or a heavy hitter's hex hash.",
    "item_index": "Position of the item in the spec's readout (stable across windows of one spec id).",
    "eps_local": "Local epsilon of one client's reports in this window (the notion: docs/mathematics.md §1.1).",
    "delta": "The spec's central delta.",
    "mechanism": "The local randomizer.",
}

#: Columns the analyzer adds to its Parquet parts for analysts (not in the Avro Estimate records of the
#: estimates topic, which keep the epoch-millisecond fields): typed times, the unit, the statistic apart.
ANALYST_FIELDS = (
    pa.field("window_start_utc", pa.timestamp("ms", tz="UTC"), metadata={"description": "window_start as a UTC "
             "timestamp."}),
    pa.field("window_end_utc", pa.timestamp("ms", tz="UTC"), metadata={"description": "window_end as a UTC "
             "timestamp."}),
    pa.field("statistic", pa.string(), metadata={"description": "What estimate is: frequency (a fraction of the "
             "clients), mean, conditional_mean, node_count (clients in a range-tree node), quantile."}),
    pa.field("key", pa.string(), metadata={"description": "The category, key, coordinate, node or hash the "
             "statistic is of (item without its :statistic suffix)."}),
    pa.field("unit", pa.string(), metadata={"description": "Unit of estimate and stderr: fraction (of the "
             "clients analysed), clients (a count), value (the units of the spec's metric, e.g. ms for "
             "latency_ms), normalised (a kv mean on [-1, 1])."}),
)


def _described(schema: pa.Schema) -> pa.Schema:
    docs = {f["name"]: f.get("doc") for f in load_schema("Estimate").parsed["fields"]}
    return pa.schema([f.with_metadata({"description": docs.get(f.name) or _DESCRIPTIONS.get(f.name, "")})
                      for f in schema])


def _part_schema() -> pa.Schema:
    import json

    fields = [*_described(ESTIMATE_ARROW_SCHEMA), *ANALYST_FIELDS]
    descriptions = {f.name: f.metadata[b"description"].decode() for f in fields}
    return pa.schema(fields, metadata={"esa.column_descriptions": json.dumps(descriptions)})


#: The schema of the analyzer's Parquet parts: the Estimate columns, described, then ``ANALYST_FIELDS``.
#: Descriptions are in each field's metadata (pyarrow, pandas via pyarrow) and, for readers that do not keep
#: Arrow field metadata (DuckDB), as JSON in the file's key-value metadata ``esa.column_descriptions``.
ESTIMATE_PART_SCHEMA = _part_schema()
