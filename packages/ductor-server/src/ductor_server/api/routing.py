"""Routing resources: `/v1/workers`, `/v1/pools`, `/v1/rules`, `/v1/route`,
`/v1/decisions`, `/v1/assignments`. Thin handlers over `RoutingService`.

Every mutating call accepts an `Idempotency-Key`; another tenant's objects are 404.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import msgspec
from litestar import Controller, Litestar, MediaType, Request, Response, delete, get, post
from litestar._openapi.plugin import OpenAPIPlugin
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, HeaderParameter, QueryParameter

from ductor_routing import Pool, Worker
from ductor_server.api.bodies import decode_body
from ductor_server.api.idempotency import run_idempotent
from ductor_server.routing.service import (
    ACCEPTED,
    COMPLETED,
    REJECTED,
    AssignmentView,
    DecisionView,
    OutcomeBody,
    RouteBody,
    RoutingService,
    RulesBody,
    RuleSetVersion,
    RuleSetView,
    ShadowReportView,
)

IdempotencyKey = Annotated[str | None, HeaderParameter(name="Idempotency-Key")]
T = TypeVar("T")


def _routing(request: Request[Any, Any, Any]) -> RoutingService:
    service: RoutingService = request.app.state.routing
    return service


def _json(value: Any) -> Response[Any]:
    # Response types are described by msgspec, not by Litestar's schema plugin
    # (which cannot describe struct fields whose default is a dict).
    return Response(content=value, media_type=MediaType.JSON)


async def _idempotent(
    request: Request[Any, Any, Any],
    tenant_id: str,
    key: str | None,
    body: Any,
    into: type[T],
    produce: Callable[[], Awaitable[tuple[int, T]]],
) -> Response[T]:
    return await run_idempotent(
        request.app.state.store,
        tenant_id=tenant_id,
        scope=f"{request.method} {request.url.path}",
        key=key,
        body=body,
        into=into,
        produce=produce,
        now=_routing(request).clock.now(),
    )


class WorkersController(Controller):
    """The worker registry: humans, agents and systems that receive work."""

    path = "/v1/workers"
    tags = ("routing",)

    @post("/")
    async def put_worker(
        self,
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
        idempotency_key: IdempotencyKey = None,
    ) -> Response[Any]:
        """Create (201) or replace (200) a worker; pools see the change on their next decision."""
        body = decode_body(await request.body(), Worker)

        async def produce() -> tuple[int, Worker]:
            created, worker = await _routing(request).put_worker(tenant_id, body)
            return (201 if created else 200), worker

        return await _idempotent(request, tenant_id, idempotency_key, body, Worker, produce)

    @get("/")
    async def list_workers(
        self, request: Request[Any, Any, Any], tenant_id: NamedDependency[str]
    ) -> Response[Any]:
        """Every worker, by id."""
        return _json(await _routing(request).list_workers(tenant_id))

    @get("/{worker_id:str}")
    async def get_worker(
        self,
        worker_id: FromPath[str],
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
    ) -> Response[Any]:
        """One worker."""
        return _json(await _routing(request).get_worker(tenant_id, worker_id))

    @delete("/{worker_id:str}", status_code=204)
    async def delete_worker(
        self,
        worker_id: FromPath[str],
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
    ) -> None:
        """Delete a worker no pool lists any more (422 `routing.config` otherwise)."""
        await _routing(request).delete_entity(tenant_id, "worker", worker_id)


class PoolsController(Controller):
    """Pools: members with filters, caps, budgets and bids; a live and shadow strategies."""

    path = "/v1/pools"
    tags = ("routing",)

    @post("/")
    async def put_pool(
        self,
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
        idempotency_key: IdempotencyKey = None,
    ) -> Response[Any]:
        """Create (201) or replace (200) a pool; every member must be a known worker."""
        body = decode_body(await request.body(), Pool)

        async def produce() -> tuple[int, Pool]:
            created, pool = await _routing(request).put_pool(tenant_id, body)
            return (201 if created else 200), pool

        return await _idempotent(request, tenant_id, idempotency_key, body, Pool, produce)

    @get("/")
    async def list_pools(
        self, request: Request[Any, Any, Any], tenant_id: NamedDependency[str]
    ) -> Response[Any]:
        """Every pool, by id."""
        return _json(await _routing(request).list_pools(tenant_id))

    @get("/{pool_id:str}")
    async def get_pool(
        self,
        pool_id: FromPath[str],
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
    ) -> Response[Any]:
        """One pool."""
        return _json(await _routing(request).get_pool(tenant_id, pool_id))

    @delete("/{pool_id:str}", status_code=204)
    async def delete_pool(
        self,
        pool_id: FromPath[str],
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
    ) -> None:
        """Delete a pool no rule uses any more (422 `routing.config` otherwise)."""
        await _routing(request).delete_entity(tenant_id, "pool", pool_id)

    @get("/{pool_id:str}/shadow-report")
    async def shadow_report(
        self,
        pool_id: FromPath[str],
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
        limit: Annotated[int, QueryParameter(ge=1, le=100_000)] = 10_000,
    ) -> Response[Any]:
        """How often each shadow strategy agreed with the live one, over the latest decisions."""
        return _json(await _routing(request).shadow_report(tenant_id, pool_id, limit=limit))


class RulesController(Controller):
    """The tenant's rule set: each publish is a new, numbered version, live at once."""

    path = "/v1/rules"
    tags = ("routing",)

    @post("/")
    async def publish(
        self,
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
        idempotency_key: IdempotencyKey = None,
    ) -> Response[Any]:
        """Publish `{id, rules, default_pool, kinds, enrichers, seed}` as the next version (201)."""
        body = decode_body(await request.body(), RulesBody)

        async def produce() -> tuple[int, RuleSetView]:
            return 201, await _routing(request).publish_rules(tenant_id, body)

        return await _idempotent(request, tenant_id, idempotency_key, body, RuleSetView, produce)

    @get("/")
    async def latest(
        self, request: Request[Any, Any, Any], tenant_id: NamedDependency[str]
    ) -> Response[Any]:
        """The rule set in force."""
        return _json(await _routing(request).get_rules(tenant_id))

    @get("/versions")
    async def versions(
        self, request: Request[Any, Any, Any], tenant_id: NamedDependency[str]
    ) -> Response[Any]:
        """Every version, newest first."""
        return _json(await _routing(request).list_rule_versions(tenant_id))

    @get("/versions/{version:int}")
    async def version(
        self,
        version: FromPath[int],
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
    ) -> Response[Any]:
        """One version."""
        return _json(await _routing(request).get_rules(tenant_id, version))


class RouteController(Controller):
    """Route a routable now: the decision, its explanation and its assignment."""

    path = "/v1"
    tags = ("routing",)

    @post("/route")
    async def route(
        self,
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
        idempotency_key: IdempotencyKey = None,
    ) -> Response[Any]:
        """Run Validate, Enrich, Filter, Select, Assign on `{id, kind, attributes, ...}` (201)."""
        body = decode_body(await request.body(), RouteBody)

        async def produce() -> tuple[int, DecisionView]:
            return 201, await _routing(request).route(tenant_id, body)

        return await _idempotent(request, tenant_id, idempotency_key, body, DecisionView, produce)

    @get("/decisions/{decision_id:str}")
    async def decision(
        self,
        decision_id: FromPath[str],
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
    ) -> Response[Any]:
        """A stored decision with its explanation."""
        return _json(await _routing(request).get_decision(tenant_id, decision_id))

    @get("/assignments")
    async def assignments(
        self,
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
        routable_id: FromQuery[str | None] = None,
        worker: FromQuery[str | None] = None,
        status: FromQuery[str | None] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=1000)] = 100,
    ) -> Response[Any]:
        """Assignments by `routable_id`, `worker` (an assignee's inbox) and `status`."""
        return _json(
            await _routing(request).list_assignments(
                tenant_id, routable_id=routable_id, worker=worker, status=status, limit=limit
            )
        )

    @get("/assignments/{assignment_id:str}")
    async def assignment(
        self,
        assignment_id: FromPath[str],
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
    ) -> Response[Any]:
        """One assignment and its status."""
        return _json(await _routing(request).get_assignment(tenant_id, assignment_id))

    async def _move(
        self,
        request: Request[Any, Any, Any],
        tenant_id: str,
        assignment_id: str,
        to_status: str,
        key: str | None,
    ) -> Response[Any]:
        body = decode_body(await request.body(), OutcomeBody, optional=True)

        async def produce() -> tuple[int, AssignmentView]:
            moved = await _routing(request).move_assignment(
                tenant_id, assignment_id, to_status, result=body.result, reason=body.reason
            )
            return 200, moved

        return await _idempotent(request, tenant_id, key, body, AssignmentView, produce)

    @post("/assignments/{assignment_id:str}/accept")
    async def accept(
        self,
        assignment_id: FromPath[str],
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
        idempotency_key: IdempotencyKey = None,
    ) -> Response[Any]:
        """The assignee takes the work."""
        return await self._move(request, tenant_id, assignment_id, ACCEPTED, idempotency_key)

    @post("/assignments/{assignment_id:str}/complete")
    async def complete(
        self,
        assignment_id: FromPath[str],
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
        idempotency_key: IdempotencyKey = None,
    ) -> Response[Any]:
        """The assignee finished: `{result?}`; its load is given back."""
        return await self._move(request, tenant_id, assignment_id, COMPLETED, idempotency_key)

    @post("/assignments/{assignment_id:str}/reject")
    async def reject(
        self,
        assignment_id: FromPath[str],
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
        idempotency_key: IdempotencyKey = None,
    ) -> Response[Any]:
        """The assignee declines: `{reason?}`; every reservation is given back."""
        return await self._move(request, tenant_id, assignment_id, REJECTED, idempotency_key)


ROUTING_CONTROLLERS = (WorkersController, PoolsController, RulesController, RouteController)
"""Every routing controller, for the app's route list."""


#: (path, method) -> (request body type or None, body required, success response type).
ROUTING_OPERATIONS: dict[tuple[str, str], tuple[Any, bool, Any]] = {
    ("/v1/workers", "post"): (Worker, True, Worker),
    ("/v1/workers", "get"): (None, False, list[Worker]),
    ("/v1/workers/{worker_id}", "get"): (None, False, Worker),
    ("/v1/pools", "post"): (Pool, True, Pool),
    ("/v1/pools", "get"): (None, False, list[Pool]),
    ("/v1/pools/{pool_id}", "get"): (None, False, Pool),
    ("/v1/pools/{pool_id}/shadow-report", "get"): (None, False, ShadowReportView),
    ("/v1/rules", "post"): (RulesBody, True, RuleSetView),
    ("/v1/rules", "get"): (None, False, RuleSetView),
    ("/v1/rules/versions", "get"): (None, False, list[RuleSetVersion]),
    ("/v1/rules/versions/{version}", "get"): (None, False, RuleSetView),
    ("/v1/route", "post"): (RouteBody, True, DecisionView),
    ("/v1/decisions/{decision_id}", "get"): (None, False, DecisionView),
    ("/v1/assignments", "get"): (None, False, list[AssignmentView]),
    ("/v1/assignments/{assignment_id}", "get"): (None, False, AssignmentView),
    **{
        (f"/v1/assignments/{{assignment_id}}/{move}", "post"): (OutcomeBody, False, AssignmentView)
        for move in ("accept", "complete", "reject")
    },
}


def document_routing(app: Litestar) -> None:
    """Describe the routing operations' bodies and answers in the OpenAPI document
    with msgspec's schemas (the handlers decode and encode with msgspec)."""
    schema = app.plugins.get(OpenAPIPlugin).provide_openapi_schema()
    entries = list(ROUTING_OPERATIONS.items())
    types: list[Any] = []
    for _, (body, _, answer) in entries:
        types.extend(t for t in (body, answer) if t is not None)
    refs, components = msgspec.json.schema_components(
        types, ref_template="#/components/schemas/{name}"
    )
    existing = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, component in components.items():
        existing.setdefault(name, component)
    found = iter(refs)
    paths = schema.get("paths", {})
    for (path, method), (body, required, _) in entries:
        body_ref = next(found) if body is not None else None
        answer_ref = next(found)
        operation = paths.get(path, {}).get(method)
        if operation is None:
            continue
        if body_ref is not None:
            operation["requestBody"] = {
                "required": required,
                "content": {"application/json": {"schema": body_ref}},
            }
        for status, response in operation.get("responses", {}).items():
            if status.startswith("2") and status != "204":
                response["content"] = {"application/json": {"schema": answer_ref}}
