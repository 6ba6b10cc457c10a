"""An unbounded Kafka source for Beam's portable runners: a Python splittable DoFn, one element per partition.

Why a Python SDF and not Beam's cross-language KafkaIO: KafkaIO needs a Java expansion service and a JVM on
every worker; this reader runs wherever the Python SDK harness runs (the FnApiRunner, the portable job
service, Flink, Dataflow) through the same two client libraries as the bounded reader
(``transforms.io.kafka.clients``), with the same settings file.

Semantics, those of KafkaIO's ``commitOffsetsInFinalize``:

* element ``(topic, partition)``; its restriction is ``OffsetRange(start, 2**63 - 1)``, where ``start`` is the
  consumer group's committed offset (else the beginning of the partition). Each ``process`` call polls for up
  to ``max_bundle_seconds``, claims every record it emits, then checkpoints (``defer_remainder``): the rest of
  the partition is a residual the runner resumes later, from the checkpointed offset, not from the group;
* offsets are committed to the group only when the runner *finalizes* the bundle (``BundleFinalizerParam``):
  Flink after the checkpoint that holds the bundle's outputs completed, Dataflow after they were persisted,
  the local runners once the bundle succeeded. A job restarted without its runner state resumes from the
  committed offsets, so nothing committed is read twice, and records whose outputs sat in lost runner state
  (open windows) are lost, never duplicated;
* the watermark of a partition (``PartitionWatermark``, a manual estimator with its own state) is the largest
  trusted event time seen on it minus ``out_of_orderness``; a partition without a record for
  ``idle_timeout`` advances with the wall clock minus ``out_of_orderness`` instead, so a quiet partition does
  not hold every window open (as the bounded jobs' ``WindowClock``). Which event times are trusted is the
  caller's ``EventTimes`` policy: Kafka record timestamps by default; the shuffler passes one that only
  believes authenticated sets (``transforms.shuffler.streaming.SetEventTimes``);
* ``SourceClock.stop_after_idle_ms`` (``--stop_after_idle_seconds``; None: never) finishes a partition once no
  record arrived for that long and it has read up to the partition's end offset: the local runners run a
  source to completion before the stages after it, so a test or a one-off catch-up needs an end. On Flink or
  Dataflow leave it unset. A file at ``stop_path`` (the driver writes it on SIGTERM) finishes every partition
  at its next checkpoint: the source ends, the watermark
  goes to the end of time and every open window fires, a drain that works on any runner.

Elements: with ``batched=True`` lists of records (``kafkaio.element_batches``, what ``IngressFn`` takes),
timestamped with the partition's watermark when emitted (a batch spans many event times; downstream windows
are assigned from each record's own event time); otherwise single records timestamped with their Kafka
timestamp, never below the watermark.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import apache_beam as beam
from apache_beam.coders import coders
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.metrics import Metrics
from apache_beam.transforms.core import RestrictionProvider, WatermarkEstimatorProvider
from apache_beam.utils.timestamp import MIN_TIMESTAMP, Duration, Timestamp

from transforms.io.kafka.bounded import element_batches
from transforms.io.kafka.clients import Consumer, KafkaRecord, consumer
from transforms.io.kafka.config import DEFAULT_CLIENT, check_client

LOG = logging.getLogger(__name__)
END = 2**63 - 1  # an unbounded partition: OffsetRange's stop
READ_CHUNK = 20_000  # records asked of one poll


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


@dataclass(frozen=True)
class SourceClock:
    """How a partition's watermark moves and when an idle partition ends (milliseconds; None: never)."""

    out_of_orderness_ms: int = 600_000
    idle_timeout_ms: int = 300_000
    stop_after_idle_ms: int | None = None

    def __post_init__(self) -> None:
        if self.out_of_orderness_ms < 0 or self.idle_timeout_ms < 0:
            raise ValueError("out_of_orderness and idle_timeout must be >= 0")
        if self.stop_after_idle_ms is not None and self.stop_after_idle_ms < 0:
            raise ValueError(f"stop_after_idle must be >= 0 or None, got {self.stop_after_idle_ms}")


class UnboundedOffsetTracker(OffsetRestrictionTracker):
    """An offset tracker over ``[start, END)`` that tells the runner the work never ends by itself."""

    def is_bounded(self) -> bool:
        return False


class PartitionWatermark(ManualWatermarkEstimator):
    """A partition's watermark, with what moves it: (watermark ms, max trusted event ms, last record wall ms).

    The whole triple is the estimator state, so it travels with every checkpointed residual. Methods only:
    the SDK wraps the estimator in a thread-safe proxy that forwards calls, not attributes.
    """

    def __init__(self, state: tuple[int | None, int | None, int]):
        watermark, self._max_event, self._last_data = state
        super().__init__(None if watermark is None else Timestamp(micros=watermark * 1000))
        self._watermark_ms = watermark

    def observe(self, max_event_ms: int | None, now_ms: int) -> None:
        """A chunk arrived at ``now_ms``; ``max_event_ms`` is its largest trusted event time, if any."""
        self._last_data = now_ms
        if max_event_ms is not None:
            self._max_event = max_event_ms if self._max_event is None else max(self._max_event, max_event_ms)

    def idle_ms(self, now_ms: int) -> int:
        return now_ms - self._last_data

    def advance(self, now_ms: int, clock: SourceClock) -> int | None:
        """Move the watermark forward (never back); returns it in ms (None: nothing seen yet, not idle).

        Never past ``now - out_of_orderness``: a device clock running ahead must not close windows early."""
        candidates = []
        if self._max_event is not None:
            candidates.append(min(self._max_event, now_ms) - clock.out_of_orderness_ms)
        if self.idle_ms(now_ms) >= clock.idle_timeout_ms:
            candidates.append(now_ms - clock.out_of_orderness_ms)
        if candidates and (self._watermark_ms is None or max(candidates) > self._watermark_ms):
            self._watermark_ms = max(candidates)
            self.set_watermark(Timestamp(micros=self._watermark_ms * 1000))
        return self._watermark_ms

    def watermark_ms(self) -> int | None:
        return self._watermark_ms

    def get_estimator_state(self) -> tuple[int | None, int | None, int]:
        return self._watermark_ms, self._max_event, self._last_data


class _WatermarkProvider(WatermarkEstimatorProvider):
    def initial_estimator_state(self, element: Any, restriction: OffsetRange) -> tuple[None, None, int]:
        return None, None, wall_ms()  # idle time counts from the start of the read

    def create_watermark_estimator(self, state: tuple[int | None, int | None, int]) -> PartitionWatermark:
        return PartitionWatermark(tuple(state))

    def estimator_state_coder(self) -> coders.Coder:
        return coders.FastPrimitivesCoder()


class _PartitionRestrictions(RestrictionProvider):
    """``[committed offset of the group (else the beginning), END)`` per partition; a partition is not split
    up front (its records are read in order): the runner splits it by checkpointing."""

    def __init__(self, bootstrap: str, group_id: str, consumer_config: Mapping[str, Any], client: str):
        self._bootstrap, self._group, self._config, self._client = bootstrap, group_id, dict(consumer_config), client

    def initial_restriction(self, element: tuple[str, int]) -> OffsetRange:
        topic, partition = element
        probe = consumer(self._client, self._bootstrap, self._group, **self._config)
        try:
            begin, _ = probe.offsets(topic, [partition])
            committed = probe.committed(topic, [partition]).get(partition)
        finally:
            probe.close()
        start = begin[partition] if committed is None else max(int(committed), begin[partition])
        LOG.info("%s[%d]: unbounded read from offset %d (group %s)", topic, partition, start, self._group)
        return OffsetRange(start, END)

    def create_tracker(self, restriction: OffsetRange) -> UnboundedOffsetTracker:
        return UnboundedOffsetTracker(restriction)

    def split(self, element: tuple[str, int], restriction: OffsetRange) -> Iterator[OffsetRange]:
        yield restriction

    def restriction_size(self, element: tuple[str, int], restriction: OffsetRange) -> float:
        return 1.0  # every partition weighs the same: the backlog is unknown without asking the broker

    def truncate(self, element: tuple[str, int], restriction: OffsetRange) -> None:
        return None  # on a runner drain: stop reading (what is committed is the resume point)


_RESTRICTION = beam.DoFn.RestrictionParam()  # the DoFn is its own restriction provider
_WATERMARK = beam.DoFn.WatermarkEstimatorParam(_WatermarkProvider())


class ReadKafkaPartitionFn(beam.DoFn, RestrictionProvider):
    """The splittable DoFn (see the module doc); its own restriction provider, since the initial offset
    depends on where it reads (bootstrap, group, client settings)."""

    def __init__(self, bootstrap: str, group_id: str, *, consumer_config: Mapping[str, Any] | None = None,
                 client: str = DEFAULT_CLIENT, event_times: EventTimes | None = None,
                 clock: SourceClock = SourceClock(), batched: bool = True, poll_seconds: float = 0.2,
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
        self._restrictions = _PartitionRestrictions(bootstrap, group_id, self._config, self._client)
        self._read = Metrics.counter("esa", "kafka_records_read")
        self._commits = Metrics.counter("esa", "kafka_offsets_committed")
        self._reader: Consumer | None = None
        self._at: tuple[str, int, int] | None = None  # where the reader's assignment stands
        self._committer: Consumer | None = None
        self._committed: dict[tuple[str, int], int] = {}
        self._commit_lock = threading.Lock()

    def initial_restriction(self, element: tuple[str, int]) -> OffsetRange:
        return self._restrictions.initial_restriction(element)

    def create_tracker(self, restriction: OffsetRange) -> UnboundedOffsetTracker:
        return self._restrictions.create_tracker(restriction)

    def split(self, element: tuple[str, int], restriction: OffsetRange) -> Iterator[OffsetRange]:
        return self._restrictions.split(element, restriction)

    def restriction_size(self, element: tuple[str, int], restriction: OffsetRange) -> float:
        return self._restrictions.restriction_size(element, restriction)

    def truncate(self, element: tuple[str, int], restriction: OffsetRange) -> None:
        return self._restrictions.truncate(element, restriction)

    def setup(self) -> None:
        self._reader = consumer(self._client, self._bootstrap, None, **self._config)
        self._times.setup()

    def teardown(self) -> None:
        for c in (self._reader, self._committer):
            if c is not None:
                c.close()
        self._reader = self._committer = None

    def _seek(self, topic: str, partition: int, offset: int) -> Consumer:
        assert self._reader is not None
        if self._at != (topic, partition, offset):
            self._reader.assign(topic, {partition: offset})
            self._at = (topic, partition, offset)  # a read that claims nothing must not leave a stale mark
        return self._reader

    def _commit(self, topic: str, partition: int, offset: int) -> None:
        """Finalization callback: commit ``offset`` (the next record to read) unless a later one was."""
        with self._commit_lock:
            if self._committed.get((topic, partition), -1) >= offset:
                return
            if self._committer is None:
                self._committer = consumer(self._client, self._bootstrap, self._group, **self._config)
            self._committer.commit(topic, {partition: offset})
            self._committed[(topic, partition)] = offset
            self._commits.inc()
        LOG.debug("committed %s[%d] at %d for group %s", topic, partition, offset, self._group)

    @beam.DoFn.unbounded_per_element()
    def process(self, element: tuple[str, int], finalizer: Any = beam.DoFn.BundleFinalizerParam,
                tracker: Any = _RESTRICTION, watermark: Any = _WATERMARK) -> Iterator[Any]:
        topic, partition = element
        restriction = tracker.current_restriction()
        position = restriction.start
        reader = self._seek(topic, partition, position)
        deadline = time.monotonic() + self._bundle_s
        got, split = 0, False
        while not split and time.monotonic() < deadline:
            polled = reader.poll(self._poll_s, READ_CHUNK)
            records = [r for r in polled if r.offset >= position and r.partition == partition and r.topic == topic]
            if not records:
                break
            claimed = []
            for record in records:
                if not tracker.try_claim(record.offset):
                    split = True  # the runner split the restriction: the rest belongs to another
                    break
                claimed.append(record)
            if not claimed:
                break
            position = claimed[-1].offset + 1
            self._at = (topic, partition, position)
            got += len(claimed)
            self._read.inc(len(claimed))
            stamp = watermark.watermark_ms()
            watermark.observe(self._times.max_event_ms(claimed), wall_ms())
            yield from self._elements(claimed, stamp)
            watermark.advance(wall_ms(), self._clock)
        skipped = False
        if split:
            self._at = None
        else:
            # A transaction's commit marker takes an offset no poll returns: past the last record, the consumer's
            # position says where the log really continues, so the commit and the idle check see the true end
            ahead = reader.position(topic, partition)
            if ahead > position and tracker.try_claim(ahead - 1):
                position, skipped = ahead, True
                self._at = (topic, partition, position)
            now = wall_ms()
            watermark.advance(now, self._clock)
            stop = self._clock.stop_after_idle_ms
            idle = stop is not None and got == 0 and watermark.idle_ms(now) >= stop
            # Idle and caught up: a slow first fetch (a loaded machine) must not end a partition that still
            # holds records; its end offset is asked only when the time-out says to stop.
            idle = idle and position >= reader.offsets(topic, [partition])[1].get(partition, 0)
            if idle or self._stop_requested():
                LOG.info("%s[%d]: %s; finishing at offset %d", topic, partition,
                         f"no record for {watermark.idle_ms(now) / 1000:.1f} s" if idle else "stop requested",
                         position)
                tracker.try_claim(restriction.stop)  # claims nothing: marks the restriction done
            else:
                tracker.defer_remainder(Duration(seconds=0 if got else self._defer_s))
        if got or skipped:
            finalizer.register(lambda: self._commit(topic, partition, position))

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
        self._fn = ReadKafkaPartitionFn(bootstrap, group_id, consumer_config=self._config, client=self._client,
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
                | "Partitions" >> beam.Create([(self._topic, int(p)) for p in partitions])
                | "Read" >> beam.ParDo(self._fn))
