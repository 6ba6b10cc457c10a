"""Analyzer ingress: signed release batches -> whole, verified, opened releases -> count accumulators.

The analyzer trusts nothing on its input topic. A batch is used only if it decodes, its shuffler
signature verifies under a known shuffler key, its release id is the one its routing fields imply, and
it belongs to a spec this analyzer serves. A release is used only *whole*: every batch 0..count-1
present, with one header, and as many messages as the header says; a release missing batches is held
(the driver resumes at its earliest batch next run), a release whose window is already in the
analyst's ledger is a replay (re-read batches below the read that analyzed it are skipped), and a
release claiming fewer sets than the spec's ``min_clients`` (plus its blanket's dummies) is refused. Each
message is then opened with the analyzer's private key (the routing fields are its associated data, so
a message moved to another crowd, window or channel does not open) and its payload validated against the
mechanism's domain; a message that fails is dead-lettered on its own (counts only: no bytes reach the analyst).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.pvalue import TaggedOutput

from schemas import WireFormatError
from transforms.analyzer.estimates import CrowdAccumulator
from transforms.io.dead_letters import dead_letter
from transforms.io.kafka.bounded import KafkaRecord
from transforms.runtime.worker_gc import tune_worker_gc
from transforms.spec import AnalysisSpec, SpecSet
from transforms.state.prior_runs import PriorRuns, partition_key
from transforms.trust.keys import KEY_ID_PATTERN, load_analyzer_private, load_shuffler_verifiers
from transforms.trust.message_set import AuthError
from transforms.trust.release import decode_release_batch, release_id_of, verify_release_batch
from transforms.trust.sealing import associated_data, open_many
from transforms.wire.elements import SourceRef
from transforms.wire.payload_batch import decode_payload_array
from transforms.wire.rows import count_clients

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
    n_sets: int  # real sets: the header's count less the spec's blanket dummies
    accumulator: CrowdAccumulator
    source_ends: dict[str, int]  # per partition: one past the last batch of this release that was read


def _dead(stage: str, reason: str, source: SourceRef, spec_id: str | None = None) -> TaggedOutput:
    return TaggedOutput(DEAD, dead_letter(stage, reason, source=source, spec_id=spec_id))


#: how long a batch signed by a shuffler key this analyzer does not hold yet is held (and retried by every run)
#: before it is dead-lettered: the time an operator has to distribute a rotated key's public file
KEY_WAIT_MS = 24 * 3_600_000
UNKNOWN_KEY = "unknown shuffler key id"
ROTATED = "held: signed with a shuffler key id not distributed to this analyzer yet"


class DecodeReleaseFn(beam.DoFn):
    """KafkaRecords -> (release id, BatchElement) for verified batches; dead letters (no bytes) otherwise.

    A batch signed with a shuffler key id this analyzer does not know yet is *held* (its offset leaves on
    ``HELD``, so the resume offset never passes it and every run retries it) while its record is younger than
    ``key_wait_ms`` on the run's clock and its key id is well formed and dated no earlier than the newest key
    the analyzer holds (what a rotation creates): a rotated shuffler key may reach the shuffler before its
    public file reaches the analyzer, and dead-lettering those batches lost their windows for good. Only the
    shuffler's principal may write the shuffled topic (broker ACLs), so a hold cannot be forced by anyone
    else; after the wait, or for any other unknown id, the batch is dead-lettered as before.
    """
    def __init__(self, specs: Sequence[AnalysisSpec], keys_dir: str, prior: PriorRuns, now_ms: int | None = None,
                 key_wait_ms: int = KEY_WAIT_MS):
        self._specs = SpecSet(specs)
        self._keys_dir, self._prior = keys_dir, prior
        self._now_ms, self._key_wait_ms = now_ms, key_wait_ms
        self._held = Metrics.counter(NAMESPACE, "batches_held")
        self._dead = Metrics.counter(NAMESPACE, "dead_lettered")
        self._reread = Metrics.counter(NAMESPACE, "records_reread")
        self._replayed = Metrics.counter(NAMESPACE, "batches_replayed")

    def setup(self) -> None:
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
            if problem is ROTATED:
                if self._waiting(record.timestamp_ms):
                    self._held.inc()
                    yield TaggedOutput(HELD, (pkey, record.offset))
                    continue
                problem = f"unauthenticated release batch: {UNKNOWN_KEY} (not distributed within " \
                          f"{self._key_wait_ms // 1000} s)"
            if problem is not None:
                if seen_before:
                    self._reread.inc()
                else:
                    self._dead.inc()
                    yield _dead("analyze", problem, source)
                continue
            yield batch.release_id, BatchElement(batch, source)

    def _rotated(self, key_id: Any) -> bool:
        """Whether an unknown key id can be a rotation: a well-formed id no older (by its date) than the newest
        shuffler key this analyzer holds (a rotation always adds a newer one; an older unknown id is a forgery)."""
        if not isinstance(key_id, str) or not KEY_ID_PATTERN.fullmatch(key_id):
            return False
        return not self._verifiers or key_id[:8] >= max(self._verifiers)[:8]

    def _waiting(self, timestamp_ms: int | None) -> bool:
        """Whether a batch of an unknown key id is still within its wait (a run without a clock never holds)."""
        return self._now_ms is not None and timestamp_ms is not None and \
            self._now_ms - timestamp_ms < self._key_wait_ms

    def _admit(self, value: bytes | None) -> tuple[Any, str | None]:
        if value is None:
            return None, "empty record"
        try:
            batch = decode_release_batch(value)
        except WireFormatError as err:
            return None, f"malformed release batch: {err.reason}"
        try:
            verify_release_batch(batch, self._verifiers)
        except AuthError as err:
            if str(err) == UNKNOWN_KEY and self._rotated(batch.key_id):
                return None, ROTATED
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


class OpenedBatch(NamedTuple):
    """One release batch after opening: what assembly needs of it, with its messages already folded into the
    mechanism's count arrays (O(domain) instead of O(messages): the GroupByKey of a release carries these)."""
    header: tuple  # release id, spec, crowd, window end, batch count, sets, messages, deletions
    batch_index: int
    signature: bytes
    source: SourceRef
    n_messages: int  # messages the batch carries
    counts: Any  # the mechanism's Accumulator for the messages that opened, or None if none did
    opened: int  # messages that opened and decoded
    failures: tuple[str, ...]  # why the others could not be used (their dead letters, if the release is taken)
    signer: str = ""  # the shuffler key id that signed it: two shufflers' releases of one window stay apart


class OpenBatchFn(beam.DoFn):
    """(release id, BatchElement) -> (release id, OpenedBatch): the analyzer opens each batch where it is read.

    Why before the GroupByKey: grouping the sealed messages of a whole release would hold all of them (in the
    runner's buffers and as Python objects) at once: ~1.1 kB per message, measured. Folded per batch, a
    release costs its batch count times the accumulator size. A batch of a release that turns out incomplete
    is opened again by the run that completes it; nothing is counted until the release is assembled.
    """
    def __init__(self, specs: Sequence[AnalysisSpec], keys_dir: str, threads: int = 0, python_gc: str = "tuned"):
        self._specs = SpecSet(specs)
        self._keys_dir = keys_dir
        self._threads = threads  # messages of a batch are opened on this many threads (0: one per core)
        self._python_gc = python_gc  # transforms.runtime.worker_gc

    def setup(self) -> None:
        tune_worker_gc(self._python_gc)

        self._private = load_analyzer_private(Path(self._keys_dir))

    def process(self, keyed: tuple[str, BatchElement]) -> Iterator[tuple[str, OpenedBatch]]:
        release_id, element = keyed
        yield release_id, open_batch(self._specs[element.batch.spec_id], self._private, element, self._threads)


def open_batch(spec: AnalysisSpec, private: Any, element: BatchElement, threads: int) -> OpenedBatch:
    """Open every message of one batch (its X25519 work on ``threads``), decode the payloads and check their
    domain over the whole batch at once (``transforms.wire.payload_batch``), and fold the usable ones into counts.
    A message that fails is counted with its reason, on its own."""
    batch, mechanism = element.batch, spec.randomizer
    channels = [m.channel for m in batch.messages]
    ads = {ch: associated_data(spec.spec_id, batch.crowd_id, batch.window_end_ms, ch) for ch in set(channels)}
    opened = open_many(private, [m.sealed for m in batch.messages], [ads[ch] for ch in channels], threads)
    plain = [(i, p) for i, p in enumerate(opened) if isinstance(p, bytes)]
    failures = [(i, f"unusable message: {p}") for i, p in enumerate(opened) if not isinstance(p, bytes)]
    rows, _, bad = decode_payload_array(mechanism, [p for _, p in plain], [channels[i] for i, _ in plain])
    failures += [(plain[j][0], f"unusable message: {reason}") for j, reason in bad]
    counts = None
    if len(rows):
        counts = mechanism.new_accumulator()
        counts.add(*count_clients(mechanism, rows))
    return OpenedBatch(_header(batch), batch.batch_index, bytes(batch.signature), element.source,
                       len(batch.messages), counts, len(rows), tuple(reason for _, reason in sorted(failures)),
                       batch.key_id)


class AssembleReleaseFn(beam.DoFn):
    """(release id, [OpenedBatch]) -> OpenedRelease if whole; held offsets if incomplete; dead otherwise.

    Takes only batches :class:`OpenBatchFn` (or :func:`open_batch`) opened: assembly needs no key, and a
    release's group never holds its sealed messages.

    Two valid releases of one window (a second shuffler with its own keys or state on the same topic) are told
    apart by their header and signing key and judged in the order they were published: the first valid one
    is taken (or, while incomplete, held with the rest), the later ones are dead-lettered as a conflict and
    counted (``releases_conflicting``). Refusing both, as before, lost the window for good.
    """
    def __init__(self, specs: Sequence[AnalysisSpec]):
        self._specs = SpecSet(specs)
        self._dead = Metrics.counter(NAMESPACE, "dead_lettered")
        self._held = Metrics.counter(NAMESPACE, "batches_held")
        self._duplicates = Metrics.counter(NAMESPACE, "batches_duplicate")
        self._messages_dead = Metrics.counter(NAMESPACE, "messages_dead_lettered")
        self._analyzed = Metrics.counter(NAMESPACE, "batches_analyzed")
        self._messages = Metrics.counter(NAMESPACE, "messages_analyzed")
        self._conflicts = Metrics.counter(NAMESPACE, "releases_conflicting")
        self._set_aside = Metrics.counter(NAMESPACE, "batches_set_aside")

    def process(self, keyed: tuple[str, Iterable[OpenedBatch]]) -> Iterator[Any]:
        _, elements = keyed
        items = list(elements)
        unopened = [type(b).__name__ for b in items if not isinstance(b, OpenedBatch)]
        if unopened:
            raise TypeError(f"AssembleReleaseFn takes OpenedBatch elements (open them with OpenBatchFn first), "
                            f"got {unopened[0]}")
        candidates: dict[tuple, list[OpenedBatch]] = {}
        for item in items:
            candidates.setdefault((item.header, item.signer), []).append(item)
        ordered = sorted(candidates.values(), key=lambda c: min(tuple(b.source) for b in c))
        for n, candidate in enumerate(ordered):
            outcome: list[str] = []
            yield from self._assemble(candidate, outcome)
            if outcome == ["refused"]:
                continue  # not valid: the next one published may be
            rest = [b for later in ordered[n + 1:] for b in later]
            if outcome == ["held"]:
                yield from self._hold(rest)
            elif rest:
                self._conflicts.inc(len(ordered) - n - 1)
                # Set aside, not lost: the window was analyzed from the first release. Their dead letters say
                # why, but they are counted apart (batches_set_aside), never toward the dead-letter bar (exit 6).
                yield from self._refuse(rest, "conflicting release: another valid release of this window was "
                                              "published first (a second shuffler on this topic?); kept the first",
                                        set_aside=True)
            return

    def _hold(self, items: Iterable[OpenedBatch]) -> Iterator[TaggedOutput]:
        earliest: dict[str, int] = {}
        for item in items:
            self._held.inc()
            pkey = partition_key(item.source.topic, item.source.partition)
            earliest[pkey] = min(earliest.get(pkey, item.source.offset), item.source.offset)
        for pkey, offset in earliest.items():
            yield TaggedOutput(HELD, (pkey, offset))

    def _assemble(self, items: list[OpenedBatch], outcome: list[str]) -> Iterator[Any]:
        """One candidate release: its outputs; ``outcome`` gets "released", "held" or "refused"."""
        items.sort(key=lambda b: (b.batch_index, tuple(b.source)))
        release_id = items[0].header[0]
        header = items[0].header
        _, spec_id, crowd_id, window_end_ms, batch_count, n_sets, n_messages, deleted = header
        by_index: dict[int, OpenedBatch] = {}
        for item in items:
            previous = by_index.get(item.batch_index)
            if item.header != header or (previous and previous.signature != item.signature):
                outcome.append("refused")
                yield from self._refuse(items, "inconsistent release: batches disagree on its header or content")
                return
            if previous is not None:
                self._duplicates.inc()
                continue
            by_index[item.batch_index] = item
        if len(by_index) < batch_count:
            outcome.append("held")
            yield from self._hold(by_index.values())
            return
        spec = self._specs[spec_id]
        whole = [by_index[i] for i in range(batch_count)]
        if sum(b.n_messages for b in whole) != n_messages:
            outcome.append("refused")
            yield from self._refuse(whole, "partial release: fewer messages than its header claims")
            return
        dummies = spec.crowd.blanket_dummies  # the shuffler's blanket: counted in the header, never a client
        if n_sets < spec.crowd.min_clients + dummies:
            outcome.append("refused")
            yield from self._refuse(whole, f"release of {n_sets} sets, below the spec's minimum crowd "
                                           f"({spec.crowd.min_clients}" + (f" + {dummies} dummies)" if dummies
                                                                           else ")"))
            return
        accumulator = CrowdAccumulator(spec.randomizer.new_accumulator(), deleted=deleted)
        for item in whole:
            if item.counts is not None:
                accumulator.counts.merge(item.counts)
            accumulator.messages += item.opened
            self._messages.inc(item.opened)
        ends: dict[str, int] = {}
        for item in items:  # duplicate copies too: they were read (and counted) by the run that sealed it
            pkey = partition_key(item.source.topic, item.source.partition)
            ends[pkey] = max(ends.get(pkey, 0), item.source.offset + 1)
        self._analyzed.inc(len(whole))
        outcome.append("released")
        yield OpenedRelease(release_id, spec_id, crowd_id, window_end_ms, n_sets - dummies, accumulator, ends)
        for item in whole:
            for reason in item.failures:
                self._messages_dead.inc()
                yield _dead("analyze", reason, item.source)

    def _refuse(self, items: Sequence[OpenedBatch], reason: str, set_aside: bool = False) -> Iterator[TaggedOutput]:
        for item in items:
            (self._set_aside if set_aside else self._dead).inc()
            yield _dead("analyze", reason, item.source, item.header[1])


def _header(batch: Any) -> tuple:
    return (batch.release_id, batch.spec_id, batch.crowd_id, batch.window_end_ms, batch.batch_count, batch.n_sets,
            batch.n_messages, batch.deleted)
