"""Analyzer ingress: signed release batches -> whole, verified, opened releases -> count accumulators.

The analyzer trusts nothing on its input topic. A batch is used only if it decodes, its shuffler
signature verifies under a known shuffler key, its release id is the one its routing fields imply, and
it belongs to a spec this analyzer serves. A release is used only *whole*: every batch 0..count-1
present, with one header, and as many messages as the header says; a release missing batches is held
(the driver resumes at its earliest batch next run), a release whose window is already in the
analyst's ledger is a replay (re-read batches below the read that analyzed it are skipped), and a
release claiming fewer sets than the spec's ``min_clients`` is refused. Each message is then opened
with the analyzer's private key (the routing fields are its associated data, so a message moved to
another crowd, window or channel does not open) and its payload validated against the mechanism's
domain; a message that fails is dead-lettered on its own (counts only: no bytes reach the analyst).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.pvalue import TaggedOutput

from transforms.analyze import CrowdAccumulator
from transforms.ingress import PriorRuns, partition_key
from transforms.kafkaio import KafkaRecord
from transforms.parallel import map_ordered
from transforms.records import SourceRef, count_clients, dead_letter, decode_payload, rows_to_array
from transforms.spec import AnalysisSpec

LOG = logging.getLogger(__name__)
NAMESPACE = "esa"
DEAD = "dead_letters"
HELD = "held"


class BatchElement(NamedTuple):
    """A verified release batch and where it was read."""

    batch: Any  # transforms.trust.release.ReleaseBatch
    source: SourceRef


class OpenedRelease(NamedTuple):
    """A whole release, opened and folded into the mechanism's count arrays."""

    release_id: str
    spec_id: str
    crowd_id: str | None
    window_end_ms: int
    n_sets: int
    accumulator: CrowdAccumulator
    source_ends: dict[str, int]  # per partition: one past the last batch of this release that was read


def _dead(stage: str, reason: str, source: SourceRef, spec_id: str | None = None) -> TaggedOutput:
    return TaggedOutput(DEAD, dead_letter(stage, reason, source=source, spec_id=spec_id))


class DecodeReleaseFn(beam.DoFn):
    """KafkaRecords -> (release id, BatchElement) for verified batches; dead letters (no bytes) otherwise."""

    def __init__(self, specs: Sequence[AnalysisSpec], keys_dir: str, prior: PriorRuns):
        self._specs = {s.spec_id: s for s in specs}
        self._keys_dir, self._prior = keys_dir, prior
        self._dead = Metrics.counter(NAMESPACE, "dead_lettered")
        self._reread = Metrics.counter(NAMESPACE, "records_reread")
        self._replayed = Metrics.counter(NAMESPACE, "batches_replayed")

    def setup(self) -> None:
        from transforms.trust.keys import load_shuffler_verifiers

        self._verifiers = load_shuffler_verifiers(Path(self._keys_dir))

    def process(self, element: KafkaRecord | list[KafkaRecord]) -> Iterator[Any]:
        for record in element if isinstance(element, list) else [element]:
            source = SourceRef(record.topic, record.partition, record.offset)
            pkey = partition_key(record.topic, record.partition)
            seen_before = record.offset < self._prior.processed_until.get(pkey, 0)
            try:
                batch, problem = self._admit(record.value)
            except Exception as err:
                batch, problem = None, f"internal error on this record ({type(err).__name__})"
                LOG.exception("release decoding failed at %s offset %d", pkey, record.offset)
            if problem is None:
                window = (batch.spec_id, batch.crowd_id, batch.window_end_ms)
                if self._prior.replayed(window, pkey, record.offset):
                    released = self._prior.released[window]
                    if record.offset < released.get(pkey, 0) or seen_before:
                        self._reread.inc()
                        continue
                    self._replayed.inc()
                    problem = "replayed release: this window was already analyzed"
            if problem is not None:
                if seen_before:
                    self._reread.inc()
                else:
                    self._dead.inc()
                    yield _dead("analyze", problem, source)
                continue
            yield batch.release_id, BatchElement(batch, source)

    def _admit(self, value: bytes | None) -> tuple[Any, str | None]:
        from schemas import WireFormatError
        from transforms.trust.message_set import AuthError
        from transforms.trust.release import decode_release_batch, release_id_of, verify_release_batch

        if value is None:
            return None, "empty record"
        try:
            batch = decode_release_batch(value)
        except WireFormatError as err:
            return None, f"malformed release batch: {err.reason}"
        try:
            verify_release_batch(batch, self._verifiers)
        except AuthError as err:
            return None, f"unauthenticated release batch: {err}"
        spec = self._specs.get(batch.spec_id)
        if spec is None:
            return None, "release of a spec this analyzer does not serve"
        if batch.release_id != release_id_of(batch.spec_id, batch.crowd_id, batch.window_end_ms):
            return None, "release id does not match its spec, crowd and window"
        if batch.window_end_ms % (spec.window_seconds * 1000):
            return None, f"window_end is not the end of a {spec.window_seconds} s window"
        if (batch.crowd_id is None) != (spec.crowd.partition is None):
            return None, "crowd_id does not fit the spec's crowd partition"
        return batch, None


class AssembleReleaseFn(beam.DoFn):
    """(release id, [BatchElement]) -> OpenedRelease if whole; held offsets if incomplete; dead otherwise."""

    def __init__(self, specs: Sequence[AnalysisSpec], keys_dir: str, threads: int = 0):
        self._specs = {s.spec_id: s for s in specs}
        self._keys_dir = keys_dir
        self._threads = threads  # messages of a batch are opened on this many threads (0: one per core)
        self._dead = Metrics.counter(NAMESPACE, "dead_lettered")
        self._held = Metrics.counter(NAMESPACE, "batches_held")
        self._duplicates = Metrics.counter(NAMESPACE, "batches_duplicate")
        self._messages_dead = Metrics.counter(NAMESPACE, "messages_dead_lettered")
        self._analyzed = Metrics.counter(NAMESPACE, "batches_analyzed")
        self._messages = Metrics.counter(NAMESPACE, "messages_analyzed")

    def setup(self) -> None:
        from transforms.trust.keys import load_analyzer_private

        self._private = load_analyzer_private(Path(self._keys_dir))

    def process(self, keyed: tuple[str, Iterable[BatchElement]]) -> Iterator[Any]:
        release_id, elements = keyed
        items = sorted(elements, key=lambda e: (e.batch.batch_index, tuple(e.source)))
        first = items[0].batch
        header = _header(first)
        by_index: dict[int, BatchElement] = {}
        for item in items:
            previous = by_index.get(item.batch.batch_index)
            if _header(item.batch) != header or (previous and previous.batch.signature != item.batch.signature):
                yield from self._refuse(items, "inconsistent release: batches disagree on its header or content")
                return
            if previous is not None:
                self._duplicates.inc()
                continue
            by_index[item.batch.batch_index] = item
        if len(by_index) < first.batch_count:
            self._held.inc(len(by_index))
            earliest: dict[str, int] = {}
            for item in by_index.values():
                pkey = partition_key(item.source.topic, item.source.partition)
                earliest[pkey] = min(earliest.get(pkey, item.source.offset), item.source.offset)
            for pkey, offset in earliest.items():
                yield TaggedOutput(HELD, (pkey, offset))
            return
        spec = self._specs[first.spec_id]
        whole = [by_index[i] for i in range(first.batch_count)]
        if sum(len(e.batch.messages) for e in whole) != first.n_messages:
            yield from self._refuse(whole, "partial release: fewer messages than its header claims")
            return
        if first.n_sets < spec.crowd.min_clients:
            yield from self._refuse(whole, f"release of {first.n_sets} sets, below the spec's minimum crowd "
                                           f"({spec.crowd.min_clients})")
            return
        accumulator = self._open(spec, first, whole)
        ends: dict[str, int] = {}
        for item in items:  # duplicate copies too: they were read (and counted) by the run that sealed it
            pkey = partition_key(item.source.topic, item.source.partition)
            ends[pkey] = max(ends.get(pkey, 0), item.source.offset + 1)
        self._analyzed.inc(len(whole))
        yield OpenedRelease(release_id, first.spec_id, first.crowd_id, first.window_end_ms, first.n_sets,
                            accumulator, ends)
        for item in whole:
            yield from self._message_dead_letters(item)

    def _refuse(self, items: Sequence[BatchElement], reason: str) -> Iterator[TaggedOutput]:
        for item in items:
            self._dead.inc()
            yield _dead("analyze", reason, item.source, item.batch.spec_id)

    def _open(self, spec: AnalysisSpec, header: Any, whole: Sequence[BatchElement]) -> CrowdAccumulator:
        from transforms.trust.sealing import SealError, associated_data, open_sealed

        mechanism = spec.randomizer
        accumulator = CrowdAccumulator(mechanism.new_accumulator(), deleted=header.deleted)
        self._failures: list[tuple[SourceRef, str]] = []

        def open_one(message: Any) -> tuple[Any, str | None]:
            ad = associated_data(spec.spec_id, header.crowd_id, header.window_end_ms, message.channel)
            try:
                return decode_payload(mechanism, open_sealed(self._private, message.sealed, ad), message.channel), None
            except (SealError, ValueError) as err:
                return None, f"unusable message: {err}"

        for item in whole:
            rows = []
            for row, problem in map_ordered(open_one, item.batch.messages, self._threads):
                if problem is None:
                    rows.append(row)
                else:
                    self._failures.append((item.source, problem))
            if rows:
                reports = rows_to_array(mechanism, rows)
                messages, clients = count_clients(mechanism, reports)
                accumulator.counts.add(messages, clients)
                accumulator.messages += len(reports)
            self._messages.inc(len(rows))
        return accumulator

    def _message_dead_letters(self, item: BatchElement) -> Iterator[TaggedOutput]:
        for source, reason in [f for f in self._failures if f[0] == item.source]:
            self._messages_dead.inc()
            yield _dead("analyze", reason, source)


def _header(batch: Any) -> tuple:
    return (batch.release_id, batch.spec_id, batch.crowd_id, batch.window_end_ms, batch.batch_count, batch.n_sets,
            batch.n_messages, batch.deleted)


def released_lookup(entries: Iterable[Any]) -> Mapping[tuple[str, str | None, int], Mapping[str, int]]:
    """Ledger entries -> the (spec, crowd, window) -> source ends map the ingress steps consult."""
    return {(e.key.spec_id, e.key.crowd_id, e.key.window_end_ms): dict(e.source_ends) for e in entries}


def prior_runs(state: Any, entries: Iterable[Any], run_key: str) -> PriorRuns:
    """What the ingress steps must know of earlier runs (``state``: the job's saved RunState).

    An entry sealed under this ``run_key`` *after* the state was last saved is a crashed attempt of this
    very run (same input range, state never saved): its window is redone rather than skipped as re-read,
    so the rerun reproduces the identical release, publishes it if need be and counts its records once.
    """
    entries = list(entries)
    redo = frozenset((e.key.spec_id, e.key.crowd_id, e.key.window_end_ms) for e in entries
                     if e.run_key == run_key and e.sealed_at_ms >= state.updated_at_ms)
    clocks = {pkey: tuple((int(end), int(clock)) for end, clock in entries_)
              for pkey, entries_ in getattr(state, "read_clock", {}).items()}
    return PriorRuns(processed_until=dict(state.processed_until), released=released_lookup(entries), redo=redo,
                     read_clock=clocks)
