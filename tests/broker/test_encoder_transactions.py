"""Issue 34, K1: an encoder run is one Kafka transaction, so a shuffler planning its read while the run is
being written sees none of it (the plan ends at the last stable offset), and all of it once committed.

The race forced: the encoder's writer produces a run's sets out of event-time order (the newest first, as a
backlog catch-up did) and, in the middle of the run, the shuffler plans its read, as a ``--follow`` shuffler
does at any moment. Without the transaction the same plan takes the prefix written so far (the sets whose
event times let its watermark pass the older sets still to come): shown below with a plain producer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from pipelines.broker import LocalBroker
from transforms.io.kafka.bounded import ensure_topics, plan_bounded_read, produce_records, read_topic
from transforms.io.kafka.writer import KafkaTarget, Mode, TransactionalWriter, write_records

pytestmark = pytest.mark.slow
CLIENTS = ("confluent", "kafka-python")
N = 40


def _run(midway: Callable[[], None]) -> Iterator[tuple[bytes, bytes]]:
    """A run's sets, newest event time first; ``midway`` is called after half of them were produced."""
    for i in reversed(range(N)):
        if i == N // 2 - 1:
            midway()
        yield b"device-%d" % (i % 7), b"set with event minute %03d" % i


def _planned(broker: LocalBroker, topic: str, client: str) -> int:
    """What a shuffler planning now would read: records in [committed offset, planned end)."""
    return sum(r.stop - r.start for r in plan_bounded_read(broker.bootstrap, topic, None, client=client))


@pytest.mark.parametrize("client", CLIENTS)
def test_a_shuffler_planning_during_an_encoder_run_sees_none_of_it(broker: LocalBroker, topic_name: str,
                                                                  client: str) -> None:
    ensure_topics(broker.bootstrap, [topic_name], partitions=3)
    seen_midway: list[int] = []
    writer = TransactionalWriter(KafkaTarget.of(broker.bootstrap, topic_name), f"esa-encoder-test-{topic_name}")
    try:
        def plan_now() -> None:
            writer._p.flush(30)  # the first half is in the log, inside the open transaction
            seen_midway.append(_planned(broker, topic_name, client))

        assert writer.write(_run(plan_now)) == N
    finally:
        writer.close()
    assert seen_midway == [0]  # the plan ended at the last stable offset: nothing of the open run
    assert _planned(broker, topic_name, client) >= N  # committed: the whole run (and its commit markers)
    values = sorted(r.value for r in read_topic(broker.bootstrap, topic_name, client=client))
    assert values == sorted(b"set with event minute %03d" % i for i in range(N))


def test_without_a_transaction_the_same_plan_takes_a_prefix(broker: LocalBroker, topic_name: str) -> None:
    """The failure the transaction removes: a plain producer's first half is planned, newest sets first."""
    ensure_topics(broker.bootstrap, [topic_name], partitions=3)
    seen_midway: list[int] = []
    records = list(_run(lambda: None))
    target = KafkaTarget.of(broker.bootstrap, topic_name)
    write_records(target, records[: N // 2], Mode.PLAIN)
    seen_midway.append(_planned(broker, topic_name, "confluent"))
    write_records(target, records[N // 2:], Mode.PLAIN)
    assert seen_midway == [N // 2]


def test_an_aborted_run_is_never_seen(broker: LocalBroker, topic_name: str) -> None:
    ensure_topics(broker.bootstrap, [topic_name])
    writer = TransactionalWriter(KafkaTarget.of(broker.bootstrap, topic_name), f"esa-encoder-test-{topic_name}")

    def crash() -> None:
        raise RuntimeError("the encoder died mid-run")

    try:
        with pytest.raises(RuntimeError, match="died mid-run"):
            writer.write(_run(crash))
        assert writer.write([(b"d", b"the rerun")]) == 1
    finally:
        writer.close()
    assert [r.value for r in read_topic(broker.bootstrap, topic_name)] == [b"the rerun"]


def test_a_partition_with_an_open_transaction_counts_as_active(broker: LocalBroker, topic_name: str,
                                                                tmp_path) -> None:
    """No watermark passes what an open transaction may still add: a shuffler's run planned meanwhile marks the
    partition active at its clock, however long ago its last committed record arrived (the idle rule would
    otherwise move the watermark with the wall clock past the run's sets)."""
    from pathlib import Path

    from confluent_kafka import Producer

    from pipelines.job import plan_run
    from pipelines.job_config import JobConfig
    from transforms.io.kafka.bounded import open_transactions
    from transforms.spec import load_spec

    ensure_topics(broker.bootstrap, [topic_name], partitions=1)
    produce_records(broker.bootstrap, topic_name, [b"committed long ago"])
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"open-{topic_name}"})
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(topic_name, b"in an open run", b"device-1")
    producer.flush(30)
    spec = Path(__file__).resolve().parents[2] / "examples" / "feature_usage.toml"
    config = JobConfig(bootstrap=broker.bootstrap, specs=(load_spec(str(spec)),), out_dir=tmp_path / "out",
                       state_dir=tmp_path / "state", reports_topic=topic_name, group_id=f"g-{topic_name}",
                       now_ms=1_800_000_000_000)
    try:
        run = plan_run(config, "shuffle", topic_name)
        assert [(r.start, r.stop) for r in run.plan] == [(0, 1)]  # the last stable offset: not the open record
        assert open_transactions(broker.bootstrap, run.plan) == [0]
        assert run.state.last_data_wall_ms == {f"{topic_name}/0": 1_800_000_000_000}
        producer.commit_transaction(60)
    finally:
        producer.flush(5)
    later_plan = plan_run(config, "shuffle", topic_name).plan
    assert open_transactions(broker.bootstrap, later_plan) == []
