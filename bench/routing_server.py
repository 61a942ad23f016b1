"""Decision latency of POST /v1/route in a real server process (p50, p99).

A `ductor dev` (SQLite) or `ductor serve` (Postgres) process is started on
127.0.0.1; a single client routes leads one after another through three
auction pools of 100 buyers with state filters, caps and bids. Baselines,
measured in the same run against the same process: `GET /healthz` (the HTTP
floor) and `GET /v1/workers/{id}` (an authenticated one-row read). The offline
pipeline (the same configuration, `Router.route` + in-memory commit) says how
much of a decision is routing itself.

    uv run python bench/routing_server.py [--decisions 2000] [--backend sqlite|postgres|both]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import msgspec

from ductor_core.expressions import engine_by_name
from ductor_routing import InMemoryRoutingState, KindSchema, Pool, Routable, Router, RuleSet
from ductor_routing import Worker as RoutingWorker
from ductor_server.cli_server import create_key
from ductor_server.storage import open_store

STATES = ["CA", "NV", "AZ", "TX", "FL", "NY", "OR", "WA"]
POOLS = ("solar", "insurance", "mortgage")
ADMIN_URL = os.environ.get("DUCTOR_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")


def config(buyers: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    rng = random.Random(5)
    workers = [{"id": f"b{i:03d}", "kind": "system"} for i in range(buyers)]
    pools = []
    for p, name in enumerate(POOLS):
        members = [
            {
                "worker": w["id"],
                "bid": rng.randrange(5_000_000, 40_000_000, 1000),
                "filters": [{"attribute": "state", "op": "in", "values": rng.sample(STATES, 3)}],
                "caps": [{"window": "day", "limit": 1_000_000}],
            }
            for i, w in enumerate(workers)
            if i % 3 == p or i % 5 == 0
        ]
        pools.append(
            {
                "id": name,
                "channel": "leads",
                "strategy": {"name": "auction", "options": {"pricing": "second"}},
                "shadows": [{"name": "round_robin"}],
                "members": members,
            }
        )
    rules = {
        "id": "bench",
        "kinds": {"lead": {"attributes": {"state": {"type": "string", "required": True}}}},
        "rules": [
            {"id": f"to-{p}", "pool": p, "match": [{"attribute": "vertical", "value": p}]}
            for p in POOLS
        ],
    }
    return workers, pools, rules


def lead(n: int, rng: random.Random) -> dict[str, Any]:
    return {
        "id": f"lead-{n}",
        "kind": "lead",
        "attributes": {"state": rng.choice(STATES), "vertical": rng.choice(POOLS)},
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(fn: Callable[[], Any], count: int) -> list[float]:
    """Latency of `count` sequential calls, in milliseconds."""
    out = []
    for _ in range(count):
        started = time.perf_counter()
        fn()
        out.append((time.perf_counter() - started) * 1000)
    return out


def offline_us(buyers: int, decisions: int) -> float:
    """Microseconds per decision of the pure pipeline on the same configuration."""
    workers, pools, rules = config(buyers)
    router = Router(
        rule_set=msgspec.convert({"id": "bench", "rules": rules["rules"]}, RuleSet, strict=False),
        pools=[msgspec.convert(p, Pool) for p in pools],
        workers=[msgspec.convert(w, RoutingWorker) for w in workers],
        kinds={"lead": msgspec.convert(rules["kinds"]["lead"], KindSchema)},
        engine=engine_by_name("cel-rust"),
    )
    state = InMemoryRoutingState()
    rng = random.Random(9)
    now = datetime(2026, 11, 29, 12, tzinfo=UTC)
    started = time.perf_counter()
    for n in range(decisions):
        body = lead(n, rng)
        decision = router.route(
            Routable(id=body["id"], kind="lead", attributes=body["attributes"]), state, now
        )
        if decision.intent is not None:
            state.commit(decision.intent)
    return (time.perf_counter() - started) / decisions * 1e6


class Server:
    def __init__(
        self,
        backend: str,
        data_dir: Path,
        *,
        env: dict[str, str] | None = None,
        route: Callable[[str], str] | None = None,
    ) -> None:
        """`route` maps the database's URL to the one the server connects to (a proxy's)."""
        self.backend = backend
        self.extra_env = env or {}
        self.route = route
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = data_dir
        self.database_url: str | None = None
        self.db_name = f"ductor_bench_routing_{os.getpid()}"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_")}
        env.update(self.extra_env)
        if self.backend == "postgres":
            import psycopg

            with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.db_name}"')
                conn.execute(f'CREATE DATABASE "{self.db_name}"')
            self.database_url = ADMIN_URL.rsplit("/", 1)[0] + "/" + self.db_name
            route = self.route or (lambda url: url)
            env["DUCTOR_DATABASE_URL"] = route(self.database_url)
            args = ["serve", "--migrate", "--port", str(self.port)]
        else:
            args = ["dev", "--port", str(self.port), "--data-dir", str(self.data_dir)]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ductor_server.cli", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120  # a loaded two-core machine may take over 30 s
        while True:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.__exit__()  # __exit__ is not called when __enter__ raises
                raise SystemExit(f"{self.backend} server did not start")
            time.sleep(0.1)
        return self

    def api_key(self) -> str:
        if self.database_url is None:
            return (self.data_dir / "api_key").read_text().strip()

        async def mint(url: str) -> str:
            store = open_store(url)
            await store.open()
            try:
                return await create_key(store, "bench", name="bench")
            finally:
                await store.close()

        return asyncio.run(mint(self.database_url))

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        if self.database_url is not None:
            import psycopg

            with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.db_name}"')


def run(backend: str, buyers: int, decisions: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, Server(backend, Path(tmp) / "data") as server:
        headers = {"Authorization": f"Bearer {server.api_key()}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
            workers, pools, rules = config(buyers)
            for w in workers:
                http.post("/v1/workers", json=w).raise_for_status()
            for p in pools:
                http.post("/v1/pools", json=p).raise_for_status()
            http.post("/v1/rules", json=rules).raise_for_status()
            rng = random.Random(3)
            counter = iter(range(10**9))

            def route() -> None:
                r = http.post("/v1/route", json=lead(next(counter), rng))
                r.raise_for_status()

            timed(route, 100)  # warm up: router compiled, connections open
            health = timed(lambda: http.get("/healthz").raise_for_status(), decisions)
            read = timed(lambda: http.get("/v1/workers/b001").raise_for_status(), decisions)
            latencies = timed(route, decisions)
        p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
        h50, h99 = percentile(health, 0.5), percentile(health, 0.99)
        r50, r99 = percentile(read, 0.5), percentile(read, 0.99)
        print(f"\n[{backend}] {decisions} sequential decisions, {buyers} buyers in 3 pools")
        print(f"  GET /healthz         p50 {h50:7.2f} ms  p99 {h99:7.2f} ms   (baseline)")
        print(f"  GET /v1/workers/{{id}} p50 {r50:7.2f} ms  p99 {r99:7.2f} ms")
        print(
            f"  POST /v1/route       p50 {p50:7.2f} ms  p99 {p99:7.2f} ms"
            f"  mean {statistics.fmean(latencies):.2f} ms"
        )
        print(f"  route p99 / healthz p99      = {p99 / h99:6.1f}x")
        print(f"  route p99 / one-row read p99 = {p99 / r99:6.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=2000)
    parser.add_argument("--buyers", type=int, default=100)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    args = parser.parse_args()
    us = offline_us(args.buyers, args.decisions)
    print(f"offline pipeline (Router.route + in-memory commit, cel-rust): {us:.0f} us/decision")
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    for backend in backends:
        run(backend, args.buyers, args.decisions)
        print(f"  (offline pipeline is {us / 1000:.2f} ms of a decision)")


if __name__ == "__main__":
    main()
