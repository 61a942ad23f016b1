"""Runs through the whole engine (services, coordinator, workers, timers) on both backends."""

from __future__ import annotations

from typing import Any

import pytest

from ductor_server.engine.runtime import Runtime
from ductor_server.errors import (
    RequestInvalid,
    RunNotFound,
    WorkflowNotFound,
    WorkflowVersionNotFound,
)

from .conftest import OTHER_TENANT, SUCCEEDED, TEST_CONFIG, Engine, step

HELLO: dict[str, Any] = {
    "family_slug": "hello-world",
    "title": "Hello World",
    "steps": [
        {
            "ref": "greet",
            "type": "STEP_TYPE_DATAFLOW",
            "title": "Build greeting",
            "args": {"operation": "project", "project": {"message": '"hello"'}},
        },
        {
            "ref": "pause",
            "type": "STEP_TYPE_WAIT",
            "title": "Short delay",
            "args": {"duration": "2s"},
        },
    ],
    "edges": [{"source_ref": "greet", "target_ref": "pause", "type": "EDGE_TYPE_SUCCESS"}],
}


async def test_hello_world_completes_after_its_durable_wait(engine: Engine) -> None:
    await engine.publish(HELLO)
    run = await engine.trigger("hello-world")
    view = await engine.wait_step(run.id, "pause", "waiting")
    assert step(view, "greet").output == {"message": "hello"}
    assert view.status.value == "RUN_STATUS_RUNNING"
    await engine.advance(1)
    await engine.advance(0)
    view = await engine.services.runs.get("t_acme", run.id)
    assert step(view, "pause").status.value == "STEP_STATUS_WAITING"
    await engine.advance(1)
    done = await engine.wait_run(run.id)
    assert done.status == SUCCEEDED
    assert done.output == {"pause": {"waited_until": "2030-01-01T00:00:02Z"}}
    kinds = [h.kind for h in await engine.services.runs.history("t_acme", run.id)]
    assert kinds[0] == "run.created"
    assert "step.succeeded" in kinds
    assert kinds[-1] == "run.succeeded"


async def test_a_wait_survives_a_runtime_restart(engine: Engine) -> None:
    await engine.publish(HELLO)
    run = await engine.trigger("hello-world")
    await engine.wait_step(run.id, "pause", "waiting")
    await engine.runtime.stop()
    # Nothing runs while stopped: the timer stays in the store.
    async with engine.store.transaction() as tx:
        timers = await tx.list_run_timers("t_acme", run.id)
    assert [t.timer_id for t in timers] == ["pause:-1:wait:1"]
    engine.clock.advance(5)
    engine.runtime = Runtime(
        engine.store, config=TEST_CONFIG, clock=engine.clock, actions=engine.actions
    )
    engine.runtime.launch()
    try:
        done = await engine.wait_run(run.id)
    finally:
        await engine.runtime.stop()
    assert done.status == SUCCEEDED


async def test_trigger_is_idempotent_by_key_and_tenant_scoped(engine: Engine) -> None:
    await engine.publish(HELLO)
    first = await engine.trigger("hello-world", {"n": 1}, key="k-1")
    again = await engine.trigger("hello-world", {"n": 2}, key="k-1")
    assert again.id == first.id
    assert again.input == {"n": 1}
    other = await engine.trigger("hello-world", {"n": 3}, key="k-2")
    assert other.id != first.id
    with pytest.raises(RunNotFound):
        await engine.services.runs.get(OTHER_TENANT, first.id)
    with pytest.raises(WorkflowNotFound):
        await engine.services.runs.trigger(OTHER_TENANT, "hello-world", None, {}, None)
    with pytest.raises(WorkflowVersionNotFound):
        await engine.services.runs.trigger("t_acme", "hello-world", 9, {}, None)
    page = await engine.services.runs.page("t_acme", limit=1)
    assert len(page.items) == 1
    assert page.next_cursor is not None
    rest = await engine.services.runs.page("t_acme", cursor=page.next_cursor, limit=10)
    assert {r.id for r in page.items + rest.items} == {first.id, other.id}
    assert (await engine.services.runs.page(OTHER_TENANT)).items == []
    running = await engine.services.runs.page("t_acme", status="running")
    assert {r.id for r in running.items} == {first.id, other.id}
    with pytest.raises(RequestInvalid):
        await engine.services.runs.page("t_acme", status="sleepy")
    with pytest.raises(RequestInvalid):
        await engine.services.runs.page("t_acme", cursor="not-a-cursor")
