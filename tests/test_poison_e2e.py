"""Poison-task quarantine against real server processes, on SQLite and Postgres.

A step whose handler kills its process (here: the sink SIGKILLs the server when
the step's request arrives) is run again after each restart until it has died
`DUCTOR_POISON_AFTER` times; then it fails as `attempt.poisoned` and the server
stays up. Graceful stops (SIGTERM: leases given back) never count as deaths.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


class KillSink:
    """An HTTP server on 127.0.0.1 that runs `on_request` for every request it
    gets (and answers 200 if it is still connected afterwards)."""

    def __init__(self) -> None:
        self.on_request: Callable[[], None] = lambda: None
        self.hits = 0
        self.lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                if length:
                    self.rfile.read(length)
                with sink.lock:
                    sink.hits += 1
                sink.on_request()
                body = b"{}"
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)


@pytest.fixture
def kill_sink() -> Iterator[KillSink]:
    sink = KillSink()
    sink.thread.start()
    try:
        yield sink
    finally:
        sink.server.shutdown()
        sink.server.server_close()


def _call(slug: str, url: str) -> dict[str, Any]:
    return {
        "family_slug": slug,
        "steps": [
            {
                "ref": "call",
                "type": "STEP_TYPE_ACTION",
                "args": {"action": "http", "params": {"url": json.dumps(url), "method": '"POST"'}},
                "retry": {"max_attempts": 3, "initial_interval": "1s"},
            }
        ],
        "edges": [],
    }


def _start_run(server: Any, definition: dict[str, Any]) -> str:
    with server.client() as http:
        published = http.post("/v1/workflows", json=definition)
        assert published.status_code in (200, 201), published.text
        response = http.post("/v1/runs", json={"family_slug": definition["family_slug"]})
        assert response.status_code == 201, response.text
        run_id: str = response.json()["id"]
        return run_id


def _wait(predicate: Callable[[], bool], timeout: float, what: str, server: Any) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{server.log()[-3000:]}")
        time.sleep(0.05)


def test_a_step_that_kills_its_server_is_quarantined(server: Any, kill_sink: KillSink) -> None:
    server.extra_env.update({"DUCTOR_LEASE_SECONDS": "1", "DUCTOR_POISON_AFTER": "3"})
    kills: list[int] = []
    up = threading.Event()  # set once start() returned, so a kill never races it

    def kill_the_server() -> None:
        assert up.wait(30)
        up.clear()
        server.kill9()
        kills.append(1)

    kill_sink.on_request = kill_the_server
    server.start()
    run_id = _start_run(server, _call("suicide", f"{kill_sink.url}/die"))
    up.set()
    for death in (1, 2, 3):
        _wait(lambda: len(kills) == death, 30, f"death {death}", server)  # noqa: B023
        server.start()  # the task's lease lapses and the new process takes it over
        up.set()
    kill_sink.on_request = lambda: None
    run = server.wait_for_run(run_id, timeout=30)

    assert kill_sink.hits == 3  # run three times, never a fourth
    assert run["status"] == "RUN_STATUS_FAILED", run
    assert run["error"]["code"] == "run.step_failed"
    assert run["error"]["details"] == {"step_ref": "call", "error": "attempt.poisoned"}
    [call] = run["steps"]
    assert call["error"]["code"] == "attempt.poisoned"
    assert call["error"]["details"]["deaths"] == 3
    assert call["attempt"] == 1  # non-retryable: the retry policy did not run it again
    with server.client() as http:
        history = http.get(f"/v1/runs/{run_id}/history").json()
    assert any(
        e["kind"] == "step.failed" and "attempt.poisoned" in json.dumps(e["data"]) for e in history
    )
    assert "quarantined task" in server.log()
    # The server stays up and keeps running other work.
    assert server.proc.poll() is None
    healthy = _start_run(
        server,
        {
            "family_slug": "after",
            "steps": [
                {
                    "ref": "greet",
                    "type": "STEP_TYPE_DATAFLOW",
                    "args": {"operation": "project", "project": {"ok": "true"}},
                }
            ],
            "edges": [],
        },
    )
    assert server.wait_for_run(healthy, timeout=30)["status"] == "RUN_STATUS_SUCCEEDED"
    assert server.proc.poll() is None


def test_graceful_restarts_never_count_as_deaths(server: Any, sink: Any) -> None:
    server.extra_env.update(
        {"DUCTOR_LEASE_SECONDS": "1", "DUCTOR_POISON_AFTER": "1", "DUCTOR_STOP_GRACE": "0.3"}
    )
    sink.slow_seconds = 2.5
    server.start()
    run_id = _start_run(server, _call("slow", f"{sink.url}/slow"))
    for _ in range(5):
        _wait(sink.slow_started.is_set, 30, "the slow call to reach the sink", server)
        sink.slow_started.clear()
        assert server.proc is not None
        server.proc.terminate()  # SIGTERM: running steps are cut, leases given back
        assert server.proc.wait(timeout=10) == 0
        server.start()
    run = server.wait_for_run(run_id, timeout=30)
    deliveries = sink.deliveries_for(run_id)

    assert run["status"] == "RUN_STATUS_SUCCEEDED", run
    assert len(deliveries) >= 6  # cut five times, then finished
    assert "quarantined task" not in server.log()
