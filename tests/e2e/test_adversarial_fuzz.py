"""Properties (hypothesis): the DoFns that read each job's input topic never fail on what an attacker writes.

``tests/trust`` checks the wire decoders alone; here the job-path DoFns themselves take arbitrary bytes
(encode: DecodeEventsFn, then randomize and seal whatever decodes; shuffle: IngressFn; analyze:
DecodeReleaseFn) and every record must come out as exactly one outcome -- used, or dead-lettered with its
position and a bounded letter -- never as an exception that would fail the run.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.demo.population import avro_value
from pipelines.enrolment import enrol_simulated
from schemas import SCHEMA_VERSION, encode_record, load_schema
from tests.e2e.adversary import HOUR_MS, histogram_spec, opened
from transforms.analyzer.releases import DecodeReleaseFn
from transforms.encoder.encode import DecodeEventsFn, EncodeBatchFn
from transforms.encoder.seal import SealSetsFn
from transforms.io.kafka.bounded import KafkaRecord
from transforms.shuffler.elements import TimePolicy
from transforms.shuffler.ingress import IngressFn
from transforms.state.dead_letters import MAX_ORIGINAL_BYTES, MAX_REASON_CHARS, bounded_letter
from transforms.state.prior_runs import PriorRuns

SPEC = histogram_spec("fuzz")
_KEYS = tempfile.TemporaryDirectory(prefix="esa-adv-fuzz-")  # removed at interpreter exit
KEYS = Path(_KEYS.name) / "keys"
enrol_simulated(KEYS, ["c1"])
NOW = 1_000 * HOUR_MS
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def event(client: str = "c1", t: int = NOW - HOUR_MS, value: object = None, metric: str | None = None) -> bytes:
    return encode_record("TelemetryEvent", {
        "schema_version": SCHEMA_VERSION, "client_id": client, "event_time": t, "metric": metric or SPEC.metric,
        "value": avro_value(SPEC, 1) if value is None else value, "crowd_id": None}, check=False)


VALID_EVENT = event()


def mutated(valid: bytes) -> st.SearchStrategy[bytes]:
    """A valid encoding with a few bytes flipped, cut and a tail appended (reaches past the header)."""
    flips = st.lists(st.tuples(st.integers(0, len(valid) - 1), st.integers(1, 255)), max_size=4)

    def apply(edits: list[tuple[int, int]], cut: int | None, tail: bytes) -> bytes:
        data = bytearray(valid)
        for i, x in edits:
            data[i] ^= x
        return bytes(data[:cut]) + tail
    return st.builds(apply, flips, st.one_of(st.none(), st.integers(0, len(valid))), st.binary(max_size=8))


def anything(name: str, valid: bytes) -> st.SearchStrategy[bytes]:
    return st.one_of(st.binary(max_size=300), st.binary(max_size=200).map(lambda b: load_schema(name).header + b),
                     mutated(valid))


def outcomes(fn, values: list[bytes]) -> tuple[list, list]:
    """Run a DoFn on one batch of records at offsets 0..n-1: (used outputs, dead letters)."""
    records = [KafkaRecord("t", 0, i, 0, None, v) for i, v in enumerate(values)]
    used, dead = [], []
    for out in fn.process(records):
        if getattr(out, "tag", None) == "dead_letters":
            dead.append(out.value)
        elif getattr(out, "tag", None) is None:
            used.append(out)
    return used, dead


def assert_letters(dead: list[dict], n: int) -> None:
    assert sorted(d["offset"] for d in dead) == sorted(set(d["offset"] for d in dead))  # one letter per record
    assert all(d["topic"] == "t" and 0 <= d["offset"] < n for d in dead)
    assert all(len(d["reason"]) <= MAX_REASON_CHARS for d in dead)
    assert all(d["original"] is None or len(d["original"]) <= MAX_ORIGINAL_BYTES for d in dead)


@SETTINGS
@given(st.lists(anything("TelemetryEvent", VALID_EVENT), min_size=1, max_size=4))
def test_encode_job_reads_any_bytes(values: list[bytes]) -> None:
    decode = DecodeEventsFn([SPEC])
    decode.setup()
    used, dead = outcomes(decode, values)
    events = [e for batch in used for e in batch]
    assert len(events) + len(dead) == len(values)
    assert_letters(dead, len(values))
    seal_all(events)


def seal_all(events: list) -> None:
    """Randomize and sign what decoded: a decoded event must never fail the later steps of the job."""
    if not events:
        return
    encode = EncodeBatchFn([SPEC], b"k" * 16)
    sealer = SealSetsFn([SPEC], str(KEYS))
    sealer.setup()
    for reports in encode.process(events):
        for batch in sealer.process(reports):
            assert all(opened(KEYS, value).spec_id == SPEC.spec_id for _, value in batch)


@SETTINGS
@given(st.integers(-(2**63), 2**63 - 1), st.text(max_size=30), st.text(min_size=1, max_size=30))
def test_any_event_time_category_or_client_is_encoded_or_dead_lettered(t: int, category: str, client: str) -> None:
    decode = DecodeEventsFn([SPEC])
    decode.setup()
    values = [event(client, t), event(client, t, value=category)]
    used, dead = outcomes(decode, values)
    events = [e for batch in used for e in batch]
    assert len(events) + len(dead) == 2
    in_range = 0 <= t < 2**53
    known = category in {avro_value(SPEC, i) for i in range(SPEC.d)}
    assert len(events) == int(in_range) + int(in_range and known)
    seal_all(events)


@SETTINGS
@given(st.lists(st.one_of(st.binary(max_size=300), st.binary(max_size=200).map(
    lambda b: load_schema("MessageSet").header + b)), min_size=1, max_size=4))
def test_shuffle_ingress_reads_any_bytes(values: list[bytes]) -> None:
    ingress = IngressFn([SPEC], str(KEYS / "registry" / "devices.parquet"), PriorRuns(),
                        TimePolicy(NOW, 30 * 86_400_000, HOUR_MS), keys_dir=str(KEYS))
    ingress.setup()
    used, dead = outcomes(ingress, values)
    assert not used and len(dead) == len(values)  # nothing arbitrary authenticates
    assert_letters(dead, len(values))


@SETTINGS
@given(st.lists(st.one_of(st.binary(max_size=300), st.binary(max_size=200).map(
    lambda b: load_schema("ReleaseBatch").header + b)), min_size=1, max_size=4))
def test_analyzer_reads_any_bytes(values: list[bytes]) -> None:
    decoder = DecodeReleaseFn([SPEC], str(KEYS), PriorRuns())
    decoder.setup()
    used, dead = outcomes(decoder, values)
    assert not used and len(dead) == len(values)
    assert_letters(dead, len(values))
    assert all(d["original"] is None for d in dead)  # the analyst's side keeps no bytes


def test_dead_letter_reasons_are_capped() -> None:
    letter = bounded_letter({"schema_version": SCHEMA_VERSION, "stage": "decode", "reason": "r" * 10**6,
                             "original": b"x" * 10**6})
    assert len(letter["reason"]) <= MAX_REASON_CHARS and "1000000 characters" in letter["reason"]
    assert len(letter["original"]) == MAX_ORIGINAL_BYTES and letter["original_length"] == 10**6
    assert bounded_letter(letter) == letter  # idempotent
