"""Write a run's records in one Kafka transaction: a read_committed reader sees all of them or none.

Why: the edge encoder catching up a backlog writes a run's sets from many bundles, not in event-time order.
Written without a transaction, a ``--follow`` shuffler that planned its read in the middle saw a prefix, moved
its watermark past sets still to come, and dead-lettered them as late (issue 34, K1). In one transaction the
run becomes visible at its commit; every reader of this project reads committed, so it plans up to the last
stable offset (the first record of a transaction still open) and never sees half a run.

The transactional id is the writer's own and stable (one per state directory: a restarted writer fences its
earlier self, whose open transaction the broker aborts). librdkafka's transactional producer; the client's
retriable errors are waited out by `transforms.io.kafka.retry`, fatal ones (fenced) are not.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from transforms.io.kafka import retry
from transforms.io.kafka.config import to_librdkafka
from transforms.io.kafka.records import KafkaWriteError

__all__ = ["TransactionalWriter"]

LOG = logging.getLogger(__name__)


class TransactionalWriter:
    """One transactional producer under ``transactional_id``; `write` commits a whole run, or nothing."""

    def __init__(self, bootstrap: str, transactional_id: str, kafka_config: Mapping[str, Any] | None = None,
                 timeout_s: float = 300.0) -> None:
        from confluent_kafka import Producer

        self.transactional_id, self._timeout_s = transactional_id, timeout_s
        settings = {"bootstrap.servers": bootstrap, "client.id": transactional_id,
                    "transactional.id": transactional_id, "transaction.timeout.ms": int(timeout_s * 1000),
                    "linger.ms": 20, "batch.size": 1_000_000, "queue.buffering.max.kbytes": 32 * 1024,
                    "partitioner": "murmur2_random", "logger": logging.getLogger("kafka.librdkafka")}
        settings.update(to_librdkafka(dict(kafka_config or {})))
        settings["on_delivery"] = self._delivered
        self._bootstrap, self._config = bootstrap, dict(kafka_config or {})
        self._written: dict[int, int] = {}  # partition -> last offset written in the current transaction
        self._p = Producer(settings)
        retry.call(f"transaction init of {transactional_id}", lambda: self._p.init_transactions(timeout_s))

    def write(self, topic: str, records: Iterable[tuple[bytes | None, bytes]]) -> int:
        """Produce ``records`` to ``topic`` in one committed transaction; returns the count. KafkaWriteError
        (the transaction aborted: nothing visible) on any failure, including one raised by ``records``."""
        from confluent_kafka import KafkaException

        started = time.monotonic()
        self._p.begin_transaction()
        self._written = {}
        n = 0
        try:
            for key, value in records:
                while True:
                    try:
                        self._p.produce(topic, value, key)
                        break
                    except BufferError:
                        self._p.poll(0.05)
                n += 1
            left = self._p.flush(self._timeout_s)
            if left:
                raise KafkaWriteError(f"{topic}: {left} record(s) undelivered after {self._timeout_s:g} s")
            retry.call(f"transaction commit on {topic}", lambda: self._p.commit_transaction(self._timeout_s))
        except (KafkaException, retry.KafkaCallError) as err:
            self._abort(topic)
            raise KafkaWriteError(f"the transaction of {n} record(s) to {topic!r} ({self.transactional_id}) was "
                                  f"aborted, nothing of it is visible: {retry.describe(err)}", err) from None
        except BaseException:
            self._abort(topic)
            raise
        self._await_visible(topic)
        LOG.info("wrote %d records to %s in one transaction (%.1f s)", n, topic, time.monotonic() - started)
        return n

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is None:
            self._written[msg.partition()] = max(self._written.get(msg.partition(), -1), msg.offset())

    def _await_visible(self, topic: str) -> None:
        """Return once read_committed readers see the committed records: the commit returns when the coordinator
        logged it, the partitions' markers follow; a job planning right after (``esa run``'s shuffler) would
        otherwise stop short of the run."""
        from confluent_kafka import Consumer, TopicPartition

        probe = Consumer({"bootstrap.servers": self._bootstrap, "group.id": "esa-visibility-probe",
                          "isolation.level": "read_committed", "enable.auto.commit": False,
                          "logger": logging.getLogger("kafka.librdkafka"), **to_librdkafka(self._config)})
        deadline = time.monotonic() + self._timeout_s
        try:
            for partition, offset in self._written.items():
                while retry.call(f"watermark offsets of {topic}[{partition}]", lambda p=partition:
                                 probe.get_watermark_offsets(TopicPartition(topic, p), 10, False))[1] <= offset:
                    if time.monotonic() > deadline:
                        raise KafkaWriteError(f"{topic}[{partition}]: committed records not visible after "
                                              f"{self._timeout_s:g} s")
                    time.sleep(0.02)
        finally:
            probe.close()

    def _abort(self, topic: str) -> None:
        try:
            self._p.abort_transaction(self._timeout_s)
        except Exception:  # a fenced or broken producer cannot abort; the broker aborts on timeout or takeover
            LOG.warning("could not abort the transaction on %s", topic, exc_info=True)

    def close(self) -> None:
        self._p.flush(0)
