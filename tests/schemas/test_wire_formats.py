"""Avro wire formats (docs/architecture.md §7): round trips of every schema and every refusal of ``decode_record``.

Every Kafka message is an Avro single-object encoding (``C3 01``, 8-byte little-endian CRC-64-AVRO
fingerprint, schemaless datum). These tests pin the byte layout against an independent CRC-64-AVRO so
that a non-Python consumer (Java Avro, a schema registry) reads the same fingerprints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastavro.schema import to_parsing_canonical_form

from schemas import (
    SCHEMA_NAMES,
    SCHEMA_VERSION,
    SUPPORTED_VERSIONS,
    WireFormatError,
    decode_record,
    encode_record,
    load_schema,
)

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas"
HEADER_LEN = 10  # C3 01 + 8 fingerprint bytes

CATEGORY = ("esa.telemetry.CategoryPayload", {"value": 5})
BITS = ("esa.telemetry.BitsPayload", {"length": 12, "bits": b"\x81\x30"})
HASHED = ("esa.telemetry.HashedPayload", {"seed": 1023, "z": 3})
MARK = ("esa.telemetry.MarkPayload", {})
SKETCH = ("esa.telemetry.SketchPayload", {"row": 7, "length": 12, "bits": b"\x81\x30"})
KEY_VALUE = ("esa.telemetry.KeyValuePayload", {"key": 3, "value": -1})
COORDINATES = ("esa.telemetry.CoordinatesPayload", {"indices": [0, 9], "values": [0.5, -2.0]})
VECTOR = ("esa.telemetry.VectorPayload", {"values": [1.5, -0.25, 0.0]})
INTEGERS = ("esa.telemetry.IntegersPayload", {"values": [4, -1, 2**40]})


def telemetry_event(value: Any, crowd_id: str | None = None) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "client_id": "client-7", "event_time": 1_700_000_123_456,
            "metric": "app_language", "value": value, "crowd_id": crowd_id}


def report(payload: Any, client_id: str | None = "client-7", crowd_id: str | None = None) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "spec_id": "app_language@0123456789ab", "crowd_id": crowd_id,
            "channel": 0, "client_id": client_id, "event_time": 1_700_000_123_456, "payload": payload}


def estimate(n_deleted: int | None) -> dict[str, Any]:
    """An Estimate; with ``n_deleted`` set, the optional odometer and release fields are set too."""
    optional = {"eps_central_cumulative": None, "windows_composed": None, "release_id": None}
    if n_deleted is not None:
        optional = {"eps_central_cumulative": 0.31, "windows_composed": 3, "release_id": "r" * 64}
    return {**optional, "schema_version": SCHEMA_VERSION, "spec_id": "app_language@0123456789ab",
            "analysis": "app_language", "window_start": 1_699_999_200_000, "window_end": 1_700_002_800_000,
            "crowd_id": "v1.2", "item": "en",
            "item_index": 0, "estimate": 0.25, "stderr": 0.0125, "raw_estimate": 0.26, "n_reports": 20_000,
            "n_clients": 20_000, "n_deleted": n_deleted,
            "eps_local": 2.0, "eps_central": 0.12, "delta": 1e-6, "mechanism": "olh",
            "parameters": json.dumps({"d": 64, "epsilon": 2.0}), "eps_central_cumulative": 1.1,
            "windows_composed": 3, "delta_cumulative": 4e-6, "release_id": "0123456789abcdef0123456789abcdef",
            "notion": "replacement across partitions", "eps_count_cumulative": 0.4}


def dead_letter(full: bool) -> dict[str, Any]:
    if not full:
        return {"schema_version": SCHEMA_VERSION, "original": None, "topic": None, "partition": None,
                "offset": None, "stage": "decode", "reason": "not an Avro message", "spec_id": None,
                "original_length": None, "original_digest": None}
    return {"schema_version": SCHEMA_VERSION, "original": b"\x00\xffgarbage", "topic": "telemetry", "partition": 3,
            "offset": 2**40 + 7, "stage": "shuffle", "reason": "duplicate: client c", "spec_id": "s@0123456789ab",
            "original_length": 9, "original_digest": None}


def message_set(crowd_id: str | None = None) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "spec_id": "app_language@0123456789ab", "crowd_id": crowd_id,
            "device_id": "0123456789abcdef0123456789abcdef", "event_time": 1_700_000_123_456, "nonce": bytes(16),
            "key_id": "20260101-0a1b2c3d", "messages": [{"channel": 0, "sealed": b"\x01sealed"}],
            "signature": bytes(64)}


def release_batch(deleted: int | None) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "release_id": "ab" * 16, "spec_id": "app_language@0123456789ab",
            "crowd_id": "v1.2", "window_end": 1_700_002_800_000, "batch_index": 0, "batch_count": 1,
            "n_sets": 1, "n_messages": 2, "deleted": deleted,
            "messages": [{"channel": 0, "sealed": b"\x01a"}, {"channel": 3, "sealed": b"\x01b"}],
            "key_id": "20260101-0a1b2c3d", "signature": bytes(64)}


ROUND_TRIPS: list[tuple[str, str, dict[str, Any]]] = [
    ("TelemetryEvent", "string", telemetry_event("en")),
    ("TelemetryEvent", "long", telemetry_event(63)),
    ("TelemetryEvent", "double", telemetry_event(2.5)),
    ("TelemetryEvent", "map", telemetry_event({"cpu": 0.5, "mem": -1.25})),
    ("TelemetryEvent", "sparse", telemetry_event(("esa.telemetry.SparseTernary",
                                                  {"indices": [1, 17, 40], "signs": [1, -1, 1]}))),
    ("TelemetryEvent", "dense", telemetry_event(("esa.telemetry.DenseVector", {"values": [0.0, -3.5, 1e300]}))),
    ("Report", "category", report(CATEGORY)),
    ("Report", "bits", report(BITS)),
    ("Report", "hashed", report(HASHED)),
    ("Report", "no-client", report(CATEGORY, client_id=None)),
    ("Report", "crowd", report(CATEGORY, crowd_id="v1.2")),
    ("Report", "mark", report(MARK)),
    ("Report", "sketch", report(SKETCH)),
    ("Report", "key_value", report(KEY_VALUE)),
    ("Report", "coordinates", report(COORDINATES)),
    ("Report", "vector", report(VECTOR)),
    ("Report", "integers", report(INTEGERS)),
    ("TelemetryEvent", "crowd", telemetry_event("en", crowd_id="v1.2")),
    ("Estimate", "n_deleted-null", estimate(None)),
    ("Estimate", "n_deleted-set", estimate(31)),
    ("DeadLetter", "minimal", dead_letter(False)),
    ("DeadLetter", "full", dead_letter(True)),
    ("MessageSet", "no-crowd", message_set()),
    ("MessageSet", "crowd", message_set("v1.2")),
    ("ReleaseBatch", "deleted-null", release_batch(None)),
    ("ReleaseBatch", "deleted-set", release_batch(7)),
]


# --- an independent CRC-64-AVRO (Avro specification, "Schema Fingerprints") --------------------------------

_CRC64_EMPTY = 0xC15D213AA4D7A795


def _crc64_table() -> list[int]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_CRC64_EMPTY & -(fp & 1))
        table.append(fp)
    return table


_CRC64_TABLE = _crc64_table()


def crc64_avro(data: bytes) -> int:
    fp = _CRC64_EMPTY
    for byte in data:
        fp = (fp >> 8) ^ _CRC64_TABLE[(fp ^ byte) & 0xFF]
    return fp


def test_reference_crc64_matches_the_avro_specification_test_vector() -> None:
    # Avro's own test data (share/test/data/schema-tests.txt): the fingerprint of "null".
    assert crc64_avro(b'"null"') == 7195948357588979594


# --- round trips ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "case", "record"), ROUND_TRIPS, ids=[f"{n}-{c}" for n, c, _ in ROUND_TRIPS])
def test_round_trip(name: str, case: str, record: dict[str, Any]) -> None:
    message = encode_record(name, record)
    assert message[:HEADER_LEN] == load_schema(name).header
    decoded = decode_record(name, message)
    assert decoded == record
    # Types survive too (a long must not come back as a double, bytes not as str).
    for key, value in record.items():
        assert type(decoded[key]) is type(value), key


def test_estimate_without_the_optional_odometer_fields_reads_them_as_null() -> None:
    """Writers that predate the odometer (eps_central_cumulative, windows_composed, release_id) stay readable."""
    full = estimate(31)
    added = ("eps_central_cumulative", "windows_composed", "release_id", "notion", "eps_count_cumulative")
    older = {k: v for k, v in full.items() if k not in added}
    decoded = decode_record("Estimate", encode_record("Estimate", older))
    assert decoded == {**older, **dict.fromkeys(added)}


def test_record_union_branches_written_as_plain_dicts_come_back_named() -> None:
    # Producers may write a record branch without its name; the reader always says which branch it was,
    # which is what the encode stage dispatches on.
    sparse = {"indices": [2], "signs": [-1]}
    dense = {"values": [1.0, 2.0]}
    assert decode_record("TelemetryEvent", encode_record("TelemetryEvent", telemetry_event(sparse)))["value"] == (
        "esa.telemetry.SparseTernary", sparse)
    assert decode_record("TelemetryEvent", encode_record("TelemetryEvent", telemetry_event(dense)))["value"] == (
        "esa.telemetry.DenseVector", dense)


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_header_is_the_single_object_marker_and_little_endian_crc64_of_the_canonical_form(name: str) -> None:
    raw = json.loads((SCHEMA_DIR / f"{name}.avsc").read_text(encoding="utf-8"))
    expected = crc64_avro(to_parsing_canonical_form(raw).encode("utf-8")).to_bytes(8, "little")
    loaded = load_schema(name)
    assert loaded.fingerprint == expected
    assert loaded.header == b"\xc3\x01" + expected


def test_fingerprints_are_distinct() -> None:
    assert len({load_schema(name).fingerprint for name in SCHEMA_NAMES}) == len(SCHEMA_NAMES)


def test_load_schema_refuses_an_unknown_name() -> None:
    with pytest.raises(KeyError, match="Nope"):
        load_schema("Nope")


# --- refusals of decode_record -------------------------------------------------------------------------------

def reason_of(expected: str, message: bytes | None) -> str:
    with pytest.raises(WireFormatError) as info:
        decode_record(expected, message)
    assert info.value.reason == str(info.value)
    return info.value.reason


@pytest.mark.parametrize("message", [None, b"", b"\xc3", b"\xc3\x01abc",
                                     np.random.default_rng(20240501).bytes(64)], ids=["none", "empty", "one-byte",
                                                                                       "short-header", "random"])
def test_refuses_what_is_not_a_single_object_message(message: bytes | None) -> None:
    assert "not an Avro single-object message" in reason_of("Report", message)


def test_refuses_random_bytes_behind_a_valid_header() -> None:
    # Seeded garbage after a genuine Report header: corrupt, trailing or version -- never a record.
    rng = np.random.default_rng(7)
    for size in (1, 5, 17, 64, 300):
        reason_of("Report", load_schema("Report").header + rng.bytes(size))


@pytest.mark.parametrize(("name", "case", "record"), ROUND_TRIPS, ids=[f"{n}-{c}" for n, c, _ in ROUND_TRIPS])
def test_refuses_every_truncation(name: str, case: str, record: dict[str, Any]) -> None:
    message = encode_record(name, record)
    for cut in range(len(message)):
        reason = reason_of(name, message[:cut])
        if cut >= HEADER_LEN:
            assert f"corrupt {name} datum" in reason, (cut, reason)


@pytest.mark.parametrize("extra", [b"\x00", b"\x02\x04junk"])
def test_refuses_trailing_bytes(extra: bytes) -> None:
    message = encode_record("Report", report(CATEGORY)) + extra
    assert f"{len(extra)} trailing bytes after the Report datum" in reason_of("Report", message)


@pytest.mark.parametrize(("writer", "record"), [("TelemetryEvent", telemetry_event("en")),
                                                ("Estimate", estimate(None)),
                                                ("DeadLetter", dead_letter(True))])
def test_refuses_a_record_of_another_schema(writer: str, record: dict[str, Any]) -> None:
    reason = reason_of("Report", encode_record(writer, record))
    assert f"expected a Report record, got a {writer} record" in reason


def test_refuses_a_body_of_another_schema_behind_a_forged_header() -> None:
    body = encode_record("TelemetryEvent", telemetry_event("en"))[HEADER_LEN:]
    for name in ("Report", "Estimate", "DeadLetter"):
        reason_of(name, load_schema(name).header + body)


def test_refuses_an_unknown_fingerprint() -> None:
    body = encode_record("Report", report(CATEGORY))[HEADER_LEN:]
    reason = reason_of("Report", b"\xc3\x01" + bytes.fromhex("abababababababab") + body)
    assert "unknown writer schema fingerprint abababababababab" in reason


@pytest.mark.parametrize("name", SCHEMA_NAMES)
@pytest.mark.parametrize("version", [99, 0, -1, SCHEMA_VERSION + 1])
def test_refuses_an_unknown_schema_version(name: str, version: int) -> None:
    assert version not in SUPPORTED_VERSIONS
    record = {n: r for n, _, r in ROUND_TRIPS}[name]
    message = encode_record(name, {**record, "schema_version": version})
    reason = reason_of(name, message)
    assert f"unknown {name} schema_version {version}" in reason


# --- refusals of encode_record --------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "record", "field"), [
    ("Report", report(CATEGORY), "spec_id"),
    ("Report", report(CATEGORY), "payload"),
    ("TelemetryEvent", telemetry_event("en"), "client_id"),
    ("Estimate", estimate(None), "eps_central"),
    ("DeadLetter", dead_letter(False), "reason"),
])
def test_encode_refuses_a_record_missing_a_field(name: str, record: dict[str, Any], field: str) -> None:
    broken = {k: v for k, v in record.items() if k != field}
    with pytest.raises(ValueError, match=f"schema {name}") as info:
        encode_record(name, broken)
    assert field in str(info.value)  # the docstring promises an error naming the field


def test_encode_refuses_a_value_of_the_wrong_type() -> None:
    with pytest.raises(ValueError, match="schema Report"):
        encode_record("Report", {**report(CATEGORY), "channel": "zero"})
