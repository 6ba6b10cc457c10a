"""A Kafka producer whose every record resolves an asyncio future once the broker acknowledged it (or refused).

For a service that answers a request only once its record is durable (the ingestion edge: 202 = in Kafka or in
the spool). confluent-kafka (librdkafka) with ``acks=all`` and the idempotent producer (a retried batch is
written once, in order); one background thread serves its delivery callbacks and hands each result to the
event loop. Records carry no key and no headers unless given; the caller chooses the timestamp.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from typing import Any

from transforms.io.kafka.clients import CLIENT_ID
from transforms.io.kafka.config import to_librdkafka

__all__ = ["AckedProducer", "ProduceError"]


class ProduceError(RuntimeError):
    """The broker did not acknowledge a record (unreachable, timed out, refused)."""


class AckedProducer:
    """``await produce(topic, value, ...)`` returns once the record is acknowledged by all in-sync replicas."""

    def __init__(self, bootstrap: str, config: Mapping[str, Any] | None = None, *,
                 message_timeout_ms: int = 10_000, linger_ms: int = 2) -> None:
        from confluent_kafka import Producer

        settings: dict[str, Any] = {
            "bootstrap.servers": bootstrap, "client.id": CLIENT_ID, "enable.idempotence": True, "acks": "all",
            "linger.ms": linger_ms, "message.timeout.ms": message_timeout_ms,
            "queue.buffering.max.messages": 1_000_000, "compression.type": "none",
        }
        settings.update(to_librdkafka(dict(config or {})))
        self._producer = Producer(settings)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="esa-acked-producer", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)

    def produce_callback(self, topic: str, value: bytes, done: Callable[[BaseException | None], None], *,
                         key: bytes | None = None, timestamp_ms: int = 0) -> None:
        """Queue one record; ``done(None)`` on acknowledgement, ``done(error)`` otherwise, on the producer's
        thread. Raises ``ProduceError`` at once if the local queue refuses it."""
        from confluent_kafka import KafkaException

        def report(err: Any, _msg: Any) -> None:
            done(None if err is None else ProduceError(str(err)))

        try:
            self._producer.produce(topic, value=value, key=key, timestamp=timestamp_ms, on_delivery=report)
        except (BufferError, KafkaException) as err:
            raise ProduceError(str(err)) from None

    async def produce(self, topic: str, value: bytes, *, key: bytes | None = None, timestamp_ms: int = 0) -> None:
        """Produce one record and wait for its acknowledgement; ``ProduceError`` if it is not acknowledged."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def settle(fut: asyncio.Future[None], err: BaseException | None) -> None:
            if not fut.done():
                if err is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(err)

        self.produce_callback(topic, value, lambda err: loop.call_soon_threadsafe(settle, future, err),
                              key=key, timestamp_ms=timestamp_ms)
        await future

    def topics(self, timeout_s: float) -> set[str]:
        """Names of the cluster's topics; ``ProduceError`` if the cluster does not answer in time."""
        from confluent_kafka import KafkaException

        try:
            return set(self._producer.list_topics(timeout=timeout_s).topics)
        except KafkaException as err:
            raise ProduceError(str(err)) from None

    def in_queue(self) -> int:
        return len(self._producer)

    def close(self, timeout_s: float = 10.0) -> int:
        """Flush for up to ``timeout_s``; the number of records still unacknowledged."""
        left = self._producer.flush(timeout_s)
        self._stop.set()
        self._thread.join(timeout=5)
        return int(left)
