"""Synthetic telemetry produced to Kafka (``esa simulate``; used by the demo).

The population and its truth come from ``pipelines.demo.population``. ``bad_records`` adds samples of each
kind of input the pipeline must dead-letter, so a demo run shows that path too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from pipelines.demo.population import Population, avro_value
from schemas import SCHEMA_VERSION, encode_record
from transforms.io.kafka.bounded import ensure_topics, produce_records
from transforms.io.kafka.config import DEFAULT_CLIENT
from transforms.mechanisms.base import channel_count, encode_messages, is_single_message
from transforms.mechanisms.randomness import os_entropy_rng, seeded_rng
from transforms.spec import AnalysisSpec
from transforms.wire.avro_payload import payload_to_avro
from transforms.wire.event_values import client_inputs, event_value
from transforms.wire.rows import PRESENCE, array_to_rows, client_messages, row_channel

LOG = logging.getLogger(__name__)


def telemetry_messages(spec: AnalysisSpec, population: Population) -> Iterator[tuple[bytes, bytes]]:
    """(Kafka key = client id, Avro TelemetryEvent) per client, the value as a device sends it."""
    crowds = population.crowd_ids if population.crowd_ids is not None else [None] * len(population)
    for cid, value, t, crowd in zip(population.client_ids, population.values, population.event_times_ms, crowds,
                                    strict=True):
        record = {"schema_version": SCHEMA_VERSION, "client_id": cid, "event_time": int(t),
                  "metric": spec.metric, "value": avro_value(spec, value), "crowd_id": crowd}
        yield cid.encode(), encode_record("TelemetryEvent", record, check=False)


BAD_VALUES = {  # per kind, an event value its spec must refuse
    "histogram": "not-a-category",
    "kv_mean": {"not-a-key": 0.5},
    "vector_mean": ("esa.telemetry.DenseVector", {"values": [0.5]}),
    "range": -1.5,
    "quantile": -1.5,
    "heavy_hitters": 2.5,
}


def bad_records(spec: AnalysisSpec, population: Population, per_kind: int,
                seed: int | None = None) -> dict[str, list[tuple[bytes, bytes]]]:
    """Records each of which the pipeline must dead-letter: {'raw': [...], 'reports': [...]}.

    Per kind, ``per_kind`` of: bytes that are not Avro and an event with a value outside the spec's domain
    (raw topic); a Report of an unknown spec, of schema_version 99, and with an out-of-domain payload or
    channel (reports topic); a second event from an existing client in the same window (raw topic).
    Duplicates repeat the client's value one millisecond after the original in the same window, so the
    shuffler keeps the original and the truth is unchanged.
    """
    rng = seeded_rng(seed + 1) if seed is not None else os_entropy_rng()
    raw: list[tuple[bytes, bytes]] = []
    reports: list[tuple[bytes, bytes]] = []
    t0 = int(population.event_times_ms.min())
    crowd0 = population.crowd_ids[0] if population.crowd_ids is not None else None
    channel, valid_payload = _valid_message(spec, population)

    def report(cid: str, spec_id: str, version: int, payload: tuple, channel: int = channel) -> bytes:
        return encode_record("Report", {"schema_version": version, "spec_id": spec_id, "crowd_id": crowd0,
                                        "channel": channel, "client_id": cid, "event_time": t0, "payload": payload},
                             check=False)

    for k in range(per_kind):
        cid = f"bad-client-{k:04d}"
        raw.append((cid.encode(), rng.bytes(int(rng.integers(1, 64)))))
        reports.append((cid.encode(), report(cid, "no-such-analysis@000000000000", SCHEMA_VERSION, valid_payload)))
        reports.append((cid.encode(), report(cid, spec.spec_id, 99, valid_payload)))
        event = {"schema_version": SCHEMA_VERSION, "client_id": cid, "event_time": t0, "metric": spec.metric,
                 "value": BAD_VALUES[spec.kind], "crowd_id": crowd0}
        raw.append((cid.encode(), encode_record("TelemetryEvent", event)))
        if is_single_message(spec.randomizer):
            reports.append((cid.encode(), report(cid, spec.spec_id, SCHEMA_VERSION, _out_of_domain(valid_payload))))
        else:
            reports.append((cid.encode(), report(cid, spec.spec_id, SCHEMA_VERSION, valid_payload,
                                                 channel=channel_count(spec.randomizer) + 5)))
        i = int(rng.integers(len(population)))
        window_end = (population.event_times_ms[i] // population.window_ms + 1) * population.window_ms
        dup = {"schema_version": SCHEMA_VERSION, "client_id": population.client_ids[i],
               "event_time": int(min(population.event_times_ms[i] + 1, window_end - 1)), "metric": spec.metric,
               "value": avro_value(spec, population.values[i]),
               "crowd_id": population.crowd_ids[i] if population.crowd_ids is not None else None}
        raw.append((population.client_ids[i].encode(), encode_record("TelemetryEvent", dup)))
    return {"raw": raw, "reports": reports}


def _valid_message(spec: AnalysisSpec, population: Population) -> tuple[int, tuple[str, dict]]:
    """(channel, payload) of one real message of the spec, encoded as a device would from a real value."""
    value = event_value(spec, avro_value(spec, population.values[0]))
    rng = os_entropy_rng()  # any valid message will do: no seed (and no "seeded randomness" warning)
    mechanism = spec.randomizer
    wire, _ = client_messages(mechanism, *encode_messages(mechanism, client_inputs(spec, [value], rng), rng),
                               n_clients=1)
    rows = [r for r in array_to_rows(wire) if row_channel(mechanism, r) != PRESENCE]
    if not rows:
        raise ValueError(f"could not draw a message of {spec.name} to build bad reports from")
    return row_channel(mechanism, rows[0]), payload_to_avro(mechanism, rows[0])


def _out_of_domain(valid: tuple[str, dict]) -> tuple[str, dict]:
    """A payload of the right record type whose value lies outside the mechanism's output domain."""
    name, record = valid[0], dict(valid[1])
    if "length" in record:
        record["length"] += 1
    elif any(isinstance(v, list) for v in record.values()):
        key = next(k for k, v in record.items() if isinstance(v, list))
        record[key] = [*record[key], record[key][0] if record[key] else 0]
    else:
        key = next(k for k, v in record.items() if isinstance(v, int))
        record[key] = 1 << 40
    return name, record


def produce_population(bootstrap: str, spec: AnalysisSpec, population: Population, *, raw_topic: str,
                       reports_topic: str, bad_per_kind: int = 0, partitions: int = 3, seed: int | None = None,
                       progress: Callable[[int, int], None] | None = None, client: str = DEFAULT_CLIENT,
                       client_config: Mapping[str, Any] | None = None) -> dict[str, int]:
    """Create topics and produce the population (then any bad records); returns records per topic.

    ``client_config``: settings (kafka-python names, as ``--kafka_config`` holds them: TLS, SASL) for the
    admin client and every producer, so a secured broker takes the simulation as it takes the jobs."""
    config = dict(client_config or {})
    ensure_topics(bootstrap, [raw_topic, reports_topic], partitions=partitions, client_config=config, client=client)
    n = produce_records(bootstrap, raw_topic, telemetry_messages(spec, population), producer_config=config,
                        client=client, progress=(lambda done: progress(done, len(population))) if progress else None)
    produced = {raw_topic: n, reports_topic: 0}
    if bad_per_kind:
        bad = bad_records(spec, population, bad_per_kind, seed)
        produced[raw_topic] += produce_records(bootstrap, raw_topic, bad["raw"], producer_config=config,
                                               client=client)
        produced[reports_topic] += produce_records(bootstrap, reports_topic, bad["reports"], producer_config=config,
                                                   client=client)
    LOG.info("produced %s", produced)
    return produced
