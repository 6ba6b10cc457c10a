"""Encode stage: raw TelemetryEvent records -> locally randomized reports (docs/architecture.md §2,
docs/mathematics.md §8).

This is what a device does; the Beam version serves edge collectors and simulation. Events are decoded
one by one (each Kafka message is one Avro datum), then randomized in numpy batches. Randomness is a
keyed PRF of (secret job key, topic/partition/offset), so a retried bundle -- whatever its batch
boundaries -- reproduces exactly the same reports: two different randomizations of one event that both
escaped would double its privacy loss.

Permanent randomization ([ESA]'s backstop, ``rappor_fragments``) is not per event: it is a keyed PRF of
(device, metric, backstop parameters, value) under its own sub-key (``transforms.device.backstop``), so
every window, retry and rerun of one device's value reuses one backstop, as the device client's memo does.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.pvalue import TaggedOutput

from schemas import WireFormatError, decode_record
from transforms.device.backstop import is_memoizing, prf_backstops
from transforms.encoder.keys import EncoderKeys
from transforms.io.dead_letters import dead_letter
from transforms.io.kafka.bounded import KafkaRecord
from transforms.mechanisms.base import encode_messages
from transforms.mechanisms.randomness import KeyedRandom, element_id, topic_hash
from transforms.spec import AnalysisSpec, SpecSet
from transforms.state.dead_letters import bounded_letter
from transforms.wire.elements import ReportElement, SourceRef
from transforms.wire.event_values import client_inputs, event_value
from transforms.wire.rows import CHANNEL, array_to_rows, client_messages

LOG = logging.getLogger(__name__)
DEAD = "dead_letters"
NAMESPACE = "esa"
#: Event times a message set can carry (``transforms.trust.message_set``): an event outside them is
#: dead-lettered here, where it is read, instead of failing the job when its set is signed.
MAX_EVENT_TIME_MS = 2**53


class EventElement(NamedTuple):
    """A decoded event with its category index, waiting to be randomized."""

    spec_id: str
    client_id: str
    event_time_ms: int
    value: Any
    source: SourceRef
    original: bytes
    crowd_id: str | None = None


class ReportBatch:
    """One spec's randomized reports of a batch of events, kept as the mechanism's wire array from the randomizer
    to the payload codec (``transforms.encoder.seal``): row ``i`` is a message of ``events[owner[i]]``, one
    event's rows consecutive, in event order. Iterating gives the per-report view (``ReportElement``, payloads
    as wire tuples) for tools and tests; the sealing step never builds it."""

    __slots__ = ("events", "owner", "spec_id", "wire")

    def __init__(self, spec_id: str, wire: np.ndarray, owner: np.ndarray, events: Sequence[EventElement]):
        self.spec_id, self.wire, self.owner, self.events = spec_id, wire, owner, list(events)

    def __len__(self) -> int:
        return len(self.wire)

    def __iter__(self) -> Iterator[ReportElement]:
        channels = self.wire[CHANNEL].tolist() if CHANNEL in self.wire.dtype.names else [0] * len(self.wire)
        for i, channel, row in zip(self.owner.tolist(), channels, array_to_rows(self.wire), strict=True):
            event = self.events[i]
            yield ReportElement(self.spec_id, channel, event.client_id, event.event_time_ms, row, event.source,
                                event.original, event.crowd_id)

    def __getstate__(self) -> tuple:
        return self.spec_id, self.wire, self.owner, self.events

    def __setstate__(self, state: tuple) -> None:
        self.spec_id, self.wire, self.owner, self.events = state

    def sets(self) -> Iterator[tuple[EventElement, np.ndarray]]:
        """Each event with its rows (a slice of the wire array, no copy): one message set each."""
        if not len(self.owner):
            return
        cuts = (np.flatnonzero(np.diff(self.owner)) + 1).tolist()
        for start, stop in zip([0, *cuts], [*cuts, len(self.owner)], strict=True):
            yield self.events[int(self.owner[start])], self.wire[start:stop]


def specs_by_metric(specs: Sequence[AnalysisSpec]) -> dict[str, AnalysisSpec]:
    """Map TelemetryEvent.metric to its spec; two specs on one metric would break record accounting."""
    out: dict[str, AnalysisSpec] = {}
    for spec in specs:
        if spec.metric in out:
            raise ValueError(f"specs {out[spec.metric].name} and {spec.name} both consume metric {spec.metric!r}")
        out[spec.metric] = spec
    return out


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
                if not 0 <= event["event_time"] < MAX_EVENT_TIME_MS:
                    raise ValueError("event_time out of range [0, 2^53) ms")
                value = event_value(spec, event["value"])
                crowd = spec.crowd_of(event.get("crowd_id"))
            except (WireFormatError, ValueError) as err:
                self._dead.inc()
                yield TaggedOutput(DEAD, bounded_letter(dead_letter("decode", str(err), original=record.value,
                                                                    source=source)))
                continue
            except Exception as err:  # no record may stop the job: anything unforeseen is this record's fault
                LOG.exception("decoding failed at %s", source)
                self._dead.inc()
                yield TaggedOutput(DEAD, bounded_letter(dead_letter(
                    "decode", f"internal error on this record ({type(err).__name__})", original=record.value,
                    source=source)))
                continue
            events.append(EventElement(spec.spec_id, event["client_id"], event["event_time"], value, source,
                                       record.value, crowd))
        self._decoded.inc(len(events))
        if events:
            yield events


class EncodeBatchFn(beam.DoFn):
    """A batch of EventElements -> ReportElements through the mechanism's vectorised ``encode``.

    ``keys``: the encoder's sub-keys, or a secret (a 16-byte job key in tests) to derive them from.
    """

    def __init__(self, specs: Sequence[AnalysisSpec], keys: EncoderKeys | bytes):
        self._specs = SpecSet(specs)
        self._keys = keys if isinstance(keys, EncoderKeys) else EncoderKeys.derive(keys)
        self._encoded = Metrics.counter(NAMESPACE, "reports_encoded")
        self._events = Metrics.counter(NAMESPACE, "events_encoded")

    def process(self, batch: list[EventElement]) -> Iterator[ReportBatch]:
        by_spec: dict[str, list[EventElement]] = {}
        for event in batch:
            by_spec.setdefault(event.spec_id, []).append(event)
        for spec_id, events in by_spec.items():
            yield self._encode(self._specs[spec_id], events)

    def _encode(self, spec: AnalysisSpec, events: list[EventElement]) -> ReportBatch:
        rng = KeyedRandom.for_elements(self._keys.randomize, _element_ids(events))
        mechanism = spec.randomizer
        inputs = client_inputs(spec, [e.value for e in events], rng)
        if is_memoizing(mechanism):  # the permanent part: one backstop per (device, value), fresh fragments of it
            backstops = prf_backstops(self._keys.backstop, spec.metric, mechanism, [e.client_id for e in events],
                                      inputs)
            messages = mechanism.fragments_from_backstop(backstops, rng)
        else:
            messages = encode_messages(mechanism, inputs, rng)
        wire, owner = client_messages(mechanism, *messages, n_clients=len(events))
        self._events.inc(len(events))
        self._encoded.inc(len(wire))
        return ReportBatch(spec.spec_id, wire, owner, events)


def _element_ids(events: list[EventElement]) -> np.ndarray:
    """Stable per-event ids from (topic, partition, offset): what the keyed randomness is derived from."""
    topics = {e.source.topic for e in events}
    hashes = {t: topic_hash(t) for t in topics}
    parts = np.fromiter((e.source.partition for e in events), dtype=np.uint64, count=len(events))
    offsets = np.fromiter((e.source.offset for e in events), dtype=np.uint64, count=len(events))
    th = np.fromiter((hashes[e.source.topic] for e in events), dtype=np.uint64, count=len(events))
    return element_id(parts, offsets, th)


class EncodeEvents(beam.PTransform):
    """KafkaRecords (single or batched lists) of TelemetryEvents -> (ReportBatches, dead letters).

    Each output element is one batch of reports of one spec, in arrays (``ReportBatch``). With ``batched_input``
    (lists of records from ``ReadFromKafkaBounded(batched=True)``) each decoded batch is randomized as it is; single
    records are first gathered with ``BatchElements`` so that randomization still runs on numpy batches.
    """

    def __init__(self, specs: Sequence[AnalysisSpec], keys: EncoderKeys | bytes, max_batch_size: int = 4096,
                 batched_input: bool = False):
        super().__init__()
        self._specs, self._max_batch = list(specs), max_batch_size
        self._keys = keys if isinstance(keys, EncoderKeys) else EncoderKeys.derive(keys)  # a bad key fails here
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
        reports = batches | "Randomize" >> beam.ParDo(EncodeBatchFn(self._specs, self._keys))
        return reports, decoded[DEAD]
