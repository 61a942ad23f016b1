"""SIGTERM to a real `ductor serve` (docs/deploy.md): a request in flight is
answered, a running step gets `DUCTOR_STOP_GRACE` seconds to finish, and one
that needs longer goes back to the queue. Nothing is lost and no side effect
reaches the loopback sink twice: after a restart every run completes.

(A long poll answered at once on SIGTERM is `test_run_wait_e2e`'s.)
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from .conftest import ServerProcess, Sink

# SIGTERMs and timing: these run alone, after the parallel part of the suite.
pytestmark = pytest.mark.serial


def slow_call(url: str) -> dict[str, Any]:
    """One HTTP call to the sink: the step in flight when the server stops."""
    return {
        "family_slug": "slow-call",
        "steps": [
            {
                "ref": "call",
                "type": "STEP_TYPE_ACTION",
                "args": {"action": "http", "params": {"url": json.dumps(url), "body": "input"}},
                "retry": {"max_attempts": 3, "initial_interval": "1s"},
            }
        ],
        "edges": [],
    }


def started_slow_run(server: ServerProcess, sink: Sink, wait_until: Callable[..., None]) -> str:
    """Start the server, publish `slow-call` and start a run; its id once its call
    has reached the sink."""
    server.start()
    with server.client() as http:
        assert http.post("/v1/workflows", json=slow_call(f"{sink.url}/slow")).status_code == 201
        created = http.post("/v1/runs", json={"family_slug": "slow-call", "input": {"n": 1}})
        assert created.status_code == 201, created.text
    wait_until(sink.slow_started.is_set, what="the slow call to reach the sink")
    run_id: str = created.json()["id"]
    return run_id


def terminate(server: ServerProcess) -> tuple[int, float]:
    """SIGTERM the server; its exit status and how long it took to exit."""
    assert server.proc is not None
    stopped = time.monotonic()
    server.proc.terminate()
    status = server.proc.wait(timeout=60)
    return status, time.monotonic() - stopped


def test_a_step_longer_than_the_grace_goes_back_to_the_queue_and_runs_once(
    postgres_server: ServerProcess, sink: Sink, wait_until: Callable[..., None]
) -> None:
    # A lease far longer than the test: the task must come back by its release at
    # the stop, not by its lease running out.
    server = postgres_server
    server.extra_env.update({"DUCTOR_STOP_GRACE": "1", "DUCTOR_LEASE_SECONDS": "300"})
    sink.slow_seconds = 8
    run_id = started_slow_run(server, sink, wait_until)
    status, took = terminate(server)
    assert status == 0, server.log()[-3000:]
    # It did not wait for the step (8 s), only its grace and the engine's close.
    assert took < 6, took
    assert "Traceback" not in server.log(), server.log()[-3000:]
    # The cut call is seen as such by the sink once its 8 s are up.
    wait_until(lambda: len(sink.deliveries_for(run_id)) == 1, timeout=30, what="the cut call")
    ((path, cut_key, cut_status),) = sink.deliveries_for(run_id)
    assert (path, cut_status) == ("/slow", 0)
    server.start()
    run = server.wait_for_run(run_id, timeout=60)  # far less than the lease
    assert run["status"] == "RUN_STATUS_SUCCEEDED", run
    (step,) = run["steps"]
    key = f"{run_id}:call:-1:{step['attempt']}"
    assert sink.effects_for(run_id) == {key: 1}
    assert step["output"]["body"]["key"] == key
    print(f"stop mid-step: exited in {took:.2f} s with grace 1 s; keys {cut_key} then {key}")


def test_a_step_within_the_grace_finishes_and_is_not_run_again(
    postgres_server: ServerProcess, sink: Sink, wait_until: Callable[..., None]
) -> None:
    server = postgres_server
    server.extra_env.update({"DUCTOR_STOP_GRACE": "20"})
    sink.slow_seconds = 2
    run_id = started_slow_run(server, sink, wait_until)
    status, took = terminate(server)
    assert status == 0, server.log()[-3000:]
    assert took < 15, took  # the step's 2 s, not the whole grace
    assert "Traceback" not in server.log(), server.log()[-3000:]
    # The call ended inside the grace, and its result was kept: after the restart
    # the run ends without calling the sink again.
    ((path, key, answered),) = sink.deliveries_for(run_id)
    assert (path, answered) == ("/slow", 200)
    server.start()
    run = server.wait_for_run(run_id, timeout=60)
    assert run["status"] == "RUN_STATUS_SUCCEEDED", run
    (step,) = run["steps"]
    assert key == f"{run_id}:call:-1:{step['attempt']}"
    assert sink.deliveries_for(run_id) == [("/slow", key, 200)]
    print(f"stop within the grace: exited in {took:.2f} s, the step's call answered once")


class SlowBody:
    """A request body sent in two parts, the second once `release` is set."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.sent_first = threading.Event()
        self.release = threading.Event()

    def __iter__(self) -> Iterator[bytes]:
        half = len(self.body) // 2
        yield self.body[:half]
        self.sent_first.set()
        self.release.wait(timeout=30)
        yield self.body[half:]


def test_a_request_in_flight_at_sigterm_is_answered_and_kept(
    postgres_server: ServerProcess,
) -> None:
    server = postgres_server.start()
    definition = {
        "family_slug": "quick",
        "steps": [
            {
                "ref": "only",
                "type": "STEP_TYPE_DATAFLOW",
                "args": {"operation": "project", "project": {"n": "input.n"}},
            }
        ],
        "edges": [],
    }
    with server.client() as http:
        assert http.post("/v1/workflows", json=definition).status_code == 201
    body = SlowBody(json.dumps({"family_slug": "quick", "input": {"n": 7}}).encode())
    answers: list[httpx.Response] = []

    def post() -> None:
        with server.client() as http:
            headers = {"Content-Type": "application/json", "Idempotency-Key": "in-flight"}
            answers.append(http.post("/v1/runs", content=body, headers=headers))

    poster = threading.Thread(target=post)
    poster.start()
    assert body.sent_first.wait(timeout=30)
    time.sleep(0.3)  # the request's headers and first half are with the server
    assert server.proc is not None
    stopped = time.monotonic()
    server.proc.terminate()
    time.sleep(1.5)  # the server is stopping: new connections are refused
    with pytest.raises(httpx.TransportError), server.client() as http:
        http.get("/healthz")
    body.release.set()
    poster.join(timeout=30)
    status = server.proc.wait(timeout=60)
    took = time.monotonic() - stopped
    assert status == 0, server.log()[-3000:]
    (answer,) = answers
    assert answer.status_code == 201, answer.text
    run_id = answer.json()["id"]
    server.start()
    run = server.wait_for_run(run_id, timeout=60)
    assert run["status"] == "RUN_STATUS_SUCCEEDED", run
    with server.client() as http:
        listed = http.get("/v1/runs", params={"family_slug": "quick"}).json()["items"]
    assert [r["id"] for r in listed] == [run_id]
    print(f"request in flight at SIGTERM: answered 201, the server exited in {took:.2f} s")
