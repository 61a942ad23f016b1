"""End to end through HTTP against a real server process, on SQLite and on Postgres.

The seed's hello-world is published, triggered and completes with the right
output; runs caught in a WAIT, a retry backoff and a slow ACTION survive a
`kill -9` of the server; one tenant never sees another's runs or workflows.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

HELLO_WORLD: dict[str, Any] = {
    "family_slug": "hello-world",
    "title": "Hello World",
    "steps": [
        {
            "ref": "greet",
            "type": "STEP_TYPE_DATAFLOW",
            "title": "Build greeting",
            "args": {"operation": "project", "project": {"message": '"hello"'}},
        },
        {
            "ref": "pause",
            "type": "STEP_TYPE_WAIT",
            "title": "Short delay",
            "args": {"duration": "2s"},
        },
    ],
    "edges": [{"source_ref": "greet", "target_ref": "pause", "type": "EDGE_TYPE_SUCCESS"}],
}


def _nap(seconds: int) -> dict[str, Any]:
    return {
        "family_slug": "nap",
        "steps": [
            {"ref": "nap", "type": "STEP_TYPE_WAIT", "args": {"duration": f"{seconds}s"}},
            {
                "ref": "done",
                "type": "STEP_TYPE_DATAFLOW",
                "args": {"operation": "project", "project": {"who": "input.who"}},
            },
        ],
        "edges": [{"source_ref": "nap", "target_ref": "done"}],
    }


def _call(slug: str, url: str, *, backoff: str = "1s") -> dict[str, Any]:
    return {
        "family_slug": slug,
        "steps": [
            {
                "ref": "call",
                "type": "STEP_TYPE_ACTION",
                "args": {
                    "action": "http",
                    "params": {"url": json.dumps(url), "method": '"POST"', "body": "input"},
                },
                "retry": {"max_attempts": 3, "initial_interval": backoff},
            }
        ],
        "edges": [],
    }


def _publish(http: Any, definition: dict[str, Any]) -> dict[str, Any]:
    response = http.post("/v1/workflows", json=definition)
    assert response.status_code in (200, 201), response.text
    published: dict[str, Any] = response.json()
    return published


def _trigger(http: Any, slug: str, input: Any = None) -> str:
    response = http.post("/v1/runs", json={"family_slug": slug, "input": input})
    assert response.status_code == 201, response.text
    run_id: str = response.json()["id"]
    return run_id


def _step(http: Any, run_id: str, ref: str) -> dict[str, Any]:
    run = http.get(f"/v1/runs/{run_id}").json()
    step: dict[str, Any] = next(s for s in run["steps"] if s["ref"] == ref)
    return step


def test_hello_world_through_the_cli_and_http(server: Any, tmp_path: Path) -> None:
    server.start()
    definition = tmp_path / "hello-world.json"
    definition.write_text(json.dumps(HELLO_WORLD))

    assert "valid" in server.cli("workflows", "validate", str(definition)).stdout
    published = server.cli("workflows", "publish", str(definition)).stdout
    assert published.startswith("published hello-world version 1 (sha256:")
    again = server.cli("workflows", "publish", str(definition)).stdout
    assert again.startswith("unchanged hello-world version 1")

    result = server.cli(
        "runs", "trigger", "hello-world", "--input", '{"name": "ada"}', "--wait", "--timeout", "60"
    )
    run = json.loads(result.stdout)
    assert run["status"] == "RUN_STATUS_SUCCEEDED"
    assert run["version"] == 1
    assert run["input"] == {"name": "ada"}
    steps = {s["ref"]: s for s in run["steps"]}
    assert steps["greet"]["output"] == {"message": "hello"}
    assert steps["pause"]["status"] == "STEP_STATUS_SUCCEEDED"
    assert set(run["output"]) == {"pause"}
    assert "waited_until" in run["output"]["pause"]

    # Errors print their code and message and exit 1.
    missing = server.cli("runs", "get", "no-such-run", check=False)
    assert missing.returncode == 1
    assert missing.stderr.startswith("error: run.not_found: ")
    broken = tmp_path / "broken.json"
    broken.write_text(
        json.dumps({**HELLO_WORLD, "edges": [{"source_ref": "greet", "target_ref": "x"}]})
    )
    invalid = server.cli("workflows", "validate", str(broken), check=False)
    assert invalid.returncode == 1
    assert "/edges/0" in invalid.stdout
    refused = server.cli("workflows", "publish", str(broken), check=False)
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: definition.invalid: ")

    with server.client() as http:
        listed = http.get("/v1/runs", params={"family_slug": "hello-world"}).json()
        assert [r["id"] for r in listed["items"]] == [run["id"]]

    # Eight concurrent triggers with one Idempotency-Key start one run.
    def trigger_once(_: int) -> tuple[int, str]:
        with server.client() as http:
            response = http.post(
                "/v1/runs",
                json={"family_slug": "hello-world", "input": {"n": 8}},
                headers={"Idempotency-Key": "burst-1"},
            )
            return response.status_code, response.json().get("id", response.text)

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(trigger_once, range(8)))
    assert {status for status, _ in answers} == {201}, answers
    assert len({run_id for _, run_id in answers}) == 1, answers
    with server.client() as http:
        listed = http.get("/v1/runs", params={"family_slug": "hello-world"}).json()
        assert len(listed["items"]) == 2
        history = http.get(f"/v1/runs/{run['id']}/history").json()
        assert history, "a finished run has a history"
        assert [h["seq"] for h in history] == sorted(h["seq"] for h in history)


@pytest.mark.slow
def test_runs_survive_kill_9_of_the_server(server: Any, sink: Any, wait_until: Any) -> None:
    server.start()
    with server.client() as http:
        _publish(http, _nap(8))
        _publish(http, _call("flaky-call", f"{sink.url}/flaky", backoff="8s"))
        _publish(http, _call("slow-call", f"{sink.url}/slow"))
        nap = _trigger(http, "nap", {"who": "ada"})
        flaky = _trigger(http, "flaky-call", {"n": 1})
        slow = _trigger(http, "slow-call", {"n": 2})

        # Each run is where the kill must find it: inside the WAIT, inside
        # the retry backoff after a 503, and inside the slow HTTP attempt.
        wait_until(
            lambda: _step(http, nap, "nap")["status"] == "STEP_STATUS_WAITING",
            what="nap to wait",
        )
        wait_until(
            lambda: _step(http, flaky, "call")["status"] == "STEP_STATUS_RETRYING",
            what="flaky call to back off",
        )
        wait_until(sink.slow_started.is_set, what="the slow call to reach the sink")
        # Still there just before the kill (else the test proves nothing); the
        # slow request has seconds left, the wait and the backoff more.
        assert _step(http, nap, "nap")["status"] == "STEP_STATUS_WAITING"
        assert _step(http, flaky, "call")["status"] == "STEP_STATUS_RETRYING"
    server.kill9()
    # The kill landed while the slow request was still open at the sink.
    assert sink.effects_for(slow) == {}

    server.start()
    finished = {run_id: server.wait_for_run(run_id, timeout=60) for run_id in (nap, flaky, slow)}
    for run in finished.values():
        assert run["status"] == "RUN_STATUS_SUCCEEDED", run

    assert finished[nap]["output"] == {"done": {"who": "ada"}}

    # The retried call: attempt 1 got a 503, attempt 2 succeeded, and the sink
    # performed the side effect once, for the successful attempt's key.
    flaky_step = next(s for s in finished[flaky]["steps"] if s["ref"] == "call")
    assert flaky_step["attempt"] == 2
    assert sink.effects_for(flaky) == {f"{flaky}:call:-1:2": 1}
    assert ("/flaky", f"{flaky}:call:-1:1", 503) in sink.deliveries_for(flaky)

    # The slow call was cut by the kill; its attempt was delivered again with
    # the same key, and the side effect happened exactly once.
    slow_step = next(s for s in finished[slow]["steps"] if s["ref"] == "call")
    slow_key = f"{slow}:call:-1:{slow_step['attempt']}"
    assert sink.effects_for(slow) == {slow_key: 1}
    assert slow_step["output"]["body"]["key"] == slow_key
    slow_deliveries = sink.deliveries_for(slow)
    assert len(slow_deliveries) >= 2, slow_deliveries
    assert ("/slow", slow_key, 0) in slow_deliveries


def test_tenants_see_only_their_own(sqlite_server: Any) -> None:
    server = sqlite_server.start()
    other_key = server.cli(
        "keys", "create", "--tenant", "other", "--data-dir", str(server.data_dir)
    ).stdout.strip()
    with server.client() as http:
        _publish(http, HELLO_WORLD)
        run_id = _trigger(http, "hello-world")
    with server.client(other_key) as other:
        for path in (
            f"/v1/runs/{run_id}",
            f"/v1/runs/{run_id}/history",
            "/v1/workflows/hello-world",
            "/v1/workflows/hello-world/versions/1",
        ):
            response = other.get(path)
            assert response.status_code == 404, (path, response.text)
            assert response.json()["code"].endswith("not_found")
        assert other.post(f"/v1/runs/{run_id}/cancel").status_code == 404
        assert other.get("/v1/runs").json()["items"] == []
        assert other.get("/v1/workflows").json() == []
        trigger = other.post("/v1/runs", json={"family_slug": "hello-world"})
        assert trigger.status_code == 404
        assert trigger.json()["code"] == "workflow.not_found"
    # The owner still sees its run complete.
    assert server.wait_for_run(run_id)["status"] == "RUN_STATUS_SUCCEEDED"
    listing = server.cli("runs", "list").stdout
    assert run_id in listing
    assert "succeeded" in listing
    other_listing = server.cli("runs", "list", "--api-key", other_key).stdout
    assert run_id not in other_listing
    sent = json.loads(
        server.cli("events", "send", "nothing.yet", "--data", "{}", "--id", "e1").stdout
    )
    assert sent["id"] == "e1"
    assert sent["duplicate"] is False


def test_api_and_engine_in_separate_processes(make_server: Any, postgres_url: str) -> None:
    api = make_server("api", database_url=postgres_url, env={"DUCTOR_ROLES": "api"})
    engine = make_server(
        "engine", database_url=postgres_url, env={"DUCTOR_ROLES": "coordinator,worker,timer"}
    )
    api.start()
    engine.api_key = api.api_key
    engine.start()
    with engine.client(api.api_key) as http:
        # The engine-only process serves no /v1 routes.
        assert http.get("/v1/runs").status_code == 404
    with api.client() as http:
        _publish(http, HELLO_WORLD)
        run_id = _trigger(http, "hello-world", {"split": True})
    run = api.wait_for_run(run_id, timeout=60)
    assert run["status"] == "RUN_STATUS_SUCCEEDED"
    greet = next(s for s in run["steps"] if s["ref"] == "greet")
    assert greet["output"] == {"message": "hello"}


def _chain(url: str) -> dict[str, Any]:
    def call(ref: str) -> dict[str, Any]:
        return {
            "ref": ref,
            "type": "STEP_TYPE_ACTION",
            "args": {"action": "http", "params": {"url": json.dumps(url), "body": "input"}},
            "retry": {"max_attempts": 5, "initial_interval": "1s"},
        }

    return {
        "family_slug": "chain",
        "steps": [
            call("first"),
            {"ref": "rest", "type": "STEP_TYPE_WAIT", "args": {"duration": "1s"}},
            call("second"),
        ],
        "edges": [
            {"source_ref": "first", "target_ref": "rest"},
            {"source_ref": "rest", "target_ref": "second"},
        ],
    }


@pytest.mark.slow
def test_repeated_kills_at_arbitrary_moments_lose_and_repeat_nothing(
    server: Any, sink: Any
) -> None:
    server.start()
    with server.client() as http:
        _publish(http, _chain(f"{sink.url}/ok"))
        runs = [_trigger(http, "chain", {"n": n}) for n in range(12)]
    for pause in (1.5, 1.0):
        time.sleep(pause)
        server.kill9()
        server.start()
    for run_id in runs:
        run = server.wait_for_run(run_id, timeout=90)
        assert run["status"] == "RUN_STATUS_SUCCEEDED", run
        steps = {s["ref"]: s for s in run["steps"]}
        # Each call's side effect happened under one idempotency key only: the
        # key of the attempt the run recorded (a redelivery reuses that key).
        for ref in ("first", "second"):
            keys = {k for k in sink.effects_for(run_id) if k.split(":")[1] == ref}
            assert keys == {f"{run_id}:{ref}:-1:{steps[ref]['attempt']}"}, (ref, keys)
