"""Edge cases of the engine: self-starting workflows, scatter over child runs,
absolute waits, repeated cancels, and the order of a run's history."""

from __future__ import annotations

import contextlib
from typing import Any

from ductor_server.engine.effects import MAX_START_DEPTH
from ductor_server.errors import RunNotCancellable

from .conftest import CANCELLED, FAILED, SUCCEEDED, TENANT, Engine, step


async def test_a_workflow_that_starts_itself_stops_at_the_nesting_cap(engine: Engine) -> None:
    await engine.publish(
        {
            "family_slug": "ouroboros",
            "steps": [
                {
                    "ref": "again",
                    "type": "STEP_TYPE_SUBWORKFLOW",
                    "args": {"family_slug": "ouroboros"},
                }
            ],
        }
    )
    run = await engine.trigger("ouroboros", {})
    done = await engine.wait_run(run.id)
    assert done.status == FAILED
    page = await engine.services.runs.page(TENANT, family_slug="ouroboros", limit=100)
    assert len(page.items) == MAX_START_DEPTH + 1
    assert all(r.status == FAILED for r in page.items)
    deepest = [r for r in page.items if r.id not in {x.parent_run_id for x in page.items}]
    [leaf] = deepest
    leaf_view = await engine.services.runs.get(TENANT, leaf.id)
    assert step(leaf_view, "again").error.code == "run.nesting_too_deep"


async def _publish_scatter(engine: Engine, child: str, value: str, *, gather: bool) -> str:
    """Publish `child`, one DATAFLOW step `calc` giving `{"v": value}` over
    `input.n`, and `<child>s`, which scatters it over `input.ns` two at a time
    (then gathers it, with `gather`); the parent's slug."""
    await engine.publish(
        {
            "family_slug": child,
            "steps": [
                {
                    "ref": "calc",
                    "type": "STEP_TYPE_DATAFLOW",
                    "args": {"operation": "project", "project": {"v": value}},
                }
            ],
        }
    )
    scatter = {
        "ref": "each",
        "type": "STEP_TYPE_SCATTER",
        "args": {
            "items": "input.ns",
            "workflow": {"family_slug": child},
            "input": "{'n': item}",
            "max_concurrency": 2,
        },
    }
    parent: dict[str, Any] = {"family_slug": f"{child}s", "steps": [scatter]}
    if gather:
        parent["steps"].append(
            {"ref": "all", "type": "STEP_TYPE_GATHER", "args": {"scatter": "each"}}
        )
        parent["edges"] = [{"source_ref": "each", "target_ref": "all"}]
    await engine.publish(parent)
    return f"{child}s"


async def test_scatter_over_child_workflows_gathers_their_outputs(engine: Engine) -> None:
    parent = await _publish_scatter(engine, "square", "input.n * input.n", gather=True)
    run = await engine.trigger(parent, {"ns": [1, 2, 3, 4]})
    done = await engine.wait_run(run.id)
    assert done.status == SUCCEEDED
    items = done.output["all"]["items"]
    assert [i["calc"]["v"] for i in items] == [1, 4, 9, 16]
    children = await engine.services.runs.page(TENANT, family_slug="square", limit=10)
    assert len(children.items) == 4
    assert {c.parent_run_id for c in children.items} == {run.id}


async def test_a_scatter_whose_items_fail_names_them(engine: Engine) -> None:
    parent = await _publish_scatter(engine, "invert", "10 / (input.n - 2)", gather=False)
    run = await engine.trigger(parent, {"ns": [1, 2, 3, 2]})
    done = await engine.wait_run(run.id)
    assert done.status == FAILED
    error = step(done, "each").error
    assert error.code == "scatter.items_failed"
    assert error.details == {"failed": [1, 3]}
    assert not error.retryable
    assert done.error is not None
    assert done.error.code == "run.step_failed"


async def test_a_cancel_without_a_reason_says_so(engine: Engine) -> None:
    await engine.publish(
        {
            "family_slug": "idle",
            "steps": [{"ref": "h", "type": "STEP_TYPE_WAIT", "args": {"duration": "1h"}}],
        }
    )
    run = await engine.trigger("idle", {})
    await engine.wait_step(run.id, "h", "waiting")
    await engine.services.runs.cancel(TENANT, run.id)
    done = await engine.wait_run(run.id)
    assert done.status == CANCELLED
    assert done.error is not None
    assert (done.error.code, done.error.message) == ("run.cancelled", "cancel requested")


async def test_wait_until_an_absolute_time(engine: Engine) -> None:
    await engine.publish(
        {
            "family_slug": "until",
            "steps": [
                {"ref": "w", "type": "STEP_TYPE_WAIT", "args": {"until": "timestamp(input.at)"}}
            ],
        }
    )
    run = await engine.trigger("until", {"at": "2030-01-01T01:00:00Z"})
    await engine.wait_step(run.id, "w", "waiting")
    await engine.advance(3599)
    view = await engine.services.runs.get(TENANT, run.id)
    assert step(view, "w").status.value == "STEP_STATUS_WAITING"
    await engine.advance(1)
    done = await engine.wait_run(run.id)
    assert done.status == SUCCEEDED
    past = await engine.trigger("until", {"at": "2000-01-01T00:00:00Z"})
    assert (await engine.wait_run(past.id)).status == SUCCEEDED


async def test_cancelling_twice_cancels_once(engine: Engine) -> None:
    await engine.publish(
        {
            "family_slug": "hold",
            "steps": [{"ref": "h", "type": "STEP_TYPE_WAIT", "args": {"duration": "1h"}}],
        }
    )
    run = await engine.trigger("hold", {})
    await engine.wait_step(run.id, "h", "waiting")
    await engine.services.runs.cancel(TENANT, run.id, "one")
    with contextlib.suppress(RunNotCancellable):  # the first cancel may have ended it
        await engine.services.runs.cancel(TENANT, run.id, "two")
    done = await engine.wait_run(run.id)
    assert done.status == CANCELLED
    assert step(done, "h").status.value == "STEP_STATUS_CANCELLED"
    kinds = [h.kind for h in await engine.services.runs.history(TENANT, run.id)]
    assert kinds.count("run.cancelled") == 1
    async with engine.store.transaction() as tx:
        assert await tx.list_run_timers(TENANT, run.id) == []


async def test_history_tells_the_story_in_order(engine: Engine) -> None:
    await engine.publish(
        {
            "family_slug": "story",
            "steps": [
                {
                    "ref": "a",
                    "type": "STEP_TYPE_ACTION",
                    "args": {"action": "noop", "params": {"x": "1"}},
                },
                {"ref": "b", "type": "STEP_TYPE_WAIT", "args": {"duration": "1s"}},
            ],
            "edges": [{"source_ref": "a", "target_ref": "b"}],
        }
    )
    run = await engine.trigger("story", {})
    await engine.wait_step(run.id, "b", "waiting")
    await engine.advance(1)
    await engine.wait_run(run.id)
    history = await engine.services.runs.history(TENANT, run.id)
    story: list[tuple[str, Any]] = [(h.kind, (h.data or {}).get("step_ref")) for h in history]
    assert story == [
        ("run.created", None),
        ("run.running", None),
        ("step.running", "a"),
        ("step.succeeded", "a"),
        ("step.waiting", "b"),
        ("step.succeeded", "b"),
        ("run.succeeded", None),
    ]
    assert [h.seq for h in history] == sorted(h.seq for h in history)


async def test_a_failed_steps_history_entry_carries_the_errors_details(engine: Engine) -> None:
    await engine.publish(
        {
            "family_slug": "answers-404",
            "steps": [
                {
                    "ref": "a",
                    "type": "STEP_TYPE_ACTION",
                    "args": {"action": "http", "params": {"url": '"http://10.0.0.1/"'}},
                }
            ],
        }
    )
    run = await engine.trigger("answers-404", {})
    done = await engine.wait_run(run.id)
    assert done.status == FAILED
    failed = step(done, "a").error
    assert failed is not None
    assert failed.details, failed
    history = {h.kind: h.data for h in await engine.services.runs.history(TENANT, run.id)}
    # The step.failed entry has the error as the run shows it, details included.
    assert history["step.failed"]["error"] == {
        "code": failed.code,
        "message": failed.message,
        "retryable": failed.retryable,
        "details": failed.details,
    }
    assert history["run.failed"]["error"]["code"] == "run.step_failed"
    assert history["run.failed"]["error"]["details"] == {"step_ref": "a", "error": failed.code}
