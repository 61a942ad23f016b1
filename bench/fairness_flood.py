"""Fairness under a flood, in a real server: tenant A enqueues 20,000 runs at once,
then tenant B triggers 100; B's trigger-to-end latency (p50, p99) against B's
latency on the idle server, measured in the same run (the ratio is the figure;
the target is p99 within 3x).

A `ductor serve` on a fresh Postgres database and a redis-server of the bench's
own (the Redis fair queue), and an HTTP service on 127.0.0.1 that A's steps call
(each call takes `--call-ms`) and B's step calls (at once). A's runs are
enqueued with `POST /v1/runs/batch` (500 a call, from four clients); B's runs
with `POST /v1/runs` from eight clients, as the e2e test does.

    uv run python bench/fairness_flood.py [--a-runs 20000] [--b-runs 100] [--call-ms 200]

On a shared machine the figure moves with the other load: read it with the
idle baseline of the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx

from ductor_server.cli_server import create_key
from ductor_server.storage import open_store
from ductor_server.testing import LoopbackHTTPServer

ADMIN_URL = os.environ.get("DUCTOR_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
ENDED = {"RUN_STATUS_SUCCEEDED", "RUN_STATUS_FAILED", "RUN_STATUS_CANCELLED"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Sink:
    """Answers `/sleep/<ms>/<label>` after that long, anything else at once;
    counts the calls in flight per label and the most ever seen."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                label = self.path.rsplit("/", 1)[-1]
                with sink.lock:
                    sink.in_flight[label] = sink.in_flight.get(label, 0) + 1
                    sink.peak[label] = max(sink.peak.get(label, 0), sink.in_flight[label])
                length = int(self.headers.get("content-length") or 0)
                if length:
                    self.rfile.read(length)
                if self.path.startswith("/sleep/"):
                    time.sleep(int(self.path.split("/")[2]) / 1000)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")
                with sink.lock:
                    sink.in_flight[label] -= 1
                    sink.calls[label] = sink.calls.get(label, 0) + 1

        self.server = LoopbackHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Deployment:
    """A redis-server, a fresh database and one `ductor serve` on both."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.db_name = f"ductor_bench_fairness_{os.getpid()}"
        self.database_url = ADMIN_URL.rsplit("/", 1)[0] + "/" + self.db_name
        self.redis_port = free_port()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Deployment:
        import psycopg

        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.db_name}"')
            conn.execute(f'CREATE DATABASE "{self.db_name}"')
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server is not installed")
        redis = [binary, "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", ""]
        self.procs.append(subprocess.Popen(redis, cwd=self.workdir, stdout=subprocess.DEVNULL))
        env = {k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_")}
        env.update(
            {
                "DUCTOR_DATABASE_URL": self.database_url,
                "DUCTOR_REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0",
                "DUCTOR_LEASE_SECONDS": "60",
                "DUCTOR_OUTBOUND_ALLOW": "127.0.0.0/8",
            }
        )
        log = (self.workdir / "server.log").open("ab")
        self.procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ductor_server.cli",
                    "serve",
                    "--migrate",
                    "--port",
                    str(self.port),
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        deadline = time.monotonic() + 120  # a loaded two-core machine may take long
        while True:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or self.procs[-1].poll() is not None:
                raise SystemExit("the server did not start: see " + str(log.name))
            time.sleep(0.2)

    def key(self, tenant: str) -> str:
        async def mint() -> str:
            store = open_store(self.database_url)
            await store.open()
            try:
                return await create_key(store, tenant, name="bench")
            finally:
                await store.close()

        return asyncio.run(mint())

    def __exit__(self, *exc: object) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        import psycopg

        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.db_name}"')


def client(url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120)


def workflow(slug: str, url: str) -> dict[str, Any]:
    return {
        "family_slug": slug,
        "steps": [
            {
                "ref": "call",
                "type": "STEP_TYPE_ACTION",
                "args": {"action": "http", "params": {"url": json.dumps(url), "method": '"POST"'}},
            }
        ],
    }


def trigger_b(url: str, key: str, count: int) -> list[str]:
    def some(n: int) -> list[str]:
        with client(url, key) as http:
            out = []
            for _ in range(n):
                response = http.post("/v1/runs", json={"family_slug": "quick", "input": {}})
                assert response.status_code == 201, response.text
                out.append(response.json()["id"])
            return out

    shares = [count // 8 + (i < count % 8) for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        return [run_id for ids in pool.map(some, shares) for run_id in ids]


def flood_a(url: str, key: str, count: int) -> None:
    def batch(n: int) -> None:
        with client(url, key) as http:
            body = {"runs": [{"family_slug": "flood", "input": {}} for _ in range(n)]}
            response = http.post("/v1/runs/batch", json=body)
            assert response.status_code == 201, response.text

    sizes = [500] * (count // 500) + ([count % 500] if count % 500 else [])
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(batch, sizes))


def latencies(url: str, key: str, run_ids: list[str]) -> list[float]:
    out = []
    deadline = time.monotonic() + 300
    with client(url, key) as http:
        for run_id in run_ids:
            while True:
                run = http.get(f"/v1/runs/{run_id}").json()
                if run["status"] in ENDED:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"run {run_id} did not end: {run['status']}")
                time.sleep(0.05)
            began = datetime.fromisoformat(run["created_at"])
            ended = datetime.fromisoformat(run["finished_at"])
            out.append((ended - began).total_seconds())
    return out


def p(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a-runs", type=int, default=20_000)
    parser.add_argument("--b-runs", type=int, default=100)
    parser.add_argument("--call-ms", type=int, default=200)
    args = parser.parse_args()
    sink = Sink()
    with tempfile.TemporaryDirectory() as tmp, Deployment(Path(tmp)) as deployment:
        key_a, key_b = deployment.key("alpha"), deployment.key("bravo")
        with client(deployment.url, key_a) as http:
            http.post("/v1/workflows", json=workflow("flood", f"{sink.url}/sleep/{args.call_ms}/a"))
        with client(deployment.url, key_b) as http:
            http.post("/v1/workflows", json=workflow("quick", f"{sink.url}/fast/b"))
        idle = latencies(deployment.url, key_b, trigger_b(deployment.url, key_b, args.b_runs))
        started = time.monotonic()
        flood_a(deployment.url, key_a, args.a_runs)
        flooded = time.monotonic() - started
        loaded = latencies(deployment.url, key_b, trigger_b(deployment.url, key_b, args.b_runs))
        done_a = sink.calls.get("a", 0)
    sink.close()
    print(
        f"A: {args.a_runs} runs of one {args.call_ms} ms call enqueued in {flooded:.1f} s;"
        f" {done_a} done when B's last run ended (A's backlog was still there:"
        f" {done_a < args.a_runs}); peak {sink.peak.get('a', 0)} of A's calls in flight"
    )
    print(
        f"B ({args.b_runs} runs): idle p50 {p(idle, 50) * 1000:.0f} ms, p99"
        f" {p(idle, 99) * 1000:.0f} ms; under A's flood p50 {p(loaded, 50) * 1000:.0f} ms,"
        f" p99 {p(loaded, 99) * 1000:.0f} ms"
    )
    print(
        f"ratio under flood / idle: p50 {p(loaded, 50) / p(idle, 50):.2f}x,"
        f" p99 {p(loaded, 99) / p(idle, 99):.2f}x (target: p99 within 3x)"
    )


if __name__ == "__main__":
    main()
