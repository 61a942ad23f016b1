"""A version's `input_schema` is enforced wherever a DAG run starts, on both
backends: a trigger, a batch, a re-run, an event's trigger and a child run
(SUBWORKFLOW, SCATTER item). A refused start stores no run."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from ductor_server.cli_server import create_key
from ductor_server.storage import Store

ORDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["id", "total"],
    "properties": {"id": {"type": "string"}, "total": {"type": "number", "minimum": 0}},
}

ORDERS: dict[str, Any] = {
    "family_slug": "orders",
    "triggers": [{"event": "order.created"}],
    "input_schema": ORDER_SCHEMA,
    "steps": [
        {
            "ref": "flag",
            "type": "STEP_TYPE_DATAFLOW",
            "args": {"operation": "project", "project": {"order": "input.id"}},
        }
    ],
}

PARENT: dict[str, Any] = {
    "family_slug": "parent",
    "steps": [
        {
            "ref": "child",
            "type": "STEP_TYPE_SUBWORKFLOW",
            "args": {"family_slug": "orders", "input": "input.order"},
        }
    ],
}

FAN: dict[str, Any] = {
    "family_slug": "fan",
    "steps": [
        {
            "ref": "each",
            "type": "STEP_TYPE_SCATTER",
            "args": {
                "items": "input.orders",
                "workflow": {"family_slug": "orders"},
                "tolerate_failures": True,
            },
        }
    ],
}

GOOD = {"id": "o-1", "total": 250}


class Api:
    def __init__(self, client: AsyncTestClient[Any], key: str, store: Any) -> None:
        self.client = client
        self.store = store
        self.auth = {"Authorization": f"Bearer {key}"}

    async def post(self, path: str, body: Any, **headers: str) -> Any:
        return await self.client.post(path, json=body, headers={**self.auth, **headers})

    async def publish(self, definition: dict[str, Any]) -> Any:
        return await self.post("/v1/workflows", definition)

    async def runs(self) -> list[Any]:
        async with self.store.transaction() as tx:
            rows = await tx.session.fetch_all("SELECT family_slug FROM runs ORDER BY created_at")
        return [row[0] for row in rows]

    async def ended(self, run_id: str) -> dict[str, Any]:
        for _ in range(300):
            run: dict[str, Any] = (
                await self.client.get(f"/v1/runs/{run_id}", headers=self.auth)
            ).json()
            if run["status"] not in ("RUN_STATUS_PENDING", "RUN_STATUS_RUNNING"):
                return run
            await asyncio.sleep(0.05)
        raise AssertionError(f"run {run_id} did not end")


@pytest.fixture
async def api(served: tuple[AsyncTestClient[Any], Store]) -> Api:
    client, store = served
    made = Api(client, await create_key(store, "tenant-a", name="a"), store)
    published = await made.publish(ORDERS)
    assert published.status_code == 201, published.text
    return made


async def test_a_trigger_whose_input_fails_the_schema_is_refused(api: Api) -> None:
    answer = await api.post("/v1/runs", {"family_slug": "orders", "input": {"total": "many"}})
    assert answer.status_code == 422, answer.text
    error = answer.json()
    assert error["code"] == "run.input_invalid"
    problems = error["details"]["problems"]
    assert [p["pointer"] for p in problems] == ["/input/id", "/input/total"]
    assert "not of type 'number'" in problems[1]["message"]
    assert error["details"]["pointer"] == "/input/id"
    assert await api.runs() == []
    started = await api.post("/v1/runs", {"family_slug": "orders", "input": GOOD})
    assert started.status_code == 201, started.text
    assert (await api.ended(started.json()["id"]))["status"] == "RUN_STATUS_SUCCEEDED"


async def test_a_refusal_lists_at_most_twenty_problems(api: Api) -> None:
    wide = {
        "family_slug": "wide",
        "input_schema": {"type": "object", "additionalProperties": {"type": "integer"}},
        "steps": ORDERS["steps"],
    }
    assert (await api.publish(wide)).status_code == 201
    answer = await api.post(
        "/v1/runs", {"family_slug": "wide", "input": {f"k{i}": "x" * 1500 for i in range(500)}}
    )
    assert answer.status_code == 422
    problems = answer.json()["details"]["problems"]
    assert len(problems) == 20
    assert all(len(p["message"]) <= 200 for p in problems)


async def test_concurrent_refused_triggers_with_one_key_store_nothing(api: Api) -> None:
    body = {"family_slug": "orders", "input": {"id": 7}}
    answers = await asyncio.gather(
        *(api.post("/v1/runs", body, **{"Idempotency-Key": "k-1"}) for _ in range(6))
    )
    assert {a.status_code for a in answers} == {422}
    assert await api.runs() == []
    # An error is not remembered: the same key with a good input starts the run.
    fixed = await api.post(
        "/v1/runs", {"family_slug": "orders", "input": GOOD}, **{"Idempotency-Key": "k-1"}
    )
    assert fixed.status_code == 201


async def test_a_batch_with_a_bad_input_starts_nothing_and_points_at_the_run(api: Api) -> None:
    runs = [{"family_slug": "orders", "input": GOOD} for _ in range(4)]
    runs[2] = {"family_slug": "orders", "input": {"id": "o-3", "total": -1}}
    answer = await api.post("/v1/runs/batch", {"runs": runs})
    assert answer.status_code == 422, answer.text
    error = answer.json()
    assert error["code"] == "run.input_invalid"
    assert error["details"]["pointer"] == "/runs/2/input/total"
    assert [p["pointer"] for p in error["details"]["problems"]] == ["/runs/2/input/total"]
    assert await api.runs() == []


async def test_a_run_key_that_names_a_run_returns_it_whatever_the_input(api: Api) -> None:
    first = await api.post(
        "/v1/runs/batch", {"runs": [{"family_slug": "orders", "input": GOOD, "key": "o-1"}]}
    )
    assert first.status_code == 201
    again = await api.post(
        "/v1/runs/batch", {"runs": [{"family_slug": "orders", "input": {}, "key": "o-1"}]}
    )
    assert again.status_code == 201, again.text
    assert again.json()["runs"][0]["created"] is False
    assert again.json()["runs"][0]["id"] == first.json()["runs"][0]["id"]


async def test_a_rerun_checks_the_input_against_the_version_it_pins(api: Api) -> None:
    loose = {**ORDERS, "family_slug": "loose", "input_schema": None, "triggers": []}
    assert (await api.publish(loose)).status_code == 201
    old = await api.post("/v1/runs", {"family_slug": "loose", "input": {"id": "o-9"}})
    run_id = old.json()["id"]
    await api.ended(run_id)
    assert (await api.publish({**loose, "input_schema": ORDER_SCHEMA})).status_code == 201
    latest = await api.post(f"/v1/runs/{run_id}/rerun", {"latest": True})
    assert latest.status_code == 422, latest.text
    assert latest.json()["details"]["problems"][0]["pointer"] == "/input/total"
    pinned = await api.post(f"/v1/runs/{run_id}/rerun", {})
    assert pinned.status_code == 201, pinned.text
    assert pinned.json()["run"]["version"] == 1


async def test_an_event_whose_data_fails_the_schema_is_stored_and_starts_nothing(
    api: Api,
) -> None:
    answer = await api.post(
        "/v1/events", {"name": "order.created", "id": "e-1", "data": {"id": "o-1"}}
    )
    assert answer.status_code == 202, answer.text
    accepted = answer.json()
    assert accepted["runs_started"] == []
    assert accepted["runs_refused"] == [
        {
            "family_slug": "orders",
            "version": 1,
            "code": "run.input_invalid",
            "problems": [{"pointer": "/data/total", "message": "is required"}],
        }
    ]
    assert await api.runs() == []
    # The event was stored: sent again it is a duplicate.
    again = await api.post(
        "/v1/events", {"name": "order.created", "id": "e-1", "data": {"id": "o-1"}}
    )
    assert again.json()["duplicate"] is True
    good = await api.post("/v1/events", {"name": "order.created", "data": GOOD})
    assert len(good.json()["runs_started"]) == 1
    assert good.json()["runs_refused"] == []


async def test_a_child_whose_input_fails_its_schema_fails_the_step(api: Api) -> None:
    assert (await api.publish(PARENT)).status_code == 201
    started = await api.post("/v1/runs", {"family_slug": "parent", "input": {"order": {"id": 1}}})
    run = await api.ended(started.json()["id"])
    assert run["status"] == "RUN_STATUS_FAILED"
    [step] = run["steps"]
    assert step["status"] == "STEP_STATUS_FAILED"
    assert step["error"]["code"] == "run.input_invalid"
    assert step["error"]["retryable"] is False
    pointers = {p["pointer"] for p in step["error"]["details"]["problems"]}
    assert pointers == {"/input/id", "/input/total"}
    assert await api.runs() == ["parent"]  # no child was stored


async def test_a_scatter_item_whose_input_fails_the_schema_fails_alone(api: Api) -> None:
    assert (await api.publish(FAN)).status_code == 201
    orders = [GOOD, {"id": "o-2"}, {"id": "o-3", "total": 3}]
    started = await api.post("/v1/runs", {"family_slug": "fan", "input": {"orders": orders}})
    run = await api.ended(started.json()["id"])
    assert run["status"] == "RUN_STATUS_SUCCEEDED", run
    [step] = run["steps"]
    assert step["output"] == [{"flag": {"order": "o-1"}}, None, {"flag": {"order": "o-3"}}]
    failed = step["items"][1]
    assert failed["status"] == "STEP_STATUS_FAILED"
    assert failed["error"]["code"] == "run.input_invalid"
    assert sorted(await api.runs()) == ["fan", "orders", "orders"]


@pytest.mark.parametrize(
    ("schema", "pointer"),
    [
        (
            {"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}},
            "/input_schema/properties/a/$ref",
        ),
        (
            {"properties": {"a": {"type": "string", "pattern": "(?=a)b"}}},
            "/input_schema/properties/a/pattern",
        ),
        ({"patternProperties": {"^a": {}}}, "/input_schema/patternProperties"),
        ({"properties": {"a": {"minLength": -1}}}, "/input_schema/properties/a/minLength"),
        ({"$id": "https://example.com/", "type": "object"}, "/input_schema/$id"),
        ({"$schema": "http://json-schema.org/draft-04/schema#"}, "/input_schema/$schema"),
        ({"enum": ["x" * 1000] * 70}, "/input_schema"),
    ],
)
async def test_publishing_a_schema_that_is_not_a_bounded_json_schema_is_refused(
    api: Api, schema: dict[str, Any], pointer: str
) -> None:
    answer = await api.publish({**ORDERS, "family_slug": "bad", "input_schema": schema})
    assert answer.status_code == 422, answer.text
    problems = answer.json()["details"]
    assert {p["code"] for p in problems} == {"definition.bad_input_schema"}
    assert pointer in [p["pointer"] for p in problems]


async def test_hostile_schemas_cost_little(api: Api) -> None:
    # Nested alternatives over nested arrays: exponential in the input's depth
    # for a validator without a bound; refused after a bounded number of steps.
    branch = {"type": "array", "items": {"$ref": "#/$defs/n"}}
    bomb = {
        "family_slug": "bomb",
        "input_schema": {
            "$defs": {"n": {"anyOf": [branch, branch, {"type": "string"}]}},
            "$ref": "#/$defs/n",
        },
        "steps": ORDERS["steps"],
    }
    assert (await api.publish(bomb)).status_code == 201
    nested: Any = True
    for _ in range(60):
        nested = [nested]
    began = time.perf_counter()
    answer = await api.post("/v1/runs", {"family_slug": "bomb", "input": nested})
    assert answer.status_code == 422
    assert "steps" in answer.json()["details"]["problems"][-1]["message"]
    # A pattern that backtracks for ever in Python's re is linear in RE2.
    redos = {
        "family_slug": "redos",
        "input_schema": {"type": "string", "pattern": "^(a+)+$"},
        "steps": ORDERS["steps"],
    }
    assert (await api.publish(redos)).status_code == 201
    answer = await api.post("/v1/runs", {"family_slug": "redos", "input": "a" * 100_000 + "!"})
    assert answer.status_code == 422
    assert time.perf_counter() - began < 10  # seconds; unbounded, either would not end
    assert await api.runs() == []
