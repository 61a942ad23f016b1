"""Trigger → complete latency of a 3-step run at half the measured maximum load.

A real server process on 127.0.0.1, the way a user first starts it: `ductor
serve --migrate` on a brand-new PostgreSQL database, or `ductor dev` on its
embedded SQLite file. Everything goes through the API: the chain of no-op
ACTION steps is published with `POST /v1/workflows` and each run is started
with its own `POST /v1/runs`.

1. Commits per run: a Postgres server is started behind a loopback proxy that
   counts the COMMITs it sends (`ductor_server.testing.CommitCounter`); runs
   are triggered one at a time on it, idle, and each is counted until a moment
   after it ended, less the idle server's own polls (its statements, BEGIN
   and COMMIT included, and its round trips, the times it waited for the
   database, are counted and printed too). The engine code is the same on
   SQLite, so both backends use this count.
2. Baseline: that many single-row UPDATE commits in sequence over one
   connection, against the benchmarked server's database (on SQLite, a file
   beside the server's with its journal settings), timed many times; and, for
   comparison, as many one-UPDATE transactions through the server's store code.
3. Maximum throughput: `--burst` runs started by 8 clients, one request each
   at a time, timed from the first request to the last run's `finished_at`;
   with `--observe wait` each run is also waited for by its long poll, sent
   once it is triggered, as in the latency phase (the maximum is of the load
   whose latency is measured: the polls cost the server too).
4. Latency: `--runs` runs started one at a time at a steady pace, half that
   rate (`--fraction`), each request sent on schedule, not after the previous
   answer. A run's latency is from the moment its request is sent to the
   moment the caller learns it succeeded: by default the caller's own long
   poll, `GET /v1/runs/{id}?wait=30` sent as soon as the trigger is answered,
   which the server answers once the run has ended (`--observe db`: one query
   for every run in flight every `--poll-ms` against the database, from a
   connection of its own, which adds up to `--poll-ms`; `--observe api` polls
   `GET /v1/runs/{id}` per run instead: requests the server serves alongside
   the runs, enough to overload it). The latency to the run's own
   `finished_at` (the time its last tick began) is printed beside it.

The p50 and p99 are divided by the baseline's median; the targets are 2x and 3x.

    uv run python bench/latency.py [--backend postgres|sqlite|both] [--runs 500] [--burst 500]
                                   [--steps 3] [--fraction 0.5 | --rate R] [--observe wait|db|api]
                                   [--poll-ms 5]

`--rate R` paces the latency phase at R runs/s instead of a fraction of the
measured maximum (which varies from run to run), so two builds compare at one load.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psycopg
from engine import publish
from routing_server import ADMIN_URL, Server, percentile

from ductor_server.storage import open_store
from ductor_server.testing import CommitCounter

SUCCEEDED = "RUN_STATUS_SUCCEEDED"
ENDED = {SUCCEEDED, "RUN_STATUS_FAILED", "RUN_STATUS_CANCELLED"}
BURST_CLIENTS = 8
COUNT_RUNS = 10
COUNT_IDLE = 3.0  # seconds of an idle server, to subtract its polls
COUNT_SETTLE = 0.2  # seconds after a run ended in which its commits are still counted
BASELINE_SAMPLES = 300
STORE_SAMPLES = 100
IDLE_RUNS = 50
PHASE_TIMEOUT = 120.0  # seconds any one phase may take beyond its schedule


@dataclass(frozen=True)
class Ended:
    status: str
    finished_at: datetime | None


class Database:
    """The server's database, read from a connection of the bench's own."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.pg: psycopg.Connection[tuple[object, ...]] | None = None
        self.lite: sqlite3.Connection | None = None
        if server.database_url is not None:
            self.pg = psycopg.connect(server.database_url, autocommit=True)
        else:
            self.lite = sqlite3.connect(
                server.data_dir / "ductor.db", timeout=30, isolation_level=None
            )

    def close(self) -> None:
        if self.pg is not None:
            self.pg.close()
        if self.lite is not None:
            self.lite.close()

    def ended(self, ids: Iterable[str]) -> dict[str, Ended]:
        """The runs among `ids` that have ended."""
        wanted = list(ids)
        if not wanted:
            return {}
        if self.pg is not None:
            rows = self.pg.execute(
                "SELECT id, status, finished_at FROM runs WHERE id = ANY(%s) AND status = ANY(%s)",
                (wanted, sorted(ENDED)),
                prepare=True,
            ).fetchall()
        else:
            assert self.lite is not None
            marks = ",".join("?" * len(wanted))
            rows = self.lite.execute(
                f"SELECT id, status, finished_at FROM runs WHERE id IN ({marks})"
                " AND status IN (?, ?, ?)",
                (*wanted, *sorted(ENDED)),
            ).fetchall()
        out = {}
        for run_id, status, finished in rows:
            if isinstance(finished, str):
                finished = datetime.fromisoformat(finished)
            out[str(run_id)] = Ended(str(status), finished)
        return out


# --- the API ----------------------------------------------------------------------


def client(server: Server, api_key: str) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    return httpx.AsyncClient(
        base_url=server.url,
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=60,
        limits=limits,
    )


async def trigger(http: httpx.AsyncClient, i: int) -> str:
    answer = await http.post("/v1/runs", json={"family_slug": "bench-chain", "input": {"i": i}})
    if answer.status_code != 201:
        raise SystemExit(f"start refused: {answer.status_code} {answer.text}")
    return str(answer.json()["id"])


def check_succeeded(ended: dict[str, Ended], ids: list[str]) -> None:
    bad = {i: e.status for i, e in ended.items() if e.status != SUCCEEDED}
    if bad or len(ended) != len(ids):
        raise SystemExit(f"runs ended badly or not at all: {len(ended)}/{len(ids)} ended, {bad}")


# --- 1. commits per run ------------------------------------------------------------


def commits_per_run(steps: int) -> tuple[int, list[int], float, int, int]:
    """Transactions one run takes, counted as COMMITs on the wire between a Postgres
    server process and its database: (median, per run, idle commits/s subtracted,
    and the medians of the statements sent per run, BEGIN and COMMIT included,
    and of the round trips: the times the server process waited for an answer)."""
    target = urlsplit(ADMIN_URL)
    counter = CommitCounter((target.hostname or "127.0.0.1", target.port or 5432))
    try:
        with (
            tempfile.TemporaryDirectory() as tmp,
            Server("postgres", Path(tmp), route=counter.url) as server,
        ):
            api_key = server.api_key()
            publish(server, api_key, steps)
            db = Database(server)  # straight to Postgres: its commits are not counted
            try:
                return asyncio.run(_count(server, api_key, counter, db))
            finally:
                db.close()
    finally:
        counter.close()


async def _count(
    server: Server, api_key: str, counter: CommitCounter, db: Database
) -> tuple[int, list[int], float, int, int]:
    async with client(server, api_key) as http:
        await trigger(http, -1)  # warm: the key, the definition, the connections
        await asyncio.sleep(1.0)
        before, said, trips, started = (
            counter.commits,
            counter.statements,
            counter.round_trips,
            time.perf_counter(),
        )
        await asyncio.sleep(COUNT_IDLE)  # the safety-net polls of an idle server
        idle_rate = (counter.commits - before) / (time.perf_counter() - started)
        idle_said = (counter.statements - said) / (time.perf_counter() - started)
        idle_trips = (counter.round_trips - trips) / (time.perf_counter() - started)
        counts, statements, round_trips = [], [], []
        for i in range(COUNT_RUNS):
            before, said, trips, started = (
                counter.commits,
                counter.statements,
                counter.round_trips,
                time.perf_counter(),
            )
            run_id = await trigger(http, -2 - i)
            async with asyncio.timeout(PHASE_TIMEOUT):
                while not db.ended([run_id]):  # noqa: ASYNC110 (the database is what we watch)
                    await asyncio.sleep(0.001)
            await asyncio.sleep(COUNT_SETTLE)  # the looks the loops take after it ended
            took = time.perf_counter() - started
            counts.append(round(counter.commits - before - idle_rate * took))
            statements.append(round(counter.statements - said - idle_said * took))
            round_trips.append(round(counter.round_trips - trips - idle_trips * took))
            check_succeeded(db.ended([run_id]), [run_id])
    return (
        round(statistics.median(counts)),
        counts,
        idle_rate,
        round(statistics.median(statements)),
        round(statistics.median(round_trips)),
    )


# --- 2. the baseline ---------------------------------------------------------------


def baseline_ms(server: Server, commits: int) -> list[float]:
    """Milliseconds of `commits` single-row UPDATE commits in sequence, many times."""
    samples = []
    if server.database_url is not None:
        with psycopg.connect(server.database_url, autocommit=True) as conn:
            conn.execute("CREATE TABLE bench_latency_baseline (id integer PRIMARY KEY, v bigint)")
            conn.execute("INSERT INTO bench_latency_baseline VALUES (1, 0)")
            update = "UPDATE bench_latency_baseline SET v = v + 1 WHERE id = 1"
            for _ in range(20):
                conn.execute(update, prepare=True)
            for _ in range(BASELINE_SAMPLES):
                started = time.perf_counter()
                for _ in range(commits):
                    conn.execute(update, prepare=True)
                samples.append((time.perf_counter() - started) * 1000)
            conn.execute("DROP TABLE bench_latency_baseline")
        return samples
    # The server's own settings (storage/sqlite.py): WAL, synchronous NORMAL, and
    # every transaction BEGIN IMMEDIATE.
    path = server.data_dir / "baseline.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("CREATE TABLE t (id integer PRIMARY KEY, v integer)")
        conn.execute("INSERT INTO t VALUES (1, 0)")
        for n in range(BASELINE_SAMPLES + 1):
            started = time.perf_counter()
            for _ in range(commits):
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("UPDATE t SET v = v + 1 WHERE id = 1")
                conn.execute("COMMIT")
            if n:  # the first one warms up
                samples.append((time.perf_counter() - started) * 1000)
    finally:
        conn.close()
    return samples


async def store_baseline_ms(target: str | Path, commits: int) -> list[float]:
    """Milliseconds of `commits` one-UPDATE transactions in sequence through the
    server's own store code (its pool or thread, BEGIN, UPDATE, COMMIT)."""
    store = open_store(target)
    await store.open()
    samples = []
    try:
        async with store.transaction() as tx:
            await tx.session.execute(
                "CREATE TABLE bench_latency_store (id integer PRIMARY KEY, v bigint)"
            )
            await tx.session.execute("INSERT INTO bench_latency_store VALUES (1, 0)")
        for n in range(STORE_SAMPLES + 1):
            started = time.perf_counter()
            for _ in range(commits):
                async with store.transaction() as tx:
                    await tx.session.execute(
                        "UPDATE bench_latency_store SET v = v + 1 WHERE id = %s", (1,)
                    )
            if n:  # the first one warms up
                samples.append((time.perf_counter() - started) * 1000)
        async with store.transaction() as tx:
            await tx.session.execute("DROP TABLE bench_latency_store")
    finally:
        await store.close()
    return samples


# --- 3. maximum throughput ---------------------------------------------------------


async def max_throughput(
    server: Server, api_key: str, runs: int, observe: str
) -> tuple[float, float]:
    """(runs/s, seconds) of `runs` runs started by 8 clients as fast as answered;
    with `observe` "wait", each run is also waited for by its own long poll, sent
    once it is triggered (the latency phase's load, which the maximum is of)."""
    db = Database(server)
    ids: list[str] = []
    polls: list[asyncio.Task[httpx.Response]] = []
    try:
        async with client(server, api_key) as http:
            numbers = iter(range(runs))

            async def starter() -> None:
                for i in numbers:
                    run_id = await trigger(http, 1000 + i)
                    ids.append(run_id)
                    if observe == "wait":
                        wait = http.get(f"/v1/runs/{run_id}", params={"wait": 30})
                        polls.append(asyncio.create_task(wait))

            started_wall = datetime.now(UTC)
            started = time.perf_counter()
            await asyncio.gather(*(starter() for _ in range(BURST_CLIENTS)))
            await asyncio.wait_for(asyncio.gather(*polls), PHASE_TIMEOUT)
            deadline = started + PHASE_TIMEOUT
            while True:
                await asyncio.sleep(0.1)
                ended = db.ended(ids)
                if len(ended) == len(ids) or time.perf_counter() > deadline:
                    break
        check_succeeded(ended, ids)
    finally:
        db.close()
    last = max(e.finished_at for e in ended.values() if e.finished_at is not None)
    seconds = (last - started_wall).total_seconds()
    return runs / seconds, seconds


# --- 4. latency at a steady pace ---------------------------------------------------


@dataclass
class Sample:
    sent: float  # perf_counter
    sent_wall: datetime
    seen: float | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)


async def paced_latency(
    server: Server, api_key: str, rate: float | None, runs: int, observe: str, poll_ms: float
) -> tuple[list[float], list[float], int]:
    """Latency samples in ms: (observed, to finished_at, polls made); runs started
    `rate` a second, or each when the one before was seen ended (`rate` None)."""
    db = Database(server)
    samples: dict[str, Sample] = {}
    in_flight: set[str] = set()
    polls = 0
    all_sent = asyncio.Event()
    interval = poll_ms / 1000

    try:
        async with client(server, api_key) as http:

            async def watch_api(run_id: str) -> None:
                nonlocal polls
                while True:
                    await asyncio.sleep(interval)
                    polls += 1
                    answer = await http.get(f"/v1/runs/{run_id}")
                    if answer.json().get("status") in ENDED:
                        samples[run_id].seen = time.perf_counter()
                        samples[run_id].done.set()
                        return

            async def watch_db() -> None:
                nonlocal polls
                while in_flight or not all_sent.is_set():
                    await asyncio.sleep(interval)
                    if not in_flight:
                        continue
                    polls += 1
                    seen = time.perf_counter()
                    for run_id in db.ended(in_flight):
                        samples[run_id].seen = seen
                        samples[run_id].done.set()
                        in_flight.discard(run_id)

            async def wait_api(run_id: str) -> None:
                nonlocal polls
                while True:
                    polls += 1
                    answer = await http.get(f"/v1/runs/{run_id}", params={"wait": 30})
                    if answer.json().get("status") in ENDED:
                        samples[run_id].seen = time.perf_counter()
                        samples[run_id].done.set()
                        return

            async def one(i: int) -> str:
                sample = Sample(time.perf_counter(), datetime.now(UTC))
                run_id = await trigger(http, 10_000 + i)
                samples[run_id] = sample
                if observe == "api":
                    await watch_api(run_id)
                elif observe == "wait":
                    await wait_api(run_id)
                else:
                    in_flight.add(run_id)
                return run_id

            watcher = asyncio.create_task(watch_db()) if observe == "db" else None
            tasks = []
            started = time.perf_counter()
            for i in range(runs):
                if rate is not None:
                    await asyncio.sleep(max(0.0, started + i / rate - time.perf_counter()))
                    tasks.append(asyncio.create_task(one(i)))
                else:
                    async with asyncio.timeout(PHASE_TIMEOUT):
                        await samples[await one(i)].done.wait()
            await asyncio.wait_for(asyncio.gather(*tasks), PHASE_TIMEOUT)
            all_sent.set()
            if watcher is not None:
                await asyncio.wait_for(watcher, PHASE_TIMEOUT)
        ended = db.ended(samples)
        check_succeeded(ended, list(samples))
    finally:
        db.close()
    observed, recorded = [], []
    for run_id, sample in samples.items():
        assert sample.seen is not None
        observed.append((sample.seen - sample.sent) * 1000)
        finished = ended[run_id].finished_at
        assert finished is not None
        recorded.append((finished - sample.sent_wall).total_seconds() * 1000)
    return observed, recorded, polls


# --- the bench ---------------------------------------------------------------------


def bench(backend: str, args: argparse.Namespace, commits: int) -> None:
    print(f"\n[{backend}] {args.steps}-step no-op runs, one POST /v1/runs each")
    with tempfile.TemporaryDirectory() as tmp, Server(backend, Path(tmp)) as server:
        api_key = server.api_key()
        publish(server, api_key, args.steps)
        base = baseline_ms(server, commits)
        b50, b99 = percentile(base, 0.5), percentile(base, 0.99)
        print(
            f"  baseline: {commits} single-row UPDATE commits in sequence, one connection:"
            f" p50 {b50:.2f} ms, p99 {b99:.2f} ms ({len(base)} samples)"
        )
        through = server.database_url or server.data_dir / "baseline.db"
        store = asyncio.run(store_baseline_ms(through, commits))
        s50, s99 = percentile(store, 0.5), percentile(store, 0.99)
        print(
            f"  the same through the server's store code (BEGIN, UPDATE, COMMIT):"
            f" p50 {s50:.2f} ms, p99 {s99:.2f} ms ({len(store)} samples)"
        )
        rate, seconds = asyncio.run(max_throughput(server, api_key, args.burst, args.observe))
        print(
            f"  max throughput: {rate:.1f} runs/s ({args.burst} runs, {BURST_CLIENTS} clients,"
            f"{' each run waited by a long poll,' if args.observe == 'wait' else ''}"
            f" {seconds:.1f} s to the last finished_at)"
        )
        alone, _, _ = asyncio.run(
            paced_latency(server, api_key, None, IDLE_RUNS, args.observe, args.poll_ms)
        )
        pace = args.rate if args.rate is not None else rate * args.fraction
        observed, recorded, polls = asyncio.run(
            paced_latency(server, api_key, pace, args.runs, args.observe, args.poll_ms)
        )
    a50, a99 = percentile(alone, 0.5), percentile(alone, 0.99)
    print(
        f"  latency of {IDLE_RUNS} runs one after another (no load): p50 {a50:.1f} ms,"
        f" p99 {a99:.1f} ms"
    )
    how = {
        "db": f"a watcher querying the database every {args.poll_ms:g} ms",
        "api": f"GET /v1/runs/{{id}} every {args.poll_ms:g} ms per run",
        "wait": "the caller's own long poll, GET /v1/runs/{id}?wait=30, sent once triggered",
    }[args.observe]
    print(
        f"  latency at {pace:.1f} runs/s, {args.runs} runs, trigger sent -> seen succeeded"
        f" ({how}, {polls} polls):"
    )
    p50, p90, p99 = (percentile(observed, q) for q in (0.5, 0.9, 0.99))
    r50, r90, r99 = (percentile(recorded, q) for q in (0.5, 0.9, 0.99))
    print(f"    observed       p50 {p50:6.1f} ms  p90 {p90:6.1f} ms  p99 {p99:6.1f} ms")
    print(f"    to finished_at p50 {r50:6.1f} ms  p90 {r90:6.1f} ms  p99 {r99:6.1f} ms")
    tenth = max(1, len(observed) // 10)
    first, last = percentile(observed[:tenth], 0.5), percentile(observed[-tenth:], 0.5)
    print(
        f"    p50 of the first {tenth} runs {first:.1f} ms, of the last {tenth} {last:.1f} ms"
        " (a rise says the pace is more than the server keeps up with)"
    )
    met = {True: "met", False: "not met"}
    print(
        f"  ratio to the baseline's p50: p50 {p50 / b50:.1f}x (target 2x: {met[p50 / b50 <= 2]}),"
        f" p99 {p99 / b50:.1f}x (target 3x: {met[p99 / b50 <= 3]})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--burst", type=int, default=500, help="runs to measure the maximum")
    parser.add_argument("--runs", type=int, default=500, help="runs to measure the latency")
    parser.add_argument(
        "--fraction", type=float, default=0.5, help="of the maximum throughput, the pace"
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="runs/s to pace at instead of a fraction of the maximum (for A/B runs)",
    )
    parser.add_argument("--observe", choices=["wait", "db", "api"], default="wait")
    parser.add_argument("--poll-ms", type=float, default=5.0)
    parser.add_argument(
        "--commits", type=int, default=None, help="commits per run, instead of counting them"
    )
    args = parser.parse_args()
    if not (1 <= args.runs <= 5000 and 1 <= args.burst <= 5000 and 0 < args.fraction <= 1):
        raise SystemExit("--runs and --burst go from 1 to 5000, --fraction from 0 to 1")
    if args.rate is not None and not 0 < args.rate <= 10_000:
        raise SystemExit("--rate goes from 0 to 10000 runs/s")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    commits = args.commits
    if commits is None:
        commits, counts, idle_rate, statements, round_trips = commits_per_run(args.steps)
        print(
            f"commits per run: {commits} (COMMITs on the wire of a Postgres server, one run at"
            f" a time on an idle server: {counts}, less {idle_rate:.1f}/s of idle polls);"
            f" statements per run: {statements} (BEGIN and COMMIT included);"
            f" round trips per run: {round_trips} (the server waiting for its database)"
        )
    for backend in ["postgres", "sqlite"] if args.backend == "both" else [args.backend]:
        bench(backend, args, commits)
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
