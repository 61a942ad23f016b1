"""The REST API in process, on a real SQLite store: auth, bad input, idempotency,
tenancy, the error shape and the OpenAPI document."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from litestar.testing import AsyncTestClient

from ductor_server import Settings, create_app
from ductor_server.cli_server import create_key
from ductor_server.storage import open_store
from ductor_server.transports.rest.errors import STATUS_BY_CODE

HELLO: dict[str, Any] = {
    "family_slug": "hello-world",
    "title": "Hello World",
    "steps": [
        {
            "ref": "greet",
            "type": "STEP_TYPE_DATAFLOW",
            "args": {"operation": "project", "project": {"message": '"hello"'}},
        },
        {"ref": "pause", "type": "STEP_TYPE_WAIT", "args": {"duration": "2s"}},
    ],
    "edges": [{"source_ref": "greet", "target_ref": "pause", "type": "EDGE_TYPE_SUCCESS"}],
}

MAX_BODY = 4096


class Api:
    """A test client plus two tenants' keys."""

    def __init__(self, client: AsyncTestClient[Any], key_a: str, key_b: str, store: Any) -> None:
        self.client = client
        self.store = store
        self.a = {"Authorization": f"Bearer {key_a}"}
        self.b = {"Authorization": f"Bearer {key_b}"}

    async def call(
        self,
        method: str,
        path: str,
        *,
        headers: dict[str, str] | None = None,
        as_b: bool = False,
        **kwargs: Any,
    ) -> Any:
        sent = dict(self.b if as_b else self.a)
        sent.update(headers or {})
        return await self.client.request(method, path, headers=sent, **kwargs)


@pytest.fixture(params=["sqlite", "postgres"])
async def api(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Api]:
    database_url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    settings = Settings(
        data_dir=tmp_path,
        database_url=database_url,
        max_body_bytes=MAX_BODY,
        poll_interval=0.05,
    )
    async with AsyncTestClient(app=create_app(settings)) as client:
        # The app runs its own event loop; the test talks to the same SQLite
        # file through a store of its own.
        store = open_store(settings.store_target)
        await store.open()
        try:
            key_a = await create_key(store, "tenant-a", name="a")
            key_b = await create_key(store, "tenant-b", name="b")
            yield Api(client, key_a, key_b, store)
        finally:
            await store.close()


def assert_error(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert set(body) == {"code", "message", "details"}, body
    assert body["code"] == code, body
    assert body["message"]
    assert STATUS_BY_CODE.get(code, status) == status
    return body


# --- auth --------------------------------------------------------------------


BAD_AUTH_HEADERS = [
    None,
    "",
    "Bearer",
    "Bearer ",
    "Basic abc",
    "Bearer dk_not_a_real_key",
    "dk_no_scheme",
]


async def test_every_v1_route_needs_a_valid_key(api: Api) -> None:
    for header in BAD_AUTH_HEADERS:
        headers = {} if header is None else {"Authorization": header}
        for method, path in [
            ("GET", "/v1/runs"),
            ("GET", "/v1/workflows"),
            ("POST", "/v1/events"),
            ("GET", "/v1/runs/some-run"),
        ]:
            response = await api.client.request(method, path, headers=headers)
            assert_error(response, 401, "auth.unauthenticated")


async def test_health_needs_no_key(api: Api) -> None:
    assert (await api.client.get("/healthz")).status_code == 200
    ready = await api.client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"store": "ok", "queue": "ok"}


async def test_a_revoked_key_is_refused(api: Api) -> None:
    store = api.store
    key = await create_key(store, "tenant-c", name="c")
    headers = {"Authorization": f"Bearer {key}"}
    assert (await api.client.get("/v1/runs", headers=headers)).status_code == 200
    async with store.transaction() as tx:
        (record,) = await tx.list_api_keys("tenant-c")
        assert await tx.revoke_api_key("tenant-c", record.id, now=datetime.now(UTC))
    assert_error(await api.client.get("/v1/runs", headers=headers), 401, "auth.unauthenticated")


# --- bad input -----------------------------------------------------------------


async def test_malformed_json_names_line_and_column(api: Api) -> None:
    body = b'{\n  "family_slug": "hello-world",\n  "input": {oops}\n}'
    response = await api.call("POST", "/v1/runs", content=body)
    error = assert_error(response, 400, "request.malformed_json")
    assert error["details"]["line"] == 3
    assert error["details"]["column"] == 13
    assert "line 3, column 13" in error["message"]


async def test_truncated_json_is_malformed(api: Api) -> None:
    response = await api.call("POST", "/v1/events", content=b'{"name": "a"')
    error = assert_error(response, 400, "request.malformed_json")
    assert error["details"]["line"] == 1


WRONG_TYPES: list[tuple[str, Any, str]] = [
    ("/v1/runs", {"family_slug": 5}, "$.family_slug"),
    ("/v1/runs", {"family_slug": "x", "version": "one"}, "$.version"),
    ("/v1/runs", {"input": {}}, "$.family_slug"),
    ("/v1/runs", {"family_slug": "x", "bogus": 1}, "$.bogus"),
    ("/v1/events", {"name": ["a"]}, "$.name"),
    ("/v1/events", [], "$"),
    ("/v1/runs/r1/signals/go", {"id": 7}, "$.id"),
    ("/v1/runs/r1/cancel", {"reason": False}, "$.reason"),
]


async def test_wrong_types_name_the_field(api: Api) -> None:
    for path, body, where in WRONG_TYPES:
        response = await api.call("POST", path, content=json.dumps(body).encode())
        error = assert_error(response, 422, "request.invalid")
        assert error["details"]["path"] == where, (path, body)
        assert where in error["message"]
    assert (await api.call("GET", "/v1/runs")).json()["items"] == []


async def test_an_empty_body_where_one_is_needed(api: Api) -> None:
    error = assert_error(await api.call("POST", "/v1/runs", content=b""), 422, "request.invalid")
    assert error["details"]["reason"] == "empty body"


async def test_a_body_over_the_limit_is_413(api: Api) -> None:
    big = json.dumps({"family_slug": "hello-world", "input": "x" * MAX_BODY}).encode()
    error = assert_error(await api.call("POST", "/v1/runs", content=big), 413, "request.too_large")
    assert error["details"] == {"max_body_bytes": MAX_BODY}
    page = (await api.call("GET", "/v1/runs")).json()
    assert page["items"] == []


async def test_unknown_routes_and_methods_use_the_error_shape(api: Api) -> None:
    assert_error(await api.call("GET", "/v1/nothing-here"), 404, "route.not_found")
    assert_error(await api.call("DELETE", "/v1/runs"), 405, "route.method_not_allowed")


async def test_invalid_definition_lists_every_problem_and_publishes_nothing(api: Api) -> None:
    bad = {
        **HELLO,
        "steps": [*HELLO["steps"], {"ref": "greet", "type": "STEP_TYPE_NOPE"}],
        "edges": [{"source_ref": "greet", "target_ref": "ghost"}],
    }
    report = (await api.call("POST", "/v1/workflows/validate", json=bad)).json()
    assert report["valid"] is False
    assert len(report["problems"]) >= 3
    assert all(p["pointer"].startswith("/") for p in report["problems"])

    error = assert_error(
        await api.call("POST", "/v1/workflows", json=bad), 422, "definition.invalid"
    )
    pointers = {p["pointer"] for p in error["details"]}
    assert "/steps/2/type" in pointers or any(p.startswith("/steps/2") for p in pointers)
    assert any(p.startswith("/edges/0") for p in pointers)
    assert (await api.call("GET", "/v1/workflows")).json() == []


async def test_an_action_the_server_does_not_have_is_refused_with_the_nearest(api: Api) -> None:
    typo = {
        "family_slug": "typo",
        "steps": [
            {
                "ref": "call",
                "type": "STEP_TYPE_ACTION",
                "args": {"action": "htp", "params": {"url": "'https://example.com/'"}},
            }
        ],
    }
    problem = {
        "code": "definition.unknown_action",
        "message": "step 'call': 'args.action' names no action this server has: 'htp'"
        " (did you mean 'http'?)",
        "pointer": "/steps/0/args/action",
    }
    report = (await api.call("POST", "/v1/workflows/validate", json=typo)).json()
    assert report == {"valid": False, "problems": [problem]}
    error = assert_error(
        await api.call("POST", "/v1/workflows", json=typo), 422, "definition.invalid"
    )
    assert error["details"] == [problem]
    assert (await api.call("GET", "/v1/workflows")).json() == []
    typo["steps"][0]["args"]["action"] = "http"
    assert (await api.call("POST", "/v1/workflows", json=typo)).status_code == 201


async def test_an_expression_reading_what_its_place_does_not_give_is_refused(api: Api) -> None:
    # Each would publish and then fail (or match nothing, or share one key) every run.
    misread = {
        **HELLO,
        "family_slug": "misread",
        "edges": [],
        "triggers": [{"event": "order.created", "filter": "input.total > 100"}],
        "concurrency": {"limit": 1, "key": "steps.greet.output"},
    }
    misread["steps"] = [
        {
            "ref": "greet",
            "type": "STEP_TYPE_DATAFLOW",
            "args": {"operation": "project", "project": {"who": "event.data.name"}},
        }
    ]
    problems = [
        {
            "code": "definition.bad_expression",
            "message": "step 'greet': 'args.project.who' reads 'event', but it sees only"
            " 'input', 'steps' and 'run': 'event.data.name'",
            "pointer": "/steps/0/args/project/who",
        },
        {
            "code": "definition.bad_expression",
            "message": "triggers[0]: 'filter' reads 'input', but it sees only 'event':"
            " 'input.total > 100'",
            "pointer": "/triggers/0/filter",
        },
        {
            "code": "definition.bad_expression",
            "message": "concurrency: 'concurrency.key' reads 'steps', but it sees only 'input':"
            " 'steps.greet.output'",
            "pointer": "/concurrency/key",
        },
    ]
    report = (await api.call("POST", "/v1/workflows/validate", json=misread)).json()
    assert report == {"valid": False, "problems": problems}
    error = assert_error(
        await api.call("POST", "/v1/workflows", json=misread), 422, "definition.invalid"
    )
    assert error["details"] == problems
    assert (await api.call("GET", "/v1/workflows")).json() == []


async def test_a_valid_definition_validates(api: Api) -> None:
    report = (await api.call("POST", "/v1/workflows/validate", json=HELLO)).json()
    assert report == {"valid": True, "problems": []}


async def test_unknown_things_are_404(api: Api) -> None:
    assert_error(await api.call("GET", "/v1/runs/nope"), 404, "run.not_found")
    assert_error(await api.call("GET", "/v1/runs/nope/history"), 404, "run.not_found")
    assert_error(await api.call("POST", "/v1/runs/nope/cancel"), 404, "run.not_found")
    assert_error(await api.call("GET", "/v1/workflows/nope"), 404, "workflow.not_found")
    trigger = await api.call("POST", "/v1/runs", json={"family_slug": "nope"})
    assert_error(trigger, 404, "workflow.not_found")
    await api.call("POST", "/v1/workflows", json=HELLO)
    assert_error(
        await api.call("GET", "/v1/workflows/hello-world/versions/9"),
        404,
        "workflow.version_not_found",
    )
    pinned = await api.call("POST", "/v1/runs", json={"family_slug": "hello-world", "version": 9})
    assert_error(pinned, 404, "workflow.version_not_found")
    # None of the failed triggers left a run behind.
    assert (await api.call("GET", "/v1/runs")).json()["items"] == []


async def test_a_nul_in_a_path_or_query_parameter_is_refused_naming_it(api: Api) -> None:
    # Refused alike on both backends (PostgreSQL text cannot hold a NUL at all).
    for method, path, name in [
        ("GET", "/v1/runs/run%00x", "run_id"),
        ("GET", "/v1/runs/run%00x/history", "run_id"),
        ("POST", "/v1/runs/run%00x/cancel", "run_id"),
        ("GET", "/v1/keys/key%00x", "key_id"),
        ("GET", "/v1/workflows/a%00b", "slug"),
        ("GET", "/v1/runs?family_slug=a%00b", "family_slug"),
        ("GET", "/v1/runs?status=%00", "status"),
    ]:
        body = assert_error(await api.call(method, path), 422, "request.invalid")
        assert body["details"]["path"] == name, (path, body)
    assert (await api.call("GET", "/v1/runs?family_slug=nope")).json()["items"] == []


async def test_an_error_repeats_at_most_a_bounded_part_of_the_request(api: Api) -> None:
    slug = "s" * 3_500  # within this server's 4 KiB body limit
    missing = await api.call("POST", "/v1/runs", json={"family_slug": slug})
    error = assert_error(missing, 404, "workflow.not_found")
    assert len(missing.content) < 3_500
    assert error["details"]["family_slug"] == "s" * 976 + "… (2524 more characters)"
    assert error["message"] == "workflow '" + "s" * 1_966 + "… (1545 more characters)"
    run_id = "r" * 7_000
    assert len((await api.call("GET", f"/v1/runs/{run_id}")).content) < 5_000
    nowhere = await api.call("GET", "/v2/" + "p" * 20_000)
    assert assert_error(nowhere, 404, "route.not_found")["details"] == {
        "method": "GET",
        "path": "/v2/" + "p" * 971 + "… (19029 more characters)",
    }
    short = assert_error(await api.call("GET", "/v1/runs/nope"), 404, "run.not_found")
    assert short["details"] == {"run_id": "nope"}
    zero = await api.call("POST", "/v1/runs", json={"family_slug": "x", "version": 0})
    assert assert_error(zero, 422, "request.invalid")["details"] == {
        "path": "$.version",
        "reason": "must be a positive integer",
    }


# --- workflows and runs ----------------------------------------------------------


async def test_publish_is_content_addressed(api: Api) -> None:
    first = await api.call("POST", "/v1/workflows", json=HELLO)
    assert first.status_code == 201
    assert first.json()["version"] == 1
    assert first.json()["created"] is True
    same = await api.call("POST", "/v1/workflows", json=HELLO)
    assert same.status_code == 200
    assert same.json() == {**first.json(), "created": False}
    changed = await api.call("POST", "/v1/workflows", json={**HELLO, "title": "Hello again"})
    assert changed.status_code == 201
    assert changed.json()["version"] == 2
    assert changed.json()["hash"] != first.json()["hash"]

    family = (await api.call("GET", "/v1/workflows/hello-world")).json()
    assert family["latest"]["version"] == 2
    assert [v["version"] for v in family["versions"]] == [1, 2]
    v1 = (await api.call("GET", "/v1/workflows/hello-world/versions/1")).json()
    assert v1["definition"]["title"] == "Hello World"
    listed = (await api.call("GET", "/v1/workflows")).json()
    assert [(w["family_slug"], w["latest_version"]) for w in listed] == [("hello-world", 2)]


async def test_trigger_and_read_a_run(api: Api) -> None:
    await api.call("POST", "/v1/workflows", json=HELLO)
    created = await api.call(
        "POST", "/v1/runs", json={"family_slug": "hello-world", "input": {"n": 1}}
    )
    assert created.status_code == 201
    run = created.json()
    assert run["family_slug"] == "hello-world"
    assert run["version"] == 1
    assert run["input"] == {"n": 1}
    fetched = (await api.call("GET", f"/v1/runs/{run['id']}")).json()
    assert fetched["id"] == run["id"]
    assert [s["ref"] for s in fetched["steps"]] == ["greet", "pause"]
    page = (await api.call("GET", "/v1/runs", params={"family_slug": "hello-world"})).json()
    assert [r["id"] for r in page["items"]] == [run["id"]]
    bad_limit = await api.call("GET", "/v1/runs", params={"limit": 0})
    error = assert_error(bad_limit, 422, "request.invalid")
    assert "limit" in json.dumps(error["details"])
    bad_status = await api.call("GET", "/v1/runs", params={"status": "RUN_STATUS_BOGUS"})
    assert_error(bad_status, 422, "request.invalid")
    for bad in ("one", "1.5", "1e0", "+1", "%201", "0", "9223372036854775808"):
        for path in (f"/v1/workflows/hello-world/versions/{bad}", f"/v1/rules/versions/{bad}"):
            error = assert_error(await api.call("GET", path), 422, "request.invalid")
            assert error["details"]["path"] == "version", error
    assert (await api.call("GET", "/v1/workflows/hello-world/versions/01")).status_code == 200


async def test_a_read_with_wait_answers_the_run_as_it_stands_when_the_time_is_up(
    api: Api,
) -> None:
    # (A wait the run's end cuts short: tests/test_run_wait_e2e.py, on real servers.)
    await api.call("POST", "/v1/workflows", json=HELLO)  # its second step waits 2 s
    run = (await api.call("POST", "/v1/runs", json={"family_slug": "hello-world"})).json()
    path = f"/v1/runs/{run['id']}"
    held = await api.call("GET", path, params={"wait": 0.3})
    assert held.status_code == 200
    assert held.json()["status"] == "RUN_STATUS_RUNNING"


async def test_a_read_with_wait_refuses_bad_waits_and_others_runs_at_once(api: Api) -> None:
    await api.call("POST", "/v1/workflows", json=HELLO)
    run = (await api.call("POST", "/v1/runs", json={"family_slug": "hello-world"})).json()
    path = f"/v1/runs/{run['id']}"
    for wait in ("0", "-1", "60.5", "abc", "nan", "inf", ""):
        error = assert_error(
            await api.call("GET", path, params={"wait": wait}), 422, "request.invalid"
        )
        assert "wait" in json.dumps(error["details"]), (wait, error)
    async with asyncio.timeout(10):  # no waiting on a run that is not the tenant's
        assert_error(
            await api.call("GET", path, params={"wait": 60}, as_b=True), 404, "run.not_found"
        )
        assert_error(
            await api.call("GET", "/v1/runs/nope", params={"wait": 60}), 404, "run.not_found"
        )


async def test_run_list_pages_with_a_cursor(api: Api) -> None:
    await api.call("POST", "/v1/workflows", json=HELLO)
    ids = []
    for _ in range(5):
        response = await api.call("POST", "/v1/runs", json={"family_slug": "hello-world"})
        ids.append(response.json()["id"])
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = (await api.call("GET", "/v1/runs", params=params)).json()
        seen += [r["id"] for r in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert sorted(seen) == sorted(ids)
    assert len(seen) == 5
    bad = await api.call("GET", "/v1/runs", params={"cursor": "garbage!"})
    # Named as every other list names a cursor it never gave.
    assert assert_error(bad, 422, "request.invalid")["details"]["pointer"] == "cursor"


# --- idempotency -------------------------------------------------------------------


async def test_same_key_same_body_replays_the_first_answer(api: Api) -> None:
    await api.call("POST", "/v1/workflows", json=HELLO)
    body = {"family_slug": "hello-world", "input": {"a": 1, "b": 2}}
    headers = {"Idempotency-Key": "order-1"}
    first = await api.call("POST", "/v1/runs", json=body, headers=headers)
    assert first.status_code == 201
    # Same JSON, keys in another order and other whitespace: still the same request.
    again = await api.call(
        "POST",
        "/v1/runs",
        content=b'{"input": {"b": 2, "a": 1},   "family_slug": "hello-world"}',
        headers=headers,
    )
    assert again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    assert again.headers.get("Idempotency-Replayed") == "true"
    assert len((await api.call("GET", "/v1/runs")).json()["items"]) == 1


async def test_same_key_other_body_is_a_conflict_and_writes_nothing(api: Api) -> None:
    await api.call("POST", "/v1/workflows", json=HELLO)
    headers = {"Idempotency-Key": "order-2"}
    await api.call("POST", "/v1/runs", json={"family_slug": "hello-world"}, headers=headers)
    conflict = await api.call(
        "POST", "/v1/runs", json={"family_slug": "hello-world", "input": 1}, headers=headers
    )
    assert_error(conflict, 422, "idempotency.conflict")
    assert len((await api.call("GET", "/v1/runs")).json()["items"]) == 1


async def test_keys_are_per_tenant_and_per_endpoint(api: Api) -> None:
    await api.call("POST", "/v1/workflows", json=HELLO)
    await api.call("POST", "/v1/workflows", json=HELLO, as_b=True)
    headers = {"Idempotency-Key": "shared"}
    a = await api.call("POST", "/v1/runs", json={"family_slug": "hello-world"}, headers=headers)
    b = await api.call(
        "POST", "/v1/runs", json={"family_slug": "hello-world"}, headers=headers, as_b=True
    )
    assert a.status_code == b.status_code == 201
    assert a.json()["id"] != b.json()["id"]
    event = await api.call("POST", "/v1/events", json={"name": "x"}, headers=headers)
    assert event.status_code == 202


async def test_a_failed_request_is_not_remembered(api: Api) -> None:
    headers = {"Idempotency-Key": "retry-me"}
    missing = await api.call(
        "POST", "/v1/runs", json={"family_slug": "hello-world"}, headers=headers
    )
    assert_error(missing, 404, "workflow.not_found")
    await api.call("POST", "/v1/workflows", json=HELLO)
    retried = await api.call(
        "POST", "/v1/runs", json={"family_slug": "hello-world"}, headers=headers
    )
    assert retried.status_code == 201


async def test_an_oversized_idempotency_key_is_refused(api: Api) -> None:
    response = await api.call(
        "POST", "/v1/events", json={"name": "x"}, headers={"Idempotency-Key": "k" * 300}
    )
    assert_error(response, 422, "request.invalid")


async def test_an_idempotency_key_with_a_control_character_is_refused(api: Api) -> None:
    # The key would name the event (and a signal) it sends, and ids hold no control
    # characters; nothing is stored.
    for key in ("evt\x01key", "evt\x7fkey"):
        response = await api.call(
            "POST", "/v1/events", json={"name": "x"}, headers={"Idempotency-Key": key}
        )
        body = assert_error(response, 422, "request.invalid")
        assert body["details"]["header"] == "Idempotency-Key"
        assert "control characters" in body["message"]
    await api.call("POST", "/v1/workflows", json=HELLO)
    run_id = (await api.call("POST", "/v1/runs", json={"family_slug": "hello-world"})).json()["id"]
    signal = await api.call(
        "POST", f"/v1/runs/{run_id}/signals/go", headers={"Idempotency-Key": "sig\x1bkey"}
    )
    assert_error(signal, 422, "request.invalid")
    batch = await api.call(
        "POST", "/v1/runs/batch", json={"runs": [{"family_slug": "hello-world", "key": "r\x01"}]}
    )
    assert_error(batch, 422, "request.invalid")
    listed = await api.call("GET", "/v1/runs")
    assert [r["id"] for r in listed.json()["items"]] == [run_id]


# --- tenancy ---------------------------------------------------------------------


async def test_another_tenants_things_are_not_found(api: Api) -> None:
    await api.call("POST", "/v1/workflows", json=HELLO)
    run_id = (await api.call("POST", "/v1/runs", json={"family_slug": "hello-world"})).json()["id"]
    for method, path in [
        ("GET", f"/v1/runs/{run_id}"),
        ("GET", f"/v1/runs/{run_id}/history"),
        ("POST", f"/v1/runs/{run_id}/cancel"),
        ("POST", f"/v1/runs/{run_id}/signals/go"),
        ("GET", "/v1/workflows/hello-world"),
        ("GET", "/v1/workflows/hello-world/versions/1"),
    ]:
        response = await api.call(method, path, as_b=True)
        assert response.status_code == 404, (method, path, response.text)
    assert (await api.call("GET", "/v1/runs", as_b=True)).json()["items"] == []
    assert (await api.call("GET", "/v1/workflows", as_b=True)).json() == []
    # and tenant A's run is untouched by B's cancel
    run = (await api.call("GET", f"/v1/runs/{run_id}")).json()
    assert run["cancel_requested"] is False


# --- steering --------------------------------------------------------------------


async def test_cancel_then_cancel_again(api: Api) -> None:
    await api.call("POST", "/v1/workflows", json=HELLO)
    run_id = (await api.call("POST", "/v1/runs", json={"family_slug": "hello-world"})).json()["id"]
    cancelled = await api.call("POST", f"/v1/runs/{run_id}/cancel", json={"reason": "test"})
    assert cancelled.status_code == 202
    assert cancelled.json()["id"] == run_id


async def test_an_idempotency_key_names_an_event_without_id(api: Api) -> None:
    headers = {"Idempotency-Key": "evt-key-1"}
    sent = await api.call("POST", "/v1/events", json={"name": "ping"}, headers=headers)
    assert sent.status_code == 202
    assert sent.json()["id"] == "evt-key-1"
    # The same event under its id, without the key: a duplicate, not a second event.
    again = await api.call("POST", "/v1/events", json={"name": "ping", "id": "evt-key-1"})
    assert again.json()["duplicate"] is True


async def test_events_are_deduplicated_by_id(api: Api) -> None:
    first = await api.call("POST", "/v1/events", json={"name": "order.created", "id": "e1"})
    assert first.status_code == 202
    assert first.json()["duplicate"] is False
    again = await api.call("POST", "/v1/events", json={"name": "order.created", "id": "e1"})
    assert again.json()["duplicate"] is True
    # The same content, key order aside, is a duplicate answered with the stored event.
    data = {"a": 1, "b": [1, {"x": None, "y": "z"}]}
    stored = await api.call("POST", "/v1/events", json={"name": "n", "id": "e2", "data": data})
    assert stored.json()["duplicate"] is False
    reordered = {"b": [1, {"y": "z", "x": None}], "a": 1}
    same = await api.call("POST", "/v1/events", json={"id": "e2", "data": reordered, "name": "n"})
    assert same.status_code == 202, same.text
    assert same.json() == {**stored.json(), "duplicate": True}
    # The id with another name or data is refused, naming the id; nothing is stored.
    for other in ({"name": "m", "data": data}, {"name": "n", "data": {"a": 2}}, {"name": "n"}):
        refused = await api.call("POST", "/v1/events", json={**other, "id": "e2"})
        error = assert_error(refused, 422, "event.invalid")
        assert error["details"]["path"] == "$.id", error
        assert error["details"]["id"] == "e2", error
    async with api.store.transaction() as tx:
        kept = await tx.get_event("tenant-a", "e2")
    assert kept is not None
    assert (kept.name, kept.data) == ("n", data)
    # An id taken from the Idempotency-Key is named by that header instead.
    keyed = await api.call(
        "POST", "/v1/events", json={"name": "other"}, headers={"Idempotency-Key": "e2"}
    )
    error = assert_error(keyed, 422, "event.invalid")
    assert error["details"]["header"] == "Idempotency-Key", error
    assert error["details"]["id"] == "e2", error


# --- OpenAPI -----------------------------------------------------------------------


async def test_openapi_document_is_served_with_request_bodies(api: Api) -> None:
    response = await api.client.get("/docs/openapi.json")
    assert response.status_code == 200
    doc = response.json()
    paths = doc["paths"]
    for path in [
        "/v1/workflows",
        "/v1/workflows/validate",
        "/v1/workflows/{slug}",
        "/v1/workflows/{slug}/versions/{version}",
        "/v1/runs",
        "/v1/runs/{run_id}",
        "/v1/runs/{run_id}/history",
        "/v1/runs/{run_id}/cancel",
        "/v1/runs/{run_id}/signals/{name}",
        "/v1/events",
        "/healthz",
        "/readyz",
    ]:
        assert path in paths, path
    trigger = paths["/v1/runs"]["post"]
    ref = trigger["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    name = ref.rsplit("/", 1)[-1]
    assert set(doc["components"]["schemas"][name]["properties"]) == {
        "family_slug",
        "version",
        "input",
    }
    assert any(p["name"] == "Idempotency-Key" for p in trigger["parameters"])
    error = trigger["responses"]["422"]["content"]["application/json"]["schema"]["$ref"]
    error_schema = doc["components"]["schemas"][error.rsplit("/", 1)[-1]]
    assert set(error_schema["properties"]) == {"code", "message", "details"}
    assert "401" in paths["/v1/runs/{run_id}"]["get"]["responses"]


APPROVAL: dict[str, Any] = {
    "family_slug": "approval",
    "steps": [
        {"ref": "approve", "type": "STEP_TYPE_WAIT_FOR_SIGNAL", "args": {"signal": "approve"}},
        {"ref": "ship", "type": "STEP_TYPE_WAIT_FOR_SIGNAL", "args": {"signal": "ship"}},
    ],
    "edges": [{"source_ref": "approve", "target_ref": "ship"}],
}


async def _wait_for_status(api: Api, run_id: str, status: str) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + 20
    while True:
        run: dict[str, Any] = (await api.call("GET", f"/v1/runs/{run_id}")).json()
        if run["status"] == status:
            return run
        assert not run["status"].endswith(("SUCCEEDED", "FAILED", "CANCELLED")), run
        assert asyncio.get_running_loop().time() < deadline, run
        await asyncio.sleep(0.05)


async def test_a_signal_completes_a_waiting_run_and_a_late_one_is_refused(api: Api) -> None:
    await api.call("POST", "/v1/workflows", json=APPROVAL)
    run_id = (await api.call("POST", "/v1/runs", json={"family_slug": "approval"})).json()["id"]
    path = f"/v1/runs/{run_id}/signals/approve"
    sent = await api.call("POST", path, json={"payload": {"by": "ada"}, "id": "s1"})
    assert sent.status_code == 202, sent.text
    assert sent.json()["duplicate"] is False
    repeat = await api.call("POST", path, json={"payload": {"by": "bob"}, "id": "s1"})
    assert repeat.status_code == 202, repeat.text
    assert repeat.json()["duplicate"] is True
    ship = await api.call("POST", f"/v1/runs/{run_id}/signals/ship", json={"payload": 1})
    assert ship.status_code == 202, ship.text
    run = await _wait_for_status(api, run_id, "RUN_STATUS_SUCCEEDED")
    assert run["steps"][0]["output"] == {"by": "ada"}
    late = await api.call("POST", path, json={"payload": {"by": "eve"}})
    assert_error(late, 409, "run.ended")
    # A retry of a delivered signal is still its duplicate once the run has ended.
    again = await api.call("POST", f"/v1/runs/{run_id}/signals/ship", json={"id": "s2"})
    assert_error(again, 409, "run.ended")
    retried = await api.call("POST", path, json={"payload": {"by": "ada"}, "id": "s1"})
    assert retried.status_code == 202, retried.text
    assert retried.json() == {
        "run_id": run_id,
        "signal_id": "s1",
        "name": "approve",
        "duplicate": True,
    }
    for bad in ("a" * 257, "a%01b"):
        refused = await api.call("POST", f"/v1/runs/{run_id}/signals/{bad}", json={})
        error = assert_error(refused, 422, "request.invalid")
        assert error["details"]["path"] == "name", error
        assert error["details"]["reason"].startswith("signal name "), error
    assert_error(await api.call("POST", f"/v1/runs/{run_id}/cancel"), 409, "run.not_cancellable")


async def test_a_signal_no_step_is_left_to_take_is_answered_and_ignored(api: Api) -> None:
    # `ship` waits after `approve`: one early `ship` signal is kept for it; the
    # next ones, which no step could ever take, are answered 202 and ignored, and
    # the run's history says why.
    await api.call("POST", "/v1/workflows", json=APPROVAL)
    run_id = (await api.call("POST", "/v1/runs", json={"family_slug": "approval"})).json()["id"]
    await _wait_for_status(api, run_id, "RUN_STATUS_RUNNING")
    for i in range(3):
        sent = await api.call(
            "POST", f"/v1/runs/{run_id}/signals/ship", json={"payload": i, "id": f"ship{i}"}
        )
        assert sent.status_code == 202, sent.text
        assert sent.json()["duplicate"] is False
    deadline = asyncio.get_running_loop().time() + 20
    while True:
        history = (await api.call("GET", f"/v1/runs/{run_id}/history")).json()
        ignored = [h["data"] for h in history if h["kind"] == "input.ignored"]
        if len(ignored) == 2 or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.05)
    assert [i["reason"] for i in ignored] == [
        "signal 'ship' has no step left to take it: 1 kept for the 1 yet to start"
    ] * 2, history
    await api.call("POST", f"/v1/runs/{run_id}/signals/approve", json={"payload": "ok"})
    run = await _wait_for_status(api, run_id, "RUN_STATUS_SUCCEEDED")
    assert run["output"] == {"ship": 0}


async def test_a_signal_id_sent_again_under_another_name_answers_the_name_it_took(
    api: Api,
) -> None:
    # The id was delivered as `approve`; the repeat as `ship` delivers nothing, and
    # its answer says under which name the id went, before and after the run ends.
    await api.call("POST", "/v1/workflows", json=APPROVAL)
    run_id = (await api.call("POST", "/v1/runs", json={"family_slug": "approval"})).json()["id"]
    first = await api.call("POST", f"/v1/runs/{run_id}/signals/approve", json={"id": "s1"})
    assert first.json()["name"] == "approve"
    expected = {"run_id": run_id, "signal_id": "s1", "name": "approve", "duplicate": True}
    repeat = await api.call("POST", f"/v1/runs/{run_id}/signals/ship", json={"id": "s1"})
    assert repeat.status_code == 202, repeat.text
    assert repeat.json() == expected
    run = (await api.call("GET", f"/v1/runs/{run_id}")).json()
    assert run["steps"][1]["status"] != "STEP_STATUS_SUCCEEDED", run
    await api.call("POST", f"/v1/runs/{run_id}/cancel")
    await _wait_for_status(api, run_id, "RUN_STATUS_CANCELLED")
    late = await api.call("POST", f"/v1/runs/{run_id}/signals/ship", json={"id": "s1"})
    assert late.status_code == 202, late.text
    assert late.json() == expected


async def test_a_signal_name_with_a_slash_is_sent_encoded(api: Api) -> None:
    # The SDKs encode a name's `/` as `%2F`; the server receives it decoded.
    slashed = {
        "family_slug": "slashed",
        "steps": [
            {"ref": "w", "type": "STEP_TYPE_WAIT_FOR_SIGNAL", "args": {"signal": "orders/ship"}}
        ],
        "edges": [],
    }
    await api.call("POST", "/v1/workflows", json=slashed)
    run_id = (await api.call("POST", "/v1/runs", json={"family_slug": "slashed"})).json()["id"]
    sent = await api.call("POST", f"/v1/runs/{run_id}/signals/orders%2Fship", json={"id": "s"})
    assert sent.status_code == 202, sent.text
    assert sent.json()["name"] == "orders/ship"
    run = await _wait_for_status(api, run_id, "RUN_STATUS_SUCCEEDED")
    assert run["steps"][0]["status"] == "STEP_STATUS_SUCCEEDED"
    nameless = await api.call("POST", f"/v1/runs/{run_id}/signals/", json={})
    assert nameless.status_code == 404, nameless.text


async def test_a_signal_name_with_a_slash_at_an_end_is_delivered_as_sent(api: Api) -> None:
    # `orders/` is not `orders`: the run waiting for `orders` takes only that one.
    waits = {
        "family_slug": "waits",
        "steps": [{"ref": "w", "type": "STEP_TYPE_WAIT_FOR_SIGNAL", "args": {"signal": "orders"}}],
        "edges": [],
    }
    await api.call("POST", "/v1/workflows", json=waits)
    run_id = (await api.call("POST", "/v1/runs", json={"family_slug": "waits"})).json()["id"]
    for path, name in (("orders%2F", "orders/"), ("%2Forders", "/orders"), ("a%2F%2Fb", "a//b")):
        sent = await api.call("POST", f"/v1/runs/{run_id}/signals/{path}", json={})
        assert sent.status_code == 202, sent.text
        assert sent.json()["name"] == name
    run = (await api.call("GET", f"/v1/runs/{run_id}")).json()
    assert run["steps"][0]["status"] == "STEP_STATUS_WAITING", run
    sent = await api.call("POST", f"/v1/runs/{run_id}/signals/orders", json={})
    assert sent.json()["name"] == "orders"
    await _wait_for_status(api, run_id, "RUN_STATUS_SUCCEEDED")


async def test_cancel_ends_a_waiting_run(api: Api) -> None:
    await api.call("POST", "/v1/workflows", json=APPROVAL)
    run_id = (await api.call("POST", "/v1/runs", json={"family_slug": "approval"})).json()["id"]
    cancelled = await api.call(
        "POST", f"/v1/runs/{run_id}/cancel", json={"reason": "no longer needed"}
    )
    assert cancelled.status_code == 202
    assert cancelled.json()["id"] == run_id
    run = await _wait_for_status(api, run_id, "RUN_STATUS_CANCELLED")
    assert run["steps"][0]["status"] == "STEP_STATUS_CANCELLED"
    kinds = [h["kind"] for h in (await api.call("GET", f"/v1/runs/{run_id}/history")).json()]
    assert kinds, "the cancel is in the history"


ON_ORDER: dict[str, Any] = {
    "family_slug": "on-order",
    "triggers": [{"event": "order.created", "filter": "event.data.amount > 10"}],
    "steps": [
        {
            "ref": "echo",
            "type": "STEP_TYPE_DATAFLOW",
            "args": {"operation": "project", "project": {"amount": "input.amount"}},
        }
    ],
    "edges": [],
}


async def test_an_event_starts_the_runs_whose_trigger_matches(api: Api) -> None:
    assert (await api.call("POST", "/v1/workflows", json=ON_ORDER)).status_code == 201
    small = await api.call(
        "POST", "/v1/events", json={"name": "order.created", "data": {"amount": 5}}
    )
    assert small.status_code == 202
    assert small.json()["runs_started"] == []
    big = await api.call(
        "POST", "/v1/events", json={"name": "order.created", "data": {"amount": 50}, "id": "o-1"}
    )
    started = big.json()["runs_started"]
    assert len(started) == 1
    run = await _wait_for_status(api, started[0], "RUN_STATUS_SUCCEEDED")
    assert run["family_slug"] == "on-order"
    assert run["input"] == {"amount": 50}  # a triggered run's input is the event's data
    assert run["output"] == {"echo": {"amount": 50}}
    again = await api.call(
        "POST", "/v1/events", json={"name": "order.created", "data": {"amount": 50}, "id": "o-1"}
    )
    assert again.json()["duplicate"] is True
    assert again.json()["runs_started"] == []
    runs = (await api.call("GET", "/v1/runs", params={"family_slug": "on-order"})).json()
    assert [r["id"] for r in runs["items"]] == started


TABLES = (
    "tenants",
    "api_keys",
    "workflow_versions",
    "workflow_triggers",
    "runs",
    "run_inbox",
    "tasks",
    "attempts",
    "timers",
    "waits",
    "events",
    "run_history",
    "idempotency_keys",
)


def _row_counts(settings_target: str) -> dict[str, int]:
    if settings_target.startswith("postgresql://"):
        with psycopg.connect(settings_target) as conn:
            return {
                t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # type: ignore[index]
                for t in TABLES
            }
    conn = sqlite3.connect(settings_target)
    try:
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}
    finally:
        conn.close()


async def test_failed_requests_write_no_row_anywhere(api: Api) -> None:
    await api.call("POST", "/v1/workflows", json=HELLO)
    run_id = (await api.call("POST", "/v1/runs", json={"family_slug": "hello-world"})).json()["id"]
    await _wait_for_status(api, run_id, "RUN_STATUS_SUCCEEDED")
    target = api.client.app.state.settings.store_target
    before = _row_counts(target)
    key = {"Idempotency-Key": "bad-1"}
    bad_definition = {**HELLO, "edges": [{"source_ref": "greet", "target_ref": "ghost"}]}
    failures = [
        ("POST", "/v1/workflows", {"json": bad_definition, "headers": key}, 422),
        ("POST", "/v1/workflows", {"content": b"{", "headers": key}, 400),
        ("POST", "/v1/runs", {"json": {"family_slug": "nope"}, "headers": key}, 404),
        ("POST", "/v1/runs", {"json": {"family_slug": "hello-world", "version": 7}}, 404),
        ("POST", "/v1/runs", {"json": {"family_slug": "hello-world", "x": 1}}, 422),
        ("POST", "/v1/runs", {"content": b"[" * (MAX_BODY + 1)}, 413),
        ("POST", f"/v1/runs/{run_id}/cancel", {"headers": key}, 409),
        ("POST", f"/v1/runs/{run_id}/signals/go", {"json": {"payload": 1}}, 409),
        ("POST", "/v1/runs/nope/signals/go", {"json": {"payload": 1}}, 404),
        ("POST", "/v1/events", {"json": {"name": ""}, "headers": key}, 422),
        ("POST", "/v1/events", {"json": {"data": 1}}, 422),
    ]
    for method, path, kwargs, status in failures:
        response = await api.call(method, path, **kwargs)
        assert response.status_code == status, (path, kwargs, response.text)
    unauthenticated = await api.client.post("/v1/runs", json={"family_slug": "hello-world"})
    assert unauthenticated.status_code == 401
    assert _row_counts(target) == before


LARGE_OUTPUTS: dict[str, Any] = {
    "family_slug": "large-outputs",
    "steps": [
        {
            "ref": "a",
            "type": "STEP_TYPE_ACTION",
            "args": {"action": "noop", "params": {"text": "input.text"}},
        },
        {
            "ref": "b",
            "type": "STEP_TYPE_DATAFLOW",
            "args": {"operation": "project", "project": {"size": "size(steps.a.output.text)"}},
        },
        {
            "ref": "c",
            "type": "STEP_TYPE_ACTION",
            "args": {"action": "noop", "params": {"again": "steps.a.output.text"}},
        },
    ],
    "edges": [{"source_ref": "a", "target_ref": "b"}, {"source_ref": "b", "target_ref": "c"}],
}


async def test_large_step_outputs_are_kept_out_of_the_state_and_still_read(api: Api) -> None:
    # Outputs past OUTLINE_BYTES are written once beside the run; later steps'
    # expressions and the API still see them whole.
    text = "".join(chr(ord("a") + i % 26) for i in range(1500))
    assert (await api.call("POST", "/v1/workflows", json=LARGE_OUTPUTS)).status_code == 201
    started = await api.call(
        "POST", "/v1/runs", json={"family_slug": "large-outputs", "input": {"text": text}}
    )
    assert started.status_code == 201, started.text
    run_id = started.json()["id"]
    run = await _wait_for_status(api, run_id, "RUN_STATUS_SUCCEEDED")
    outputs = {step["ref"]: step["output"] for step in run["steps"]}
    assert outputs == {"a": {"text": text}, "b": {"size": 1500}, "c": {"again": text}}
    async with api.store.transaction() as tx:
        rows = await tx.session.fetch_all(
            "SELECT step_ref FROM run_outputs WHERE run_id = %s ORDER BY step_ref", (run_id,)
        )
        state = await tx.session.fetch_one("SELECT state FROM runs WHERE id = %s", (run_id,))
    assert [r[0] for r in rows] == ["a", "c"]
    assert state is not None
    stored = json.loads(state[0])["steps"]
    assert "output" not in stored["a"]
    assert "output" not in stored["c"]
    assert stored["b"]["output"] == {"size": 1500}
