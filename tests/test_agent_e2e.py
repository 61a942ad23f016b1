"""The chat agent end to end: real server processes on SQLite (`ductor dev`) and
Postgres (`ductor serve`), one of each for the module, whose model calls go through
the inference proxy to the scripted upstream (tests/ai_upstream.py), whose
`operator` model asks for tools and then answers from their results.

It explains a routing decision from the stored explanation (`list_assignments`,
then `get_decision`) and each turn costs the sum of its AI requests; a mutating
call waits for confirmation and runs only when confirmed (a rejected one never
runs, and the model is told); a failed model call mid-turn answers 502 and the
same Idempotency-Key resumes the turn; eight model calls end a turn; concurrent
duplicates answer once; another tenant finds nothing, nor can its model be talked
into reading it; hostile bodies are 4xx; a conversation stops at 200 messages;
`ductor chat` runs as a real process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from ductor_server.connections import new_secret_key
from ductor_server.pytest_plugin import create_database, drop_database
from ductor_server.services.tools import TOOLS

from .ai_upstream import UPSTREAM_KEY, ScriptedUpstream
from .conftest import ServerProcess, _create_key

pytestmark = pytest.mark.timeout(600)

CALL_COST = 100 * 1 + 20 * 2  # the operator's usage at 1 and 2 micros per token

FRAGILE: dict[str, Any] = {
    "family_slug": "fragile",
    "steps": [
        {
            "ref": "boom",
            "type": "STEP_TYPE_DATAFLOW",
            "args": {"operation": "project", "project": {"x": "input.missing.deeper"}},
        }
    ],
    "edges": [],
}


@dataclass
class Env:
    server: ServerProcess
    upstream: ScriptedUpstream
    other_key: str
    decision: dict[str, Any]


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    scripted = ScriptedUpstream().start()
    try:
        yield scripted
    finally:
        scripted.stop()


def _ok(answer: httpx.Response, status: int = 201) -> Any:
    assert answer.status_code == status, answer.text
    return answer.json()


def _set_up(http: httpx.Client, upstream: ScriptedUpstream) -> dict[str, Any]:
    """The upstream connection and prices; two buyers, a pool, rules, and lead-2
    routed to ben (ana filters out Texas); the decision."""
    _ok(
        http.post(
            "/v1/connections",
            json={
                "name": "llm",
                "provider": "openai",
                "config": {"base_url": upstream.url},
                "secrets": {"api_key": UPSTREAM_KEY},
            },
        )
    )
    _ok(http.put("/v1/ai/settings", json={"default_connection": "llm"}), 200)
    for model in ("operator", "looper", "slow"):
        price = {"input_per_million": 1_000_000, "output_per_million": 2_000_000}
        _ok(http.put(f"/v1/ai/prices/{model}", json=price))
    _ok(http.post("/v1/workers", json={"id": "ana", "capacity": {"leads": 10}}))
    _ok(http.post("/v1/workers", json={"id": "ben", "capacity": {"leads": 10}}))
    pool = {
        "id": "desk",
        "channel": "leads",
        "strategy": {"name": "auction", "options": {"reserve": 1000000}},
        "members": [
            {
                "worker": "ana",
                "bid": 3000000,
                "filters": [{"attribute": "state", "op": "in", "values": ["CA", "NV"]}],
            },
            {"worker": "ben", "bid": 2500000},
        ],
    }
    _ok(http.post("/v1/pools", json=pool))
    rules = {
        "id": "main",
        "default_pool": "desk",
        "kinds": {"lead": {"attributes": {"state": {"type": "string", "required": True}}}},
    }
    _ok(http.post("/v1/rules", json=rules))
    decision = _ok(
        http.post("/v1/route", json={"id": "lead-2", "kind": "lead", "attributes": {"state": "TX"}})
    )
    assert decision["worker"] == "ben"
    _ok(http.post("/v1/workflows", json=FRAGILE))
    _ok(http.post("/v1/workflows", json={**FRAGILE, "family_slug": "brittle"}))
    stored: dict[str, Any] = _ok(http.get(f"/v1/decisions/{decision['id']}"), 200)
    return stored


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def env(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    upstream: ScriptedUpstream,
) -> Iterator[Env]:
    """One server of the backend for the module, set up; stopped (and its database
    dropped) after."""
    base = tmp_path_factory.mktemp(f"agent-{request.param}")
    admin: str | None = None
    url: str | None = None
    if request.param == "postgres":
        admin = request.getfixturevalue("_postgres_admin")
        url = create_database(admin)
    server = ServerProcess(data_dir=base / "data", database_url=url)
    if url:  # `ductor dev` makes its own secret key; `serve` is given one
        server.extra_env["DUCTOR_SECRET_KEYS"] = new_secret_key("k1")
    try:
        server.start()
        other = asyncio.run(_create_key(url or str(server.data_dir / "ductor.db"), "other"))
        with server.client() as http:
            decision = _set_up(http, upstream)
        yield Env(server=server, upstream=upstream, other_key=other, decision=decision)
    finally:
        server.stop()
        if url is not None and admin is not None:
            drop_database(url, admin)


def _calls(turn: dict[str, Any]) -> list[dict[str, Any]]:
    return [call for message in turn["messages"] for call in message["tool_calls"]]


def _start(
    http: httpx.Client,
    message: str,
    *,
    model: str = "operator",
    headers: dict[str, str] | None = None,
    **fields: Any,
) -> httpx.Response:
    return http.post(
        "/v1/agent/conversations",
        json={"model": model, "message": message, **fields},
        headers=headers,
        timeout=120,
    )


def _say(http: httpx.Client, conversation: str, body: dict[str, Any], **kw: Any) -> httpx.Response:
    return http.post(
        f"/v1/agent/conversations/{conversation}/messages", json=body, timeout=120, **kw
    )


def _runs(http: httpx.Client, family: str = "fragile") -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = _ok(
        http.get("/v1/runs", params={"family_slug": family, "limit": 500}), 200
    )["items"]
    return items


# --- explaining a decision -------------------------------------------------------------


def test_the_agent_explains_a_decision_from_the_stored_explanation(env: Env) -> None:
    decision = env.decision
    with env.server.client() as http:
        answer = _ok(_start(http, "why did lead-2 go to ben?"))
        turn = answer["turn"]
        assert turn["status"] == "completed", turn
        calls = _calls(turn)
        assert [(c["tool"], c["status"], c["approval"]) for c in calls] == [
            ("list_assignments", "executed", "read_only"),
            ("get_decision", "executed", "read_only"),
        ]
        assert calls[0]["arguments"] == {"routable_id": "lead-2"}
        assert calls[1]["arguments"] == {"decision_id": decision["id"]}
        # The tool's result is the REST answer, and the answer quotes its explanation.
        assert calls[1]["result"] == decision
        assert json.dumps(decision["explanation"], sort_keys=True) in turn["answer"]
        assert turn["answer"].startswith("lead-2 went to ben (pool desk, strategy auction)")
        excluded = decision["explanation"]["excluded"]
        assert any("ana" in json.dumps(group) for group in excluded)

        # Each model call is an AI request of the agent; the turn costs their sum.
        records = [_ok(http.get(f"/v1/ai/requests/{i}"), 200) for i in turn["ai_request_ids"]]
        assert len(records) == turn["model_calls"] == 3
        assert {(r["source"], r["model"], r["status"]) for r in records} == {
            ("agent", "operator", "ok")
        }
        assert turn["cost_micros"] == sum(r["cost_micros"] for r in records) == 3 * CALL_COST
        conversation = _ok(http.get(f"/v1/agent/conversations/{answer['conversation']['id']}"), 200)
        assert conversation["status"] == "idle"
        assert conversation["cost_micros"] == turn["cost_micros"]
        assert [m["role"] for m in conversation["messages"]] == ["user", *["assistant"] * 3]
        assert [t["turn"] for t in conversation["turns"]] == [1]
        assert conversation["turns"][0]["ai_request_ids"] == turn["ai_request_ids"]

    # What the model was sent: the MCP server's tools (the agent keys mutations itself),
    # then each tool result after the answer that asked for it.
    sent = env.upstream.bodies("operator")[-3:]
    assert [t["function"]["name"] for t in sent[0]["tools"]] == [tool.name for tool in TOOLS]
    for offered in sent[0]["tools"]:
        assert "idempotency_key" not in offered["function"]["parameters"]["properties"]
    assert sent[0]["messages"][0]["role"] == "system"
    last = sent[-1]["messages"]
    assert [m["role"] for m in last[1:]] == ["user", "assistant", "tool", "assistant", "tool"]
    assert json.loads(last[-1]["content"]) == decision
    assert last[-1]["tool_call_id"] == last[-2]["tool_calls"][0]["id"] == calls[1]["id"]


def test_duplicates_answer_once_and_the_cli_chats(env: Env) -> None:
    server = env.server
    with server.client() as http:
        conversation = _ok(http.post("/v1/agent/conversations", json={"model": "operator"}))[
            "conversation"
        ]["id"]
        before = len(env.upstream.bodies("operator"))

        def send(_: int) -> httpx.Response:
            with server.client() as mine:
                return _say(
                    mine,
                    conversation,
                    {"content": "why did lead-2 go to ben?"},
                    headers={"Idempotency-Key": "same-question"},
                )

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(send, range(6)))
        assert {a.status_code for a in answers} == {201}, [a.text for a in answers]
        assert len({json.dumps(a.json()["turn"], sort_keys=True) for a in answers}) == 1
        assert sum(a.headers.get("Idempotency-Replayed") != "true" for a in answers) == 1
        # One turn, three model calls: the duplicates did nothing.
        assert len(env.upstream.bodies("operator")) - before == 3
        found = _ok(http.get(f"/v1/agent/conversations/{conversation}"), 200)
        assert len(found["turns"]) == 1
        again = _say(
            http,
            conversation,
            {"content": "something else"},
            headers={"Idempotency-Key": "same-question"},
        )
        assert again.status_code == 422
        assert again.json()["code"] == "idempotency.conflict"

        # The list pages newest first (an older conversation of its own, so the
        # test does not depend on which tests ran before it on this server).
        older = _ok(http.post("/v1/agent/conversations", json={"model": "operator"}))
        newest = _ok(http.post("/v1/agent/conversations", json={"model": "operator"}))
        page = _ok(http.get("/v1/agent/conversations", params={"limit": 1}), 200)
        assert page["items"][0]["id"] == newest["conversation"]["id"]
        assert page["next_cursor"]
        rest = _ok(http.get("/v1/agent/conversations", params={"cursor": page["next_cursor"]}), 200)
        rest_ids = [c["id"] for c in rest["items"]]
        assert newest["conversation"]["id"] not in rest_ids
        assert rest_ids[0] == older["conversation"]["id"]
        assert conversation in rest_ids

    # `ductor chat -m` as a real process: the answer on stdout, the tools on stderr.
    done = server.cli("chat", "--model", "operator", "-m", "why did lead-2 go to ben?")
    assert json.dumps(env.decision["explanation"], sort_keys=True) in done.stdout
    assert "[tool] get_decision" in done.stderr
    assert f"{3 * CALL_COST} micros" in done.stderr
    # A mutating call waits: not executed, exit 3, the run does not exist.
    runs = len(_runs_of(server))
    waiting = server.cli("chat", "--model", "operator", "-m", "start fragile", check=False)
    assert waiting.returncode == 3, waiting.stderr
    assert "waiting for confirmation: trigger_run" in waiting.stderr
    assert len(_runs_of(server)) == runs
    conversation = waiting.stderr.split("ductor chat --conversation ")[1].split()[0]
    # The REPL asks about it first, and "y" runs it.
    repl = subprocess.run(
        [sys.executable, "-m", "ductor_server.cli", "chat", "--conversation", conversation],
        input="y\n",
        env={**server_env(server)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert repl.returncode == 0, repl.stderr
    assert "run trigger_run" in repl.stderr
    assert "started " in repl.stdout
    assert len(_runs_of(server)) == runs + 1


def server_env(server: ServerProcess) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_")}
    env.update({"DUCTOR_URL": server.url, "DUCTOR_API_KEY": server.api_key})
    return env


def _runs_of(server: ServerProcess) -> list[dict[str, Any]]:
    with server.client() as http:
        return _runs(http)


# --- confirmations ---------------------------------------------------------------------


def test_mutating_calls_wait_for_confirmation(env: Env) -> None:
    server = env.server
    with server.client() as http:
        failed = []
        for n in range(2):
            run = _ok(http.post("/v1/runs", json={"family_slug": "brittle", "input": {"n": n}}))
            failed.append(server.wait_for_run(run["id"]))
        assert {r["status"] for r in failed} == {"RUN_STATUS_FAILED"}
        before = {r["id"] for r in _runs(http, "brittle")}

        # list_runs runs at once; the two re-runs wait, and nothing is started.
        answer = _ok(_start(http, "retry the failed runs of brittle"))
        conversation, turn = answer["conversation"]["id"], answer["turn"]
        assert turn["status"] == "awaiting_confirmation"
        calls = _calls(turn)
        assert [(c["tool"], c["status"]) for c in calls] == [
            ("list_runs", "executed"),
            ("rerun_run", "pending"),
            ("rerun_run", "pending"),
        ]
        pending = turn["pending"]
        assert [c["id"] for c in pending] == [c["id"] for c in calls[1:]]
        assert {c["arguments"]["run_id"] for c in pending} <= before
        assert {r["id"] for r in _runs(http, "brittle")} == before
        found = _ok(http.get(f"/v1/agent/conversations/{conversation}"), 200)
        assert found["status"] == "awaiting_confirmation"
        assert [c["id"] for c in found["pending"]] == [c["id"] for c in pending]

        # A message that does not decide every waiting call is refused, and so is an
        # id that waits nowhere (another conversation's, or one decided already).
        refused = _say(http, conversation, {"content": "hello?"})
        assert refused.status_code == 409
        assert refused.json()["code"] == "agent.confirmation_required"
        assert refused.json()["details"]["pending"] == [c["id"] for c in pending]
        partial = _say(http, conversation, {"confirm": [pending[0]["id"]]})
        assert partial.json()["code"] == "agent.confirmation_required"
        elsewhere = _ok(_start(http, "start fragile"))
        foreign = elsewhere["turn"]["pending"][0]["id"]
        stranger = _say(
            http,
            conversation,
            {"confirm": [pending[0]["id"]], "reject": [pending[1]["id"], foreign]},
        )
        assert stranger.status_code == 409
        assert stranger.json()["code"] == "agent.tool_call_not_pending"
        assert stranger.json()["details"]["pointer"] == "/reject/1"
        assert {r["id"] for r in _runs(http, "brittle")} == before

        # Confirm one, reject the other: one new run, and the model is told of the other.
        decided = _ok(
            _say(http, conversation, {"confirm": [pending[0]["id"]], "reject": [pending[1]["id"]]})
        )["turn"]
        assert decided["status"] == "completed"
        assert decided["pending"] == []
        assert {(c["id"], c["status"], c["approval"]) for c in decided["decided"]} == {
            (pending[0]["id"], "executed", "confirmed"),
            (pending[1]["id"], "rejected", "rejected"),
        }
        started = {r["id"] for r in _runs(http, "brittle")} - before
        assert len(started) == 1
        [new_id] = started
        rerun = next(c for c in decided["decided"] if c["status"] == "executed")["result"]
        assert rerun["rerun_of"] == pending[0]["arguments"]["run_id"]
        assert rerun["run"]["id"] == new_id
        assert (
            rerun["run"]["input"]
            == next(r for r in failed if r["id"] == rerun["rerun_of"])["input"]
        )
        assert f"re-ran {rerun['rerun_of']} as {new_id}" in decided["answer"]
        assert "rerun_run: not executed (agent.rejected" in decided["answer"]
        told = env.upstream.bodies("operator")[-1]["messages"]
        refusal = next(m for m in told if m.get("tool_call_id") == pending[1]["id"])
        assert json.loads(refusal["content"])["error"]["code"] == "agent.rejected"
        again = _say(http, conversation, {"confirm": [pending[0]["id"]]})
        assert again.status_code == 409
        assert again.json()["details"] == {
            "pointer": "/confirm/0",
            "id": pending[0]["id"],
            "status": "executed",
        }

        # With allow_mutations the call runs at once; the agent keys it by the call.
        allowed = _ok(_start(http, "start fragile", allow_mutations=True))["turn"]
        [call] = _calls(allowed)
        assert (call["tool"], call["status"], call["approval"]) == (
            "trigger_run",
            "executed",
            "allowed",
        )
        run = _ok(http.get(f"/v1/runs/{call['result']['id']}"), 200)
        assert run["idempotency_key"] == f"agent:{call['id']}"

        # Another tenant finds none of it, and cannot decide its calls.
        waiting = elsewhere["conversation"]["id"]
    with server.client(env.other_key) as theirs:
        for path in (
            f"/v1/agent/conversations/{conversation}",
            f"/v1/agent/conversations/{waiting}",
        ):
            lost = theirs.get(path)
            assert lost.status_code == 404
            assert lost.json()["code"] == "agent.conversation_not_found"
        stolen = _say(theirs, waiting, {"confirm": [foreign]})
        assert stolen.status_code == 404
        assert stolen.json()["code"] == "agent.conversation_not_found"
        assert _ok(theirs.get("/v1/agent/conversations"), 200)["items"] == []
        unset = theirs.post("/v1/agent/conversations", json={"model": "operator"})
        assert unset.status_code == 422
        assert unset.json()["code"] == "ai.no_connection"
        assert unset.json()["details"]["pointer"] == "/connection"
        connection = {
            "name": "mine",
            "provider": "openai",
            "config": {"base_url": env.upstream.url},
            "secrets": {"api_key": UPSTREAM_KEY},
        }
        _ok(theirs.post("/v1/connections", json=connection))
        own = _ok(
            theirs.post("/v1/agent/conversations", json={"model": "operator", "connection": "mine"})
        )
        hijack = _say(theirs, own["conversation"]["id"], {"confirm": [foreign]})
        assert hijack.status_code == 409
        assert hijack.json()["code"] == "agent.tool_call_not_pending"
    with server.client() as http:
        assert (
            _ok(http.get(f"/v1/agent/conversations/{waiting}"), 200)["pending"][0]["id"] == foreign
        )


# --- failures and limits ---------------------------------------------------------------


def test_lone_surrogates_in_a_model_answer_are_stored_replaced(env: Env) -> None:
    # The model's text, a tool's name and its arguments hold `\\ud800` escapes without
    # their pair, which no store can hold: each is stored as U+FFFD and the turn goes on.
    with env.server.client() as http:
        answer = _start(http, "hi", model="mangled")
        assert answer.status_code == 201, answer.text
        turn = answer.json()["turn"]
        assert (turn["status"], turn["answer"]) == ("completed", "done \ufffd")
        asked = turn["messages"][1]
        assert asked["content"] == "looking \ufffd up"
        first, second = asked["tool_calls"]
        assert (first["tool"], first["arguments"]) == ("get_run", {"run_id": "run-\ufffd"})
        assert (first["status"], first["error_code"]) == ("failed", "run.not_found")
        assert (second["tool"], second["status"]) == ("list_\ufffdruns", "failed")
        assert second["result"]["error"]["message"] == "no tool named 'list_\ufffdruns'"
        conversation = answer.json()["conversation"]["id"]
        stored = _ok(http.get(f"/v1/agent/conversations/{conversation}"), 200)
        assert stored["messages"] == turn["messages"]


def test_a_huge_upstream_error_is_stored_cut(env: Env) -> None:
    # The upstream's error object (100 KB, in short strings) is answered and stored
    # with the turn as its first 500 bytes of text, not whole.
    with env.server.client() as http:
        failed = _start(http, "hi", model="huge_error")
        assert failed.status_code == 502, failed.text
        error = failed.json()
        assert error["message"] == "the upstream answered 500: too much"
        shown = error["details"]["upstream_error"]
        assert isinstance(shown, str)
        assert shown.startswith('{"error": {"message": "too much", "blob": ["xxx')
        assert len(shown) == 500
        conversation = error["details"]["conversation_id"]
        stored = _ok(http.get(f"/v1/agent/conversations/{conversation}"), 200)
        [turn] = stored["turns"]
        assert turn["status"] == "failed"
        assert turn["error"]["details"]["upstream_error"] == shown
        assert len(json.dumps(stored)) < 10_000


def test_failures_limits_and_hostile_input(env: Env) -> None:
    server, upstream = env.server, env.upstream
    with server.client() as http:
        # The upstream fails after the first tool ran: 502, the turn is stored failed
        # and whole, and the same Idempotency-Key resumes it.
        upstream.fail_after_tool = True
        key = {"Idempotency-Key": "why-once"}
        broken = _start(http, "why did lead-2 go to ben?", headers=key)
        assert broken.status_code == 502, broken.text
        error = broken.json()
        assert error["code"] == "ai.upstream_error"
        conversation = error["details"]["conversation_id"]
        assert error["details"]["turn"] == 1
        assert error["details"]["upstream_status"] == 500
        found = _ok(http.get(f"/v1/agent/conversations/{conversation}"), 200)
        [turn] = found["turns"]
        assert (turn["status"], turn["error"]["code"]) == ("failed", "ai.upstream_error")
        records = [_ok(http.get(f"/v1/ai/requests/{i}"), 200) for i in turn["ai_request_ids"]]
        assert [r["status"] for r in records] == ["ok", "upstream_error"]
        assert turn["cost_micros"] == sum(r["cost_micros"] for r in records) == CALL_COST
        assert [m["role"] for m in found["messages"]] == ["user", "assistant"]
        [asked] = found["messages"][1]["tool_calls"]
        assert (asked["tool"], asked["status"]) == ("list_assignments", "executed")
        resumed = _start(http, "why did lead-2 go to ben?", headers=key)
        assert resumed.status_code == 201, resumed.text
        assert resumed.headers.get("Idempotency-Replayed") is None
        turn = resumed.json()["turn"]
        assert (turn["turn"], turn["status"]) == (1, "completed")
        assert json.dumps(env.decision["explanation"], sort_keys=True) in turn["answer"]
        assert turn["model_calls"] == 4
        records = [_ok(http.get(f"/v1/ai/requests/{i}"), 200) for i in turn["ai_request_ids"]]
        assert turn["cost_micros"] == sum(r["cost_micros"] for r in records) == 3 * CALL_COST
        replayed = _start(http, "why did lead-2 go to ben?", headers=key)
        assert replayed.headers["Idempotency-Replayed"] == "true"
        assert replayed.json()["turn"] == turn

        # Eight model calls end a turn that never answers; their tools are not run.
        looped = _ok(_start(http, "go", model="looper"))["turn"]
        assert (looped["status"], looped["model_calls"]) == ("step_limit", 8)
        assert looped["error"]["code"] == "agent.step_limit"
        assert [c["status"] for c in looped["messages"][-1]["tool_calls"]] == ["skipped"]
        assert len(looped["ai_request_ids"]) == 8

        # A second message while a turn runs is refused.
        slow = _ok(http.post("/v1/agent/conversations", json={"model": "slow"}))
        slow_id = slow["conversation"]["id"]
        first: list[httpx.Response] = []

        def take_your_time() -> None:
            with server.client() as mine:
                first.append(_say(mine, slow_id, {"content": "take your time"}))

        worker = threading.Thread(target=take_your_time)
        worker.start()
        deadline = time.monotonic() + 30
        while _ok(http.get(f"/v1/agent/conversations/{slow_id}"), 200)["status"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        busy = _say(http, slow_id, {"content": "and now?"})
        assert busy.status_code == 409
        assert busy.json()["code"] == "agent.conversation_busy"
        worker.join(60)
        assert first[0].status_code == 201
        assert first[0].json()["turn"]["answer"] == "echo: take your time"

        # The upstream's timeout is the proxy's 504; a blocking budget its 429, before
        # anything is sent upstream. Each turn is stored failed, with its error.
        settings = {"default_connection": "llm", "timeout_seconds": 0.5}
        _ok(http.put("/v1/ai/settings", json=settings), 200)
        timed = _say(http, slow_id, {"content": "too slow"})
        _ok(http.put("/v1/ai/settings", json={"default_connection": "llm"}), 200)
        assert timed.status_code == 504, timed.text
        assert timed.json()["code"] == "ai.upstream_timeout"
        assert timed.json()["details"]["turn"] == 2
        _ok(http.put("/v1/budgets/ai.cost", json={"window": "day", "limit": 1}))
        sent = len(upstream.requests)
        over = _say(http, slow_id, {"content": "one more"})
        assert http.delete("/v1/budgets/ai.cost").status_code == 204
        assert over.status_code == 429, over.text
        assert (over.json()["code"], over.json()["details"]["turn"]) == ("budget.exceeded", 3)
        assert len(upstream.requests) == sent
        turns = _ok(http.get(f"/v1/agent/conversations/{slow_id}"), 200)["turns"]
        assert [(t["status"], (t["error"] or {}).get("code")) for t in turns] == [
            ("completed", None),
            ("failed", "ai.upstream_timeout"),
            ("failed", "budget.exceeded"),
        ]
        refusal = _ok(http.get(f"/v1/ai/requests/{turns[2]['ai_request_ids'][0]}"), 200)
        assert (refusal["status"], refusal["cost_micros"]) == ("refused", 0)

        # The model asking for a tool that does not exist, or with bad arguments: the
        # call fails, the model is told, the turn goes on.
        odd = _ok(_start(http, 'call drop_tables {"all": true}'))["turn"]
        [call] = _calls(odd)
        assert (call["status"], call["error_code"]) == ("failed", "request.invalid")
        assert call["result"]["error"]["message"] == "no tool named 'drop_tables'"
        bad = _ok(_start(http, 'call get_run {"run_id": 5, "x": [[[]]]}'))["turn"]
        [call] = _calls(bad)
        assert call["status"] == "failed"
        assert call["result"]["error"]["details"]["argument"] in ("run_id", "x")
        assert bad["status"] == "completed"

        # Hostile bodies: each a 4xx naming where, and nothing written.
        count = len(_ok(http.get("/v1/agent/conversations", params={"limit": 200}), 200)["items"])
        for body, status, where in (
            ({"model": "operator", "message": "x" * 32_001}, 422, "/message"),
            ({"model": "", "message": "hi"}, 422, "/model"),
            ({"model": "operator", "message": "  "}, 422, "/message"),
            ({"model": "operator", "connection": "nope", "message": "hi"}, 404, None),
            ({"model": "operator", "colour": "blue"}, 422, None),
            ({"model": "operator", "title": "t" * 201}, 422, "/title"),
        ):
            refused = http.post("/v1/agent/conversations", json=body)
            assert refused.status_code == status, (body, refused.text)
            if where is not None:
                assert refused.json()["details"]["pointer"] == where
        huge = http.post(
            "/v1/agent/conversations", json={"model": "operator", "message": "x" * 2_000_000}
        )
        assert huge.status_code == 413
        after = len(_ok(http.get("/v1/agent/conversations", params={"limit": 200}), 200)["items"])
        assert after == count
        for body, where in (
            ({}, "/content"),
            ({"content": "x" * 32_001}, "/content"),
            ({"confirm": ["atc_nope"]}, "/confirm/0"),
            ({"confirm": ["atc_" + "0" * 32], "reject": ["atc_" + "0" * 32]}, "/reject/0"),
            ({"reject": ["atc_" + "1" * 32] * 65}, "/reject"),
        ):
            refused = _say(http, slow_id, body)
            assert refused.status_code == 422, (body, refused.text)
            assert refused.json()["details"]["pointer"] == where
        wrong_type = _say(http, slow_id, {"confirm": [5]})
        assert wrong_type.status_code == 422
        assert wrong_type.json()["details"]["path"] == "$.confirm[0]"
        for path, code in (
            ("/v1/agent/conversations/agc_" + "0" * 32, "agent.conversation_not_found"),
            ("/v1/agent/conversations/../../v1/runs", "route.not_found"),
            ("/v1/agent/conversations/" + "x" * 500, "agent.conversation_not_found"),
        ):
            assert http.get(path).json()["code"] == code
        cursor = http.get("/v1/agent/conversations", params={"cursor": "garbage"})
        assert cursor.status_code == 422
        # None of them wrote anything.
        assert len(_ok(http.get(f"/v1/agent/conversations/{slow_id}"), 200)["turns"]) == 3
    assert httpx.get(f"{server.url}/readyz").status_code == 200


# --- a hostile tenant --------------------------------------------------------------------


def test_a_tenant_cannot_make_the_agent_read_another_tenants_data(env: Env) -> None:
    """Whatever the model is talked into asking for, its tools run under the caller's
    tenant: another tenant's decision, run or assignments are not found; a `tenant`
    argument is refused; another tenant's connection is not found. More than eight
    calls in one answer and over-long arguments are refused unrun."""
    server = env.server
    target = server.database_url or str(server.data_dir / "ductor.db")
    mallory = asyncio.run(_create_key(target, "mallory"))
    with server.client() as http:
        run = _ok(http.post("/v1/runs", json={"family_slug": "brittle", "input": {}}))
    decision = env.decision["id"]
    with server.client(mallory) as theirs:
        borrowed = theirs.post(
            "/v1/agent/conversations",
            json={"model": "operator", "connection": "llm", "message": "hi"},
        )
        assert borrowed.status_code == 404, borrowed.text
        assert borrowed.json()["code"] == "connection.not_found"
        assert _ok(theirs.get("/v1/agent/conversations"), 200)["items"] == []
        connection = {
            "name": "own",
            "provider": "openai",
            "config": {"base_url": env.upstream.url},
            "secrets": {"api_key": UPSTREAM_KEY},
        }
        _ok(theirs.post("/v1/connections", json=connection))
        _ok(theirs.put("/v1/ai/settings", json={"default_connection": "own"}), 200)
        for message, code in (
            (f'call get_decision {{"decision_id": "{decision}"}}', "decision.not_found"),
            (f'call get_run {{"run_id": "{run["id"]}"}}', "run.not_found"),
            (f'call get_run {{"run_id": "{run["id"]}", "tenant": "default"}}', "request.invalid"),
            (
                f'call get_run {{"run_id": "{run["id"]}", "tenant_id": "default"}}',
                "request.invalid",
            ),
        ):
            turn = _ok(_start(theirs, message))["turn"]
            [call] = _calls(turn)
            assert (call["status"], call["error_code"]) == ("failed", code), call
            assert turn["status"] == "completed"
            assert env.decision["explanation"]["strategy"] not in json.dumps(call["result"])
        turn = _ok(_start(theirs, "why did lead-2 go to ben?"))["turn"]
        assert turn["answer"] == "I found no assignment of it."
        [call] = _calls(turn)
        assert (call["tool"], call["status"], call["result"]["items"]) == (
            "list_assignments",
            "executed",
            [],
        )
        # Nine calls in one answer: eight run, the ninth is refused unrun.
        turn = _ok(_start(theirs, "call list_workflows x9 {}"))["turn"]
        statuses = [(c["status"], c["error_code"]) for c in _calls(turn)]
        assert statuses == [("executed", None)] * 8 + [("failed", "request.invalid")]
        assert "at most 8" in _calls(turn)[8]["result"]["error"]["message"]
        # Arguments over 16,000 characters are refused unrun.
        long = json.dumps({"run_id": "r", "pad": "x" * 16_000})
        turn = _ok(_start(theirs, f"call get_run {long}"))["turn"]
        [call] = _calls(turn)
        assert (call["status"], call["error_code"]) == ("failed", "request.invalid")
        assert "16000" in call["result"]["error"]["message"]
        assert call["arguments"] == {}
    with server.client() as http:
        # The first tenant's data is as it was, and none of the model calls are its.
        assert _ok(http.get(f"/v1/decisions/{decision}"), 200)["id"] == decision
        mine = _ok(http.get("/v1/ai/requests", params={"limit": 500}), 200)["items"]
        assert not [r for r in mine if r["connection"] == "own"]


def test_a_conversation_takes_no_message_once_it_holds_200(env: Env) -> None:
    with env.server.client() as http:
        conversation = _ok(http.post("/v1/agent/conversations", json={"model": "echo"}))
        conversation_id = conversation["conversation"]["id"]
        for n in range(100):  # a message and its answer each
            _ok(_say(http, conversation_id, {"content": f"m{n}"}))
        found = _ok(http.get(f"/v1/agent/conversations/{conversation_id}"), 200)
        assert len(found["messages"]) == 200
        full = _say(http, conversation_id, {"content": "one more"})
        assert full.status_code == 409, full.text
        assert full.json()["code"] == "agent.conversation_too_long"
        found = _ok(http.get(f"/v1/agent/conversations/{conversation_id}"), 200)
        assert len(found["messages"]) == 200
        assert len(found["turns"]) == 100


def test_ductor_chat_with_yes_json_and_the_model_from_the_environment(env: Env) -> None:
    server = env.server

    def chat(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ductor_server.cli", "chat", *args],
            env={**server_env(server), **extra},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )

    with server.client() as http:
        before = len(_runs(http, "brittle"))
    # --yes runs the mutating call at once; --json prints the answer whole.
    done = chat("--yes", "--json", "-m", "start brittle", DUCTOR_CHAT_MODEL="operator")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    turn = answer["turn"]
    assert turn["status"] == "completed"
    [call] = _calls(turn)
    assert (call["tool"], call["status"], call["approval"]) == (
        "trigger_run",
        "executed",
        "allowed",
    )
    assert f"conversation {answer['conversation']['id']}" in done.stderr
    with server.client() as http:
        assert len(_runs(http, "brittle")) == before + 1
    # No model, or a connection the tenant lacks: one clear line, no traceback.
    missing = chat("-m", "hi")
    assert missing.returncode not in (0, 3)
    assert "--model or DUCTOR_CHAT_MODEL" in missing.stderr
    assert "Traceback" not in missing.stderr
    unknown = chat("--model", "operator", "--connection", "nope", "-m", "hi")
    assert unknown.returncode not in (0, 3)
    assert "connection.not_found" in unknown.stderr
    assert "Traceback" not in unknown.stderr
