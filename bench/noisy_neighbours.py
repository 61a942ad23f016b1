"""What one hostile tenant's large requests cost another tenant, in a real server.

`ductor serve --migrate` on a fresh PostgreSQL database. Tenant B runs 3-step
no-op chains one after another (`POST /v1/runs`, then its long poll); tenant A,
meanwhile, sends one of these loads, each within the documented limits:

- `scatter`: one run of a SCATTER of 10,000 no-op actions (the most a SCATTER
  runs), all at once (`max_concurrency` 10,000);
- `signals`: 200 signals of 500 kB to one run whose signal step has not started
  (one is kept for it, the others are ignored);
- `event`: one event of 1 MB to 300 runs waiting for it.

For each load: B's p50 and p99 while it goes on (B runs until it ends, at least
`--b-runs` times), against B's p50 on the idle server measured just before (the
ratio is the figure), how long A's load took,
and the server's resident memory at its peak (sampled every 50 ms) against idle.

    uv run python bench/noisy_neighbours.py [--load scatter|signals|event|all] [--b-runs 30]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from engine import publish
from routing_server import Server, percentile

from ductor_server.cli_server import create_key
from ductor_server.storage import open_store

SCATTER_ITEMS = 10_000
SIGNALS, SIGNAL_BYTES = 200, 500_000
WAITING_RUNS, EVENT_BYTES = 300, 1_000_000


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def mint(url: str, tenant: str) -> str:
    async def go() -> str:
        store = open_store(url)
        await store.open()
        try:
            return await create_key(store, tenant, name="bench")
        finally:
            await store.close()

    return asyncio.run(go())


async def b_latencies(b: httpx.AsyncClient, runs: int) -> list[float]:
    """B's chains one after another: trigger sent -> seen ended, in ms."""
    out = []
    for i in range(runs):
        started = time.perf_counter()
        answer = await b.post("/v1/runs", json={"family_slug": "bench-chain", "input": {"i": i}})
        run_id = answer.json()["id"]
        ended = await b.get(f"/v1/runs/{run_id}", params={"wait": 60})
        if ended.json()["status"] != "RUN_STATUS_SUCCEEDED":
            raise SystemExit(f"B's run did not succeed: {ended.text[:300]}")
        out.append((time.perf_counter() - started) * 1000)
    return out


async def _publish(a: httpx.AsyncClient, definition: dict[str, Any]) -> None:
    answer = await a.post("/v1/workflows", json=definition)
    if answer.status_code not in (200, 201):
        raise SystemExit(f"publish refused: {answer.text[:300]}")


async def _wait_ended(a: httpx.AsyncClient, run_id: str) -> None:
    while True:
        answer = await a.get(f"/v1/runs/{run_id}", params={"wait": 60})
        if answer.json()["status"] != "RUN_STATUS_RUNNING":
            return


async def scatter(a: httpx.AsyncClient) -> None:
    step = {"type": "STEP_TYPE_ACTION", "args": {"action": "noop"}}
    args = {"items": "input.xs", "max_concurrency": SCATTER_ITEMS, "step": step}
    await _publish(
        a,
        {
            "family_slug": "fan",
            "steps": [{"ref": "each", "type": "STEP_TYPE_SCATTER", "args": args}],
        },
    )
    answer = await a.post(
        "/v1/runs", json={"family_slug": "fan", "input": {"xs": list(range(SCATTER_ITEMS))}}
    )
    await _wait_ended(a, answer.json()["id"])


async def signals(a: httpx.AsyncClient) -> None:
    steps = [
        {"ref": "w", "type": "STEP_TYPE_WAIT_FOR_EVENT", "args": {"event": "x", "timeout": "1h"}},
        {"ref": "s", "type": "STEP_TYPE_WAIT_FOR_SIGNAL", "args": {"signal": "go"}},
    ]
    edges = [{"source_ref": "w", "target_ref": "s"}]
    await _publish(a, {"family_slug": "sig", "steps": steps, "edges": edges})
    run_id = (await a.post("/v1/runs", json={"family_slug": "sig"})).json()["id"]
    payload = {"b": "y" * SIGNAL_BYTES}
    left = list(range(SIGNALS))

    async def sender() -> None:
        while left:
            left.pop()
            await a.post(f"/v1/runs/{run_id}/signals/go", json={"payload": payload})

    await asyncio.gather(*(sender() for _ in range(8)))
    await a.post(f"/v1/runs/{run_id}/cancel")


async def event(a: httpx.AsyncClient) -> None:
    step = {"ref": "w", "type": "STEP_TYPE_WAIT_FOR_EVENT", "args": {"event": "e", "timeout": "1h"}}
    await _publish(a, {"family_slug": "ev", "steps": [step]})
    ids = []
    for start in range(0, WAITING_RUNS, 500):
        count = min(500, WAITING_RUNS - start)
        batch = {"runs": [{"family_slug": "ev"} for _ in range(count)]}
        ids += [r["id"] for r in (await a.post("/v1/runs/batch", json=batch)).json()["runs"]]
    await asyncio.sleep(2)  # every run waits
    await a.post("/v1/events", json={"name": "e", "data": {"b": "y" * EVENT_BYTES}})
    for run_id in ids:
        await _wait_ended(a, run_id)


LOADS: dict[str, Callable[[httpx.AsyncClient], Awaitable[None]]] = {
    "scatter": scatter,
    "signals": signals,
    "event": event,
}


async def measure(server: Server, name: str, b_runs: int, key_a: str, key_b: str) -> None:
    assert server.proc is not None
    pid = server.proc.pid
    timeout = httpx.Timeout(600)
    async with (
        httpx.AsyncClient(
            base_url=server.url, headers={"Authorization": f"Bearer {key_a}"}, timeout=timeout
        ) as a,
        httpx.AsyncClient(
            base_url=server.url, headers={"Authorization": f"Bearer {key_b}"}, timeout=timeout
        ) as b,
    ):
        await b_latencies(b, 10)  # warm
        idle = await b_latencies(b, b_runs)
        idle_rss = rss_mb(pid)
        peak = [idle_rss]

        async def watch() -> None:
            while True:
                peak[0] = max(peak[0], rss_mb(pid))
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch())
        started = time.perf_counter()
        load = asyncio.create_task(LOADS[name](a))
        await asyncio.sleep(0.2)
        loaded: list[float] = []
        while not load.done() or len(loaded) < b_runs:  # B's runs all through A's load
            loaded += await b_latencies(b, 1)
        await load
        took = time.perf_counter() - started
        watcher.cancel()
    idle_p50 = percentile(idle, 0.5)
    p50, p99 = percentile(loaded, 0.5), percentile(loaded, 0.99)
    print(
        f"{name}: A's load took {took:.1f} s; B idle p50 {idle_p50:.1f} ms, under the load"
        f" p50 {p50:.1f} ms ({p50 / idle_p50:.1f}x), p99 {p99:.1f} ms ({p99 / idle_p50:.1f}x);"
        f" server memory {idle_rss:.0f} MB idle, {peak[0]:.0f} MB at its peak"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", choices=[*LOADS, "all"], default="all")
    parser.add_argument("--b-runs", type=int, default=30)
    args = parser.parse_args()
    for name in LOADS if args.load == "all" else [args.load]:
        with tempfile.TemporaryDirectory() as tmp, Server("postgres", Path(tmp)) as server:
            assert server.database_url is not None
            key_a = mint(server.database_url, "bench-a")
            key_b = mint(server.database_url, "bench-b")
            publish(server, key_b, 3)
            asyncio.run(measure(server, name, args.b_runs, key_a, key_b))


if __name__ == "__main__":
    main()
