"""Operators' resources under `/v1/admin`: each tenant's policy in the fair task
queue. Thin handlers over `QueueService`, outside the tenants' API-key guard.

`require_operator_key` (the guard of `/v1/tenants` too) is the one check of who
may call them: the bearer key must be the operator key (`DUCTOR_OPERATOR_KEY`).
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, Router, delete, get, put
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, JSONBody

from ductor_server.engine.fairness import TenantPolicy
from ductor_server.services import QueuePoliciesView, QueuePolicyView, QueueService
from ductor_server.transports.rest.auth import require_operator_key
from ductor_server.transports.rest.bodies import NO_BODY, JsonBody, NoBody, required
from ductor_server.transports.rest.dependencies import services_of
from ductor_server.transports.rest.errors import V1_ERRORS, also_ok
from ductor_server.transports.rest.idempotency import answered
from ductor_server.transports.rest.parameters import refuse_nul_parameters


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
    guards=[require_operator_key, refuse_nul_parameters],
    dependencies={"queue": Provide(provide_queue, sync_to_thread=False)},
    dto=JsonBody,
    return_dto=None,
)
"""The operators' routes, behind `require_operator_key` instead of a tenant's key."""


__all__ = ["ADMIN_ROUTER", "AdminController", "provide_queue"]
