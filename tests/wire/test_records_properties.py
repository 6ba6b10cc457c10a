"""Properties of the conversions every report goes through (hypothesis): nothing is lost or altered.

Payload rows <-> numpy report arrays <-> Avro payloads, and TelemetryEvent / Report wire round trips, for
arbitrary valid inputs of each mechanism.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import SCHEMA_VERSION, decode_record, encode_record
from transforms.mechanisms.frequency.oracles import make_frequency_mechanism
from transforms.wire.avro_payload import payload_from_avro, payload_to_avro
from transforms.wire.rows import array_to_rows, rows_to_array

MECHANISMS = st.sampled_from(["grr", "oue", "olh"])


@settings(max_examples=60, deadline=None)
@given(name=MECHANISMS, d=st.integers(2, 70), eps=st.floats(0.1, 6.0), n=st.integers(0, 40), seed=st.integers(0, 2**32))
def test_rows_arrays_and_avro_payloads_round_trip(name: str, d: int, eps: float, n: int, seed: int) -> None:
    mech = make_frequency_mechanism(name, d, eps)
    reports = mech.encode(np.random.default_rng(seed).integers(0, d, size=n), np.random.default_rng(seed + 1))
    rows = array_to_rows(reports)
    assert len(rows) == n
    back = rows_to_array(mech, rows)
    assert back.dtype == reports.dtype and back.tobytes() == reports.tobytes()
    for row in rows:
        assert payload_from_avro(mech, payload_to_avro(mech, row)) == row


@settings(max_examples=60, deadline=None)
@given(client=st.text(min_size=1, max_size=40), metric=st.text(max_size=20), t=st.integers(-2**62, 2**62),
       value=st.one_of(st.text(max_size=30), st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=False),
                       st.dictionaries(st.text(max_size=8), st.floats(allow_nan=False), max_size=5)))
def test_telemetry_events_round_trip(client: str, metric: str, t: int, value: object) -> None:
    record = {"schema_version": SCHEMA_VERSION, "client_id": client, "event_time": t, "metric": metric,
              "value": value, "crowd_id": None}
    assert decode_record("TelemetryEvent", encode_record("TelemetryEvent", record)) == record


@settings(max_examples=40, deadline=None)
@given(name=MECHANISMS, d=st.integers(2, 40), seed=st.integers(0, 2**32), client=st.text(min_size=1, max_size=20))
def test_reports_round_trip_and_stay_in_domain(name: str, d: int, seed: int, client: str) -> None:
    mech = make_frequency_mechanism(name, d, 2.0)
    row = array_to_rows(mech.encode(np.array([seed % d]), np.random.default_rng(seed)))[0]
    record = {"schema_version": SCHEMA_VERSION, "spec_id": "s@0", "crowd_id": None, "channel": 0, "client_id": client,
              "event_time": seed, "payload": payload_to_avro(mech, row)}
    decoded = decode_record("Report", encode_record("Report", record))
    assert decoded == record
    assert payload_from_avro(mech, decoded["payload"]) == row


def test_array_to_rows_of_empty_batches_with_vector_fields() -> None:
    """An empty batch with a multi-value field (mm_hadamard's ``values``) is no rows, not a reshape error."""
    dtype = np.dtype([("channel", "<i8"), ("values", "<i8", (14,)), ("bits", "u1", (4,))])
    assert array_to_rows(np.zeros(0, dtype=dtype)) == []
    rows = array_to_rows(np.ones(2, dtype=dtype))
    assert rows[0] == (1, (1,) * 14, b"\x01" * 4) and len(rows) == 2
