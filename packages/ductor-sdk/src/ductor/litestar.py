"""Litestar adapter: a route handler that serves a `Client`'s bridge endpoint.

Needs the `litestar` extra (`pip install ductor[litestar]`); only translates
requests and responses, all protocol work is in `Client.handle`.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, route
from litestar.enums import HttpMethod
from litestar.handlers import HTTPRouteHandler

from ductor.asgi import MAX_BODY_BYTES
from ductor.client import Client
from ductor.protocol import BRIDGE_PATH

__all__ = ["bridge_handler"]


def bridge_handler(client: Client, path: str = BRIDGE_PATH) -> HTTPRouteHandler:
    """A Litestar handler answering GET (health) and POST (actions) at `path`.

    Every other method reaches `Client.handle` too, which answers it with a signed
    405 `ErrorResponse`, as the bridge endpoint promises. A body over
    `MAX_BODY_BYTES` (64 MiB) gets Litestar's own 413.

    Pass it in `route_handlers=[...]` of `Litestar(...)` or of a `Router`.
    """

    @route(
        path,
        # Every method: Litestar's own 405 would be unsigned and of another shape.
        http_method=list(HttpMethod),
        include_in_schema=False,
        name="ductor_bridge",
        # The same limit as every adapter's, not Litestar's default of 10 MB.
        request_max_body_size=MAX_BODY_BYTES,
    )
    async def ductor_bridge(request: Request[Any, Any, Any]) -> Response[bytes]:
        body = await request.body()
        answer = await client.handle(request.method, request.headers, body, url=str(request.url))
        headers = {k: v for k, v in answer.headers.items() if k.lower() != "content-type"}
        return Response(
            content=answer.body,
            status_code=answer.status,
            headers=headers,
            media_type=answer.headers.get("content-type", "application/json"),
        )

    return ductor_bridge
