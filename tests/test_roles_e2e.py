"""docs/deploy.md's processes by role, on one PostgreSQL, with and without Redis:
`api`, `coordinator,timer` and `worker` each in a `ductor serve` of its own do
only their part (a run does not move while the process of the next part is
down), and a run goes through the three, its worker stopped mid-step by SIGTERM
and started again, with its call to the loopback sink answered once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from .conftest import ServerProcess, Sink

# SIGTERMs and timing: these run alone, after the parallel part of the suite.
pytestmark = pytest.mark.serial


def _call(url: str) -> dict[str, Any]:
    return {
        "family_slug": "slow-call",
        "steps": [
            {
                "ref": "call",
                "type": "STEP_TYPE_ACTION",
                "args": {"action": "http", "params": {"url": json.dumps(url), "body": "input"}},
                "retry": {"max_attempts": 3, "initial_interval": "1s"},
            },
            {
                "ref": "done",
                "type": "STEP_TYPE_DATAFLOW",
                "args": {"operation": "project", "project": {"key": "steps.call.output.body.key"}},
            },
        ],
        "edges": [{"source_ref": "call", "target_ref": "done"}],
    }


def _stop(server: ServerProcess) -> float:
    """SIGTERM `server` and wait for it to exit with status 0; how long it took."""
    assert server.proc is not None
    stopped = time.monotonic()
    server.proc.terminate()
    assert server.proc.wait(timeout=60) == 0, server.log()[-3000:]
    return time.monotonic() - stopped


@pytest.mark.parametrize("with_redis", [False, True], ids=["postgres-only", "redis"])
def test_each_role_does_only_its_part_and_a_run_crosses_all_three(
    with_redis: bool,
    make_server: Callable[..., ServerProcess],
    postgres_url: str,
    request: pytest.FixtureRequest,
    sink: Sink,
    wait_until: Callable[..., None],
) -> None:
    env = {"DUCTOR_LOG_LEVEL": "info", "DUCTOR_STOP_GRACE": "1", "DUCTOR_LEASE_SECONDS": "300"}
    if with_redis:
        env["DUCTOR_REDIS_URL"] = request.getfixturevalue("redis_url")
        env["DUCTOR_REDIS_PREFIX"] = request.getfixturevalue("redis_prefix")
    api = make_server("api", database_url=postgres_url, env=env).start("--roles", "api")
    coordinator = make_server("coordinator", database_url=postgres_url, env=env)
    worker = make_server("worker", database_url=postgres_url, env=env)
    for part, roles in ((coordinator, "coordinator,timer"), (worker, "worker")):
        part.api_key = api.api_key
        part.start("--roles", roles)
    sink.slow_seconds = 8
    with api.client() as http:
        assert http.post("/v1/workflows", json=_call(f"{sink.url}/slow")).status_code == 201

        def run_of(run_id: str) -> dict[str, Any]:
            found: dict[str, Any] = http.get(f"/v1/runs/{run_id}").json()
            return found

        # The worker, stopped mid-step, gives the step back; no other process runs it.
        created = http.post("/v1/runs", json={"family_slug": "slow-call", "input": {"n": 1}})
        assert created.status_code == 201, created.text
        run_id = created.json()["id"]
        wait_until(sink.slow_started.is_set, timeout=30, what="the call to reach the sink")
        took = _stop(worker)
        assert took < 6, took
        sink.slow_seconds = 1
        time.sleep(3)
        assert [d[2] for d in sink.deliveries_for(run_id)] in ([], [0]), "a step ran elsewhere"
        assert run_of(run_id)["status"] == "RUN_STATUS_RUNNING"

        # Without a coordinator, the worker runs the step, but the run does not move on.
        _stop(coordinator)
        worker.start("--roles", "worker")
        wait_until(
            lambda: any(d[2] == 200 for d in sink.deliveries_for(run_id)),
            timeout=60,
            what="the worker to call the sink again",
        )
        time.sleep(3)
        run = run_of(run_id)
        assert run["status"] == "RUN_STATUS_RUNNING", run
        statuses = {s["ref"]: s["status"] for s in run["steps"]}
        assert statuses == {"call": "STEP_STATUS_RUNNING", "done": "STEP_STATUS_PENDING"}, run

        # The coordinator back, the run ends; the call was answered once.
        coordinator.start("--roles", "coordinator,timer")
    run = api.wait_for_run(run_id, timeout=60)
    assert run["status"] == "RUN_STATUS_SUCCEEDED", run
    (key,) = sink.effects_for(run_id)
    assert sink.effects_for(run_id) == {key: 1}
    assert run["output"] == {"done": {"key": key}}
    # Only the coordinator ticked: its log has the totals a coordinator writes at exit.
    for part in (api, coordinator, worker):
        part.stop()
    assert "coordinator done" in coordinator.log()
    assert "coordinator done" not in api.log() + worker.log()
    print(
        f"roles split ({'redis' if with_redis else 'postgres only'}): worker exited in {took:.2f} s"
    )
