"""What every /v1 handler is given: the caller's tenant and the service layer.

The tenant comes from the `Authorization: Bearer <key>` header; keys are
looked up by their SHA-256 hash. Nothing here serves a route.
"""

from __future__ import annotations

from typing import Any

from litestar import Request

from ductor_server.api.auth import authenticate
from ductor_server.services import Services


async def provide_tenant_id(request: Request[Any, Any, Any]) -> str:
    """The tenant of the API key presented (401 `auth.unauthenticated` otherwise)."""
    return await authenticate(request.app.state.store, request.headers.get("authorization"))


def provide_services(request: Request[Any, Any, Any]) -> Services:
    """The `Services` of this process (bound to its store and engine loops)."""
    services: Services = request.app.state.services
    return services
