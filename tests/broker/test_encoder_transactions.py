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
from transforms.io.kafka.transactions import TransactionalWriter

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
    writer = TransactionalWriter(broker.bootstrap, f"esa-encoder-test-{topic_name}")
    try:
        def plan_now() -> None:
            writer._p.flush(30)  # the first half is in the log, inside the open transaction
            seen_midway.append(_planned(broker, topic_name, client))

        assert writer.write(topic_name, _run(plan_now)) == N
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
    produce_records(broker.bootstrap, topic_name, records[: N // 2])
    seen_midway.append(_planned(broker, topic_name, "confluent"))
    produce_records(broker.bootstrap, topic_name, records[N // 2:])
    assert seen_midway == [N // 2]


def test_an_aborted_run_is_never_seen(broker: LocalBroker, topic_name: str) -> None:
    ensure_topics(broker.bootstrap, [topic_name])
    writer = TransactionalWriter(broker.bootstrap, f"esa-encoder-test-{topic_name}")

    def crash() -> None:
        raise RuntimeError("the encoder died mid-run")

    try:
        with pytest.raises(RuntimeError, match="died mid-run"):
            writer.write(topic_name, _run(crash))
        assert writer.write(topic_name, [(b"d", b"the rerun")]) == 1
    finally:
        writer.close()
    assert [r.value for r in read_topic(broker.bootstrap, topic_name)] == [b"the rerun"]
