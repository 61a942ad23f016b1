"""Starlette / FastAPI adapter: a route that serves a `Client`'s bridge endpoint.

Needs the `starlette` extra (`pip install ductor[starlette]`); only translates
requests and responses, all protocol work is in `Client.handle`.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ductor.asgi import MAX_BODY_BYTES
from ductor.client import Client
from ductor.protocol import BRIDGE_PATH

__all__ = ["bridge_route", "serve"]

_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"]


def bridge_route(client: Client, path: str = BRIDGE_PATH) -> Route:
    """A Starlette `Route` answering GET (health) and POST (actions) at `path`.

    Every other method reaches `Client.handle` too, which answers it with a signed
    405 `ErrorResponse`, as the bridge endpoint promises.
    """

    async def ductor_bridge(request: Request) -> Response:
        # Read up to the limit only: the signature is checked once the body is in,
        # so an unsigned caller must not be able to make the app hold any size.
        body = bytearray()
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > MAX_BODY_BYTES:
                return Response(b"body too large", status_code=413, media_type="text/plain")
        answer = await client.handle(
            request.method, request.headers, bytes(body), url=str(request.url)
        )
        headers = {k: v for k, v in answer.headers.items() if k.lower() != "content-type"}
        return Response(
            answer.body,
            status_code=answer.status,
            headers=headers,
            media_type=answer.headers.get("content-type", "application/json"),
        )

    # Every method reaches the handler: Starlette's own 405 would be unsigned.
    return Route(path, ductor_bridge, methods=_METHODS, name="ductor_bridge")


def serve(app: Starlette, client: Client, path: str = BRIDGE_PATH) -> None:
    """Add the bridge route to a Starlette or FastAPI `app` at `path` (/api/ductor)."""
    app.router.routes.append(bridge_route(client, path))
