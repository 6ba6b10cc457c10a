"""An unbounded Kafka source for Beam's portable runners: a Python splittable DoFn, one element for every
partition of the topic (``transforms.io.kafka.positions`` says why not one per partition).

Why a Python SDF and not Beam's cross-language KafkaIO: KafkaIO needs a Java expansion service and a JVM on
every worker; this reader runs wherever the Python SDK harness runs (the FnApiRunner, the portable job
service, Flink, Dataflow) through the same two client libraries as the bounded reader
(``transforms.io.kafka.clients``), with the same settings file.

Semantics, those of KafkaIO's ``commitOffsetsInFinalize``:

* element ``(topic, partitions)``; its restriction (``TopicPositions``) is, per partition, the consumer group's
  committed offset (else the beginning of the partition). Each ``process`` call polls every partition for up
  to ``max_bundle_seconds``, claims every record it emits, then checkpoints (``defer_remainder``): the rest of
  the topic is a residual the runner resumes later, from the checkpointed offsets, not from the group;
* offsets are committed to the group only when the runner *finalizes* the bundle (``BundleFinalizerParam``):
  Flink after the checkpoint that holds the bundle's outputs completed, Dataflow after they were persisted,
  the local runners once the bundle succeeded. A job restarted without its runner state resumes from the
  committed offsets, so nothing committed is read twice, and records whose outputs sat in lost runner state
  (open windows) are lost, never duplicated;
* the watermark is the minimum over the partitions (``TopicWatermark``, a manual estimator whose state holds
  each partition's clock); a partition's (``PartitionWatermark``) is the largest trusted event time seen on it
  minus ``out_of_orderness``; a partition without a record for
  ``idle_timeout`` advances with the wall clock minus ``out_of_orderness`` instead, so a quiet partition does
  not hold every window open (as the bounded jobs' ``WindowClock``). Which event times are trusted is the
  caller's ``EventTimes`` policy: Kafka record timestamps by default; the shuffler passes one that only
  believes authenticated sets (``transforms.shuffler.streaming.SetEventTimes``);
* ``SourceClock.stop_after_idle_ms`` (``--stop_after_idle_seconds``; None: never) finishes the read once no
  record arrived on any partition for that long and each is read to its end offset: the local runners run a
  source to completion before the stages after it, so a test or a one-off catch-up needs an end. On Flink or
  Dataflow leave it unset. A file at ``stop_path`` (the driver writes it on SIGTERM) finishes the read
  at its next checkpoint: the source ends, the watermark
  goes to the end of time and every open window fires, a drain that works on any runner.

Elements: with ``batched=True`` lists of records (``kafkaio.element_batches``, what ``IngressFn`` takes),
timestamped with the read's watermark when emitted (a batch spans many event times; downstream windows
are assigned from each record's own event time); otherwise single records timestamped with their Kafka
timestamp, never below the watermark.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.transforms.core import RestrictionProvider
from apache_beam.utils.timestamp import MIN_TIMESTAMP, Duration, Timestamp

from transforms.io.kafka.bounded import element_batches
from transforms.io.kafka.clients import Consumer, KafkaRecord, consumer
from transforms.io.kafka.config import DEFAULT_CLIENT, check_client
from transforms.io.kafka.positions import (
    PartitionWatermark,
    SourceClock,
    TopicPositions,
    TopicPositionsTracker,
    TopicWatermarkProvider,
    positions,
)

__all__ = ["END", "EventTimes", "KafkaTimestamps", "PartitionWatermark", "ReadFromKafkaUnbounded", "ReadKafkaTopicFn",
           "SourceClock", "wall_ms"]

LOG = logging.getLogger(__name__)
END = 2**63 - 1  # an unbounded partition: OffsetRange's stop
READ_CHUNK = 20_000  # records asked of one poll
FIRST_BUNDLE = "first bundle of this reader"  # logged once per reader: whether a read started (the stalled read)
DEFAULT_CLOCK = SourceClock()


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class EventTimes(Protocol):
    """Which event times of a polled chunk the watermark may believe (pickled to the workers)."""

    def setup(self) -> None: ...
    def max_event_ms(self, records: Sequence[KafkaRecord]) -> int | None: ...


class KafkaTimestamps:
    """The default policy: the records' Kafka timestamps (set by the producer or the broker)."""

    def setup(self) -> None:
        return None

    def max_event_ms(self, records: Sequence[KafkaRecord]) -> int | None:
        stamps = [r.timestamp_ms for r in records if r.timestamp_ms is not None and r.timestamp_ms >= 0]
        return max(stamps) if stamps else None


class _TopicRestrictions(RestrictionProvider):
    """Every partition of the element's topic from the consumer group's committed offset (else the beginning).
    Not split up front: each partition is read in order, and the runner splits the read by checkpointing."""

    def __init__(self, bootstrap: str, group_id: str, consumer_config: Mapping[str, Any], client: str):
        self._bootstrap, self._group, self._config, self._client = bootstrap, group_id, dict(consumer_config), client

    def initial_restriction(self, element: tuple[str, Sequence[int]]) -> TopicPositions:
        topic, partitions = element
        probe = consumer(self._client, self._bootstrap, self._group, **self._config)
        try:
            begin, _ = probe.offsets(topic, list(partitions))
            committed = probe.committed(topic, list(partitions))
        finally:
            probe.close()
        starts = {p: begin[p] if committed.get(p) is None else max(int(committed[p]), begin[p]) for p in partitions}
        LOG.info("%s: unbounded read from offsets %s (group %s)", topic, starts, self._group)
        return positions(starts)

    def create_tracker(self, restriction: TopicPositions) -> TopicPositionsTracker:
        return TopicPositionsTracker(restriction)

    def split(self, element: Any, restriction: TopicPositions) -> Iterator[TopicPositions]:
        yield restriction

    def restriction_size(self, element: Any, restriction: TopicPositions) -> float:
        return 1.0  # the backlog is unknown without asking the broker

    def truncate(self, element: Any, restriction: TopicPositions) -> None:
        return None  # on a runner drain: stop reading (what is committed is the resume point)


_RESTRICTION = beam.DoFn.RestrictionParam()  # the DoFn is its own restriction provider
_WATERMARK = beam.DoFn.WatermarkEstimatorParam(TopicWatermarkProvider(wall_ms))


class ReadKafkaTopicFn(beam.DoFn, RestrictionProvider):
    """The splittable DoFn (see the module doc): element ``(topic, partitions)``, one for the whole read; its own
    restriction provider, since the initial offsets depend on where it reads (bootstrap, group, client)."""

    def __init__(self, bootstrap: str, group_id: str, *, consumer_config: Mapping[str, Any] | None = None,
                 client: str = DEFAULT_CLIENT, event_times: EventTimes | None = None,
                 clock: SourceClock = DEFAULT_CLOCK, batched: bool = True, poll_seconds: float = 0.2,
                 max_bundle_seconds: float = 2.0, defer_seconds: float = 0.5, stop_path: str | None = None):
        if not group_id:
            raise ValueError("the unbounded reader commits offsets: give it a consumer group")
        if poll_seconds <= 0 or max_bundle_seconds <= 0 or defer_seconds < 0:
            raise ValueError("poll_seconds and max_bundle_seconds must be > 0, defer_seconds >= 0")
        self._bootstrap, self._group = bootstrap, group_id
        self._config, self._client = dict(consumer_config or {}), check_client(client)
        self._times = event_times if event_times is not None else KafkaTimestamps()
        self._clock, self._batched = clock, batched
        self._poll_s, self._bundle_s, self._defer_s = poll_seconds, max_bundle_seconds, defer_seconds
        self._stop_path, self._stop_checked = stop_path, 0.0
        self._started = False  # the first bundle of this instance is logged: where a stalled read stands
        self._restrictions = _TopicRestrictions(bootstrap, group_id, self._config, self._client)
        self._read = Metrics.counter("esa", "kafka_records_read")
        self._commits = Metrics.counter("esa", "kafka_offsets_committed")
        self._reader: Consumer | None = None
        self._at: tuple[str, TopicPositions] | None = None  # where the reader's assignment stands
        self._committer: Consumer | None = None
        self._committed: dict[tuple[str, int], int] = {}
        self._commit_lock = threading.Lock()

    def initial_restriction(self, element: tuple[str, Sequence[int]]) -> TopicPositions:
        return self._restrictions.initial_restriction(element)

    def create_tracker(self, restriction: TopicPositions) -> TopicPositionsTracker:
        return self._restrictions.create_tracker(restriction)

    def split(self, element: Any, restriction: TopicPositions) -> Iterator[TopicPositions]:
        return self._restrictions.split(element, restriction)

    def restriction_size(self, element: Any, restriction: TopicPositions) -> float:
        return self._restrictions.restriction_size(element, restriction)

    def truncate(self, element: Any, restriction: TopicPositions) -> None:
        return self._restrictions.truncate(element, restriction)

    def setup(self) -> None:
        self._reader = consumer(self._client, self._bootstrap, None, **self._config)
        self._times.setup()

    def teardown(self) -> None:
        for c in (self._reader, self._committer):
            if c is not None:
                c.close()
        self._reader = self._committer = None

    def _seek(self, topic: str, at: dict[int, int]) -> Consumer:
        assert self._reader is not None
        mark = (topic, positions(at))
        if self._at != mark:
            self._reader.assign(topic, at)
            self._at = mark  # a read that claims nothing must not leave a stale mark
        return self._reader

    def _commit(self, topic: str, offsets: dict[int, int]) -> None:
        """Finalization callback: commit each partition's ``offset`` (the next to read) unless a later one was."""
        with self._commit_lock:
            ahead = {p: o for p, o in offsets.items() if self._committed.get((topic, p), -1) < o}
            if not ahead:
                return
            if self._committer is None:
                self._committer = consumer(self._client, self._bootstrap, self._group, **self._config)
            self._committer.commit(topic, ahead)
            for p, o in ahead.items():
                self._committed[(topic, p)] = o
            self._commits.inc(len(ahead))
        LOG.debug("committed %s at %s for group %s", topic, ahead, self._group)

    @beam.DoFn.unbounded_per_element()
    def process(self, element: tuple[str, Sequence[int]], finalizer: Any = beam.DoFn.BundleFinalizerParam,
                tracker: Any = _RESTRICTION, watermark: Any = _WATERMARK) -> Iterator[Any]:
        topic = element[0]
        at = tracker.current_restriction().of()
        start = dict(at)
        reader = self._seek(topic, dict(at))
        if not self._started:
            self._started = True
            LOG.info("%s: %s, at offsets %s", topic, FIRST_BUNDLE, at)
        deadline = time.monotonic() + self._bundle_s
        got, split = 0, False
        while not split and time.monotonic() < deadline:
            polled = reader.poll(self._poll_s, READ_CHUNK)
            records = [r for r in polled if r.topic == topic and r.offset >= at.get(r.partition, END)]
            if not records:
                break
            claimed = []
            for record in records:
                if not tracker.try_claim((record.partition, record.offset)):
                    split = True  # the runner split the restriction: the rest belongs to another
                    break
                claimed.append(record)
            if not claimed:
                break
            by_partition: dict[int, list[KafkaRecord]] = {}
            for record in claimed:
                by_partition.setdefault(record.partition, []).append(record)
                at[record.partition] = record.offset + 1
            self._at = (topic, positions(at))
            got += len(claimed)
            self._read.inc(len(claimed))
            stamp = watermark.watermark_ms()
            now = wall_ms()
            for partition, chunk in by_partition.items():
                watermark.observe(partition, self._times.max_event_ms(chunk), now)
            yield from self._elements(claimed, stamp)
            watermark.advance(wall_ms(), self._clock)
        skipped = False
        if split:
            self._at = None
        else:
            # A transaction's commit marker takes an offset no poll returns: past the last record, the consumer's
            # position says where the log really continues, so the commit and the idle check see the true end
            for partition in sorted(at):
                ahead = reader.position(topic, partition)
                if ahead > at[partition] and tracker.try_claim((partition, ahead - 1)):
                    at[partition], skipped = ahead, True
            self._at = (topic, positions(at))
            now = wall_ms()
            watermark.advance(now, self._clock)
            stop = self._clock.stop_after_idle_ms
            idle = stop is not None and got == 0 and watermark.idle_ms(now) >= stop
            # Idle and caught up: a slow first fetch (a loaded machine) must not end a read that still has
            # records; the end offsets are asked only when the time-out says to stop.
            if idle:
                ends = reader.offsets(topic, sorted(at))[1]
                idle = all(at[p] >= ends.get(p, 0) for p in at)
            if idle or self._stop_requested():
                LOG.info("%s: %s; finishing at offsets %s", topic,
                         f"no record for {watermark.idle_ms(now) / 1000:.1f} s" if idle else "stop requested", at)
                tracker.try_claim(None)  # claims nothing: marks the read done
            else:
                tracker.defer_remainder(Duration(seconds=0 if got else self._defer_s))
        if got or skipped:
            moved = {p: o for p, o in at.items() if o > start[p]}
            finalizer.register(lambda: self._commit(topic, moved))

    def _stop_requested(self) -> bool:
        """Whether the driver asked for a graceful stop (a file at ``stop_path``), looked at once a second."""
        if self._stop_path is None or time.monotonic() - self._stop_checked < 1.0:
            return False
        self._stop_checked = time.monotonic()
        from apache_beam.io.filesystems import FileSystems

        return bool(FileSystems.exists(self._stop_path))

    def _elements(self, records: list[KafkaRecord], watermark_ms: int | None) -> Iterator[Any]:
        floor = MIN_TIMESTAMP if watermark_ms is None else Timestamp(micros=watermark_ms * 1000)
        if self._batched:
            for batch in element_batches(records):
                yield beam.window.TimestampedValue(batch, floor)
            return
        for record in records:
            stamp = Timestamp(micros=record.timestamp_ms * 1000) if record.timestamp_ms else MIN_TIMESTAMP
            yield beam.window.TimestampedValue(record, max(stamp, floor))


class ReadFromKafkaUnbounded(beam.PTransform):
    """Every partition of ``topic`` (as the broker lists them when the pipeline is built), read without end.

    ``reader_options`` go to ``ReadKafkaPartitionFn``. Partitions added to the topic later are not read
    until the job is restarted.
    """

    def __init__(self, bootstrap: str, topic: str, group_id: str, *,
                 consumer_config: Mapping[str, Any] | None = None, client: str = DEFAULT_CLIENT,
                 partitions: Sequence[int] | None = None, **reader_options: Any):
        super().__init__()
        self._bootstrap, self._topic, self._group = bootstrap, topic, group_id
        self._config, self._client = dict(consumer_config or {}), check_client(client)
        self._partitions = None if partitions is None else list(partitions)
        self._fn = ReadKafkaTopicFn(bootstrap, group_id, consumer_config=self._config, client=self._client,
                                        **reader_options)

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        partitions = self._partitions
        if partitions is None:
            probe = consumer(self._client, self._bootstrap, None, **self._config)
            try:
                partitions = probe.partitions(self._topic)
            finally:
                probe.close()
        if not partitions:
            raise ValueError(f"topic {self._topic!r} does not exist on {self._bootstrap} (or has no partitions)")
        return (pbegin
                | "Topic" >> beam.Create([(self._topic, tuple(sorted(int(p) for p in partitions)))])
                | "Read" >> beam.ParDo(self._fn))
