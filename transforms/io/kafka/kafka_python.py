"""The kafka-python (pure Python) side of `transforms.io.kafka.clients`: a consumer, a producer, topic creation.

Kept apart from the librdkafka side so each module stays readable; both implement the same small interface
and route their synchronous requests through `transforms.io.kafka.retry`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from transforms.io.kafka import retry
from transforms.io.kafka.records import CLIENT_ID, MAX_RECORDS, Element, KafkaRecord, split_element
from transforms.io.kafka.topic_ready import wait_for_leaders

_LEADERS_S = 15.0  # a created topic's partitions get leaders within this, or creation fails clearly

# what of --kafka_config the kafka-python admin client takes (connection and identity, not producer/consumer tuning)
_ADMIN_KEYS = ("client_id", "security_protocol", "ssl_", "sasl_", "request_timeout_ms", "api_version",
               "bootstrap_timeout_ms")


class KpConsumer:
    def __init__(self, bootstrap: str, group_id: str | None, config: Mapping[str, Any]) -> None:
        from kafka import KafkaConsumer

        settings: dict[str, Any] = {
            "client_id": CLIENT_ID, "enable_auto_commit": False, "auto_offset_reset": "earliest",
            "isolation_level": "read_committed",  # an aborted transaction's records are never read
            "max_partition_fetch_bytes": 16 * 1024 * 1024,
        }
        settings.update(config)
        self._c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group_id, **settings)

    @staticmethod
    def _tp(topic: str, partition: int) -> Any:
        from kafka import TopicPartition

        return TopicPartition(topic, partition)

    def partitions(self, topic: str) -> list[int]:
        return sorted(retry.call(f"metadata of {topic}", lambda: self._c.partitions_for_topic(topic)) or ())

    def offsets(self, topic: str, partitions: Sequence[int]) -> tuple[dict[int, int], dict[int, int]]:
        tps = [self._tp(topic, p) for p in partitions]
        begin = retry.call(f"beginning offsets of {topic}", lambda: self._c.beginning_offsets(tps))
        end = retry.call(f"end offsets of {topic}", lambda: self._c.end_offsets(tps))
        return {tp.partition: o for tp, o in begin.items()}, {tp.partition: o for tp, o in end.items()}

    def assign(self, topic: str, starts: Mapping[int, int]) -> None:
        tps = {p: self._tp(topic, p) for p in starts}
        self._c.assign(list(tps.values()))
        for p, offset in starts.items():
            self._c.seek(tps[p], offset)

    def poll(self, timeout_s: float, max_records: int = MAX_RECORDS) -> list[KafkaRecord]:
        polled = self._c.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        return [KafkaRecord(m.topic, m.partition, m.offset, m.timestamp, m.key, m.value)
                for messages in polled.values() for m in messages]

    def position(self, topic: str, partition: int) -> int:
        """The next offset to fetch, or -1 if kafka-python cannot say within 10 s (it may return None): the
        caller then keeps the position it read to, which is never ahead of the truth."""
        at = self._c.position(self._tp(topic, partition), timeout_ms=10_000)
        return -1 if at is None else int(at)

    def committed(self, topic: str, partitions: Sequence[int]) -> dict[int, int | None]:
        return {p: retry.call(f"committed offset of {topic}[{p}]", lambda p=p: self._c.committed(self._tp(topic, p)))
                for p in partitions}

    def commit(self, topic: str, offsets: Mapping[int, int]) -> None:
        from kafka.structs import OffsetAndMetadata

        marks = {self._tp(topic, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()}
        retry.call(f"offset commit on {topic}", lambda: self._c.commit(marks))

    def close(self) -> None:
        self._c.close(autocommit=False)


class KpProducer:
    def __init__(self, bootstrap: str, config: Mapping[str, Any]) -> None:
        from kafka import KafkaProducer

        settings: dict[str, Any] = {"client_id": CLIENT_ID, "acks": "all", "linger_ms": 20,
                                    "batch_size": 512 * 1024,
                                    # retriable send errors (a leader moving) are retried by the library,
                                    # within the one deadline of transforms.io.kafka.retry
                                    "retries": 2**31 - 1, "delivery_timeout_ms": retry.producer_timeout_ms()}
        settings.update(config)
        self._p = KafkaProducer(bootstrap_servers=bootstrap, **settings)
        self._error: BaseException | None = None

    def _on_error(self, exc: BaseException) -> None:
        self._error = self._error or exc  # runs on the sender thread

    def send(self, topic: str, key: bytes | None, value: bytes) -> None:
        self._p.send(topic, key=key, value=value).add_errback(self._on_error)

    def send_many(self, topic: str, elements: Iterable[Element]) -> int:
        n = 0
        for element in elements:
            key, value = split_element(element)
            self.send(topic, key, value)
            n += 1
        return n

    def error(self) -> BaseException | None:
        return self._error

    def flush(self, timeout_s: float) -> None:
        # Unsent records raise kafka-python's KafkaTimeoutError, as before this interface existed: the CLI
        # maps kafka errors to "Kafka unreachable" (exit 4).
        self._p.flush(timeout=timeout_s)

    def close(self) -> None:
        self._p.close(timeout=5)


def create_topics(bootstrap: str, topics: Sequence[str], partitions: int, config: Mapping[str, Any]) -> None:
    from kafka import KafkaAdminClient

    settings = {"client_id": CLIENT_ID} | {k: v for k, v in config.items() if k.startswith(_ADMIN_KEYS)}
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, **settings)
    try:
        spec = {t: {"num_partitions": partitions, "replication_factor": 1} for t in topics}
        response = admin.create_topics(spec, raise_errors=False, wait_for_metadata=True)
        refused = [r for r in response.get("topics", []) if r["error_code"] not in (0, 36)]  # 36: already exists
        if refused:  # a principal may write a topic it may not create: an existing topic is all it needs
            known = set(retry.call("metadata", admin.list_topics))
            for result in refused:
                if result["name"] not in known:
                    raise retry.KafkaCallError(f"cannot create topic {result['name']!r} on {bootstrap}: "
                                               f"{result.get('error_message') or result['error_code']}")

        def leaders() -> dict[str, list[int] | None]:
            described = retry.call("metadata", lambda: admin.describe_topics(list(topics)))
            return {d["name"]: None if d["error_code"] else
                    [p["leader_id"] if not p["error_code"] else -1 for p in d["partitions"]] for d in described}

        wait_for_leaders(leaders, topics, bootstrap, _LEADERS_S)
    finally:
        admin.close()
