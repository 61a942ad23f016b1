"""The chat agent when its server is killed mid-turn: a real `ductor dev` process
(SQLite) and a real `ductor serve` process (Postgres), whose model calls go through
the inference proxy to the scripted upstream (tests/ai_upstream.py), are SIGKILLed
while a model call of a turn is in flight, and started again on the same data.

- Killed after a mutating tool call ran (the model was answering its result): the
  stored turn is whole (the answer with its executed call and result), the same
  request with the same Idempotency-Key resumes the turn and completes it, the run
  it started exists once (keyed `agent:<call id>`), and each model call that
  answered is recorded once, in the turn's `ai_request_ids` and cost.
- Killed during a turn's first model call: the same request resumes the turn;
  or a different message goes on once the dead turn's lease has passed, and the
  left turn ends `interrupted` (its own key then answers it as it stands and
  starts nothing). While the turn's process lived, it held the conversation
  well past one lease (another message was `409 agent.conversation_busy`).

Bounded in time, loopback only.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from ductor_server.connections import new_secret_key
from ductor_server.pytest_plugin import create_database, drop_database

from .ai_upstream import UPSTREAM_KEY, ScriptedUpstream
from .conftest import ServerProcess

# Kills: these run alone, after the parallel part of the suite.
pytestmark = [pytest.mark.serial, pytest.mark.timeout(180)]

CALL_COST = 100 * 1 + 20 * 2  # the operator's usage at 1 and 2 micros per token

LEASE = 4.0
"""The server's DUCTOR_LEASE_SECONDS: how long a dead process's turn holds on."""

HELLO: dict[str, Any] = {
    "family_slug": "hello",
    "steps": [
        {
            "ref": "hi",
            "type": "STEP_TYPE_DATAFLOW",
            "args": {"operation": "project", "project": {"greeting": '"hi"'}},
        }
    ],
    "edges": [],
}


def _ok(answer: httpx.Response, status: int = 201) -> Any:
    assert answer.status_code == status, answer.text
    return answer.json()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def served(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ServerProcess, ScriptedUpstream]]:
    """A server of the backend with the upstream as its default connection, the
    operator model priced and a `hello` workflow; stopped (and its database
    dropped) after the module's tests."""
    admin: str | None = None
    url: str | None = None
    if request.param == "postgres":
        admin = request.getfixturevalue("_postgres_admin")
        url = create_database(admin)
    env = {"DUCTOR_LEASE_SECONDS": f"{LEASE:g}"}
    if url:  # `ductor dev` makes its own secret key; `serve` is given one
        env["DUCTOR_SECRET_KEYS"] = new_secret_key("k1")
    upstream = ScriptedUpstream().start()
    server = ServerProcess(
        data_dir=tmp_path_factory.mktemp(f"agent-kill-{request.param}") / "data",
        database_url=url,
        env=env,
    )
    try:
        server.start()
        with server.client() as http:
            connection = {
                "name": "llm",
                "provider": "openai",
                "config": {"base_url": upstream.url},
                "secrets": {"api_key": UPSTREAM_KEY},
            }
            _ok(http.post("/v1/connections", json=connection))
            _ok(http.put("/v1/ai/settings", json={"default_connection": "llm"}), 200)
            price = {"input_per_million": 1_000_000, "output_per_million": 2_000_000}
            _ok(http.put("/v1/ai/prices/operator", json=price))
            _ok(http.post("/v1/workflows", json=HELLO))
        yield server, upstream
    finally:
        server.stop()
        upstream.stop()
        if url:
            drop_database(url, admin)


def _post(server: ServerProcess, path: str, body: Any, headers: dict[str, str]) -> httpx.Response:
    with server.client() as http:
        return http.post(path, json=body, headers=headers, timeout=60)


def _killed_mid_call(
    server: ServerProcess,
    upstream: ScriptedUpstream,
    when: str,
    path: str,
    body: Any,
    headers: dict[str, str],
    while_held: Callable[[], None] | None = None,
) -> None:
    """POST `body` to `path`, SIGKILL the server while the model call `when` names
    (`any`: the turn's first, `tool`: the one answering tool results) is in flight
    (after `while_held`, if given), and start the server again on the same data dir."""
    upstream.hold(when)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        request = pool.submit(_post, server, path, body, headers)
        arrived = upstream.held.wait(30)
        if not arrived:
            upstream.let_go()
        assert arrived, f"the model call never came\n{server.log()[-4000:]}"
        try:
            if while_held is not None:
                while_held()
        finally:
            server.kill9()
        with pytest.raises(httpx.TransportError):
            request.result(timeout=30)
    upstream.let_go()
    server.start()


def _runs(http: httpx.Client) -> list[tuple[str, str | None]]:
    """(id, idempotency key) of every run of `hello`."""
    page = _ok(http.get("/v1/runs", params={"family_slug": "hello", "limit": 500}), 200)
    runs = [_ok(http.get(f"/v1/runs/{r['id']}"), 200) for r in page["items"]]
    return sorted((r["id"], r["idempotency_key"]) for r in runs)


def _recorded_once(http: httpx.Client) -> None:
    """Every agent model call recorded is in one turn's `ai_request_ids`, once, and
    each turn's and conversation's cost is the sum of its records'."""
    records = _ok(http.get("/v1/ai/requests", params={"limit": 500}), 200)["items"]
    costs = {r["id"]: r["cost_micros"] for r in records if r["source"] == "agent"}
    listed: list[str] = []
    for summary in _ok(http.get("/v1/agent/conversations"), 200)["items"]:
        found = _ok(http.get(f"/v1/agent/conversations/{summary['id']}"), 200)
        for turn in found["turns"]:
            listed += turn["ai_request_ids"]
            assert turn["model_calls"] == len(turn["ai_request_ids"]), turn
            assert turn["cost_micros"] == sum(costs[i] for i in turn["ai_request_ids"]), turn
        assert found["cost_micros"] == sum(t["cost_micros"] for t in found["turns"])
    assert sorted(listed) == sorted(costs)


def test_a_turn_killed_after_a_mutating_call_resumes_and_runs_it_once(
    served: tuple[ServerProcess, ScriptedUpstream],
) -> None:
    server, upstream = served
    key = {"Idempotency-Key": "start-hello-killed"}
    body = {"model": "operator", "message": "start hello", "allow_mutations": True}
    asked = len(upstream.bodies("operator"))
    _killed_mid_call(server, upstream, "tool", "/v1/agent/conversations", body, key)

    with server.client() as http:
        # What the killed turn stored is whole: the message, the model's answer with
        # its call, executed, and its result; the run it started exists once.
        conversation = _ok(http.get("/v1/agent/conversations"), 200)["items"][0]["id"]
        found = _ok(http.get(f"/v1/agent/conversations/{conversation}"), 200)
        [turn] = found["turns"]
        assert (turn["status"], turn["model_calls"], turn["cost_micros"]) == (
            "running",
            1,
            CALL_COST,
        ), turn
        [first] = turn["ai_request_ids"]
        asking, answering = found["messages"]
        assert (asking["role"], asking["content"], asking["tool_calls"]) == (
            "user",
            "start hello",
            [],
        )
        assert (answering["role"], answering["ai_request_id"]) == ("assistant", first)
        [call] = answering["tool_calls"]
        assert (call["tool"], call["status"], call["approval"]) == (
            "trigger_run",
            "executed",
            "allowed",
        ), call
        run_id = call["result"]["id"]
        assert _runs(http) == [(run_id, f"agent:{call['id']}")]

        # The same request again resumes the turn from there and completes it.
        resumed = http.post("/v1/agent/conversations", json=body, headers=key, timeout=60)
        answer = _ok(resumed)
        assert resumed.headers.get("Idempotency-Replayed") is None
        assert answer["conversation"]["id"] == conversation
        turn = answer["turn"]
        assert (turn["turn"], turn["status"], turn["answer"]) == (
            1,
            "completed",
            f"started {run_id}",
        )
        assert turn["model_calls"] == 2
        assert turn["ai_request_ids"][0] == first
        assert len(set(turn["ai_request_ids"])) == 2
        records = [_ok(http.get(f"/v1/ai/requests/{i}"), 200) for i in turn["ai_request_ids"]]
        assert [(r["source"], r["status"]) for r in records] == [("agent", "ok")] * 2
        assert turn["cost_micros"] == sum(r["cost_micros"] for r in records) == 2 * CALL_COST
        assert [(c["id"], c["status"]) for c in answer["turn"]["messages"][1]["tool_calls"]] == [
            (call["id"], "executed")
        ]
        assert _runs(http) == [(run_id, f"agent:{call['id']}")]
        # The model was asked three times: the killed call (unrecorded: its server
        # died before the answer) and its repeat were asked the same.
        bodies = upstream.bodies("operator")[asked:]
        assert len(bodies) == 3
        assert bodies[1]["messages"] == bodies[2]["messages"]

        # Once more: the completed turn is replayed, nothing runs again.
        replayed = http.post("/v1/agent/conversations", json=body, headers=key, timeout=60)
        assert replayed.headers["Idempotency-Replayed"] == "true"
        assert _ok(replayed)["turn"] == turn
        assert len(upstream.bodies("operator")) == asked + 3

        # The conversation goes on.
        later = _ok(
            http.post(
                f"/v1/agent/conversations/{conversation}/messages",
                json={"content": "thanks"},
                timeout=60,
            )
        )["turn"]
        assert (later["turn"], later["status"], later["answer"]) == (2, "completed", "echo: thanks")
        assert _runs(http) == [(run_id, f"agent:{call['id']}")]
        _recorded_once(http)


def test_a_turn_killed_in_its_first_model_call_resumes_with_its_key(
    served: tuple[ServerProcess, ScriptedUpstream],
) -> None:
    server, upstream = served
    with server.client() as http:
        conversation = _ok(http.post("/v1/agent/conversations", json={"model": "operator"}))[
            "conversation"
        ]["id"]
        runs = _runs(http)
    key = {"Idempotency-Key": "start-hello-resumed"}
    body = {"content": "start hello", "allow_mutations": True}
    path = f"/v1/agent/conversations/{conversation}/messages"
    _killed_mid_call(server, upstream, "any", path, body, key)
    asked = len(upstream.bodies("operator"))

    with server.client() as http:
        found = _ok(http.get(f"/v1/agent/conversations/{conversation}"), 200)
        [turn] = found["turns"]
        assert (turn["status"], turn["model_calls"], turn["ai_request_ids"]) == ("running", 0, [])
        assert _runs(http) == runs

        # The same request resumes the turn: the model is asked again, the call it
        # asks for runs once, and the turn completes with two recorded calls.
        resumed = http.post(path, json=body, headers=key, timeout=60)
        turn = _ok(resumed)["turn"]
        assert resumed.headers.get("Idempotency-Replayed") is None
        assert (turn["turn"], turn["status"], turn["model_calls"]) == (1, "completed", 2)
        [call] = [c for m in turn["messages"] for c in m["tool_calls"]]
        assert (call["tool"], call["status"]) == ("trigger_run", "executed")
        assert turn["answer"] == f"started {call['result']['id']}"
        assert _runs(http) == sorted([*runs, (call["result"]["id"], f"agent:{call['id']}")])
        assert turn["cost_micros"] == 2 * CALL_COST
        assert len(upstream.bodies("operator")) == asked + 2
        _recorded_once(http)


def test_a_turn_killed_in_its_first_model_call_is_interrupted_by_the_next_message(
    served: tuple[ServerProcess, ScriptedUpstream],
) -> None:
    server, upstream = served
    with server.client() as http:
        conversation = _ok(http.post("/v1/agent/conversations", json={"model": "operator"}))[
            "conversation"
        ]["id"]
        runs = _runs(http)
    key = {"Idempotency-Key": "start-hello-unanswered"}
    body = {"content": "start hello", "allow_mutations": True}
    path = f"/v1/agent/conversations/{conversation}/messages"

    def busy() -> None:
        # While its loop lives, a turn holds the conversation past many leases (its
        # process renews the lease during the model call).
        time.sleep(1.5 * LEASE)
        with server.client() as http:
            refused = http.post(path, json={"content": "hello there"})
            assert refused.status_code == 409, refused.text
            assert refused.json()["code"] == "agent.conversation_busy"
            found = _ok(http.get(f"/v1/agent/conversations/{conversation}"), 200)
            assert found["status"] == "running"

    _killed_mid_call(server, upstream, "any", path, body, key, busy)
    asked = len(upstream.bodies("operator"))

    with server.client() as http:
        # Stored: the turn, running, with no model call, and the message; nothing else.
        found = _ok(http.get(f"/v1/agent/conversations/{conversation}"), 200)
        [turn] = found["turns"]
        assert (turn["status"], turn["model_calls"], turn["ai_request_ids"]) == ("running", 0, [])
        assert [(m["role"], m["content"], m["tool_calls"]) for m in found["messages"]] == [
            ("user", "start hello", [])
        ]

        # Another message: busy while the dead turn's lease holds, then it goes on.
        deadline = time.monotonic() + 30
        while True:
            sent = http.post(path, json={"content": "hello there"}, timeout=60)
            if sent.status_code != 409:
                break
            assert sent.json()["code"] == "agent.conversation_busy", sent.text
            assert time.monotonic() < deadline, "the dead turn still holds the conversation"
            time.sleep(0.2)
        later = _ok(sent)["turn"]
        assert (later["turn"], later["status"], later["answer"]) == (
            2,
            "completed",
            "echo: hello there",
        )
        found = _ok(http.get(f"/v1/agent/conversations/{conversation}"), 200)
        assert [(t["turn"], t["status"], t["model_calls"]) for t in found["turns"]] == [
            (1, "interrupted", 0),
            (2, "completed", 1),
        ]
        assert found["turns"][0]["finished_at"] is not None
        assert found["status"] == "idle"

        # The left turn's key answers it as it stands: a later message went on from it.
        again = http.post(path, json=body, headers=key, timeout=60)
        assert again.headers["Idempotency-Replayed"] == "true"
        left = _ok(again)["turn"]
        assert (left["turn"], left["status"], left["model_calls"]) == (1, "interrupted", 0)
        assert len(upstream.bodies("operator")) == asked + 1
        assert _runs(http) == runs
        _recorded_once(http)
