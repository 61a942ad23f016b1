"""Twenty simultaneous retries with one Idempotency-Key, through a real server process
on SQLite and on Postgres: exactly one effect each, and twenty equal answers (one
fresh, nineteen marked replayed)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest

from ductor_server.pytest_plugin import create_database, drop_database
from ductor_server.testing import ServedProcess, serve_process

RETRIES = 20
TENANTS = ("t-route", "t-runs", "t-events", "t-workflows", "t-signals")


class Server:
    """A `ductor serve` process and a key per tenant; `count` reads its database."""

    def __init__(self, served: ServedProcess) -> None:
        self.url = served.url
        self.target = served.target
        self.keys = served.keys

    def count(self, sql: str, *params: Any) -> int:
        """The first column of the first row of `sql` (`%s` placeholders)."""
        if self.target.startswith("postgresql://"):
            with psycopg.connect(self.target) as conn:
                row = conn.execute(sql, params).fetchone()
        else:
            conn = sqlite3.connect(self.target)
            try:
                row = conn.execute(sql.replace("%s", "?"), params).fetchone()
            finally:
                conn.close()
        assert row is not None
        return int(row[0] or 0)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    data_dir = tmp_path_factory.mktemp("idem-" + request.param)
    env = {"DUCTOR_POLL_INTERVAL": "0.05"}
    database_url = None
    if request.param == "postgres":
        database_url = create_database(request.getfixturevalue("_postgres_admin"))
    try:
        with serve_process(data_dir, tenants=TENANTS, database_url=database_url, env=env) as served:
            yield Server(served)
    finally:
        if database_url is not None:
            drop_database(database_url)


class Client:
    """One tenant's view of the server."""

    def __init__(self, server: Server, tenant: str) -> None:
        self.server = server
        self.tenant = tenant
        self.headers = {"Authorization": f"Bearer {server.keys[tenant]}"}

    async def call(self, method: str, path: str, body: Any = None, key: str | None = None) -> Any:
        headers = dict(self.headers)
        if key is not None:
            headers["Idempotency-Key"] = key
        async with httpx.AsyncClient(base_url=self.server.url, timeout=30) as http:
            return await http.request(method, path, json=body, headers=headers)

    async def ok(self, method: str, path: str, body: Any = None) -> Any:
        response = await self.call(method, path, body)
        assert response.status_code in (200, 201, 202), response.text
        return response.json()

    async def storm(self, path: str, body: Any, key: str) -> list[httpx.Response]:
        """RETRIES identical requests at once, each on its own connection."""
        return list(
            await asyncio.gather(*(self.call("POST", path, body, key) for _ in range(RETRIES)))
        )


def assert_one_answer(responses: list[httpx.Response], status: int) -> dict[str, Any]:
    """Every answer has `status` and the same body; exactly one was not replayed."""
    assert [r.status_code for r in responses] == [status] * RETRIES, [r.text for r in responses]
    bodies = [json.loads(r.content) for r in responses]
    assert all(b == bodies[0] for b in bodies), bodies
    replayed = [r.headers.get("Idempotency-Replayed") == "true" for r in responses]
    assert replayed.count(False) == 1, replayed
    first: dict[str, Any] = bodies[0]
    return first


HELLO: dict[str, Any] = {
    "family_slug": "hello",
    "steps": [{"ref": "pause", "type": "STEP_TYPE_WAIT", "args": {"duration": "1h"}}],
    "edges": [],
}


async def test_route_commits_one_decision_and_one_reservation(server: Server) -> None:
    api = Client(server, "t-route")
    await api.ok("POST", "/v1/workers", {"id": "w1", "capacity": {"leads": 100}})
    await api.ok(
        "POST", "/v1/pools", {"id": "p1", "channel": "leads", "members": [{"worker": "w1"}]}
    )
    await api.ok("POST", "/v1/rules", {"kinds": {"lead": {}}, "default_pool": "p1"})
    responses = await api.storm("/v1/route", {"id": "lead-1", "kind": "lead"}, "route-1")
    where = "WHERE tenant_id = %s"
    assert server.count(f"SELECT count(*) FROM routing_decisions {where}", api.tenant) == 1
    assert server.count(f"SELECT count(*) FROM routing_assignments {where}", api.tenant) == 1
    assert server.count(f"SELECT sum(value) FROM routing_counters {where}", api.tenant) == 1
    decision = assert_one_answer(responses, 201)
    assert decision["worker"] == "w1"


async def test_trigger_starts_one_run(server: Server) -> None:
    api = Client(server, "t-runs")
    await api.ok("POST", "/v1/workflows", HELLO)
    responses = await api.storm("/v1/runs", {"family_slug": "hello", "input": {"n": 1}}, "run-1")
    assert server.count("SELECT count(*) FROM runs WHERE tenant_id = %s", api.tenant) == 1
    run = assert_one_answer(responses, 201)
    assert run["idempotency_key"] == "run-1"


async def test_an_event_is_stored_once_and_starts_one_run(server: Server) -> None:
    api = Client(server, "t-events")
    await api.ok("POST", "/v1/workflows", {**HELLO, "triggers": [{"event": "order.created"}]})
    responses = await api.storm("/v1/events", {"name": "order.created", "data": {"id": 7}}, "evt-1")
    assert server.count("SELECT count(*) FROM events WHERE tenant_id = %s", api.tenant) == 1
    assert server.count("SELECT count(*) FROM runs WHERE tenant_id = %s", api.tenant) == 1
    accepted = assert_one_answer(responses, 202)
    assert (accepted["id"], accepted["duplicate"]) == ("evt-1", False)
    assert len(accepted["runs_started"]) == 1


async def test_concurrent_events_with_one_id_store_one_and_refuse_other_content(
    server: Server,
) -> None:
    api = Client(server, "t-events")
    bodies = [
        {"name": "order.paid", "id": "evt-race", "data": {"n": index % 2}}
        for index in range(RETRIES)
    ]
    responses = await asyncio.gather(*(api.call("POST", "/v1/events", body) for body in bodies))
    where = "WHERE tenant_id = %s AND id = 'evt-race'"
    assert server.count(f"SELECT count(*) FROM events {where}", api.tenant) == 1
    accepted = [(b, r) for b, r in zip(bodies, responses, strict=True) if r.status_code == 202]
    refused = [(b, r) for b, r in zip(bodies, responses, strict=True) if r.status_code != 202]
    # One content won: all of its sends are answered, one of them fresh; the other
    # content's sends are all refused.
    assert len(accepted) == len(refused) == RETRIES // 2, [r.text for r in responses]
    assert len({json.dumps(b["data"]) for b, _ in accepted}) == 1
    assert [r.json()["duplicate"] for _, r in accepted].count(False) == 1
    assert {(r.status_code, r.json()["code"]) for _, r in refused} == {(422, "event.invalid")}


async def test_publish_creates_one_version_and_says_so_every_time(server: Server) -> None:
    api = Client(server, "t-workflows")
    responses = await api.storm("/v1/workflows", HELLO, "wf-1")
    versions = "SELECT count(*) FROM workflow_versions WHERE tenant_id = %s"
    assert server.count(versions, api.tenant) == 1
    published = assert_one_answer(responses, 201)
    assert (published["version"], published["created"]) == (1, True)


async def test_a_signal_is_delivered_once(server: Server) -> None:
    api = Client(server, "t-signals")
    approval = {
        "family_slug": "approval",
        "steps": [
            {"ref": "approve", "type": "STEP_TYPE_WAIT_FOR_SIGNAL", "args": {"signal": "approve"}},
            {"ref": "ship", "type": "STEP_TYPE_WAIT_FOR_SIGNAL", "args": {"signal": "ship"}},
        ],
        "edges": [{"source_ref": "approve", "target_ref": "ship"}],
    }
    await api.ok("POST", "/v1/workflows", approval)
    run = await api.ok("POST", "/v1/runs", {"family_slug": "approval"})
    path = f"/v1/runs/{run['id']}/signals/approve"
    responses = await api.storm(path, {"payload": {"by": "ada"}}, "sig-1")
    accepted = assert_one_answer(responses, 202)
    assert (accepted["signal_id"], accepted["duplicate"]) == ("sig-1", False)
    # Wait until the coordinator has taken every input of the run, then count.
    deadline = asyncio.get_running_loop().time() + 20
    inbox = "SELECT count(*) FROM run_inbox WHERE tenant_id = %s AND run_id = %s"
    while True:
        view = await api.ok("GET", f"/v1/runs/{run['id']}")
        approved = view["steps"][0]["status"] == "STEP_STATUS_SUCCEEDED"
        if approved and server.count(inbox, api.tenant, run["id"]) == 0:
            break
        assert asyncio.get_running_loop().time() < deadline, view
        await asyncio.sleep(0.05)
    history = await api.ok("GET", f"/v1/runs/{run['id']}/history")
    assert [h["kind"] for h in history].count("signal.received") == 1
    assert view["steps"][0]["output"] == {"by": "ada"}
