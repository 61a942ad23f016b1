"""Plain ASGI adapter: serve a `Client`'s bridge endpoint as an ASGI app.

Knows ASGI only; no framework. Mount it anywhere, or serve it directly (it
answers on `path`, `/api/ductor` by default, and 404 elsewhere).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ductor.client import BridgeResponse, Client
from ductor.protocol import BRIDGE_PATH

__all__ = ["BridgeApp", "serve_asgi"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_BODY_BYTES = 64 * 1024 * 1024
"""Requests above this size are refused (413) before any work is done."""


class BridgeApp:
    """An ASGI app answering `client`'s bridge endpoint at `path`.

    Args:
        client: the app's `Client`.
        path: where the endpoint lives; `None` answers on every path (for mounting).
    """

    def __init__(self, client: Client, path: str | None = BRIDGE_PATH) -> None:
        self.client = client
        self.path = None if path is None else path.rstrip("/") or "/"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry point."""
        if scope["type"] == "lifespan":
            await _lifespan(self.client, receive, send)
            return
        if scope["type"] != "http":
            return
        request_path = (scope.get("path") or "/").rstrip("/") or "/"
        if self.path is not None and request_path != self.path:
            await _send(send, 404, {"content-type": "text/plain"}, b"not found")
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body.extend(message.get("body", b""))
            if len(body) > MAX_BODY_BYTES:
                await _send(send, 413, {"content-type": "text/plain"}, b"body too large")
                return
            if not message.get("more_body", False):
                break
        headers = {
            key.decode("latin-1").lower(): value.decode("latin-1")
            for key, value in scope.get("headers", [])
        }
        response = await self.client.handle(
            scope["method"], headers, bytes(body), url=_url(scope, headers)
        )
        await _respond(send, response)


def serve_asgi(client: Client, path: str | None = BRIDGE_PATH) -> BridgeApp:
    """The ASGI app for `client`'s bridge endpoint (see `BridgeApp`)."""
    return BridgeApp(client, path)


async def _respond(send: Send, response: BridgeResponse) -> None:
    await _send(send, response.status, response.headers, response.body)


async def _send(send: Send, status: int, headers: dict[str, str], body: bytes) -> None:
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    raw.append((b"content-length", str(len(body)).encode("ascii")))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def _lifespan(client: Client, receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await client.aclose()  # the pool of calls to the server
            await send({"type": "lifespan.shutdown.complete"})
            return


def _url(scope: Scope, headers: dict[str, str]) -> str:
    host = headers.get("host")
    if host is None:
        server = scope.get("server") or ("127.0.0.1", 80)
        host = f"{server[0]}:{server[1]}"
    root = scope.get("root_path", "")
    return f"{scope.get('scheme', 'http')}://{host}{root}{scope.get('path', '')}"
