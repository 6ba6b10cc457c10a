"""The edge's routes as a plain ASGI application served by uvicorn with httptools: a thin adapter from ASGI to
``pipelines.edge.core.Edge``.

Why uvicorn: measured side by side with aiohttp serving the same ``Edge`` (``benchmarks/edge_load.py``; the
aiohttp adapter is kept there), over six paired runs its CPU per report was a median 0.89 of aiohttp's (0.73 to
1.28: within the noise of the shared machine), and it held 10,000 open connections in less memory in both runs
that measured it (docs/performance.md). Five fixed routes need no framework, so no Starlette. No access log and
no proxy-header processing (uvicorn's would read and log the peer's address), keep-alive on, TLS when given.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn

from pipelines.edge.core import Edge, Reply, refused
from transforms.shuffler.edge_rules import RefusedError

_ROUTE_OF = {"/v1/reports": "reports", "/v1/enrol": "enrol", "/v1/keys": "keys", "/healthz": "healthz",
             "/metrics": "metrics"}
Scope = dict[str, Any]
# Browsers post from the operator's web pages: any origin may call the /v1 routes (no cookies or credentials
# are used, so a wildcard grants nothing), and scripts may read Retry-After and ETag. The Origin is never logged.
_CORS_ROUTES = frozenset({"reports", "enrol", "keys"})
_CORS = [(b"access-control-allow-origin", b"*"), (b"access-control-expose-headers", b"Retry-After, ETag")]
_PREFLIGHT = {"Access-Control-Allow-Methods": "GET, POST",
              "Access-Control-Allow-Headers": "Content-Type, If-None-Match", "Access-Control-Max-Age": "86400"}


def application(edge: Edge) -> Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
                                        Awaitable[None]]:
    metrics = edge.metrics

    async def app(scope: Scope, receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                while (await receive())["type"] != "lifespan.shutdown":
                    await send({"type": "lifespan.startup.complete"})
                await send({"type": "lifespan.shutdown.complete"})
            return
        route = _ROUTE_OF.get(scope["path"], "other")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
                   if k in (b"content-type", b"content-length", b"if-none-match")}
        metrics.in_flight.inc()
        try:
            reply = await _handle(route, scope["method"], headers, receive)
        finally:
            metrics.in_flight.dec()
        metrics.answered(route, reply.status)
        out = [(b"content-type", reply.content_type.encode()), (b"content-length", str(len(reply.body)).encode())]
        out += [(k.lower().encode(), v.encode()) for k, v in reply.headers.items()]
        if route in _CORS_ROUTES:
            out += _CORS
        await send({"type": "http.response.start", "status": reply.status, "headers": out})
        await send({"type": "http.response.body", "body": reply.body})

    async def _handle(route: str, method: str, headers: dict[str, str], receive: Callable[[], Awaitable[Any]]
                      ) -> Reply:
        post = route in ("reports", "enrol")
        if route == "other":
            return refused(RefusedError(404, "not-found", "Not found", "no such route"))
        if method == "OPTIONS" and route in _CORS_ROUTES:  # a browser's preflight before a cross-origin POST
            return Reply(204, b"", "text/plain", dict(_PREFLIGHT))
        if (post and method != "POST") or (not post and method not in ("GET", "HEAD")):
            reply = refused(RefusedError(405, "method-not-allowed", "Method not allowed",
                                         f"{method} is not served here"))
            reply.headers["Allow"] = "POST" if post else "GET, HEAD"
            return reply
        declared = headers.get("content-length")
        length = int(declared) if declared is not None and declared.isdigit() else None

        async def read(at_most: int) -> bytes:
            chunks, size, more = [], 0, True
            while more and size < at_most:
                message = await receive()
                chunk = message.get("body", b"")
                chunks.append(chunk)
                size += len(chunk)
                more = message.get("more_body", False)
            return b"".join(chunks)[:at_most]

        if route == "reports":
            return await edge.report(headers.get("content-type"), length, read)
        if route == "enrol":
            return await edge.enrol(headers.get("content-type"), length, read)
        if route == "keys":
            return edge.keys_document(headers.get("if-none-match"))
        if route == "healthz":
            return edge.health()
        return edge.metrics_text()

    return app


class Serving:
    """A running server: its bound ``port``, ``task`` (done when it stopped), ``stop()``."""

    def __init__(self, server: uvicorn.Server, task: asyncio.Task[None]) -> None:
        self._server, self.task = server, task

    @property
    def port(self) -> int:
        return int(self._server.servers[0].sockets[0].getsockname()[1])

    async def stop(self) -> None:
        self._server.should_exit = True
        await self.task


async def serve(edge: Edge, host: str, port: int, tls: ssl.SSLContext | None) -> Serving:
    """Start serving ``edge`` on ``host:port`` (0: a free port); returns once it listens."""
    config = uvicorn.Config(application(edge), host=host, port=port, http="httptools", loop="none",
                            lifespan="off", access_log=False, log_config=None, proxy_headers=False,
                            server_header=False, backlog=4096, timeout_keep_alive=75,
                            ssl_context_factory=(lambda _config, _default: tls) if tls is not None else None)
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        if task.done():
            task.result()  # the bind failed: its error, here
            raise OSError(f"cannot listen on {host}:{port}")
        await asyncio.sleep(0.02)
    return Serving(server, task)
