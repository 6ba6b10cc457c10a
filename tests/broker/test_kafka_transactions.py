"""Apache Kafka's transactions as this project relies on them, on the real broker, with both Python clients.

Why these matter here: a release published in a transaction is all-or-nothing for a read-committed reader
(every consumer of this project reads committed), and a second producer with the same transactional id
fences the first, so a zombie shuffler cannot finish a release a newer one has taken over.
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaException, Producer

from pipelines.broker import LocalBroker
from transforms.io.kafka.bounded import ensure_topics, read_topic
from transforms.io.kafka.clients import consumer

pytestmark = pytest.mark.slow
CLIENTS = ("confluent", "kafka-python")


def _transactional(bootstrap: str, transactional_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                         "transaction.timeout.ms": 60_000})
    producer.init_transactions(30)
    return producer


def _write(producer: Producer, topic: str, values: list[bytes], *, commit: bool) -> None:
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value)
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


def _uncommitted(bootstrap: str, topic: str) -> list[bytes]:
    """Every record in the log, aborted ones included (isolation.level=read_uncommitted)."""
    from confluent_kafka import Consumer, TopicPartition

    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": "esa-uncommitted-probe",
                       "isolation.level": "read_uncommitted", "enable.auto.commit": False})
    try:
        reader.assign([TopicPartition(topic, 0, 0)])
        out: list[bytes] = []
        for _ in range(50):
            out += [m.value() for m in reader.consume(100, timeout=0.2) if m.error() is None]
            if len(out) >= 10:
                break
        return out
    finally:
        reader.close()


@pytest.mark.parametrize("client", CLIENTS)
def test_an_aborted_transaction_is_invisible_to_the_projects_readers(broker: LocalBroker, topic_name: str,
                                                                     client: str) -> None:
    ensure_topics(broker.bootstrap, [topic_name])
    producer = _transactional(broker.bootstrap, f"txn-{topic_name}")
    committed = [b"c%d" % i for i in range(5)]
    _write(producer, topic_name, committed, commit=True)
    _write(producer, topic_name, [b"a%d" % i for i in range(5)], commit=False)
    assert len(_uncommitted(broker.bootstrap, topic_name)) == 10  # the aborted records are in the log
    assert [r.value for r in read_topic(broker.bootstrap, topic_name, client=client)] == committed
    probe = consumer(client, broker.bootstrap)
    try:  # the planned end is the last stable offset: past both transactions' markers
        _, ends = probe.offsets(topic_name, [0])
        assert ends == {0: 12}
    finally:
        probe.close()


def test_a_zombie_producer_is_fenced(broker: LocalBroker, topic_name: str) -> None:
    ensure_topics(broker.bootstrap, [topic_name])
    zombie = _transactional(broker.bootstrap, f"fence-{topic_name}")
    zombie.begin_transaction()
    zombie.produce(topic_name, b"zombie")
    zombie.flush(30)
    successor = _transactional(broker.bootstrap, f"fence-{topic_name}")  # same id: bumps the epoch
    with pytest.raises(KafkaException) as err:
        zombie.commit_transaction(30)
    assert err.value.args[0].fatal() or "fenced" in str(err.value).lower()
    _write(successor, topic_name, [b"successor"], commit=True)
    assert [r.value for r in read_topic(broker.bootstrap, topic_name)] == [b"successor"]


def test_the_xlang_reads_bound_counts_committed_records_and_its_check_refuses_any_other_count(
        broker: LocalBroker, topic_name: str) -> None:
    """``--kafka_io xlang`` bounds Java's read by the plan's committed records (offsets also hold transaction
    markers and aborted records) and fails the pipeline on any other count per partition."""
    from transforms.io.kafka.bounded import plan_bounded_read
    from transforms.io.kafka.records import KafkaReadError
    from transforms.io.kafka.xlang import _CheckCounts, count_plan

    ensure_topics(broker.bootstrap, [topic_name])
    producer = _transactional(broker.bootstrap, f"{topic_name}-tx")
    _write(producer, topic_name, [b"a", b"b", b"c"], commit=True)
    _write(producer, topic_name, [b"aborted"], commit=False)
    _write(producer, topic_name, [b"d", b"e"], commit=True)
    plan = plan_bounded_read(broker.bootstrap, topic_name, None)
    assert sum(r.stop - r.start for r in plan) == 9  # 5 committed, 1 aborted, 3 markers
    assert count_plan(broker.bootstrap, plan) == {0: 5}
    check = _CheckCounts({0: 5})
    assert list(check.process([(0, 5)])) == []
    for wrong in ([(0, 4)], [(0, 6)], [(0, 5), (1, 1)], []):
        with pytest.raises(KafkaReadError, match="not"):
            list(check.process(wrong))
