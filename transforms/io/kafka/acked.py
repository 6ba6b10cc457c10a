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

from confluent_kafka import KafkaException, Producer

from transforms.io.kafka.clients import CLIENT_ID
from transforms.io.kafka.config import to_librdkafka

__all__ = ["AckedProducer", "ProduceError"]


class ProduceError(RuntimeError):
    """The broker did not acknowledge a record (unreachable, timed out, refused)."""


class AckedProducer:
    """``await produce(topic, value, ...)`` returns once the record is acknowledged by all in-sync replicas.

    ``linger_ms`` 10, not librdkafka's 5 or our former 2: each request waits for its own acknowledgement, so at a
    few thousand requests a second a 2 ms linger sent batches of one or two records, and librdkafka's broker
    thread spent ~100 microseconds of CPU per report (a third of the edge's CPU); 10 ms cut it to ~14 and the
    edge's CPU per report from ~300 to ~165 microseconds (``benchmarks/edge_load.py``, docs/performance.md),
    for at most 10 ms more latency.
    """

    def __init__(self, bootstrap: str, config: Mapping[str, Any] | None = None, *,
                 message_timeout_ms: int = 10_000, linger_ms: int = 10) -> None:
        settings: dict[str, Any] = {
            "bootstrap.servers": bootstrap, "client.id": CLIENT_ID, "enable.idempotence": True, "acks": "all",
            "linger.ms": linger_ms, "message.timeout.ms": message_timeout_ms,
            "queue.buffering.max.messages": 1_000_000, "compression.type": "none",
        }
        settings.update(to_librdkafka(dict(config or {})))
        self._producer = Producer(settings)
        self._lock = threading.Lock()
        self._settled: list[tuple[asyncio.Future[None], Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="esa-acked-producer", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)
            if self._settled:  # one wake-up of the event loop per poll, not one per record
                with self._lock:
                    batch, self._settled = self._settled, []
                batch[0][0].get_loop().call_soon_threadsafe(_settle_all, batch)

    def produce_callback(self, topic: str, value: bytes, done: Callable[[BaseException | None], None], *,
                         key: bytes | None = None, timestamp_ms: int = 0) -> None:
        """Queue one record; ``done(None)`` on acknowledgement, ``done(error)`` otherwise, on the producer's
        thread. Raises ``ProduceError`` at once if the local queue refuses it."""
        def report(err: Any, _msg: Any) -> None:
            done(None if err is None else ProduceError(str(err)))

        try:
            self._producer.produce(topic, value=value, key=key, timestamp=timestamp_ms, on_delivery=report)
        except (BufferError, KafkaException) as err:
            raise ProduceError(str(err)) from None

    async def produce(self, topic: str, value: bytes, *, key: bytes | None = None, timestamp_ms: int = 0,
                      timeout_s: float | None = None) -> None:
        """Produce one record and wait for its acknowledgement; ``ProduceError`` if it is not acknowledged (within
        ``timeout_s``, if given: the record may still be acknowledged later)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def report(err: Any, _msg: Any) -> None:
            with self._lock:
                self._settled.append((future, err))

        try:
            self._producer.produce(topic, value=value, key=key, timestamp=timestamp_ms, on_delivery=report)
        except (BufferError, KafkaException) as err:
            raise ProduceError(str(err)) from None
        timer = None if timeout_s is None else loop.call_later(timeout_s, _expire, future)
        try:
            await future
        finally:
            if timer is not None:
                timer.cancel()

    def topics(self, timeout_s: float) -> set[str]:
        """Names of the cluster's topics; ``ProduceError`` if the cluster does not answer in time."""
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


def _settle_all(batch: list[tuple[asyncio.Future[None], Any]]) -> None:
    for future, err in batch:
        if not future.done():
            if err is None:
                future.set_result(None)
            else:
                future.set_exception(ProduceError(str(err)))


def _expire(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_exception(ProduceError("no acknowledgement in time"))
