"""The HTTP server span and the API latency metric of every routed request.

A plain ASGI middleware that Litestar runs after routing, so the route
template (`/v1/runs/{run_id:str}`) names the span and the metric rather than
the path, keeping both bounded. An incoming `traceparent` (and `tracestate`,
`baggage`) is continued; without one the request starts a trace. A request
that matches no route (404, 405) is answered before this runs and has no span.
WebSocket and lifespan scopes pass through untouched.
"""

from __future__ import annotations

import time

from litestar.enums import ScopeType
from litestar.middleware import MiddlewareProtocol
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from opentelemetry import propagate
from opentelemetry.trace import SpanKind, StatusCode

from ductor_server.telemetry import API_DURATION, tracer

_PROPAGATED = frozenset({b"traceparent", b"tracestate", b"baggage"})


class TelemetryMiddleware(MiddlewareProtocol):
    """A SERVER span `<METHOD> <route template>` per request, current while the
    handler runs, and one `ductor.api.request.duration` measurement."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self.app(scope, receive, send)
            return
        method = str(scope.get("method", "GET"))
        route = str(scope.get("path_template") or scope["path"])
        carrier: dict[str, str] = {}
        for name, value in scope["headers"]:
            if name in _PROPAGATED:
                key = name.decode("latin-1")
                text = value.decode("latin-1")
                carrier[key] = f"{carrier[key]},{text}" if key in carrier else text
        parent = propagate.extract(carrier) if carrier else None
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        started = time.perf_counter()
        with tracer.start_as_current_span(
            f"{method} {route}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": method,
                "http.route": route,
                "url.path": scope["path"],
                "url.scheme": scope["scheme"],
            },
        ) as span:
            try:
                await self.app(scope, receive, send_status)
            finally:
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_attribute("error.type", str(status))
                    span.set_status(StatusCode.ERROR)
                API_DURATION.record(
                    time.perf_counter() - started,
                    {
                        "http.request.method": method,
                        "http.route": route,
                        "http.response.status_code": status,
                    },
                )


__all__ = ["TelemetryMiddleware"]
