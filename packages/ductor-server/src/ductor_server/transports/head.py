"""HEAD is answered as GET would be, without the body (RFC 9110, section 9.3.2):
load balancers and uptime checks probe `/healthz` or `/ui/` with HEAD.

The wrapped application sees a GET; the HTTP server (uvicorn) knows the request
was a HEAD and sends the headers only. Paths that answer GET with an open-ended
stream (the MCP server's event stream) keep refusing HEAD, since a HEAD there
would hold the connection for as long as the stream lasts.
"""

from __future__ import annotations

from typing import Any

Scope = dict[str, Any]
Receive = Any
Send = Any

STREAMING_PREFIXES = ("/mcp",)


class HeadAsGet:
    """An ASGI application that hands HEAD requests to `app` as GET requests."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "HEAD"
            and not scope["path"].startswith(STREAMING_PREFIXES)
        ):
            scope = {**scope, "method": "GET"}
        await self.app(scope, receive, send)

    def __getattr__(self, name: str) -> Any:
        # The server's lifespan and state live on the wrapped application.
        return getattr(self.app, name)


__all__ = ["STREAMING_PREFIXES", "HeadAsGet"]
