"""Steps per second through the whole engine, the way a user first starts it.

A real server process runs N chains of no-op ACTION steps with its default
settings: `ductor serve --migrate` on a brand-new PostgreSQL database that
nobody has ANALYZEd (or `ductor dev` on SQLite). The bench publishes the chain
through the API and starts the runs with `POST /v1/runs/batch`, 100 runs a
request from 4 clients, as a producer with many runs would; the clock runs from
the first start to the moment the database holds every run as succeeded
(counted from a separate connection, rarely, so as not to compete; the end is
the last run's `finished_at`, not the poll that saw it, which would add up to a
poll interval to a run of a few seconds). With
`--redis URL` the server uses Redis for its fair task queue and wake-ups;
`--in-process` drives the engine in this process instead (services, coordinator
and workers without HTTP, the runs started in the same batches), which also
prints the engine's own counters.

The Postgres baseline, measured on the same server in the same run, is
pgbench's classic write: 8 clients each committing single-row `UPDATE t SET v =
v + 1 WHERE id = :id` in autocommit for a few seconds (the real `pgbench`
binary when it is installed, else the same load from psycopg). The ratio says
how many workflow steps the engine completes per single-row committed update.
On Postgres it also prints the WAL written per step and the mean size of a
finished run's row.

    uv run python bench/engine.py [--runs 1000] [--steps 10] [--backend postgres|sqlite|both]
                                  [--redis redis://127.0.0.1:6379/15] [--in-process]
                                  [--output-bytes 4096]

With `--output-bytes N` each step of the chain answers a string of N bytes (the
run's input), as steps that return documents or model answers do.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import shutil
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psycopg
from prose import prose
from routing_server import Server

from ductor_server.composition import build_services
from ductor_server.engine.actions import default_registry
from ductor_server.engine.runtime import Runtime
from ductor_server.services.runs import RunRequest
from ductor_server.storage import Store, open_store

TENANT = "bench"
CLIENTS = 8
BASELINE_SECONDS = 5
BASELINE_ROWS = 1000
START_CLIENTS = 4
START_BATCH = 100
PGBENCH_PATHS = ("/usr/lib/postgresql/15/bin/pgbench",)
OUTPUT_BYTES = 0  # --output-bytes: each step's output size, through the server


def chain(steps: int, output_bytes: int = 0) -> dict[str, object]:
    """A workflow of `steps` no-op actions, one after another; with
    `output_bytes`, step i answers the run's `input.b<i>` (that long) as its output."""

    def args(i: int) -> dict[str, object]:
        if not output_bytes:
            return {"action": "noop"}
        return {"action": "noop", "params": {"blob": f"input.b{i}"}}

    return {
        "family_slug": "bench-chain",
        "steps": [
            {"ref": f"s{i}", "type": "STEP_TYPE_ACTION", "args": args(i)} for i in range(steps)
        ],
        "edges": [{"source_ref": f"s{i}", "target_ref": f"s{i + 1}"} for i in range(steps - 1)],
    }


# --- the baseline: pgbench-style single-row UPDATEs -----------------------------------


def _prepare_update_table(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id integer PRIMARY KEY, v bigint NOT NULL)")
        conn.execute("INSERT INTO t SELECT i, 0 FROM generate_series(1, %s) AS i", (BASELINE_ROWS,))
        conn.execute("VACUUM ANALYZE t")


def _pgbench_binary() -> str | None:
    found = shutil.which("pgbench")
    if found:
        return found
    return next((p for p in PGBENCH_PATHS if os.path.exists(p)), None)


def _pgbench_tps(binary: str, url: str) -> float:
    parts = urlsplit(url)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
        script.write(
            f"\\set id random(1, {BASELINE_ROWS})\nUPDATE t SET v = v + 1 WHERE id = :id;\n"
        )
    try:
        command = [binary, "-n", "-M", "prepared", "-c", str(CLIENTS), "-j", str(CLIENTS)]
        command += ["-T", str(BASELINE_SECONDS), "-f", script.name]
        command += ["-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 5432)]
        command += ["-U", parts.username or "postgres", parts.path.lstrip("/")]
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(script.name)
    match = re.search(r"tps = ([0-9.]+)", out)
    if match is None:
        raise RuntimeError(f"pgbench printed no tps:\n{out}")
    return float(match.group(1))


async def _python_tps(url: str) -> float:
    stop = time.perf_counter() + BASELINE_SECONDS

    async def client() -> int:
        done = 0
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            while time.perf_counter() < stop:
                await conn.execute(
                    "UPDATE t SET v = v + 1 WHERE id = %s",
                    (random.randint(1, BASELINE_ROWS),),
                    prepare=True,
                )
                done += 1
        return done

    started = time.perf_counter()
    counts = await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return sum(counts) / (time.perf_counter() - started)


def baseline_update_tps(admin_url: str) -> tuple[float, str]:
    """(TPS, what measured it) of 8 clients doing single-row autocommit UPDATEs."""
    from ductor_server.pytest_plugin import create_database, drop_database

    url = create_database(admin_url)
    try:
        _prepare_update_table(url)
        binary = _pgbench_binary()
        if binary is not None:
            return _pgbench_tps(binary, url), "pgbench"
        return asyncio.run(_python_tps(url)), "psycopg"
    finally:
        drop_database(url, admin_url)


# --- the engine ---------------------------------------------------------------------


async def _run_counts(store: Store, tenant: str) -> dict[str, int]:
    async with store.transaction() as tx:
        rows = await tx.session.fetch_all(
            "SELECT status, COUNT(*) FROM runs WHERE tenant_id = %s GROUP BY status", (tenant,)
        )
    return {str(status): int(count) for status, count in rows}


async def engine_steps_per_second(target: str | Path, runs: int, steps: int) -> tuple[float, float]:
    """Migrate a fresh store, run `runs` chains of `steps` no-op actions with the
    default runtime; return (steps/s, seconds)."""
    store = open_store(target)
    await store.open()
    try:
        await store.migrate()
        async with store.transaction() as tx:
            await tx.ensure_tenant(TENANT, name="bench", now=datetime.now(UTC))
        async with Runtime.start(store, actions=default_registry()) as runtime:
            services = build_services(runtime)
            await services.workflows.publish(TENANT, chain(steps))
            started = time.perf_counter()

            async def start(client: int) -> None:
                # As the API clients do: batches of START_BATCH runs from START_CLIENTS.
                for first in range(client * START_BATCH, runs, START_CLIENTS * START_BATCH):
                    last = min(first + START_BATCH, runs)
                    batch = [
                        RunRequest(family_slug="bench-chain", input={"i": i})
                        for i in range(first, last)
                    ]
                    await services.runs.trigger_many(TENANT, batch)

            await asyncio.gather(*(start(client) for client in range(START_CLIENTS)))
            while True:
                # A cheap count, polled rarely, so as not to compete with the engine.
                await asyncio.sleep(0.2)
                counts = await _run_counts(store, TENANT)
                if counts.get("RUN_STATUS_SUCCEEDED", 0) == runs:
                    break
                if counts.get("RUN_STATUS_FAILED", 0) or counts.get("RUN_STATUS_CANCELLED", 0):
                    raise SystemExit(f"runs ended badly: {counts}")
            elapsed = time.perf_counter() - started
            c, w = runtime.coordinator, runtime.workers
            print(
                f"          (coordinator: {c.ticks} ticks in {c.batches} batches, "
                f"{c.inline_batches} inline, {c.offloaded_batches} offloaded; workers: "
                f"{w.lease_batches} lease batches, {w.report_batches} report batches, "
                f"{w.taken_at_once} tasks taken at once)"
            )
    finally:
        await store.close()
    return runs * steps / elapsed, elapsed


# --- the engine in a real server, through the API -------------------------------------


def _query(server: Server, sql: str) -> list[tuple[Any, ...]]:
    """The rows of `sql` on the server's database, from a connection of our own."""
    if server.database_url is not None:
        with psycopg.connect(server.database_url) as conn:
            return conn.execute(sql).fetchall()
    import sqlite3

    with sqlite3.connect(server.data_dir / "ductor.db", timeout=30) as conn:
        return conn.execute(sql).fetchall()


def _succeeded(server: Server) -> dict[str, int]:
    rows = _query(server, "SELECT status, COUNT(*) FROM runs GROUP BY status")
    return {str(status): int(count) for status, count in rows}


def _last_finish(server: Server) -> float:
    """When the last run finished (its `finished_at`, as a Unix time): the end
    of the measured span, exact where polling the counts would round it up."""
    [(value,)] = _query(server, "SELECT MAX(finished_at) FROM runs")
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    return moment.timestamp()


def _input(i: int, steps: int) -> dict[str, object]:
    if not OUTPUT_BYTES:
        return {"i": i}
    # A text of its own for each step (one text for every step would compress
    # to one copy and hide what storing the outputs costs).
    return {"i": i, **{f"b{s}": prose(f"{i}:{s}", OUTPUT_BYTES) for s in range(steps)}}


async def _start_all(server: Server, api_key: str, runs: int, steps: int) -> None:
    headers = {"Authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=120) as http:
        # Large inputs go in smaller batches, each well under the body limit.
        per = START_BATCH if not OUTPUT_BYTES else max(1, 500_000 // (steps * OUTPUT_BYTES))
        per = min(per, START_BATCH)

        async def client(worker: int) -> None:
            for first in range(worker * per, runs, START_CLIENTS * per):
                batch = [
                    {"family_slug": "bench-chain", "input": _input(i, steps)}
                    for i in range(first, min(first + per, runs))
                ]
                answer = await http.post(
                    "/v1/runs/batch",
                    json={"runs": batch},
                    headers={"Idempotency-Key": f"bench-{first}"},
                )
                if answer.status_code != 201:
                    raise SystemExit(f"batch start refused: {answer.status_code} {answer.text}")

        await asyncio.gather(*(client(w) for w in range(START_CLIENTS)))


def server_steps_per_second(
    backend: str, runs: int, steps: int, redis_url: str | None
) -> tuple[float, float]:
    """Start a real server on a fresh store, start `runs` chains of `steps` no-op
    actions through the API; return (steps/s, seconds)."""
    # A key space of this run's own: the queue's keys belong to one database.
    prefix = f"ductor-bench-{os.getpid()}:"
    env = {"DUCTOR_REDIS_URL": redis_url, "DUCTOR_REDIS_PREFIX": prefix} if redis_url else {}
    try:
        with tempfile.TemporaryDirectory() as tmp, Server(backend, Path(tmp), env=env) as server:
            return _run_on(server, runs, steps)
    finally:
        if redis_url:
            import redis

            client = redis.Redis.from_url(redis_url)
            for key in client.scan_iter(match=prefix + "*"):
                client.delete(key)
            client.close()


def publish(server: Server, api_key: str, steps: int) -> None:
    """Publish the chain of `steps` no-op steps through the API."""
    answer = httpx.post(
        f"{server.url}/v1/workflows",
        json=chain(steps, OUTPUT_BYTES),
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=60,
    )
    if answer.status_code not in (200, 201):
        raise SystemExit(f"publish refused: {answer.text}")


def _wal_lsn(server: Server) -> int | None:
    """Where the server's WAL stands, in bytes (None on SQLite)."""
    if server.database_url is None:
        return None
    with psycopg.connect(server.database_url) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    return int(row[0]) if row else None


def _run_sizes(server: Server) -> str:
    """The mean stored size of a finished run's row and of its state, on Postgres."""
    if server.database_url is None:
        return ""
    sql = "SELECT AVG(pg_column_size(r.*)), AVG(pg_column_size(r.state)) FROM runs r"
    with psycopg.connect(server.database_url) as conn:
        row = conn.execute(sql).fetchone()
    if row is None or row[0] is None:
        return ""
    return f"run row {float(row[0]):.0f} B (state {float(row[1]):.0f} B)"


WAL_NOTE: list[str] = []


def _run_on(server: Server, runs: int, steps: int) -> tuple[float, float]:
    api_key = server.api_key()
    publish(server, api_key, steps)
    wal_before = _wal_lsn(server)
    started = time.time()
    asyncio.run(_start_all(server, api_key, runs, steps))
    while True:
        time.sleep(0.2)
        counts = _succeeded(server)
        if counts.get("RUN_STATUS_SUCCEEDED", 0) == runs:
            break
        if counts.get("RUN_STATUS_FAILED", 0) or counts.get("RUN_STATUS_CANCELLED", 0):
            raise SystemExit(f"runs ended badly: {counts}")
    elapsed = _last_finish(server) - started
    wal_after = _wal_lsn(server)
    if wal_before is not None and wal_after is not None:
        per_step = (wal_after - wal_before) / (runs * steps)
        WAL_NOTE.append(f"WAL {per_step:,.0f} B/step, {_run_sizes(server)}")
    return runs * steps / elapsed, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=None, help="default 1000")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="postgres")
    parser.add_argument("--redis", default=None, help="the server's DUCTOR_REDIS_URL")
    parser.add_argument(
        "--output-bytes",
        type=int,
        default=0,
        help="through the server, each step answers a string this long (default: {})",
    )
    parser.add_argument(
        "--in-process", action="store_true", help="drive the engine here, without a server"
    )
    args = parser.parse_args()
    global OUTPUT_BYTES
    OUTPUT_BYTES = args.output_bytes
    how = "in process" if args.in_process else "server + API" + (", Redis" if args.redis else "")
    if OUTPUT_BYTES and not args.in_process:
        how += f", {OUTPUT_BYTES} B outputs"
    if args.backend in ("sqlite", "both"):
        runs = args.runs or 1000
        if args.in_process:
            with tempfile.TemporaryDirectory() as tmp:
                rate, elapsed = asyncio.run(
                    engine_steps_per_second(Path(tmp) / "bench.db", runs, args.steps)
                )
        else:
            rate, elapsed = server_steps_per_second("sqlite", runs, args.steps, args.redis)
        print(
            f"sqlite    engine {rate:8.0f} steps/s"
            f" ({runs} runs x {args.steps} steps, {how}, {elapsed:.1f}s)"
        )
    if args.backend in ("postgres", "both"):
        from ductor_server.pytest_plugin import admin_database_url, create_database, drop_database

        runs = args.runs or 1000
        admin = os.environ.get("DUCTOR_BENCH_DATABASE_URL", admin_database_url())
        if args.in_process:
            try:
                url = create_database(admin)
            except Exception as exc:  # no server: say so and go on
                print(f"postgres  skipped: {exc}")
                return
            try:
                rate, elapsed = asyncio.run(engine_steps_per_second(url, runs, args.steps))
            finally:
                drop_database(url, admin)
        else:
            rate, elapsed = server_steps_per_second("postgres", runs, args.steps, args.redis)
        tps, baseline = baseline_update_tps(admin)
        print(
            f"postgres  engine {rate:8.0f} steps/s ({runs} runs x {args.steps} steps on a fresh"
            f" database, {how}, {elapsed:.1f}s) | baseline {tps:8.0f} single-row UPDATE/s"
            f" ({baseline}, {CLIENTS} clients, {BASELINE_SECONDS}s)"
            f" | ratio {rate / tps:.2f} steps per UPDATE"
        )
        for note in WAL_NOTE:
            print(f"postgres  {note}")


if __name__ == "__main__":
    main()
