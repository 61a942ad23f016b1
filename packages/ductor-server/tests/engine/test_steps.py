"""Each kind of step through the whole engine, on both backends: retries, failure
edges, conditions, scatter/gather, sub-workflows, signals, events and cancels."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import msgspec
import pytest

from ductor_core.definitions import content_hash, definition_from_obj
from ductor_core.runs import ErrorInfo
from ductor_server.engine.actions import ActionCall, ActionFailed
from ductor_server.errors import RunEnded, RunNotCancellable

from .conftest import CANCELLED, FAILED, SUCCEEDED, TENANT, Engine, step


def action(
    ref: str, name: str, params: dict[str, str] | None = None, **extra: Any
) -> dict[str, Any]:
    return {
        "ref": ref,
        "type": "STEP_TYPE_ACTION",
        "args": {"action": name, "params": params or {}},
        **extra,
    }


def project(ref: str, **fields: str) -> dict[str, Any]:
    return {
        "ref": ref,
        "type": "STEP_TYPE_DATAFLOW",
        "args": {"operation": "project", "project": fields},
    }


def edge(
    source: str, target: str, kind: str = "SUCCESS", condition: str | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"source_ref": source, "target_ref": target, "type": f"EDGE_TYPE_{kind}"}
    if condition is not None:
        out["condition"] = condition
    return out


async def test_retries_back_off_then_succeed(engine: Engine) -> None:
    calls: list[int] = []

    async def flaky(call: ActionCall) -> Any:
        calls.append(call.attempt)
        if call.attempt < 3:
            raise ActionFailed(ErrorInfo(code="upstream.busy", message="busy", retryable=True))
        return {"n": call.payload["params"]["n"], "attempt": call.attempt}

    engine.actions.register_action("flaky", flaky)
    retry = {"max_attempts": 3, "initial_interval": "10s", "backoff_coefficient": 2.0}
    await engine.publish(
        {
            "family_slug": "retrying",
            "steps": [action("call", "flaky", {"n": "input.n"}, retry=retry)],
        }
    )
    run = await engine.trigger("retrying", {"n": 7})
    start = engine.clock.now()
    view = await engine.wait_step(run.id, "call", "retrying")
    first_retry = step(view, "call").retry_at
    assert timedelta(seconds=9) <= first_retry - start <= timedelta(seconds=11)
    assert step(view, "call").error.code == "upstream.busy"
    await engine.advance(5)  # not due yet: no new attempt
    await asyncio.sleep(0.2)
    assert calls == [1]
    await engine.advance(6.5)
    view = await engine.wait_run(
        run.id,
        lambda v: (
            step(v, "call").attempt == 2 and step(v, "call").status.value.endswith("RETRYING")
        ),
    )
    second_retry = step(view, "call").retry_at
    assert timedelta(seconds=18) <= second_retry - engine.clock.now() <= timedelta(seconds=22)
    await engine.advance(23)
    done = await engine.wait_run(run.id)
    assert done.status == SUCCEEDED
    assert calls == [1, 2, 3]
    assert step(done, "call").output == {"n": 7, "attempt": 3}
    async with engine.store.transaction() as tx:
        attempts = await tx.list_attempts(TENANT, run.id)
    assert [(a.attempt, a.ok) for a in attempts] == [(1, False), (2, False), (3, True)]
    history = await engine.services.runs.history(TENANT, run.id)
    retrying = [h.data for h in history if h.kind == "step.retrying"]
    assert len(retrying) == 2
    # each retry's time is written as the API writes times (RFC 3339, UTC, `Z`)
    assert retrying[0]["retry_at"] == first_retry.isoformat().replace("+00:00", "Z")
    assert retrying[1]["retry_at"] == second_retry.isoformat().replace("+00:00", "Z")


async def test_non_retryable_failure_takes_the_failure_edge(engine: Engine) -> None:
    async def boom(call: ActionCall) -> Any:
        raise ActionFailed(ErrorInfo(code="card.declined", message="no", retryable=False))

    engine.actions.register_action("boom", boom)
    await engine.publish(
        {
            "family_slug": "handled",
            "steps": [
                action("charge", "boom"),
                project("recover", handled="true"),
                project("ship", ok="true"),
            ],
            "edges": [edge("charge", "recover", "FAILURE"), edge("charge", "ship")],
        }
    )
    run = await engine.trigger("handled", {})
    done = await engine.wait_run(run.id)
    assert done.status == SUCCEEDED
    assert step(done, "charge").status.value == "STEP_STATUS_FAILED"
    assert step(done, "charge").error.code == "card.declined"
    assert step(done, "charge").attempt == 1
    assert step(done, "ship").status.value == "STEP_STATUS_SKIPPED"
    assert done.output == {"recover": {"handled": True}}


async def test_unhandled_failure_fails_the_run(engine: Engine) -> None:
    # Publishing refuses an action the server does not have; a version stored
    # before that check (or one whose action has since gone) fails at run time.
    definition = definition_from_obj(
        {
            "family_slug": "unhandled",
            "steps": [action("send", "missing-action"), project("after", x="1")],
            "edges": [edge("send", "after")],
        }
    )
    async with engine.store.transaction() as tx:
        await tx.insert_workflow_version(
            TENANT,
            family_slug="unhandled",
            hash=content_hash(definition),
            definition=msgspec.to_builtins(definition),
            trigger_events=[],
            now=engine.clock.now(),
        )
    run = await engine.trigger("unhandled", {})
    done = await engine.wait_run(run.id)
    assert done.status == FAILED
    assert done.error is not None
    assert step(done, "send").error.code == "handler.unknown"
    assert step(done, "after").status.value in ("STEP_STATUS_CANCELLED", "STEP_STATUS_SKIPPED")
    with pytest.raises(RunNotCancellable):
        await engine.services.runs.cancel(TENANT, run.id, "too late")


async def test_condition_edges_choose_one_branch(engine: Engine) -> None:
    await engine.publish(
        {
            "family_slug": "branch",
            "steps": [
                project("check", amount="input.amount"),
                project("big", label='"big"'),
                project("small", label='"small"'),
            ],
            "edges": [
                edge("check", "big", "CONDITION", "output.amount > 100"),
                edge("check", "small", "CONDITION", "output.amount <= 100"),
            ],
        }
    )
    high = await engine.wait_run((await engine.trigger("branch", {"amount": 150})).id)
    low = await engine.wait_run((await engine.trigger("branch", {"amount": 5})).id)
    assert [step(high, r).status.value[12:] for r in ("big", "small")] == ["SUCCEEDED", "SKIPPED"]
    assert [step(low, r).status.value[12:] for r in ("big", "small")] == ["SKIPPED", "SUCCEEDED"]
    assert high.output == {"big": {"label": "big"}}
    assert low.output == {"small": {"label": "small"}}


async def test_scatter_gather_respects_max_concurrency_and_item_order(engine: Engine) -> None:
    active = 0
    peak = 0

    async def track(call: ActionCall) -> Any:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.03 * (5 - call.item_index))  # later items finish first
        active -= 1
        return call.payload["params"]["x"] * 10

    engine.actions.register_action("track", track)
    await engine.publish(
        {
            "family_slug": "fan",
            "steps": [
                {
                    "ref": "fan",
                    "type": "STEP_TYPE_SCATTER",
                    "args": {
                        "items": "input.items",
                        "max_concurrency": 2,
                        "step": {
                            "type": "STEP_TYPE_ACTION",
                            "args": {"action": "track", "params": {"x": "item"}},
                        },
                    },
                },
                {"ref": "collect", "type": "STEP_TYPE_GATHER", "args": {"scatter": "fan"}},
            ],
            "edges": [edge("fan", "collect")],
        }
    )
    run = await engine.trigger("fan", {"items": [1, 2, 3, 4, 5]})
    done = await engine.wait_run(run.id)
    assert done.status == SUCCEEDED
    assert peak == 2
    assert done.output == {"collect": {"items": [10, 20, 30, 40, 50], "succeeded": 5, "failed": 0}}
    items = step(done, "fan").items
    assert [i.index for i in items] == [0, 1, 2, 3, 4]
    assert all(i.status.value == "STEP_STATUS_SUCCEEDED" for i in items)


async def test_subworkflow_result_flows_to_the_parent(engine: Engine) -> None:
    await engine.publish(
        {"family_slug": "child", "steps": [project("double", doubled="input.n * 2")]}
    )
    await engine.publish(
        {
            "family_slug": "parent",
            "steps": [
                {
                    "ref": "sub",
                    "type": "STEP_TYPE_SUBWORKFLOW",
                    "args": {"family_slug": "child", "input": "{'n': input.n}"},
                },
                project("use", value="steps.sub.output.double.doubled"),
            ],
            "edges": [edge("sub", "use")],
        }
    )
    run = await engine.trigger("parent", {"n": 21})
    done = await engine.wait_run(run.id)
    assert done.status == SUCCEEDED
    assert done.output == {"use": {"value": 42}}
    child_id = step(done, "sub").child_run_id
    assert child_id
    child = await engine.services.runs.get(TENANT, child_id)
    assert child.parent_run_id == run.id
    assert child.parent_step_ref == "sub"
    assert child.status == SUCCEEDED
    assert child.input == {"n": 21}


async def test_subworkflow_of_an_unpublished_family_fails_the_step(engine: Engine) -> None:
    await engine.publish(
        {
            "family_slug": "orphan",
            "steps": [
                {"ref": "sub", "type": "STEP_TYPE_SUBWORKFLOW", "args": {"family_slug": "nope"}}
            ],
        }
    )
    done = await engine.wait_run((await engine.trigger("orphan", {})).id)
    assert done.status == FAILED
    assert step(done, "sub").error.code == "workflow.not_found"


SIGNALLED: dict[str, Any] = {
    "family_slug": "approval",
    "steps": [
        {
            "ref": "approval",
            "type": "STEP_TYPE_WAIT_FOR_SIGNAL",
            "args": {"signal": "approve", "timeout": "1h"},
        },
        project("after", by="steps.approval.output.by"),
    ],
    "edges": [edge("approval", "after")],
}


async def test_a_signal_resumes_a_waiting_run_once(engine: Engine) -> None:
    await engine.publish(SIGNALLED)
    run = await engine.trigger("approval", {})
    await engine.wait_step(run.id, "approval", "waiting")
    first = (
        await engine.services.runs.signal(TENANT, run.id, "approve", {"by": "ana"}, "sig-1")
    ).value
    again = (
        await engine.services.runs.signal(TENANT, run.id, "approve", {"by": "bob"}, "sig-1")
    ).value
    assert not first.duplicate
    assert again.duplicate
    done = await engine.wait_run(run.id)
    assert done.status == SUCCEEDED
    assert done.output == {"after": {"by": "ana"}}
    with pytest.raises(RunEnded):
        await engine.services.runs.signal(TENANT, run.id, "approve", {}, None)
    kinds = [h.kind for h in await engine.services.runs.history(TENANT, run.id)]
    assert kinds.count("signal.received") == 1


async def test_a_signal_sent_early_is_buffered(engine: Engine) -> None:
    await engine.publish(
        {
            "family_slug": "early",
            "steps": [
                {"ref": "nap", "type": "STEP_TYPE_WAIT", "args": {"duration": "10s"}},
                {"ref": "approval", "type": "STEP_TYPE_WAIT_FOR_SIGNAL", "args": {"signal": "go"}},
            ],
            "edges": [edge("nap", "approval")],
        }
    )
    run = await engine.trigger("early", {})
    await engine.wait_step(run.id, "nap", "waiting")
    await engine.services.runs.signal(TENANT, run.id, "go", {"k": 1}, None)
    await engine.advance(11)
    done = await engine.wait_run(run.id)
    assert done.output == {"approval": {"k": 1}}


async def test_a_wait_for_signal_times_out_with_null(engine: Engine) -> None:
    await engine.publish(SIGNALLED)
    run = await engine.trigger("approval", {})
    await engine.wait_step(run.id, "approval", "waiting")
    await engine.advance(3601)
    done = await engine.wait_step(run.id, "approval", "succeeded")
    assert step(done, "approval").output is None


async def test_events_start_matching_runs_once(engine: Engine) -> None:
    await engine.publish(
        {
            "family_slug": "on-order",
            "triggers": [{"event": "order.created", "filter": "event.data.amount > 10"}],
            "steps": [project("echo", amount="input.amount")],
        }
    )
    big = (
        await engine.services.events.send(TENANT, "order.created", {"amount": 50}, "evt-1")
    ).value
    small = (
        await engine.services.events.send(TENANT, "order.created", {"amount": 5}, "evt-2")
    ).value
    repeat = (
        await engine.services.events.send(TENANT, "order.created", {"amount": 50}, "evt-1")
    ).value
    other = (await engine.services.events.send(TENANT, "order.deleted", {"amount": 50}, None)).value
    assert len(big.runs_started) == 1
    assert not big.duplicate
    assert small.runs_started == []
    assert repeat.duplicate
    assert repeat.runs_started == []
    assert other.runs_started == []
    assert other.id.startswith("evt_")
    done = await engine.wait_run(big.runs_started[0])
    assert done.output == {"echo": {"amount": 50}}
    page = await engine.services.runs.page(TENANT, family_slug="on-order")
    assert [r.id for r in page.items] == big.runs_started
    # Another tenant's event of the same name starts nothing here.
    foreign = (
        await engine.services.events.send("t_other", "order.created", {"amount": 99}, "evt-1")
    ).value
    assert foreign.runs_started == []
    assert not foreign.duplicate


async def test_an_event_wakes_a_waiting_run_when_it_matches(engine: Engine) -> None:
    await engine.publish(
        {
            "family_slug": "shipping",
            "steps": [
                {
                    "ref": "shipped",
                    "type": "STEP_TYPE_WAIT_FOR_EVENT",
                    "args": {
                        "event": "order.shipped",
                        "match": "event.data.order_id == input.id",
                        "timeout": "7d",
                    },
                },
                project("done", carrier="steps.shipped.output.data.carrier"),
            ],
            "edges": [edge("shipped", "done")],
        }
    )
    run = await engine.trigger("shipping", {"id": "o-1"})
    await engine.wait_step(run.id, "shipped", "waiting")
    miss = (
        await engine.services.events.send(TENANT, "order.shipped", {"order_id": "o-2"}, "e1")
    ).value
    assert miss.runs_notified == [run.id]
    hit = (
        await engine.services.events.send(
            TENANT, "order.shipped", {"order_id": "o-1", "carrier": "dhl"}, "e2"
        )
    ).value
    assert hit.runs_notified == [run.id]
    done = await engine.wait_run(run.id)
    assert done.output == {"done": {"carrier": "dhl"}}
    # The wait is gone: a later event reaches nobody.
    late = (
        await engine.services.events.send(TENANT, "order.shipped", {"order_id": "o-1"}, "e3")
    ).value
    assert late.runs_notified == []


async def test_cancel_cancels_the_run_and_its_children(engine: Engine) -> None:
    await engine.publish(
        {
            "family_slug": "slow-child",
            "steps": [
                {"ref": "hold", "type": "STEP_TYPE_WAIT_FOR_SIGNAL", "args": {"signal": "never"}}
            ],
        }
    )
    await engine.publish(
        {
            "family_slug": "holder",
            "steps": [
                {
                    "ref": "sub",
                    "type": "STEP_TYPE_SUBWORKFLOW",
                    "args": {"family_slug": "slow-child"},
                },
                {
                    "ref": "many",
                    "type": "STEP_TYPE_SCATTER",
                    "args": {"items": "[1, 2]", "workflow": {"family_slug": "slow-child"}},
                },
            ],
        }
    )
    run = await engine.trigger("holder", {})
    view = await engine.wait_run(
        run.id,
        lambda v: (
            step(v, "sub").child_run_id is not None
            and all(i.child_run_id for i in (step(v, "many").items or [None]))
        ),  # type: ignore[union-attr]
    )
    children = [step(view, "sub").child_run_id] + [i.child_run_id for i in step(view, "many").items]
    for child in children:
        await engine.wait_step(child, "hold", "waiting")
    await engine.services.runs.cancel(TENANT, run.id, "changed my mind")
    done = await engine.wait_run(run.id)
    assert done.status == CANCELLED
    for child in children:
        ended = await engine.wait_run(child)
        assert ended.status == CANCELLED
    kinds = [h.kind for h in await engine.services.runs.history(TENANT, run.id)]
    assert "run.cancel_requested" in kinds
    assert kinds[-1] == "run.cancelled" or "run.cancelled" in kinds
    async with engine.store.transaction() as tx:
        for child in children:
            assert await tx.list_run_waits(TENANT, child) == []
