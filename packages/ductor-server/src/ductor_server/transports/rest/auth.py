"""Who is calling and what it may do: the `Authorization: Bearer <key>` header resolved
to a caller, and the route's scope checked against the key's.

`require_api_key` is the guard of every /v1 route of a tenant: it runs before
the body is read, so a caller without a valid key, or without the scope the
route needs (`transports/rest/scopes.py`), learns nothing else about its
request. The caller it finds is given to handlers as the `tenant_id` and
`caller` dependencies. `require_operator_key` guards the operator's
`/v1/tenants` routes instead. No route handlers here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from ductor_server.errors import Unauthenticated
from ductor_server.services.keys import Caller
from ductor_server.transports.rest.dependencies import services_of
from ductor_server.transports.rest.scopes import scope_for


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
    """Guard: resolve the caller from its API key and check the route's scope.

    Raises:
        Unauthenticated: a missing, malformed, unknown or revoked key (401
            `auth.unauthenticated`), or an expired one (401 `auth.key_expired`).
        Forbidden: the key lacks the route's scope (403 `auth.forbidden`).
    """
    key = bearer_token(connection.headers.get("authorization"))
    caller = await services_of(connection).keys.authenticate(key)
    scope = cast(Mapping[str, Any], connection.scope)
    needed = scope_for(scope.get("method", "GET"), scope["path_template"])
    if needed is not None:
        caller.require(needed)
    connection.state.caller = caller
    connection.state.tenant_id = caller.tenant_id


async def require_operator_key(
    connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
) -> None:
    """Guard of the operator's routes: the bearer key must be `DUCTOR_OPERATOR_KEY`.

    Raises:
        Unauthenticated: no operator key is configured, or another key was sent.
    """
    key = bearer_token(connection.headers.get("authorization"))
    services_of(connection).tenants.authenticate_operator(key)


def provide_tenant_id(request: Request[Any, Any, Any]) -> str:
    """The tenant `require_api_key` found for this request."""
    tenant_id: str = request.state.tenant_id
    return tenant_id


def provide_caller(request: Request[Any, Any, Any]) -> Caller:
    """The caller (tenant, key, scopes) `require_api_key` found for this request."""
    caller: Caller = request.state.caller
    return caller


__all__ = [
    "bearer_token",
    "provide_caller",
    "provide_tenant_id",
    "require_api_key",
    "require_operator_key",
]
