"""Python-native Kafka IO for Beam: a bounded source with commit-after-success, and a sink.

Why not Beam's KafkaIO: it is a Java cross-language transform, so it needs a JVM expansion service,
which the local FnApiRunner setup does not have (`read_from_kafka(..., implementation="xlang")` keeps it
available for Dataflow/Flink). kafka-python sits behind `_consumer`/`_producer`/`_admin` so a faster
client (confluent-kafka) can be slotted in.

Bounded-read semantics: a job reads, per partition, [committed offset of its group, end of log at plan
time) and commits the end only after the pipeline finished successfully (`run_and_commit`): a failed
run re-reads the same range, a second successful run reads nothing new.

Why the end offset is probed: tansu (the local broker) answers ListOffsets(latest) with the *base*
offset of the last record batch + 1, not the log end (measured: 20,000 records in 3 partitions, end
offsets 5725 against a real 6667). Trusting it silently drops up to a producer batch per partition,
so the planner seeks to the reported end and polls until the log is quiet.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.runners.runner import PipelineResult, PipelineState
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

_log = logging.getLogger(__name__)

CLIENT_ID = "esa-telemetry"
_MAX_RECORDS = 100_000  # per poll: few large polls, not kafka-python's default of 500
_BATCH_ELEMENT = 2_000  # records per element when batched: large enough for numpy, small enough to spread
Element = bytes | tuple[bytes | None, bytes]


class KafkaRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes


class PartitionRange(NamedTuple):
    """Offsets [start, stop) of one partition: the unit of work of a bounded read."""

    topic: str
    partition: int
    start: int
    stop: int


class KafkaReadError(RuntimeError):
    """A bounded read made no progress (broker gone, records deleted under us)."""


class KafkaWriteError(RuntimeError):
    """The broker refused or timed out a produced record."""


def _consumer(bootstrap: str, group_id: str | None = None, **config: Any) -> KafkaConsumer:
    """Manual-assignment consumer; never auto-commits (offsets are committed after success only)."""
    settings: dict[str, Any] = {
        "client_id": CLIENT_ID, "enable_auto_commit": False, "auto_offset_reset": "earliest",
        "max_poll_interval_ms": 5000,  # tansu: group operations are prompt only with a short interval
        "max_partition_fetch_bytes": 16 * 1024 * 1024,
    }
    settings.update(config)
    return KafkaConsumer(bootstrap_servers=bootstrap, group_id=group_id, **settings)


def _producer(bootstrap: str, **config: Any) -> KafkaProducer:
    settings: dict[str, Any] = {"client_id": CLIENT_ID, "acks": "all", "linger_ms": 20,
                                "batch_size": 512 * 1024}
    settings.update(config)
    return KafkaProducer(bootstrap_servers=bootstrap, **settings)


_ADMIN_KEYS = ("security_protocol", "ssl_", "sasl_", "request_timeout_ms", "api_version")


def _admin(bootstrap: str, **config: Any) -> KafkaAdminClient:
    """An admin client with the security settings of ``config`` (consumer-only settings are dropped)."""
    settings = {k: v for k, v in config.items() if k.startswith(_ADMIN_KEYS)}
    return KafkaAdminClient(bootstrap_servers=bootstrap, client_id=CLIENT_ID, **settings)


def _split(element: Element) -> tuple[bytes | None, bytes]:
    if isinstance(element, tuple):
        key, value = element
        return key, value
    if isinstance(element, bytes | bytearray):
        return None, bytes(element)
    raise TypeError(f"Kafka elements must be bytes or (key, value) tuples, got {type(element).__name__}")


def ensure_topics(bootstrap: str, topics: Sequence[str], partitions: int = 1,
                  client_config: Mapping[str, Any] | None = None) -> None:
    """Create `topics` with `partitions` partitions; existing topics are left as they are."""
    admin = _admin(bootstrap, **dict(client_config or {}))
    try:
        spec = {t: {"num_partitions": partitions, "replication_factor": 1} for t in topics}
        response = admin.create_topics(spec, raise_errors=False, wait_for_metadata=True)
        for result in response.get("topics", []):
            if result["error_code"] not in (0, 36):  # 36: TOPIC_ALREADY_EXISTS
                raise RuntimeError(f"cannot create topic {result['name']!r}: {result.get('error_message')}")
    finally:
        admin.close()


def _probe_real_end(consumer: KafkaConsumer, reported: Mapping[TopicPartition, int], idle_polls: int,
                    idle_poll_ms: int, max_probe_s: float) -> dict[TopicPartition, int]:
    """Seek to the reported ends and poll until `idle_polls` consecutive polls return nothing."""
    consumer.assign(list(reported))
    for tp, offset in reported.items():
        consumer.seek(tp, offset)
    empty, deadline = 0, time.monotonic() + max_probe_s
    while empty < idle_polls and time.monotonic() < deadline:  # deadline: a busy producer never goes quiet
        batch = consumer.poll(timeout_ms=idle_poll_ms, max_records=_MAX_RECORDS)
        empty = 0 if any(batch.values()) else empty + 1
    return {tp: max(offset, consumer.position(tp)) for tp, offset in reported.items()}


def plan_bounded_read(bootstrap: str, topic: str, group_id: str | None, *, idle_polls: int = 2,
                      idle_poll_ms: int = 300, max_probe_s: float = 10.0,
                      consumer_config: Mapping[str, Any] | None = None,
                      start_offsets: Mapping[int, int] | None = None) -> list[PartitionRange]:
    """Per partition: start = ``start_offsets`` (a job's own durable resume point), else the committed
    offset of `group_id`, else the beginning; stop = real end of log."""
    config = dict(consumer_config or {})
    probe = _consumer(bootstrap, fetch_max_wait_ms=100, **config)
    try:
        partitions = probe.partitions_for_topic(topic)
        if not partitions:
            raise ValueError(f"topic {topic!r} does not exist on {bootstrap}")
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        begin = probe.beginning_offsets(tps)
        ends = _probe_real_end(probe, probe.end_offsets(tps), idle_polls, idle_poll_ms, max_probe_s)
    finally:
        probe.close()
    committed: dict[TopicPartition, int | None] = {}
    if start_offsets:
        committed = {tp: start_offsets.get(tp.partition) for tp in tps}
    elif group_id is not None:
        grouped = _consumer(bootstrap, group_id, **config)
        try:
            committed = {tp: grouped.committed(tp) for tp in tps}
        finally:
            grouped.close(autocommit=False)
    plan = []
    for tp in tps:
        done = committed.get(tp)
        start = begin[tp] if done is None else max(done, begin[tp])
        if start > ends[tp]:
            _log.warning("%s: committed offset %d is past the end %d; reading nothing", tp, start, ends[tp])
            start = ends[tp]
        plan.append(PartitionRange(topic, tp.partition, start, ends[tp]))
    _log.info("planned %d records from %s for group %s: %s", sum(r.stop - r.start for r in plan), topic,
              group_id, [(r.partition, r.start, r.stop) for r in plan])
    return plan


def committed_offsets(bootstrap: str, group_id: str, topic: str,
                      consumer_config: Mapping[str, Any] | None = None) -> dict[int, int]:
    """Partition -> offset committed by ``group_id`` on ``topic`` (partitions without a commit are left out)."""
    consumer = _consumer(bootstrap, group_id, **dict(consumer_config or {}))
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        found = {p: consumer.committed(TopicPartition(topic, p)) for p in sorted(partitions)}
    finally:
        consumer.close(autocommit=False)
    return {p: int(o) for p, o in found.items() if o is not None}


def commit_plan(bootstrap: str, group_id: str, plan: Iterable[PartitionRange],
                consumer_config: Mapping[str, Any] | None = None) -> None:
    """Commit `stop` of every range for `group_id`."""
    offsets = {TopicPartition(r.topic, r.partition): OffsetAndMetadata(r.stop, "", -1) for r in plan}
    consumer = _consumer(bootstrap, group_id, **dict(consumer_config or {}))
    try:
        consumer.commit(offsets)
    finally:
        consumer.close(autocommit=False)
    _log.info("committed %s for group %s", {tp.partition: om.offset for tp, om in offsets.items()}, group_id)


def _read_range(consumer: KafkaConsumer, r: PartitionRange, stall_timeout_s: float,
                poll_ms: int = 500) -> Iterator[list[KafkaRecord]]:
    """Yield batches holding exactly the records with start <= offset < stop."""
    if r.start >= r.stop:
        return
    tp = TopicPartition(r.topic, r.partition)
    consumer.assign([tp])
    consumer.seek(tp, r.start)
    position, last_progress = r.start, time.monotonic()
    while position < r.stop:
        polled = consumer.poll(timeout_ms=poll_ms, max_records=_MAX_RECORDS).get(tp, [])
        batch = [KafkaRecord(m.topic, m.partition, m.offset, m.timestamp, m.key, m.value)
                 for m in polled if r.start <= m.offset < r.stop]
        if batch:
            yield batch
        now, new_position = time.monotonic(), consumer.position(tp)
        if new_position > position:  # position, not record count: skips gaps such as transaction markers
            position, last_progress = new_position, now
        elif now - last_progress > stall_timeout_s:
            raise KafkaReadError(f"no progress reading {r.topic}[{r.partition}] for {stall_timeout_s:.0f} s: "
                                 f"at offset {position}, planned [{r.start}, {r.stop})")


class _ReadPartitionRangeFn(beam.DoFn):
    def __init__(self, bootstrap: str, consumer_config: Mapping[str, Any], stall_timeout_s: float,
                 batched: bool = False) -> None:
        self._bootstrap, self._config, self._stall_s = bootstrap, dict(consumer_config), stall_timeout_s
        self._batched = batched
        self._read = Metrics.counter("esa", "kafka_records_read")
        self._consumer: KafkaConsumer | None = None

    def setup(self) -> None:
        self._consumer = _consumer(self._bootstrap, **self._config)

    def process(self, r: PartitionRange) -> Iterator[KafkaRecord | list[KafkaRecord]]:
        assert self._consumer is not None
        t0, n = time.monotonic(), 0
        for batch in _read_range(self._consumer, r, self._stall_s):
            n += len(batch)
            self._read.inc(len(batch))
            for start in range(0, len(batch), _BATCH_ELEMENT) if self._batched else ():
                yield batch[start:start + _BATCH_ELEMENT]
            if not self._batched:
                yield from batch
        if n:
            _log.info("read %d records of %s[%d] in %.2fs", n, r.topic, r.partition, time.monotonic() - t0)

    def teardown(self) -> None:
        if self._consumer is not None:
            self._consumer.close(autocommit=False)
            self._consumer = None


class ReadFromKafkaBounded(beam.PTransform):
    """Reads a topic from the group's committed offsets to the end of log seen when the pipeline is built.

    Planning happens in `expand` (one instance = one application). Elements are `KafkaRecord`s with the
    default timestamp, or lists of up to 2,000 of them with ``batched=True`` (downstream stages then
    work on whole batches); event time is assigned downstream. Call `commit_offsets()` (or `run_and_commit`)
    only after the pipeline succeeded.
    """

    def __init__(self, bootstrap: str, topic: str, group_id: str, *,
                 consumer_config: Mapping[str, Any] | None = None, stall_timeout_s: float = 30.0,
                 batched: bool = False, start_offsets: Mapping[int, int] | None = None,
                 plan: list[PartitionRange] | None = None) -> None:
        super().__init__()
        self.start_offsets = dict(start_offsets or {})
        self.fixed_plan = plan
        self.batched = batched
        self.bootstrap, self.topic, self.group_id = bootstrap, topic, group_id
        self.consumer_config = dict(consumer_config or {})
        self.stall_timeout_s = stall_timeout_s
        self.plan: list[PartitionRange] | None = None

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        self.plan = self.fixed_plan if self.fixed_plan is not None else plan_bounded_read(
            self.bootstrap, self.topic, self.group_id, consumer_config=self.consumer_config,
            start_offsets=self.start_offsets)
        return (pbegin
                | "Plan" >> beam.Create(self.plan)
                | "Spread" >> beam.Reshuffle()
                | "Read" >> beam.ParDo(_ReadPartitionRangeFn(self.bootstrap, self.consumer_config,
                                                             self.stall_timeout_s, self.batched)))

    def commit_offsets(self) -> None:
        if self.plan is None:
            raise RuntimeError("commit_offsets() before the transform was applied to a pipeline")
        commit_plan(self.bootstrap, self.group_id, self.plan, self.consumer_config)


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
                    readers: list[ReadFromKafkaBounded] | None = None, **xlang_options: Any) -> beam.PCollection:
    """Read `topic` as `KafkaRecord`s with the Python bounded reader or Beam's cross-language KafkaIO.

    "python": the reader is appended to `readers` (if given) so the driver can `run_and_commit` it.
    "xlang" (Dataflow/Flink): needs a Java expansion service (none here), is unbounded unless
    `max_num_records`/`max_read_time` is in `xlang_options`, and commits offsets itself on bundle
    finalization (`commit_offset_in_finalize`); nothing is appended to `readers`.
    """
    label = label or f"ReadKafka[{topic}]"
    if implementation == "python":
        reader = ReadFromKafkaBounded(bootstrap, topic, group_id)
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


class _WriteFn(beam.DoFn):
    def __init__(self, bootstrap: str, topic: str, producer_config: Mapping[str, Any],
                 flush_timeout_s: float) -> None:
        self._bootstrap, self._topic, self._config = bootstrap, topic, dict(producer_config)
        self._flush_timeout_s = flush_timeout_s
        self._written = Metrics.counter("esa", "kafka_records_written")
        self._producer: KafkaProducer | None = None
        self._error: BaseException | None = None

    def setup(self) -> None:
        self._producer = _producer(self._bootstrap, **self._config)

    def _on_error(self, exc: BaseException) -> None:
        self._error = self._error or exc  # runs on the sender thread; the bundle raises it

    def process(self, element: Element) -> None:
        assert self._producer is not None
        key, value = _split(element)
        self._producer.send(self._topic, key=key, value=value).add_errback(self._on_error)
        self._written.inc()

    def finish_bundle(self) -> None:
        assert self._producer is not None
        self._producer.flush(timeout=self._flush_timeout_s)
        error, self._error = self._error, None
        if error is not None:
            raise KafkaWriteError(f"writing to {self._topic} on {self._bootstrap} failed: {error}") from error

    def teardown(self) -> None:
        if self._producer is not None:
            self._producer.close(timeout=5)
            self._producer = None


class WriteToKafka(beam.PTransform):
    """Writes `bytes` or `(key, value)` elements to `topic`; a bundle fails unless every record was acked."""

    def __init__(self, bootstrap: str, topic: str, *, producer_config: Mapping[str, Any] | None = None,
                 flush_timeout_s: float = 60.0) -> None:
        super().__init__()
        self._fn = _WriteFn(bootstrap, topic, producer_config or {}, flush_timeout_s)

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        return pcoll | "Produce" >> beam.ParDo(self._fn)


def produce_records(bootstrap: str, topic: str, values: Iterable[Element], *,
                    producer_config: Mapping[str, Any] | None = None,
                    progress: Callable[[int], None] | None = None, progress_every: int = 10_000,
                    flush_timeout_s: float = 60.0) -> int:
    """Produce `values` outside Beam (simulator, tests); returns the count, raises on the first failure."""
    producer = _producer(bootstrap, **dict(producer_config or {}))
    errors: list[BaseException] = []
    n = 0
    try:
        for n, element in enumerate(values, start=1):
            key, value = _split(element)
            producer.send(topic, key=key, value=value).add_errback(errors.append)
            if n % progress_every == 0:
                if errors:
                    break
                if progress is not None:
                    progress(n)
        producer.flush(timeout=flush_timeout_s)
        if progress is not None and not errors and n % progress_every:
            progress(n)
    finally:
        producer.close(timeout=5)
    if errors:
        raise KafkaWriteError(f"producing to {topic} on {bootstrap} failed: {errors[0]}") from errors[0]
    _log.info("produced %d records to %s", n, topic)
    return n


def read_topic(bootstrap: str, topic: str, *, timeout_s: float = 30.0,
               consumer_config: Mapping[str, Any] | None = None) -> list[KafkaRecord]:
    """The whole topic, beginning to real end, outside Beam; `timeout_s` bounds time without progress."""
    plan = plan_bounded_read(bootstrap, topic, None, consumer_config=consumer_config)
    consumer = _consumer(bootstrap, **dict(consumer_config or {}))
    try:
        return [rec for r in plan for batch in _read_range(consumer, r, timeout_s) for rec in batch]
    finally:
        consumer.close(autocommit=False)
