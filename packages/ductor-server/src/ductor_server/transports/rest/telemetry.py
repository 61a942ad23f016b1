"""The HTTP server span and the API latency metric of every routed request.

A plain ASGI middleware that Litestar runs after routing, so the route
template (`/v1/runs/{run_id}`) names the span and the metric rather than
the path, keeping both bounded. A mounted endpoint (Connect's services, MCP)
has no template: a call is named by its procedure's path when the mount lists
it (`ROUTES_OPT`), else by the mount's own path, never by what the caller
wrote after it. An incoming `traceparent` (and `tracestate`,
`baggage`) is continued; without one the request starts a trace. A request
that matches no route (404, 405) is answered before this runs and has no span.
WebSocket and lifespan scopes pass through untouched. A client that hangs up
before the answer starts is counted as status 499 (client closed request), not
as whatever the server then sends to no one: not a server error. A method
outside HTTP's standard set (a mount answers any) is named `_OTHER`, as
OpenTelemetry's HTTP conventions say, so no caller can add a series per method.
"""

from __future__ import annotations

import time

from litestar.enums import ScopeType
from litestar.middleware import MiddlewareProtocol
from litestar.types import ASGIApp, Message, Receive, ReceiveMessage, Scope, Send
from opentelemetry import propagate
from opentelemetry.trace import SpanKind, StatusCode

from ductor_server.telemetry import API_DURATION, tracer

_PROPAGATED = frozenset({b"traceparent", b"tracestate", b"baggage"})

KNOWN_METHODS = frozenset(
    {"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"}
)
"""The methods a span and the metric name as sent; any other is `_OTHER`."""

CLIENT_CLOSED = 499
"""The status a request is counted with when its client hung up before the answer."""

ROUTES_OPT = "ductor.routes"
"""The `opt` key under which a mount's handler lists the whole paths it serves
(`/ductor.v1.RunService/GetRun`), each a route of its own for telemetry."""


def route_and_path(scope: Scope) -> tuple[str, str]:
    """The route template and the requested path of a routed request.

    Litestar hands a mount the rest of the path after the mount's own
    (`/GetRun/`) and no template: the path is rebuilt, and the route is that path
    when the mount lists it, else the mount's path.
    """
    template = scope.get("path_template")
    path = str(scope["path"])
    if template:
        return str(template), path
    handler = scope.get("route_handler")
    if handler is None or not getattr(handler, "is_mount", False):
        return path, path
    mount = next(iter(handler.paths))
    whole = mount + path.rstrip("/")
    routes = handler.opt.get(ROUTES_OPT, ())
    return (whole if whole in routes else mount), whole


class TelemetryMiddleware(MiddlewareProtocol):
    """A SERVER span `<METHOD> <route template>` per request, current while the
    handler runs, and one `ductor.api.request.duration` measurement."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self.app(scope, receive, send)
            return
        sent = str(scope.get("method", "GET"))
        method = sent if sent in KNOWN_METHODS else "_OTHER"
        route, path = route_and_path(scope)
        carrier: dict[str, str] = {}
        for name, value in scope["headers"]:
            if name in _PROPAGATED:
                key = name.decode("latin-1")
                text = value.decode("latin-1")
                carrier[key] = f"{carrier[key]},{text}" if key in carrier else text
        parent = propagate.extract(carrier) if carrier else None
        status = 500
        answering = hung_up = False

        async def send_status(message: Message) -> None:
            nonlocal status, answering
            if message["type"] == "http.response.start":
                status = message["status"]
                answering = True
            await send(message)

        async def receive_hang_up() -> ReceiveMessage:
            nonlocal hung_up
            message = await receive()
            if message["type"] == "http.disconnect" and not answering:
                hung_up = True
            return message

        started = time.perf_counter()
        with tracer.start_as_current_span(
            f"{'HTTP' if method == '_OTHER' else method} {route}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": method,
                "http.route": route,
                "url.path": path,
                "url.scheme": scope["scheme"],
            },
        ) as span:
            try:
                await self.app(scope, receive_hang_up, send_status)
            finally:
                if hung_up:
                    status = CLIENT_CLOSED
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


__all__ = ["CLIENT_CLOSED", "KNOWN_METHODS", "ROUTES_OPT", "TelemetryMiddleware", "route_and_path"]
