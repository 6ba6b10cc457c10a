"""The edge's routes as a plain ASGI application for uvicorn (httptools): the alternative the edge's HTTP library
was measured against (``benchmarks/edge_load.py``), serving the same ``pipelines.edge.core.Edge`` as the kept
aiohttp adapter (``pipelines.edge.server_aiohttp``). Run uvicorn with ``access_log=False``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from pipelines.edge.core import Edge, Reply, refused
from transforms.shuffler.edge_rules import RefusedError

_ROUTE_OF = {"/v1/reports": "reports", "/v1/enrol": "enrol", "/v1/keys": "keys", "/healthz": "healthz",
             "/metrics": "metrics"}
Scope = dict[str, Any]


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
        await send({"type": "http.response.start", "status": reply.status, "headers": out})
        await send({"type": "http.response.body", "body": reply.body})

    async def _handle(route: str, method: str, headers: dict[str, str], receive: Callable[[], Awaitable[Any]]
                      ) -> Reply:
        post = route in ("reports", "enrol")
        if route == "other":
            return refused(RefusedError(404, "not-found", "Not found", "no such route"))
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
