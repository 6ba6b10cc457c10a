"""Key-value, vector, range and heavy-hitter events through the real Encode stage: good events become
reports, bad ones are dead-lettered with the reason (keys outside the spec, NaN or infinite values, values
outside the range, vectors of the wrong length, values of the wrong type)."""

from __future__ import annotations

import math

import apache_beam as beam
import numpy as np
import pytest

from schemas import SCHEMA_VERSION, encode_record
from tests.beam_harness import PipelineRun, run_pipeline
from transforms.encoder.encode import EncodeEvents
from transforms.io.kafka.bounded import KafkaRecord
from transforms.mechanisms.randomness import job_key_from_seed
from transforms.spec import AnalysisSpec, spec_from_dict
from transforms.wire.elements import ReportElement

T0 = 500_000 * 3_600_000
KV = spec_from_dict({
    "analysis": {"name": "usage", "kind": "kv_mean"},
    "domain": {"keys": ["a", "b", "c", "d"], "s": 2, "value_range": [0.0, 10.0]},
    "mechanism": {"name": "collision", "epsilon": 2.0}})
VEC = spec_from_dict({"analysis": {"name": "vec", "kind": "vector_mean"},
                      "domain": {"dimension": 3, "value_range": [-1.0, 1.0]},
                      "mechanism": {"name": "ldp_sgd", "epsilon": 2.0}})
RANGE = spec_from_dict({"analysis": {"name": "lat", "kind": "range"},
                        "domain": {"bits": 8, "value_range": [0.0, 100.0]},
                        "mechanism": {"name": "dyadic_range", "epsilon": 2.0}})
HH = spec_from_dict({"analysis": {"name": "url", "kind": "heavy_hitters"}, "domain": {"bits": 32},
                     "mechanism": {"name": "prefix_heavy_hitters", "epsilon": 4.0}})
SPECS: list[AnalysisSpec] = [KV, VEC, RANGE, HH]
DENSE = "esa.telemetry.DenseVector"

GOOD = [
    ("usage", {"a": 1.5, "c": 10.0}), ("usage", {}), ("usage", {"d": 0.0}),
    ("vec", (DENSE, {"values": [0.5, -1.0, 0.0]})),
    ("lat", 0.0), ("lat", 99.9), ("lat", 100.0), ("lat", 42),
    ("url", "https://example.org/a"), ("url", 12345),
]
BAD = [
    ("usage", {"z": 1.0}, "unknown key 'z'"),
    ("usage", {"a": math.nan}, "not finite"),
    ("usage", {"a": math.inf}, "not finite"),
    ("usage", {"a": 11.0}, "outside value_range"),
    ("usage", {"a": 1.0, "b": 2.0, "c": 3.0}, "more than max_keys = 2"),
    ("usage", "a", "cannot feed kv_mean analysis usage"),
    ("vec", (DENSE, {"values": [0.5, 0.5]}), "vector of length 2, expected 3"),
    ("vec", (DENSE, {"values": [0.5, math.nan, 0.0]}), "vector entry 1 is not finite"),
    ("vec", (DENSE, {"values": [0.5, 0.0, -math.inf]}), "vector entry 2 is not finite"),
    ("vec", (DENSE, {"values": [0.5, 2.0, 0.0]}), "vector entry 1 = 2.0 outside the value_range"),
    ("vec", {"a": 1.0}, "cannot feed vector_mean analysis vec"),
    ("lat", -0.5, "outside the value_range"),
    ("lat", math.nan, "is not finite"),
    ("lat", "fast", "cannot feed range analysis lat"),
    ("url", 1.5, "cannot feed heavy_hitters analysis url"),
]


def record(offset: int, metric: str, value: object) -> KafkaRecord:
    event = {"schema_version": SCHEMA_VERSION, "client_id": f"c{offset}", "event_time": T0 + offset,
             "metric": metric, "value": value, "crowd_id": None}
    return KafkaRecord("telemetry", 0, offset, T0, None, encode_record("TelemetryEvent", event))


@pytest.fixture(scope="module")
def encoded(tmp_path_factory: pytest.TempPathFactory) -> PipelineRun:
    records = [record(i, m, v) for i, (m, v) in enumerate(GOOD)]
    records += [record(100 + i, m, v) for i, (m, v, _) in enumerate(BAD)]

    def build(p: beam.Pipeline) -> dict[str, beam.PCollection]:
        reports, dead = p | beam.Create(records) | EncodeEvents(SPECS, job_key_from_seed(3))
        return {"reports": reports, "dead": dead}

    return run_pipeline(tmp_path_factory.mktemp("numeric"), build)


def test_good_events_become_reports_of_their_spec(encoded: PipelineRun) -> None:
    reports = encoded.values("reports")
    assert all(isinstance(r, ReportElement) for r in reports)
    offsets = {r.source.offset for r in reports}
    assert offsets == set(range(len(GOOD)))  # every good event, none of the bad ones
    by_metric = {s.metric: s.spec_id for s in SPECS}
    for r in reports:
        assert r.spec_id == by_metric[GOOD[r.source.offset][0]]
    assert encoded.count("events_encoded") == len(GOOD)


def test_bad_events_are_dead_lettered_with_the_reason(encoded: PipelineRun) -> None:
    dead = {d["offset"]: d for d in encoded.values("dead")}
    assert set(dead) == {100 + i for i in range(len(BAD))}
    for i, (_, _, reason) in enumerate(BAD):
        letter = dead[100 + i]
        assert letter["stage"] == "decode"
        assert reason in letter["reason"], (BAD[i], letter["reason"])
        assert letter["original"] is not None


def test_range_values_land_in_their_bucket() -> None:
    from transforms.wire.event_values import event_value

    assert [event_value(RANGE, v) for v in (0.0, 99.9, 100.0, 50.0)] == [0, 255, 255, 128]
    assert np.all(np.diff([event_value(RANGE, v) for v in np.linspace(0, 100, 50)]) >= 0)
