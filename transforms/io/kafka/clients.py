"""Two Kafka client libraries behind one small interface: kafka-python (pure Python) and confluent-kafka
(librdkafka, C).

Why both: confluent-kafka reads and writes several times faster (benchmarks/kafka_clients.py), while
kafka-python needs no native library. `transforms.io.kafka.bounded` keeps the semantics (bounded ranges, the
end-of-log probe, commit after success) and only asks a client for these primitives: partitions, offsets,
assign-and-seek, poll, position, committed/commit, send/flush, create topics. Both consumers use manual
assignment and never auto-commit; both producers use acks=all and report every unacknowledged record.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from transforms.io.kafka import retry
from transforms.io.kafka.config import CONFLUENT, KAFKA_PYTHON, check_client, to_librdkafka
from transforms.io.kafka.records import (
    CLIENT_ID,
    MAX_RECORDS,
    Element,
    KafkaReadError,
    KafkaRecord,
    KafkaWriteError,
    split_element,
)
from transforms.io.kafka.retry import KafkaCallError
from transforms.io.kafka.topic_ready import wait_for_leaders

__all__ = ["CLIENT_ID", "MAX_RECORDS", "Consumer", "Element", "KafkaReadError", "KafkaRecord", "KafkaWriteError",
           "Producer", "consumer", "create_topics", "producer", "split_element"]

_log = logging.getLogger(__name__)
_NO_GROUP = "esa-telemetry-unused"  # librdkafka insists on a group.id; manual assignment never joins it


class Consumer(Protocol):
    def partitions(self, topic: str) -> list[int]: ...
    def offsets(self, topic: str, partitions: Sequence[int]) -> tuple[dict[int, int], dict[int, int]]: ...
    def assign(self, topic: str, starts: Mapping[int, int]) -> None: ...
    def poll(self, timeout_s: float, max_records: int = MAX_RECORDS) -> list[KafkaRecord]: ...
    def position(self, topic: str, partition: int) -> int: ...
    def committed(self, topic: str, partitions: Sequence[int]) -> dict[int, int | None]: ...
    def commit(self, topic: str, offsets: Mapping[int, int]) -> None: ...
    def close(self) -> None: ...


class Producer(Protocol):
    def send(self, topic: str, key: bytes | None, value: bytes) -> None: ...
    def send_many(self, topic: str, elements: Iterable[Element]) -> int: ...
    def error(self) -> BaseException | None: ...
    def flush(self, timeout_s: float) -> None: ...
    def close(self) -> None: ...


# ---------------------------------------------------------------- confluent-kafka (librdkafka)

_TIMEOUT_S = 15.0  # metadata, offsets and commits
_LOG = logging.getLogger("kafka.librdkafka")  # under "kafka": quieted with kafka-python's logs


def _rd_settings(bootstrap: str) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "client.id": CLIENT_ID, "logger": _LOG}


class _CkConsumer:
    def __init__(self, bootstrap: str, group_id: str | None, config: Mapping[str, Any]) -> None:
        from confluent_kafka import Consumer as RdConsumer

        settings = _rd_settings(bootstrap)
        settings.update({
            "group.id": group_id or _NO_GROUP, "enable.auto.commit": False, "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",  # an aborted transaction's records are never read
            # Manual assignment never joins the group, so these only bound a misuse.
            "session.timeout.ms": 10_000, "max.poll.interval.ms": 10_000,
            "fetch.max.bytes": 64 * 1024 * 1024, "max.partition.fetch.bytes": 16 * 1024 * 1024,
            # Prefetch: at most 32 MiB per partition (was 256 MiB: a whole bounded read sat in the queue). Speed
            # needs the default 100k-message refill and >= 16 MiB (measured on 300 B records: 285k/s at 32 MiB,
            # 268k/s at 16, 84k/s at 8; 135k/s with a 20k-message refill).
            "queued.max.messages.kbytes": 32 * 1024, "fetch.wait.max.ms": 100,
        })
        settings.update(to_librdkafka(config))
        self._c = RdConsumer(settings)
        self._next: dict[tuple[str, int], int] = {}  # last delivered offset + 1, per partition

    def partitions(self, topic: str) -> list[int]:
        from confluent_kafka import KafkaError, KafkaException

        def ask() -> list[int]:
            meta = self._c.list_topics(topic, timeout=_TIMEOUT_S).topics.get(topic)
            if meta is None or (meta.error is not None and meta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
                return []  # not (yet) in the metadata: the caller decides whether to wait (`wait_for_partitions`)
            if meta.error is not None:
                raise KafkaException(meta.error)  # LEADER_NOT_AVAILABLE of a topic being created: retried
            return sorted(meta.partitions)

        return retry.call(f"metadata of {topic}", ask)

    def offsets(self, topic: str, partitions: Sequence[int]) -> tuple[dict[int, int], dict[int, int]]:
        """(low, high) per partition; high is the last stable offset for this read_committed consumer (librdkafka
        asks ListOffsets with the consumer's isolation level): never past an open transaction's first record."""
        from confluent_kafka import TopicPartition

        def watermarks(p: int) -> tuple[int, int]:
            try:
                return self._c.get_watermark_offsets(TopicPartition(topic, p), timeout=_TIMEOUT_S)
            except Exception:
                # librdkafka answers from its metadata cache: ask for the topic's metadata before the retry, so
                # the next attempt finds a leader elected meanwhile
                with contextlib.suppress(Exception):
                    self._c.list_topics(topic, timeout=5)
                raise

        marks = {p: retry.call(f"watermark offsets of {topic}[{p}]", lambda p=p: watermarks(p)) for p in partitions}
        return {p: int(low) for p, (low, _) in marks.items()}, {p: int(high) for p, (_, high) in marks.items()}

    def assign(self, topic: str, starts: Mapping[int, int]) -> None:
        from confluent_kafka import TopicPartition

        self._c.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
        self._next = {(topic, p): o for p, o in starts.items()}

    def poll(self, timeout_s: float, max_records: int = MAX_RECORDS) -> list[KafkaRecord]:
        messages = self._c.consume(num_messages=max(1, min(max_records, 1_000_000)), timeout=timeout_s)
        out: list[KafkaRecord] = []
        append, make = out.append, tuple.__new__  # the hot loop: ~6 C calls per record, no keyword parsing
        for m in messages:
            if m.error() is not None:
                self._on_error(m)
                continue
            append(make(KafkaRecord, (m.topic(), m.partition(), m.offset(), m.timestamp()[1], m.key(), m.value())))
        # Where each partition got to; with one partition assigned (a range read) its last record says it.
        self._next.update({(r.topic, r.partition): r.offset + 1 for r in (out[-1:] if len(self._next) == 1 else out)})
        return out

    @staticmethod
    def _on_error(m: Any) -> None:
        from confluent_kafka import KafkaError

        err = m.error()
        if err.code() == KafkaError._PARTITION_EOF:
            return
        if err.fatal() or not err.retriable():
            raise KafkaReadError(f"reading {m.topic()}[{m.partition()}]: {err}")
        _log.warning("transient Kafka read error: %s", err)

    def position(self, topic: str, partition: int) -> int:
        from confluent_kafka import TopicPartition

        reported = self._c.position([TopicPartition(topic, partition)])[0].offset
        return max(int(reported), self._next.get((topic, partition), -1))

    def committed(self, topic: str, partitions: Sequence[int]) -> dict[int, int | None]:
        from confluent_kafka import TopicPartition

        def ask() -> list[Any]:
            found = self._c.committed([TopicPartition(topic, p) for p in partitions], timeout=_TIMEOUT_S)
            _raise_partition_error(found)
            return list(found)

        found = retry.call(f"committed offsets of {topic}", ask)
        return {tp.partition: (int(tp.offset) if tp.offset >= 0 else None) for tp in found}

    def commit(self, topic: str, offsets: Mapping[int, int]) -> None:
        from confluent_kafka import TopicPartition

        def ask() -> None:
            done = self._c.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()],
                                  asynchronous=False)
            _raise_partition_error(done or ())

        retry.call(f"offset commit on {topic}", ask)

    def close(self) -> None:
        self._c.close()


def _raise_partition_error(partitions: Iterable[Any]) -> None:
    """A per-partition error of a committed()/commit() answer, raised so `retry.call` judges it."""
    from confluent_kafka import KafkaException

    failed = [tp for tp in partitions if tp.error is not None]
    if failed:
        raise KafkaException(failed[0].error)


class _CkProducer:
    def __init__(self, bootstrap: str, config: Mapping[str, Any]) -> None:
        from confluent_kafka import Producer as RdProducer

        settings = _rd_settings(bootstrap)
        settings.update({
            # Idempotent: a retried send after a lost acknowledgement is not written twice (sequence numbers).
            "acks": "all", "enable.idempotence": True,
            "linger.ms": 20, "batch.size": 1_000_000, "batch.num.messages": 100_000,
            # The local queue bounds memory, not speed (a full queue waits for deliveries): 512 MiB let a
            # bounded run's whole output sit in it (~0.4 kB per record measured).
            "compression.type": "none", "queue.buffering.max.messages": 100_000,
            "queue.buffering.max.kbytes": 32 * 1024,
            "partitioner": "murmur2_random",  # keyed records land where kafka-python (and Java) put them
            # Unkeyed records spread over every partition, as kafka-python spreads them: the sticky default put a
            # whole bounded burst (20k records) in one partition, leaving the readers' parallelism unused.
            "sticky.partitioning.linger.ms": 0,
            # Retriable send errors (a leader moving, a broker restarting) are retried by librdkafka itself,
            # idempotently, within the one deadline of transforms.io.kafka.retry.
            "message.timeout.ms": retry.producer_timeout_ms(),
        })
        settings.update(to_librdkafka(config))
        settings["on_delivery"] = self._on_delivery  # one producer-wide report callback, none per record
        self._p = RdProducer(settings)
        self._error: BaseException | None = None

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is not None and self._error is None:
            from confluent_kafka import KafkaException

            self._error = KafkaException(err)

    def send(self, topic: str, key: bytes | None, value: bytes) -> None:
        while True:
            try:
                self._p.produce(topic, value, key)
                return
            except BufferError:  # local queue full: let deliveries drain
                self._p.poll(0.05)

    def send_many(self, topic: str, elements: Iterable[Element]) -> int:
        produce, poll = self._p.produce, self._p.poll  # the hot loop: one C call per record
        n = 0
        for n, element in enumerate(elements, start=1):
            key, value = element if type(element) is tuple else split_element(element)
            try:
                produce(topic, value, key)
            except BufferError:
                self.send(topic, key, value)
            if not n % 10_000:  # serve delivery reports now and then, not per record
                poll(0)
        return n

    def error(self) -> BaseException | None:
        return self._error

    def flush(self, timeout_s: float) -> None:
        left = self._p.flush(timeout_s)
        if left:
            self._p.purge()
            self._p.flush(0)
            raise KafkaWriteError(f"{left} record(s) not acknowledged within {timeout_s:g} s"
                                  + (f": {self._error}" if self._error else ""))

    def close(self) -> None:
        self._p.purge()  # anything unflushed was never acknowledged; its caller already raised
        self._p.flush(0)


def _ck_create_topics(bootstrap: str, topics: Sequence[str], partitions: int, config: Mapping[str, Any]) -> None:
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic

    settings = _rd_settings(bootstrap)
    settings.update({k: v for k, v in to_librdkafka(config).items()
                     if k.startswith(("security.", "ssl.", "sasl.", "socket.", "client."))})
    admin = AdminClient(settings)
    futures = admin.create_topics([NewTopic(t, partitions, 1) for t in topics], operation_timeout=_TIMEOUT_S,
                                  request_timeout=_TIMEOUT_S)
    refused = {}
    for topic, future in futures.items():
        try:
            future.result(timeout=_TIMEOUT_S + 5)
        except Exception as exc:
            err = exc.args[0] if exc.args else None
            if getattr(err, "code", lambda: None)() != KafkaError.TOPIC_ALREADY_EXISTS:
                refused[topic] = exc
    if refused:  # a principal may write a topic it may not create: an existing topic is all it needs
        known = retry.call("metadata", lambda: admin.list_topics(timeout=_TIMEOUT_S)).topics
        for topic, exc in refused.items():
            if topic not in known or known[topic].error is not None:
                raise KafkaCallError(f"cannot create topic {topic!r} on {bootstrap}: {retry.describe(exc)}", exc)
    def leaders() -> dict[str, list[int] | None]:
        known = retry.call("metadata", lambda: admin.list_topics(timeout=_TIMEOUT_S)).topics
        return {t: None if t not in known or known[t].error is not None
                else [p.leader if p.error is None else -1 for p in known[t].partitions.values()] for t in topics}

    wait_for_leaders(leaders, topics, bootstrap, _TIMEOUT_S)


# ---------------------------------------------------------------- selection

def consumer(client: str, bootstrap: str, group_id: str | None = None, **config: Any) -> Consumer:
    """A manual-assignment consumer of library ``client``; never auto-commits."""
    if check_client(client) == CONFLUENT:
        return _CkConsumer(bootstrap, group_id, config)
    from transforms.io.kafka.kafka_python import KpConsumer

    return KpConsumer(bootstrap, group_id, config)


def producer(client: str, bootstrap: str, **config: Any) -> Producer:
    """An acks=all producer of library ``client``."""
    if check_client(client) == CONFLUENT:
        return _CkProducer(bootstrap, config)
    from transforms.io.kafka.kafka_python import KpProducer

    return KpProducer(bootstrap, config)


def create_topics(client: str, bootstrap: str, topics: Sequence[str], partitions: int,
                  config: Mapping[str, Any]) -> None:
    """Create ``topics``; existing ones are left as they are."""
    if check_client(client) == CONFLUENT:
        _ck_create_topics(bootstrap, topics, partitions, config)
    else:
        assert client == KAFKA_PYTHON
        from transforms.io.kafka.kafka_python import create_topics as kp_create_topics

        kp_create_topics(bootstrap, topics, partitions, config)
