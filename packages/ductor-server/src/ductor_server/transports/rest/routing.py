"""Routing resources: `/v1/workers`, `/v1/pools`, `/v1/rules`, `/v1/route`,
`/v1/decisions`, `/v1/assignments`. Thin handlers over `RoutingService`.

Every mutating call accepts an `Idempotency-Key`; another tenant's objects are 404.
"""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request, Response, delete, get, post, put
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter

from ductor_routing import Pool, Worker
from ductor_server.services.routing import (
    ACCEPTED,
    COMPLETED,
    REJECTED,
    AssignmentView,
    ConfigCheck,
    ConfigCheckBody,
    DecisionView,
    OutcomeBody,
    ReturnBody,
    ReturnView,
    RouteBody,
    RoutingService,
    RulesBody,
    RuleSetVersion,
    RuleSetView,
    ShadowReportView,
)
from ductor_server.services.settlement import PoolSettlement, PoolSettlementView
from ductor_server.transports.rest.bodies import (
    NO_BODY,
    NoBody,
    VersionPath,
    or_default,
    path_id,
    path_version,
    required,
)
from ductor_server.transports.rest.errors import V1_ERRORS, also_ok
from ductor_server.transports.rest.idempotency import IdempotencyKey, answered, checked_key


class WorkersController(Controller):
    """The worker registry: humans, agents and systems that receive work."""

    path = "/v1/workers"
    tags = ("routing",)

    @post("/", status_code=201, responses=also_ok(Worker, "An existing worker was replaced"))
    async def put_worker(
        self,
        tenant_id: NamedDependency[str],
        routing: NamedDependency[RoutingService],
        data: JSONBody[Worker | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[Worker]:
        """Create (201) or replace (200) a worker; pools see the change on their next decision."""
        worker = required(data)
        key = checked_key(idempotency_key)
        return answered(await routing.put_worker(tenant_id, worker, idempotency_key=key))

    @get("/", responses=V1_ERRORS)
    async def list_workers(
        self, tenant_id: NamedDependency[str], routing: NamedDependency[RoutingService]
    ) -> list[Worker]:
        """Every worker, by id."""
        return await routing.list_workers(tenant_id)

    # `path`, not `str`: a worker id may hold a `/` (see `path_id`).
    @get("/{worker_id:path}", responses=V1_ERRORS)
    async def get_worker(
        self,
        worker_id: FromPath[str],
        tenant_id: NamedDependency[str],
        routing: NamedDependency[RoutingService],
        request: Request[Any, Any, Any],
    ) -> Worker:
        """One worker."""
        return await routing.get_worker(tenant_id, path_id(request, "worker_id"))

    @delete("/{worker_id:path}", status_code=204, responses=V1_ERRORS)
    async def delete_worker(
        self,
        worker_id: FromPath[str],
        tenant_id: NamedDependency[str],
        routing: NamedDependency[RoutingService],
        request: Request[Any, Any, Any],
    ) -> None:
        """Delete a worker no pool lists any more (409 `routing.in_use` otherwise)."""
        await routing.delete_entity(tenant_id, "worker", path_id(request, "worker_id"))


class PoolsController(Controller):
    """Pools: members with filters, caps, budgets and bids; a live and shadow strategies."""

    path = "/v1/pools"
    tags = ("routing",)

    @post("/", status_code=201, responses=also_ok(Pool, "An existing pool was replaced"))
    async def put_pool(
        self,
        tenant_id: NamedDependency[str],
        routing: NamedDependency[RoutingService],
        data: JSONBody[Pool | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[Pool]:
        """Create (201) or replace (200) a pool; every member must be a known worker."""
        pool = required(data)
        key = checked_key(idempotency_key)
        return answered(await routing.put_pool(tenant_id, pool, idempotency_key=key))

    @get("/", responses=V1_ERRORS)
    async def list_pools(
        self, tenant_id: NamedDependency[str], routing: NamedDependency[RoutingService]
    ) -> list[Pool]:
        """Every pool, by id."""
        return await routing.list_pools(tenant_id)

    @get("/{pool_id:str}", responses=V1_ERRORS)
    async def get_pool(
        self,
        pool_id: FromPath[str],
        tenant_id: NamedDependency[str],
        routing: NamedDependency[RoutingService],
    ) -> Pool:
        """One pool."""
        return await routing.get_pool(tenant_id, pool_id)

    @delete("/{pool_id:str}", status_code=204, responses=V1_ERRORS)
    async def delete_pool(
        self,
        pool_id: FromPath[str],
        tenant_id: NamedDependency[str],
        routing: NamedDependency[RoutingService],
    ) -> None:
        """Delete a pool no rule uses any more (409 `routing.in_use` otherwise)."""
        await routing.delete_entity(tenant_id, "pool", pool_id)

    @put(
        "/{pool_id:str}/settlement",
        status_code=201,
        responses=also_ok(PoolSettlementView, "The pool's setting was replaced"),
    )
    async def put_settlement(
        self,
        pool_id: FromPath[str],
        tenant_id: NamedDependency[str],
        routing: NamedDependency[RoutingService],
        data: JSONBody[PoolSettlement | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[PoolSettlementView]:
        """Set how the pool's assignments are charged (201 first, then 200); its next
        decision excludes members who cannot pay (`funds`) and charges the winner."""
        setting = required(data)
        key = checked_key(idempotency_key)
        return answered(
            await routing.put_settlement(tenant_id, pool_id, setting, idempotency_key=key)
        )

    @get("/{pool_id:str}/settlement", responses=V1_ERRORS)
    async def get_settlement(
        self,
        pool_id: FromPath[str],
        tenant_id: NamedDependency[str],
        routing: NamedDependency[RoutingService],
    ) -> PoolSettlementView:
        """The pool's settlement (404 `settlement.not_found` when it has none)."""
        return await routing.get_settlement(tenant_id, pool_id)

    @get("/{pool_id:str}/shadow-report", responses=V1_ERRORS)
    async def shadow_report(
        self,
        pool_id: FromPath[str],
        tenant_id: NamedDependency[str],
        routing: NamedDependency[RoutingService],
        limit: Annotated[int, QueryParameter(ge=1, le=100_000)] = 10_000,
    ) -> ShadowReportView:
        """How often each shadow strategy agreed with the live one, over the latest decisions."""
        return await routing.shadow_report(tenant_id, pool_id, limit=limit)


class RulesController(Controller):
    """The tenant's rule set: each publish is a new, numbered version, live at once."""

    path = "/v1/rules"
    tags = ("routing",)

    @post("/", status_code=201, responses=V1_ERRORS)
    async def publish(
        self,
        tenant_id: NamedDependency[str],
        routing: NamedDependency[RoutingService],
        data: JSONBody[RulesBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[RuleSetView]:
        """Publish `{id, rules, default_pool, kinds, enrichers, seed}` as the next version (201)."""
        rules = required(data)
        key = checked_key(idempotency_key)
        return answered(await routing.publish_rules(tenant_id, rules, idempotency_key=key))

    @get("/", responses=V1_ERRORS)
    async def latest(
        self, tenant_id: NamedDependency[str], routing: NamedDependency[RoutingService]
    ) -> RuleSetView:
        """The rule set in force."""
        return await routing.get_rules(tenant_id)

    @get("/versions", responses=V1_ERRORS)
    async def versions(
        self, tenant_id: NamedDependency[str], routing: NamedDependency[RoutingService]
    ) -> list[RuleSetVersion]:
        """Every version, newest first."""
        return await routing.list_rule_versions(tenant_id)

    @get("/versions/{version:str}", responses=V1_ERRORS)
    async def version(
        self,
        version: VersionPath,
        tenant_id: NamedDependency[str],
        routing: NamedDependency[RoutingService],
    ) -> RuleSetView:
        """One version."""
        return await routing.get_rules(tenant_id, path_version(version))


class RoutingConfigController(Controller):
    """Checking a routing configuration change before making it."""

    path = "/v1/routing"
    tags = ("routing",)

    @post("/validate", status_code=200, responses=V1_ERRORS)
    async def validate(
        self,
        tenant_id: NamedDependency[str],
        routing: NamedDependency[RoutingService],
        data: JSONBody[ConfigCheckBody | NoBody] = NO_BODY,
    ) -> ConfigCheck:
        """Check `{workers, pools, rule_set}` as their puts would, together with the
        stored configuration (`{valid, problems}`); nothing is written."""
        return await routing.check_config(tenant_id, required(data))


class RouteController(Controller):
    """Route a routable now: the decision, its explanation and its assignment."""

    path = "/v1"
    tags = ("routing",)

    @post("/route", status_code=201, responses=V1_ERRORS)
    async def route(
        self,
        tenant_id: NamedDependency[str],
        routing: NamedDependency[RoutingService],
        data: JSONBody[RouteBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[DecisionView]:
        """Run Validate, Enrich, Filter, Select, Assign on `{id, kind, attributes, ...}` (201)."""
        body = required(data)
        key = checked_key(idempotency_key)
        return answered(await routing.route(tenant_id, body, idempotency_key=key))

    @get("/decisions/{decision_id:str}", responses=V1_ERRORS)
    async def decision(
        self,
        decision_id: FromPath[str],
        tenant_id: NamedDependency[str],
        routing: NamedDependency[RoutingService],
    ) -> DecisionView:
        """A stored decision with its explanation."""
        return await routing.get_decision(tenant_id, decision_id)

    @get("/assignments", responses=V1_ERRORS)
    async def assignments(
        self,
        tenant_id: NamedDependency[str],
        routing: NamedDependency[RoutingService],
        routable_id: FromQuery[str | None] = None,
        worker: FromQuery[str | None] = None,
        status: FromQuery[str | None] = None,
        after: FromQuery[str | None] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=1000)] = 100,
    ) -> list[AssignmentView]:
        """Assignments by `routable_id`, `worker` (an assignee's inbox) and `status`,
        oldest first; `after` an assignment id continues past it (the next page)."""
        return await routing.list_assignments(
            tenant_id,
            routable_id=routable_id,
            worker=worker,
            status=status,
            after=after,
            limit=limit,
        )

    @get("/assignments/{assignment_id:str}", responses=V1_ERRORS)
    async def assignment(
        self,
        assignment_id: FromPath[str],
        tenant_id: NamedDependency[str],
        routing: NamedDependency[RoutingService],
    ) -> AssignmentView:
        """One assignment and its status."""
        return await routing.get_assignment(tenant_id, assignment_id)

    @post("/assignments/{assignment_id:str}/accept", status_code=200, responses=V1_ERRORS)
    async def accept(
        self,
        assignment_id: FromPath[str],
        tenant_id: NamedDependency[str],
        routing: NamedDependency[RoutingService],
        data: JSONBody[OutcomeBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[AssignmentView]:
        """The assignee takes the work (the body is optional)."""
        return await _move(routing, tenant_id, assignment_id, ACCEPTED, data, idempotency_key)

    @post("/assignments/{assignment_id:str}/complete", status_code=200, responses=V1_ERRORS)
    async def complete(
        self,
        assignment_id: FromPath[str],
        tenant_id: NamedDependency[str],
        routing: NamedDependency[RoutingService],
        data: JSONBody[OutcomeBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[AssignmentView]:
        """The assignee finished: `{result?}`; its load is given back."""
        return await _move(routing, tenant_id, assignment_id, COMPLETED, data, idempotency_key)

    @post("/assignments/{assignment_id:str}/reject", status_code=200, responses=V1_ERRORS)
    async def reject(
        self,
        assignment_id: FromPath[str],
        tenant_id: NamedDependency[str],
        routing: NamedDependency[RoutingService],
        data: JSONBody[OutcomeBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[AssignmentView]:
        """The assignee declines: `{reason?}`; every reservation is given back."""
        return await _move(routing, tenant_id, assignment_id, REJECTED, data, idempotency_key)

    @post("/assignments/{assignment_id:str}/return", status_code=201, responses=V1_ERRORS)
    async def return_assignment(
        self,
        assignment_id: FromPath[str],
        tenant_id: NamedDependency[str],
        routing: NamedDependency[RoutingService],
        data: JSONBody[ReturnBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[ReturnView]:
        """Return a settled assignment: `{reason, reroute?, amount?}`; credits the buyer
        (a reversal of the charge) and, with `reroute`, answers the new decision."""
        body = required(data)
        key = checked_key(idempotency_key)
        return answered(
            await routing.return_assignment(tenant_id, assignment_id, body, idempotency_key=key)
        )


async def _move(
    routing: RoutingService,
    tenant_id: str,
    assignment_id: str,
    to_status: str,
    data: OutcomeBody | NoBody,
    idempotency_key: str | None,
) -> Response[AssignmentView]:
    body = or_default(data, OutcomeBody())
    key = checked_key(idempotency_key)
    moved = await routing.move_assignment(
        tenant_id,
        assignment_id,
        to_status,
        result=body.result,
        reason=body.reason,
        idempotency_key=key,
    )
    return answered(moved)


ROUTING_CONTROLLERS = (
    WorkersController,
    PoolsController,
    RulesController,
    RoutingConfigController,
    RouteController,
)
"""Every routing controller, for the app's route list."""


__all__ = [
    "ROUTING_CONTROLLERS",
    "PoolsController",
    "RouteController",
    "RulesController",
    "WorkersController",
]
