"""The one place that writes to Kafka: a typed target (broker, topic, client settings) and a mode.

Like Beam's ``kafka.py`` (one ``WriteToKafka`` with its producer config), every write of this project goes
through here, in one of three modes:

- ``PLAIN``: acks=all, no idempotence (a retried send after a lost acknowledgement may be written twice);
- ``IDEMPOTENT`` (the default): acks=all with the idempotent producer's sequence numbers, so a retried send is
  written once (``produce_records``, the Beam sink ``WriteToKafka``);
- ``TRANSACTIONAL``: a run of records in one Kafka transaction under a stable transactional id
  (``TransactionalWriter``): a read_committed reader sees all of them or none.

Why transactions, for both writers that need them: the edge encoder writes a run's sets from many bundles, not
in event-time order; seen half-written, a ``--follow`` shuffler moved its watermark past sets still to come and
dead-lettered them as late (issue 34, K1). The shuffler publishes a release as several batches; published one
by one, a crash in the middle left a partial release on the topic. In a transaction the records become visible
at the commit; every reader of this project reads committed, so it plans up to the last stable offset (Apache
Kafka's exactly-once producer, KIP-98). Initialising a transactional id fences any earlier producer of it (its
open transaction is aborted): a second writer of the same id makes the first fail with ``FencedError`` at its
next write, never add to what the second writes. Transactions need librdkafka: the transactional producer is
confluent-kafka's whatever the target's client says (its settings translated from ``--kafka_config``).
"""

from __future__ import annotations

import atexit
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics

from transforms.io.kafka import retry
from transforms.io.kafka.clients import Element, KafkaWriteError, Producer, producer, split_element
from transforms.io.kafka.config import DEFAULT_CLIENT, check_client, to_librdkafka

__all__ = ["FencedError", "KafkaTarget", "Mode", "TransactionalWriter", "WriteToKafka", "forget_writers",
           "produce_records", "transactional_writer", "write_records"]

_log = logging.getLogger(__name__)


class Mode(Enum):
    PLAIN = "plain"
    IDEMPOTENT = "idempotent"
    TRANSACTIONAL = "transactional"


@dataclass(frozen=True)
class KafkaTarget:
    """Exactly what a write goes to: the broker, the topic, the client library and its settings (frozen, so a
    target can key a cache and travel to Beam workers)."""

    bootstrap: str
    topic: str
    settings: tuple[tuple[str, Any], ...] = ()
    client: str = DEFAULT_CLIENT

    @classmethod
    def of(cls, bootstrap: str, topic: str, settings: Mapping[str, Any] | None = None,
           client: str = DEFAULT_CLIENT) -> KafkaTarget:
        return cls(bootstrap, str(topic), tuple(sorted(dict(settings or {}).items())), client)

    @property
    def config(self) -> dict[str, Any]:
        """The client settings (``--kafka_config``) as the clients take them."""
        return dict(self.settings)


class FencedError(KafkaWriteError):
    """Another producer initialised this writer's transactional id: this one may never write again."""


def write_records(target: KafkaTarget, records: Iterable[Element], mode: Mode = Mode.IDEMPOTENT, *,
                  transactional_id: str | None = None) -> int:
    """Write ``records`` (``bytes`` or ``(key, value)``) to ``target`` in ``mode``; returns the count.

    TRANSACTIONAL needs ``transactional_id`` and uses this process's writer of it (``transactional_writer``)."""
    if mode is Mode.TRANSACTIONAL:
        if not transactional_id:
            raise ValueError("a transactional write needs a transactional id")
        return transactional_writer(target, transactional_id).write(split_element(r) for r in records)
    config = target.config
    if mode is Mode.PLAIN:
        config = {**config, "enable_idempotence": False}
    return produce_records(target.bootstrap, target.topic, records, producer_config=config, client=target.client)


class TransactionalWriter:
    """One transactional producer under ``transactional_id``; ``write`` commits a whole run, or nothing."""

    def __init__(self, target: KafkaTarget, transactional_id: str, *, timeout_s: float = 300.0,
                 client_id: str | None = None) -> None:
        from confluent_kafka import Producer as RdProducer

        self.target, self.transactional_id, self._timeout_s = target, transactional_id, timeout_s
        settings = {"bootstrap.servers": target.bootstrap, "client.id": client_id or transactional_id,
                    "transactional.id": transactional_id, "transaction.timeout.ms": int(timeout_s * 1000),
                    "linger.ms": 20, "batch.size": 1_000_000, "queue.buffering.max.kbytes": 32 * 1024,
                    "partitioner": "murmur2_random", "logger": logging.getLogger("kafka.librdkafka")}
        settings.update(to_librdkafka(target.config))
        settings["on_delivery"] = self._delivered
        self._written: dict[int, int] = {}  # partition -> last offset written in the current transaction
        self._fenced = False
        self._p = RdProducer(settings)
        # Fences any earlier producer of this id and aborts its open transaction; a coordinator still loading (a
        # broker just restarted) answers with a retriable error that transforms.io.kafka.retry waits out.
        retry.call(f"transaction init of {transactional_id}", lambda: self._p.init_transactions(timeout_s))

    def write(self, records: Iterable[tuple[bytes | None, bytes]]) -> int:
        """Produce ``records`` in one committed transaction, visible to read_committed readers on return; returns
        the count. FencedError if another producer took the id over; KafkaWriteError (the transaction aborted:
        nothing visible) on any other failure; an error raised by ``records`` aborts it and goes on up."""
        from confluent_kafka import KafkaException

        topic = self.target.topic
        if self._fenced:
            raise FencedError(f"another producer writes {topic!r} under {self.transactional_id!r} now; this one "
                              "was fenced")
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
            # A retriable commit error (coordinator moving, a time-out) is retried as librdkafka documents:
            # commit_transaction() again; one that requires an abort, or a fatal one, is not retriable.
            retry.call(f"transaction commit on {topic}", lambda: self._p.commit_transaction(self._timeout_s))
        except (KafkaException, SystemError, retry.KafkaCallError) as err:  # SystemError: fatal, via a callback
            cause = err.cause if isinstance(err, retry.KafkaCallError) else err
            kafka_error = retry.kafka_error_of(cause) or _kafka_error(cause)
            if kafka_error is not None and kafka_error.fatal():
                self._fenced = True
                raise FencedError(f"fenced on {topic!r}: another producer initialised transactional id "
                                  f"{self.transactional_id!r} ({kafka_error.str()})", err) from None
            self._abort()
            raise KafkaWriteError(f"the transaction of {n} record(s) to {topic!r} ({self.transactional_id}) was "
                                  f"aborted, nothing of it is visible: {retry.describe(err)}", err) from None
        except BaseException:
            self._abort()
            raise
        self._await_visible()
        _log.info("wrote %d records to %s in one transaction (%.1f s)", n, topic, time.monotonic() - started)
        return n

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is None:
            self._written[msg.partition()] = max(self._written.get(msg.partition(), -1), msg.offset())

    def _await_visible(self) -> None:
        """Return once read_committed readers see the committed records: the commit returns when the coordinator
        logged it, the partitions' markers follow; a job planning right after (``esa run``'s next job) would
        otherwise stop short of what was just written."""
        from confluent_kafka import Consumer, TopicPartition

        topic = self.target.topic
        probe = Consumer({"bootstrap.servers": self.target.bootstrap, "group.id": "esa-visibility-probe",
                          "isolation.level": "read_committed", "enable.auto.commit": False,
                          "logger": logging.getLogger("kafka.librdkafka"), **to_librdkafka(self.target.config)})
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

    def _abort(self) -> None:
        try:
            self._p.abort_transaction(self._timeout_s)
        except Exception:  # a fenced or broken producer cannot abort; the broker aborts on timeout or takeover
            _log.warning("could not abort the transaction on %s", self.target.topic, exc_info=True)

    def close(self) -> None:
        self._p.flush(0)


def _kafka_error(err: BaseException | None) -> Any:
    """The librdkafka KafkaError behind ``err`` (or what it was raised from), if any."""
    while err is not None:
        inner = err.args[0] if err.args else None
        if hasattr(inner, "fatal"):
            return inner
        err = err.__cause__ or err.__context__
    return None


_WRITERS: dict[tuple[KafkaTarget, str], TransactionalWriter] = {}


def transactional_writer(target: KafkaTarget, transactional_id: str, **kwargs: Any) -> TransactionalWriter:
    """This process's writer of ``transactional_id`` to ``target`` (created, and the id claimed, on first use):
    a long-running job claims its id once, not once per write."""
    found = _WRITERS.get((target, transactional_id))
    if found is None:
        found = _WRITERS[(target, transactional_id)] = TransactionalWriter(target, transactional_id, **kwargs)
    return found


def forget_writers() -> None:
    """Drop the cached writers (a test's end): the next write claims its id again. Nothing is pending in them:
    every write committed (and waited for) or aborted its transaction."""
    _WRITERS.clear()


atexit.register(forget_writers)  # before the broker (a test's) is gone: no reconnect attempts at exit


# ---------------------------------------------------------------- idempotent and plain writes


def _flush_s(timeout_s: float | None) -> float:
    """A flush waits as long as the client may retry a record (the retry policy's deadline), plus a margin."""
    return timeout_s if timeout_s is not None else retry.producer_timeout_ms() / 1000 + 10.0


def produce_records(bootstrap: str, topic: str, values: Iterable[Element], *,
                    producer_config: Mapping[str, Any] | None = None,
                    progress: Callable[[int], None] | None = None, progress_every: int = 10_000,
                    flush_timeout_s: float | None = None, client: str = DEFAULT_CLIENT) -> int:
    """Produce `values` outside Beam (drivers, simulator, tests); returns the count, raises on the first failure."""
    if progress_every < 1:
        raise ValueError(f"progress_every must be positive, got {progress_every}")
    out = producer(client, bootstrap, **dict(producer_config or {}))
    n = 0
    try:
        elements = iter(values)
        try:
            while chunk := out.send_many(topic, itertools.islice(elements, progress_every)):
                n += chunk
                if out.error() is not None:
                    break
                if progress is not None and chunk == progress_every:
                    progress(n)
                if chunk < progress_every:
                    break
            out.flush(_flush_s(flush_timeout_s))
        except KafkaWriteError as err:
            raise KafkaWriteError(f"producing to {topic} on {bootstrap} failed: {err}") from err
        error = out.error()
        if progress is not None and error is None and n % progress_every:
            progress(n)
    finally:
        out.close()
    if error is not None:
        raise KafkaWriteError(f"producing to {topic} on {bootstrap} failed: {error}") from error
    _log.info("produced %d records to %s", n, topic)
    return n


class _WriteFn(beam.DoFn):
    def __init__(self, bootstrap: str, topic: str, producer_config: Mapping[str, Any],
                 flush_timeout_s: float, client: str = DEFAULT_CLIENT) -> None:
        self._bootstrap, self._topic, self._config = bootstrap, topic, dict(producer_config)
        self._flush_timeout_s, self._client = flush_timeout_s, check_client(client)
        self._written = Metrics.counter("esa", "kafka_records_written")
        self._producer: Producer | None = None

    def setup(self) -> None:
        self._producer = producer(self._client, self._bootstrap, **self._config)

    def process(self, element: Element) -> None:
        assert self._producer is not None
        key, value = split_element(element)
        self._producer.send(self._topic, key, value)
        self._written.inc()

    def finish_bundle(self) -> None:
        assert self._producer is not None
        try:
            self._producer.flush(self._flush_timeout_s)
        except KafkaWriteError as err:
            raise KafkaWriteError(f"writing to {self._topic} on {self._bootstrap} failed: {err}") from err
        error = self._producer.error()
        if error is not None:  # a refused record poisons this producer: the retried bundle gets a fresh one
            self.teardown()
            self.setup()
            raise KafkaWriteError(f"writing to {self._topic} on {self._bootstrap} failed: {error}") from error

    def teardown(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None


class WriteToKafka(beam.PTransform):
    """Writes `bytes` or `(key, value)` elements to `topic`, idempotently; a bundle fails unless every record
    was acked."""

    def __init__(self, bootstrap: str, topic: str, *, producer_config: Mapping[str, Any] | None = None,
                 flush_timeout_s: float | None = None, client: str = DEFAULT_CLIENT) -> None:
        super().__init__()
        self._fn = _WriteFn(bootstrap, topic, producer_config or {}, _flush_s(flush_timeout_s), client)

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        return pcoll | "Produce" >> beam.ParDo(self._fn)
