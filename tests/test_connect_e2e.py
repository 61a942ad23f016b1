"""Connect-RPC against real server processes on 127.0.0.1.

A Connect client not written here (connect-es with connect-node, its code generated
by protoc-gen-es from `proto/`) publishes a workflow, triggers a run and watches it
finish, routes a lead and reads error codes, on SQLite (`ductor dev`) and on
Postgres (`ductor serve`). Over plain HTTP (httpx), every method of every service
is called (the chat agent's turns against the scripted upstream of
tests/ai_upstream.py), and every request and answer is checked against the schemas
by protobuf-es; a key needs its REST call's scope; another tenant finds nothing;
ten concurrent duplicates with one `Idempotency-Key` start one run, which REST sees
under the same key; bad input is `invalid_argument` with REST's message and path.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from ductor_server.pytest_plugin import create_database, drop_database
from ductor_server.transports.connect import METHODS

from .ai_upstream import UPSTREAM_KEY, ScriptedUpstream
from .conftest import ServerProcess
from .connect_node import node, prepared_client, schema_problems

pytestmark = pytest.mark.timeout(300)

HELLO: dict[str, Any] = {
    "family_slug": "hello",
    "title": "Say hello",
    "steps": [
        {
            "ref": "greet",
            "type": "STEP_TYPE_DATAFLOW",
            "args": {"operation": "project", "project": {"greeting": "'hello ' + input.name"}},
        }
    ],
    "edges": [],
}
GATE: dict[str, Any] = {
    "family_slug": "gate",
    "steps": [
        {"ref": "approval", "type": "STEP_TYPE_WAIT_FOR_SIGNAL", "args": {"signal": "approve"}}
    ],
    "edges": [],
}
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def sqlite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One `ductor dev` for the module."""
    server = ServerProcess(data_dir=tmp_path_factory.mktemp("connect-sqlite") / "data")
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def postgres(
    tmp_path_factory: pytest.TempPathFactory, _postgres_admin: str
) -> Iterator[ServerProcess]:
    """One `ductor serve` on a fresh Postgres database for the module."""
    url = create_database(_postgres_admin)
    server = ServerProcess(
        data_dir=tmp_path_factory.mktemp("connect-postgres") / "data", database_url=url
    )
    try:
        yield server.start()
    finally:
        server.stop()
        drop_database(url, _postgres_admin)


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    """The scripted OpenAI-compatible upstream the chat agent's turns call."""
    scripted = ScriptedUpstream().start()
    try:
        yield scripted
    finally:
        scripted.stop()


def other_key(server: ServerProcess, tenant: str) -> str:
    extra = [] if server.database_url else ["--data-dir", str(server.data_dir)]
    return server.cli("keys", "create", "--tenant", tenant, *extra).stdout.strip()


# --- a real Connect client ---------------------------------------------------------


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_connect_es_runs_a_workflow_routes_a_lead_and_reads_errors(
    backend: str, request: pytest.FixtureRequest
) -> None:
    prepared_client()
    server: ServerProcess = request.getfixturevalue(backend)
    seen = node("e2e.mjs", env={"DUCTOR_URL": server.url, "DUCTOR_API_KEY": server.api_key})

    assert seen["published"]["family_slug"] == "hello"
    trigger = seen["trigger"]
    assert trigger["again"] == trigger["id"], "the same Idempotency-Key started a second run"
    assert trigger["replayed"] == "true"
    assert seen["finished"] == {
        "status": "RUN_STATUS_SUCCEEDED",
        "output": {"greet": {"greeting": "hello ada"}},
        "steps": 1,
    }
    assert trigger["id"] in seen["listed"]
    with server.client() as http:
        rest = http.get(f"/v1/runs/{trigger['id']}").json()
    assert rest["status"] == "RUN_STATUS_SUCCEEDED"
    assert rest["idempotency_key"] == "connect-e2e-1"

    assert seen["route"] == {"worker": "ana", "pool": "leads", "stored": "ana"}

    assert seen["not_found"] == {
        "code": "NotFound",
        "message": "run 'run-that-is-not-there' not found",
        "detail": {"code": "run.not_found", "details": {"run_id": "run-that-is-not-there"}},
    }
    invalid = seen["invalid"]
    assert invalid["code"] == "InvalidArgument"
    assert invalid["detail"]["code"] == "request.invalid"
    assert invalid["detail"]["details"]["path"] == "$.limit"
    assert seen["unauthenticated"]["code"] == "Unauthenticated"
    assert seen["unauthenticated"]["detail"]["code"] == "auth.unauthenticated"


# --- every method over HTTP --------------------------------------------------------


class Caller:
    """Calls methods as a Connect client does (POST, JSON) and keeps every exchange."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http
        self.seen: list[tuple[str, Any]] = []
        self.answered: dict[str, int] = {}

    def call(
        self, service: str, name: str, body: dict[str, Any] | None = None, **headers: str
    ) -> httpx.Response:
        response = self.http.post(
            f"/ductor.v1.{service}/{name}", json=body or {}, headers={**JSON, **headers}
        )
        self.answered[name] = response.status_code
        self.seen.append((f"ductor.v1.{name}Request", body or {}))
        if response.status_code == 200:
            self.seen.append((f"ductor.v1.{name}Response", response.json()))
        return response

    def ok(self, service: str, name: str, body: dict[str, Any] | None = None) -> Any:
        response = self.call(service, name, body)
        assert response.status_code == 200, (name, response.status_code, response.text)
        assert response.headers["content-type"] == "application/json"
        return response.json()

    def refused(
        self, service: str, name: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The error of a call that must fail cleanly: Connect's code and Ductor's."""
        response = self.call(service, name, body)
        assert 400 <= response.status_code < 500, (name, response.status_code, response.text)
        error: dict[str, Any] = response.json()
        (detail,) = error["details"]
        assert detail["type"] == "google.protobuf.Struct"
        return {
            "connect": error["code"],
            "code": detail["debug"]["code"],
            "status": response.status_code,
        }


def test_every_method_answers_in_the_schemas_json(
    sqlite: ServerProcess, upstream: ScriptedUpstream
) -> None:
    prepared_client()
    # A tenant of its own: nothing the other tests made is in its lists.
    with sqlite.client(other_key(sqlite, "every")) as http:
        caller = Caller(http)
        _workflows_runs_events(caller, http)
        _routing(caller)
        _settlement(caller)
        _integrations(caller)
        _agent(caller, http, upstream)
        _keys(caller, http)
    assert set(caller.answered) == {m.name for m in METHODS}, "a method was not called"
    assert not [n for n, status in caller.answered.items() if status == 500]
    assert schema_problems(caller.seen) == []


def _workflows_runs_events(c: Caller, http: httpx.Client) -> None:
    W, R, E = "WorkflowService", "RunService", "EventService"
    broken = {"family_slug": "x", "steps": [{"ref": "a", "type": "STEP_TYPE_NOPE"}], "edges": []}
    assert c.ok(W, "ValidateWorkflow", {"definition": broken})["valid"] is False
    refusal = c.refused(W, "PublishWorkflow", {"definition": broken})
    assert refusal == {"connect": "invalid_argument", "code": "definition.invalid", "status": 400}
    published = c.ok(W, "PublishWorkflow", {"definition": HELLO})
    assert {**published, "created": False} == http.post("/v1/workflows", json=HELLO).json()
    c.ok(W, "PublishWorkflow", {"definition": GATE})
    assert c.ok(W, "ListWorkflows")["items"] == http.get("/v1/workflows").json()
    assert (
        c.ok(W, "GetWorkflow", {"family_slug": "hello"}) == http.get("/v1/workflows/hello").json()
    )
    version = c.ok(W, "GetWorkflowVersion", {"family_slug": "hello", "version": "1"})
    assert version == http.get("/v1/workflows/hello/versions/1").json()

    run = c.ok(R, "TriggerRun", {"family_slug": "hello", "input": {"name": "ada"}})
    sqlite_run = http.get(f"/v1/runs/{run['id']}").json()
    assert c.ok(R, "GetRun", {"run_id": run["id"]}) == sqlite_run
    batch = c.ok(R, "TriggerRuns", {"runs": [{"family_slug": "hello", "input": {"name": "bo"}}]})
    assert batch["created"] == 1
    page = c.ok(R, "ListRuns", {"family_slug": "hello", "limit": 1})
    assert len(page["items"]) == 1
    assert page["next_cursor"]
    assert c.ok(R, "GetRunHistory", {"run_id": run["id"]})["items"] == (
        http.get(f"/v1/runs/{run['id']}/history").json()
    )
    gate = c.ok(R, "TriggerRun", {"family_slug": "gate"})
    signal = c.ok(R, "SignalRun", {"run_id": gate["id"], "name": "hold", "payload": [1]})
    assert signal["duplicate"] is False
    waiting = c.refused(R, "RerunRun", {"run_id": gate["id"]})
    assert waiting == {"connect": "failed_precondition", "code": "run.not_ended", "status": 400}
    assert c.ok(R, "CancelRun", {"run_id": gate["id"], "reason": "test"})["id"] == gate["id"]
    _ended(http, run["id"])
    again = {"Idempotency-Key": "rerun-1"}
    rerun = c.call(R, "RerunRun", {"run_id": run["id"], "latest": True}, **again)
    assert rerun.status_code == 200, rerun.text
    assert rerun.json()["rerun_of"] == run["id"]
    assert rerun.json()["run"]["input"] == {"name": "ada"}
    replay = c.call(R, "RerunRun", {"run_id": run["id"], "latest": True}, **again)
    assert replay.headers["Idempotency-Replayed"] == "true"
    assert replay.json() == rerun.json()
    # REST shares the key: the same re-run, not a third run.
    rest = http.post(f"/v1/runs/{run['id']}/rerun", json={"latest": True}, headers=again)
    assert rest.status_code == 201, rest.text
    assert rest.json()["run"]["id"] == rerun.json()["run"]["id"]
    assert c.ok(E, "SendEvent", {"name": "lead.created", "data": {"n": 1}, "id": "ev-1"})["id"]


def _ended(http: httpx.Client, run_id: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if http.get(f"/v1/runs/{run_id}").json()["finished_at"] is not None:
            return
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} did not end")


def _routing(c: Caller) -> None:
    S = "RoutingService"
    for worker in ("ana", "bo"):
        c.ok(S, "PutWorker", {"id": worker})
    assert {w["id"] for w in c.ok(S, "ListWorkers")["items"]} == {"ana", "bo"}
    assert c.ok(S, "GetWorker", {"worker_id": "ana"})["id"] == "ana"
    c.ok(S, "DeleteWorker", {"worker_id": "bo"})
    c.ok(S, "PutPool", {"id": "leads", "members": [{"worker": "ana"}]})
    c.ok(S, "PutPool", {"id": "spare", "members": [{"worker": "ana"}]})
    assert len(c.ok(S, "ListPools")["items"]) == 2
    assert c.ok(S, "GetPool", {"pool_id": "leads"})["id"] == "leads"
    c.ok(S, "DeletePool", {"pool_id": "spare"})
    rules = c.ok(S, "PublishRules", {"kinds": {"lead": {}}, "default_pool": "leads"})
    assert c.ok(S, "GetRules") == rules
    assert c.ok(S, "ListRuleVersions")["items"][0]["version"] == rules["version"]
    assert c.ok(S, "GetRulesVersion", {"version": rules["version"]}) == rules
    assert c.ok(S, "ValidateRouting", {"workers": [{"id": "cy"}]})["valid"] is True
    decision = c.ok(S, "Route", {"id": "lead-1", "kind": "lead", "attributes": {"n": 1}})
    assert decision["worker"] == "ana"
    assert c.ok(S, "GetDecision", {"decision_id": decision["id"]}) == decision
    (assignment,) = c.ok(S, "ListAssignments", {"routable_id": "lead-1"})["items"]
    ident = {"assignment_id": assignment["id"]}
    assert c.ok(S, "GetAssignment", ident)["id"] == assignment["id"]
    assert c.ok(S, "AcceptAssignment", ident)["status"] == "accepted"
    assert c.ok(S, "CompleteAssignment", {**ident, "result": {"ok": True}})["status"]
    other = c.ok(S, "Route", {"id": "lead-2", "kind": "lead"})
    assert c.ok(S, "RejectAssignment", {"assignment_id": other["assignment_id"]})
    # Settlement is off on this pool: these refuse, cleanly.
    assert c.refused(S, "GetPoolSettlement", {"pool_id": "leads"})["code"] == "settlement.not_found"
    returned = c.refused(S, "ReturnAssignment", {**ident, "reason": "bad"})
    assert returned["connect"] in {"failed_precondition", "invalid_argument"}
    assert c.ok(S, "GetShadowReport", {"pool_id": "leads", "limit": 10})["pool"] == "leads"


def _settlement(c: Caller) -> None:
    L, M, R, W = "LedgerService", "MeteringService", "ReceiptService", "WalletService"
    for code, kind in (("cash", "asset"), ("sales", "revenue")):
        c.ok(L, "OpenAccount", {"code": code, "currency": "USD", "kind": kind})
    assert len(c.ok(L, "ListAccounts")["items"]) >= 2
    assert c.ok(L, "GetAccount", {"code": "cash"})["code"] == "cash"
    postings = [
        {"account": "cash", "amount": 5_000_000, "currency": "USD"},
        {"account": "sales", "amount": "-5000000", "currency": "USD"},
    ]
    entry = c.ok(L, "PostEntry", {"postings": postings})
    c.ok(L, "PostEntries", {"entries": [{"postings": postings, "key": "b-1"}]})
    assert c.ok(L, "ListEntries", {"account": "cash"})["items"]
    assert c.ok(L, "GetEntry", {"entry_id": entry["id"]})["id"] == entry["id"]
    hold = {"debit_account": "sales", "credit_account": "cash", "amount": 1000, "currency": "USD"}
    first = c.ok(L, "PlaceHold", {**hold, "timeout_seconds": 600})
    second = c.ok(L, "PlaceHold", {**hold, "timeout_seconds": 600})
    assert c.ok(L, "ListHolds", {"status": "pending"})["items"]
    assert c.ok(L, "GetHold", {"hold_id": first["id"]})["id"] == first["id"]
    assert c.ok(L, "PostHold", {"hold_id": first["id"], "amount": 400})["entry"]
    assert c.ok(L, "VoidHold", {"hold_id": second["id"]})["status"] == "voided"
    setting = {"currency": "USD", "seller_account": "cash", "platform_account": "sales"}
    put = c.ok("RoutingService", "PutPoolSettlement", {"pool_id": "leads", **setting})
    assert c.ok("RoutingService", "GetPoolSettlement", {"pool_id": "leads"}) == put

    c.ok(M, "CreateMeter", {"name": "calls", "unit": "call"})
    assert c.ok(M, "ListMeters")["items"]
    assert c.ok(M, "GetMeter", {"name": "calls"})["name"] == "calls"
    c.ok(M, "CreateBudget", {"meter": "calls", "limit": 100, "block": False})
    assert c.ok(M, "RecordUsage", {"meter": "calls", "amount": 2})["amount"] == 2
    assert c.ok(M, "ReadUsage", {"meter": "calls", "window": "day"})["items"]
    assert c.ok(M, "ListBudgets")["items"]
    assert c.ok(M, "GetBudget", {"meter": "calls"})["limit"] == 100
    assert c.ok(M, "PutBudget", {"meter": "calls", "limit": 50})["limit"] == 50
    c.ok(M, "DeleteBudget", {"meter": "calls"})
    c.ok(M, "CreatePlan", {"id": "pro", "entitlements": {"routing": {"enabled": True}}})
    assert c.ok(M, "ListPlans")["items"]
    assert c.ok(M, "GetPlan", {"plan_id": "pro"})["id"] == "pro"
    assert c.ok(M, "AssignPlan", {"plan": "pro"})["plan"]
    assert c.ok(M, "GetAssignedPlan")["plan"]

    assert c.ok(R, "ListReceipts")["items"] == []
    assert c.refused(R, "GetReceipt", {"receipt_id": "rcp_nope"})["connect"] == "not_found"
    # No payment processor is configured here: a clean `unavailable`.
    topup = c.call(W, "StartTopUp", {"account": "cash", "amount": 1000})
    assert topup.json()["details"][0]["debug"]["code"] == "wallet.unavailable"
    assert c.ok(W, "ListTopUps")["items"] == []
    assert c.refused(W, "GetTopUp", {"topup_id": "top_nope"})["connect"] == "not_found"


def _integrations(c: Caller) -> None:
    C, N, A, B = "ConnectionService", "InboxService", "AiService", "BridgeService"
    assert c.ok(C, "ListProviders")["items"]
    hook = {
        "name": "hook",
        "provider": "webhook",
        "config": {"url": "http://127.0.0.1:9/x"},
        "secrets": {"signing_secret": "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3"},
    }
    assert c.ok(C, "ValidateConnection", hook)["valid"] is True
    created = c.ok(C, "CreateConnection", hook)
    assert "whsec_" not in str(created), "a secret was shown"
    assert [x["name"] for x in c.ok(C, "ListConnections")["items"]] == ["hook"]
    assert c.ok(C, "GetConnection", {"name": "hook"}) == created
    assert c.ok(C, "UpdateConnection", {"name": "hook", "description": "the hook"})["description"]
    assert c.ok(C, "TestConnection", {"name": "hook"})["ok"] is False  # nothing listens there
    c.ok(C, "DeleteConnection", {"name": "hook"})

    sent = c.ok(N, "SendNotification", {"subscriber_id": "sam", "title": "Hi"})
    note = sent["notification"]["id"]
    assert c.ok(N, "ListNotifications", {"subscriber_id": "sam"})["notifications"]
    assert c.ok(N, "GetNotification", {"notification_id": note})["id"] == note
    c.ok(N, "DeleteNotification", {"notification_id": note})
    c.ok(N, "PutSubscriber", {"subscriber_id": "sam", "email": "sam@example.com"})
    assert c.ok(N, "GetSubscriber", {"subscriber_id": "sam"})["email"] == "sam@example.com"
    c.ok(N, "PutPreferences", {"subscriber_id": "sam", "rules": []})
    assert c.ok(N, "GetPreferences", {"subscriber_id": "sam"}) == {"rules": []}
    c.ok(N, "ListEmails")
    assert c.refused(N, "GetEmail", {"email_id": "em_nope"})["connect"] == "not_found"
    c.call(N, "GetInboxSecret")
    assert c.ok(N, "RotateInboxSecret")["secret"]

    c.ok(A, "GetAiSettings")
    c.ok(A, "PutAiSettings", {"timeout_seconds": 30})
    c.ok(A, "PutPrice", {"model": "gpt-x", "input_per_million": 100})
    assert c.ok(A, "ListPrices")["items"]
    assert c.ok(A, "GetPrice", {"model": "gpt-x"})["input_per_million"] == 100
    c.ok(A, "DeletePrice", {"model": "gpt-x"})
    assert c.ok(A, "ListAiRequests")["items"] == []
    assert c.refused(A, "GetAiRequest", {"request_id": "air_nope"})["connect"] == "not_found"

    assert c.ok(B, "ListApps")["items"] == []
    key = c.ok(B, "CreateAppKey", {"app_id": "shop"})
    assert c.ok(B, "ListAppKeys", {"app_id": "shop"})["items"]
    c.ok(B, "RevokeAppKey", {"app_id": "shop", "key_id": key["key_id"]})
    sync = c.call(B, "SyncApp", {"url": "http://127.0.0.1:9/api/ductor"})
    assert sync.json()["code"] == "unavailable"  # no bridge signing key on this server
    c.call(B, "ProbeApp", {"app_id": "shop"})


def _agent(c: Caller, http: httpx.Client, upstream: ScriptedUpstream) -> None:
    A = "AgentService"
    # No `openai` connection yet: refused before anything is stored.
    refused = c.refused(A, "CreateConversation", {"model": "echo", "message": "hi"})
    assert refused == {"connect": "failed_precondition", "code": "ai.no_connection", "status": 400}
    assert c.ok(A, "ListConversations")["items"] == []
    llm = {
        "name": "llm",
        "provider": "openai",
        "config": {"base_url": upstream.url},
        "secrets": {"api_key": UPSTREAM_KEY},
    }
    c.ok("ConnectionService", "CreateConnection", llm)

    started = c.ok(A, "CreateConversation", {"model": "echo", "connection": "llm"})
    assert started["turn"] is None
    conversation = started["conversation"]["id"]
    said = {"conversation_id": conversation, "content": "hello"}
    answer = c.call(A, "SendMessage", said, **{"Idempotency-Key": "say-1"})
    assert answer.status_code == 200, answer.text
    turn = answer.json()["turn"]
    assert (turn["status"], turn["answer"], turn["model_calls"]) == ("completed", "echo: hello", 1)
    replay = c.call(A, "SendMessage", said, **{"Idempotency-Key": "say-1"})
    assert replay.headers["Idempotency-Replayed"] == "true"
    assert replay.json()["turn"] == turn
    got = c.ok(A, "GetConversation", {"conversation_id": conversation})
    assert got == http.get(f"/v1/agent/conversations/{conversation}").json()
    assert [m["content"] for m in got["messages"]] == ["hello", "echo: hello"]
    listed = c.ok(A, "ListConversations", {"limit": 1})
    assert [x["id"] for x in listed["items"]] == [conversation]

    # A model call that fails: the turn's error names the conversation and turn.
    failed = c.call(A, "CreateConversation", {"model": "fail", "connection": "llm", "message": "x"})
    assert failed.json()["code"] == "unavailable", failed.text
    debug = failed.json()["details"][0]["debug"]
    assert debug["code"] == "ai.upstream_error"
    assert debug["details"]["turn"] == 1
    assert c.ok(A, "GetConversation", {"conversation_id": debug["details"]["conversation_id"]})
    missing = c.refused(A, "SendMessage", {"conversation_id": "agc_nope", "content": "hi"})
    assert missing["code"] == "agent.conversation_not_found"


def _keys(c: Caller, http: httpx.Client) -> None:
    K = "KeyService"
    bad = c.refused(K, "CreateKey", {"name": "x", "scopes": ["root"]})
    assert bad == {"connect": "invalid_argument", "code": "key.invalid", "status": 400}
    once = {"Idempotency-Key": "key-1"}
    made = c.call(K, "CreateKey", {"name": "ci", "scopes": ["read"]}, **once)
    assert made.status_code == 200, made.text
    created = made.json()
    assert created["key"].startswith("dk_")
    replay = c.call(K, "CreateKey", {"name": "ci", "scopes": ["read"]}, **once)
    assert replay.headers["Idempotency-Replayed"] == "true"
    assert replay.json() == {**created, "key": None}, "a replay showed the secret again"
    # The new key works, with its scope.
    with httpx.Client(
        base_url=str(http.base_url), headers={"Authorization": f"Bearer {created['key']}"}
    ) as reader:
        assert _rpc(reader, "KeyService/ListKeys", {}).json()["code"] == "permission_denied"
    assert created["id"] in [k["id"] for k in c.ok(K, "ListKeys", {"limit": 500})["items"]]
    got = c.ok(K, "GetKey", {"key_id": created["id"]})
    assert got == http.get(f"/v1/keys/{created['id']}").json()
    assert "key" not in got
    assert c.ok(K, "RevokeKey", {"key_id": created["id"]}) == {}
    assert c.ok(K, "GetKey", {"key_id": created["id"]})["status"] == "revoked"
    assert c.refused(K, "GetKey", {"key_id": "key_nope"})["connect"] == "not_found"


# --- tenants, duplicates, bad input ------------------------------------------------


def _rpc(http: httpx.AsyncClient | httpx.Client, path: str, body: Any, **headers: str) -> Any:
    return http.post(f"/ductor.v1.{path}", json=body, headers={**JSON, **headers})


def test_another_tenant_finds_nothing(postgres: ServerProcess) -> None:
    with postgres.client() as http:
        http.post("/v1/workflows", json=HELLO)
        run = http.post("/v1/runs", json={"family_slug": "hello", "input": {"name": "x"}}).json()
        (key, *_) = http.get("/v1/keys").json()["items"]
    with postgres.client(other_key(postgres, "globex")) as stranger:
        rerun = _rpc(stranger, "RunService/RerunRun", {"run_id": run["id"]})
        assert rerun.json()["details"][0]["debug"]["code"] == "run.not_found"
        for method in ("GetKey", "RevokeKey"):
            touched = _rpc(stranger, f"KeyService/{method}", {"key_id": key["id"]})
            assert touched.json()["details"][0]["debug"]["code"] == "key.not_found"
        missing = _rpc(stranger, "RunService/GetRun", {"run_id": run["id"]})
        assert missing.status_code == 404
        assert missing.json()["details"][0]["debug"]["code"] == "run.not_found"
        cancel = _rpc(stranger, "RunService/CancelRun", {"run_id": run["id"]})
        assert cancel.json()["code"] == "not_found"
        listed = _rpc(stranger, "WorkflowService/ListWorkflows", {})
        assert listed.json() == {"items": []}
        runs = _rpc(stranger, "RunService/ListRuns", {}).json()
        assert runs["items"] == []
        trigger = _rpc(stranger, "RunService/TriggerRun", {"family_slug": "hello"})
        assert trigger.json()["details"][0]["debug"]["code"] == "workflow.not_found"


def test_an_idempotency_key_is_the_tenants_own(sqlite: ServerProcess) -> None:
    # Another tenant sending the same Idempotency-Key with the same request is
    # answered for itself: never the first tenant's run, nor a replay of it.
    trigger = {"family_slug": "hello", "input": {"name": "same"}}
    once = {"Idempotency-Key": "shared-by-two"}
    with sqlite.client() as http:
        http.post("/v1/workflows", json=HELLO)
        mine = _rpc(http, "RunService/TriggerRun", trigger, **once)
        assert mine.status_code == 200, mine.text
    with sqlite.client(other_key(sqlite, "umbrella")) as stranger:
        missing = _rpc(stranger, "RunService/TriggerRun", trigger, **once)
        assert missing.status_code == 404
        assert missing.json()["details"][0]["debug"]["code"] == "workflow.not_found"
        assert "Idempotency-Replayed" not in missing.headers
        stranger.post("/v1/workflows", json=HELLO)
        theirs = _rpc(stranger, "RunService/TriggerRun", trigger, **once)
        assert theirs.status_code == 200, theirs.text
        assert "Idempotency-Replayed" not in theirs.headers
        assert theirs.json()["id"] != mine.json()["id"]
        again = _rpc(stranger, "RunService/TriggerRun", trigger, **once)
        assert again.headers["Idempotency-Replayed"] == "true"
        assert again.json()["id"] == theirs.json()["id"]


def test_an_error_repeats_at_most_a_bounded_part_of_the_request(sqlite: ServerProcess) -> None:
    with sqlite.client() as http:
        missing = _rpc(http, "RunService/TriggerRun", {"family_slug": "s" * 100_000})
    assert missing.status_code == 404
    assert len(missing.content) < 5_000
    assert missing.json()["message"].endswith("more characters)")
    debug = missing.json()["details"][0]["debug"]
    assert debug["code"] == "workflow.not_found"
    assert debug["details"]["family_slug"] == "s" * 974 + "… (99026 more characters)"


def test_get_run_waits_for_the_run_to_end(postgres: ServerProcess) -> None:
    # GetRun's `wait` is REST's long poll: held until the run ends (a signal
    # sent meanwhile), or answered as it stands once the time is up.
    with postgres.client() as http, ThreadPoolExecutor(1) as pool:
        http.post("/v1/workflows", json=GATE)
        run = http.post("/v1/runs", json={"family_slug": "gate"}).json()
        started = time.monotonic()
        held = _rpc(http, "RunService/GetRun", {"run_id": run["id"], "wait": 0.3})
        assert held.status_code == 200, held.text
        assert held.json()["status"] == "RUN_STATUS_RUNNING"
        assert time.monotonic() - started >= 0.3

        waiting = pool.submit(
            lambda: _rpc(http, "RunService/GetRun", {"run_id": run["id"], "wait": 30})
        )
        time.sleep(0.3)
        assert not waiting.done()
        signal = http.post(f"/v1/runs/{run['id']}/signals/approve", json={"payload": 1})
        assert signal.status_code == 202, signal.text
        ended = waiting.result(timeout=20)
        assert ended.status_code == 200, ended.text
        assert ended.json()["status"] == "RUN_STATUS_SUCCEEDED"
        assert ended.json() == http.get(f"/v1/runs/{run['id']}").json()

        for wait in (0, -1, 60.5, "soon"):
            refused = _rpc(http, "RunService/GetRun", {"run_id": run["id"], "wait": wait})
            assert refused.status_code == 400, refused.text
            assert refused.json()["code"] == "invalid_argument"
            assert refused.json()["details"][0]["debug"]["details"]["path"] == "$.wait"
    with postgres.client(other_key(postgres, "initech")) as stranger:
        started = time.monotonic()
        missing = _rpc(stranger, "RunService/GetRun", {"run_id": run["id"], "wait": 30})
        assert missing.status_code == 404
        assert time.monotonic() - started < 10  # not held


def test_a_method_needs_the_scope_of_its_rest_call(sqlite: ServerProcess) -> None:
    with sqlite.client() as http:
        http.post("/v1/workflows", json=HELLO)
        # Other tests of the module start runs of this tenant too.
        before = http.get("/v1/runs", params={"limit": 500}).json()["items"]
        made = http.post("/v1/keys", json={"name": "reader", "scopes": ["read"]})
        assert made.status_code == 201, made.text
        reader_key = made.json()["key"]
        expired = http.post(
            "/v1/keys", json={"name": "gone", "scopes": ["read"], "expires_in": "1s"}
        ).json()["key"]
    with sqlite.client(reader_key) as reader:
        listed = _rpc(reader, "WorkflowService/ListWorkflows", {})
        assert listed.status_code == 200, listed.text
        refused = _rpc(reader, "RunService/TriggerRun", {"family_slug": "hello"})
        assert refused.status_code == 403, refused.text
        assert refused.json()["code"] == "permission_denied"
        debug = refused.json()["details"][0]["debug"]
        assert debug["code"] == "auth.forbidden"
        assert debug["details"]["needed"] == "write"
        assert _rpc(reader, "RunService/ListRuns", {}).status_code == 200
        # Re-running needs `write` (refused before the run is looked up); making a
        # key needs `admin`.
        for path, body, needed in (
            ("RunService/RerunRun", {"run_id": "run_anything"}, "write"),
            ("KeyService/CreateKey", {"name": "mine", "scopes": ["read"]}, "admin"),
        ):
            refused = _rpc(reader, path, body)
            assert refused.status_code == 403, refused.text
            assert refused.json()["code"] == "permission_denied"
            assert refused.json()["details"][0]["debug"]["details"]["needed"] == needed
    with sqlite.client() as http:
        runs = http.get("/v1/runs", params={"limit": 500}).json()["items"]
        keys = http.get("/v1/keys", params={"limit": 500}).json()["items"]
    assert runs == before  # the refused trigger started nothing
    assert "mine" not in [k["name"] for k in keys]  # nor did the refused create
    time.sleep(1.5)
    with sqlite.client(expired) as late:
        gone = _rpc(late, "WorkflowService/ListWorkflows", {})
        assert gone.status_code == 401
        assert gone.json()["details"][0]["debug"]["code"] == "auth.key_expired"


def test_ten_concurrent_duplicates_start_one_run(postgres: ServerProcess) -> None:
    async def race() -> list[httpx.Response]:
        headers = {"Authorization": f"Bearer {postgres.api_key}", "Idempotency-Key": "dup-10"}
        async with httpx.AsyncClient(base_url=postgres.url, headers=headers, timeout=60) as http:
            body = {"family_slug": "hello", "input": {"name": "dup"}}
            return await asyncio.gather(
                *(_rpc(http, "RunService/TriggerRun", body) for _ in range(10))
            )

    with postgres.client() as http:
        http.post("/v1/workflows", json=HELLO)
    answers = asyncio.run(race())
    assert [a.status_code for a in answers] == [200] * 10
    assert len({a.json()["id"] for a in answers}) == 1
    assert sum(a.headers.get("Idempotency-Replayed") == "true" for a in answers) == 9
    run_id = answers[0].json()["id"]
    with postgres.client() as http:
        # REST shares the key's store: the same key there answers the same run.
        rest = http.post(
            "/v1/runs",
            json={"family_slug": "hello", "input": {"name": "dup"}},
            headers={"Idempotency-Key": "dup-10"},
        )
        assert rest.json()["id"] == run_id
        assert rest.headers["Idempotency-Replayed"] == "true"
        changed = _rpc(
            http,
            "RunService/TriggerRun",
            {"family_slug": "hello", "input": {"name": "other"}},
            **{"Idempotency-Key": "dup-10"},
        )
        assert changed.status_code == 400
        assert changed.json()["code"] == "failed_precondition"
        assert changed.json()["details"][0]["debug"]["code"] == "idempotency.conflict"
        mine = http.get("/v1/runs?family_slug=hello").json()["items"]
        assert sum(r["id"] == run_id for r in mine) == 1


def test_a_budget_put_over_rest_is_replayed_over_connect(sqlite: ServerProcess) -> None:
    # PutBudget names its meter in the request, REST in the path: one key is one
    # request whichever way the meter is named.
    budget = {"limit": 10, "window": "month"}
    with sqlite.client() as http:
        assert http.post("/v1/meters", json={"name": "replayed", "unit": "call"}).is_success
        once = {"Idempotency-Key": "budget-1"}
        first = http.put("/v1/budgets/replayed", json=budget, headers=once)
        assert first.status_code == 201, first.text
        again = _rpc(http, "MeteringService/PutBudget", {"meter": "replayed", **budget}, **once)
        assert again.status_code == 200, again.text
        assert again.headers["Idempotency-Replayed"] == "true"
        assert again.json() == first.json()
        named = http.put("/v1/budgets/replayed", json={"meter": "replayed", **budget}, headers=once)
        assert named.headers["Idempotency-Replayed"] == "true"
        other = _rpc(
            http, "MeteringService/PutBudget", {"meter": "replayed", "limit": 11}, **once
        ).json()
        assert other["details"][0]["debug"]["code"] == "idempotency.conflict"


def test_bad_input_is_invalid_argument_with_rests_message(sqlite: ServerProcess) -> None:
    with sqlite.client() as http:

        def refused(body: bytes, **headers: str) -> tuple[int, dict[str, Any]]:
            response = http.post(
                "/ductor.v1.RunService/TriggerRun", content=body, headers={**JSON, **headers}
            )
            return response.status_code, response.json()

        status, error = refused(b'{"family_slug": "x", "version": "one"}')
        rest = http.post("/v1/runs", content=b'{"family_slug": "x", "version": "one"}').json()
        assert status == 400
        assert error["code"] == "invalid_argument"
        assert error["message"] == rest["message"]
        assert error["details"][0]["debug"] == {"code": rest["code"], "details": rest["details"]}

        status, error = refused(b'{"family_slug": "x", "nope": 1}')
        assert error["details"][0]["debug"]["details"]["path"] == "$.nope"
        assert "nope" in error["message"]

        status, error = refused(b'{"family_slug": ')
        assert error["details"][0]["debug"]["code"] == "request.malformed_json"

        deep = b'{"family_slug": "x", "input": ' + b"[" * 100 + b"]" * 100 + b"}"
        status, error = refused(deep)
        assert "nested more than 64" in error["message"]

        huge = b'{"family_slug": "' + b"x" * (3 * 1024 * 1024) + b'"}'
        status, error = refused(huge)
        assert status == 429
        assert error["code"] == "resource_exhausted"
        limit = http.post("/v1/runs", content=huge).json()
        assert limit["code"] == "request.too_large"
        assert error["message"] == limit["message"]
        assert error["details"][0]["debug"] == {"code": limit["code"], "details": limit["details"]}
        # An integer stays one in the detail's JSON.
        assert isinstance(error["details"][0]["debug"]["details"]["max_body_bytes"], int)

        def chunks() -> Iterator[bytes]:
            # No content-length: the bytes read pass the limit.
            for start in range(0, len(huge), 65536):
                yield huge[start : start + 65536]

        streamed = http.post("/ductor.v1.RunService/TriggerRun", content=chunks(), headers=JSON)
        assert streamed.status_code == 429
        assert streamed.json()["details"][0]["debug"]["code"] == "request.too_large"

        # A gzip body (Connect's Content-Encoding) is held to the limit once
        # inflated: a 200 KB bomb of 200 MB is refused as the same body sent plain.
        bomb = gzip.compress(b'{"family_slug": "x"' + b" " * (200 * 1024 * 1024) + b"}", 9)
        status, error = refused(bomb, **{"Content-Encoding": "gzip"})
        assert (status, error["message"]) == (429, limit["message"])
        assert error["details"][0]["debug"] == {"code": limit["code"], "details": limit["details"]}
        small = gzip.compress(b'{"family_slug": "x", "nope": 1}')
        status, error = refused(small, **{"Content-Encoding": "gzip"})
        assert error["details"][0]["debug"]["details"]["path"] == "$.nope"
        status, error = refused(b'{"family_slug": "x"}', **{"Content-Encoding": "gzip"})
        assert (status, error["code"]) == (400, "invalid_argument")
        assert error["details"][0]["debug"] == {
            "code": "request.invalid",
            "details": {"header": "Content-Encoding"},
        }

        status, error = refused(b'{"family_slug": "x"}', **{"Idempotency-Key": "k" * 300})
        assert error["details"][0]["debug"]["details"] == {"header": "Idempotency-Key"}

        proto = http.post(
            "/ductor.v1.RunService/GetRun",
            content=b"\n\x01x",
            headers={"Content-Type": "application/proto"},
        )
        assert proto.status_code == 415
        # A method that does not exist is an unknown route, as on REST.
        unknown = http.post("/ductor.v1.RunService/StartRun", content=b"{}", headers=JSON)
        assert unknown.status_code == 404
        error = unknown.json()
        assert (error["code"], error["message"]) == ("unimplemented", "no such route")
        assert error["details"][0]["debug"] == {
            "code": "route.not_found",
            "details": {"method": "POST", "path": "/ductor.v1.RunService/StartRun"},
        }
        assert error["details"][0]["value"]
        # The server still answers.
        assert _rpc(http, "WorkflowService/ListWorkflows", {}).status_code == 200


def test_only_connects_unary_json_is_served(sqlite: ServerProcess) -> None:
    # A POST whose Content-Type is not application/json, or a GET without
    # encoding=json, is a bare 415 before the key is read: gRPC and gRPC-web are
    # not served, and the library would take `json` alone as the JSON codec.
    path = "/ductor.v1.WorkflowService/ListWorkflows"
    with httpx.Client(base_url=sqlite.url, timeout=30) as anyone:
        for content_type in (
            "application/grpc",
            "application/grpc+json",
            "application/grpc-web+json",
            "application/connect+json",
            "application/proto",
            "json",
            "text/plain",
            "",
        ):
            refused = anyone.post(path, content=b"{}", headers={"Content-Type": content_type})
            assert refused.status_code == 415, (content_type, refused.status_code)
            assert refused.content == b""
            assert refused.headers["Accept-Post"] == "application/json"
        for pair in (("text/plain", "application/json"), ("application/json", "text/plain")):
            # Two Content-Types: not one that is JSON.
            headers = [("Content-Type", content_type) for content_type in pair]
            refused = anyone.post(path, content=b"{}", headers=headers)
            assert refused.status_code == 415, pair
            assert refused.headers["Accept-Post"] == "application/json"
        for params in ({"message": "{}"}, {"encoding": "proto", "message": "{}"}):
            refused = anyone.get(path, params=params)
            assert refused.status_code == 415, params
            assert refused.content == b""
    assert "Traceback" not in sqlite.log()
    with sqlite.client() as http:
        listed = http.post(path, json={}, headers={"Content-Type": "application/json"}).json()
        for content_type in ("application/json; charset=utf-8", "Application/JSON"):
            answer = http.post(path, content=b"{}", headers={"Content-Type": content_type})
            assert answer.status_code == 200, content_type
            assert answer.json() == listed
        by_get = http.get(path, params={"encoding": "json", "message": "{}"})
        assert by_get.status_code == 200
        assert by_get.json() == listed


def test_an_encoding_not_served_is_invalid_argument_naming_where(sqlite: ServerProcess) -> None:
    # Only gzip (and identity) is inflated. Another Content-Encoding, or GET's
    # `compression`, is bad input, answered 400 `invalid_argument` naming the
    # header or parameter, never a 5xx; content codings are case-insensitive.
    path = "/ductor.v1.WorkflowService/ListWorkflows"
    body = gzip.compress(b"{}")
    with sqlite.client() as http:
        listed = http.post(path, content=b"{}", headers=JSON).json()
        for encoding in ("GZIP", "Gzip", "identity, gzip"):
            sent = http.post(path, content=body, headers={**JSON, "Content-Encoding": encoding})
            assert (sent.status_code, sent.json()) == (200, listed), encoding
        for encoding in ("br", "deflate", "gzip, gzip", "x" * 5000):
            refused = http.post(path, content=body, headers={**JSON, "Content-Encoding": encoding})
            assert refused.status_code == 400, (encoding[:20], refused.status_code)
            error = refused.json()
            assert error["code"] == "invalid_argument"
            assert error["details"][0]["debug"] == {
                "code": "request.invalid",
                "details": {"header": "Content-Encoding"},
            }
            assert len(error["message"]) < 300
        # Without a key, the same answer (the header is read before the key, as
        # Content-Type is).
        anyone = httpx.post(
            sqlite.url + path, content=body, headers={**JSON, "Content-Encoding": "br"}
        )
        assert anyone.status_code == 400
        for version in ("v2", ""):
            params = {"encoding": "json", "message": "{}", "connect": version}
            refused = http.get(path, params=params)
            assert refused.status_code == 400, version
            assert refused.json()["details"][0]["debug"]["details"] == {"parameter": "connect"}
        by_get = http.get(path, params={"encoding": "json", "message": "{}", "connect": "v1"})
        assert by_get.json() == listed
        # A base64 message (`base64=1`) is URL-safe base64, with or without
        # padding; anything else is refused, not read as some other message.
        for message in ("!!!", "e30!!", "e", "e3 0"):
            params = {"encoding": "json", "message": message, "base64": "1"}
            refused = http.get(path, params=params)
            assert refused.status_code == 400, message
            assert refused.json()["details"][0]["debug"] == {
                "code": "request.invalid",
                "details": {"parameter": "message"},
            }
        for message in ("e30", "e30=", base64.urlsafe_b64encode(gzip.compress(b"{}")).decode()):
            params = {"encoding": "json", "message": message, "base64": "1"}
            if len(message) > 4:
                params["compression"] = "gzip"
            assert http.get(path, params=params).json() == listed, message
        for compression, message in (("br", "{}"), ("gzip", "{}")):
            params = {"encoding": "json", "message": message, "compression": compression}
            refused = http.get(path, params=params)
            assert refused.status_code == 400, compression
            assert refused.json()["details"][0]["debug"] == {
                "code": "request.invalid",
                "details": {"parameter": "compression"},
            }
    assert "Traceback" not in sqlite.log()


def test_hostile_bodies_are_clear_connect_errors(sqlite: ServerProcess) -> None:
    # What a hostile client sends instead of a request message is invalid_argument
    # (or resource_exhausted past the limit) with a detail saying what is wrong,
    # never a 5xx: a body that is not an object, binary protobuf labelled JSON,
    # bytes that are not UTF-8, gzip cut short or followed by junk, a streaming
    # request's Connect-Content-Encoding on a unary call, and a GET's gzip bomb.
    path = "/ductor.v1.RunService/ListRuns"
    with sqlite.client() as http:
        limit = http.post("/v1/runs", content=b"x" * (2 * 1024 * 1024)).json()

        def refused(body: bytes, **headers: str) -> tuple[int, str, dict[str, Any]]:
            answer = http.post(path, content=body, headers={**JSON, **headers})
            error = answer.json()
            (detail,) = error["details"]
            return answer.status_code, error["code"], detail["debug"]

        for body in (b"[]", b"null", b"1", b'"x"'):
            status, code, debug = refused(body)
            assert (status, code, debug["code"]) == (400, "invalid_argument", "request.invalid")
            assert debug["details"]["path"] == "$", body
        for body in (b"\n\x05hello\x10\x01", b'{"family_slug": "\xff"}', b"\xef\xbb\xbf{}"):
            status, code, debug = refused(body)
            assert (status, code, debug["code"]) == (
                400,
                "invalid_argument",
                "request.malformed_json",
            ), body
        plain = gzip.compress(b'{"limit": 5}')
        for body in (plain[:-6], plain + b"junk", b"{}"):
            status, code, debug = refused(body, **{"Content-Encoding": "gzip"})
            assert (status, code) == (400, "invalid_argument")
            assert debug == {"code": "request.invalid", "details": {"header": "Content-Encoding"}}
        # Connect-Content-Encoding belongs to streaming calls: a unary body it
        # names is read as sent (here gzip bytes, which are no JSON).
        status, code, debug = refused(plain, **{"Connect-Content-Encoding": "gzip"})
        assert (status, debug["code"]) == (400, "request.malformed_json")

        bomb = gzip.compress(b"{" + b" " * (8 * 1024 * 1024) + b"}", 9)
        params = {
            "encoding": "json",
            "message": base64.urlsafe_b64encode(bomb).decode().rstrip("="),
            "base64": "1",
            "compression": "gzip",
        }
        started = time.monotonic()
        by_get = http.get(path, params=params)
        assert time.monotonic() - started < 10
        assert by_get.status_code == 429, by_get.text
        error = by_get.json()
        assert (error["code"], error["message"]) == ("resource_exhausted", limit["message"])
        assert error["details"][0]["debug"] == {"code": limit["code"], "details": limit["details"]}
        assert _rpc(http, "RunService/ListRuns", {}).status_code == 200
    assert "Traceback" not in sqlite.log()


def test_header_bytes_beyond_ascii_read_as_rest_reads_them(sqlite: ServerProcess) -> None:
    # HTTP header values are bytes; both transports read them as Latin-1, so a
    # key with bytes past ASCII (UTF-8 or not) is one key over REST and Connect,
    # and no header is a 500.
    with sqlite.client() as http:
        http.post("/v1/workflows", json=HELLO)
        trigger = {"family_slug": "hello", "input": {"name": "x"}}
        for raw_key in (b"k-\xc3\xa9-utf8", b"k-\xff\xfe-latin1"):
            rest = http.post("/v1/runs", json=trigger, headers={"Idempotency-Key": raw_key})
            assert rest.status_code == 201, rest.text
            again = http.post(
                "/ductor.v1.RunService/TriggerRun",
                json=trigger,
                headers=[("Content-Type", "application/json"), ("Idempotency-Key", raw_key)],
            )
            assert again.status_code == 200, again.text
            assert again.headers["Idempotency-Replayed"] == "true"
            assert again.json()["id"] == rest.json()["id"]
        for name, value in (
            ("Authorization", b"Bearer \xffnope"),
            ("Connect-Timeout-Ms", b"1\xff"),
        ):
            refused = httpx.post(
                sqlite.url + "/ductor.v1.WorkflowService/ListWorkflows",
                content=b"{}",
                headers=[("Content-Type", "application/json"), (name, value)],
            )
            assert 400 <= refused.status_code < 500, (name, refused.status_code)
    assert "Traceback" not in sqlite.log()


def test_a_deadline_that_passes_is_deadline_exceeded_and_a_retry_answers(
    sqlite: ServerProcess,
) -> None:
    # Connect-Timeout-Ms bounds the call: past it the answer is 504
    # deadline_exceeded, and a retry with the same key answers what was done
    # (here nothing: the deadline passed before the call began).
    with sqlite.client() as http:
        http.post("/v1/workflows", json=HELLO)
        trigger = {"family_slug": "hello", "input": {"name": "late"}}
        late = _rpc(
            http,
            "RunService/TriggerRun",
            trigger,
            **{"Connect-Timeout-Ms": "0", "Idempotency-Key": "late-1"},
        )
        assert late.status_code == 504
        assert late.json() == {"code": "deadline_exceeded", "message": "Request timed out"}
        retried = _rpc(http, "RunService/TriggerRun", trigger, **{"Idempotency-Key": "late-1"})
        assert retried.status_code == 200
        assert "Idempotency-Replayed" not in retried.headers
        again = _rpc(http, "RunService/TriggerRun", trigger, **{"Idempotency-Key": "late-1"})
        assert again.headers["Idempotency-Replayed"] == "true"
        assert again.json()["id"] == retried.json()["id"]
        roomy = _rpc(
            http,
            "RunService/GetRun",
            {"run_id": retried.json()["id"]},
            **{"Connect-Timeout-Ms": "9999999999"},
        )
        assert roomy.status_code == 200


def test_an_answer_is_gzipped_when_accept_encoding_names_gzip(sqlite: ServerProcess) -> None:
    # Accept-Encoding is read as HTTP has it: case-insensitive, with q-values
    # (q=0 refuses a coding); an error is always plain.
    path = "/ductor.v1.WorkflowService/ListWorkflows"
    with sqlite.client() as http:
        listed = http.post(path, content=b"{}", headers=JSON).json()
        for accepted, gzipped in (
            ("gzip", True),
            ("GZIP", True),
            ("gzip;q=1.0", True),
            ("deflate, br;q=0.9, gzip;q=0.5", True),
            ("*", True),
            ("gzip;q=0", False),
            ("gzip; q=0.000, identity", False),
            ("identity", False),
            ("br", False),
        ):
            answer = http.post(path, content=b"{}", headers={**JSON, "Accept-Encoding": accepted})
            assert answer.status_code == 200
            assert (answer.headers.get("Content-Encoding") == "gzip") is gzipped, accepted
            assert answer.json() == listed
        error = http.post(
            "/ductor.v1.RunService/GetRun",
            json={"run_id": "run_missing"},
            headers={**JSON, "Accept-Encoding": "gzip;q=1.0"},
        )
        assert error.status_code == 404
        assert "Content-Encoding" not in error.headers


def test_a_long_id_is_found_or_refused_as_on_rest(sqlite: ServerProcess) -> None:
    # Ids and names are 1 to 256 characters: one that long is reached over
    # Connect too, and a longer one is answered as REST answers it.
    worker_id = "w" * 256
    with sqlite.client() as http:
        made = http.post("/v1/workers", json={"id": worker_id})
        assert made.status_code in (200, 201), made.text
        got = _rpc(http, "RoutingService/GetWorker", {"worker_id": worker_id})
        assert got.status_code == 200, got.text
        assert got.json() == http.get(f"/v1/workers/{worker_id}").json()
        assert _rpc(http, "RoutingService/DeleteWorker", {"worker_id": worker_id}).json() == {}
        assert http.get(f"/v1/workers/{worker_id}").status_code == 404

        long_run = "run_" + "x" * 300
        missing = _rpc(http, "RunService/GetRun", {"run_id": long_run})
        rest = http.get(f"/v1/runs/{long_run}").json()
        assert missing.status_code == 404
        assert missing.json()["message"] == rest["message"]
        assert missing.json()["details"][0]["debug"] == {
            "code": rest["code"],
            "details": rest["details"],
        }

        http.post("/v1/workflows", json=GATE)
        run = http.post("/v1/runs", json={"family_slug": "gate"}).json()
        name = "s" * 257
        refused = _rpc(http, "RunService/SignalRun", {"run_id": run["id"], "name": name})
        rest = http.post(f"/v1/runs/{run['id']}/signals/{name}", json={}).json()
        assert refused.status_code == 400
        assert refused.json()["message"] == rest["message"]
        # REST names the path parameter, Connect the request's field.
        assert rest["details"]["path"] == "name"
        assert refused.json()["details"][0]["debug"]["details"] == {
            **rest["details"],
            "path": "$.name",
        }
        signalled = _rpc(http, "RunService/SignalRun", {"run_id": run["id"], "name": "s" * 256})
        assert signalled.status_code == 200, signalled.text


# --- docs/connect.md -------------------------------------------------------------------


def test_the_docs_examples_run(sqlite: ServerProcess) -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "connect.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", doc, re.DOTALL)
    assert len(blocks) == 2
    env = {**os.environ, "DUCTOR_URL": sqlite.url, "DUCTOR_API_KEY": other_key(sqlite, "docs")}
    outputs = []
    for block in blocks:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block.replace("curl -s", "curl -sS")],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    published, run, runs = (json.loads(line) for line in _documents(outputs[0]))
    assert published["family_slug"] == "hello"
    assert run["family_slug"] == "hello"
    assert run["idempotency_key"] == "hello-1"
    assert [r["id"] for r in runs["items"]] == [run["id"]]
    error = json.loads(outputs[1])
    shown = json.loads(re.findall(r"```json\n(.*?)\n```", doc, re.DOTALL)[0])
    assert error["details"][0]["value"]
    shown["details"][0]["value"] = error["details"][0]["value"]
    assert error == shown


def _documents(text: str) -> list[str]:
    # curl prints one JSON document per call, without newlines between them.
    decoder, at, found = json.JSONDecoder(), 0, []
    while at < len(text):
        _, end = decoder.raw_decode(text, at)
        found.append(text[at:end])
        at = end
    return found
