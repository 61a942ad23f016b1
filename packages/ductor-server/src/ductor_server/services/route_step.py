"""The `route` step handler: STEP_TYPE_ROUTE run by the workers through the routing service.

It never touches run state. Without `await_completion` the attempt commits a
decision and returns it. With it, the attempt holds (its lease kept alive by
the worker heartbeat) until the assignee completes the assignment, then
returns the result; a reject or a timeout fails the attempt as retryable, so
the step's retry policy reroutes it, excluding everyone who already declined.
A redelivered attempt (after a crash) finds its decision and waits again.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from typing import Any

import msgspec

from ductor_core.errors import DuctorError
from ductor_server.engine.actions import ActionCall, failure
from ductor_server.services.routing import (
    COMPLETED,
    EXPIRED,
    OPEN_STATUSES,
    RouteBody,
    RoutingService,
)

# The attempt gives up this long before the worker's own timeout would cancel it,
# so it can mark the assignment expired itself.
_TIMEOUT_MARGIN = 0.25


class RouteStep:
    """Handler for `route` tasks.

    Args:
        service: the routing service of this process.
        poll_interval: seconds between looks at an awaited assignment.
    """

    def __init__(self, service: RoutingService, *, poll_interval: float = 0.2) -> None:
        self.service = service
        self.poll_interval = poll_interval

    async def __call__(self, call: ActionCall) -> Any:
        payload = call.payload if isinstance(call.payload, Mapping) else {}
        kind = payload.get("kind")
        attributes = payload.get("attributes") or {}
        if not isinstance(kind, str) or not isinstance(attributes, Mapping):
            raise failure(
                "route.bad_params",
                "route needs a string kind and a map of attributes",
                retryable=False,
            )
        price = payload.get("price")
        if price is not None and (isinstance(price, bool) or not isinstance(price, int)):
            raise failure("route.bad_params", "route price must be integer micros", retryable=False)
        pool = payload.get("pool")
        routable_id = f"{call.run_id}:{call.step_ref}:{call.item_index}"
        tenant = call.tenant_id
        # Workers who declined or let earlier attempts expire do not get it again.
        earlier = await self.service.assignments_of(tenant, routable_id)
        exclude = tuple(sorted({a.worker for a in earlier if a.status not in OPEN_STATUSES}))
        body = RouteBody(
            id=routable_id,
            kind=kind,
            attributes=dict(attributes),
            price=price,
            pool=pool if isinstance(pool, str) else None,
            exclude=exclude,
        )
        digest = hashlib.sha256(f"{tenant}\n{call.idempotency_key}".encode()).hexdigest()[:32]
        try:
            decision = (
                await self.service.route(
                    tenant, body, decision_id=f"dec_{digest}", origin=call.idempotency_key
                )
            ).value
        except DuctorError as exc:
            # The details say what refused it (a budget's meter, limit and usage).
            details = None if exc.details is None else msgspec.to_builtins(exc.details)
            raise failure(exc.code, exc.message, retryable=exc.retryable, details=details) from exc
        output: dict[str, Any] = msgspec.to_builtins(decision)
        if decision.assignment_id is None:
            raise failure(
                "route.unassigned",
                f"no recipient for {routable_id}: {decision.explanation.note or 'no candidate'}",
                retryable=True,
                details=output,
            )
        if not payload.get("await_completion"):
            return output
        return await self._await(call, decision.assignment_id, output)

    async def _await(self, call: ActionCall, assignment_id: str, output: dict[str, Any]) -> Any:
        tenant = call.tenant_id
        loop = asyncio.get_running_loop()
        deadline = None
        if call.timeout_seconds is not None and call.timeout_seconds > 0:
            deadline = loop.time() + max(call.timeout_seconds - _TIMEOUT_MARGIN, 0.0)
        try:
            return await self._poll(tenant, assignment_id, output, deadline)
        except asyncio.CancelledError:
            # Past the deadline, the worker's own timeout cut the attempt before
            # it could expire the assignment (a slow store, a busy machine): it
            # must not stay open behind the failed attempt. (Cancelled before
            # the deadline, as at shutdown, the redelivered attempt finds it.)
            if deadline is not None and loop.time() >= deadline:
                await asyncio.shield(self._expire(tenant, assignment_id))
            raise

    async def _poll(
        self, tenant: str, assignment_id: str, output: dict[str, Any], deadline: float | None
    ) -> Any:
        loop = asyncio.get_running_loop()
        while True:
            assignment = await self.service.get_assignment(tenant, assignment_id)
            if assignment.status == COMPLETED:
                return {**output, "result": assignment.result}
            if assignment.status not in OPEN_STATUSES:
                raise failure(
                    f"route.{assignment.status}",
                    f"{assignment.worker} {assignment.status} the assignment"
                    + (f": {assignment.reason}" if assignment.reason else ""),
                    retryable=True,
                )
            if deadline is not None and loop.time() >= deadline:
                if not await self._expire(tenant, assignment_id):
                    continue  # completed or rejected just now: report that instead
                raise failure(
                    "route.timeout",
                    f"{assignment.worker} did not complete the assignment in time",
                    retryable=True,
                )
            await asyncio.sleep(self.poll_interval)

    async def _expire(self, tenant: str, assignment_id: str) -> bool:
        try:
            await self.service.move_assignment(
                tenant, assignment_id, EXPIRED, reason="not completed in time"
            )
        except DuctorError:
            return False
        return True
