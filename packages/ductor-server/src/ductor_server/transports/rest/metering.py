"""Metering resources: `/v1/meters`, `/v1/usage`, `/v1/budgets`, `/v1/plans`, `/v1/plan`.
Thin handlers over `MeteringService`.

Every create accepts an `Idempotency-Key`; another tenant's objects are 404.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from litestar import Controller, Request, Response, delete, get, post, put
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, JSONBody, QueryParameter

from ductor_server.errors import RequestInvalid
from ductor_server.services.metering import (
    BudgetBody,
    BudgetView,
    MeterBody,
    MeteringService,
    MeterView,
    PlanAssignBody,
    PlanAssignmentView,
    PlanBody,
    PlanView,
    UsageBody,
    UsageRecorded,
    UsageView,
)
from ductor_server.transports.rest.bodies import NO_BODY, NoBody, required
from ductor_server.transports.rest.dependencies import services_of
from ductor_server.transports.rest.errors import V1_ERRORS, also_created, also_ok
from ductor_server.transports.rest.idempotency import IdempotencyKey, answered, checked_key
from ductor_settlement import UsageWindow


def provide_metering(request: Request[Any, Any, Any]) -> MeteringService:
    """The metering service."""
    return services_of(request).metering


_METERING = {"metering": Provide(provide_metering, sync_to_thread=False)}


def usage_time(name: str, text: str | None) -> datetime | None:
    """The time of the usage query parameter `name` (None when absent or empty).

    Raises:
        RequestInvalid: not an RFC 3339 time with an offset.
    """
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        value = None
    if value is None or value.utcoffset() is None:
        raise RequestInvalid(
            f"{name!r} must be an RFC 3339 time with an offset, e.g. 2026-01-01T00:00:00Z",
            details={"path": name, "value": text[:100]},
        )
    return value


def usage_window(text: str) -> UsageWindow:
    """The usage window kind `text` names (`day` when it is empty).

    Raises:
        RequestInvalid: not hour, day or month.
    """
    if not text:
        return UsageWindow.DAY
    try:
        return UsageWindow(text)
    except ValueError:
        raise RequestInvalid(
            "'window' is one of hour, day, month", details={"path": "window", "value": text[:100]}
        ) from None


class MetersController(Controller):
    """Meters: the built-in ones and the tenant's own."""

    path = "/v1/meters"
    tags = ("metering",)
    dependencies = _METERING

    @post("/", status_code=201, responses=also_ok(MeterView, "The same meter existed"))
    async def create_meter(
        self,
        tenant_id: NamedDependency[str],
        metering: NamedDependency[MeteringService],
        data: JSONBody[MeterBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[MeterView]:
        """Create a meter (201); the same meter again is 200, another one under the
        name (or a built-in name) 409 `meter.conflict`."""
        body = required(data)
        key = checked_key(idempotency_key)
        return answered(await metering.create_meter(tenant_id, body, idempotency_key=key))

    @get("/", responses=V1_ERRORS)
    async def list_meters(
        self, tenant_id: NamedDependency[str], metering: NamedDependency[MeteringService]
    ) -> list[MeterView]:
        """The built-in meters (`runs`, `steps`, `route_decisions`), then the tenant's own."""
        return await metering.list_meters(tenant_id)

    @get("/{name:str}", responses=V1_ERRORS)
    async def get_meter(
        self,
        name: FromPath[str],
        tenant_id: NamedDependency[str],
        metering: NamedDependency[MeteringService],
    ) -> MeterView:
        """One meter."""
        return await metering.get_meter(tenant_id, name)


class UsageController(Controller):
    """Usage per meter and window."""

    path = "/v1/usage"
    tags = ("metering",)
    dependencies = _METERING

    @get("/", responses=V1_ERRORS)
    async def read_usage(
        self,
        tenant_id: NamedDependency[str],
        metering: NamedDependency[MeteringService],
        meter: Annotated[str | None, QueryParameter(max_length=64)] = None,
        window: Annotated[str, QueryParameter(max_length=16)] = "day",
        from_: Annotated[str | None, QueryParameter(name="from", max_length=64)] = None,
        to: Annotated[str | None, QueryParameter(max_length=64)] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=1000)] = 500,
    ) -> list[UsageView]:
        """Counters of one window kind (`hour`, `day`, `month`; default day) whose window
        starts in [`from`, `to`), oldest first; of one `meter` or all."""
        return await metering.usage(
            tenant_id,
            meter=meter,
            window=usage_window(window),
            start=usage_time("from", from_),
            end=usage_time("to", to),
            limit=limit,
        )

    @post("/", status_code=201, responses=V1_ERRORS)
    async def record_usage(
        self,
        tenant_id: NamedDependency[str],
        metering: NamedDependency[MeteringService],
        data: JSONBody[UsageBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[UsageRecorded]:
        """Record usage of a meter the tenant created (201); 429 `budget.exceeded` past
        a blocking budget (nothing recorded)."""
        body = required(data)
        key = checked_key(idempotency_key)
        return answered(await metering.record_usage(tenant_id, body, idempotency_key=key))


class BudgetsController(Controller):
    """Budgets: a limit per meter and window, alert thresholds, block at the limit."""

    path = "/v1/budgets"
    tags = ("metering",)
    dependencies = _METERING

    @post("/", status_code=201, responses=also_ok(BudgetView, "The same budget existed"))
    async def create_budget(
        self,
        tenant_id: NamedDependency[str],
        metering: NamedDependency[MeteringService],
        data: JSONBody[BudgetBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[BudgetView]:
        """Set the budget of a meter that has none (201); the same again is 200, another
        409 `budget.conflict` (PUT replaces)."""
        body = required(data)
        key = checked_key(idempotency_key)
        return answered(await metering.create_budget(tenant_id, body, idempotency_key=key))

    @get("/", responses=V1_ERRORS)
    async def list_budgets(
        self, tenant_id: NamedDependency[str], metering: NamedDependency[MeteringService]
    ) -> list[BudgetView]:
        """Every budget, by meter, with the current window's usage and recent alerts."""
        return await metering.list_budgets(tenant_id)

    @get("/{meter:str}", responses=V1_ERRORS)
    async def get_budget(
        self,
        meter: FromPath[str],
        tenant_id: NamedDependency[str],
        metering: NamedDependency[MeteringService],
    ) -> BudgetView:
        """The budget on a meter, its current window's usage and recent alerts."""
        return await metering.get_budget(tenant_id, meter)

    @put(
        "/{meter:str}",
        status_code=200,
        responses=also_created(BudgetView, "The meter had no budget: created"),
    )
    async def put_budget(
        self,
        meter: FromPath[str],
        tenant_id: NamedDependency[str],
        metering: NamedDependency[MeteringService],
        data: JSONBody[BudgetBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[BudgetView]:
        """Create (201) or replace (200) the budget on a meter."""
        body = required(data)
        key = checked_key(idempotency_key)
        return answered(await metering.put_budget(tenant_id, meter, body, idempotency_key=key))

    @delete("/{meter:str}", status_code=204, responses=V1_ERRORS)
    async def delete_budget(
        self,
        meter: FromPath[str],
        tenant_id: NamedDependency[str],
        metering: NamedDependency[MeteringService],
    ) -> None:
        """Remove the budget on a meter (its recorded alerts stay)."""
        await metering.delete_budget(tenant_id, meter)


class PlansController(Controller):
    """Plans: named sets of entitlements."""

    path = "/v1/plans"
    tags = ("metering",)
    dependencies = _METERING

    @post("/", status_code=201, responses=also_ok(PlanView, "The same plan existed"))
    async def create_plan(
        self,
        tenant_id: NamedDependency[str],
        metering: NamedDependency[MeteringService],
        data: JSONBody[PlanBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[PlanView]:
        """Create a plan (201); the same plan again is 200, another under its id 409
        `plan.conflict`."""
        body = required(data)
        key = checked_key(idempotency_key)
        return answered(await metering.create_plan(tenant_id, body, idempotency_key=key))

    @get("/", responses=V1_ERRORS)
    async def list_plans(
        self, tenant_id: NamedDependency[str], metering: NamedDependency[MeteringService]
    ) -> list[PlanView]:
        """Every plan, by id."""
        return await metering.list_plans(tenant_id)

    @get("/{plan_id:str}", responses=V1_ERRORS)
    async def get_plan(
        self,
        plan_id: FromPath[str],
        tenant_id: NamedDependency[str],
        metering: NamedDependency[MeteringService],
    ) -> PlanView:
        """One plan."""
        return await metering.get_plan(tenant_id, plan_id)


class PlanController(Controller):
    """The tenant's plan."""

    path = "/v1/plan"
    tags = ("metering",)
    dependencies = _METERING

    @get("/", responses=V1_ERRORS)
    async def get_assigned_plan(
        self, tenant_id: NamedDependency[str], metering: NamedDependency[MeteringService]
    ) -> PlanAssignmentView:
        """The tenant's plan (`plan` is null when it has none: nothing is gated)."""
        return await metering.assigned_plan(tenant_id)

    @put("/", status_code=200, responses=V1_ERRORS)
    async def assign_plan(
        self,
        tenant_id: NamedDependency[str],
        metering: NamedDependency[MeteringService],
        data: JSONBody[PlanAssignBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[PlanAssignmentView]:
        """Assign a plan by id (`{"plan": null}` removes it); 404 `plan.not_found`."""
        body = required(data)
        key = checked_key(idempotency_key)
        return answered(await metering.assign_plan(tenant_id, body, idempotency_key=key))


METERING_CONTROLLERS = (
    MetersController,
    UsageController,
    BudgetsController,
    PlansController,
    PlanController,
)
"""The metering controllers, in the order they are served."""

__all__ = [
    "METERING_CONTROLLERS",
    "BudgetsController",
    "MetersController",
    "PlanController",
    "PlansController",
    "UsageController",
    "provide_metering",
    "usage_time",
    "usage_window",
]
