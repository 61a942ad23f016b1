"""An idle server only polls as a safety net, and wake-ups reach other processes.

Idle: a real `ductor serve` on a fresh Postgres database, all roles, default
poll interval. The commits it sends over a window stay within what the engine
loops' polls allow: each loop (coordinator, workers, timers, email outbox)
commits once per look.

Across processes: with the poll interval set far beyond the test's wait, a run
triggered through an API-only process completes in an engine-only process only
because Redis pub/sub woke it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import pytest

from ductor_server.settings import IDLE_POLL_INTERVAL
from ductor_server.testing import CommitCounter

from .conftest import ServerProcess

# Timing, load and kills: these run alone, after the parallel part of the suite.
pytestmark = pytest.mark.serial

WINDOW = 20.0
SETTLE = 3.0
LOOPS = 4  # coordinator, workers, timers, the email outbox: one transaction per look each


def _check_idle(make: Callable[[str], ServerProcess], postgres_url: str) -> None:
    parts = urlsplit(postgres_url)
    counter = CommitCounter((parts.hostname or "127.0.0.1", parts.port or 5432))
    try:
        server = make(counter.url(postgres_url))
        server.start()
        time.sleep(SETTLE)  # start-up work (migrations, the first housekeeping sweep) is over
        before = counter.commits
        time.sleep(WINDOW)
        commits = counter.commits - before
    finally:
        counter.close()
    bound = LOOPS * (math.ceil(WINDOW / IDLE_POLL_INTERVAL) + 1)
    assert bound <= WINDOW  # the target: at most one commit per second
    print(f"idle: {commits} commits in {WINDOW:g}s (bound {bound})")
    assert 0 < commits <= bound, f"{commits} commits in {WINDOW:g}s, bound {bound}"


def test_an_idle_server_only_commits_its_safety_net_polls(
    make_server: Callable[..., ServerProcess], postgres_url: str
) -> None:
    env = {"DUCTOR_POLL_INTERVAL": ""}
    _check_idle(lambda url: make_server("idle", database_url=url, env=env), postgres_url)


def test_an_idle_server_with_redis_only_commits_its_safety_net_polls(
    make_server: Callable[..., ServerProcess],
    postgres_url: str,
    redis_url: str,
    redis_prefix: str,
) -> None:
    env = {
        "DUCTOR_POLL_INTERVAL": "",
        "DUCTOR_REDIS_URL": redis_url,
        "DUCTOR_REDIS_PREFIX": redis_prefix,
    }
    _check_idle(lambda url: make_server("idle", database_url=url, env=env), postgres_url)


ONE_STEP = {
    "family_slug": "one-step",
    "title": "One step",
    "steps": [
        {
            "ref": "only",
            "type": "STEP_TYPE_ACTION",
            "title": "only",
            "args": {"action": "noop", "params": {"n": "1"}},
        }
    ],
    "edges": [],
}


def test_redis_wakes_the_engine_in_another_process(
    make_server: Callable[..., ServerProcess],
    postgres_url: str,
    redis_url: str,
    redis_prefix: str,
) -> None:
    # Polls every 10 minutes: only a wake-up can finish the runs within the wait.
    env = {
        "DUCTOR_POLL_INTERVAL": "600",
        "DUCTOR_REDIS_URL": redis_url,
        "DUCTOR_REDIS_PREFIX": redis_prefix,
    }
    engine = make_server(
        "engine", database_url=postgres_url, env={**env, "DUCTOR_ROLES": "coordinator,worker,timer"}
    )
    api = make_server("api", database_url=postgres_url, env={**env, "DUCTOR_ROLES": "api"})
    engine.start()
    api.start()
    with api.client() as http:
        assert http.post("/v1/workflows", json=ONE_STEP).status_code in (200, 201)
        for _ in range(3):
            response = http.post("/v1/runs", json={"family_slug": "one-step", "input": {}})
            assert response.status_code in (200, 201, 202), response.text
            run = api.wait_for_run(response.json()["id"], timeout=30)
            assert run["status"] == "RUN_STATUS_SUCCEEDED", run
