"""Fairness, end to end: a tenant flooding the queue with slow work does not slow
another tenant down, and one tenant's slow calls never hold the slots another
tenant needs (the headroom).

A real `ductor serve` on Postgres with Redis wake-ups, and a real HTTP service
that the steps call. Tenant B's 100 one-step runs are measured twice in the same
test: on the idle server, then while tenant A has 2,000 runs of five slow steps
(0.2 s each: 2,000 slot-seconds, far more than the 64 worker slots get through
while B runs) queued and running. B's trigger-to-end latency under A's
flood stays close to its idle latency (p99 within 3x, the target).
(The target is 20,000 runs of A; 2,000 keep this test under a minute and
already hold every slot for the whole of B's runs: the queue, not the size of
the backlog, decides who goes next.)
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx
import pytest

from ductor_server.testing import LoopbackHTTPServer

from .conftest import ServerProcess, _create_key

# Timing, load and kills: these run alone, after the parallel part of the suite.
pytestmark = pytest.mark.serial

A_RUNS = 2_000
A_STEPS = 5
SLOW_SECONDS = 0.2
B_RUNS = 100
TRIGGER_THREADS = 8
ENDED = {"RUN_STATUS_SUCCEEDED", "RUN_STATUS_FAILED", "RUN_STATUS_CANCELLED"}


class TimingSink:
    """An HTTP service that answers `/slow/<label>` after `SLOW_SECONDS`,
    `/sleep/<ms>/<label>` after that many milliseconds, and anything else at
    once, remembering when each call to each label (the path's last part)
    began and ended."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, float, float]] = []  # (tenant, began, ended)
        self.began: list[tuple[str, float]] = []  # (tenant, began), as calls come in
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                began = time.monotonic()
                with sink.lock:
                    sink.began.append((self.path.rsplit("/", 1)[-1], began))
                length = int(self.headers.get("content-length") or 0)
                if length:
                    self.rfile.read(length)
                if self.path.startswith("/slow"):
                    time.sleep(SLOW_SECONDS)
                elif self.path.startswith("/sleep/"):
                    time.sleep(int(self.path.split("/")[2]) / 1000)
                # A call ends before its answer goes out: the caller can start
                # its next call only once it has the answer, so a call that the
                # end of this one let start can never seem to overlap it (as it
                # could if this thread were slow to note the time after writing).
                with sink.lock:
                    sink.calls.append((self.path.rsplit("/", 1)[-1], began, time.monotonic()))
                body = b"{}"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = LoopbackHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def last_began(self, tenant: str) -> float:
        with self.lock:
            return max(began for t, began, _ in self.calls if t == tenant)

    def started(self, label: str) -> int:
        """How many calls to `label` have come in (ended or not)."""
        with self.lock:
            return sum(1 for t, _ in self.began if t == label)

    def calls_of(self, label: str) -> list[tuple[float, float]]:
        """(began, ended) of each call to `label`, in the order they ended."""
        with self.lock:
            return [(b, e) for t, b, e in self.calls if t == label]

    def peak_in_flight(self, tenant: str) -> int:
        with self.lock:
            edges = sorted(
                [(b, 1) for t, b, _ in self.calls if t == tenant]
                + [(e, -1) for t, _, e in self.calls if t == tenant]
            )
        peak = current = 0
        for _, step in edges:
            current += step
            peak = max(peak, current)
        return peak


@pytest.fixture
def sink() -> Iterator[TimingSink]:
    server = TimingSink()
    try:
        yield server
    finally:
        server.close()


def _workflow(slug: str, url: str, steps: int) -> dict[str, Any]:
    refs = [f"s{i}" for i in range(steps)]
    return {
        "family_slug": slug,
        "title": slug,
        "steps": [
            {
                "ref": ref,
                "type": "STEP_TYPE_ACTION",
                "title": ref,
                "args": {
                    "action": "http",
                    "params": {"url": json.dumps(url), "method": '"POST"'},
                },
            }
            for ref in refs
        ],
        "edges": [
            {"source_ref": a, "target_ref": b, "type": "EDGE_TYPE_SUCCESS"}
            for a, b in itertools.pairwise(refs)
        ],
    }


def _trigger_many(server: ServerProcess, key: str, slug: str, count: int) -> list[str]:
    """Trigger `count` runs from `TRIGGER_THREADS` clients; return their ids."""

    def trigger(n: int) -> list[str]:
        ids = []
        with server.client(key) as http:
            for _ in range(n):
                response = http.post("/v1/runs", json={"family_slug": slug, "input": {}})
                assert response.status_code == 201, response.text
                ids.append(response.json()["id"])
        return ids

    share = [
        count // TRIGGER_THREADS + (i < count % TRIGGER_THREADS) for i in range(TRIGGER_THREADS)
    ]
    with ThreadPoolExecutor(TRIGGER_THREADS) as pool:
        return [run_id for ids in pool.map(trigger, share) for run_id in ids]


def _latencies(server: ServerProcess, key: str, run_ids: list[str], timeout: float) -> list[float]:
    """Each run's trigger-to-end time (server clock), once all have ended."""
    deadline = time.monotonic() + timeout
    out: list[float] = []
    with server.client(key) as http:
        for run_id in run_ids:
            while True:
                run = http.get(f"/v1/runs/{run_id}").json()
                if run["status"] in ENDED:
                    break
                assert time.monotonic() < deadline, f"run {run_id} did not end: {run}"
                time.sleep(0.05)
            assert run["status"] == "RUN_STATUS_SUCCEEDED", run
            began = datetime.fromisoformat(run["created_at"])
            ended = datetime.fromisoformat(run["finished_at"])
            out.append((ended - began).total_seconds())
    return out


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def _two_tenants(
    server: ServerProcess, postgres_url: str, workflow_a: dict[str, Any], sink: TimingSink
) -> tuple[str, str]:
    """Start `server` on Redis; tenant A publishes `workflow_a` and tenant B the quick
    one-step workflow. Returns A's and B's API keys."""
    server.start()
    key_a = server.api_key
    key_b = asyncio.run(_create_key(postgres_url, "bravo"))
    with server.client(key_a) as http:
        assert http.post("/v1/workflows", json=workflow_a).status_code in (200, 201)
    with server.client(key_b) as http:
        wf = _workflow("quick", f"{sink.url}/fast/b", 1)
        assert http.post("/v1/workflows", json=wf).status_code in (200, 201)
    return key_a, key_b


def _fair_env(redis_url: str, redis_prefix: str) -> dict[str, str]:
    """A server on the Redis fair queue, woken by Redis only, with leases that outlast
    the slow calls."""
    return {
        "DUCTOR_POLL_INTERVAL": "",
        "DUCTOR_REDIS_URL": redis_url,
        "DUCTOR_REDIS_PREFIX": redis_prefix,
        "DUCTOR_LEASE_SECONDS": "60",
        "DUCTOR_WORKER_CONCURRENCY": str(SLOTS),
    }


def test_a_flooding_tenant_does_not_slow_another_down(
    make_server: Callable[..., ServerProcess],
    postgres_url: str,
    redis_url: str,
    redis_prefix: str,
    sink: TimingSink,
) -> None:
    server = make_server("fair", database_url=postgres_url, env=_fair_env(redis_url, redis_prefix))
    flood = _workflow("flood", f"{sink.url}/slow/a", A_STEPS)
    key_a, key_b = _two_tenants(server, postgres_url, flood, sink)

    idle = _latencies(server, key_b, _trigger_many(server, key_b, "quick", B_RUNS), 60)

    flood_started = time.monotonic()
    _trigger_many(server, key_a, "flood", A_RUNS)
    flooded = time.monotonic() - flood_started
    loaded = _latencies(server, key_b, _trigger_many(server, key_b, "quick", B_RUNS), 60)
    b_done = time.monotonic()

    # A still had work queued after B's last run ended: B ran against the flood.
    deadline = time.monotonic() + 5
    while sink.last_began("a") <= b_done:
        assert time.monotonic() < deadline, "tenant A's backlog ran dry before B was done"
        time.sleep(0.1)
    idle_p99, loaded_p99 = _p99(idle), _p99(loaded)
    print(
        f"\nB p50/p99 idle {statistics.median(idle) * 1000:.0f}/{idle_p99 * 1000:.0f} ms,"
        f" under A's flood {statistics.median(loaded) * 1000:.0f}/{loaded_p99 * 1000:.0f} ms"
        f" ({loaded_p99 / idle_p99:.2f}x); A: {A_RUNS} runs triggered in {flooded:.1f}s,"
        f" peak {sink.peak_in_flight('a')} calls in flight"
    )
    # The target is p99 within 3x (of the idle p99, or of twice the idle p50 when
    # one slow idle run makes the idle p99 noise). Measured on a 2-core machine
    # with the sink's backlog fixed: p99 0.7-1.5x, p50 1.1-1.7x. Without fair
    # scheduling B queues behind A's whole backlog (2,000 runs x 5 steps x 0.2 s
    # over 64 slots: about 30 s), a hundred times over.
    # The p50 bound is looser than the target's 3x: B's triggers share the two
    # cores with A's 2,000 (sent by 8 clients while B's run), so B's median also
    # pays for CPU the queue does not schedule (seen once at 3.1x in a full CI run,
    # p99 2.0x). Without fair scheduling both would be about a hundred times over.
    idle_p50, loaded_p50 = statistics.median(idle), statistics.median(loaded)
    assert loaded_p50 <= 4 * idle_p50
    assert loaded_p99 <= 3 * max(idle_p99, 2 * idle_p50)
    assert httpx.get(f"{server.url}/readyz").status_code == 200


STUCK_MS = 5_000
STUCK_RUNS = 80
SLOTS = 64  # the server's worker slots (`DUCTOR_WORKER_CONCURRENCY`, see `_fair_env`)
HEADROOM = 8  # an eighth of them, which no one tenant may take


def test_one_tenants_slow_tasks_never_hold_the_slots_another_tenant_needs(
    make_server: Callable[..., ServerProcess],
    postgres_url: str,
    redis_url: str,
    redis_prefix: str,
    sink: TimingSink,
) -> None:
    # Tenant A's 80 calls take 5 s each: more than the 64 slots. Without the
    # headroom they would fill every slot, and B's runs would wait 5 s for the
    # first of them to end; with it, B's calls start while all of A's first
    # wave is still in flight, and A never holds more than 56 slots.
    server = make_server("stuck", database_url=postgres_url, env=_fair_env(redis_url, redis_prefix))
    stuck = _workflow("stuck", f"{sink.url}/sleep/{STUCK_MS}/a", 1)
    key_a, key_b = _two_tenants(server, postgres_url, stuck, sink)
    _trigger_many(server, key_a, "stuck", STUCK_RUNS)
    deadline = time.monotonic() + 60
    while sink.started("a") < SLOTS - HEADROOM:
        assert time.monotonic() < deadline, f"only {sink.started('a')} of A's calls began"
        time.sleep(0.05)
    assert not sink.calls_of("a"), "A's first calls ended before B could be measured"
    quick = _trigger_many(server, key_b, "quick", 10)
    _latencies(server, key_b, quick, 60)
    first_a_end = min(ended for _, ended in sink.calls_of("a") or [(0.0, float("inf"))])
    b_calls = sink.calls_of("b")
    assert len(b_calls) == 10
    assert max(began for began, _ in b_calls) < first_a_end, "B waited for A's slow slots"
    deadline = time.monotonic() + 60
    while len(sink.calls_of("a")) < SLOTS - HEADROOM:
        assert time.monotonic() < deadline, "A's first wave never ended"
        time.sleep(0.1)
    assert sink.peak_in_flight("a") <= SLOTS - HEADROOM
