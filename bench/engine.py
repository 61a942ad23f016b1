"""Steps per second through the whole engine (services, coordinator, workers).

A 20-step ACTION chain with a no-op action runs on SQLite and on Postgres; the
baseline, measured in the same run on the same store, is one small committed
transaction after another (store commits per second). The ratio says how many
workflow steps the engine completes per single-commit round trip: batching
should keep it well above 1.

    uv run python bench/engine.py [--runs 50] [--steps 20] [--backend sqlite|postgres|both]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from ductor_server.composition import build_services
from ductor_server.engine.actions import default_registry
from ductor_server.engine.runtime import Runtime, RuntimeConfig
from ductor_server.storage import NewHistoryEntry, Store, open_store

TENANT = "bench"


def chain(steps: int) -> dict[str, object]:
    return {
        "family_slug": "bench-chain",
        "steps": [
            {"ref": f"s{i}", "type": "STEP_TYPE_ACTION", "args": {"action": "noop"}}
            for i in range(steps)
        ],
        "edges": [{"source_ref": f"s{i}", "target_ref": f"s{i + 1}"} for i in range(steps - 1)],
    }


async def baseline_commits_per_second(store: Store, seconds: float = 2.0) -> float:
    """Sequential one-row transactions: the cost of one commit round trip."""
    now = datetime.now(UTC)
    done = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        async with store.transaction() as tx:
            await tx.append_history(
                [NewHistoryEntry(tenant_id=TENANT, run_id="baseline", at=now, kind="bench")]
            )
        done += 1
    return done / (time.perf_counter() - started)


async def engine_steps_per_second(store: Store, runs: int, steps: int) -> tuple[float, float]:
    """Run `runs` chains of `steps` no-op actions concurrently; (steps/s, seconds)."""
    config = RuntimeConfig(poll_interval=0.05, coordinator_batch=128, worker_batch=128)
    async with Runtime.start(store, config=config, actions=default_registry()) as runtime:
        services = build_services(runtime)
        await services.workflows.publish(TENANT, chain(steps))
        started = time.perf_counter()
        ids = [
            (await services.runs.trigger(TENANT, "bench-chain", None, {"i": i}, None)).value.id
            for i in range(runs)
        ]
        pending = set(ids)
        while pending:
            # Polling reads (and decodes) whole runs: keep it rare so that it
            # does not compete with the engine it measures.
            await asyncio.sleep(0.25)
            page = await services.runs.page(TENANT, status="running", limit=500)
            still = {r.id for r in page.items}
            for run_id in pending - still:
                view = await services.runs.get(TENANT, run_id)
                if view.status.value != "RUN_STATUS_SUCCEEDED":
                    raise SystemExit(f"run {run_id} ended {view.status.value}: {view.error}")
            pending &= still
        elapsed = time.perf_counter() - started
        c, w = runtime.coordinator, runtime.workers
        print(
            f"          (coordinator: {c.ticks} ticks in {c.batches} batches; workers: "
            f"{w.lease_batches} lease batches, {w.report_batches} report batches)"
        )
    return runs * steps / elapsed, elapsed


async def measure(name: str, target: str | Path, runs: int, steps: int) -> None:
    store = open_store(target)
    await store.open()
    try:
        await store.migrate()
        async with store.transaction() as tx:
            await tx.ensure_tenant(TENANT, name="bench", now=datetime.now(UTC))
        commits = await baseline_commits_per_second(store)
        steps_per_s, elapsed = await engine_steps_per_second(store, runs, steps)
    finally:
        await store.close()
    print(
        f"{name:9s} baseline {commits:8.0f} commits/s | engine {steps_per_s:8.0f} steps/s "
        f"({runs} runs x {steps} steps in {elapsed:.2f}s) | ratio {steps_per_s / commits:.2f} "
        "steps per commit-time"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    args = parser.parse_args()
    if args.backend in ("sqlite", "both"):
        with tempfile.TemporaryDirectory() as tmp:
            asyncio.run(measure("sqlite", Path(tmp) / "bench.db", args.runs, args.steps))
    if args.backend in ("postgres", "both"):
        from ductor_server.pytest_plugin import admin_database_url, create_database, drop_database

        admin = os.environ.get("DUCTOR_BENCH_DATABASE_URL", admin_database_url())
        try:
            url = create_database(admin)
        except Exception as exc:  # no server: say so and go on
            print(f"postgres  skipped: {exc}")
            return
        try:
            asyncio.run(measure("postgres", url, args.runs, args.steps))
        finally:
            drop_database(url, admin)


if __name__ == "__main__":
    main()
