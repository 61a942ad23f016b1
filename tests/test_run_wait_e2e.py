"""`GET /v1/runs/{run_id}?wait=` against real server processes: a long poll is
answered once its run ends, not when its time is up; many wait at once; on
two processes sharing one Postgres (no Redis), a run that ends on either
answers a wait held by the other; and `ductor runs trigger --wait` ends when
its run does.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from ductor.api import AsyncApiClient
from ductor_server.testing import serve_process

TENANT = "t-wait"
OTHER = "t-other"

GATED: dict[str, Any] = {
    "family_slug": "gated",
    "steps": [
        {"ref": "hold", "type": "STEP_TYPE_WAIT_FOR_SIGNAL", "args": {"signal": "go"}},
        {"ref": "after", "type": "STEP_TYPE_ACTION", "args": {"action": "noop"}},
    ],
    "edges": [{"source_ref": "hold", "target_ref": "after"}],
}

WAIT = 60  # what each long poll asks for: far longer than any answer here takes
BOUND = 30.0  # seconds the test gives itself; an answer by timeout would need 60


def _client(url: str, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=WAIT + 30
    )


async def _started(http: httpx.AsyncClient, count: int) -> list[str]:
    published = await http.post("/v1/workflows", json=GATED)
    assert published.status_code in (200, 201), published.text
    ids = []
    for _ in range(count):
        created = await http.post("/v1/runs", json={"family_slug": "gated"})
        assert created.status_code == 201, created.text
        ids.append(created.json()["id"])
    return ids


async def _long_polls_answer_when_runs_end(url: str, keys: dict[str, str]) -> None:
    async with _client(url, keys[TENANT]) as http, _client(url, keys[OTHER]) as other:
        ids = await _started(http, 20)
        started = time.monotonic()
        waits = [
            asyncio.create_task(http.get(f"/v1/runs/{run_id}", params={"wait": WAIT}))
            for run_id in ids
        ]
        # Another tenant's wait on the same id is refused at once.
        theirs = await other.get(f"/v1/runs/{ids[0]}", params={"wait": WAIT})
        assert theirs.status_code == 404
        await asyncio.sleep(0.5)
        assert not any(w.done() for w in waits)
        for run_id in ids[:10]:  # only half of them end
            sent = await http.post(f"/v1/runs/{run_id}/signals/go")
            assert sent.status_code == 202, sent.text
        async with asyncio.timeout(BOUND):
            done = await asyncio.gather(*waits[:10])
        assert [r.json()["status"] for r in done] == ["RUN_STATUS_SUCCEEDED"] * 10
        assert time.monotonic() - started < BOUND
        assert not any(w.done() for w in waits[10:])
        for w in waits[10:]:
            w.cancel()
        await asyncio.gather(*waits[10:], return_exceptions=True)
    # The SDK's wait_for_result long-polls: answered once the run ends, with a
    # pause between requests (`interval`) far longer than the wait for the end.
    async with AsyncApiClient(url, api_key=keys[TENANT]) as api:
        run = await api.trigger("gated")
        waiting = asyncio.create_task(api.wait_for_result(run.id, timeout=WAIT, interval=WAIT))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        await api.signal(run.id, "go")
        async with asyncio.timeout(BOUND):
            done = await waiting
        assert done.succeeded
        # A cancel's reason is sent, and becomes the cancelled run's error message.
        held = await api.trigger("gated")
        await api.cancel(held.id, reason="the customer asked")
        async with asyncio.timeout(BOUND):
            cancelled = await api.wait_for_result(held.id, timeout=WAIT, interval=WAIT)
        assert cancelled.status == "RUN_STATUS_CANCELLED"
        assert cancelled.error["code"] == "run.cancelled"
        assert cancelled.error["message"] == "the customer asked"


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_long_polls_are_answered_when_their_runs_end(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    database_url = request.getfixturevalue("postgres_url") if backend == "postgres" else None
    with serve_process(tmp_path, tenants=[TENANT, OTHER], database_url=database_url) as served:
        asyncio.run(_long_polls_answer_when_runs_end(served.url, served.keys))


async def _across(first: str, second: str, key: str) -> None:
    async with _client(first, key) as one, _client(second, key) as two:
        ids = await _started(one, 6)
        waits = [
            asyncio.create_task(one.get(f"/v1/runs/{run_id}", params={"wait": WAIT}))
            for run_id in ids
        ]
        await asyncio.sleep(0.5)
        assert not any(w.done() for w in waits)
        for run_id in ids:  # signalled through the other process
            sent = await two.post(f"/v1/runs/{run_id}/signals/go")
            assert sent.status_code == 202, sent.text
        async with asyncio.timeout(BOUND):
            done = await asyncio.gather(*waits)
        assert [r.json()["status"] for r in done] == ["RUN_STATUS_SUCCEEDED"] * 6


def test_a_wait_on_one_process_is_answered_when_another_ends_the_run(
    tmp_path: Path, postgres_url: str
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with (
        serve_process(tmp_path / "a", tenants=[TENANT], database_url=postgres_url) as a,
        serve_process(tmp_path / "b", tenants=[OTHER], database_url=postgres_url) as b,
    ):
        asyncio.run(_across(a.url, b.url, a.keys[TENANT]))


def test_the_cli_trigger_wait_ends_when_its_run_does(tmp_path: Path) -> None:
    # A pause of 60 s between requests: only a long poll can end within BOUND.
    with serve_process(tmp_path, tenants=[TENANT]) as served:
        key = served.keys[TENANT]
        # A first publish starts the validation worker process (about 1 s on an
        # idle machine): the default 5 s timeout is too short under a loaded CI.
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=served.url, headers=headers, timeout=BOUND) as http:
            assert http.post("/v1/workflows", json=GATED).status_code in (200, 201)
            env = {k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_")}
            env.update({"DUCTOR_URL": served.url, "DUCTOR_API_KEY": key})
            command = ["runs", "trigger", "gated", "--wait", "--interval", "60", "--timeout", "90"]
            cli = subprocess.Popen(
                [sys.executable, "-m", "ductor_server.cli", *command],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                deadline = time.monotonic() + BOUND
                runs: list[dict[str, Any]] = []
                while not runs and time.monotonic() < deadline:
                    runs = http.get("/v1/runs", params={"family_slug": "gated"}).json()["items"]
                    time.sleep(0.1)
                [run] = runs
                time.sleep(1.0)  # the CLI waits by now, its first answer long gone
                assert cli.poll() is None
                sent = http.post(f"/v1/runs/{run['id']}/signals/go")
                assert sent.status_code == 202, sent.text
                signalled = time.monotonic()
                out, err = cli.communicate(timeout=BOUND)
            finally:
                cli.kill()
        assert cli.returncode == 0, err
        assert time.monotonic() - signalled < BOUND
        ended = json.loads(out)
        assert (ended["id"], ended["status"]) == (run["id"], "RUN_STATUS_SUCCEEDED")


def test_a_stopping_server_answers_its_long_polls_at_once(postgres_server: Any) -> None:
    """SIGTERM answers every waiting `GET /v1/runs/{id}?wait=` with the run as it
    stands (the client asks again, behind a load balancer another api process),
    instead of holding it until uvicorn's drain gives up and cutting it with a 500."""
    server = postgres_server
    server.start()
    definition = {
        "family_slug": "long",
        "steps": [{"ref": "pause", "type": "STEP_TYPE_WAIT", "args": {"duration": "60s"}}],
        "edges": [],
    }
    with server.client() as http:
        assert http.post("/v1/workflows", json=definition).status_code in (200, 201)
        created = http.post("/v1/runs", json={"family_slug": "long"})
        assert created.status_code == 201, created.text
        run_id = created.json()["id"]

    async def wait_then_stop() -> tuple[httpx.Response, float]:
        headers = {"Authorization": f"Bearer {server.api_key}"}
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=60) as http:
            poll = asyncio.create_task(http.get(f"/v1/runs/{run_id}", params={"wait": 30}))
            await asyncio.sleep(1)  # the request is waiting
            assert not poll.done()
            stopped = time.monotonic()
            server.proc.terminate()
            response = await poll
            return response, time.monotonic() - stopped

    response, took = asyncio.run(wait_then_stop())
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "RUN_STATUS_RUNNING"
    assert took < 3, took  # not held for the 5 s connection drain
    assert server.proc.wait(timeout=30) == 0
    assert "Traceback" not in server.log()
