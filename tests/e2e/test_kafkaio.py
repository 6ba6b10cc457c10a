"""Kafka IO against a real Apache Kafka broker and Beam's FnApiRunner (no mocks)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections import Counter

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.runners.runner import PipelineResult
from apache_beam.testing.util import assert_that, equal_to

from pipelines.broker import BrokerError, LocalBroker
from transforms.io.kafka.bounded import (
    KafkaRecord,
    PartitionRange,
    ReadFromKafkaBounded,
    WriteToKafka,
    _ReadPartitionRangeFn,
    ensure_topics,
    plan_bounded_read,
    produce_records,
    read_from_kafka,
    read_topic,
    run_and_commit,
)
from transforms.io.kafka.config import CLIENTS, CONFLUENT, KAFKA_PYTHON

pytestmark = pytest.mark.slow
FAST_FAIL = {  # give up on an unreachable broker within seconds, in each client's own settings
    KAFKA_PYTHON: {"bootstrap_timeout_ms": 2000, "max_block_ms": 2000, "request_timeout_ms": 2000},
    CONFLUENT: {"delivery_timeout_ms": 2000, "socket_timeout_ms": 2000},
}


@pytest.fixture(params=CLIENTS)
def client(request: pytest.FixtureRequest) -> str:
    """Every test below runs once per Kafka client library."""
    return str(request.param)


def _pipeline() -> beam.Pipeline:
    return beam.Pipeline(runner=FnApiRunner())


def _counter(result: PipelineResult, name: str) -> int:
    counters = result.metrics().query(MetricsFilter().with_namespace("esa").with_name(name))["counters"]
    return sum(c.committed for c in counters)


def _triples(records: list[KafkaRecord]) -> list[tuple[int, int, bytes]]:
    return [(r.partition, r.offset, r.value) for r in records]


def _read_and_commit(bootstrap: str, topic: str, group: str, expected: list[tuple[int, int, bytes]],
                     client: str) -> int:
    """One bounded job: assert it sees exactly `expected`, commit, return the records-read counter."""
    reader = ReadFromKafkaBounded(bootstrap, topic, group, client=client)
    p = _pipeline()
    assert_that(p | reader | beam.Map(lambda r: (r.partition, r.offset, r.value)), equal_to(expected))
    return _counter(run_and_commit(p, reader), "kafka_records_read")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_bounded_read_reads_each_record_once_and_resumes_after_commit(broker: LocalBroker,
                                                                      topic_name: str, client: str) -> None:
    bootstrap, group, n = broker.bootstrap, f"{topic_name}-job", 20_000
    ensure_topics(bootstrap, [topic_name], partitions=3, client=client)
    ensure_topics(bootstrap, [topic_name], partitions=3, client=client)  # idempotent
    values = [b"v%06d" % i for i in range(n)]
    progress: list[int] = []
    t0 = time.perf_counter()
    assert produce_records(bootstrap, topic_name, values, progress=progress.append, progress_every=5000,
                           client=client) == n
    produce_s = time.perf_counter() - t0
    assert progress == [5000, 10000, 15000, 20000]

    # Ground truth: every value once, offsets 0..count-1 in every partition (no record past a short end).
    truth = _triples(read_topic(bootstrap, topic_name, client=client))
    assert sorted(v for _, _, v in truth) == values
    per_partition = {p: sorted(o for q, o, _ in truth if q == p) for p in range(3)}
    assert all(offsets == list(range(len(offsets))) and offsets for offsets in per_partition.values())

    t0 = time.perf_counter()
    assert _read_and_commit(bootstrap, topic_name, group, truth, client) == n
    read_s = time.perf_counter() - t0
    print(f"\nproduce_records: {n / produce_s:,.0f} rec/s; ReadFromKafkaBounded job: {n / read_s:,.0f} rec/s")

    plan = plan_bounded_read(bootstrap, topic_name, group, client=client)
    assert [(r.start, r.stop) for r in plan] == [(len(per_partition[p]),) * 2 for p in range(3)]
    assert _read_and_commit(bootstrap, topic_name, group, [], client) == 0

    more = [b"w%03d" % i for i in range(100)]
    produce_records(bootstrap, topic_name, more, client=client)
    new = [t for t in _triples(read_topic(bootstrap, topic_name, client=client)) if t[2] in set(more)]
    assert len(new) == 100 and all(o >= len(per_partition[p]) for p, o, _ in new)
    assert _read_and_commit(bootstrap, topic_name, group, new, client) == 100


def test_unkeyed_burst_spreads_over_every_partition(broker: LocalBroker, topic_name: str, client: str) -> None:
    """Readers parallelize by partition: a burst of unkeyed records must not land in one of them.

    librdkafka's sticky partitioner (its default) put 20,000 records written in a few milliseconds into one
    partition. Each record now picks a partition at random, so each of 3 gets Binomial(3000, 1/3): mean 1000,
    standard deviation 26; at least 700 is 11 standard deviations below the mean. CI once saw 1,654 / 667 / 679:
    the producer's first metadata listed two partitions without a leader, and the partitioner, drawing again
    after a leaderless draw, put 5/9 in partition 0; creating a topic now waits for every partition's leader.
    """
    ensure_topics(broker.bootstrap, [topic_name], partitions=3, client=client)
    produce_records(broker.bootstrap, topic_name, [b"u%05d" % i for i in range(3000)], client=client)
    per_partition = np.bincount([r.partition for r in read_topic(broker.bootstrap, topic_name, client=client)],
                                minlength=3)
    assert per_partition.sum() == 3000 and per_partition.min() >= 700, per_partition


def _explode(record: KafkaRecord) -> KafkaRecord:
    raise ValueError(f"boom at offset {record.offset}")


def test_failed_run_commits_nothing(broker: LocalBroker, topic_name: str, client: str) -> None:
    bootstrap, group = broker.bootstrap, f"{topic_name}-job"
    ensure_topics(bootstrap, [topic_name], partitions=2, client=client)
    produce_records(bootstrap, topic_name, [(b"k%d" % i, b"v%d" % i) for i in range(50)], client=client)

    reader = ReadFromKafkaBounded(bootstrap, topic_name, group, client=client)
    p = _pipeline()
    _ = p | reader | beam.Map(_explode)
    with pytest.raises(Exception, match="boom"):
        run_and_commit(p, reader)
    plan = plan_bounded_read(bootstrap, topic_name, group, client=client)
    assert all(r.start == 0 for r in plan) and sum(r.stop for r in plan) == 50

    readers: list[ReadFromKafkaBounded] = []
    p = _pipeline()
    records = read_from_kafka(p, bootstrap=bootstrap, topic=topic_name, group_id=group, readers=readers,
                              client=client)
    assert_that(records | beam.Map(lambda r: (r.key, r.value)),
                equal_to([(b"k%d" % i, b"v%d" % i) for i in range(50)]))
    run_and_commit(p, *readers)
    assert all(r.start == r.stop for r in plan_bounded_read(bootstrap, topic_name, group, client=client))


def test_read_that_cannot_reach_its_stop_fails_clearly(broker: LocalBroker, topic_name: str, client: str) -> None:
    ensure_topics(broker.bootstrap, [topic_name], client=client)
    produce_records(broker.bootstrap, topic_name, [b"only", b"two"], client=client)
    p = _pipeline()
    _ = (p | beam.Create([PartitionRange(topic_name, 0, 0, 5)])
         | beam.ParDo(_ReadPartitionRangeFn(broker.bootstrap, {}, stall_timeout_s=1.0, client=client)))
    with pytest.raises(Exception, match=rf"no progress reading {topic_name}\[0\].*at offset 2, planned \[0, 5\)"):
        p.run().wait_until_finish()


def test_unknown_implementation_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown Kafka implementation"):
        read_from_kafka(_pipeline(), bootstrap="127.0.0.1:1", topic="t", group_id="g", implementation="java")


def test_write_to_kafka_writes_every_element(broker: LocalBroker, topic_name: str, client: str) -> None:
    ensure_topics(broker.bootstrap, [topic_name], partitions=2, client=client)
    plain = [b"p%04d" % i for i in range(1500)]
    keyed = [(b"key%d" % (i % 7), b"k%04d" % i) for i in range(1500)]
    p = _pipeline()
    _ = p | beam.Create([*plain, *keyed]) | WriteToKafka(broker.bootstrap, topic_name, client=client)
    result = p.run()
    result.wait_until_finish()
    assert _counter(result, "kafka_records_written") == 3000
    records = read_topic(broker.bootstrap, topic_name, client=client)
    assert Counter((r.key, r.value) for r in records) == Counter([(None, v) for v in plain] + keyed)


def test_write_to_unreachable_broker_fails_fast(client: str) -> None:
    bootstrap = f"127.0.0.1:{_closed_port()}"
    p = _pipeline()
    _ = p | beam.Create([b"x", b"y"]) | WriteToKafka(bootstrap, "nowhere", producer_config=FAST_FAIL[client],
                                                         client=client)
    t0 = time.monotonic()
    with pytest.raises(Exception, match=r"bootstrap|[Tt]imeout|timed out"):
        p.run().wait_until_finish()
    assert time.monotonic() - t0 < 15


def test_local_broker_lifecycle(broker: LocalBroker, client: str) -> None:
    with LocalBroker() as local:
        assert local.bootstrap.startswith("127.0.0.1:") and local.running
        assert local.bootstrap != broker.bootstrap
        ensure_topics(local.bootstrap, ["lifecycle"], client=client)
        port = local.port
    assert not local.running
    local.stop()  # second stop is a no-op
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass
    with pytest.raises(BrokerError, match="already in use"):
        LocalBroker(port=broker.port).start()


def test_run_broker_forever_serves_until_sigint() -> None:
    code = "import sys; from pipelines.broker import run_broker_forever; sys.exit(run_broker_forever(None))"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        bootstrap = proc.stdout.readline().strip()
        assert bootstrap.startswith("127.0.0.1:")
        ensure_topics(bootstrap, ["cli"])
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_batched_read_yields_lists_covering_every_record_once(broker: LocalBroker, topic_name: str,
                                                             client: str) -> None:
    """batched=True (what the end-to-end pipeline uses): lists of at most 2,000 records, none lost or repeated."""
    bootstrap = broker.bootstrap
    ensure_topics(bootstrap, [topic_name], partitions=2, client=client)
    produce_records(bootstrap, topic_name, [b"b%05d" % i for i in range(5_000)], client=client)
    truth = _triples(read_topic(bootstrap, topic_name, client=client))
    reader = ReadFromKafkaBounded(bootstrap, topic_name, f"{topic_name}-job", batched=True, client=client)
    p = _pipeline()
    batches = p | reader
    sizes_ok = batches | "SizesOk" >> beam.Map(lambda b: isinstance(b, list) and 0 < len(b) <= 2_000)
    assert_that(sizes_ok | beam.Distinct(), equal_to([True]), label="AllLists")
    flat = batches | beam.FlatMap(lambda b: [(r.partition, r.offset, r.value) for r in b])
    assert_that(flat, equal_to(truth), label="EveryRecordOnce")
    assert _counter(run_and_commit(p, reader), "kafka_records_read") == 5_000
