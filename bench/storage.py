"""Storage throughput: attempts recorded per second, batched vs one per transaction.

Run: `uv run python bench/storage.py [--count N] [--batch B]`. Prints, for each
backend (SQLite in a temp dir; PostgreSQL in a fresh database on
DUCTOR_TEST_DATABASE_URL, skipped if unreachable), the rate of one attempt
per transaction (the baseline) and of B attempts per transaction, as a ratio.
A second pair measures a worker's full commit (attempt + inbox item + task done).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ductor_core.runs import AttemptResult
from ductor_server.storage import (
    AttemptRecord,
    NewInboxItem,
    NewTask,
    Store,
    TaskRef,
    open_store,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def attempt(run: str, n: int) -> AttemptRecord:
    return AttemptRecord(
        tenant_id="bench",
        run_id=run,
        step_ref="step",
        attempt=n,
        ok=True,
        output={"n": n, "payload": "x" * 64},
        started_at=NOW,
        finished_at=NOW,
    )


async def record_attempts(store: Store, run: str, count: int, batch: int) -> None:
    for start in range(0, count, batch):
        async with store.transaction() as tx:
            await tx.record_attempts([attempt(run, n) for n in range(start, start + batch)])


async def worker_commits(store: Store, run: str, count: int, batch: int) -> None:
    async with store.transaction() as tx:
        await tx.enqueue_tasks(
            [
                NewTask(
                    tenant_id="bench",
                    run_id=run,
                    step_ref="step",
                    attempt=n,
                    step_type="STEP_TYPE_ACTION",
                    handler="action:noop",
                    idempotency_key=f"{run}:step:-1:{n}",
                    available_at=NOW,
                )
                for n in range(count)
            ]
        )
    while True:
        async with store.transaction() as tx:
            tasks = await tx.lease_tasks(
                owner="bench", limit=batch, lease_for=timedelta(minutes=5), now=NOW
            )
        if not tasks:
            return
        async with store.transaction() as tx:
            new = await tx.record_attempts([attempt(run, t.attempt) for t in tasks])
            await tx.enqueue_inbox(
                [
                    NewInboxItem(
                        tenant_id="bench",
                        run_id=run,
                        input=AttemptResult(step_ref="step", attempt=t.attempt, ok=True),
                        available_at=NOW,
                    )
                    for t, fresh in zip(tasks, new, strict=True)
                    if fresh
                ]
            )
            await tx.complete_tasks([TaskRef(tenant_id=t.tenant_id, task_id=t.id) for t in tasks])


async def rate(
    store: Store,
    work: Callable[[Store, str, int, int], Awaitable[None]],
    run: str,
    count: int,
    batch: int,
) -> float:
    started = time.perf_counter()
    await work(store, run, count, batch)
    return count / (time.perf_counter() - started)


async def bench_backend(label: str, target: str, count: int, batch: int) -> None:
    store = open_store(target)
    await store.open()
    await store.migrate()
    try:
        await record_attempts(store, "warmup", 50, 10)
        for name, work in (("attempts", record_attempts), ("worker commit", worker_commits)):
            single = await rate(store, work, f"{name}-single", count, 1)
            batched = await rate(store, work, f"{name}-batched", count, batch)
            print(
                f"{label:8} {name:14} 1/tx: {single:9.0f}/s   {batch}/tx: {batched:9.0f}/s"
                f"   ratio batched/single: {batched / single:6.1f}x"
            )
    finally:
        await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000, help="attempts per measurement")
    parser.add_argument("--batch", type=int, default=100, help="attempts per transaction")
    args = parser.parse_args()
    print(f"{args.count} attempts per measurement; baseline = one per transaction")
    with tempfile.TemporaryDirectory() as tmp:
        await bench_backend("sqlite", str(Path(tmp) / "bench.db"), args.count, args.batch)
    try:
        from ductor_server.pytest_plugin import create_database, drop_database

        url = create_database()
    except Exception as exc:  # any connection problem: report and skip Postgres
        print(f"postgres skipped: {exc}")
        return
    try:
        await bench_backend("postgres", url, args.count, args.batch)
    finally:
        drop_database(url)


if __name__ == "__main__":
    asyncio.run(main())
