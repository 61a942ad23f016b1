"""Balanced entries per second through the real API, against single-row commits on
the same database, both measured in the same run.

A `ductor serve` process is started on a freshly migrated PostgreSQL database
(as after `ductor migrate`), on 127.0.0.1. In interleaved rounds, C clients
(`--concurrent`, default 8) each on their own pair of accounts:

- the baseline: one `INSERT` of one row per transaction, straight to the
  server's database with psycopg (what a single-row commit costs there);
- `POST /v1/ledger/entries` with an `Idempotency-Key`, one entry per request;
- `POST /v1/ledger/entries/batch` with `--batch` entries (default 100) per
  request and transaction, the batch keyed.

Printed: median entries per second of each and the ratio to the baseline.

    uv run python bench/ledger_api.py [--count 2000] [--concurrent 8] [--batch 100]
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

import httpx
import psycopg
from routing_server import Server

USD = 1_000_000


def _charge(worker: int) -> dict[str, object]:
    return {
        "postings": [
            {"account": f"wallet-{worker}", "amount": 1_000, "currency": "USD"},
            {"account": f"revenue-{worker}", "amount": -1_000, "currency": "USD"},
        ],
        "description": "charge",
    }


async def _rows(url: str, worker: int, count: int) -> None:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        for n in range(count):
            async with conn.transaction():
                await conn.execute(
                    "INSERT INTO ledger_bench_rows (worker, n) VALUES (%s, %s)", (worker, n)
                )


async def _entries(http: httpx.AsyncClient, tag: str, worker: int, count: int) -> None:
    for n in range(count):
        answer = await http.post(
            "/v1/ledger/entries",
            json=_charge(worker),
            headers={"Idempotency-Key": f"{tag}-{worker}-{n}"},
        )
        assert answer.status_code == 201, answer.text


async def _batches(http: httpx.AsyncClient, tag: str, size: int, worker: int, count: int) -> None:
    for n in range(0, count, size):
        body = {"entries": [_charge(worker)] * min(size, count - n)}
        answer = await http.post(
            "/v1/ledger/entries/batch",
            json=body,
            headers={"Idempotency-Key": f"{tag}-{worker}-{n}"},
        )
        assert answer.status_code == 201, answer.text


async def _rate(job: Callable[[int, int], Awaitable[None]], count: int, callers: int) -> float:
    each = count // callers
    started = time.perf_counter()
    await asyncio.gather(*(job(worker, each) for worker in range(callers)))
    return each * callers / (time.perf_counter() - started)


async def bench(
    server: Server, key: str, count: int, callers: int, rounds: int, batch: int
) -> None:
    assert server.database_url is not None
    async with await psycopg.AsyncConnection.connect(server.database_url, autocommit=True) as conn:
        await conn.execute(
            "CREATE TABLE ledger_bench_rows (worker integer NOT NULL, n integer NOT NULL)"
        )
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=callers)
    async with httpx.AsyncClient(
        base_url=server.url, headers=headers, timeout=120, limits=limits
    ) as http:
        for worker in range(callers):
            for code, kind, floor in (
                (f"cash-{worker}", "asset", None),
                (f"wallet-{worker}", "liability", 0),
                (f"revenue-{worker}", "revenue", None),
            ):
                body = {"code": code, "currency": "USD", "kind": kind, "floor": floor}
                (await http.post("/v1/accounts", json=body)).raise_for_status()
            funds = {
                "postings": [
                    {"account": f"cash-{worker}", "amount": 10**6 * USD, "currency": "USD"},
                    {"account": f"wallet-{worker}", "amount": -(10**6) * USD, "currency": "USD"},
                ]
            }
            (await http.post("/v1/ledger/entries", json=funds)).raise_for_status()
        base: list[float] = []
        single: list[float] = []
        batched: list[float] = []
        per_round = max(count // rounds, callers)
        for r in range(rounds):
            base.append(await _rate(partial(_rows, server.database_url), per_round, callers))
            single.append(await _rate(partial(_entries, http, f"s{r}"), per_round, callers))
            batched.append(
                await _rate(partial(_batches, http, f"b{r}", batch), per_round * 5, callers)
            )
    b, s, m = (statistics.median(x) for x in (base, single, batched))
    print(
        f"postgres, {callers} callers: single-row commits {b:7.0f}/s"
        f" | API entries with Idempotency-Key {s:7.0f}/s = {s / b:.2f}x"
        f" | API batches of {batch} {m:7.0f}/s = {m / b:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--concurrent", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Server("postgres", Path(tmp)) as server:
        key = server.api_key()
        asyncio.run(bench(server, key, args.count, args.concurrent, args.rounds, args.batch))


if __name__ == "__main__":
    main()
