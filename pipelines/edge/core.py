"""The edge's request handling, independent of the HTTP library: each route is one async method returning a
``Reply``; the server module (``pipelines.edge.server``) only adapts requests and replies.

Durability (the contract devices rely on): ``POST /v1/reports`` answers 202 only once the report is acknowledged
by Kafka (``acks=all``, idempotent producer) or fsynced to the spool. While the spool holds anything, new reports
join it behind the older ones, and a drain thread produces them to Kafka in order, moving the spool's cursor
only past acknowledged records. Kafka unreachable and the spool refusing (full, or the disk low) is 503 with
Retry-After. Nothing here reads the peer's address, port, User-Agent or the request time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from pipelines.edge.keyring import KeyRing
from pipelines.edge.metrics import EdgeMetrics
from pipelines.edge.spool import Spool, SpoolFullError
from transforms.io.kafka.acked import AckedProducer, ProduceError
from transforms.shuffler.edge_admission import RateLimiter, parse_enrolment, verify_token
from transforms.shuffler.edge_rules import (
    PROBLEM_CONTENT_TYPE,
    RefusedError,
    admit_report,
    check_content_type,
    check_declared_length,
    forwarded_record,
    problem_body,
)
from transforms.trust.enrolment import enrolment_record

_log = logging.getLogger("esa.edge")
JSON = "application/json"
DRAIN_BATCH = 500


@dataclass
class Reply:
    status: int
    body: bytes = b""
    content_type: str = JSON
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EdgeSettings:
    reports_topic: str
    devices_topic: str
    enrolment: str  # "token" or "open"
    max_report_bytes: int
    ack_timeout_s: float
    retry_after_s: int
    rate_per_device: float
    burst_per_device: int


def refused(refusal: RefusedError) -> Reply:
    headers = {} if refusal.retry_after is None else {"Retry-After": str(refusal.retry_after)}
    return Reply(refusal.status, problem_body(refusal), PROBLEM_CONTENT_TYPE, headers)


BodyReader = Callable[[int], Awaitable[bytes]]  # read at most n bytes of the body (n+1 tells "too large")


class SpoolWriter:
    """Group commit: appends arriving while an fsync runs wait for the next one, which takes them all."""

    def __init__(self, spool: Spool, executor: ThreadPoolExecutor) -> None:
        self.spool, self._executor = spool, executor
        self._pending: list[tuple[bytes, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None

    async def append(self, body: bytes) -> None:
        future = asyncio.get_running_loop().create_future()
        self._pending.append((body, future))
        if self._task is None:
            self._task = asyncio.ensure_future(self._flush())
        await future

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    await loop.run_in_executor(self._executor, self.spool.append_many, [b for b, _ in batch])
                except Exception as err:  # SpoolFullError or an I/O error: every waiter of this batch is refused
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(err)
                else:
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_result(None)
        finally:
            self._task = None


class Edge:
    """The routes. ``start`` begins the drain thread; ``close`` stops it and flushes the producer."""

    def __init__(self, settings: EdgeSettings, producer: AckedProducer, spool: Spool, keys: KeyRing,
                 metrics: EdgeMetrics, enrol_secret: bytes | None) -> None:
        self.settings, self.producer, self.spool, self.keys, self.metrics = settings, producer, spool, keys, metrics
        self._secret = enrol_secret
        self._limiter = RateLimiter(settings.rate_per_device, settings.burst_per_device)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="esa-edge-spool")
        self._writer = SpoolWriter(spool, self._executor)
        self.kafka_up = spool.depth()[0] == 0
        self._stop = threading.Event()
        self._drainer = threading.Thread(target=self._drain_loop, name="esa-edge-drain", daemon=True)
        metrics.bind(self)

    def start(self) -> None:
        self._drainer.start()

    def close(self) -> None:
        self._stop.set()
        self._drainer.join(timeout=30)
        left = self.producer.close(10.0)
        if left:
            _log.warning("edge: %d records unacknowledged at shutdown (each is also in the spool or was never "
                         "acknowledged to a device)", left)
        self._executor.shutdown(wait=True)
        self.spool.close()

    # -- POST /v1/reports --------------------------------------------------------------------------------

    async def report(self, content_type: str | None, declared_length: int | None, read: BodyReader) -> Reply:
        limit = self.settings.max_report_bytes
        try:
            check_content_type(content_type)
            check_declared_length(declared_length, limit)
            body = await read(limit + 1)
            device_id = admit_report(body, self.keys.sealing_private, limit)
            wait = self._limiter.wait(device_id, time.monotonic())
            if wait:
                raise RefusedError(429, "rate-limited", "Too many reports",
                              "this device sent more reports than the edge accepts per device", wait)
            await self._deliver(body)
        except RefusedError as refusal:
            return refused(refusal)
        return Reply(202, b'{"status":"accepted"}')

    async def _deliver(self, body: bytes) -> None:
        record = forwarded_record(body, time.time_ns() // 1_000_000)
        if self.kafka_up and self.spool.depth()[0] == 0:
            started = time.perf_counter()
            try:
                await self.producer.produce(self.settings.reports_topic, record.value,
                                            timestamp_ms=record.timestamp_ms, timeout_s=self.settings.ack_timeout_s)
                self.metrics.acked(time.perf_counter() - started)
                return
            except ProduceError as err:
                self._set_kafka(False, str(err))
        try:
            await self._writer.append(record.value)
        except (SpoolFullError, OSError) as err:
            self.metrics.spool_refused()
            raise RefusedError(503, "unavailable", "Temporarily unavailable",
                          "the edge can neither reach Kafka nor keep the report on disk now; retry later",
                          self.settings.retry_after_s) from err
        self.metrics.spooled()

    def _set_kafka(self, up: bool, why: str = "") -> None:
        if up != self.kafka_up:
            self.kafka_up = up
            if up:
                _log.info("edge: Kafka acknowledges again; reports go to Kafka directly")
            else:
                _log.warning("edge: Kafka did not acknowledge (%s); reports go to the spool until it does", why)

    # -- the drain -------------------------------------------------------------------------------------------

    def _drain_loop(self) -> None:
        while not self._stop.is_set():
            bodies, cursor = self.spool.peek(DRAIN_BATCH)
            if not bodies:
                self._stop.wait(0.05)
                continue
            if self._produce_all(bodies):
                self.spool.commit(cursor, len(bodies), sum(len(b) for b in bodies))
                self.metrics.drained(len(bodies))
                if self.spool.depth()[0] == 0:
                    self._set_kafka(True)
            else:
                self._set_kafka(False, "spooled reports not acknowledged")
                self._stop.wait(1.0)

    def _produce_all(self, bodies: list[bytes]) -> bool:
        """Produce ``bodies`` in order; True once every one is acknowledged."""
        done = threading.Semaphore(0)
        failures: list[BaseException] = []

        def settle(err: BaseException | None) -> None:
            if err is not None:
                failures.append(err)
            done.release()

        queued = 0
        for body in bodies:
            record = forwarded_record(body, time.time_ns() // 1_000_000)
            try:
                self.producer.produce_callback(self.settings.reports_topic, record.value, settle,
                                               timestamp_ms=record.timestamp_ms)
                queued += 1
            except ProduceError as err:
                failures.append(err)
                break
        deadline = time.monotonic() + 60.0
        for _ in range(queued):
            if not done.acquire(timeout=max(0.0, deadline - time.monotonic())):
                return False
        return not failures

    # -- POST /v1/enrol ----------------------------------------------------------------------------------

    async def enrol(self, content_type: str | None, declared_length: int | None, read: BodyReader) -> Reply:
        try:
            check_content_type(content_type, frozenset({JSON}))
            check_declared_length(declared_length, 4096)
            public_key, token = parse_enrolment(await read(4097), self.settings.enrolment == "token")
            if self.settings.enrolment == "token":
                assert self._secret is not None
                verify_token(self._secret, public_key, token, time.time())
            try:
                key, value = enrolment_record(public_key)
            except ValueError as err:
                raise RefusedError(400, "malformed-enrolment", "Malformed enrolment", str(err)) from None
            try:
                await self.producer.produce(self.settings.devices_topic, value, key=key,
                                            timeout_s=self.settings.ack_timeout_s * 4)
            except ProduceError:
                raise RefusedError(503, "unavailable", "Temporarily unavailable",
                              "the device registry cannot be written now; retry later",
                              self.settings.retry_after_s) from None
        except RefusedError as refusal:
            return refused(refusal)
        return Reply(200, json.dumps({"device_id": key.decode(), "enrolled": True}).encode())

    # -- GET /v1/keys, /healthz, /metrics ----------------------------------------------------------------

    def keys_document(self, if_none_match: str | None) -> Reply:
        body, etag = self.keys.document()
        headers = {"Cache-Control": "public, max-age=300", "ETag": etag}
        if if_none_match is not None and etag in [t.strip() for t in if_none_match.split(",")]:
            return Reply(304, b"", JSON, headers)
        return Reply(200, body, JSON, headers)

    def health(self) -> Reply:
        records, nbytes = self.spool.depth()
        body = {"status": "ok", "kafka": "up" if self.kafka_up else "down", "spool_records": records,
                "spool_bytes": nbytes}
        return Reply(200, json.dumps(body).encode())

    def metrics_text(self) -> Reply:
        body, content_type = self.metrics.exposition()
        return Reply(200, body, content_type)
