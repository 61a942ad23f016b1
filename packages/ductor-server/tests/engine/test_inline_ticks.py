"""Cheap ticks run on the loop in one transaction; costly ones go to the engine lane."""

from __future__ import annotations

import asyncio
from typing import Any

from ductor_core.builtin_steps import BUILTIN_STEP_SPECS
from ductor_core.definitions import definition_from_obj
from ductor_core.runs import RunStatus
from ductor_server.engine.cheap import INLINE_BYTES, definition_cost, small
from ductor_server.engine.events import INLINE_CANDIDATES
from ductor_server.engine.inputs import input_check
from ductor_server.engine.offload import ENGINE

from .conftest import TENANT, Engine, step


def chain(slug: str, steps: int, params: dict[str, str] | None = None) -> dict[str, Any]:
    args: dict[str, Any] = {"action": "noop"}
    if params:
        args["params"] = params
    return {
        "family_slug": slug,
        "steps": [{"ref": f"s{i}", "type": "STEP_TYPE_ACTION", "args": args} for i in range(steps)],
        "edges": [{"source_ref": f"s{i}", "target_ref": f"s{i + 1}"} for i in range(steps - 1)],
    }


def test_cost_counts_only_what_the_tick_evaluates() -> None:
    # The action name is not CEL; params are.
    assert definition_cost(definition_from_obj(chain("a", 3)), BUILTIN_STEP_SPECS) == 0
    cheap = definition_cost(
        definition_from_obj(chain("b", 1, {"n": "input.n"})), BUILTIN_STEP_SPECS
    )
    costly = definition_cost(
        definition_from_obj(chain("c", 1, {"n": "input.items.map(x, x.map(y, y))"})),
        BUILTIN_STEP_SPECS,
    )
    assert 0 < cheap < 500 < 1_000_000 < costly  # a field read pays for its result


def test_a_notify_counts_its_cta_labels_and_urls_but_not_its_names() -> None:
    def notify(label: str) -> dict[str, Any]:
        args = {
            "recipients": "'ann'",
            "title": "'t'",
            "feed": "approvals",
            "ctas": [{"label": label, "action": "approve"}, {"label": "'Open'", "url": "'u'"}],
            "await_action": True,
            "timeout": "2d",
        }
        step = {"ref": "ask", "type": "STEP_TYPE_NOTIFY", "args": args}
        return {"family_slug": "n", "steps": [step], "edges": []}

    plain = definition_cost(definition_from_obj(notify("'Yes'")), BUILTIN_STEP_SPECS)
    costly = definition_cost(
        definition_from_obj(notify("string(input.items.map(x, x.map(y, y)))")),
        BUILTIN_STEP_SPECS,
    )
    # "2d" and the feed and action names are not CEL, so they make nothing costly.
    assert 0 < plain < 500 < 1_000_000 < costly


def test_size_walk_stops_at_the_bound() -> None:
    assert small([{"a": [1, 2, 3], "b": "x" * 100}])
    assert not small([{"a": "x" * INLINE_BYTES}])
    assert not small([list(range(10_000_000))])  # answered without walking it all


async def test_a_chain_without_cel_is_ticked_inline_whatever_its_input(engine: Engine) -> None:
    await engine.publish(chain("plain", 3))
    coordinator = engine.runtime.coordinator
    run = await engine.trigger("plain", {"blob": "x" * (4 * INLINE_BYTES)})
    view = await engine.wait_run(run.id)
    assert view.status == RunStatus.SUCCEEDED
    assert coordinator.inline_batches >= 3
    assert coordinator.offloaded_batches == 0


async def test_costly_cel_or_a_big_input_is_offloaded(engine: Engine) -> None:
    await engine.publish(chain("mapped", 2, {"n": "input.items.map(x, x * 2)"}))
    await engine.publish(chain("cheap", 2, {"n": "input.n"}))
    coordinator = engine.runtime.coordinator
    mapped = await engine.trigger("mapped", {"items": [1, 2, 3]})
    view = await engine.wait_run(mapped.id)
    assert view.status == RunStatus.SUCCEEDED
    assert step(view, "s1").output == {"n": [2, 4, 6]}
    assert coordinator.offloaded_batches >= 2
    inline, offloaded = coordinator.inline_batches, coordinator.offloaded_batches
    small_run = await engine.trigger("cheap", {"n": 1})
    assert (await engine.wait_run(small_run.id)).status == RunStatus.SUCCEEDED
    assert coordinator.inline_batches >= inline + 2
    assert coordinator.offloaded_batches == offloaded
    big_run = await engine.trigger("cheap", {"n": 1, "pad": "x" * INLINE_BYTES})
    assert (await engine.wait_run(big_run.id)).status == RunStatus.SUCCEEDED
    assert coordinator.offloaded_batches >= offloaded + 2


async def test_an_event_starting_many_runs_is_matched_off_the_loop(engine: Engine) -> None:
    """Cheap triggers are matched on the loop while they are few; a tenant's event
    that starts more runs than that would hold every tenant's requests."""

    def triggered(slug: str) -> dict[str, Any]:
        return {**chain(slug, 1), "triggers": [{"event": "boom"}]}

    for i in range(INLINE_CANDIDATES):
        await engine.publish(triggered(f"few{i}"))
    calls = ENGINE.calls
    few = (await engine.services.events.send(TENANT, "boom", {}, "evt-few")).value
    assert len(few.runs_started) == INLINE_CANDIDATES
    assert ENGINE.calls == calls  # matched on the loop
    await engine.publish(triggered("one-more"))
    many = (await engine.services.events.send(TENANT, "boom", {}, "evt-many")).value
    assert len(many.runs_started) == INLINE_CANDIDATES + 1
    assert ENGINE.calls == calls + 1  # in the engine lane, in one call
    for run_id in many.runs_started:
        assert (await engine.wait_run(run_id)).status == RunStatus.SUCCEEDED


async def test_an_input_checked_on_the_loop_gives_the_loop_a_turn() -> None:
    # A batch (or an event's triggers) checks its inputs one after another, each
    # on the loop when small: 200 such checks, at up to 20 ms each against a
    # schema that uses its steps, held the loop for seconds without a turn.
    definition = definition_from_obj(
        {**chain("checked", 1), "input_schema": {"type": "array", "items": {"type": "string"}}}
    )
    turns = 0
    stop = asyncio.Event()

    async def count() -> None:
        nonlocal turns
        while not stop.is_set():
            turns += 1
            await asyncio.sleep(0)

    counting = asyncio.create_task(count())
    await asyncio.sleep(0)
    before = turns
    for _ in range(50):
        assert (await input_check(definition, ["a"] * 100, tenant_id=TENANT)).valid
    during = turns - before
    stop.set()
    await counting
    assert during >= 50
