"""The bridge proof: the example Litestar app and the Ductor server as real processes.

An event triggers a workflow that runs steps, sleeps, waits for an event and a
signal the test sends, invokes a second workflow and completes with the right
output. The app is killed mid-run and restarted: the run completes and no step
body that succeeded runs again (nor does one in flight when the store stalls
past the task lease). A failing step is retried; a non-retriable
error fails the run with the error shown; changed code is detected; inline
runs checkpoint; bad or expired signatures are refused and record nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ductor import Client, Context
from ductor.api import ApiClient
from ductor.protocol import (
    APP_HEADER,
    INLINE_LIMIT_BYTES,
    SIGNATURE_HEADER,
    CheckpointRequest,
    DescribeResponse,
    ExecutePayload,
    ExecuteRequest,
    InlineRunRequest,
    SigningKeys,
    StepRunOp,
    decode,
    encode,
    new_nonce,
    signature_header,
)
from ductor_server.services.keys import hash_api_key
from ductor_server.storage import open_store

from .conftest import ChildProcess

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "examples" / "bridge_app" / "app.py"
KEY = "signkey-e2e-0001"
TIMEOUT = 60.0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class AppProcess(ChildProcess):
    """The example app as a real process, restartable on the same port and log."""

    def __init__(self, server: Any, tmp_path: Path) -> None:
        self.server = server
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/api/ductor"
        self.log_path = tmp_path / "steps.log"
        self.out_path = tmp_path / "app-output.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, variant: str = "1", *, checkpoint: bool = False, key: str = KEY) -> AppProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DUCTOR_", "BRIDGE_"))}
        env.update(
            DUCTOR_URL=self.server.url,
            DUCTOR_API_KEY=self.server.api_key,
            DUCTOR_BRIDGE_SIGNING_KEY=key,
            BRIDGE_APP_URL=self.url,
            BRIDGE_APP_LOG=str(self.log_path),
            BRIDGE_APP_VARIANT=variant,
            BRIDGE_APP_CHECKPOINT="1" if checkpoint else "0",
            PYTHONUNBUFFERED="1",
        )
        out = self.out_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, str(APP), "--port", str(self.port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        out.close()
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"app exited {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url, timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"app not up in 30s:\n{self.output()}")
            time.sleep(0.1)
        return self

    def output(self) -> str:
        return self.out_path.read_text(errors="replace") if self.out_path.exists() else ""

    def lines(self) -> list[str]:
        if not self.log_path.exists():
            return []
        return self.log_path.read_text(encoding="utf-8").splitlines()

    def count(self, line: str) -> int:
        return sum(1 for seen in self.lines() if seen == line)


@pytest.fixture
def bridge(
    make_server: Callable[..., Any], tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Any, AppProcess]]:
    """A started server with the bridge key (SQLite, or the backend given by indirect
    parametrization), and a started example app."""
    backend = getattr(request, "param", "sqlite")
    database_url = request.getfixturevalue("postgres_url") if backend == "postgres" else None
    server = make_server(
        "bridge", database_url=database_url, env={"DUCTOR_BRIDGE_SIGNING_KEY": KEY}
    ).start()
    app = AppProcess(server, tmp_path).start()
    try:
        yield server, app
    finally:
        app.stop()


def _run(http: httpx.Client, run_id: str) -> dict[str, Any]:
    response = http.get(f"/v1/runs/{run_id}")
    assert response.status_code == 200, response.text
    run: dict[str, Any] = response.json()
    return run


def _wait(http: httpx.Client, run_id: str, check: Callable[[dict[str, Any]], bool]) -> None:
    deadline = time.monotonic() + TIMEOUT
    run: dict[str, Any] = {}
    while time.monotonic() < deadline:
        run = _run(http, run_id)
        if check(run):
            return
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} never got there: {run}")


def _waiting_for(what: str) -> Callable[[dict[str, Any]], bool]:
    """A step waits for `what` ("signal approve"), or for a timer when `what` is "timer"."""

    def waits(step: dict[str, Any]) -> bool:
        if what == "timer":
            return (step.get("waiting_for") or "").startswith("timer ")
        return bool(step.get("waiting_for") == what)

    return lambda run: any(waits(step) for step in run["steps"])


def _trigger(http: httpx.Client, workflow: str, input: Any = None) -> str:
    response = http.post(
        "/v1/runs", json={"family_slug": f"bridge:shop:{workflow}", "input": input}
    )
    assert response.status_code == 201, response.text
    run_id: str = response.json()["id"]
    return run_id


@pytest.mark.parametrize("bridge", ["sqlite", "postgres"], indirect=True)
def test_an_event_runs_a_workflow_using_every_primitive(bridge: tuple[Any, AppProcess]) -> None:
    server, app = bridge
    with server.client() as http:
        apps = http.get("/v1/bridge/apps").json()
        assert [a["app_id"] for a in apps] == ["shop"]
        assert "fulfil-order" in apps[0]["workflows"]
        assert apps[0]["stale"] is False

        # A DAG workflow on the same event whose input schema the event fails.
        strict = {
            "family_slug": "strict-orders",
            "triggers": [{"event": "order.created"}],
            "input_schema": {"type": "object", "required": ["customer"]},
            "steps": [{"ref": "n", "type": "STEP_TYPE_ACTION", "args": {"action": "noop"}}],
        }
        assert http.post("/v1/workflows", json=strict).status_code == 201

        # The SDK's own REST client, against the real server's bodies and answers.
        with ApiClient(server.url, api_key=server.api_key) as api:
            sent = api.send_event("order.created", {"id": 7, "total": 500})
        assert sent.name == "order.created"
        assert sent.duplicate is False
        [run_id] = sent.runs_started
        [refused] = sent.runs_refused
        assert (refused.family_slug, refused.version, refused.code) == (
            "strict-orders",
            1,
            "run.input_invalid",
        )
        assert [p["pointer"] for p in refused.problems] == ["/data/customer"]

        _wait(http, run_id, _waiting_for("event order.shipped"))
        other = {"name": "order.shipped", "data": {"order_id": 8, "carrier": "dhl"}}
        assert http.post("/v1/events", json=other).status_code == 202
        mine = {"name": "order.shipped", "data": {"order_id": 7, "carrier": "ups"}}
        assert http.post("/v1/events", json=mine).status_code == 202
        _wait(http, run_id, _waiting_for("signal approve"))
        with ApiClient(server.url, api_key=server.api_key) as api:
            api.signal(run_id, "approve", "ops", id="approve-7")
            api.signal(run_id, "approve", "someone else", id="approve-7")  # a repeat: ignored
        run = server.wait_for_run(run_id, timeout=TIMEOUT)

    assert run["status"] == "RUN_STATUS_SUCCEEDED", run
    assert run["family_slug"] == "bridge:shop:fulfil-order"
    assert run["output"] == {
        "charge": {"charge_id": "ch_7", "amount": 500},
        "carrier": "ups",
        "approved_by": "ops",
        "labels": ["box-7", "invoice-7"],
        "receipt": {"sent": True, "charge_id": "ch_7"},
    }
    steps = {s["ref"]: s for s in run["steps"]}
    for ref in ("charge", "cool-off", "shipped", "approval", "label-box", "receipt"):
        assert steps[ref]["status"] == "STEP_STATUS_SUCCEEDED", steps[ref]
    assert app.count("done charge") == 1
    assert app.count("done send") == 1


@pytest.mark.parametrize("bridge", ["sqlite", "postgres"], indirect=True)
def test_the_app_killed_mid_run_restarts_and_no_succeeded_step_runs_twice(
    bridge: tuple[Any, AppProcess],
) -> None:
    server, app = bridge
    with server.client() as http:
        run_id = _trigger(http, "many-steps", 12)
        deadline = time.monotonic() + TIMEOUT
        while True:  # kill in the middle of a step body, once a few steps have succeeded
            lines = app.lines()
            if app.count("done s3") and lines[-1].startswith("start s"):
                break
            assert time.monotonic() < deadline, lines
            time.sleep(0.01)
        app.kill9()
        time.sleep(1.5)  # the engine's calls fail meanwhile and are retried
        app.start()
        run = server.wait_for_run(run_id, timeout=TIMEOUT)
    assert run["status"] == "RUN_STATUS_SUCCEEDED", run
    assert run["output"] == [f"s{i}" for i in range(12)]
    for i in range(12):
        assert app.count(f"done s{i}") == 1, (i, app.lines())


def test_a_store_stall_longer_than_the_lease_does_not_rerun_a_step_in_flight(
    bridge: tuple[Any, AppProcess],
) -> None:
    """The app is slow with a call in flight while the store does not answer for
    longer than the task lease (2 s here): the lease lapses, the server's worker
    leases the call again itself, and must not send it a second time."""
    server, app = bridge
    assert app.proc is not None
    database = server.data_dir / "ductor.db"
    with server.client() as http:
        run_id = _trigger(http, "many-steps", 4)
        deadline = time.monotonic() + TIMEOUT
        while "start s1" not in app.lines():
            assert time.monotonic() < deadline, app.lines()
            time.sleep(0.01)
        os.kill(app.proc.pid, signal.SIGSTOP)  # the call for s1 stays in flight
        try:
            blocker = sqlite3.connect(str(database), isolation_level=None)
            blocker.execute("BEGIN IMMEDIATE")  # every write of the server waits
            time.sleep(3.0)
            blocker.execute("ROLLBACK")
            blocker.close()
            time.sleep(1.0)  # the worker polls again and finds the lapsed lease
        finally:
            os.kill(app.proc.pid, signal.SIGCONT)
        run = server.wait_for_run(run_id, timeout=TIMEOUT)
    assert run["status"] == "RUN_STATUS_SUCCEEDED", run
    assert run["output"] == [f"s{i}" for i in range(4)]
    with sqlite3.connect(str(database)) as db:
        [(deliveries,)] = db.execute(
            "SELECT MAX(deliveries) FROM tasks WHERE run_id = ?", (run_id,)
        ).fetchall()
    assert deliveries == 2  # the stall really made the lease lapse
    for i in range(4):
        assert app.count(f"start s{i}") == 1, (i, app.lines())
        assert app.count(f"done s{i}") == 1, (i, app.lines())


def test_the_cli_lists_the_app_and_sends_an_event_as_the_docs_write_it(
    bridge: tuple[Any, AppProcess],
) -> None:
    server, _ = bridge
    listed = server.cli("apps", "list").stdout.splitlines()
    assert listed[0].split()[:2] == ["shop", "live"]
    assert "  bridge:shop:fulfil-order" in listed[1:]
    # With no DAG workflow published, the SDK workflows are what `workflows list` shows.
    families = server.cli("workflows", "list").stdout.splitlines()
    assert any(line.split()[0] == "bridge:shop:fulfil-order" for line in families), families
    # docs/sdk.md, as written: the data follows the event name ...
    sent = server.cli("events", "send", "order.created", '{"id": 7, "total": 500}')
    [run_id] = json.loads(sent.stdout)["runs_started"]
    listed_runs = server.cli("runs", "list", "--family", "bridge:shop:fulfil-order").stdout
    assert listed_runs.split()[0] == run_id
    # ... then the shipment event and the approval the run waits for.
    with server.client() as http:
        _wait(http, run_id, _waiting_for("event order.shipped"))
        server.cli("events", "send", "order.shipped", '{"order_id": 7, "carrier": "ups"}')
        _wait(http, run_id, _waiting_for("signal approve"))
        server.cli("runs", "signal", run_id, "approve", "--payload", '"ops"')
    watched = server.cli("runs", "watch", run_id, "--timeout", str(TIMEOUT))
    assert f"run {run_id}  bridge:shop:fulfil-order v1  succeeded" in watched.stdout
    assert '"approved_by": "ops"' in watched.stdout


def test_a_failing_step_is_retried_then_succeeds(bridge: tuple[Any, AppProcess]) -> None:
    server, app = bridge
    with server.client() as http:
        run = server.wait_for_run(_trigger(http, "flaky"), timeout=TIMEOUT)
    assert run["status"] == "RUN_STATUS_SUCCEEDED", run
    assert run["output"] == "ok after 3 tries"
    assert app.count("start flaky") == 3
    assert app.count("done flaky") == 1


def test_a_non_retriable_error_fails_the_run_with_the_error_shown(
    bridge: tuple[Any, AppProcess],
) -> None:
    server, app = bridge
    with server.client() as http:
        run_id = _trigger(http, "declined")
        run = server.wait_for_run(run_id, timeout=TIMEOUT)
    assert run["status"] == "RUN_STATUS_FAILED"
    assert run["error"]["code"] == "card.declined"
    assert "card declined by the issuer" in run["error"]["message"]
    assert app.count("start decline") == 1
    shown = server.cli("runs", "get", run_id).stdout
    assert "card.declined" in shown


def test_changed_code_under_a_running_workflow_is_detected(
    bridge: tuple[Any, AppProcess],
) -> None:
    server, app = bridge
    with server.client() as http:
        run_id = _trigger(http, "evolving")
        _wait(http, run_id, _waiting_for("timer"))
        app.stop()
        app.start(variant="2")
        run = server.wait_for_run(run_id, timeout=TIMEOUT)
    assert run["status"] == "RUN_STATUS_FAILED"
    assert run["error"]["code"] == "workflow.changed"
    assert "prepare" in run["error"]["message"]


def test_inline_runs_checkpoint_and_bad_signatures_are_refused(
    bridge: tuple[Any, AppProcess],
) -> None:
    server, _ = bridge
    local = Client("shop", signing_key=KEY, server_url=server.url, api_key=server.api_key)

    @local.workflow("quick")
    async def quick(ctx: Context, name: str) -> str:
        hello = await ctx.step.run("hello", lambda: f"hello {name}")
        return await ctx.step.run("shout", lambda: hello.upper())

    async def inline() -> Any:
        try:
            return await local.run_inline("quick", "ada")
        finally:
            await local.aclose()

    outcome = asyncio.run(inline())
    assert outcome.status == "RUN_STATUS_SUCCEEDED"
    assert outcome.output == "HELLO ADA"
    run = server.wait_for_run(outcome.run_id, timeout=TIMEOUT)
    assert run["status"] == "RUN_STATUS_SUCCEEDED"
    assert run["output"] == "HELLO ADA"
    assert {s["ref"] for s in run["steps"]} >= {"hello", "shout"}

    bogus = encode(DescribeResponse(app_id="intruder", sdk="x", sdk_version="0"))
    now = int(time.time())
    with server.client() as http:
        cases = {
            "signature.mismatch": signature_header(bogus, ["wrong-key"], now),
            "signature.expired": signature_header(bogus, [KEY], now - 1000),
            "signature.malformed": "t=abc",
        }
        for code, header in cases.items():
            answer = http.post(
                "/v1/bridge/sync",
                content=bogus,
                headers={SIGNATURE_HEADER: header, "content-type": "application/json"},
            )
            assert answer.status_code == 401, answer.text
            assert answer.json()["code"] == code
        # A checkpoint with a bad signature records nothing; one for an ended run is refused.
        run_id = outcome.run_id
        late = encode(
            CheckpointRequest(
                run_id=run_id,
                app_id="shop",
                workflow_id="quick",
                opcodes=[StepRunOp(id="f" * 32, name="late", result=1)],
            )
        )
        path = f"/v1/bridge/runs/{run_id}/checkpoint"
        forged = http.post(
            path,
            content=late,
            headers={SIGNATURE_HEADER: signature_header(late, ["wrong-key"], now)},
        )
        assert forged.status_code == 401
        assert forged.json()["code"] == "signature.mismatch"
        ended = http.post(
            path, content=late, headers={SIGNATURE_HEADER: signature_header(late, [KEY], now)}
        )
        assert ended.status_code == 409
        assert ended.json()["code"] == "run.ended"
        after = _run(http, run_id)
        assert after["output"] == "HELLO ADA"
        assert "late" not in {s["ref"] for s in after["steps"]}
        missing = http.post("/v1/bridge/sync", content=bogus)
        assert missing.status_code == 401
        assert missing.json()["code"] == "signature.missing"
        assert [a["app_id"] for a in http.get("/v1/bridge/apps").json()] == ["shop"]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_an_inline_run_whose_last_checkpoint_is_refused_is_not_reported_ended(
    make_server: Callable[..., Any], request: pytest.FixtureRequest, backend: str
) -> None:
    """The run is cancelled while the caller executes it: its RUN_COMPLETE is not
    recorded, so run_inline must not answer SUCCEEDED for a run the server ended
    otherwise."""
    database_url = request.getfixturevalue("postgres_url") if backend == "postgres" else None
    server = make_server(
        "inline", database_url=database_url, env={"DUCTOR_BRIDGE_SIGNING_KEY": KEY}
    ).start()
    local = Client(
        "desk",
        signing_key=KEY,
        server_url=server.url,
        api_key=server.api_key,
        url="http://127.0.0.1:9/api/ductor",
    )

    @local.workflow("cancelled-midway")
    async def cancelled_midway(ctx: Context, _: Any) -> str:
        await ctx.step.run("first", lambda: 1)
        # Not a step: the run is cancelled from outside between two checkpoints.
        await asyncio.to_thread(_cancel_and_wait, server, ctx.run_id)
        return "done"

    async def inline() -> Any:
        try:
            await local.sync()
            return await local.run_inline("cancelled-midway")
        finally:
            await local.aclose()

    outcome = asyncio.run(inline())
    run = server.wait_for_run(outcome.run_id, timeout=TIMEOUT)
    assert run["status"] == "RUN_STATUS_CANCELLED"
    assert outcome.status == "RUN_STATUS_RUNNING"
    assert outcome.output is None


def test_a_checkpoint_with_a_time_the_engine_cannot_keep_is_refused_naming_it(
    make_server: Callable[..., Any],
) -> None:
    """A checkpointed sleep whose duration does not parse used to be accepted and
    fire at once; it is a 422 naming the opcode's field, and records nothing."""
    server = make_server("checkpoint", env={"DUCTOR_BRIDGE_SIGNING_KEY": KEY}).start()
    local = Client("desk", signing_key=KEY, server_url=server.url, api_key=server.api_key)

    @local.workflow("napper")
    async def napper(ctx: Context, _: Any) -> None:
        await ctx.step.sleep("nap", "1h")

    async def sync() -> None:
        try:
            await local.sync(url="http://127.0.0.1:9/api/ductor")
        finally:
            await local.aclose()

    asyncio.run(sync())
    keys = SigningKeys(KEY)
    with server.client() as http:

        def signed_post(path: str, body: bytes) -> httpx.Response:
            header = keys.header(body, now=int(time.time()), nonce=new_nonce())
            return http.post(
                path, content=body, headers={SIGNATURE_HEADER: header, APP_HEADER: "desk"}
            )

        started = signed_post(
            "/v1/bridge/runs",
            encode(InlineRunRequest(app_id="desk", workflow_id="napper", input=None)),
        )
        assert started.status_code == 201, started.text
        run_id = started.json()["run_id"]
        ops = [
            {"op": "STEP_RUN", "id": "a" * 32, "name": "first", "result": 1},
            {"op": "SLEEP", "id": "b" * 32, "name": "nap", "duration": "banana", "until": None},
            {"op": "SLEEP", "id": "c" * 32, "name": "nap2", "duration": None, "until": "soon"},
        ]
        body = {"run_id": run_id, "app_id": "desk", "workflow_id": "napper", "opcodes": ops}
        path = f"/v1/bridge/runs/{run_id}/checkpoint"
        refused = signed_post(path, json.dumps(body).encode())
        assert refused.status_code == 422, refused.text
        error = refused.json()
        assert error["code"] == "request.invalid"
        assert [p["pointer"] for p in error["details"]["problems"]] == [
            "/opcodes/1/duration",
            "/opcodes/2/until",
        ]
        time.sleep(1)  # a wrongly queued checkpoint would have been applied by now
        assert {s["ref"] for s in _run(http, run_id)["steps"]} == {"_bridge"}
        ops[1]["duration"] = "1h"
        del ops[2]
        accepted = signed_post(path, json.dumps(body).encode())
        assert accepted.status_code == 200, accepted.text
        _wait(http, run_id, _waiting_for("timer"))


def _cancel_and_wait(server: Any, run_id: str) -> None:
    with ApiClient(server.url, api_key=server.api_key) as api:
        api.cancel(run_id, reason="stop")
        assert api.wait_for_result(run_id, timeout=TIMEOUT).status == "RUN_STATUS_CANCELLED"


def test_inputs_above_the_inline_limit_travel_by_reference(bridge: tuple[Any, AppProcess]) -> None:
    server, _ = bridge
    # Under the API's body limit, but with the first step's result recorded the
    # execute requests outgrow the inline limit and go out as a payload_ref.
    name = "x" * (INLINE_LIMIT_BYTES * 6 // 10)
    with server.client() as http:
        run_id = _trigger(http, "quick", name)
        run = server.wait_for_run(run_id, timeout=TIMEOUT)
        assert run["status"] == "RUN_STATUS_SUCCEEDED", run["error"]
        assert run["output"] == f"HELLO {name.upper()}"
        # What the app fetched: the run's input and recorded steps, signed.
        path = f"/v1/bridge/runs/{run_id}/payload"
        header = signature_header(b"", [KEY], int(time.time()))
        fetched = http.get(path, params={"ref": f"{run_id}:1"}, headers={SIGNATURE_HEADER: header})
        assert fetched.status_code == 200, fetched.text
        SigningKeys(KEY).verify(
            fetched.content, fetched.headers[SIGNATURE_HEADER], now=int(time.time())
        )
        payload = decode(fetched.content, ExecutePayload)
        assert payload.input == name
        assert [s.name for s in payload.steps] == ["hello", "shout"]
        unsigned = http.get(path, params={"ref": "x"})
        assert unsigned.status_code == 401


def test_the_server_asks_an_app_to_sync_and_probes_its_health(
    bridge: tuple[Any, AppProcess],
) -> None:
    server, app = bridge
    with server.client() as http:
        synced = http.post("/v1/bridge/apps", json={"url": app.url})
        assert synced.status_code == 200, synced.text
        assert synced.json()["app_id"] == "shop"
        assert synced.json()["synced"] is True
        assert "fulfil-order" in synced.json()["accepted"]
        health = http.post("/v1/bridge/apps/shop/health")
        assert health.status_code == 200, health.text
        assert health.json()["status"] == "ok"
        assert health.json()["app_id"] == "shop"
        unknown = http.post("/v1/bridge/apps/nobody/health")
        assert unknown.status_code == 404
        assert unknown.json()["code"] == "app.not_found"
        app.stop()
        down = http.post("/v1/bridge/apps/shop/health")
        assert down.status_code == 503
        assert down.json()["code"] == "bridge.app_call_failed"


def test_an_app_in_checkpoint_mode_reports_steps_as_it_goes(
    bridge: tuple[Any, AppProcess],
) -> None:
    server, app = bridge
    app.stop()
    app.start(checkpoint=True)
    with server.client() as http:
        run_id = _trigger(http, "many-steps", 6)
        run = server.wait_for_run(run_id, timeout=TIMEOUT)
    assert run["status"] == "RUN_STATUS_SUCCEEDED", run
    assert run["output"] == [f"s{i}" for i in range(6)]
    for i in range(6):
        assert app.count(f"done s{i}") == 1
    # The steps came in as checkpoints while one execute ran them: far fewer
    # execute calls than the 7 (6 steps + the return) of the plain protocol.
    executes = asyncio.run(_attempts(server, run_id))
    assert 1 <= len(executes) <= 3, executes


async def _attempts(server: Any, run_id: str) -> list[str]:
    store = open_store(str(server.data_dir / "ductor.db"))
    await store.open()
    try:
        async with store.transaction() as tx:
            key = await tx.find_api_key(hash_api_key(server.api_key))
            assert key is not None
            attempts = await tx.list_attempts(key.tenant_id, run_id)
    finally:
        await store.close()
    return [a.step_ref for a in attempts]


def test_replays_are_refused_and_an_app_key_of_its_own_takes_over(
    bridge: tuple[Any, AppProcess],
) -> None:
    server, app = bridge
    with server.client() as http:
        # A signed request to the server is accepted once: no second run.
        body = encode(InlineRunRequest(app_id="shop", workflow_id="send-receipt", input=None))
        header = SigningKeys(KEY).request_header(body, now=int(time.time()))
        headers = {SIGNATURE_HEADER: header, APP_HEADER: "shop"}
        first = http.post("/v1/bridge/runs", content=body, headers=headers)
        assert first.status_code == 201, first.text
        replayed = http.post("/v1/bridge/runs", content=body, headers=headers)
        assert replayed.status_code == 401
        assert replayed.json()["code"] == "signature.replayed"
        slug = "bridge:shop:send-receipt"
        runs = http.get("/v1/runs", params={"family_slug": slug}).json()["items"]
        assert [r["id"] for r in runs] == [first.json()["run_id"]]

        # A signed execute to the app is accepted once: the step body runs once.
        execute = encode(
            ExecuteRequest(
                run_id="run-replay",
                workflow_id="send-receipt",
                input={"charge_id": "ch_1", "amount": 1},
            )
        )
        signed = {SIGNATURE_HEADER: SigningKeys(KEY).request_header(execute, now=int(time.time()))}
        before = app.count("start send")
        answered = httpx.post(app.url, content=execute, headers=signed, timeout=10)
        assert answered.status_code == 200, answered.text
        assert app.count("start send") == before + 1
        again = httpx.post(app.url, content=execute, headers=signed, timeout=10)
        assert again.status_code == 401
        assert again.json()["code"] == "signature.replayed"
        assert app.count("start send") == before + 1

        # The tenant gives the app a key of its own; the app restarts with it.
        created = http.post("/v1/bridge/apps/shop/keys")
        assert created.status_code == 201, created.text
        own_key = created.json()["signing_key"]
        app.stop()
        app.start(key=own_key)  # syncs with its own key at start
        run_id = _trigger(http, "send-receipt", {"charge_id": "ch_2", "amount": 2})
        _wait(http, run_id, lambda run: run["status"] == "RUN_STATUS_SUCCEEDED")
        # The server-wide key no longer speaks for the app, in either direction.
        intruder = encode(DescribeResponse(app_id="shop", sdk="x", sdk_version="0"))
        wide = SigningKeys(KEY).request_header(intruder, now=int(time.time()))
        refused = http.post("/v1/bridge/sync", content=intruder, headers={SIGNATURE_HEADER: wide})
        assert refused.status_code == 403
        assert refused.json()["code"] == "bridge.app_forbidden"
        forged = httpx.post(
            app.url,
            content=execute,
            headers={
                SIGNATURE_HEADER: SigningKeys(KEY).request_header(execute, now=int(time.time()))
            },
            timeout=10,
        )
        assert forged.status_code == 401
        assert forged.json()["code"] == "signature.mismatch"


def test_the_app_without_a_server_at_its_url_fails_in_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DUCTOR_", "BRIDGE_"))}
    nobody = f"http://127.0.0.1:{_free_port()}"
    env.update(DUCTOR_URL=nobody, DUCTOR_API_KEY="k", BRIDGE_APP_LOG=str(tmp_path / "steps.log"))
    result = subprocess.run(
        [sys.executable, str(APP), "--port", str(_free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [result.stderr.strip()], result.stderr
    assert result.stderr.startswith(f"error: no Ductor server answers at {nobody}")
    assert "DUCTOR_URL" in result.stderr
