"""A device's HTTP side in Python: fetch the signed keys, enrol, post reports (standard library only).

What ``esa simulate`` and ``esa demo`` use to send simulated devices' reports through the edge, and what the
tests use as "the Python client over HTTP". One keep-alive connection per ``EdgeClient``; not thread-safe
(use one per thread).
"""

from __future__ import annotations

import http.client
import json
import queue
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import NamedTuple
from urllib.parse import urlsplit

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from transforms.device.keys_document import CurrentKeys, read_keys_document

REPORT_TYPE = "application/octet-stream"


class Answer(NamedTuple):
    status: int
    body: bytes
    retry_after: int | None


class EdgeClient:
    def __init__(self, url: str, *, tls: ssl.SSLContext | None = None, timeout_s: float = 30.0) -> None:
        parts = urlsplit(url)
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or (443 if self._https else 80)
        self._tls, self._timeout = tls, timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            self._conn = (http.client.HTTPSConnection(self._host, self._port, timeout=self._timeout, context=self._tls)
                          if self._https else http.client.HTTPConnection(self._host, self._port, timeout=self._timeout))
        return self._conn

    def request(self, method: str, path: str, body: bytes | None = None, content_type: str | None = None,
                headers: dict[str, str] | None = None) -> Answer:
        """One request on the kept-alive connection (reconnecting once if the server closed it)."""
        sent = {**({"Content-Type": content_type} if content_type else {}), **(headers or {})}
        for attempt in (0, 1):
            conn = self._connection()
            try:
                conn.request(method, path, body=body, headers=sent)
                response = conn.getresponse()
                data = response.read()
            except (ConnectionError, http.client.RemoteDisconnected, http.client.CannotSendRequest):
                self.close()
                if attempt:
                    raise
                continue
            retry = response.getheader("Retry-After")
            return Answer(response.status, data, int(retry) if retry and retry.isdigit() else None)
        raise AssertionError("unreachable")

    def keys(self, pinned: Ed25519PublicKey | None = None) -> CurrentKeys:
        answer = self.request("GET", "/v1/keys")
        if answer.status != 200:
            raise ConnectionError(f"GET /v1/keys answered {answer.status}")
        return read_keys_document(answer.body, pinned)

    def enrol(self, public_key: bytes, token: str | None = None) -> Answer:
        doc = {"public_key": public_key.hex(), **({"token": token} if token is not None else {})}
        return self.request("POST", "/v1/enrol", json.dumps(doc).encode(), "application/json")

    def post_report(self, body: bytes) -> Answer:
        return self.request("POST", "/v1/reports", body, REPORT_TYPE)

    def post_until_accepted(self, body: bytes, deadline_s: float = 120.0) -> Answer:
        """Post, following 429/503 Retry-After, until the edge accepts (202) or refuses for good (other 4xx)."""
        give_up = time.monotonic() + deadline_s
        while True:
            answer = self.post_report(body)
            if answer.status not in (429, 503) or time.monotonic() > give_up:
                return answer
            time.sleep(min(answer.retry_after or 1, 5))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def post_reports(url: str, bodies: Iterable[bytes], *, threads: int = 4, tls: ssl.SSLContext | None = None,
                 progress: Callable[[int], None] | None = None) -> dict[int, int]:
    """Post every body to the edge on ``threads`` kept-alive connections, following 429/503 Retry-After;
    returns how many got each final status (202 = accepted)."""
    work: queue.Queue[bytes | None] = queue.Queue(maxsize=threads * 64)
    counts: Counter[int] = Counter()
    lock = threading.Lock()
    failure: list[BaseException] = []

    def worker() -> None:
        client = EdgeClient(url, tls=tls)
        try:
            while (body := work.get()) is not None:
                status = client.post_until_accepted(body).status
                with lock:
                    counts[status] += 1
                    done = sum(counts.values())
                if progress is not None and done % 1000 == 0:
                    progress(done)
        except BaseException as err:  # surfaced to the caller below; the other workers finish their bodies
            failure.append(err)
            while work.get() is not None:
                pass
        finally:
            client.close()

    pool = [threading.Thread(target=worker, name=f"esa-post-{i}", daemon=True) for i in range(threads)]
    for t in pool:
        t.start()
    for body in bodies:
        if failure:
            break
        work.put(body)
    for _ in pool:
        work.put(None)
    for t in pool:
        t.join()
    if failure:
        raise ConnectionError(f"posting to {url} failed: {failure[0]}") from failure[0]
    if progress is not None:
        progress(sum(counts.values()))
    return dict(counts)
