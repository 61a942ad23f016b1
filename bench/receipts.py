"""Receipt issuing: receipts per second through `ReceiptService.issue_in`, against
single-row commits on the same store, both measured in the same run.

Run: `uv run python bench/receipts.py [--count N] [--concurrent C] [--sqlite]`. On a
freshly migrated PostgreSQL database (on DUCTOR_TEST_DATABASE_URL) it measures, in
interleaved rounds:

- the baseline: one `INSERT` of one row per transaction, through the same store;
- receipts: one transaction per receipt that calls `issue_in` (build the receipt,
  canonical JSON, Ed25519 signature, one `INSERT` into `receipts`) and commits;
- the signature alone (`issue_receipt`, no I/O), to show what the crypto costs.

Printed: median rates and the ratio receipts / baseline, one caller and C callers.
`--sqlite` adds the same on SQLite.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from ductor_server.services.receipts import ReceiptService
from ductor_server.storage import Store, open_store
from ductor_settlement import (
    Cost,
    DecisionRef,
    KeyRing,
    Receipt,
    SigningKey,
    Subject,
    SubjectKind,
    issue_receipt,
)

TENANT = "bench"
NOW = datetime(2030, 1, 1, tzinfo=UTC)


async def single_rows(store: Store, worker: int, count: int) -> None:
    for n in range(count):
        async with store.transaction() as tx:
            await tx.session.execute(
                "INSERT INTO receipt_bench_rows (tenant_id, worker, n) VALUES (%s, %s, %s)",
                (TENANT, worker, n),
            )


async def receipts(
    service: ReceiptService, store: Store, tag: str, worker: int, count: int
) -> None:
    for n in range(count):
        async with store.transaction() as tx:
            await service.issue_in(
                tx,
                TENANT,
                Subject(kind=SubjectKind.ASSIGNMENT, id=f"{tag}-w{worker}-{n}"),
                cost=Cost(micros=12_500_000, currency="USD"),
                decision=DecisionRef(id=f"dec-{n}", explanation_hash="sha256:" + "e" * 64),
                configuration_hash="sha256:" + "c" * 64,
                ledger_entries=(f"ent-{n}",),
                now=NOW,
            )


def signatures_per_second(ring: KeyRing, count: int) -> float:
    receipt = Receipt(
        id="rct_bench",
        tenant_id=TENANT,
        subject=Subject(kind=SubjectKind.ASSIGNMENT, id="a"),
        issued_at=NOW,
        cost=Cost(micros=1, currency="USD"),
        ledger_entries=("ent-1",),
    )
    started = time.perf_counter()
    for _ in range(count):
        issue_receipt(receipt, ring)
    return count / (time.perf_counter() - started)


async def rate(job: Callable[[int, int], Awaitable[None]], count: int, concurrent: int) -> float:
    """Operations per second of `count` operations split over `concurrent` callers."""
    each = count // concurrent
    started = time.perf_counter()
    await asyncio.gather(*(job(worker, each) for worker in range(concurrent)))
    return each * concurrent / (time.perf_counter() - started)


async def bench_backend(name: str, target: str, count: int, concurrent: int, rounds: int) -> None:
    store = open_store(target)
    await store.open()
    try:
        await store.migrate()
        ring = KeyRing([SigningKey.generate("bench")], active="bench")
        service = ReceiptService(store, keys=ring)
        async with store.transaction() as tx:
            await tx.session.execute(
                "CREATE TABLE IF NOT EXISTS receipt_bench_rows"
                " (tenant_id text NOT NULL, worker integer NOT NULL, n integer NOT NULL)"
            )
        await single_rows(store, 999, 20)
        await receipts(service, store, "warm", 0, 20)
        for callers in sorted({1, concurrent}):
            base: list[float] = []
            issued: list[float] = []
            per_round = max(count // rounds, callers)
            for r in range(rounds):
                base.append(await rate(partial(single_rows, store), per_round, callers))
                job = partial(receipts, service, store, f"c{callers}r{r}")
                issued.append(await rate(job, per_round, callers))
            b, i = statistics.median(base), statistics.median(issued)
            print(
                f"{name:8} callers={callers:<3} single-row commits {b:7.0f}/s"
                f" | receipts issued {i:7.0f}/s = {i / b:.2f}x"
            )
        print(f"{name:8} signatures alone (no I/O) {signatures_per_second(ring, 2000):7.0f}/s")
    finally:
        await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--concurrent", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sqlite", action="store_true")
    args = parser.parse_args()
    try:
        from ductor_server.pytest_plugin import create_database, drop_database

        url = create_database()
    except Exception as exc:
        print(f"postgres skipped: {exc}")
    else:
        try:
            await bench_backend("postgres", url, args.count, args.concurrent, args.rounds)
        finally:
            drop_database(url)
    if args.sqlite:
        with tempfile.TemporaryDirectory() as folder:
            target = str(Path(folder) / "ductor.db")
            await bench_backend("sqlite", target, args.count, 1, args.rounds)


if __name__ == "__main__":
    asyncio.run(main())
