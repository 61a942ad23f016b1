"""Run starts per second through the real API: one run per request against batches.

A `ductor serve` process on a freshly migrated PostgreSQL database (or `ductor
dev` on SQLite) is started on 127.0.0.1. Eight clients start runs of a 3-step
no-op chain, in interleaved rounds: one `POST /v1/runs` per run (the baseline),
then `POST /v1/runs/batch` with `--batch` runs per request. The engine runs the
started runs meanwhile, as it would in production. Printed: the median starts
per second of each way and their ratio.

    uv run python bench/starts.py [--runs 1000] [--batch 100] [--rounds 3]
                                  [--backend postgres|sqlite]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from engine import chain
from routing_server import Server

CLIENTS = 8


async def _single(http: httpx.AsyncClient, tag: str, worker: int, count: int) -> None:
    for n in range(count):
        body = {"family_slug": "bench-chain", "input": {"i": n}}
        answer = await http.post(
            "/v1/runs", json=body, headers={"Idempotency-Key": f"{tag}-{worker}-{n}"}
        )
        assert answer.status_code == 201, answer.text


async def _batched(http: httpx.AsyncClient, tag: str, size: int, worker: int, count: int) -> None:
    for n in range(0, count, size):
        runs = [
            {"family_slug": "bench-chain", "input": {"i": i}} for i in range(min(size, count - n))
        ]
        answer = await http.post(
            "/v1/runs/batch",
            json={"runs": runs},
            headers={"Idempotency-Key": f"{tag}-{worker}-{n}"},
        )
        assert answer.status_code == 201, answer.text


async def _rate(job: Any, count: int) -> float:
    each = count // CLIENTS
    started = time.perf_counter()
    await asyncio.gather(*(job(worker, each) for worker in range(CLIENTS)))
    return each * CLIENTS / (time.perf_counter() - started)


async def bench(
    server: Server, api_key: str, runs: int, batch: int, rounds: int
) -> tuple[float, float]:
    headers = {"Authorization": f"Bearer {api_key}"}
    limits = httpx.Limits(max_connections=CLIENTS)
    async with httpx.AsyncClient(
        base_url=server.url, headers=headers, timeout=120, limits=limits
    ) as http:
        published = await http.post("/v1/workflows", json=chain(3))
        assert published.status_code == 201, published.text
        await _rate(partial(_single, http, "warm"), CLIENTS * 5)
        singles: list[float] = []
        batches: list[float] = []
        for r in range(rounds):
            singles.append(await _rate(partial(_single, http, f"s{r}"), runs))
            batches.append(await _rate(partial(_batched, http, f"b{r}", batch), runs))
    return statistics.median(singles), statistics.median(batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", choices=["postgres", "sqlite"], default="postgres")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Server(args.backend, Path(tmp)) as server:
        key = server.api_key()
        single, batched = asyncio.run(bench(server, key, args.runs, args.batch, args.rounds))
    print(
        f"{args.backend:8} starts through the API, {CLIENTS} clients: one per request"
        f" {single:7.0f}/s | batches of {args.batch} {batched:7.0f}/s"
        f" | ratio {batched / single:.1f}x"
    )


if __name__ == "__main__":
    main()
