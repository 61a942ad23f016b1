"""The MCP server at /mcp, driven by the `mcp` library's own streamable-HTTP client
against a real server process on 127.0.0.1, on SQLite (`ductor dev`) and on
Postgres (`ductor serve`).

Every tool is called and its answer compared with the REST API's; a bad key is
refused before any MCP work; another tenant's key finds nothing; malformed
arguments name the argument; a body over the limit is refused and the server
keeps answering.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
import pytest
import websockets
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from .conftest import ServerProcess

pytestmark = pytest.mark.timeout(300)


TOOLS = {
    "list_workflows",
    "get_workflow",
    "validate_workflow",
    "publish_workflow",
    "trigger_run",
    "get_run",
    "get_run_history",
    "list_runs",
    "send_event",
    "send_signal",
    "cancel_run",
    "rerun_run",
    "route",
    "get_decision",
    "list_assignments",
    "list_accounts",
    "get_account",
    "list_receipts",
    "get_receipt",
}
MUTATING = {
    "publish_workflow",
    "trigger_run",
    "send_event",
    "send_signal",
    "cancel_run",
    "rerun_run",
    "route",
}

GATE: dict[str, Any] = {
    "family_slug": "gate",
    "title": "Wait for approval",
    "steps": [
        {"ref": "approval", "type": "STEP_TYPE_WAIT_FOR_SIGNAL", "args": {"signal": "approve"}},
        {
            "ref": "done",
            "type": "STEP_TYPE_DATAFLOW",
            "args": {"operation": "project", "project": {"who": "input.who"}},
        },
    ],
    "edges": [{"source_ref": "approval", "target_ref": "done"}],
}
BROKEN: dict[str, Any] = {
    "family_slug": "broken",
    "steps": [{"ref": "a", "type": "STEP_TYPE_NOPE"}, {"ref": "a", "type": "STEP_TYPE_WAIT"}],
    "edges": [],
}


@asynccontextmanager
async def connect(server: ServerProcess, key: str | None = None) -> AsyncIterator[Client]:
    """The `mcp` client on /mcp, authenticated with `key` (the server's by default)."""
    headers = {"Authorization": f"Bearer {key or server.api_key}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        Client(streamable_http_client(f"{server.url}/mcp", http_client=http)) as client,
    ):
        yield client


async def call(client: Client, tool: str, **arguments: Any) -> Any:
    """A tool's structured answer; fails if the tool answered an error."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, (tool, result.structured_content)
    assert result.content[0].type == "text"
    return result.structured_content


async def refused(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's error body (`{code, message, details}`); fails if the tool succeeded."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, (tool, result.structured_content)
    body: dict[str, Any] = result.structured_content
    assert set(body) == {"code", "message", "details"}
    return body


def mcp_error(raised: BaseException) -> MCPError:
    """The `MCPError` in what the client raised (it may come inside exception groups)."""
    if isinstance(raised, MCPError):
        return raised
    if isinstance(raised, BaseExceptionGroup):
        for inner in raised.exceptions:
            try:
                return mcp_error(inner)
            except AssertionError:
                continue
    raise AssertionError(f"no MCPError in {raised!r}") from raised


def other_tenant_key(server: ServerProcess, tenant: str) -> str:
    extra = [] if server.database_url else ["--data-dir", str(server.data_dir)]
    return server.cli("keys", "create", "--tenant", tenant, *extra).stdout.strip()


async def poll(http: httpx.AsyncClient, path: str, params: dict[str, str]) -> Any:
    """The `items` of a REST listing, once there are some."""
    deadline = time.monotonic() + 60
    while True:
        items = (await http.get(path, params=params)).json()["items"]
        if items:
            return items
        assert time.monotonic() < deadline, f"nothing at {path} {params} in 60s"
        await asyncio.sleep(0.1)


def with_receipts(server: ServerProcess) -> ServerProcess:
    server.extra_env["DUCTOR_RECEIPT_KEY"] = "mcp-1 " + base64.b64encode(bytes(32)).decode()
    server.extra_env["DUCTOR_RECEIPTS_FOR_RUNS"] = "on"
    return server.start()


def test_every_tool_answers_what_rest_answers(server: ServerProcess) -> None:
    with_receipts(server)
    asyncio.run(_every_tool(server))


def rest(server: ServerProcess) -> httpx.AsyncClient:
    """The REST API of `server`, with its key."""
    headers = {"Authorization": f"Bearer {server.api_key}"}
    return httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30)


async def _every_tool(server: ServerProcess) -> None:
    async with rest(server) as http, connect(server) as client:
        listed = (await client.list_tools()).tools
        assert {tool.name for tool in listed} == TOOLS
        for tool in listed:
            schema = tool.input_schema
            assert schema["type"] == "object"
            assert schema["additionalProperties"] is False
            assert ("idempotency_key" in schema["properties"]) == (tool.name in MUTATING)
            assert tool.annotations is not None
            assert tool.annotations.read_only_hint is (tool.name not in MUTATING)
            assert bool(tool.annotations.destructive_hint) is (tool.name == "cancel_run")
            assert set(schema.get("required", ())) <= set(schema["properties"])
        # Nested bodies are described by their own schemas under $defs.
        by_name = {tool.name: tool.input_schema for tool in listed}
        for name, argument in (
            ("validate_workflow", "definition"),
            ("publish_workflow", "definition"),
            ("route", "routable"),
        ):
            schema = by_name[name]
            reference = schema["properties"][argument]["$ref"]
            assert reference.startswith("#/$defs/"), (name, reference)
            nested = schema["$defs"][reference.removeprefix("#/$defs/")]
            assert nested["type"] == "object", (name, nested)
            assert nested["required"], (name, nested)

        # validate and publish: the same report and the same refusal as REST.
        report = await call(client, "validate_workflow", definition=BROKEN)
        assert report == (await http.post("/v1/workflows/validate", json=BROKEN)).json()
        assert report["valid"] is False
        assert {p["pointer"] for p in report["problems"]} >= {"/steps/0/type", "/steps/1/ref"}
        refusal = await refused(client, "publish_workflow", definition=BROKEN)
        rest_refusal = await http.post("/v1/workflows", json=BROKEN)
        assert rest_refusal.status_code == 422
        assert refusal == rest_refusal.json()
        assert refusal["code"] == "definition.invalid"
        assert {p["pointer"] for p in refusal["details"]} >= {"/steps/0/type"}

        first = await client.call_tool(
            "publish_workflow", {"definition": GATE, "idempotency_key": "pub-1"}
        )
        again = await client.call_tool(
            "publish_workflow", {"definition": GATE, "idempotency_key": "pub-1"}
        )
        assert first.meta is not None
        assert again.meta is not None
        assert (first.meta["ductor/status"], first.meta["ductor/replayed"]) == (201, False)
        assert (again.meta["ductor/status"], again.meta["ductor/replayed"]) == (201, True)
        assert first.structured_content == again.structured_content
        assert first.structured_content["version"] == 1
        # The same definition again, without a key: found (200), not created, not replayed.
        found_again = await client.call_tool("publish_workflow", {"definition": GATE})
        assert found_again.meta is not None
        assert (found_again.meta["ductor/status"], found_again.meta["ductor/replayed"]) == (
            200,
            False,
        )
        assert found_again.structured_content["created"] is False
        assert found_again.structured_content["version"] == 1
        assert await call(client, "list_workflows") == {
            "items": (await http.get("/v1/workflows")).json()
        }
        assert await call(client, "get_workflow", family_slug="gate") == (
            (await http.get("/v1/workflows/gate")).json()
        )
        assert await call(client, "get_workflow", family_slug="gate", version=1) == (
            (await http.get("/v1/workflows/gate/versions/1")).json()
        )

        # runs: trigger (idempotent), signal, cancel, read, history.
        run = await call(
            client, "trigger_run", family_slug="gate", input={"who": "ada"}, idempotency_key="t-1"
        )
        same = {"family_slug": "gate", "input": {"who": "ada"}, "idempotency_key": "t-1"}
        assert (await call(client, "trigger_run", **same))["id"] == run["id"]
        racing = await asyncio.gather(
            *(
                call(client, "trigger_run", family_slug="gate", idempotency_key="t-2")
                for _ in range(8)
            )
        )
        assert len({started["id"] for started in racing}) == 1
        conflict = await refused(client, "trigger_run", family_slug="gate", idempotency_key="t-1")
        assert conflict["code"] == "idempotency.conflict"
        doomed = await call(client, "trigger_run", family_slug="gate")
        signal = await client.call_tool(
            "send_signal", {"run_id": run["id"], "name": "approve", "payload": {"ok": True}}
        )
        assert not signal.is_error
        assert signal.meta is not None
        assert signal.meta["ductor/status"] == 202
        cancel = await client.call_tool(
            "cancel_run", {"run_id": doomed["id"], "reason": "not needed", "idempotency_key": "c"}
        )
        assert not cancel.is_error
        assert cancel.meta is not None
        assert cancel.meta["ductor/status"] == 202
        assert (await asyncio.to_thread(server.wait_for_run, run["id"]))[
            "status"
        ] == "RUN_STATUS_SUCCEEDED"
        assert (await asyncio.to_thread(server.wait_for_run, doomed["id"]))[
            "status"
        ] == "RUN_STATUS_CANCELLED"
        finished = await call(client, "get_run", run_id=run["id"])
        assert finished == (await http.get(f"/v1/runs/{run['id']}")).json()
        assert finished["output"] == {"done": {"who": "ada"}}
        history = await call(client, "get_run_history", run_id=run["id"])
        assert history == {"items": (await http.get(f"/v1/runs/{run['id']}/history")).json()}
        assert any(entry["kind"] for entry in history["items"])
        listed_runs = await call(client, "list_runs", family_slug="gate", limit=10)
        assert (
            listed_runs
            == (await http.get("/v1/runs", params={"family_slug": "gate", "limit": 10})).json()
        )
        assert (
            await call(client, "list_runs", status="RUN_STATUS_CANCELLED", family_slug="gate")
            == (
                await http.get(
                    "/v1/runs", params={"status": "RUN_STATUS_CANCELLED", "family_slug": "gate"}
                )
            ).json()
        )
        again_run = await client.call_tool(
            "rerun_run", {"run_id": doomed["id"], "idempotency_key": "rr-1"}
        )
        assert not again_run.is_error
        assert again_run.meta is not None
        assert again_run.meta["ductor/status"] == 201
        rerun = again_run.structured_content
        assert rerun["rerun_of"] == doomed["id"]
        assert rerun["run"] == (await http.get(f"/v1/runs/{rerun['run']['id']}")).json()
        rest_rerun = await http.post(
            f"/v1/runs/{doomed['id']}/rerun", json={}, headers={"Idempotency-Key": "rr-1"}
        )
        assert rest_rerun.headers["Idempotency-Replayed"] == "true"
        assert rest_rerun.json()["run"]["id"] == rerun["run"]["id"]
        still = await refused(client, "rerun_run", run_id=rerun["run"]["id"])
        assert still["code"] == "run.not_ended"
        ended = await refused(client, "send_signal", run_id=run["id"], name="approve")
        rest_ended = await http.post(f"/v1/runs/{run['id']}/signals/approve", json={})
        assert ended == rest_ended.json()

        # events: the first is stored; REST sees the same id as a duplicate.
        event = await call(client, "send_event", name="lead.created", data={"n": 1}, id="ev-1")
        assert event["duplicate"] is False
        assert event["id"] == "ev-1"
        duplicate = (
            await http.post(
                "/v1/events", json={"name": "lead.created", "data": {"n": 1}, "id": "ev-1"}
            )
        ).json()
        assert duplicate == {**event, "duplicate": True}

        # routing: route a routable, read the decision and its explanation.
        assert (await http.post("/v1/workers", json={"id": "ana"})).status_code == 201
        pool = {"id": "desk", "members": [{"worker": "ana"}]}
        assert (await http.post("/v1/pools", json=pool)).status_code == 201
        rules = {"kinds": {"ticket": {}}, "default_pool": "desk"}
        assert (await http.post("/v1/rules", json=rules)).status_code == 201
        routable = {"id": "t-1", "kind": "ticket", "attributes": {"subject": "refund"}}
        decision = await call(client, "route", routable=routable, idempotency_key="r-1")
        assert decision["worker"] == "ana"
        assert decision["explanation"]
        replay = await http.post("/v1/route", json=routable, headers={"Idempotency-Key": "r-1"})
        assert replay.headers["Idempotency-Replayed"] == "true"
        assert replay.json() == decision
        assert await call(client, "list_assignments", routable_id="t-1") == {
            "items": (await http.get("/v1/assignments", params={"routable_id": "t-1"})).json()
        }
        assert await call(client, "get_decision", decision_id=decision["id"]) == (
            (await http.get(f"/v1/decisions/{decision['id']}")).json()
        )

        # balances and receipts.
        account = {"code": "wallet:ana", "currency": "USD", "kind": "liability"}
        assert (await http.post("/v1/accounts", json=account)).status_code == 201
        assert await call(client, "list_accounts") == {
            "items": (await http.get("/v1/accounts")).json()
        }
        assert await call(client, "get_account", code="wallet:ana") == (
            (await http.get("/v1/accounts/wallet:ana")).json()
        )
        subject = f"run:{run['id']}"
        page = await poll(http, "/v1/receipts", {"subject": subject})
        assert await call(client, "list_receipts", subject=subject) == (
            (await http.get("/v1/receipts", params={"subject": subject})).json()
        )
        receipt_id = page[0]["id"]
        assert await call(client, "get_receipt", receipt_id=receipt_id) == (
            (await http.get(f"/v1/receipts/{receipt_id}")).json()
        )

        # resources: definitions and run histories.
        resources = (await client.list_resources()).resources
        assert [str(r.uri) for r in resources] == ["ductor://workflows/gate"]
        templates = (await client.list_resource_templates()).resource_templates
        assert {t.uri_template for t in templates} == {
            "ductor://workflows/{family_slug}",
            "ductor://workflows/{family_slug}/versions/{version}",
            "ductor://runs/{run_id}/history",
        }
        for uri, path in (
            ("ductor://workflows/gate", "/v1/workflows/gate"),
            ("ductor://workflows/gate/versions/1", "/v1/workflows/gate/versions/1"),
        ):
            [content] = (await client.read_resource(uri)).contents
            assert httpx.Response(200, text=content.text).json() == (await http.get(path)).json()  # type: ignore[union-attr]
        [content] = (await client.read_resource(f"ductor://runs/{run['id']}/history")).contents
        assert httpx.Response(200, text=content.text).json() == history  # type: ignore[union-attr]


def test_a_bad_key_is_refused_before_any_mcp_work(server: ServerProcess) -> None:
    server.start()
    for headers in ({}, {"Authorization": "Bearer dk_nope"}, {"Authorization": "Basic eDp5"}):
        answer = httpx.post(
            f"{server.url}/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            headers={**headers, "Accept": "application/json, text/event-stream"},
            timeout=60,
        )
        assert answer.status_code == 401, answer.text
        assert answer.headers["www-authenticate"].startswith("Bearer")
        assert answer.json()["error"]["data"]["code"] == "auth.unauthenticated"

    async def with_a_bad_key() -> None:
        try:
            async with connect(server, "dk_not_a_key") as client:
                await client.list_tools()
        except BaseException as refusal:
            error = mcp_error(refusal)
        else:
            raise AssertionError("a bad key was let in")
        assert error.message.startswith("auth.unauthenticated")
        assert error.error.data["code"] == "auth.unauthenticated"

    asyncio.run(with_a_bad_key())


def test_only_post_is_served_a_stream_or_a_session_end_is_refused_at_once(
    server: ServerProcess,
) -> None:
    """Stateless: a GET (a client asking for a server stream) or a DELETE (ending a
    session) is a 405 answered at once, not a connection held open."""
    server.start()
    headers = {"Authorization": f"Bearer {server.api_key}", "Accept": "text/event-stream"}
    for method in ("GET", "DELETE", "PUT"):
        answer = httpx.request(method, f"{server.url}/mcp", headers=headers, timeout=10)
        assert answer.status_code == 405, (method, answer.text)
        assert answer.headers["allow"] == "POST"
        data = answer.json()["error"]["data"]
        assert data["code"] == "route.method_not_allowed"
        assert data["details"] == {"allowed": ["POST"]}
        assert method in data["message"]
    # A bad key is still refused first.
    answer = httpx.get(f"{server.url}/mcp", headers={"Authorization": "Bearer dk_nope"}, timeout=60)
    assert answer.status_code == 401


def test_another_tenant_finds_nothing(server: ServerProcess) -> None:
    with_receipts(server)
    other = other_tenant_key(server, "other")
    asyncio.run(_isolation(server, other))


async def _isolation(server: ServerProcess, other: str) -> None:
    async with rest(server) as http, connect(server) as mine:
        await call(mine, "publish_workflow", definition=GATE, idempotency_key="mine-1")
        run = await call(mine, "trigger_run", family_slug="gate")
        # An ended run, with a receipt.
        ended = await call(
            mine, "trigger_run", family_slug="gate", input={"who": "a"}, idempotency_key="run-1"
        )
        await call(mine, "send_signal", run_id=ended["id"], name="approve")
        finished = await asyncio.to_thread(server.wait_for_run, ended["id"])
        assert finished["status"] == "RUN_STATUS_SUCCEEDED", finished
        [receipt, *_] = await poll(http, "/v1/receipts", {"subject": f"run:{ended['id']}"})
        assert (await http.post("/v1/workers", json={"id": "ana"})).status_code == 201
        pool = {"id": "desk", "members": [{"worker": "ana"}]}
        assert (await http.post("/v1/pools", json=pool)).status_code == 201
        assert (
            await http.post("/v1/rules", json={"kinds": {"t": {}}, "default_pool": "desk"})
        ).is_success
        decision = await call(mine, "route", routable={"id": "x", "kind": "t"})
        assert (
            await http.post(
                "/v1/accounts", json={"code": "wallet:a", "currency": "USD", "kind": "liability"}
            )
        ).is_success
    async with connect(server, other) as theirs:
        for tool, arguments, code in (
            ("get_workflow", {"family_slug": "gate"}, "workflow.not_found"),
            ("get_workflow", {"family_slug": "gate", "version": 1}, "workflow.not_found"),
            ("trigger_run", {"family_slug": "gate"}, "workflow.not_found"),
            ("get_run", {"run_id": run["id"]}, "run.not_found"),
            ("get_run_history", {"run_id": run["id"]}, "run.not_found"),
            ("send_signal", {"run_id": run["id"], "name": "approve"}, "run.not_found"),
            ("cancel_run", {"run_id": run["id"]}, "run.not_found"),
            ("get_decision", {"decision_id": decision["id"]}, "decision.not_found"),
            ("get_account", {"code": "wallet:a"}, "account.not_found"),
            ("rerun_run", {"run_id": ended["id"]}, "run.not_found"),
            ("get_run", {"run_id": ended["id"]}, "run.not_found"),
            ("get_receipt", {"receipt_id": receipt["id"]}, "receipt.not_found"),
        ):
            body = await refused(theirs, tool, **arguments)
            assert body["code"] == code, (tool, body)
        assert await call(theirs, "list_workflows") == {"items": []}
        assert await call(theirs, "list_accounts") == {"items": []}
        assert await call(theirs, "list_runs") == {"items": [], "next_cursor": None}
        assert await call(theirs, "list_runs", family_slug="gate") == {
            "items": [],
            "next_cursor": None,
        }
        assert (await call(theirs, "list_receipts", subject=f"run:{ended['id']}"))["items"] == []
        assert (await call(theirs, "list_receipts"))["items"] == []
        assert await call(theirs, "list_assignments", routable_id="x") == {"items": []}
        assert await call(theirs, "list_assignments", worker="ana") == {"items": []}
        assert (await theirs.list_resources()).resources == []
        for uri in (
            "ductor://workflows/gate",
            "ductor://workflows/gate/versions/1",
            f"ductor://runs/{run['id']}/history",
        ):
            with pytest.raises(MCPError, match="not_found") as unseen:
                await theirs.read_resource(uri)
            assert unseen.value.error.data["code"] in ("workflow.not_found", "run.not_found")
        # My idempotency keys are mine: the same key is a new call for them, never my
        # remembered answer.
        theirs_published = await theirs.call_tool(
            "publish_workflow", {"definition": GATE, "idempotency_key": "mine-1"}
        )
        assert theirs_published.meta is not None
        assert theirs_published.meta["ductor/replayed"] is False
        assert theirs_published.meta["ductor/status"] == 201
        theirs_run = await call(theirs, "trigger_run", family_slug="gate", idempotency_key="run-1")
        assert theirs_run["id"] not in (run["id"], ended["id"])
        # An event id is theirs alone too: mine of the same id is no duplicate.
        assert (await call(theirs, "send_event", name="n", id="ev-shared"))["duplicate"] is False
    # Nothing of theirs touched mine: the run still waits for its signal.
    async with rest(server) as http:
        assert (await http.get(f"/v1/runs/{run['id']}")).json()["status"] == "RUN_STATUS_RUNNING"
        sent = await http.post("/v1/events", json={"name": "n", "id": "ev-shared"})
        assert sent.json()["duplicate"] is False
        assert len((await http.get("/v1/workflows/gate")).json()["versions"]) == 1


def test_malformed_and_huge_arguments_are_refused_clearly(server: ServerProcess) -> None:
    server.start()
    asyncio.run(_malformed(server))
    assert httpx.get(f"{server.url}/readyz").status_code == 200


async def _malformed(server: ServerProcess) -> None:
    async with connect(server) as client:
        missing = await refused(client, "get_run")
        assert missing["code"] == "request.invalid"
        assert missing["details"]["argument"] == "run_id"
        assert "run_id" in missing["message"]
        wrong = await refused(client, "trigger_run", family_slug="gate", version="one")
        assert wrong["details"] == {
            "argument": "version",
            "path": "$.version",
            "reason": "Expected `int | null`, got `str`",
        }
        nameless = await refused(client, "t" * 20_000)
        assert nameless["code"] == "request.invalid"
        assert len(nameless["message"]) <= 2_000
        assert nameless["details"]["tool"] == "t" * 975 + "… (19025 more characters)"
        unknown = await refused(client, "get_run", run_id="r", colour="blue")
        assert unknown["details"]["argument"] == "colour"
        blank_key = await refused(client, "trigger_run", family_slug="gate", idempotency_key=" ")
        assert blank_key["details"]["argument"] == "idempotency_key"
        long_key = await refused(
            client, "trigger_run", family_slug="gate", idempotency_key="k" * 256
        )
        assert long_key["details"]["argument"] == "idempotency_key"
        assert long_key["details"]["reason"] == "Expected `str` of length <= 255"
        longest_key = await refused(
            client, "trigger_run", family_slug="gate", idempotency_key="k" * 255
        )
        assert longest_key["code"] == "workflow.not_found"  # the key was taken
        nested = await refused(client, "route", routable={"id": "x", "kind": 7})
        assert nested["details"]["path"] == "$.routable.kind"
        assert nested["details"]["argument"] == "routable"
        too_big_int = await refused(client, "send_event", name="n", data={"n": 2**70})
        assert too_big_int["code"] == "request.invalid"
        assert too_big_int["details"]["argument"] == "data"
        assert too_big_int["details"]["path"] == "$.data.n"
        nul = await refused(client, "get_run", run_id="r\x00")
        assert nul["details"] == {
            "argument": "run_id",
            "path": "$.run_id",
            "reason": "string contains a NUL character",
        }
        assert nul["message"].startswith("invalid argument `run_id`")
        deepest: object = 1
        for _ in range(63):  # 64 levels with the arguments' own object: the limit
            deepest = [deepest]
        too_deep = await refused(client, "send_event", name="n", data=[deepest])
        assert too_deep["details"] == {
            "argument": "data",
            "path": "$.data",
            "reason": "nested more than 64 levels deep",
        }
        assert (await call(client, "send_event", name="n", data=deepest))["name"] == "n"
        unknown_tool = await refused(client, "drop_tables")
        assert unknown_tool["code"] == "request.invalid"
        assert "list_workflows" in unknown_tool["details"]["tools"]

        huge = "x" * (2 * 1024 * 1024)
        with pytest.raises(MCPError) as refusal:
            await client.call_tool("send_event", {"name": "big", "data": huge})
        assert "request.too_large" in str(refusal.value)
        assert refusal.value.error.data["details"] == {"max_body_bytes": 1024 * 1024}
        # Still serving, on the same client.
        assert len((await client.list_tools()).tools) == len(TOOLS)
        assert await call(client, "list_workflows") == {"items": []}


def test_a_bad_resource_parameter_is_refused_naming_it(server: ServerProcess) -> None:
    """A version that is no 64-bit integer from 1 up, or a NUL in any parameter, is
    `request.invalid` naming the parameter on both backends, as REST's path
    parameters are (named as the URI template names them); nothing reaches the store,
    which cannot look either up."""
    server.start()
    asyncio.run(_bad_resource_parameters(server))
    assert httpx.get(f"{server.url}/readyz").status_code == 200


async def _bad_resource_parameters(server: ServerProcess) -> None:
    async with rest(server) as http, connect(server) as client:
        for uri, parameter, rest_path in (
            ("ductor://workflows/gate/versions/9999999999999999999", "version", None),
            ("ductor://workflows/gate/versions/0", "version", "/v1/workflows/gate/versions/0"),
            ("ductor://workflows/gate/versions/1.5", "version", "/v1/workflows/gate/versions/1.5"),
            ("ductor://workflows/ga\x00te", "family_slug", "/v1/workflows/ga%00te"),
            ("ductor://workflows/ga\x00te/versions/1", "family_slug", None),
            ("ductor://runs/run\x00x/history", "run_id", "/v1/runs/run%00x/history"),
        ):
            with pytest.raises(MCPError) as refusal:
                await client.read_resource(uri)
            data = refusal.value.error.data
            assert data["code"] == "request.invalid", (uri, data)
            assert data["details"]["path"] == parameter, (uri, data)
            assert refusal.value.error.message.startswith("request.invalid: "), uri
            if rest_path is not None:
                answer = await http.get(rest_path)
                assert answer.status_code == 422, (rest_path, answer.text)
                assert answer.json()["code"] == "request.invalid"
        # Still serving, on the same client.
        assert (await client.list_resources()).resources == []


def test_an_argument_nested_past_what_json_rpc_parses_is_still_a_tool_error(
    sqlite_server: ServerProcess,
) -> None:
    """However deep an argument nests, however long an integer in it (here far past the
    ~200 levels and ~4,300 digits the MCP library's JSON parsers take), the call is
    the tool error `request.invalid` naming it, as at 65 levels or 2^64: not a
    JSON-RPC parse error."""
    sqlite_server.start()
    asyncio.run(_far_too_deep(sqlite_server))


MODERN = "2026-07-28"
MODERN_META = (
    '{"io.modelcontextprotocol/protocolVersion": "2026-07-28", '
    '"io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"}, '
    '"io.modelcontextprotocol/clientCapabilities": {}}'
)


async def _call_as_text(
    server: ServerProcess, arguments: str, *, protocol: str = "2025-11-25"
) -> Any:
    """The result of `send_event` called with `arguments` (JSON text) in a message
    written by hand, as a client of `protocol` sends it."""
    meta = f', "_meta": {MODERN_META}' if protocol == MODERN else ""
    message = (
        '{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": '
        '{"name": "send_event", "arguments": ' + arguments + meta + "}}"
    )
    headers = {
        "Authorization": f"Bearer {server.api_key}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": protocol,
    }
    if protocol == MODERN:
        headers |= {"Mcp-Method": "tools/call", "Mcp-Name": "send_event"}
    async with httpx.AsyncClient(timeout=60) as http:
        answer = await http.post(f"{server.url}/mcp", content=message, headers=headers)
    assert answer.status_code == 200, answer.text[:500]
    assert answer.json()["id"] == 7
    return answer.json()["result"]


async def _far_too_deep(server: ServerProcess) -> None:
    async with connect(server) as client:
        deepest: object = 1
        for _ in range(250):
            deepest = [deepest]
        body = await refused(client, "send_event", name="n", data=deepest)
        assert body["details"] == {
            "argument": "data",
            "path": "$.data",
            "reason": "nested more than 64 levels deep",
        }
        # Deeper or longer than the client itself can write: sent as text.
        levels = 100_000
        for data, where, reason in (
            ("[" * levels + "]" * levels, "$.data", "nested more than 64 levels deep"),
            ('{"n": -' + "9" * 5_000 + "}", "$.data.n", "integer does not fit in 64 bits"),
        ):
            result = await _call_as_text(server, '{"name": "n", "data": ' + data + "}")
            assert result["isError"] is True
            assert result["structuredContent"]["details"] == {
                "argument": "data",
                "path": where,
                "reason": reason,
            }
        # Digits in a string, or a long fraction, are no integer.
        text = '{"name": "n", "data": ["' + "9" * 5_000 + '", 0.' + "5" * 5_000 + "]}"
        assert (await _call_as_text(server, text))["structuredContent"]["name"] == "n"
        # The same in a nested body, an object this time.
        routable: dict[str, Any] = {"id": "x", "kind": "t", "attributes": {}}
        inner = routable["attributes"]
        for _ in range(230):
            inner["a"] = {}
            inner = inner["a"]
        body = await refused(client, "route", routable=routable)
        assert body["code"] == "request.invalid"
        assert body["details"]["argument"] == "routable"
        # A string full of brackets is no nesting at all.
        assert (await call(client, "send_event", name="n", data="[{" * 1000))["name"] == "n"
        assert await call(client, "list_workflows") == {"items": []}


def test_a_name_as_long_as_rest_takes_is_taken_by_the_tools(sqlite_server: ServerProcess) -> None:
    """REST keeps names and ids of up to 256 characters (an account code, an event's
    name and id, a signal's name, a worker): a tool takes each as long, so what REST
    made a tool reaches; one character more is refused by both."""
    sqlite_server.start()
    asyncio.run(_longest_names(sqlite_server))


async def _longest_names(server: ServerProcess) -> None:
    longest, too_long = "a" * 256, "a" * 257
    code = "wallet:" + "a" * 249
    async with rest(server) as http, connect(server) as client:
        opened = await http.post(
            "/v1/accounts", json={"code": code, "currency": "USD", "kind": "liability"}
        )
        assert opened.is_success, opened.text
        assert (await call(client, "get_account", code=code))["code"] == code
        sent = await call(client, "send_event", name=longest, id=longest)
        assert (sent["name"], sent["id"]) == (longest, longest)
        assert (await http.post("/v1/events", json={"name": too_long})).status_code == 422
        refusal = await refused(client, "send_event", name=too_long)
        assert refusal["code"] == "request.invalid"
        assert refusal["details"]["argument"] == "name"
        await call(client, "publish_workflow", definition=GATE)
        run = await call(client, "trigger_run", family_slug="gate")
        signal = await call(client, "send_signal", run_id=run["id"], name=longest, id=longest)
        assert (signal["name"], signal["signal_id"]) == (longest, longest)
        assert await call(client, "list_assignments", worker=longest) == {"items": []}


def test_a_number_or_string_json_cannot_hold_is_refused_naming_it(
    sqlite_server: ServerProcess,
) -> None:
    """NaN, an infinity (1e999 too) or a lone surrogate, which the MCP library's
    parsers let through and REST refuses, is `request.invalid` at its path; it was
    stored as null (the numbers) or answered `internal` (the surrogate)."""
    sqlite_server.start()
    asyncio.run(_not_json(sqlite_server))


async def _not_json(server: ServerProcess) -> None:
    # (The `mcp` client itself writes NaN as null: these messages are written by hand.)
    async with connect(server) as client:
        for protocol in ("2025-11-25", MODERN):
            for text, where in (
                ('{"x": NaN}', "$.data.x"),
                ('{"x": -Infinity}', "$.data.x"),
                ('{"x": 1e999}', "$.data.x"),
            ):
                arguments = '{"name": "n", "data": ' + text + "}"
                result = await _call_as_text(server, arguments, protocol=protocol)
                assert result["isError"] is True, (protocol, text, result)
                details = result["structuredContent"]["details"]
                assert (details["argument"], details["path"]) == ("data", where), details
        for text, where in (
            ('{"name": "n", "data": ["\\ud800"]}', "$.data[0]"),
            ('{"name": "n", "data": {"\\udfff": 1}}', "$.data"),
            ('{"name": "n\\ud800"}', "$.name"),
        ):
            result = await _call_as_text(server, text, protocol=MODERN)
            assert result["isError"] is True, (text, result)
            body = result["structuredContent"]
            assert body["code"] == "request.invalid", (text, body)
            assert body["details"]["path"] == where, (text, body)
        # A finite float and a null are JSON like any other.
        sent = await call(client, "send_event", name="n", data={"x": 1.5, "y": None})
        assert sent["name"] == "n"


def test_a_path_under_mcp_is_no_route(sqlite_server: ServerProcess) -> None:
    """The MCP server answers at /mcp (and /mcp/) only: a path under it is answered
    as REST answers an unknown route, before the key is checked, in the shape of the
    endpoint's other refusals."""
    sqlite_server.start()
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {
        "Authorization": f"Bearer {sqlite_server.api_key}",
        "Accept": "application/json, text/event-stream",
    }
    for path in ("/mcp", "/mcp/"):
        answer = httpx.post(f"{sqlite_server.url}{path}", json=message, headers=headers, timeout=60)
        assert answer.status_code == 200, (path, answer.text)
        assert len(answer.json()["result"]["tools"]) == len(TOOLS)
    for path, key in (("/mcp/tools", headers), ("/mcp/x/y", headers), ("/mcp/x", {})):
        answer = httpx.post(f"{sqlite_server.url}{path}", json=message, headers=key, timeout=60)
        assert answer.status_code == 404, (path, answer.text)
        assert answer.json()["error"]["data"] == {
            "code": "route.not_found",
            "message": "no such route",
            "details": {"method": "POST", "path": path},
        }
    # A WebSocket handshake is refused there as on every other path (it was a 500).
    ws_url = sqlite_server.url.replace("http://", "ws://")

    async def handshake(path: str) -> int:
        try:
            async with websockets.connect(f"{ws_url}{path}", open_timeout=60):
                return 101
        except websockets.InvalidStatus as refused:
            return refused.response.status_code

    for path in ("/mcp", "/mcp/", "/mcp/x", "/v1/runs"):
        assert asyncio.run(handshake(path)) == 403, path


def test_a_batch_or_a_request_with_a_bad_id_is_refused_not_left_unanswered(
    sqlite_server: ServerProcess,
) -> None:
    """A JSON-RPC batch, another value than an object, a message without `"jsonrpc":
    "2.0"`, a method that is no string, params that are no object, and a request
    whose id is neither a string nor an integer, are refused with a 400 saying what
    and where; the request is not taken for a notification (answered 202 with
    nothing, its tool never run)."""
    sqlite_server.start()
    headers = {
        "Authorization": f"Bearer {sqlite_server.api_key}",
        "Accept": "application/json, text/event-stream",
    }
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    for batch in ([ping, {**ping, "id": 2}], []):
        answer = httpx.post(f"{sqlite_server.url}/mcp", json=batch, headers=headers, timeout=60)
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert (error["code"], error["data"]["code"]) == (-32600, "request.invalid")
        assert "batch" in error["data"]["message"]
        assert error["data"]["details"]["path"] == "$"
    for message, path, said in (
        ("hello", "$", "not string"),
        (None, "$", "not null"),
        ({"id": 1, "method": "ping"}, "$.jsonrpc", '"2.0"'),
        ({"jsonrpc": "1.0", "id": 1, "method": "ping"}, "$.jsonrpc", '"2.0"'),
        ({"jsonrpc": "2.0", "id": 1, "method": 5}, "$.method", "not integer"),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": [1]}, "$.params", "array"),
    ):
        raw = json.dumps(message).encode()
        typed = {**headers, "Content-Type": "application/json"}
        answer = httpx.post(f"{sqlite_server.url}/mcp", content=raw, headers=typed, timeout=60)
        assert answer.status_code == 400, (message, answer.text)
        error = answer.json()["error"]
        assert (error["code"], error["data"]["code"]) == (-32600, "request.invalid")
        assert error["data"]["details"]["path"] == path, (message, error)
        assert said in error["data"]["message"], (message, error)
    send = {"name": "send_event", "arguments": {"name": "bad-id", "id": "evt-bad-id"}}
    for request_id, kind in (({"a": 1}, "object"), (None, "null"), (1.5, "number"), ([1], "array")):
        message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": send}
        answer = httpx.post(f"{sqlite_server.url}/mcp", json=message, headers=headers, timeout=60)
        assert answer.status_code == 400, (request_id, answer.text)
        body = answer.json()
        assert body["id"] is None
        assert (body["error"]["code"], body["error"]["data"]["code"]) == (-32600, "request.invalid")
        assert body["error"]["data"]["details"]["path"] == "$.id"
        assert body["error"]["data"]["message"].endswith(f"not {kind}")
    # None of them ran the tool: the event is new to a well-formed call.
    message = {"jsonrpc": "2.0", "id": "ok", "method": "tools/call", "params": send}
    answer = httpx.post(f"{sqlite_server.url}/mcp", json=message, headers=headers, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"]["structuredContent"]["duplicate"] is False
    # A notification is still accepted without an answer.
    notification = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    answer = httpx.post(f"{sqlite_server.url}/mcp", json=notification, headers=headers, timeout=60)
    assert answer.status_code == 202, answer.text


def test_params_a_call_or_a_read_cannot_take_are_named(sqlite_server: ServerProcess) -> None:
    """A `tools/call` without params, with a `name` that is not a string or
    `arguments` that are not an object, and a `resources/read` whose `uri` is not a
    string: a JSON-RPC error for the request's id whose data says where."""
    sqlite_server.start()
    headers = {
        "Authorization": f"Bearer {sqlite_server.api_key}",
        "Accept": "application/json, text/event-stream",
    }
    for method, params, path in (
        ("tools/call", None, "$.params"),
        ("tools/call", {"name": 5}, "$.params.name"),
        ("tools/call", {"arguments": {}}, "$.params.name"),
        ("tools/call", {"name": "get_run", "arguments": [1]}, "$.params.arguments"),
        ("tools/call", {"name": "get_run", "arguments": "{}"}, "$.params.arguments"),
        ("resources/read", {"uri": 5}, "$.params.uri"),
    ):
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": 7, "method": method}
        if params is not None:
            message["params"] = params
        answer = httpx.post(f"{sqlite_server.url}/mcp", json=message, headers=headers, timeout=60)
        assert answer.status_code == 200, (params, answer.text)
        body = answer.json()
        assert body["id"] == 7
        assert body["error"]["code"] == -32602
        assert body["error"]["data"]["code"] == "request.invalid"
        assert body["error"]["data"]["details"]["path"] == path, (params, body)
    # Arguments left out or null are no arguments: the tool names what is missing.
    for params in ({"name": "get_run"}, {"name": "get_run", "arguments": None}):
        message = {"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": params}
        answer = httpx.post(f"{sqlite_server.url}/mcp", json=message, headers=headers, timeout=60)
        result = answer.json()["result"]
        assert result["isError"] is True
        assert result["structuredContent"]["details"]["argument"] == "run_id"


def _raw(server: ServerProcess, body: bytes, **headers: str) -> httpx.Response:
    """`body` POSTed to /mcp as written, with the server's key."""
    sent = {
        "Authorization": f"Bearer {server.api_key}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": "2025-11-25",
    }
    return httpx.post(f"{server.url}/mcp", content=body, headers={**sent, **headers}, timeout=60)


def test_a_lone_surrogate_under_a_handshake_version_is_a_parse_error_naming_where(
    sqlite_server: ServerProcess,
) -> None:
    """Under the handshake versions the protocol's parser refuses a message holding a
    lone surrogate before any tool sees it: HTTP 400, JSON-RPC -32700, with the line
    and column; nothing is run."""
    sqlite_server.start()
    message = (
        b'{"jsonrpc": "2.0", "id": 3, "method": "tools/call",\n'
        b' "params": {"name": "send_event", "arguments": {"name": "n\\ud800", "id": "sur"}}}'
    )
    answer = _raw(sqlite_server, message)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == -32700
    assert re.search(r"line 2 column \d+", error["message"]), error
    # Malformed JSON is the same parse error, saying where.
    broken = _raw(sqlite_server, b'{"jsonrpc": "2.0",\n "id": 1,')
    assert broken.status_code == 400
    assert broken.json()["error"]["code"] == -32700
    assert "line 2 column" in broken.json()["error"]["message"]
    # Nothing ran: the event id is new.
    again = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 4,
            "method": "tools/call",
            "params": {"name": "send_event", "arguments": {"name": "n", "id": "sur"}},
        }
    ).encode()
    assert _raw(sqlite_server, again).json()["result"]["structuredContent"]["duplicate"] is False


def test_both_protocol_eras_are_spoken_the_client_picks(sqlite_server: ServerProcess) -> None:
    """`initialize` (up to 2025-11-25) and `server/discover` (2026-07-28) both answer,
    and under either the key sees the same tools."""
    sqlite_server.start()
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"},
        },
    }
    answer = _raw(sqlite_server, json.dumps(initialize).encode())
    assert answer.status_code == 200, answer.text
    result = answer.json()["result"]
    assert result["protocolVersion"] == "2025-11-25"
    assert result["serverInfo"]["name"] == "ductor"
    assert "tools" in result["capabilities"]
    assert "resources" in result["capabilities"]
    meta = json.loads(MODERN_META)
    modern = {"MCP-Protocol-Version": MODERN}
    discover = {"jsonrpc": "2.0", "id": 2, "method": "server/discover", "params": {"_meta": meta}}
    answer = _raw(
        sqlite_server, json.dumps(discover).encode(), **modern, **{"Mcp-Method": "server/discover"}
    )
    assert answer.status_code == 200, answer.text
    result = answer.json()["result"]
    assert MODERN in result["supportedVersions"]
    assert "tools" in result["capabilities"]
    listing = {"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"_meta": meta}}
    answer = _raw(
        sqlite_server, json.dumps(listing).encode(), **modern, **{"Mcp-Method": "tools/list"}
    )
    assert answer.status_code == 200, answer.text
    assert [tool["name"] for tool in answer.json()["result"]["tools"]] == [
        tool["name"]
        for tool in _raw(
            sqlite_server, b'{"jsonrpc": "2.0", "id": 4, "method": "tools/list"}'
        ).json()["result"]["tools"]
    ]


def test_a_body_over_the_limit_is_a_413_and_a_flood_is_answered(
    sqlite_server: ServerProcess,
) -> None:
    """A body over `DUCTOR_MAX_BODY_BYTES` is refused with 413 in the endpoint's shape,
    declared or streamed; hundreds of concurrent calls are each answered; the server
    goes on answering."""
    sqlite_server.extra_env["DUCTOR_MAX_BODY_BYTES"] = "65536"
    sqlite_server.start()
    big = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "send_event", "arguments": {"name": "n", "data": "x" * 70_000}},
        }
    ).encode()
    answer = _raw(sqlite_server, big)
    assert answer.status_code == 413, answer.text
    assert answer.json()["error"]["data"] == {
        "code": "request.too_large",
        "message": "request body is larger than the limit",
        "details": {"max_body_bytes": 65536},
    }

    def chunks() -> Iterator[bytes]:  # no Content-Length: read until over the limit
        for start in range(0, len(big), 8192):
            yield big[start : start + 8192]

    headers = {
        "Authorization": f"Bearer {sqlite_server.api_key}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    streamed = httpx.post(f"{sqlite_server.url}/mcp", content=chunks(), headers=headers, timeout=60)
    assert streamed.status_code == 413, streamed.text
    assert streamed.json()["error"]["data"]["code"] == "request.too_large"

    async def flood() -> list[int]:
        message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
        async with httpx.AsyncClient(timeout=120) as http:
            answers = await asyncio.gather(
                *(
                    http.post(
                        f"{sqlite_server.url}/mcp",
                        json={
                            **message,
                            "id": n,
                            "params": {"name": "send_event", "arguments": {"name": f"n{n}"}},
                        },
                        headers=headers,
                    )
                    for n in range(200)
                )
            )
        for n, answered in enumerate(answers):
            assert answered.json()["id"] == n
            assert answered.json()["result"]["structuredContent"]["name"] == f"n{n}"
        return [answered.status_code for answered in answers]

    assert set(asyncio.run(flood())) == {200}
    assert httpx.get(f"{sqlite_server.url}/readyz", timeout=10).status_code == 200
    assert _raw(sqlite_server, b'{"jsonrpc": "2.0", "id": 9, "method": "ping"}').json() == {
        "jsonrpc": "2.0",
        "id": 9,
        "result": {},
    }


def test_a_body_is_read_as_json_whatever_its_content_type(sqlite_server: ServerProcess) -> None:
    """As REST reads a body as JSON whatever its Content-Type, so does /mcp: a message
    sent without one (`curl -d`), or as text, is answered, not refused in plain text."""
    sqlite_server.start()
    ping = b'{"jsonrpc": "2.0", "id": 5, "method": "ping"}'
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "", "nonsense"):
        answer = _raw(sqlite_server, ping, **{"Content-Type": content_type})
        assert answer.status_code == 200, (content_type, answer.text)
        assert answer.json() == {"jsonrpc": "2.0", "id": 5, "result": {}}
    headers = {
        "Authorization": f"Bearer {sqlite_server.api_key}",
        "Accept": "application/json, text/event-stream",
    }
    listing = b'{"jsonrpc": "2.0", "id": 6, "method": "tools/list"}'
    answer = httpx.post(f"{sqlite_server.url}/mcp", content=listing, headers=headers, timeout=60)
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["result"]["tools"]) == len(TOOLS)
    # Malformed JSON is still the parse error, whatever the type.
    broken = _raw(sqlite_server, b"{", **{"Content-Type": "text/plain"})
    assert broken.status_code == 400
    assert broken.json()["error"]["code"] == -32700
