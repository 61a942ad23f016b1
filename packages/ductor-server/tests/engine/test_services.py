"""The service layer's workflow lifecycle and argument checks, on both backends."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from ductor_server.engine.actions import ActionCall
from ductor_server.errors import (
    DefinitionInvalid,
    EventInvalid,
    RequestInvalid,
    RunNotFound,
    WorkflowNotFound,
    WorkflowVersionNotFound,
)

from .conftest import FAILED, OTHER_TENANT, TENANT, Engine, step
from .test_runs import HELLO


async def test_publish_is_content_addressed_and_versions_increase(engine: Engine) -> None:
    s = engine.services
    first = (await s.workflows.publish(TENANT, HELLO)).value
    same = (await s.workflows.publish(TENANT, HELLO)).value
    changed = (await s.workflows.publish(TENANT, {**HELLO, "title": "Hello again"})).value
    assert (first.version, first.created) == (1, True)
    assert (same.version, same.created, same.hash) == (1, False, first.hash)
    assert (changed.version, changed.created) == (2, True)
    assert changed.hash != first.hash
    # Another tenant's first publish of the same content is its own version 1.
    foreign = (await s.workflows.publish(OTHER_TENANT, HELLO)).value
    assert (foreign.version, foreign.created) == (1, True)

    family = await s.workflows.family(TENANT, "hello-world")
    assert family.latest.version == 2
    assert family.latest.definition.title == "Hello again"
    assert [v.version for v in family.versions] == [1, 2]
    v1 = await s.workflows.version(TENANT, "hello-world", 1)
    assert v1.definition.title == "Hello World"
    assert v1.hash == first.hash
    [summary] = await s.workflows.families(TENANT)
    assert (summary.family_slug, summary.latest_version, summary.title) == (
        "hello-world",
        2,
        "Hello again",
    )
    with pytest.raises(WorkflowNotFound):
        await s.workflows.family(TENANT, "nope")
    with pytest.raises(WorkflowNotFound):
        await s.workflows.version(TENANT, "nope", 1)
    with pytest.raises(WorkflowVersionNotFound):
        await s.workflows.version(TENANT, "hello-world", 3)
    # A run pins the version it was triggered with.
    run = (await s.runs.trigger(TENANT, "hello-world", 1, {}, None)).value
    assert run.version == 1
    latest = (await s.runs.trigger(TENANT, "hello-world", None, {}, None)).value
    assert latest.version == 2
    # The views encode to JSON (what the API sends).
    assert msgspec.json.decode(msgspec.json.encode(family))["latest"]["version"] == 2


async def test_invalid_definitions_report_every_problem(engine: Engine) -> None:
    bad: dict[str, Any] = {
        "family_slug": "broken",
        "steps": [
            {"ref": "a", "type": "STEP_TYPE_NOPE"},
            {"ref": "a", "type": "STEP_TYPE_WAIT", "args": {"duration": "2s"}},
        ],
        "edges": [{"source_ref": "a", "target_ref": "ghost"}],
    }
    report = await engine.services.workflows.validate(TENANT, bad)
    assert not report.valid
    assert len(report.problems) >= 3
    with pytest.raises(DefinitionInvalid) as caught:
        await engine.services.workflows.publish(TENANT, bad)
    assert caught.value.code == "definition.invalid"
    assert {p["pointer"] for p in caught.value.details} >= {"/steps/0/type", "/edges/0/target_ref"}
    with pytest.raises(DefinitionInvalid):
        await engine.services.workflows.publish(TENANT, ["not", "an", "object"])
    assert await engine.services.workflows.families(TENANT) == []
    good = await engine.services.workflows.validate(TENANT, HELLO)
    assert good.valid


async def test_bad_arguments_are_request_errors(engine: Engine) -> None:
    s = engine.services
    await s.workflows.publish(TENANT, HELLO)
    with pytest.raises(RequestInvalid):
        await s.runs.trigger(TENANT, "hello-world", 0, {}, None)
    with pytest.raises(RequestInvalid):
        await s.runs.page(TENANT, limit=0)
    with pytest.raises(RequestInvalid):
        await s.runs.page(TENANT, limit=10_000)
    with pytest.raises(EventInvalid):
        await s.events.send(TENANT, "", {}, None)
    with pytest.raises(EventInvalid):
        await s.events.send(TENANT, "x" * 300, {}, None)
    with pytest.raises(RunNotFound):
        await s.runs.signal(TENANT, "run_missing", "go", {}, None)
    with pytest.raises(RunNotFound):
        await s.runs.cancel(TENANT, "run_missing", "")
    with pytest.raises(RunNotFound):
        await s.runs.history(TENANT, "run_missing")
    run = (await s.runs.trigger(TENANT, "hello-world", None, {}, None)).value
    with pytest.raises(RequestInvalid):
        await s.runs.signal(TENANT, run.id, "", {}, None)
    with pytest.raises(RunNotFound):
        await s.runs.signal(OTHER_TENANT, run.id, "go", {}, None)
    with pytest.raises(RunNotFound):
        await s.runs.cancel(OTHER_TENANT, run.id, "")
    with pytest.raises(RunNotFound):
        await s.runs.history(OTHER_TENANT, run.id)


async def test_a_handler_output_that_is_not_json_fails_the_step_cleanly(engine: Engine) -> None:
    async def odd(call: ActionCall) -> Any:
        if call.step_ref == "fine":
            return {"when": datetime(2030, 1, 2, tzinfo=UTC), "pair": (1, 2)}
        return {"thing": object()}

    engine.actions.register_action("odd", odd)
    await engine.publish(
        {
            "family_slug": "odd",
            "steps": [
                {"ref": "fine", "type": "STEP_TYPE_ACTION", "args": {"action": "odd"}},
                {"ref": "weird", "type": "STEP_TYPE_ACTION", "args": {"action": "odd"}},
            ],
            "edges": [{"source_ref": "fine", "target_ref": "weird"}],
        }
    )
    done = await engine.wait_run((await engine.trigger("odd", {})).id)
    assert step(done, "fine").output == {"when": "2030-01-02T00:00:00Z", "pair": [1, 2]}
    assert done.status == FAILED
    assert step(done, "weird").error.code == "handler.bad_output"
    assert step(done, "weird").attempt == 1


async def test_notify_and_unavailable_handlers_in_a_run(engine: Engine) -> None:
    await engine.publish(
        {
            "family_slug": "notify",
            "steps": [
                {
                    "ref": "tell",
                    "type": "STEP_TYPE_NOTIFY",
                    "args": {"recipients": "input.who", "title": "'Done'"},
                },
                {
                    "ref": "bridge",
                    "type": "STEP_TYPE_BRIDGE",
                    "args": {"app_id": "billing", "workflow": "charge"},
                },
            ],
            "edges": [{"source_ref": "tell", "target_ref": "bridge"}],
        }
    )
    done = await engine.wait_run((await engine.trigger("notify", {"who": "ops"})).id)
    tell = step(done, "tell").output
    assert tell == {"group_id": f"{done.id}:tell", "recipients": ["ops"]}
    assert step(done, "bridge").error.code == "handler.unavailable"
    assert done.status == FAILED


async def test_an_action_is_checked_against_the_handlers_the_runtime_serves(
    engine: Engine,
) -> None:
    def calling(name: str) -> dict[str, Any]:
        return {
            "family_slug": "calls",
            "steps": [
                {"ref": "call", "type": "STEP_TYPE_ACTION", "args": {"action": name}},
                {
                    "ref": "each",
                    "type": "STEP_TYPE_SCATTER",
                    "args": {
                        "items": "[1, 2]",
                        "step": {"type": "STEP_TYPE_ACTION", "args": {"action": name}},
                    },
                },
            ],
        }

    s = engine.services
    report = await s.workflows.validate(TENANT, calling("sumarize"))
    assert [(p.code, p.pointer) for p in report.problems] == [
        ("definition.unknown_action", "/steps/0/args/action"),
        ("definition.unknown_action", "/steps/1/args/step/args/action"),
    ]
    assert report.problems[0].message == (
        "step 'call': 'args.action' names no action this server has: 'sumarize' (known: http, noop)"
    )
    with pytest.raises(DefinitionInvalid) as refused:
        await s.workflows.publish(TENANT, calling("sumarize"))
    assert [p["code"] for p in refused.value.details] == ["definition.unknown_action"] * 2

    async def summarize(call: ActionCall) -> Any:
        return {"summary": "short"}

    # One registered after the services were built is known from then on.
    engine.actions.register_action("summarize", summarize)
    report = await s.workflows.validate(TENANT, calling("sumarize"))
    assert report.problems[0].message.endswith("'sumarize' (did you mean 'summarize'?)")
    assert (await s.workflows.publish(TENANT, calling("summarize"))).value.version == 1
