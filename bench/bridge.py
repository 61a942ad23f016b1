"""End-to-end time of a 20-step SDK workflow through the bridge, against the same
workflow as a DAG of 20 no-op ACTION steps, both measured in the same run.

The SDK app is served over real HTTP on 127.0.0.1 (uvicorn, in this process);
the engine runs every role on one SQLite store (or Postgres). Each step of the
bridge run is one execute call that replays the recorded steps and runs the
next one, so its cost grows with the history; the DAG run dispatches a task per
step. Printed: median seconds per run, one run at a time and `--concurrent`
runs at once, and the ratio bridge / DAG (the baseline).

    uv run python bench/bridge.py [--steps 20] [--runs 5] [--concurrent 10] [--postgres URL]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import uvicorn

from ductor import Client, Context
from ductor.asgi import BridgeApp
from ductor.protocol import BRIDGE_PATH, SigningKeys
from ductor_server.bridge.kind import install
from ductor_server.bridge.registry import sync_app
from ductor_server.composition import build_services
from ductor_server.engine.actions import default_registry
from ductor_server.engine.runtime import Runtime, RuntimeConfig
from ductor_server.services import Services
from ductor_server.storage import Store, open_store

TENANT = "bench"
KEY = "signkey-bench"


def dag(steps: int) -> dict[str, Any]:
    return {
        "family_slug": "bench-chain",
        "steps": [
            {"ref": f"s{i}", "type": "STEP_TYPE_ACTION", "args": {"action": "noop"}}
            for i in range(steps)
        ],
        "edges": [{"source_ref": f"s{i}", "target_ref": f"s{i + 1}"} for i in range(steps - 1)],
    }


def sdk_app(steps: int) -> Client:
    client = Client("bench", signing_key=KEY)

    @client.workflow("chain")
    async def chain(ctx: Context, _: None) -> int:
        total = 0
        for i in range(steps):
            total += await ctx.step.run(f"s{i}", lambda i=i: i)
        return total

    return client


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def timed_runs(
    services: Services, slug: str, runs: int, concurrent: int
) -> tuple[float, float]:
    """(median seconds of `runs` runs one at a time, seconds for `concurrent` runs at once)."""

    async def one() -> float:
        started = time.perf_counter()
        run = (await services.runs.trigger(TENANT, slug, None, None, None)).value
        while True:
            view = await services.runs.get(TENANT, run.id)
            if view.status.terminal:
                assert view.status.value == "RUN_STATUS_SUCCEEDED", view.error
                return time.perf_counter() - started
            await asyncio.sleep(0.002)

    await one()  # warm up
    sequential = statistics.median([await one() for _ in range(runs)])
    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(concurrent)))
    return sequential, time.perf_counter() - started


async def bench(store: Store, steps: int, runs: int, concurrent: int) -> None:
    await store.migrate()
    async with store.transaction() as tx:
        await tx.ensure_tenant(TENANT, name="bench", now=datetime.now(UTC))
    client = sdk_app(steps)
    port = free_port()
    url = f"http://127.0.0.1:{port}{BRIDGE_PATH}"
    server = uvicorn.Server(
        uvicorn.Config(BridgeApp(client), host="127.0.0.1", port=port, log_level="error")
    )
    serving = asyncio.create_task(server.serve())
    for _ in range(1000):  # up to 10 s for uvicorn to bind
        if server.started:
            break
        await asyncio.sleep(0.01)
    config = RuntimeConfig(poll_interval=0.05, coordinator_batch=128, worker_batch=128)
    actions = default_registry()
    try:
        async with Runtime.start(
            store,
            config=config,
            actions=actions,
            setup=lambda runtime: install(runtime, keys=SigningKeys(KEY)),
        ) as runtime:
            async with store.transaction() as tx:
                await sync_app(tx, TENANT, client.describe(url), url=url, now=datetime.now(UTC))
            await build_services(runtime).workflows.publish(TENANT, dag(steps))
            dag_seq, dag_conc = await timed_runs(
                build_services(runtime), "bench-chain", runs, concurrent
            )
            br_seq, br_conc = await timed_runs(
                build_services(runtime), "bridge:bench:chain", runs, concurrent
            )
    finally:
        server.should_exit = True
        await serving
    print(f"backend {store.backend}, {steps} steps per run")
    print(f"  one run at a time (median of {runs}):")
    print(f"    DAG of ACTION steps (baseline): {dag_seq * 1000:8.1f} ms/run")
    print(f"    SDK workflow via the bridge:    {br_seq * 1000:8.1f} ms/run")
    print(f"    ratio bridge / DAG:             {br_seq / dag_seq:8.2f}x")
    print(f"  {concurrent} runs at once:")
    print(f"    DAG of ACTION steps (baseline): {dag_conc * 1000:8.1f} ms")
    print(f"    SDK workflow via the bridge:    {br_conc * 1000:8.1f} ms")
    print(f"    ratio bridge / DAG:             {br_conc / dag_conc:8.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--concurrent", type=int, default=10)
    parser.add_argument("--postgres", default=None, help="a postgresql:// URL (default SQLite)")
    args = parser.parse_args()

    async def go() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            store = open_store(args.postgres or str(Path(tmp) / "bench.db"))
            await store.open()
            try:
                await bench(store, args.steps, args.runs, args.concurrent)
            finally:
                await store.close()

    asyncio.run(go())


if __name__ == "__main__":
    main()
