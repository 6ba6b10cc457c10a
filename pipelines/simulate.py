"""Synthetic telemetry produced to Kafka (``esa simulate``; used by the demo).

The population and its truth come from ``pipelines.population``. ``bad_records`` adds samples of each
kind of input the pipeline must dead-letter, so a demo run shows that path too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import numpy as np

from pipelines.population import Population
from schemas import SCHEMA_VERSION, encode_record
from transforms.kafkaio import ensure_topics, produce_records
from transforms.mechanisms.randomness import os_entropy_rng, seeded_rng
from transforms.records import array_to_rows, payload_to_avro
from transforms.spec import AnalysisSpec

LOG = logging.getLogger(__name__)


def telemetry_messages(spec: AnalysisSpec, population: Population) -> Iterator[tuple[bytes, bytes]]:
    """(Kafka key = client id, Avro TelemetryEvent) per client; the category is sent by name."""
    for cid, value, t in zip(population.client_ids, population.values, population.event_times_ms, strict=True):
        record = {"schema_version": SCHEMA_VERSION, "client_id": cid, "event_time": int(t),
                  "metric": spec.metric, "value": spec.categories[int(value)]}
        yield cid.encode(), encode_record("TelemetryEvent", record, check=False)


def bad_records(spec: AnalysisSpec, population: Population, per_kind: int,
                seed: int | None = None) -> dict[str, list[tuple[bytes, bytes]]]:
    """Records each of which the pipeline must dead-letter: {'raw': [...], 'reports': [...]}.

    Per kind, ``per_kind`` of: bytes that are not Avro and an event with an unknown category (raw topic); a
    Report of an unknown spec, of schema_version 99, and with an out-of-domain payload (reports topic); a
    second event from an existing client in the same window (raw topic). Duplicates come one millisecond
    after the original in the same window, so the shuffler keeps the original and the truth is unchanged.
    """
    rng = seeded_rng(seed + 1) if seed is not None else os_entropy_rng()
    raw: list[tuple[bytes, bytes]] = []
    reports: list[tuple[bytes, bytes]] = []
    t0 = int(population.event_times_ms.min())
    valid_payload = payload_to_avro(spec.randomizer, _first_row(spec, rng))

    def report(cid: str, spec_id: str, version: int, payload: tuple) -> bytes:
        return encode_record("Report", {"schema_version": version, "spec_id": spec_id, "channel": 0,
                                        "client_id": cid, "event_time": t0, "payload": payload}, check=False)

    for k in range(per_kind):
        cid = f"bad-client-{k:04d}"
        raw.append((cid.encode(), rng.bytes(int(rng.integers(1, 64)))))
        reports.append((cid.encode(), report(cid, "no-such-analysis@000000000000", SCHEMA_VERSION, valid_payload)))
        reports.append((cid.encode(), report(cid, spec.spec_id, 99, valid_payload)))
        event = {"schema_version": SCHEMA_VERSION, "client_id": cid, "event_time": t0, "metric": spec.metric,
                 "value": "not-a-category"}
        raw.append((cid.encode(), encode_record("TelemetryEvent", event)))
        reports.append((cid.encode(), report(cid, spec.spec_id, SCHEMA_VERSION, _out_of_domain(valid_payload))))
        i = int(rng.integers(len(population)))
        window_end = (population.event_times_ms[i] // population.window_ms + 1) * population.window_ms
        dup = {"schema_version": SCHEMA_VERSION, "client_id": population.client_ids[i],
               "event_time": int(min(population.event_times_ms[i] + 1, window_end - 1)), "metric": spec.metric,
               "value": spec.categories[int(rng.integers(spec.d))]}
        raw.append((population.client_ids[i].encode(), encode_record("TelemetryEvent", dup)))
    return {"raw": raw, "reports": reports}


def _first_row(spec: AnalysisSpec, rng: np.random.Generator) -> tuple:
    return array_to_rows(spec.randomizer.encode(np.zeros(1, dtype=np.int64), rng))[0]


def _out_of_domain(valid: tuple[str, dict]) -> tuple[str, dict]:
    """A payload of the right record type whose value lies outside the mechanism's output domain."""
    name, record = valid[0], dict(valid[1])
    if "value" in record:
        record["value"] = 1 << 40
    elif "length" in record:
        record["length"] += 1
    else:
        record["z"] = 1 << 40
    return name, record


def produce_population(bootstrap: str, spec: AnalysisSpec, population: Population, *, raw_topic: str,
                       reports_topic: str, bad_per_kind: int = 0, partitions: int = 3, seed: int | None = None,
                       progress: Callable[[int, int], None] | None = None) -> dict[str, int]:
    """Create topics and produce the population (then any bad records); returns records per topic."""
    ensure_topics(bootstrap, [raw_topic, reports_topic], partitions=partitions)
    n = produce_records(bootstrap, raw_topic, telemetry_messages(spec, population),
                        progress=(lambda done: progress(done, len(population))) if progress else None)
    produced = {raw_topic: n, reports_topic: 0}
    if bad_per_kind:
        bad = bad_records(spec, population, bad_per_kind, seed)
        produced[raw_topic] += produce_records(bootstrap, raw_topic, bad["raw"])
        produced[reports_topic] += produce_records(bootstrap, reports_topic, bad["reports"])
    LOG.info("produced %s", produced)
    return produced
