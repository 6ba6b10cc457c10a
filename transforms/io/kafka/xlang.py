"""A planned bounded read through Beam's Java KafkaIO (``--kafka_io xlang``): exactly the records of a plan or a
failed pipeline.

A job's run reads, per partition, ``[start, stop)`` of its plan (``bounded.plan_bounded_read``). Beam 2.62's
Python ``ReadFromKafka`` can bound Java's read only by a record count (``max_num_records``) or a duration
(``max_read_time``), and starts at the consumer group's committed offset. So the driver (1) commits each
range's start to the job's group (the offset the previous run committed, unless that commit failed), (2)
counts the committed records of the plan (``count_plan``: Kafka knows offsets, not records; transaction
markers and aborted records take offsets), and the pipeline (3) reads that many with
``isolation.level=read_committed``, so a transaction of the encoder is read whole or not at all, (4) drops
anything past a range's stop (written since the plan), and (5) fails unless it holds exactly the counted
records of every partition: a record past the stop read instead of a planned one, or a split that stopped at
``max_read_time``, fails the run (nothing is released or committed; the next run plans again), never
silently shortens it.

Why (4)/(5) and a deadline: Java's bounded read divides ``max_num_records`` evenly among its splits (one per
10,000 records, at most one per partition); with several splits the count is raised to what any split may
need and the read ends after ``read_seconds(total)`` (a floor plus 500 records a second, far below what a
loaded 2-core machine reads), after which (5) decides: a read cut short fails, it never passes short.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics

from transforms.io.kafka.bounded import _read_range, element_batches
from transforms.io.kafka.clients import consumer
from transforms.io.kafka.config import DEFAULT_CLIENT
from transforms.io.kafka.planning import PartitionRange
from transforms.io.kafka.records import KafkaReadError, KafkaRecord

SPLIT_RECORDS = 10_000  # BoundedReadFromUnboundedSource: one initial split per this many records
READ_FLOOR_S, READ_RATE = 60, 500  # the deadline of a multi-split read: consumer start-up, then records/s


def read_seconds(total: int) -> int:
    """How long a multi-split read runs (each split reads for this long, then stops)."""
    return READ_FLOOR_S + total // READ_RATE


def count_plan(bootstrap: str, plan: Iterable[PartitionRange], consumer_config: Mapping[str, Any] | None = None,
               *, client: str = DEFAULT_CLIENT, stall_timeout_s: float = 30.0) -> dict[int, int]:
    """Committed (read_committed) records per partition in the plan's ranges."""
    reader = consumer(client, bootstrap, **dict(consumer_config or {}))
    try:
        return {r.partition: sum(len(batch) for batch in _read_range(reader, r, stall_timeout_s)) for r in plan}
    finally:
        reader.close()


def java_consumer_config(bootstrap: str, group_id: str) -> dict[str, str]:
    return {"bootstrap.servers": bootstrap, "group.id": group_id, "isolation.level": "read_committed",
            "auto.offset.reset": "earliest", "enable.auto.commit": "false"}


def _to_record(row: Any) -> KafkaRecord:
    return KafkaRecord(row.topic, int(row.partition), int(row.offset), int(row.timestamp),
                       bytes(row.key) if row.key is not None else None, bytes(row.value))


class _CheckCounts(beam.DoFn):
    """Fails the pipeline unless every partition holds exactly its counted records."""

    def __init__(self, expected: Mapping[int, int]) -> None:
        self._expected = dict(expected)

    def process(self, found: list[tuple[int, int]]) -> Iterable[None]:
        got = {p: n for p, n in found if n}
        want = {p: n for p, n in self._expected.items() if n}
        if got != want:
            raise KafkaReadError(f"Java KafkaIO read {got} records per partition of the plan, not {want}: records "
                                 "written past the plan were read instead, or the read hit its deadline; nothing "
                                 "is released, the next run plans again")
        return []


class ReadFromKafkaXlang(beam.PTransform):
    """The records of ``plan`` (one topic) read by Java's KafkaIO through ``expansion_service`` ("HOST:PORT"),
    as lists of up to 2,000 ``KafkaRecord``s (the python reader's ``batched=True`` shape)."""

    def __init__(self, bootstrap: str, topic: str, group_id: str, plan: list[PartitionRange],
                 counts: Mapping[int, int], expansion_service: str, *, max_read_time_s: int | None = None) -> None:
        super().__init__()
        self.bootstrap, self.topic, self.group_id = bootstrap, topic, group_id
        self.plan, self.counts = list(plan), dict(counts)
        self.expansion_service, self.max_read_time_s = expansion_service, max_read_time_s

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        from apache_beam.io.kafka import ReadFromKafka

        total = sum(self.counts.values())
        stops = {r.partition: r.stop for r in self.plan}
        read_counter = Metrics.counter("esa", "kafka_records_read")
        if total == 0:
            return pbegin | "Nothing" >> beam.Create([])
        single_split = total < SPLIT_RECORDS or len(self.plan) == 1
        bound: dict[str, Any] = {"max_num_records": total} if single_split else {
            "max_num_records": total * len(self.plan), "max_read_time": self.max_read_time_s or read_seconds(total)}

        def planned(record: KafkaRecord) -> bool:
            return record.offset < stops.get(record.partition, -1)

        def counted(record: KafkaRecord) -> KafkaRecord:
            read_counter.inc()
            return record

        records = (pbegin
                   | "JavaKafkaIO" >> ReadFromKafka(
                       consumer_config=java_consumer_config(self.bootstrap, self.group_id), topics=[self.topic],
                       with_metadata=True, expansion_service=self.expansion_service, **bound)
                   | "ToKafkaRecord" >> beam.Map(_to_record)
                   | "InPlan" >> beam.Filter(planned)
                   | "Count" >> beam.Map(counted))
        _ = (records
             | "Partition" >> beam.Map(lambda r: r.partition)
             | "PerPartition" >> beam.combiners.Count.PerElement()
             | "All" >> beam.combiners.ToList()
             | "Check" >> beam.ParDo(_CheckCounts(self.counts)))
        return (records
                | "Batch" >> beam.BatchElements(min_batch_size=1, max_batch_size=2_000)
                | "Split" >> beam.FlatMap(element_batches))
