"""Operators' resources under `/v1/admin`: each tenant's policy in the fair task
queue. Thin handlers over `QueueService`, outside the tenants' API-key guard.

`require_operator` is the one check of who may call them: the bearer key must
be the operator key (`DUCTOR_OPERATOR_KEY`). It is a single guard so that a
scoped operator API key can take its place without touching the handlers.
"""

from __future__ import annotations

import hmac
from typing import Any

from litestar import Controller, Request, Response, Router, delete, get, put
from litestar.connection import ASGIConnection
from litestar.di import NamedDependency, Provide
from litestar.handlers import BaseRouteHandler
from litestar.params import FromPath, JSONBody

from ductor_server.engine.fairness import TenantPolicy
from ductor_server.errors import OperatorOnly
from ductor_server.services import QueuePoliciesView, QueuePolicyView, QueueService
from ductor_server.settings import Settings
from ductor_server.transports.rest.auth import bearer_token
from ductor_server.transports.rest.bodies import NO_BODY, JsonBody, NoBody, required
from ductor_server.transports.rest.dependencies import services_of
from ductor_server.transports.rest.errors import V1_ERRORS, also_ok
from ductor_server.transports.rest.idempotency import answered


async def require_operator(
    connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
) -> None:
    """Guard: the caller presents the operator key (401 without a bearer key,
    403 `auth.operator_only` with any other key, or when none is configured).

    Raises:
        Unauthenticated: no bearer key.
        OperatorOnly: not the operator key.
    """
    key = bearer_token(connection.headers.get("authorization"))
    settings: Settings = connection.app.state.settings
    expected = settings.operator_key
    if expected is None or not hmac.compare_digest(key.encode(), expected.encode()):
        raise OperatorOnly(
            "this call is an operator's: send the operator key (DUCTOR_OPERATOR_KEY)"
            if expected is not None
            else "operator calls are off: the server has no DUCTOR_OPERATOR_KEY"
        )


def provide_queue(request: Request[Any, Any, Any]) -> QueueService:
    """The fair queue's operator service."""
    return services_of(request).queue


class AdminController(Controller):
    """The fair queue's per-tenant policies: weight, tier and limits."""

    path = "/v1/admin"
    tags = ("admin",)

    @get("/queue-policies", responses=V1_ERRORS)
    async def list_policies(self, queue: NamedDependency[QueueService]) -> QueuePoliciesView:
        """The settings' default policy and headroom, and every tenant policy an
        operator set."""
        return await queue.list_policies()

    @get("/tenants/{tenant:str}/queue-policy", responses=V1_ERRORS)
    async def get_policy(
        self, tenant: FromPath[str], queue: NamedDependency[QueueService]
    ) -> QueuePolicyView:
        """The policy `tenant`'s tasks are scheduled by now, and where it comes from."""
        return await queue.get_policy(tenant)

    @put(
        "/tenants/{tenant:str}/queue-policy",
        status_code=201,
        responses=also_ok(QueuePolicyView, "The tenant's earlier policy was replaced"),
    )
    async def put_policy(
        self,
        tenant: FromPath[str],
        queue: NamedDependency[QueueService],
        data: JSONBody[TenantPolicy | NoBody] = NO_BODY,
    ) -> Response[QueuePolicyView]:
        """Schedule the tenant by this policy from now on, in every process (201
        the first time, 200 when it replaces one)."""
        return answered(await queue.put_policy(tenant, required(data)))

    @delete("/tenants/{tenant:str}/queue-policy", status_code=200, responses=V1_ERRORS)
    async def delete_policy(
        self, tenant: FromPath[str], queue: NamedDependency[QueueService]
    ) -> QueuePolicyView:
        """Forget the operator's policy for the tenant; answers the settings' one,
        which applies again."""
        return await queue.delete_policy(tenant)


ADMIN_ROUTER = Router(
    "/",
    route_handlers=[AdminController],
    guards=[require_operator],
    dependencies={"queue": Provide(provide_queue, sync_to_thread=False)},
    dto=JsonBody,
    return_dto=None,
)
"""The operators' routes, behind `require_operator` instead of a tenant's key."""


__all__ = ["ADMIN_ROUTER", "AdminController", "provide_queue", "require_operator"]
