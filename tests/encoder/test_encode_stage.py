"""Encode stage (transforms/encoder/encode.py): TelemetryEvents -> LDP reports, device Reports -> validated elements.

Inputs are ``KafkaRecord``s built by hand around bytes from ``schemas.encode_record``, exactly what the
bounded Kafka reader yields. Every pipeline runs on the FnApiRunner; outputs are captured with their
timestamps and windows and checked in plain Python so a failure names the offending record.
"""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
import pytest
from fastavro.validation import validate

from schemas import SCHEMA_VERSION, encode_record, load_schema
from tests.beam_harness import PipelineRun, run_pipeline
from transforms.encoder.encode import DecodeEventsFn, EncodeBatchFn, EncodeEvents
from transforms.io.kafka.bounded import KafkaRecord
from transforms.mechanisms.randomness import job_key_from_seed
from transforms.spec import AnalysisSpec, spec_from_dict
from transforms.wire.elements import ReportElement, SourceRef
from transforms.wire.rows import PRESENCE, client_messages, rows_to_array, wire_dtype

# --- specs and records ------------------------------------------------------------------------------------

LANGS = ["en", "de", "fr", "es", "it", "nl", "pl", "pt"]
T0 = 1_700_000_000_000  # ms
TOPIC = "telemetry"
JOB_KEY = job_key_from_seed(20240501)


def make_spec(name: str, mechanism: str, *, size: int | None = None, categories: list[str] | None = None,
              **params: Any) -> AnalysisSpec:
    domain: dict[str, Any] = {"categories": categories} if categories else {"size": size}
    return spec_from_dict({"analysis": {"name": name, "metric": name}, "domain": domain,
                           "mechanism": {"name": mechanism, "epsilon": 1.0, **params}})


SPEC_GRR = make_spec("lang", "grr", categories=LANGS)
SPEC_OUE = make_spec("os", "oue", size=10)      # 10 bits: 2 bytes with 6 padding bits
SPEC_OLH = make_spec("browser", "olh", size=8)  # g = 4 buckets, 1024 seeds
SPECS = [SPEC_GRR, SPEC_OUE, SPEC_OLH]


def event_bytes(metric: str, value: Any, client: str = "client-0", event_time: int = T0) -> bytes:
    return encode_record("TelemetryEvent", {"schema_version": SCHEMA_VERSION, "client_id": client,
                                            "event_time": event_time, "metric": metric, "value": value})


def kafka(offset: int, value: bytes | None, partition: int = 0, topic: str = TOPIC) -> KafkaRecord:
    return KafkaRecord(topic, partition, offset, T0 + offset, f"k{offset}".encode(), value)


def check_dead_letter(letter: dict[str, Any], stage: str, record: KafkaRecord) -> None:
    validate(letter, load_schema("DeadLetter").parsed, raise_errors=True)  # writable to the dead-letter file
    assert letter["stage"] == stage
    assert (letter["topic"], letter["partition"], letter["offset"]) == (record.topic, record.partition,
                                                                        record.offset)
    assert letter["original"] == record.value


def in_domain(spec: AnalysisSpec, payload: tuple) -> bool:
    return bool(spec.randomizer.validate(rows_to_array(spec.randomizer, [payload]))[0])


# --- DecodeEventsFn / EncodeEvents ----------------------------------------------------------------------------

def valid_events() -> list[tuple[KafkaRecord, AnalysisSpec, int]]:
    """(record, spec, category index): names and indices, three metrics, two partitions."""
    out = []
    for i in range(90):
        spec = SPECS[i % 3]
        index = (i * 5) % spec.d
        value: Any = spec.categories[index] if i % 2 == 0 else index  # category name or index
        record = kafka(1000 + i, event_bytes(spec.metric, value, f"client-{i}", T0 + 7 * i), partition=i % 2)
        out.append((record, spec, index))
    return out


UNKNOWN_FINGERPRINT = b"\xc3\x01not a fingerprint at all"
BAD_EVENTS: list[tuple[str, bytes | None, str]] = [
    ("not-avro", b"hello world, definitely not Avro", "not an Avro single-object message"),
    ("tombstone", None, "not an Avro single-object message"),
    ("unknown-fingerprint", UNKNOWN_FINGERPRINT, "unknown writer schema fingerprint"),
    ("a-report", encode_record("Report", {"schema_version": 1, "spec_id": SPEC_GRR.spec_id, "channel": 0,
                                          "client_id": "c", "event_time": T0,
                                          "payload": ("esa.telemetry.CategoryPayload", {"value": 1})}),
     "expected a TelemetryEvent record, got a Report record"),
    ("unknown-version", encode_record("TelemetryEvent", {"schema_version": 99, "client_id": "c", "event_time": T0,
                                                         "metric": "lang", "value": "en"}), "schema_version 99"),
    ("unknown-metric", event_bytes("cpu_load", "en"), "no analysis spec consumes metric 'cpu_load'"),
    ("unknown-name", event_bytes("lang", "klingon"), "'klingon' is not in the domain of lang"),
    ("name-of-index-domain", event_bytes("browser", "firefox"), "'firefox' is not in the domain of browser"),
    ("index-too-large", event_bytes("lang", 8), "category index 8 outside [0, 8) of lang"),
    ("index-negative", event_bytes("os", -1), "category index -1 outside [0, 10) of os"),
    ("double", event_bytes("lang", 2.0), "a double value cannot feed histogram lang"),
    ("map", event_bytes("lang", {"en": 1.0}), "a map value cannot feed histogram lang"),
    ("sparse", event_bytes("lang", ("esa.telemetry.SparseTernary", {"indices": [1], "signs": [1]})),
     "a SparseTernary value cannot feed histogram lang"),
    ("dense", event_bytes("lang", ("esa.telemetry.DenseVector", {"values": [1.0]})),
     "a DenseVector value cannot feed histogram lang"),
]


@pytest.fixture(scope="module")
def encode_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[PipelineRun, list, list[KafkaRecord]]:
    good = valid_events()
    bad = [kafka(5000 + i, value) for i, (_, value, _) in enumerate(BAD_EVENTS)]
    records = [r for r, _, _ in good] + bad

    def build(p: beam.Pipeline) -> dict[str, beam.PCollection]:
        reports, dead = p | beam.Create(records) | EncodeEvents(SPECS, JOB_KEY)
        return {"reports": reports, "dead": dead}

    return run_pipeline(tmp_path_factory.mktemp("encode"), build), good, bad


def test_valid_events_become_reports(encode_run: tuple[PipelineRun, list, list[KafkaRecord]]) -> None:
    run, good, _ = encode_run
    reports = run.values("reports")
    assert all(isinstance(r, ReportElement) for r in reports)
    by_offset = {r.source.offset: r for r in reports}
    assert len(by_offset) == len(reports) == len(good)
    for record, spec, _ in good:
        report = by_offset[record.offset]
        assert report.spec_id == spec.spec_id
        assert report.channel == 0
        i = record.offset - 1000
        assert report.client_id == f"client-{i}"
        assert report.event_time_ms == T0 + 7 * i
        assert report.source == SourceRef(TOPIC, record.partition, record.offset)
        assert report.original == record.value
        assert len(report.payload) == len(spec.randomizer.report_dtype.names)
        assert in_domain(spec, report.payload), (spec.mechanism, report.payload)


def test_randomized_reports_are_not_the_raw_values(encode_run: tuple[PipelineRun, list, list[KafkaRecord]]) -> None:
    # GRR with eps=1, d=8 keeps the true value w.p. p = e/(e+7) = 0.28; 30 events all reporting the truth has
    # probability 0.28^30 < 1e-16, so an encoder that forgot to randomize fails here.
    run, good, _ = encode_run
    truth = {r.offset: index for r, spec, index in good if spec is SPEC_GRR}
    kept = sum(r.payload[0] == truth[r.source.offset] for r in run.values("reports") if r.source.offset in truth)
    assert kept < len(truth)


def test_bad_events_are_dead_lettered_with_a_reason(encode_run: tuple[PipelineRun, list, list[KafkaRecord]]) -> None:
    run, _, bad = encode_run
    letters = {d["offset"]: d for d in run.values("dead")}
    assert set(letters) == {r.offset for r in bad}
    problems = []
    for record, (case, _, reason) in zip(bad, BAD_EVENTS, strict=True):
        letter = letters[record.offset]
        check_dead_letter(letter, "decode", record)
        if reason not in letter["reason"]:
            problems.append(f"{case}: {letter['reason']!r} lacks {reason!r}")
        assert letter["spec_id"] is None
    assert not problems, problems


def test_encode_counters_account_for_every_record(encode_run: tuple[PipelineRun, list, list[KafkaRecord]]) -> None:
    run, good, bad = encode_run
    assert run.counters["events_decoded"] == len(good)
    assert run.counters["reports_encoded"] == len(good)
    assert run.counters["dead_lettered"] == len(bad)


# --- reproducibility (docs/mathematics.md §8): payload = PRF(job key, topic/partition/offset), any batching ---

REPRO_EVENTS = [kafka(offset, event_bytes(SPECS[offset % 3].metric, offset % 8, f"c{offset}"), partition=offset % 3)
                for offset in range(300)]


def encoded_payloads(tmp_path: Path, job_key: bytes, max_batch_size: int,
                     records: list[KafkaRecord] = REPRO_EVENTS) -> dict[tuple[int, int], tuple]:
    def build(p: beam.Pipeline) -> dict[str, beam.PCollection]:
        reports, _ = p | beam.Create(records) | EncodeEvents(SPECS, job_key, max_batch_size=max_batch_size)
        return {"reports": reports}

    reports = run_pipeline(tmp_path, build).values("reports")
    payloads = {(r.source.partition, r.source.offset): r.payload for r in reports}
    assert len(payloads) == len(records)
    return payloads


@pytest.fixture(scope="module")
def reference_payloads(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, int], tuple]:
    return encoded_payloads(tmp_path_factory.mktemp("reference"), JOB_KEY, 4096)


@pytest.mark.parametrize("max_batch_size", [1, 7, 100])
def test_same_job_key_reproduces_payloads_across_runs_and_batch_sizes(
        tmp_path: Path, reference_payloads: dict[tuple[int, int], tuple], max_batch_size: int) -> None:
    # A retried bundle is re-batched: the second run uses another batch size and must emit the same reports.
    assert encoded_payloads(tmp_path, JOB_KEY, max_batch_size) == reference_payloads


def test_payloads_do_not_depend_on_input_order(tmp_path: Path,
                                               reference_payloads: dict[tuple[int, int], tuple]) -> None:
    shuffled = list(REPRO_EVENTS)
    np.random.default_rng(3).shuffle(shuffled)
    assert encoded_payloads(tmp_path, JOB_KEY, 4096, shuffled) == reference_payloads


def test_another_job_key_changes_payloads(tmp_path: Path, reference_payloads: dict[tuple[int, int], tuple]) -> None:
    other = encoded_payloads(tmp_path, job_key_from_seed(99), 4096)
    differ = sum(other[k] != reference_payloads[k] for k in reference_payloads)
    # Chance that two independent randomizations coincide: GRR (eps=1, d=8) sum_y P(y)^2 = p^2 + 7 q^2 = 0.15;
    # OUE (10 bits) < 0.02; OLH (1024 seeds) < 0.01. Expected ~ 100*0.85 + 100*0.98 + 100*0.99 = 282 of 300
    # differ, sd < 4; 250 is more than 8 sd below.
    assert differ >= 250, differ


def test_batch_boundaries_do_not_change_payloads_in_the_dofn() -> None:
    # The DoFn itself, called directly on differently cut batches of the same events (no runner involved).
    decode = DecodeEventsFn(SPECS)
    decode.setup()
    events = [e for r in REPRO_EVENTS for batch in decode.process(r) for e in batch]
    encode = EncodeBatchFn(SPECS, JOB_KEY)

    def payloads(cuts: list[int]) -> dict[int, tuple]:
        out: dict[int, tuple] = {}
        for lo, hi in itertools.pairwise([0, *cuts, len(events)]):
            for batch in encode.process(events[lo:hi]):
                for report in batch:
                    out[report.source.offset] = report.payload
        return out

    whole = payloads([])
    assert len(whole) == len(events) == len(REPRO_EVENTS)
    assert payloads(list(range(1, len(events)))) == whole
    assert payloads([5, 6, 77, 200, 299]) == whole


def test_a_client_without_messages_keeps_its_presence_marker() -> None:
    # k-RAPPOR sends one message per set bit: a client whose randomized vector has no bit set sends only its
    # presence marker, also when it is the last of its batch (it was once dropped, shrinking n by one).
    spec = make_spec("flags", "rappor", size=6)
    decode = DecodeEventsFn([spec])
    decode.setup()
    events = [e for i in range(120) for batch in decode.process(kafka(i, event_bytes("flags", i % 6, f"c{i}")))
              for e in batch]
    encode = EncodeBatchFn([spec], JOB_KEY)
    reports = [r for batch in encode.process(events) for r in batch]
    assert Counter(r.client_id for r in reports if r.channel == PRESENCE) == Counter(f"c{i}" for i in range(120))
    bare = [e.client_id for e in events if sum(r.client_id == e.client_id for r in reports) == 1]
    # A batch ending with such a client: the cut right after the first client that sent nothing but its marker.
    # P(no bit set) = (1 - p)(1 - q)^5 = 0.056 per client (eps 1: p = 0.731, q = 0.269): ~6.7 of 120 expected,
    # none with probability 0.001 (and the job key is fixed, so the outcome is too).
    assert bare
    last = next(i for i, e in enumerate(events) if e.client_id == bare[0])
    (batch,) = encode.process(events[:last + 1])
    assert [r.client_id for r in batch if r.channel == PRESENCE] == [e.client_id for e in events[:last + 1]]


def test_client_messages_refuses_an_owner_outside_the_batch() -> None:
    mechanism = make_spec("flags2", "rappor", size=6).randomizer
    reports, owner = np.zeros(1, dtype=wire_dtype(mechanism)), np.array([3])
    with pytest.raises(ValueError, match="client 3 of a batch of 2"):
        client_messages(mechanism, reports, owner, n_clients=2)


def test_encode_refuses_a_short_job_key() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        EncodeBatchFn(SPECS, b"short")
