"""Release publishing in Kafka transactions, under one stable transactional id per shuffled topic.

Why transactions: a release is several batches; published one by one, a crash in the middle left a partial
release on the topic (the analyzer held it until the republish completed it). In a transaction the batches
become visible together or not at all: every reader of this project reads committed, so an aborted write is
never seen (Apache Kafka's exactly-once producer, KIP-98).

Why one stable id per stream (``esa-shuffler-<shuffled topic>``, the prefix the broker ACLs grant the shuffler,
``pipelines.broker.acls``): only one shuffler may publish to a stream. A second shuffler process (a restarted
one, or another with its own keys and state started against the same topic) initialises the same id, which
bumps its epoch: the broker then fences the first, whose next commit fails with a clear error instead of
publishing a second release of a window. What a fenced shuffler had sealed stays in its ledger, unpublished,
and is republished byte for byte if that shuffler (and only it) is restarted.

Transactions need librdkafka: the release producer is confluent-kafka's whatever ``--kafka_client`` says
(its settings translated from ``--kafka_config``).
"""

from __future__ import annotations

import atexit
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from transforms.io.kafka import retry
from transforms.io.kafka.clients import KafkaWriteError
from transforms.io.kafka.config import to_librdkafka

LOG = logging.getLogger(__name__)
TRANSACTIONAL_PREFIX = "esa-shuffler"  # pipelines.broker.acls.SHUFFLER_TRANSACTIONAL_PREFIX
TIMEOUT_S = 60.0

__all__ = ["ShufflerFencedError", "TransactionalPublisher", "publisher_for", "transactional_id"]


class ShufflerFencedError(KafkaWriteError):
    """Another shuffler took over this stream's transactional id: this one must stop publishing."""


def transactional_id(shuffled_topic: str) -> str:
    """The stream's one transactional id: every shuffler publishing ``shuffled_topic`` uses it."""
    return f"{TRANSACTIONAL_PREFIX}-{shuffled_topic}"


class TransactionalPublisher:
    """One transactional producer; ``publish`` writes a release's records in one transaction."""

    def __init__(self, bootstrap: str, topic: str, kafka_config: Mapping[str, Any] | None = None):
        from confluent_kafka import Producer

        self.topic = topic
        settings = {"bootstrap.servers": bootstrap, "client.id": "esa-shuffler",
                    "transactional.id": transactional_id(topic), "transaction.timeout.ms": int(TIMEOUT_S * 1000),
                    "logger": logging.getLogger("kafka.librdkafka")}
        settings.update(to_librdkafka(dict(kafka_config or {})))
        settings["on_delivery"] = self._delivered
        self._p = Producer(settings)
        # Fences any earlier producer of this id and aborts its open transaction; a coordinator still loading (a
        # broker just restarted) answers with a retriable error that transforms.io.kafka.retry waits out.
        retry.call(f"transaction init of {transactional_id(topic)}", lambda: self._p.init_transactions(TIMEOUT_S))
        self._fenced = False
        self._bootstrap, self._config = bootstrap, dict(kafka_config or {})
        self._written: dict[int, int] = {}  # partition -> last offset written in the current transaction

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is None:
            partition = msg.partition()
            self._written[partition] = max(self._written.get(partition, -1), msg.offset())

    def _await_visible(self) -> None:
        """Wait until read-committed readers see the committed records: the commit returns once the coordinator
        has logged it, and the partitions' commit markers follow; an analyzer planning its read right after
        (``esa run``) would otherwise stop short of the release it just published."""
        import time

        from confluent_kafka import Consumer, TopicPartition

        probe = Consumer({"bootstrap.servers": self._bootstrap, "group.id": "esa-release-probe",
                          "isolation.level": "read_committed", "enable.auto.commit": False,
                          "logger": logging.getLogger("kafka.librdkafka"), **to_librdkafka(self._config)})
        deadline = time.monotonic() + TIMEOUT_S
        try:
            for partition, offset in self._written.items():
                while retry.call(f"watermark offsets of {self.topic}[{partition}]", lambda p=partition:
                                 probe.get_watermark_offsets(TopicPartition(self.topic, p), 10, False))[1] <= offset:
                    if time.monotonic() > deadline:
                        raise KafkaWriteError(f"{self.topic}[{partition}]: committed release not visible after "
                                              f"{TIMEOUT_S:g} s")
                    time.sleep(0.02)
        finally:
            probe.close()

    def publish(self, records: Iterable[tuple[bytes | None, bytes]]) -> int:
        """Produce ``records`` (key, value) in one committed transaction; returns the count. Raises
        ShufflerFencedError if another shuffler took the stream over, KafkaWriteError (transaction aborted, nothing
        visible) on any other failure, including one raised while iterating ``records``."""
        from confluent_kafka import KafkaException

        if self._fenced:
            raise ShufflerFencedError(f"another shuffler publishes to {self.topic!r} now; this one was fenced")
        self._p.begin_transaction()
        self._written = {}
        n = 0
        try:
            for key, value in records:
                while True:
                    try:
                        self._p.produce(self.topic, value, key)
                        break
                    except BufferError:
                        self._p.poll(0.05)
                n += 1
            if self._p.flush(TIMEOUT_S):
                raise KafkaWriteError(f"{self.topic}: records still undelivered after {TIMEOUT_S:g} s")
            # A retriable commit error (coordinator moving, a time-out) is retried as librdkafka documents:
            # commit_transaction() again; one that requires an abort, or a fatal one, is not retriable.
            retry.call(f"transaction commit on {self.topic}", lambda: self._p.commit_transaction(TIMEOUT_S))
        except retry.KafkaCallError as err:
            kafka_error = retry.kafka_error_of(err.cause)
            if kafka_error is not None and kafka_error.fatal():
                self._fenced = True
                raise ShufflerFencedError(f"fenced on {self.topic!r}: another shuffler initialised transactional id "
                                          f"{transactional_id(self.topic)!r} ({kafka_error.str()})") from None
            self._abort()
            raise KafkaWriteError(f"release transaction on {self.topic!r} aborted: {err}") from None
        except (KafkaException, SystemError) as err:  # SystemError: a fatal error surfacing through a callback
            kafka_error = _kafka_error(err)
            if kafka_error is not None and kafka_error.fatal():
                self._fenced = True
                raise ShufflerFencedError(f"fenced on {self.topic!r}: another shuffler initialised transactional id "
                                     f"{transactional_id(self.topic)!r} ({kafka_error})") from None
            self._abort()
            raise KafkaWriteError(f"release transaction on {self.topic!r} aborted: {err}") from None
        except BaseException:
            self._abort()
            raise
        self._await_visible()
        return n

    def _abort(self) -> None:
        try:
            self._p.abort_transaction(TIMEOUT_S)
        except Exception:  # a fenced or broken producer cannot abort; the broker aborts on timeout or takeover
            LOG.warning("could not abort the release transaction on %s", self.topic, exc_info=True)


def _kafka_error(err: BaseException | None) -> Any:
    """The librdkafka KafkaError behind ``err`` (or what it was raised from), if any."""
    while err is not None:
        inner = err.args[0] if err.args else None
        if hasattr(inner, "fatal"):
            return inner
        err = err.__cause__ or err.__context__
    return None


_PUBLISHERS: dict[tuple[str, str, tuple], TransactionalPublisher] = {}


def publisher_for(bootstrap: str, topic: str, kafka_config: Mapping[str, Any] | None = None
                  ) -> TransactionalPublisher:
    """This process's publisher of ``topic`` (created, and the stream claimed, on first use)."""
    key = (bootstrap, topic, tuple(sorted((k, str(v)) for k, v in dict(kafka_config or {}).items())))
    found = _PUBLISHERS.get(key)
    if found is None:
        found = _PUBLISHERS[key] = TransactionalPublisher(bootstrap, topic, kafka_config)
    return found


def forget_publishers() -> None:
    """Drop the cached publishers (a test's end): the next publish claims the stream again. Nothing is pending
    in them: every publish committed (and waited for) or aborted its transaction."""
    _PUBLISHERS.clear()


atexit.register(forget_publishers)  # before the broker (a test's) is gone: no reconnect attempts at exit
