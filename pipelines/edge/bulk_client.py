"""Many devices' reports posted to the edge at once: HTTP/1.1 pipelining on concurrent keep-alive connections.

Why not ``client.post_reports`` (threads of ``http.client``): its request building and email-parser header
parsing cost more CPU per report than the edge's own handling, on the same cores. Here one asyncio loop drives
``connections`` sockets, each with up to ``depth`` requests written ahead of their answers (the edge answers a
connection's requests in order, so a connection's depth hides the Kafka acknowledgement's latency), and the
answers are parsed by httptools (the edge's own parser). The reports come in chunks from an iterable that a
feeder thread runs (the simulator encodes the next chunk while this one is posted); at most ``max_chunks`` wait.

Answers 429 and 503 are retried after their Retry-After; every other status is final and counted. Plain HTTP
only (loopback demos and simulations); a device talks to a TLS edge through ``client.EdgeClient``.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

import httptools

from pipelines.edge.client import REPORT_TYPE

RETRIED = (429, 503)


class _Connection(asyncio.Protocol):
    def __init__(self, poster: _Poster) -> None:
        self.poster = poster
        self.in_flight: deque[bytes] = deque()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.retry_after: int | None = None
        self.closed = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.poster.pump(self)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as err:
            self.poster.fail(ConnectionError(f"unparsable answer from the edge: {err}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.poster.lost(self)

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"retry-after" and value.isdigit():
            self.retry_after = int(value)

    def on_message_complete(self) -> None:
        status, retry = self.parser.get_status_code(), self.retry_after
        self.retry_after = None
        body = self.in_flight.popleft()
        self.poster.answered(self, body, status, retry)

    def send(self, bodies: list[bytes]) -> None:
        assert self.transport is not None
        head = self.poster.head
        self.in_flight.extend(bodies)
        self.transport.writelines([part for body in bodies for part in (head % len(body), body)])


class _Poster:
    def __init__(self, host: str, port: int, connections: int, depth: int,
                 progress: Callable[[int], None] | None) -> None:
        self.host, self.port, self.connections, self.depth, self.progress = host, port, connections, depth, progress
        self.head = (f"POST /v1/reports HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {REPORT_TYPE}\r\n"
                     "Content-Length: %d\r\n\r\n").encode("latin-1")
        self.loop = asyncio.get_running_loop()
        self.ready: deque[bytes] = deque()
        self.chunk_ends: deque[int] = deque()  # ready-queue positions (from the start) where a fed chunk ends
        self.taken = 0  # bodies taken from ``ready`` so far
        self.fed_all = False
        self.retrying = 0
        self.counts: Counter[int] = Counter()
        self.answers = 0
        self.open: list[_Connection] = []
        self.done: asyncio.Future[None] = self.loop.create_future()
        self.chunk_slots: threading.Semaphore | None = None
        self.reconnects = 0

    async def connect(self) -> None:
        _, conn = await self.loop.create_connection(lambda: _Connection(self), self.host, self.port)
        self.open.append(conn)

    def add(self, chunk: list[bytes]) -> None:
        self.ready.extend(chunk)
        self.chunk_ends.append(self.taken + len(self.ready))
        self.pump_all()

    def finish_feeding(self) -> None:
        self.fed_all = True
        self.check_done()

    def pump_all(self) -> None:
        for conn in self.open:
            self.pump(conn)

    def pump(self, conn: _Connection) -> None:
        if conn.closed or conn.transport is None:
            return
        room = self.depth - len(conn.in_flight)
        if room <= 0 or not self.ready:
            return
        bodies = [self.ready.popleft() for _ in range(min(room, len(self.ready)))]
        self.taken += len(bodies)
        while self.chunk_ends and self.chunk_ends[0] <= self.taken:  # a whole chunk handed out: room for another
            self.chunk_ends.popleft()
            if self.chunk_slots is not None:
                self.chunk_slots.release()
        conn.send(bodies)

    def answered(self, conn: _Connection, body: bytes, status: int, retry_after: int | None) -> None:
        if status in RETRIED:
            self.retrying += 1
            self.loop.call_later(min(retry_after or 1, 5), self._retry, body)
        else:
            self.counts[status] += 1
            self.answers += 1
            if self.progress is not None and self.answers % 1000 == 0:
                self.progress(self.answers)
        self.pump(conn)
        self.check_done()

    def _retry(self, body: bytes) -> None:
        self.retrying -= 1
        self.ready.appendleft(body)
        self.taken -= 1
        self.pump_all()

    def lost(self, conn: _Connection) -> None:
        """The edge closed a connection (keep-alive timeout, restart): its unanswered requests go again."""
        if conn in self.open:
            self.open.remove(conn)
        for body in reversed(conn.in_flight):
            self.ready.appendleft(body)
            self.taken -= 1
        conn.in_flight.clear()
        if self.done.done():
            return
        self.reconnects += 1
        if self.reconnects > 100 * self.connections:
            self.fail(ConnectionError("the edge keeps closing connections"))
            return
        task = self.loop.create_task(self.connect())
        task.add_done_callback(lambda t: t.cancelled() or t.exception() is None or self.fail(t.exception()))

    def check_done(self) -> None:
        if (self.fed_all and not self.ready and not self.retrying and not self.done.done()
                and all(not c.in_flight for c in self.open)):
            self.done.set_result(None)

    def fail(self, err: BaseException | None) -> None:
        if not self.done.done():
            self.done.set_exception(err if err is not None else ConnectionError("posting failed"))


async def _post(url: str, chunks: Iterable[list[bytes]], connections: int, depth: int, max_chunks: int,
                progress: Callable[[int], None] | None, stall_s: float) -> dict[int, int]:
    parts = urlsplit(url)
    if parts.scheme != "http":
        raise ValueError(f"bulk posting speaks plain HTTP (loopback demos); got {url}")
    poster = _Poster(parts.hostname or "127.0.0.1", parts.port or 80, connections, depth, progress)
    poster.chunk_slots = slots = threading.Semaphore(max_chunks)
    stop = threading.Event()

    def feed() -> None:  # the simulator's encoding runs here, beside the posting
        try:
            for chunk in chunks:
                if stop.is_set():
                    return
                slots.acquire()
                poster.loop.call_soon_threadsafe(poster.add, list(chunk))
            poster.loop.call_soon_threadsafe(poster.finish_feeding)
        except BaseException as err:  # the encoder's error is the caller's
            poster.loop.call_soon_threadsafe(poster.fail, err)

    for _ in range(connections):
        await poster.connect()
    feeder = threading.Thread(target=feed, name="esa-bulk-feed", daemon=True)
    feeder.start()
    try:
        last = -1
        while not poster.done.done():  # a watchdog: an edge that stops answering fails the run, not hangs it
            await asyncio.wait([poster.done], timeout=stall_s)
            if not poster.done.done() and poster.answers == last and not poster.retrying:
                poster.fail(TimeoutError(f"the edge answered nothing for {stall_s:.0f} s"))
            last = poster.answers
        poster.done.result()
    finally:
        stop.set()
        for _ in range(max_chunks):
            slots.release()  # a feeder waiting for room sees the stop
        for conn in list(poster.open):
            if conn.transport is not None:
                conn.transport.close()
    if progress is not None and poster.answers % 1000:
        progress(poster.answers)
    return dict(poster.counts)


def post_pipelined(url: str, chunks: Iterable[list[bytes]], *, connections: int = 32, depth: int = 8,
                   max_chunks: int = 4, progress: Callable[[int], None] | None = None,
                   stall_s: float = 120.0) -> dict[int, int]:
    """Post every report of every chunk to ``url``'s ``/v1/reports``; returns how many got each final status
    (202 = accepted). Raises ConnectionError (or the chunks' own error) if the posting cannot finish."""
    return asyncio.run(_post(url, chunks, connections, depth, max_chunks, progress, stall_s))
