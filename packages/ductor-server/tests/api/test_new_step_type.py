"""A new worker-run step type is one spec in core plus one handler in the server.

The toy `STEP_TYPE_ECHO` below is defined only here: its args struct and spec,
and its handler. Nothing else in the code base knows it, yet a definition using
it validates, publishes and runs to completion through the REST API, and the
runtime refuses to start a worker that lacks the handler the spec names.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from ductor_core.builtin_steps import BUILTIN_STEP_SPECS
from ductor_core.step_args import DefinitionStruct
from ductor_core.step_specs import OnWorker, StepSpec, StepSpecs
from ductor_server import Settings, create_app
from ductor_server.cli_server import create_key
from ductor_server.composition import build
from ductor_server.engine.actions import ActionCall, ActionRegistry, default_registry
from ductor_server.engine.errors import MissingHandler
from ductor_server.storage import open_store


class EchoArgs(DefinitionStruct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    message: str  # CEL
    times: int = 1


ECHO = StepSpec(
    type="STEP_TYPE_ECHO", args=EchoArgs, start=OnWorker(handler="echo"), expressions=("message",)
)
SPECS = BUILTIN_STEP_SPECS.with_specs(ECHO)


async def echo(call: ActionCall) -> Any:
    # The payload is the args with the CEL fields evaluated.
    return {"said": [call.payload["message"]] * call.payload["times"], "step": call.step_ref}


DEFINITION = {
    "family_slug": "echoes",
    "title": "Echoes",
    "steps": [
        {
            "ref": "shout",
            "type": "STEP_TYPE_ECHO",
            "title": "Echo the name",
            "args": {"message": "'hello ' + input.name", "times": 2},
        },
        {
            "ref": "count",
            "type": "STEP_TYPE_DATAFLOW",
            "title": "Count the echoes",
            "args": {"operation": "project", "project": {"n": "size(steps.shout.output.said)"}},
        },
    ],
    "edges": [{"source_ref": "shout", "target_ref": "count", "type": "EDGE_TYPE_SUCCESS"}],
}


def _actions(*, with_echo: bool) -> ActionRegistry:
    actions = default_registry()
    if with_echo:
        actions.register("echo", echo)
    return actions


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[AsyncTestClient[Any], dict[str, str]]]:
    settings = Settings(data_dir=tmp_path, poll_interval=0.05)
    composition = build(settings, specs=SPECS, actions=_actions(with_echo=True))
    async with AsyncTestClient(app=create_app(composition=composition)) as client:
        store = open_store(settings.store_target)
        await store.open()
        try:
            key = await create_key(store, "t-echo", name="echo")
        finally:
            await store.close()
        yield client, {"Authorization": f"Bearer {key}"}


async def test_a_toy_step_type_validates_publishes_and_runs_through_the_api(
    api: tuple[AsyncTestClient[Any], dict[str, str]],
) -> None:
    client, auth = api
    steps = [{**DEFINITION["steps"][0], "args": {"times": 2}}, DEFINITION["steps"][1]]  # type: ignore[dict-item]
    bad = {**DEFINITION, "steps": steps}
    report = (await client.post("/v1/workflows/validate", json=bad, headers=auth)).json()
    assert report["valid"] is False
    assert [p["pointer"] for p in report["problems"]] == ["/steps/0/args/message"]

    published = await client.post("/v1/workflows", json=DEFINITION, headers=auth)
    assert published.status_code == 201, published.text
    triggered = await client.post(
        "/v1/runs", json={"family_slug": "echoes", "input": {"name": "ada"}}, headers=auth
    )
    assert triggered.status_code == 201, triggered.text
    run_id = triggered.json()["id"]
    for _ in range(200):
        run = (await client.get(f"/v1/runs/{run_id}", headers=auth)).json()
        if run["status"] not in ("RUN_STATUS_PENDING", "RUN_STATUS_RUNNING"):
            break
        await asyncio.sleep(0.05)
    assert run["status"] == "RUN_STATUS_SUCCEEDED", run
    assert run["output"] == {"count": {"n": 2}}
    [shout] = [s for s in run["steps"] if s["ref"] == "shout"]
    assert shout["output"] == {"said": ["hello ada", "hello ada"], "step": "shout"}


async def test_without_the_spec_the_type_is_unknown(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, poll_interval=0.05)
    async with AsyncTestClient(app=create_app(composition=build(settings))) as client:
        store = open_store(settings.store_target)
        await store.open()
        try:
            key = await create_key(store, "t-echo", name="echo")
        finally:
            await store.close()
        auth = {"Authorization": f"Bearer {key}"}
        report = (await client.post("/v1/workflows/validate", json=DEFINITION, headers=auth)).json()
    assert report["valid"] is False
    assert [(p["code"], p["pointer"]) for p in report["problems"]] == [
        ("definition.unknown_step_type", "/steps/0/type")
    ]


async def test_a_worker_without_the_handler_the_spec_names_does_not_start(tmp_path: Path) -> None:
    composition = build(Settings(data_dir=tmp_path), specs=SPECS, actions=_actions(with_echo=False))
    with pytest.raises(MissingHandler, match="STEP_TYPE_ECHO needs 'echo'"):
        async with composition.running():
            pass


def test_the_spec_set_is_a_value_the_built_ins_do_not_change() -> None:
    assert "STEP_TYPE_ECHO" in SPECS
    assert "STEP_TYPE_ECHO" not in BUILTIN_STEP_SPECS
    assert isinstance(SPECS, StepSpecs)
