"""Faults under load, against real server processes and a real PostgreSQL.

- Kill loop: while runs are being triggered, the server is SIGKILLed 20 times at
  random moments and started again. Every run completes; each step's side
  effect reached the sink under one attempt key only; no task, inbox item or
  lease is left behind; no run was started twice.
- Three coordinator processes race on the same runs: no step's result and no
  run's end is applied twice; the conflicts each lost are counted and reported
  in its log.
- PostgreSQL itself (a private cluster of this test's) is restarted mid-load:
  the server reconnects and every run completes.
- Redis (a private server of this test's, the fair queue and the wake-ups) is
  flushed, then killed and started again, mid-load: every run completes, each
  step's side effect happened once.

Each test is bounded in time and talks only to 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import random
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ductor_server.pytest_plugin import unavailable
from ductor_server.storage import open_store

from .conftest import PrivateRedis, ServerProcess, free_port

# Timing, load and kills: these run alone, after the parallel part of the suite.
pytestmark = pytest.mark.serial

TERMINAL = {"RUN_STATUS_SUCCEEDED", "RUN_STATUS_FAILED", "RUN_STATUS_CANCELLED"}


def _chain(url: str, slug: str = "fault-chain") -> dict[str, Any]:
    """A call, a computed step, and another call: two side effects per run."""

    def call(ref: str) -> dict[str, Any]:
        return {
            "ref": ref,
            "type": "STEP_TYPE_ACTION",
            "args": {"action": "http", "params": {"url": json.dumps(url), "body": "input"}},
            "retry": {"max_attempts": 10, "initial_interval": "1s"},
        }

    return {
        "family_slug": slug,
        "steps": [
            call("first"),
            {
                "ref": "middle",
                "type": "STEP_TYPE_DATAFLOW",
                "args": {"operation": "project", "project": {"n": "input.n"}},
            },
            call("second"),
        ],
        "edges": [
            {"source_ref": "first", "target_ref": "middle"},
            {"source_ref": "middle", "target_ref": "second"},
        ],
    }


def _computed(slug: str = "fault-computed") -> dict[str, Any]:
    """Four computed steps in a row: coordinator work only."""
    steps = [
        {
            "ref": f"s{i}",
            "type": "STEP_TYPE_DATAFLOW",
            "args": {"operation": "project", "project": {"n": f"input.n + {i}"}},
        }
        for i in range(4)
    ]
    edges = [{"source_ref": f"s{i}", "target_ref": f"s{i + 1}"} for i in range(3)]
    return {"family_slug": slug, "steps": steps, "edges": edges}


class Trigger:
    """Triggers runs from a thread, each with its own Idempotency-Key, retrying a
    request that found the server down until it is answered."""

    def __init__(self, server: ServerProcess, slug: str, *, per_second: float) -> None:
        self.server = server
        self.slug = slug
        self.gap = 1.0 / per_second
        self.runs: dict[str, str] = {}  # key -> run id
        self.refused = 0  # requests that found the server (or its database) down
        self.attempts: list[tuple[float, float]] = []  # (sent, answered or failed), monotonic
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        n = 0
        while not self.stop.is_set():
            key = f"fault-{n}"
            self.runs[key] = self._trigger(key, n)
            n += 1
            time.sleep(self.gap)

    def _trigger(self, key: str, n: int) -> str:
        deadline = time.monotonic() + 60
        body = {"family_slug": self.slug, "input": {"n": n}}
        while True:
            sent = time.monotonic()
            try:
                with self.server.client() as http:
                    response = http.post("/v1/runs", json=body, headers={"Idempotency-Key": key})
                self.attempts.append((sent, time.monotonic()))
                if response.status_code == 201:
                    run_id: str = response.json()["id"]
                    return run_id
                assert response.status_code == 503, response.text
            except httpx.TransportError:
                self.attempts.append((sent, time.monotonic()))
            self.refused += 1
            assert time.monotonic() < deadline, f"trigger {key} not accepted in 60 s"
            time.sleep(0.1)

    def __enter__(self) -> Trigger:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=90)


def _wait_all(server: ServerProcess, run_ids: list[str], timeout: float) -> dict[str, Any]:
    """Every run's final state, or fail naming the ones still going."""
    deadline = time.monotonic() + timeout
    done: dict[str, Any] = {}
    with server.client() as http:
        while True:
            for run_id in run_ids:
                if run_id in done:
                    continue
                run = http.get(f"/v1/runs/{run_id}").json()
                if run["status"] in TERMINAL:
                    done[run_id] = run
            if len(done) == len(run_ids):
                return done
            if time.monotonic() > deadline:
                left = [r for r in run_ids if r not in done]
                raise AssertionError(
                    f"{len(left)} of {len(run_ids)} runs did not end in {timeout} s,"
                    f" e.g. {left[:3]}\n{server.log()[-4000:]}"
                )
            time.sleep(0.5)


async def _leftovers(target: str) -> dict[str, int]:
    store = open_store(target)
    await store.open()
    try:
        async with store.transaction() as tx:
            counts = {}
            for name, sql in (
                ("open tasks", "SELECT COUNT(*) FROM tasks WHERE status <> 'done'"),
                ("inbox items", "SELECT COUNT(*) FROM run_inbox"),
                ("runs", "SELECT COUNT(*) FROM runs"),
            ):
                row = await tx.session.fetch_one(sql)
                assert row is not None
                counts[name] = int(row[0])
            return counts
    finally:
        await store.close()


def _one_effect_per_step(
    sink: Any, runs: dict[str, Any], refs: tuple[str, ...], context: str = ""
) -> None:
    for run_id, run in runs.items():
        errors = {s["ref"]: s.get("error") for s in run["steps"] if s.get("error")}
        assert run["status"] == "RUN_STATUS_SUCCEEDED", (context, run_id, run["status"], errors)
        steps = {s["ref"]: s for s in run["steps"]}
        for ref in refs:
            keys = {k for k in sink.effects_for(run_id) if k.split(":")[1] == ref}
            assert keys == {f"{run_id}:{ref}:-1:{steps[ref]['attempt']}"}, (run_id, ref, keys)


@pytest.mark.slow
def test_twenty_kills_under_load_lose_and_repeat_nothing(
    postgres_server: ServerProcess, sink: Any
) -> None:
    server = postgres_server
    # Twenty outside kills seconds apart look, to the quarantine, like a task that
    # kills its process: a task leased right after a restart dies with it again
    # and again. Quarantine has its own test (test_poison_e2e); here it is off so
    # that every run must complete.
    server.extra_env["DUCTOR_POISON_AFTER"] = "0"
    server.start()
    with server.client() as http:
        assert http.post("/v1/workflows", json=_chain(f"{sink.url}/ok")).status_code == 201
    seed = int(os.environ.get("DUCTOR_FAULT_SEED", time.time_ns() % 100_000))
    rng = random.Random(seed)
    with Trigger(server, "fault-chain", per_second=8) as trigger:
        for _ in range(20):
            time.sleep(rng.uniform(0.05, 1.2))
            server.kill9()
            server.start()
        # Restarts take seconds: go on triggering (the server now up) until the
        # load is big enough to say something, within a bound.
        enough = time.monotonic() + 60
        while len(trigger.runs) < 40 and time.monotonic() < enough:
            time.sleep(0.2)
    run_ids = list(trigger.runs.values())
    assert len(run_ids) >= 40, f"only {len(run_ids)} runs triggered (seed {seed})"
    assert len(set(run_ids)) == len(run_ids), "two keys gave one run"
    runs = _wait_all(server, run_ids, timeout=150)
    _one_effect_per_step(sink, runs, ("first", "second"), f"seed {seed}")
    assert server.database_url is not None
    left = asyncio.run(_leftovers(server.database_url))
    assert left == {"open tasks": 0, "inbox items": 0, "runs": len(run_ids)}, (seed, left)
    # The retried triggers started no second run.
    with server.client() as http:
        listed = http.get("/v1/runs", params={"limit": 500}).json()["items"]
    assert len(listed) == min(len(run_ids), 500)
    print(f"kill loop: seed {seed}, {len(run_ids)} runs, 20 kills")


@pytest.mark.slow
def test_three_coordinators_never_apply_a_result_twice(
    make_server: Any, postgres_url: str, sink: Any
) -> None:
    env = {"DUCTOR_POLL_INTERVAL": "0.05", "DUCTOR_LOG_LEVEL": "info"}
    api = make_server(
        "api", database_url=postgres_url, env={**env, "DUCTOR_ROLES": "api,worker,timer"}
    )
    api.start()
    coordinators = []
    for n in range(3):
        c = make_server(
            f"coordinator-{n}",
            database_url=postgres_url,
            env={**env, "DUCTOR_ROLES": "coordinator"},
        )
        c.api_key = api.api_key
        coordinators.append(c.start())
    with api.client() as http:
        assert http.post("/v1/workflows", json=_computed()).status_code == 201
        assert http.post("/v1/workflows", json=_chain(f"{sink.url}/ok")).status_code == 201
        run_ids = [
            http.post(
                "/v1/runs",
                json={
                    "family_slug": "fault-computed" if n % 2 else "fault-chain",
                    "input": {"n": n},
                },
            ).json()["id"]
            for n in range(200)
        ]
    runs = _wait_all(api, run_ids, timeout=120)
    assert all(r["status"] == "RUN_STATUS_SUCCEEDED" for r in runs.values())
    chains = {r: run for r, run in runs.items() if run["family_slug"] == "fault-chain"}
    _one_effect_per_step(sink, chains, ("first", "second"))
    with api.client() as http:
        for run_id in run_ids:
            history = http.get(f"/v1/runs/{run_id}/history").json()
            applied = Counter(
                (h["kind"], (h["data"] or {}).get("step_ref"))
                for h in history
                if h["kind"] in ("step.succeeded", "run.succeeded")
            )
            assert applied, run_id
            assert max(applied.values()) == 1, (run_id, applied)
    conflicts = []
    for c in coordinators:
        c.stop()
        found = re.findall(
            r"coordinator done: (\d+) runs ticked in (\d+) batches, (\d+) conflicts", c.log()
        )
        assert found, c.log()[-3000:]
        conflicts.append(tuple(int(x) for x in found[-1]))
    # The work was shared: every coordinator ticked runs.
    assert all(ticks > 0 for ticks, _, _ in conflicts), conflicts
    print(f"three coordinators: (ticks, batches, conflicts) = {conflicts}")


def _pg_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not found:
        # CI has the binaries with the PostgreSQL the suite runs against; a
        # developer's machine may have only a remote one.
        unavailable("pg_ctl", "PostgreSQL server binaries are not installed")
    return Path(found[-1]).parent


class PrivatePostgres:
    """A PostgreSQL cluster of this test's own, on a free port, that it may restart."""

    def __init__(self, root: Path) -> None:
        self.bin = _pg_bin()
        self.root = root
        self.data = root / "pgdata"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        root.mkdir(parents=True, exist_ok=True)
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(root, "postgres", "postgres")

    def _run(self, *args: str) -> None:
        command = [str(self.bin / args[0]), *args[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def init(self) -> PrivatePostgres:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        return self

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.root / "pg.log"),
            "-w",
            "start",
        )

    def restart(self) -> tuple[float, float]:
        """Stop and start the cluster; the (down, up) moments, monotonic."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        down = time.monotonic()
        time.sleep(1.0)
        self.start()
        return down, time.monotonic()

    def started_at(self) -> str:
        """When the running postmaster started (changes with every restart)."""

        async def read() -> str:
            import psycopg

            async with await psycopg.AsyncConnection.connect(self.url) as conn:
                cursor = await conn.execute("SELECT pg_postmaster_start_time()::text")
                row = await cursor.fetchone()
                assert row is not None
                return str(row[0])

        return asyncio.run(read())

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    # Not under pytest's tmp dir: the postgres user must be able to reach it.
    root = Path(tempfile.mkdtemp(prefix="ductor-pg-"))
    try:
        pg = PrivatePostgres(root).init()
        pg.start()
        try:
            yield pg
        finally:
            pg.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_a_postgres_restart_mid_load_loses_nothing(
    private_postgres: PrivatePostgres, make_server: Any, sink: Any
) -> None:
    server = make_server("on-private-pg", database_url=private_postgres.url)
    server.start()
    with server.client() as http:
        assert http.post("/v1/workflows", json=_chain(f"{sink.url}/ok")).status_code == 201
    before = private_postgres.started_at()
    with Trigger(server, "fault-chain", per_second=8) as trigger:
        time.sleep(2.0)
        down, up = private_postgres.restart()
        time.sleep(3.0)
    assert private_postgres.started_at() != before, "the database was not restarted"
    run_ids = list(trigger.runs.values())
    assert len(run_ids) >= 10
    # The load went on while the database was down: some request was refused, or
    # was held by the server across the outage and answered once it was back
    # (both are fine; a run lost or doubled is not).
    overlapping = [a for a in trigger.attempts if a[0] < up and a[1] > down]
    assert overlapping, "no request overlapped the outage: nothing was tested"
    runs = _wait_all(server, run_ids, timeout=120)
    _one_effect_per_step(sink, runs, ("first", "second"))
    assert server.proc is not None
    assert server.proc.poll() is None, "the server died"
    left = asyncio.run(_leftovers(private_postgres.url))
    assert left == {"open tasks": 0, "inbox items": 0, "runs": len(run_ids)}


@pytest.mark.slow
def test_a_redis_flush_and_restart_mid_load_lose_and_repeat_nothing(
    private_redis: PrivateRedis, make_server: Any, postgres_url: str, sink: Any
) -> None:
    server = make_server(
        "on-private-redis",
        database_url=postgres_url,
        env={"DUCTOR_REDIS_URL": private_redis.url, "DUCTOR_REDIS_PREFIX": "fault"},
    )
    server.start()
    with server.client() as http:
        assert http.post("/v1/workflows", json=_chain(f"{sink.url}/ok")).status_code == 201
    with Trigger(server, "fault-chain", per_second=8) as trigger:
        time.sleep(2.0)
        in_use = int(private_redis.cli("DBSIZE") or 0)
        assert private_redis.cli("FLUSHALL") == "OK"
        time.sleep(2.0)
        private_redis.kill9()
        # Redis is no part of readiness: the process works on from the store.
        ready = httpx.get(f"{server.url}/readyz", timeout=5)
        assert ready.status_code == 200, ready.text
        assert ready.json()["checks"] == {"store": "ok", "queue": "ok"}
        time.sleep(1.0)
        private_redis.start()
        time.sleep(2.0)
    # The queue was really in Redis when it was flushed.
    assert in_use > 0, "the server kept nothing in Redis: nothing was tested"
    run_ids = list(trigger.runs.values())
    assert len(run_ids) >= 20
    assert len(set(run_ids)) == len(run_ids), "two keys gave one run"
    runs = _wait_all(server, run_ids, timeout=120)
    _one_effect_per_step(sink, runs, ("first", "second"))
    assert server.proc is not None
    assert server.proc.poll() is None, "the server died"
    left = asyncio.run(_leftovers(postgres_url))
    assert left == {"open tasks": 0, "inbox items": 0, "runs": len(run_ids)}
    print(f"redis flush and restart: {len(run_ids)} runs, {trigger.refused} refused requests")
