"""Encode stage: raw TelemetryEvent records -> locally randomized reports (DESIGN.md §1, §6).

This is what a device does; the Beam version serves edge collectors and simulation. Events are decoded
one by one (each Kafka message is one Avro datum), then randomized in numpy batches. Randomness is a
keyed PRF of (secret job key, topic/partition/offset), so a retried bundle -- whatever its batch
boundaries -- reproduces exactly the same reports: two different randomizations of one event that both
escaped would double its privacy loss.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.pvalue import TaggedOutput

from schemas import WireFormatError, decode_record
from transforms.kafkaio import KafkaRecord
from transforms.mechanisms.randomness import KeyedRandom, element_id, topic_hash
from transforms.records import ReportElement, SourceRef, array_to_rows, dead_letter, payload_from_avro
from transforms.spec import AnalysisSpec

LOG = logging.getLogger(__name__)
DEAD = "dead_letters"
NAMESPACE = "esa"


class EventElement(NamedTuple):
    """A decoded event with its category index, waiting to be randomized."""

    spec_id: str
    client_id: str
    event_time_ms: int
    value: int
    source: SourceRef
    original: bytes


def specs_by_metric(specs: Sequence[AnalysisSpec]) -> dict[str, AnalysisSpec]:
    """Map TelemetryEvent.metric to its spec; two specs on one metric would break record accounting."""
    out: dict[str, AnalysisSpec] = {}
    for spec in specs:
        if spec.metric in out:
            raise ValueError(f"specs {out[spec.metric].name} and {spec.name} both consume metric {spec.metric!r}")
        out[spec.metric] = spec
    return out


def category_of(spec: AnalysisSpec, value: Any) -> int:
    """The category index of an event value, or ``ValueError`` saying why it is not in the domain."""
    if isinstance(value, str):
        index = spec.category_index.get(value)
        if index is None:
            raise ValueError(f"category {value!r} is not in the domain of {spec.name}")
        return index
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < spec.d:
            raise ValueError(f"category index {value} outside [0, {spec.d}) of {spec.name}")
        return value
    kind = value[0].rsplit(".", 1)[-1] if isinstance(value, tuple) else type(value).__name__
    raise ValueError(f"a {kind} value cannot feed histogram {spec.name}")


class DecodeEventsFn(beam.DoFn):
    """KafkaRecord -> EventElement; anything unusable goes to the dead-letter output with the reason."""

    def __init__(self, specs: Sequence[AnalysisSpec]):
        self._specs = list(specs)
        self._by_metric: dict[str, AnalysisSpec] = {}
        self._dead = Metrics.counter(NAMESPACE, "dead_lettered")
        self._decoded = Metrics.counter(NAMESPACE, "events_decoded")

    def setup(self) -> None:
        self._by_metric = specs_by_metric(self._specs)

    def process(self, element: KafkaRecord | list[KafkaRecord]) -> Iterator[Any]:
        events: list[EventElement] = []
        for record in element if isinstance(element, list) else [element]:
            source = SourceRef(record.topic, record.partition, record.offset)
            try:
                event = decode_record("TelemetryEvent", record.value)
                spec = self._by_metric.get(event["metric"])
                if spec is None:
                    raise ValueError(f"no analysis spec consumes metric {event['metric']!r}")
                if not event["client_id"]:
                    raise ValueError("event without client_id: the shuffler cannot authenticate it")
                value = category_of(spec, event["value"])
            except (WireFormatError, ValueError) as err:
                self._dead.inc()
                yield TaggedOutput(DEAD, dead_letter("decode", str(err), original=record.value, source=source))
                continue
            events.append(EventElement(spec.spec_id, event["client_id"], event["event_time"], value, source,
                                       record.value))
        self._decoded.inc(len(events))
        if events:
            yield events


class EncodeBatchFn(beam.DoFn):
    """A batch of EventElements -> ReportElements through the mechanism's vectorised ``encode``."""

    def __init__(self, specs: Sequence[AnalysisSpec], job_key: bytes):
        if len(job_key) != 16:
            raise ValueError("job_key must be 16 bytes (use randomness.job_key_from_entropy())")
        self._specs = {s.spec_id: s for s in specs}
        self._job_key = job_key
        self._encoded = Metrics.counter(NAMESPACE, "reports_encoded")

    def process(self, batch: list[EventElement]) -> Iterator[list[ReportElement]]:
        by_spec: dict[str, list[EventElement]] = {}
        for event in batch:
            by_spec.setdefault(event.spec_id, []).append(event)
        for spec_id, events in by_spec.items():
            yield list(self._encode(self._specs[spec_id], events))

    def _encode(self, spec: AnalysisSpec, events: list[EventElement]) -> Iterable[ReportElement]:
        values = np.fromiter((e.value for e in events), dtype=np.int64, count=len(events))
        ids = _element_ids(events)
        reports = spec.randomizer.encode(values, KeyedRandom.for_elements(self._job_key, ids))
        self._encoded.inc(len(events))
        for event, row in zip(events, array_to_rows(reports), strict=True):
            yield ReportElement(spec.spec_id, 0, event.client_id, event.event_time_ms, row, event.source,
                                event.original)


def _element_ids(events: list[EventElement]) -> np.ndarray:
    """Stable per-event ids from (topic, partition, offset): what the keyed randomness is derived from."""
    topics = {e.source.topic for e in events}
    hashes = {t: topic_hash(t) for t in topics}
    parts = np.fromiter((e.source.partition for e in events), dtype=np.uint64, count=len(events))
    offsets = np.fromiter((e.source.offset for e in events), dtype=np.uint64, count=len(events))
    th = np.fromiter((hashes[e.source.topic] for e in events), dtype=np.uint64, count=len(events))
    return element_id(parts, offsets, th)


class EncodeEvents(beam.PTransform):
    """KafkaRecords (single or batched lists) of TelemetryEvents -> (lists of ReportElements, dead letters).

    Each output element is one batch of reports of one spec. With ``batched_input`` (lists of records from
    ``ReadFromKafkaBounded(batched=True)``) each decoded batch is randomized as it is; single records are
    first gathered with ``BatchElements`` so that randomization still runs on numpy batches.
    """

    def __init__(self, specs: Sequence[AnalysisSpec], job_key: bytes, max_batch_size: int = 4096,
                 batched_input: bool = False):
        super().__init__()
        self._specs, self._job_key, self._max_batch = list(specs), job_key, max_batch_size
        self._batched_input = batched_input

    def expand(self, records: beam.PCollection) -> tuple[beam.PCollection, beam.PCollection]:
        decoded = records | "DecodeEvents" >> beam.ParDo(DecodeEventsFn(self._specs)).with_outputs(
            DEAD, main="events")
        batches = decoded.events
        if not self._batched_input:
            batches = (
                batches
                | "Unbatch" >> beam.FlatMap(lambda events: events)
                | "Batch" >> beam.BatchElements(min_batch_size=min(64, self._max_batch),
                                                max_batch_size=self._max_batch)
            )
        reports = batches | "Randomize" >> beam.ParDo(EncodeBatchFn(self._specs, self._job_key))
        return reports, decoded[DEAD]


class DecodeReportsFn(beam.DoFn):
    """KafkaRecord of a device-encoded Report -> ReportElement, validating spec, version and domain."""

    def __init__(self, specs: Sequence[AnalysisSpec]):
        self._specs = {s.spec_id: s for s in specs}
        self._dead = Metrics.counter(NAMESPACE, "dead_lettered")
        self._decoded = Metrics.counter(NAMESPACE, "reports_decoded")

    def process(self, element: KafkaRecord | list[KafkaRecord]) -> Iterator[Any]:
        reports: list[ReportElement] = []
        for record in element if isinstance(element, list) else [element]:
            source = SourceRef(record.topic, record.partition, record.offset)
            spec_id = None
            try:
                report = decode_record("Report", record.value)
                spec_id = report["spec_id"]
                spec = self._specs.get(spec_id)
                if spec is None:
                    raise ValueError(f"unknown spec_id {spec_id!r} (known: {', '.join(sorted(self._specs))})")
                if report["channel"] != 0:
                    raise ValueError(f"channel {report['channel']} does not exist for {spec.mechanism}")
                if not report["client_id"]:
                    raise ValueError("report without client_id: the shuffler cannot authenticate it")
                row = payload_from_avro(spec.randomizer, report["payload"])
            except (WireFormatError, ValueError) as err:
                self._dead.inc()
                yield TaggedOutput(DEAD, dead_letter("shuffle", str(err), original=record.value, source=source,
                                                     spec_id=spec_id))
                continue
            reports.append(ReportElement(spec_id, report["channel"], report["client_id"], report["event_time"], row,
                                         source, record.value))
        self._decoded.inc(len(reports))
        if reports:
            yield reports


class DecodeReports(beam.PTransform):
    """KafkaRecords (single or batched lists) of Reports -> (lists of ReportElements, dead letters)."""

    def __init__(self, specs: Sequence[AnalysisSpec]):
        super().__init__()
        self._specs = list(specs)

    def expand(self, records: beam.PCollection) -> tuple[beam.PCollection, beam.PCollection]:
        decoded = records | "DecodeReports" >> beam.ParDo(DecodeReportsFn(self._specs)).with_outputs(
            DEAD, main="reports")
        return decoded.reports, decoded[DEAD]
