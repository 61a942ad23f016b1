"""Who is calling: the `Authorization: Bearer <key>` header resolved to a tenant.

`require_api_key` is the guard of every /v1 route: it runs before the body is
read, so a caller without a valid key learns nothing else about its request.
The tenant it finds is given to handlers as the `tenant_id` dependency. No
route handlers here.
"""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from ductor_server.errors import Unauthenticated
from ductor_server.transports.rest.dependencies import services_of


def bearer_token(header: str | None) -> str:
    """The key in an `Authorization: Bearer <key>` header.

    Raises:
        Unauthenticated: no header, another scheme, or an empty key.
    """
    if not header:
        raise Unauthenticated("missing Authorization header: send 'Authorization: Bearer <key>'")
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthenticated("the Authorization header must be 'Bearer <key>'")
    return token


async def require_api_key(
    connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
) -> None:
    """Guard: resolve the caller's tenant from its API key (401 `auth.unauthenticated`).

    Raises:
        Unauthenticated: missing, malformed, unknown or revoked key.
    """
    key = bearer_token(connection.headers.get("authorization"))
    connection.state.tenant_id = await services_of(connection).keys.tenant_of(key)


def provide_tenant_id(request: Request[Any, Any, Any]) -> str:
    """The tenant `require_api_key` found for this request."""
    tenant_id: str = request.state.tenant_id
    return tenant_id


__all__ = ["bearer_token", "provide_tenant_id", "require_api_key"]
