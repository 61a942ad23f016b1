"""STEP_TYPE_ROUTE in workflows: route and go on, or hold until the assignee completes,
rerouting on reject and on timeout (excluding who declined), on both backends."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from ductor_core.runs import RunStatus
from ductor_routing import Availability, Cap, KindSchema, Member, Pool, StrategySpec, Worker
from ductor_routing.pools import Window
from ductor_server.engine.actions import ActionCall, ActionFailed
from ductor_server.metering import MeteringTx
from ductor_server.services.metering import BudgetBody, PlanAssignBody, PlanBody
from ductor_server.services.route_step import RouteStep
from ductor_server.services.routing import RulesBody
from ductor_settlement import Entitlement, UsageWindow, window_start

from .conftest import TENANT, Engine


def workflow(*, await_completion: bool, timeout: str | None = None, attempts: int = 3) -> Any:
    args: dict[str, Any] = {
        "kind": "ticket",
        "attributes": {"topic": "input.topic", "size": "size(input.topic)"},
        "await_completion": await_completion,
    }
    if timeout is not None:
        args["timeout"] = timeout
    return {
        "family_slug": "triage",
        "title": "Triage",
        "steps": [
            {
                "ref": "assign",
                "type": "STEP_TYPE_ROUTE",
                "args": args,
                "retry": {"max_attempts": attempts, "initial_interval": "1s"},
            }
        ],
        "edges": [],
    }


async def configure(engine: Engine) -> None:
    routing = engine.routing
    for worker in ("ana", "ben", "cy"):
        await routing.put_worker(TENANT, Worker(id=worker))
    members = tuple(
        Member(worker=w, caps=(Cap(window=Window.DAY, limit=5),)) for w in ("ana", "ben", "cy")
    )
    await routing.put_pool(
        TENANT, Pool(id="desk", members=members, strategy=StrategySpec(name="round_robin"))
    )
    await routing.publish_rules(
        TENANT, RulesBody(kinds={"ticket": KindSchema()}, default_pool="desk")
    )


async def start(engine: Engine, definition: Any) -> str:
    await engine.services.workflows.publish(TENANT, definition)
    run = (await engine.services.runs.trigger(TENANT, "triage", None, {"topic": "vpn"})).value
    return run.id


async def test_route_step_routes_and_the_run_goes_on(engine: Engine) -> None:
    await configure(engine)
    run_id = await start(engine, workflow(await_completion=False))
    view = await engine.wait_run(run_id)
    assert view.status is RunStatus.SUCCEEDED, view
    (step,) = view.steps
    output = step.output
    assert output["outcome"] == "assigned"
    assert output["worker"] == "ana"
    decision = await engine.routing.get_decision(TENANT, output["id"])
    assert decision.routable_id == f"{run_id}:assign:-1"
    assert decision.explanation.pool == "desk"
    (assignment,) = await engine.routing.assignments_of(TENANT, f"{run_id}:assign:-1")
    assert assignment.status == "assigned"
    assert assignment.id == output["assignment_id"]


async def test_awaited_route_reroutes_on_reject_then_completes(engine: Engine) -> None:
    await configure(engine)
    run_id = await start(engine, workflow(await_completion=True))
    routable = f"{run_id}:assign:-1"
    first = await engine.open_assignment(routable)
    view = await engine.services.runs.get(TENANT, run_id)
    assert view.status is RunStatus.RUNNING
    await engine.routing.move_assignment(TENANT, first.id, "rejected", reason="on leave")
    # The attempt fails (retryable); after the backoff the step routes again,
    # and the worker who declined is excluded.
    await engine.wait_run(run_id, lambda r: r.steps[0].retry_at is not None, what="a retry")
    engine.advance(5)
    second = await engine.open_assignment(routable, after=1)
    assert second.worker != first.worker
    decision = await engine.routing.get_decision(TENANT, second.decision_id)
    excluded = {
        w for e in decision.explanation.excluded if e.reason == "excluded" for w in e.workers
    }
    assert excluded == {first.worker}
    await engine.routing.move_assignment(TENANT, second.id, "completed", result={"fixed": True})
    view = await engine.wait_run(run_id)
    assert view.status is RunStatus.SUCCEEDED, view
    (step,) = view.steps
    assert step.output["result"] == {"fixed": True}
    assert step.output["worker"] == second.worker
    assert step.attempt == 2


async def test_awaited_route_times_out_expires_and_fails_after_its_attempts(
    engine: Engine,
) -> None:
    await configure(engine)
    run_id = await start(engine, workflow(await_completion=True, timeout="1s", attempts=2))
    routable = f"{run_id}:assign:-1"
    await engine.open_assignment(routable)
    await engine.wait_run(run_id, lambda r: r.steps[0].retry_at is not None, what="a retry")
    engine.advance(5)
    await engine.open_assignment(routable, after=1)
    view = await engine.wait_run(run_id)
    assert view.status is RunStatus.FAILED
    assert view.steps[0].error is not None
    assert view.steps[0].error.code == "route.timeout"
    found = await engine.routing.assignments_of(TENANT, routable)
    assert [a.status for a in found] == ["expired", "expired"]
    assert found[0].worker != found[1].worker


async def test_a_redelivered_attempt_finds_its_decision_and_books_once(engine: Engine) -> None:
    await configure(engine)
    step = RouteStep(engine.routing, poll_interval=0.01)
    call = ActionCall(
        tenant_id=TENANT,
        run_id="run-x",
        step_ref="assign",
        attempt=1,
        handler="route",
        payload={"kind": "ticket", "attributes": {"topic": "vpn"}},
        idempotency_key="run-x:assign:-1:1",
    )
    first = await step(call)
    again = await step(call)
    assert again == first
    (assignment,) = await engine.routing.assignments_of(TENANT, "run-x:assign:-1")
    assert assignment.decision_id == first["id"]
    # The next attempt is a new decision, on the same routable.
    nxt = await step(msgspec.structs.replace(call, attempt=2, idempotency_key="run-x:assign:-1:2"))
    assert nxt["id"] != first["id"]
    assert len(await engine.routing.assignments_of(TENANT, "run-x:assign:-1")) == 2


async def _decisions_today(engine: Engine) -> int:
    async with engine.store.transaction() as tx:
        start = window_start(UsageWindow.DAY, engine.clock.now())
        return await MeteringTx(tx).counter(TENANT, "route_decisions", UsageWindow.DAY, start)


async def test_route_steps_are_metered_once_and_refused_past_a_budget_or_a_plan(
    engine: Engine,
) -> None:
    await configure(engine)
    await engine.services.metering.create_budget(
        TENANT, BudgetBody(meter="route_decisions", window=UsageWindow.DAY, limit=1)
    )
    step = RouteStep(engine.routing, poll_interval=0.01)
    call = ActionCall(
        tenant_id=TENANT,
        run_id="run-m",
        step_ref="assign",
        attempt=1,
        handler="route",
        payload={"kind": "ticket", "attributes": {"topic": "vpn"}},
        idempotency_key="run-m:assign:-1:1",
    )
    first = await step(call)
    assert await _decisions_today(engine) == 1
    # A redelivered attempt answers its decision: not counted again, not refused.
    assert await step(call) == first
    assert await _decisions_today(engine) == 1
    # A new decision would pass the blocking budget: refused, naming the meter.
    with pytest.raises(ActionFailed) as failed:
        await step(msgspec.structs.replace(call, attempt=2, idempotency_key="run-m:assign:-1:2"))
    assert failed.value.error.code == "budget.exceeded"
    assert not failed.value.error.retryable
    assert failed.value.error.details["meter"] == "route_decisions"
    assert (failed.value.error.details["limit"], failed.value.error.details["current"]) == (1, 1)
    assert len(await engine.routing.assignments_of(TENANT, "run-m:assign:-1")) == 1
    # Through the engine, the run's route step fails with the error.
    run_id = await start(engine, workflow(await_completion=False, attempts=1))
    view = await engine.wait_run(run_id)
    assert view.status is RunStatus.FAILED
    assert view.steps[0].error is not None
    assert view.steps[0].error.code == "budget.exceeded"
    assert await _decisions_today(engine) == 1
    # A plan without routing: entitlement.missing, naming the plan and the feature.
    await engine.services.metering.delete_budget(TENANT, "route_decisions")
    plan = PlanBody(id="no-routing", entitlements={"workflows": Entitlement()})
    await engine.services.metering.create_plan(TENANT, plan)
    await engine.services.metering.assign_plan(TENANT, PlanAssignBody(plan="no-routing"))
    with pytest.raises(ActionFailed) as failed:
        await step(msgspec.structs.replace(call, attempt=3, idempotency_key="run-m:assign:-1:3"))
    assert failed.value.error.code == "entitlement.missing"
    assert failed.value.error.details == {"plan": "no-routing", "feature": "routing"}
    assert await _decisions_today(engine) == 1


async def test_route_step_bad_params_and_unknown_pool_fail_without_retry(engine: Engine) -> None:
    await configure(engine)
    step = RouteStep(engine.routing)
    base = ActionCall(
        tenant_id=TENANT,
        run_id="run-y",
        step_ref="assign",
        attempt=1,
        handler="route",
        payload=None,
        idempotency_key="run-y:assign:-1:1",
    )
    for payload, code in [
        ({"attributes": {}}, "route.bad_params"),
        ({"kind": "ticket", "price": "12"}, "route.bad_params"),
        ({"kind": "ticket", "pool": "nowhere"}, "pool.not_found"),
        ({"kind": "bogus"}, "routing.routable_invalid"),
    ]:
        with pytest.raises(ActionFailed) as failed:
            await step(msgspec.structs.replace(base, payload=payload))
        assert failed.value.error.code == code
        assert not failed.value.error.retryable
    assert await engine.routing.assignments_of(TENANT, "run-y:assign:-1") == []
    # A pool named in the step skips the rules.
    out = await step(msgspec.structs.replace(base, payload={"kind": "ticket", "pool": "desk"}))
    assert out["explanation"]["rule"] == "default"
    assert out["pool"] == "desk"


async def test_no_recipient_is_a_retryable_failure(engine: Engine) -> None:
    await configure(engine)
    for worker in ("ana", "ben", "cy"):
        await engine.routing.put_worker(
            TENANT, Worker(id=worker, availability=Availability.OFFLINE)
        )
    step = RouteStep(engine.routing)
    call = ActionCall(
        tenant_id=TENANT,
        run_id="run-z",
        step_ref="assign",
        attempt=1,
        handler="route",
        payload={"kind": "ticket"},
        idempotency_key="run-z:assign:-1:1",
    )
    with pytest.raises(ActionFailed) as failed:
        await step(call)
    assert failed.value.error.code == "route.unassigned"
    assert failed.value.error.retryable
    assert failed.value.error.details["outcome"] == "unassigned"
