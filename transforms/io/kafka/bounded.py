"""Python-native Kafka IO for Beam: a bounded source with commit-after-success, and a sink.

Why not Beam's KafkaIO: it is a Java cross-language transform, so it needs a JVM expansion service,
which the local FnApiRunner setup does not have (`read_from_kafka(..., implementation="xlang")` keeps it
available for Dataflow/Flink). The client library sits behind `transforms.io.kafka.clients`: confluent-kafka
(librdkafka, the default: several times faster) or kafka-python, chosen per call with ``client=``
(``--kafka_client`` for the jobs); the semantics below live here, once, for both.

Bounded-read semantics: a job reads, per partition, [committed offset of its group, end of log at plan
time) and commits the end only after the pipeline finished successfully (`run_and_commit`): a failed
run re-reads the same range, a second successful run reads nothing new.

Consumers read committed records only (``isolation.level=read_committed``): a transaction a producer
aborted is never read, and the planned end of a bounded read is the last stable offset.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.runners.runner import PipelineResult, PipelineState

from transforms.io.kafka.clients import (
    CLIENT_ID,
    Consumer,
    KafkaReadError,
    KafkaRecord,
    KafkaWriteError,
    consumer,
    create_topics,
)
from transforms.io.kafka.config import DEFAULT_CLIENT, check_client
from transforms.io.kafka.planning import (
    PartitionRange,
    RewoundLogError,
    commit_plan,
    committed_offsets,
    consumer_lag,
    open_transactions,
    plan_bounded_read,
    wait_for_partitions,
)
from transforms.io.kafka.writer import WriteToKafka, produce_records  # re-exported: the one writer lives there

__all__ = ["CLIENT_ID", "DEFAULT_CLIENT", "KafkaReadError", "KafkaRecord", "KafkaWriteError", "PartitionRange",
           "ReadFromKafkaBounded", "RewoundLogError", "WriteToKafka", "commit_plan", "committed_offsets",
           "consumer_lag", "count_records", "ensure_topics", "open_transactions", "plan_bounded_read",
           "produce_records", "read_from_kafka", "read_topic", "run_and_commit", "wait_for_partitions"]

_log = logging.getLogger(__name__)
_BATCH_ELEMENT = 2_000  # records per element when batched: large enough for numpy, small enough to spread
_BATCH_BYTES = 8 * 1024 * 1024  # ... and bytes: 2,000 release batches of 512 KiB would be one 1 GiB element
_READ_CHUNK = 20_000  # records asked of one poll while reading a range (never past its stop)


def ensure_topics(bootstrap: str, topics: Sequence[str], partitions: int = 1,
                  client_config: Mapping[str, Any] | None = None, *, client: str = DEFAULT_CLIENT) -> None:
    """Create `topics` with `partitions` partitions; existing topics are left as they are."""
    create_topics(client, bootstrap, list(topics), partitions, dict(client_config or {}))


def _read_range(reader: Consumer, r: PartitionRange, stall_timeout_s: float,
                poll_ms: int = 500) -> Iterator[list[KafkaRecord]]:
    """Yield batches holding exactly the records with start <= offset < stop."""
    if r.start >= r.stop:
        return
    reader.assign(r.topic, {r.partition: r.start})
    position, last_progress = r.start, time.monotonic()
    while position < r.stop:
        # Never ask for more than is left: librdkafka's consume() waits for a full batch or the timeout.
        polled = reader.poll(poll_ms / 1000, min(_READ_CHUNK, r.stop - position))
        if polled and polled[0].offset >= r.start and polled[-1].offset < r.stop:
            batch = polled  # offsets rise within the one assigned partition: nothing to cut
        else:
            batch = [m for m in polled if m.partition == r.partition and r.start <= m.offset < r.stop]
        if batch:
            yield batch
        now, new_position = time.monotonic(), reader.position(r.topic, r.partition)
        if new_position > position:  # position, not record count: skips gaps such as transaction markers
            position, last_progress = new_position, now
        elif now - last_progress > stall_timeout_s:
            raise KafkaReadError(f"no progress reading {r.topic}[{r.partition}] for {stall_timeout_s:.0f} s: "
                                 f"at offset {position}, planned [{r.start}, {r.stop})")


class _ReadPartitionRangeFn(beam.DoFn):
    def __init__(self, bootstrap: str, consumer_config: Mapping[str, Any], stall_timeout_s: float,
                 batched: bool = False, client: str = DEFAULT_CLIENT, group_id: str | None = None) -> None:
        self._bootstrap, self._config, self._stall_s = bootstrap, dict(consumer_config), stall_timeout_s
        self._batched, self._client, self._group = batched, check_client(client), group_id
        self._read = Metrics.counter("esa", "kafka_records_read")
        self._consumer: Consumer | None = None

    def setup(self) -> None:
        # The job's group, though a manual assignment never joins it: librdkafka still looks its coordinator
        # up, and on a broker with ACLs the job's principal is granted its own group only.
        self._consumer = consumer(self._client, self._bootstrap, self._group, **self._config)

    def process(self, r: PartitionRange) -> Iterator[KafkaRecord | list[KafkaRecord]]:
        assert self._consumer is not None
        t0, n = time.monotonic(), 0
        for batch in _read_range(self._consumer, r, self._stall_s):
            n += len(batch)
            self._read.inc(len(batch))
            if self._batched:
                yield from element_batches(batch)
            else:
                yield from batch
        if n:
            _log.debug("read %d records of %s[%d] in %.2fs", n, r.topic, r.partition, time.monotonic() - t0)

    def teardown(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def element_batches(records: list[KafkaRecord], max_records: int = _BATCH_ELEMENT,
                    max_bytes: int = _BATCH_BYTES) -> Iterator[list[KafkaRecord]]:
    """Consecutive slices of ``records`` with at most ``max_records`` records and, unless one record alone is
    larger, ``max_bytes`` of values: a runner holds an element (and its bundle) in memory whole."""
    start, size = 0, 0
    for i, record in enumerate(records):
        length = len(record.value) if record.value is not None else 0
        if i > start and (i - start >= max_records or size + length > max_bytes):
            yield records[start:i]
            start, size = i, 0
        size += length
    if start < len(records):
        yield records[start:]


class ReadFromKafkaBounded(beam.PTransform):
    """Reads a topic from the group's committed offsets to the end of log seen when the pipeline is built.

    Planning happens in `expand` (one instance = one application). Elements are `KafkaRecord`s with the
    default timestamp, or lists of up to 2,000 of them with ``batched=True`` (downstream stages then
    work on whole batches); event time is assigned downstream. Call `commit_offsets()` (or `run_and_commit`)
    only after the pipeline succeeded. ``client`` picks the Kafka library (`transforms.io.kafka.clients`).
    """

    def __init__(self, bootstrap: str, topic: str, group_id: str, *,
                 consumer_config: Mapping[str, Any] | None = None, stall_timeout_s: float = 30.0,
                 batched: bool = False, start_offsets: Mapping[int, int] | None = None,
                 plan: list[PartitionRange] | None = None, client: str = DEFAULT_CLIENT) -> None:
        super().__init__()
        self.start_offsets = dict(start_offsets or {})
        self.fixed_plan = plan
        self.batched = batched
        self.bootstrap, self.topic, self.group_id = bootstrap, topic, group_id
        self.consumer_config = dict(consumer_config or {})
        self.stall_timeout_s = stall_timeout_s
        self.client = check_client(client)
        self.plan: list[PartitionRange] | None = None

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        self.plan = self.fixed_plan if self.fixed_plan is not None else plan_bounded_read(
            self.bootstrap, self.topic, self.group_id, consumer_config=self.consumer_config,
            start_offsets=self.start_offsets, client=self.client)
        return (pbegin
                | "Plan" >> beam.Create(self.plan)
                | "Spread" >> beam.Reshuffle()
                | "Read" >> beam.ParDo(_ReadPartitionRangeFn(self.bootstrap, self.consumer_config,
                                                             self.stall_timeout_s, self.batched, self.client,
                                                             self.group_id)))

    def commit_offsets(self) -> None:
        if self.plan is None:
            raise RuntimeError("commit_offsets() before the transform was applied to a pipeline")
        commit_plan(self.bootstrap, self.group_id, self.plan, self.consumer_config, client=self.client)


def run_and_commit(pipeline: beam.Pipeline, *readers: ReadFromKafkaBounded | None) -> PipelineResult:
    """Run `pipeline`; commit the readers' offsets only if it finished DONE, else raise (commit nothing)."""
    result = pipeline.run()
    state = result.wait_until_finish()
    if state != PipelineState.DONE:
        raise RuntimeError(f"pipeline finished in state {state}; Kafka offsets were not committed")
    for reader in readers:
        if reader is not None:
            reader.commit_offsets()
    return result


def read_from_kafka(pipeline_or_pbegin: beam.Pipeline | beam.pvalue.PBegin, *, bootstrap: str, topic: str,
                    group_id: str, implementation: str = "python", label: str | None = None,
                    readers: list[ReadFromKafkaBounded] | None = None, client: str = DEFAULT_CLIENT,
                    **xlang_options: Any) -> beam.PCollection:
    """Read `topic` as `KafkaRecord`s with the Python bounded reader or Beam's cross-language KafkaIO.

    "python": the reader (with Kafka library ``client``) is appended to `readers` (if given) so the driver
    can `run_and_commit` it. "xlang" (Dataflow/Flink): needs a Java expansion service (none here), is
    unbounded unless `max_num_records`/`max_read_time` is in `xlang_options`, and commits offsets itself on
    bundle finalization (`commit_offset_in_finalize`); nothing is appended to `readers`.
    """
    label = label or f"ReadKafka[{topic}]"
    if implementation == "python":
        reader = ReadFromKafkaBounded(bootstrap, topic, group_id, client=client)
        if readers is not None:
            readers.append(reader)
        return pipeline_or_pbegin | label >> reader
    if implementation == "xlang":
        from apache_beam.io.kafka import ReadFromKafka

        config = {"bootstrap.servers": bootstrap, "group.id": group_id, "auto.offset.reset": "earliest"}
        rows = pipeline_or_pbegin | label >> ReadFromKafka(
            consumer_config=config, topics=[topic], with_metadata=True, commit_offset_in_finalize=True,
            **xlang_options)
        return rows | f"{label}ToKafkaRecord" >> beam.Map(_row_to_record)
    raise ValueError(f"unknown Kafka implementation {implementation!r}; use 'python' or 'xlang'")


def _row_to_record(row: Any) -> KafkaRecord:
    return KafkaRecord(row.topic, row.partition, row.offset, row.timestamp, row.key, row.value)


def count_records(bootstrap: str, ranges: list[PartitionRange], *, timeout_s: float = 60.0,
                  consumer_config: Mapping[str, Any] | None = None, client: str = DEFAULT_CLIENT) -> int:
    """Records a read_committed consumer reads in ``ranges`` (commit markers and aborted records excluded)."""
    reader = consumer(client, bootstrap, **dict(consumer_config or {}))
    try:
        return sum(len(batch) for r in ranges for batch in _read_range(reader, r, timeout_s))
    finally:
        reader.close()


def read_topic(bootstrap: str, topic: str, *, timeout_s: float = 30.0,
               consumer_config: Mapping[str, Any] | None = None, client: str = DEFAULT_CLIENT) -> list[KafkaRecord]:
    """The whole topic, beginning to real end, outside Beam; `timeout_s` bounds time without progress."""
    plan = plan_bounded_read(bootstrap, topic, None, consumer_config=consumer_config, client=client)
    reader = consumer(client, bootstrap, **dict(consumer_config or {}))
    try:
        return [rec for r in plan for batch in _read_range(reader, r, timeout_s) for rec in batch]
    finally:
        reader.close()
