"""Ledger throughput: balanced entries per second through the ledger service, against
single-row commits on the same store, both measured in the same run.

Run: `uv run python bench/ledger.py [--count N] [--concurrent C] [--sqlite]`. On a
freshly migrated PostgreSQL database (on DUCTOR_TEST_DATABASE_URL) it measures:

- the baseline: one `INSERT` of one row per transaction, through the same store;
- the ledger: one `LedgerService.post_entry` per entry, each with an idempotency
  key: claim the key, lock both accounts, load live holds, check the entry with
  `ductor_settlement.Ledger` (balance, currency, floor), write the entry, its two
  postings and both balances, remember the answer, commit (the deferred balance
  triggers run here);

- the ledger batched: `LedgerService.post_entries` with B entries (`--batch`,
  default 100) per call and transaction, the batch keyed: the same checks, one
  lock of the accounts, one write per entry, one commit;

each one at a time, then with C concurrent callers (each caller on its own pair
of accounts, so they do not queue on one row lock), in interleaved rounds.
Printed: median rates (entries per second) and the ratio ledger / baseline, with
and without an idempotency key (the key's claim and remembered answer are two
more statements of the storage's idempotency table), and batched. `--sqlite`
adds the same on SQLite.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

from ductor_server.services.ledger import (
    AccountBody,
    BatchEntryBody,
    EntryBatchBody,
    EntryBody,
    LedgerService,
)
from ductor_server.storage import Store, open_store
from ductor_settlement import AccountKind, Posting

TENANT = "bench"
USD = 1_000_000


async def single_rows(store: Store, worker: int, count: int) -> None:
    for n in range(count):
        async with store.transaction() as tx:
            await tx.session.execute(
                "INSERT INTO ledger_bench_rows (tenant_id, worker, n) VALUES (%s, %s, %s)",
                (TENANT, worker, n),
            )


async def entries(
    ledger: LedgerService, tag: str, worker: int, count: int, *, keyed: bool = True
) -> None:
    for n in range(count):
        await ledger.post_entry(
            TENANT,
            EntryBody(
                postings=(
                    Posting(account=f"wallet-{worker}", amount=1_000, currency="USD"),
                    Posting(account=f"revenue-{worker}", amount=-1_000, currency="USD"),
                ),
                description="charge",
            ),
            idempotency_key=f"{tag}-w{worker}-e{n}" if keyed else None,
        )


async def batches(ledger: LedgerService, tag: str, size: int, worker: int, count: int) -> None:
    for n in range(0, count, size):
        charge = BatchEntryBody(
            postings=(
                Posting(account=f"wallet-{worker}", amount=1_000, currency="USD"),
                Posting(account=f"revenue-{worker}", amount=-1_000, currency="USD"),
            ),
            description="charge",
        )
        await ledger.post_entries(
            TENANT,
            EntryBatchBody(entries=(charge,) * min(size, count - n)),
            idempotency_key=f"{tag}-w{worker}-b{n}",
        )


async def setup(store: Store, ledger: LedgerService, workers: int, count: int) -> None:
    async with store.transaction() as tx:
        await tx.session.execute(
            "CREATE TABLE IF NOT EXISTS ledger_bench_rows"
            " (tenant_id text NOT NULL, worker integer NOT NULL, n integer NOT NULL)"
        )
    for worker in range(workers):
        for code, kind, floor in (
            (f"cash-{worker}", AccountKind.ASSET, None),
            (f"wallet-{worker}", AccountKind.LIABILITY, 0),
            (f"revenue-{worker}", AccountKind.REVENUE, None),
        ):
            await ledger.open_account(
                TENANT, AccountBody(code=code, currency="USD", kind=kind, floor=floor)
            )
        await ledger.post_entry(
            TENANT,
            EntryBody(
                postings=(
                    Posting(account=f"cash-{worker}", amount=1_000 * USD, currency="USD"),
                    Posting(account=f"wallet-{worker}", amount=-1_000 * USD, currency="USD"),
                )
            ),
            idempotency_key=f"top-up-{worker}",
        )


async def rate(job: Callable[[int, int], Awaitable[None]], count: int, concurrent: int) -> float:
    """Operations per second of `count` operations split over `concurrent` callers."""
    each = count // concurrent
    started = time.perf_counter()
    await asyncio.gather(*(job(worker, each) for worker in range(concurrent)))
    return each * concurrent / (time.perf_counter() - started)


async def bench_backend(
    name: str, target: str, count: int, concurrent: int, rounds: int, batch: int
) -> None:
    store = open_store(target)
    await store.open()
    try:
        await store.migrate()
        ledger = LedgerService(store)
        await setup(store, ledger, max(concurrent, 1), count)
        # Warm the pool and the plans before timing.
        await single_rows(store, 999, 20)
        await entries(ledger, "warm", 0, 20)
        for callers in sorted({1, concurrent}):
            # Interleaved rounds, so a machine busy with something else slows both alike.
            base: list[float] = []
            keyed: list[float] = []
            bare: list[float] = []
            batched: list[float] = []
            per_round = max(count // rounds, callers)
            for r in range(rounds):
                base.append(await rate(partial(single_rows, store), per_round, callers))
                tag = f"c{callers}r{r}"
                keyed.append(await rate(partial(entries, ledger, tag), per_round, callers))
                bare.append(
                    await rate(partial(entries, ledger, tag, keyed=False), per_round, callers)
                )
                batched.append(
                    await rate(partial(batches, ledger, tag, batch), per_round * 5, callers)
                )
            b, k, n, m = (statistics.median(x) for x in (base, keyed, bare, batched))
            print(
                f"{name:8} callers={callers:<3} single-row commits {b:7.0f}/s"
                f" | entries with Idempotency-Key {k:7.0f}/s = {k / b:.2f}x"
                f" | entries without {n:7.0f}/s = {n / b:.2f}x"
                f" | batched by {batch} {m:7.0f}/s = {m / b:.2f}x"
            )
        async with store.transaction() as tx:
            row = await tx.session.fetch_one(
                "SELECT COUNT(*), SUM(balance) FROM ledger_accounts WHERE tenant_id = %s",
                (TENANT,),
            )
        assert row is not None
        assert int(row[1]) == 0, row  # the books still balance
    finally:
        await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--concurrent", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--sqlite", action="store_true")
    args = parser.parse_args()
    try:
        from ductor_server.pytest_plugin import create_database, drop_database

        url = create_database()
    except Exception as exc:
        print(f"postgres skipped: {exc}")
    else:
        try:
            await bench_backend(
                "postgres", url, args.count, args.concurrent, args.rounds, args.batch
            )
        finally:
            drop_database(url)
    if args.sqlite:
        with tempfile.TemporaryDirectory() as folder:
            target = str(Path(folder) / "ductor.db")
            await bench_backend("sqlite", target, args.count, 1, args.rounds, args.batch)


if __name__ == "__main__":
    asyncio.run(main())
