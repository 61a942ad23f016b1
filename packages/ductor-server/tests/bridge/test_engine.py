"""Bridge runs through a real Runtime on both backends, the app reached in-process:
every primitive, retries, non-retriable failures, changed code, bad signatures."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from ductor import CancelContext, Client, Context, NonRetriableError
from ductor.protocol import Event, Signal
from ductor_core.runs import DispatchTask, RunStatus, StepState, StepStatus
from ductor_server.bridge.runs import bridge_data
from ductor_server.bridge.tick import bridge_start
from ductor_server.engine.clock import SystemClock
from ductor_server.errors import WorkflowNotFound
from ductor_server.storage import NewRun, NewTask

from .conftest import KEY, TENANT


def _app(counts: dict[str, int]) -> Client:
    client = Client("shop", signing_key=KEY)

    def bump(name: str) -> None:
        counts[name] = counts.get(name, 0) + 1

    async def charge(order: dict[str, Any]) -> dict[str, Any]:
        bump("charge")
        return {"charged": order["total"]}

    @client.workflow("receipt")
    async def receipt(ctx: Context, charge: dict[str, Any]) -> str:
        return await ctx.step.run("format", lambda: f"receipt for {charge['charged']}")

    @client.workflow("order", trigger="order.created", retries=2)
    async def order(ctx: Context, order: dict[str, Any]) -> dict[str, Any]:
        charged = await ctx.step.run("charge", charge, order)
        await ctx.step.sleep("cool-off", "1s")
        shipped = await ctx.step.wait_for_event(
            "shipped", event="order.shipped", match="event.data.id == input.id", timeout="30s"
        )
        approval = await ctx.step.wait_for_signal("approve", signal="approve", timeout="30s")
        both = await asyncio.gather(
            ctx.step.run("left", lambda: "L"), ctx.step.run("right", lambda: "R")
        )
        note = await ctx.step.invoke("receipt", workflow="receipt", app_id="shop", input=charged)
        assert isinstance(shipped, Event)
        assert isinstance(approval, Signal)
        return {
            "charged": charged,
            "shipped": shipped.data,
            "approved_by": approval.data,
            "both": list(both),
            "note": note,
        }

    flaky_tries = {"n": 0}

    async def flaky() -> str:
        flaky_tries["n"] += 1
        bump("flaky")
        if flaky_tries["n"] < 3:
            raise RuntimeError(f"try {flaky_tries['n']} fails")
        return "finally"

    @client.workflow("flaky", retries=3)
    async def flaky_wf(ctx: Context, _: None) -> str:
        return await ctx.step.run("flaky", flaky)

    async def declined() -> None:
        raise NonRetriableError("card declined", code="card.declined")

    @client.workflow("declined")
    async def declined_wf(ctx: Context, _: None) -> None:
        await ctx.step.run("charge", declined)

    return client


async def test_every_primitive_through_the_engine(make_engine: Any) -> None:
    counts: dict[str, int] = {}
    async with make_engine(_app(counts)) as engine:
        accepted = (
            await engine.services.events.send(
                TENANT, "order.created", {"id": 7, "total": 500}, "evt-1"
            )
        ).value
        [run_id] = accepted.runs_started
        # Resending the event starts nothing.
        again = (
            await engine.services.events.send(
                TENANT, "order.created", {"id": 7, "total": 500}, "evt-1"
            )
        ).value
        assert again.runs_started == []

        def waiting_for(what: str) -> Any:
            return lambda v: any(s.waiting_for == what for s in v.steps)

        await engine.wait_run(run_id, waiting_for("event order.shipped"), "wait for the event")
        # An event for another order does not match the wait.
        await engine.services.events.send(TENANT, "order.shipped", {"id": 8}, "evt-2")
        await engine.services.events.send(TENANT, "order.shipped", {"id": 7}, "evt-3")
        await engine.wait_run(run_id, waiting_for("signal approve"), "wait for the signal")
        await engine.services.runs.signal(TENANT, run_id, "approve", "ops", None)
        view = await engine.wait_run(run_id)

    assert view.status == RunStatus.SUCCEEDED, view.error
    assert view.output == {
        "charged": {"charged": 500},
        "shipped": {"id": 7},
        "approved_by": "ops",
        "both": ["L", "R"],
        "note": "receipt for 500",
    }
    assert counts["charge"] == 1
    assert view.family_slug == "bridge:shop:order"
    # (Postgres jsonb does not keep the order of the steps map; the history list keeps order.)
    refs = {s.ref for s in view.steps if s.ref != "_bridge"}
    assert refs == {"charge", "cool-off", "shipped", "approve", "left", "right", "receipt"}
    [own] = [s for s in view.steps if s.ref == "_bridge"]
    assert (own.status, own.error) == (StepStatus.SUCCEEDED, None)
    async with engine.store.transaction() as tx:
        run = await tx.get_run(TENANT, run_id)
        children = await tx.list_child_runs(TENANT, run_id)
    assert run is not None
    assert run.kind == "bridge"
    history = bridge_data(run).history
    assert len({r.id for r in history}) == len(history) == 7
    names = [r.name for r in history]
    assert names[:4] == ["charge", "cool-off", "shipped", "approve"]
    assert set(names[4:6]) == {"left", "right"}
    assert names[6] == "receipt"
    assert [c.family_slug for c in children] == ["bridge:shop:receipt"]
    assert children[0].status == RunStatus.SUCCEEDED


async def test_a_failing_step_is_retried_then_succeeds(make_engine: Any) -> None:
    counts: dict[str, int] = {}
    async with make_engine(_app(counts)) as engine:
        run = (
            await engine.services.runs.trigger(TENANT, "bridge:shop:flaky", None, None, None)
        ).value
        retrying = await engine.wait_run(
            run.id,
            lambda v: any(s.status == StepStatus.RETRYING for s in v.steps),
            "show the step retrying",
        )
        view = await engine.wait_run(run.id)
        history = await engine.services.runs.history(TENANT, run.id)
    assert view.status == RunStatus.SUCCEEDED, view.error
    assert view.output == "finally"
    assert counts["flaky"] == 3
    # While it waits to be tried again, the step shows its try, error and time,
    # in the words a DAG step uses.
    [step] = [s for s in retrying.steps if s.ref == "flaky"]
    assert step.attempt in (1, 2)
    assert step.error is not None
    assert f"try {step.attempt} fails" in step.error.message
    assert step.retry_at is not None
    assert step.waiting_for is not None
    assert step.waiting_for.startswith("retry at ")
    # Done: three tries, and each failed one is in the history.
    [done] = [s for s in view.steps if s.ref == "flaky"]
    assert (done.status, done.attempt, done.error) == (StepStatus.SUCCEEDED, 3, None)
    retries = [e.data for e in history if e.kind == "step.retrying"]
    assert [(r["step_ref"], r["attempt"]) for r in retries] == [("flaky", 1), ("flaky", 2)]
    assert all("fails" in r["error"]["message"] and r["retry_at"] for r in retries)


async def test_a_non_retriable_error_fails_the_run_with_the_error(make_engine: Any) -> None:
    async with make_engine(_app({})) as engine:
        run = (
            await engine.services.runs.trigger(TENANT, "bridge:shop:declined", None, None, None)
        ).value
        view = await engine.wait_run(run.id)
    assert view.status == RunStatus.FAILED
    assert view.error is not None
    assert view.error.code == "card.declined"
    assert "card declined" in view.error.message
    [charge] = [s for s in view.steps if s.ref == "charge"]
    assert charge.status.value == "STEP_STATUS_FAILED"
    # Step `_bridge` shows the run's own status, with its error.
    [own] = [s for s in view.steps if s.ref == "_bridge"]
    assert (own.status, own.error) == (StepStatus.FAILED, view.error)


async def test_a_bad_signature_fails_the_run_and_records_nothing(make_engine: Any) -> None:
    counts: dict[str, int] = {}
    async with make_engine(_app(counts), server_key="another-key") as engine:
        run = (
            await engine.services.runs.trigger(TENANT, "bridge:shop:order", None, {"id": 1}, None)
        ).value
        view = await engine.wait_run(run.id)
    assert view.status == RunStatus.FAILED
    assert view.error is not None
    assert view.error.code == "signature.mismatch"
    assert counts == {}
    assert [s.ref for s in view.steps] == ["_bridge"]


async def test_changed_code_fails_the_run_as_workflow_changed(make_engine: Any) -> None:
    client = Client("shop", signing_key=KEY)
    version = {"n": 1}

    @client.workflow("evolving")
    async def evolving(ctx: Context, _: None) -> str:
        await ctx.step.run("first" if version["n"] == 1 else "renamed", lambda: 1)
        await ctx.step.sleep("pause", "1s")
        return "done"

    async with make_engine(client) as engine:
        run = (
            await engine.services.runs.trigger(TENANT, "bridge:shop:evolving", None, None, None)
        ).value
        await engine.wait_run(
            run.id,
            lambda v: any((s.waiting_for or "").startswith("timer ") for s in v.steps),
            "sleep",
        )
        version["n"] = 2  # the code changes under the sleeping run
        view = await engine.wait_run(run.id)
    assert view.status == RunStatus.FAILED
    assert view.error is not None
    assert view.error.code == "workflow.changed"


async def test_a_bridge_run_stored_by_an_earlier_release_runs_to_its_end(
    make_engine: Any,
) -> None:
    # Earlier releases kept the bookkeeping in the `_bridge` step (kind_state NULL);
    # migration 0300 gave such runs kind "bridge".
    async with make_engine(_app({})) as engine:
        now = SystemClock().now()
        start = bridge_start(
            run_id="run_legacy", app_id="shop", workflow_id="receipt", input={"charged": 5}, now=now
        )
        holder = StepState(
            ref="_bridge", status=StepStatus.RUNNING, data=msgspec.to_builtins(start.data)
        )
        legacy = msgspec.structs.replace(
            start.state, status=RunStatus.RUNNING, steps={"_bridge": holder}
        )
        async with engine.store.transaction() as tx:
            await tx.insert_runs(
                [
                    NewRun(
                        tenant_id=TENANT,
                        family_slug="bridge:shop:receipt",
                        version=1,
                        state=legacy,
                        kind="bridge",
                    )
                ]
            )
            await tx.enqueue_tasks(
                [
                    NewTask.from_dispatch(TENANT, "run_legacy", c, available_at=now)
                    for c in start.commands
                    if isinstance(c, DispatchTask)
                ]
            )
        engine.runtime.wake()
        view = await engine.wait_run("run_legacy")
        async with engine.store.transaction() as tx:
            run = await tx.get_run(TENANT, "run_legacy")
    assert view.status == RunStatus.SUCCEEDED, view.error
    assert view.output == "receipt for 5"
    assert [s.ref for s in view.steps if s.ref != "_bridge"] == ["format"]
    assert run is not None
    assert [r.name for r in bridge_data(run).history] == ["format"]
    assert run.state.steps["_bridge"].data == {}  # moved to kind_state by the first tick
    assert run.kind_state is not None


async def test_an_unknown_bridge_workflow_is_not_found(make_engine: Any) -> None:
    async with make_engine(_app({})) as engine:
        with pytest.raises(WorkflowNotFound):
            await engine.services.runs.trigger(TENANT, "bridge:shop:nope", None, None, None)
        with pytest.raises(WorkflowNotFound):
            await engine.services.runs.trigger(TENANT, "bridge:elsewhere:order", None, None, None)


async def test_a_dag_bridge_step_runs_the_sdk_workflow_as_a_child(make_engine: Any) -> None:
    counts: dict[str, int] = {}
    async with make_engine(_app(counts)) as engine:
        await engine.services.workflows.publish(
            TENANT,
            {
                "family_slug": "checkout",
                "steps": [
                    {
                        "ref": "receipt",
                        "type": "STEP_TYPE_BRIDGE",
                        "args": {"app_id": "shop", "workflow": "receipt", "input": "input"},
                    },
                    {
                        "ref": "done",
                        "type": "STEP_TYPE_DATAFLOW",
                        "args": {
                            "operation": "project",
                            "project": {"note": "steps.receipt.output"},
                        },
                    },
                ],
                "edges": [{"source_ref": "receipt", "target_ref": "done"}],
            },
        )
        run = (
            await engine.services.runs.trigger(TENANT, "checkout", None, {"charged": 9}, None)
        ).value
        view = await engine.wait_run(run.id)
        async with engine.store.transaction() as tx:
            children = await tx.list_child_runs(TENANT, run.id)
    assert view.status == RunStatus.SUCCEEDED, view.error
    [done] = [s for s in view.steps if s.ref == "done"]
    assert done.output == {"note": "receipt for 9"}
    [child] = children
    assert child.family_slug == "bridge:shop:receipt"
    assert child.status == RunStatus.SUCCEEDED


async def test_a_dag_bridge_step_to_an_unknown_workflow_fails_clearly(make_engine: Any) -> None:
    async with make_engine(_app({})) as engine:
        await engine.services.workflows.publish(
            TENANT,
            {
                "family_slug": "lost",
                "steps": [
                    {
                        "ref": "call",
                        "type": "STEP_TYPE_BRIDGE",
                        "args": {"app_id": "shop", "workflow": "nope"},
                    }
                ],
                "edges": [],
            },
        )
        run = (await engine.services.runs.trigger(TENANT, "lost", None, None, None)).value
        view = await engine.wait_run(run.id)
    assert view.status == RunStatus.FAILED
    [call] = [s for s in view.steps if s.ref == "call"]
    assert call.error is not None
    assert call.error.code == "workflow.not_found"


async def test_an_invoke_without_app_id_names_the_fix(make_engine: Any) -> None:
    """`workflow=` alone names a DAG family: an SDK workflow's id there fails
    with an error that says to name its app."""
    client = Client("shop", signing_key=KEY)

    @client.workflow("receipt")
    async def receipt(ctx: Context, _: None) -> Any:
        return "sent"

    @client.workflow("checkout")
    async def checkout(ctx: Context, _: None) -> Any:
        return await ctx.step.invoke("send", workflow="receipt")

    async with make_engine(client) as engine:
        run = (
            await engine.services.runs.trigger(TENANT, "bridge:shop:checkout", None, None, None)
        ).value
        view = await engine.wait_run(run.id)
    assert view.status == RunStatus.FAILED
    assert view.error is not None
    assert view.error.code == "workflow.not_found", view.error
    message = view.error.message
    assert "name its app too" in message, message
    # Either SDK may have made the call: the message names both spellings.
    assert 'workflow "receipt" with app_id=... in Python, appId: ... in TypeScript' in message


async def test_cancelling_a_bridge_run_cancels_its_invoked_child(make_engine: Any) -> None:
    client = Client("shop", signing_key=KEY)

    @client.workflow("waiter")
    async def waiter(ctx: Context, _: None) -> Any:
        return await ctx.step.wait_for_signal("hold", signal="never", timeout="1h")

    @client.workflow("parent")
    async def parent(ctx: Context, _: None) -> Any:
        return await ctx.step.invoke("child", workflow="waiter", app_id="shop")

    async with make_engine(client) as engine:
        run = (
            await engine.services.runs.trigger(TENANT, "bridge:shop:parent", None, None, None)
        ).value

        async def child_waits() -> list[Any]:
            async with engine.store.transaction() as tx:
                children = await tx.list_child_runs(TENANT, run.id)
            if not children:
                return []
            view = await engine.services.runs.get(TENANT, children[0].id)
            return [view] if any(s.waiting_for == "signal never" for s in view.steps) else []

        for _ in range(1000):
            if found := await child_waits():
                break
            await asyncio.sleep(0.02)
        [child] = found
        await engine.services.runs.cancel(TENANT, run.id, "changed my mind")
        view = await engine.wait_run(run.id)
        child_view = await engine.wait_run(child.id)
        history = await engine.services.runs.history(TENANT, run.id)
    assert view.status == RunStatus.CANCELLED
    assert child_view.status == RunStatus.CANCELLED
    assert history
    assert history[0].kind == "run.created"


async def test_cancelling_runs_the_workflows_on_cancel_handler_on_the_app(
    make_engine: Any,
) -> None:
    client = Client("shop", signing_key=KEY)
    handled: list[tuple[str, Any, str | None]] = []

    async def undo(ctx: CancelContext, input: Any) -> None:
        handled.append((ctx.run_id, input, ctx.reason))

    @client.workflow("undoable", on_cancel=undo)
    async def undoable(ctx: Context, _: Any) -> Any:
        return await ctx.step.wait_for_signal("hold", signal="never", timeout="1h")

    async with make_engine(client) as engine:
        run = (
            await engine.services.runs.trigger(
                TENANT, "bridge:shop:undoable", None, {"order": 1}, None
            )
        ).value
        await engine.wait_run(
            run.id, lambda v: any(s.waiting_for == "signal never" for s in v.steps), "wait"
        )
        await engine.services.runs.cancel(TENANT, run.id, "customer left")
        view = await engine.wait_run(run.id)
    assert view.status == RunStatus.CANCELLED
    assert view.error is not None
    assert view.error.message == "customer left"
    assert view.error.details == {"run_id": run.id, "handled": True, "error": None}
    assert handled == [(run.id, {"order": 1}, "customer left")]
    [own] = [s for s in view.steps if s.ref == "_bridge"]
    assert own.status == StepStatus.CANCELLED
