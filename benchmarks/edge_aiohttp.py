"""The edge's routes on aiohttp: the alternative the edge's HTTP library (uvicorn, ``pipelines.edge.server``) was
measured against in ``benchmarks/edge_load.py``, serving the same ``pipelines.edge.core.Edge``.

No access log (aiohttp's would write the peer's address and the request time), keep-alive on, TLS when given.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable

from aiohttp import web

from pipelines.edge.core import Edge, Reply
from transforms.shuffler.edge_rules import RefusedError

_ROUTE_OF = {"/v1/reports": "reports", "/v1/enrol": "enrol", "/v1/keys": "keys", "/healthz": "healthz",
             "/metrics": "metrics"}


def _reader(request: web.Request) -> Callable[[int], Awaitable[bytes]]:
    async def read(at_most: int) -> bytes:
        chunks, size = [], 0
        while size < at_most:
            chunk = await request.content.read(at_most - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    return read


def _response(reply: Reply) -> web.Response:
    return web.Response(status=reply.status, body=reply.body, headers={"Content-Type": reply.content_type,
                                                                       **reply.headers})


def application(edge: Edge) -> web.Application:
    metrics = edge.metrics

    async def dispatch(request: web.Request) -> web.StreamResponse:
        route = _ROUTE_OF.get(request.path, "other")
        metrics.in_flight.inc()
        try:
            reply = await _handle(route, request)
        finally:
            metrics.in_flight.dec()
        metrics.answered(route, reply.status)
        return _response(reply)

    async def _handle(route: str, request: web.Request) -> Reply:
        method = request.method
        post = route in ("reports", "enrol")
        if route == "other":
            return _problem(404, "not-found", "Not found", "no such route")
        if (post and method != "POST") or (not post and method not in ("GET", "HEAD")):
            reply = _problem(405, "method-not-allowed", "Method not allowed", f"{method} is not served here")
            reply.headers["Allow"] = "POST" if post else "GET, HEAD"
            return reply
        if route == "reports":
            return await edge.report(request.headers.get("Content-Type"), request.content_length, _reader(request))
        if route == "enrol":
            return await edge.enrol(request.headers.get("Content-Type"), request.content_length, _reader(request))
        if route == "keys":
            return edge.keys_document(request.headers.get("If-None-Match"))
        if route == "healthz":
            return edge.health()
        return edge.metrics_text()

    app = web.Application(client_max_size=edge.settings.max_report_bytes + 1)
    app.router.add_route("*", "/{tail:.*}", dispatch)
    return app


def _problem(status: int, slug: str, title: str, detail: str) -> Reply:
    from pipelines.edge.core import refused

    return refused(RefusedError(status, slug, title, detail))


class Serving:
    """The same face as ``pipelines.edge.server.Serving``."""

    def __init__(self, runner: web.AppRunner) -> None:
        self._runner = runner
        self.task = asyncio.ensure_future(asyncio.Event().wait())  # never done: stopped by stop()

    @property
    def port(self) -> int:
        return int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        self.task.cancel()
        await self._runner.cleanup()


async def serve(edge: Edge, host: str, port: int, tls: ssl.SSLContext | None) -> Serving:
    """Start serving ``edge``; returns once it listens."""
    runner = web.AppRunner(application(edge), access_log=None, handle_signals=False, keepalive_timeout=75)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls, backlog=4096, reuse_address=True)
    await site.start()
    return Serving(runner)
