"""The server's memory: idle, then holding many runs that wait.

A `ductor serve` process on a freshly migrated PostgreSQL database (or `ductor
dev` on SQLite) is started on 127.0.0.1 and left idle; its resident set size
(VmRSS from /proc) is the cold baseline. A first batch of `WARM_UP` waiting
runs then pays what a process pays once, on its first requests (lazily
imported modules, prepared statements, caches); once they are parked and the
process has settled, its RSS is the warm baseline. Then `--runs` runs of a
workflow whose second step waits for a signal are started through the real
API (`POST /v1/runs/batch`) and the bench waits until every one of them is
parked on its wait (a row in `waits`), gives the process a few seconds to
settle, and reads its RSS again. Printed: both baselines, the RSS with the
runs waiting, and the growth per 10,000 waiting runs from the warm baseline
(and its ratio to it), with the growth from cold beside it.

    uv run python bench/memory.py [--runs 10000] [--backend postgres|sqlite]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
import time
from pathlib import Path

import httpx
import psycopg
from routing_server import Server

SETTLE_SECONDS = 5.0
BATCH = 500
WARM_UP = 500


def waiting_workflow() -> dict[str, object]:
    """A no-op step, then a wait for the signal `go` (none is ever sent)."""
    return {
        "family_slug": "bench-waiting",
        "steps": [
            {"ref": "first", "type": "STEP_TYPE_ACTION", "args": {"action": "noop"}},
            {"ref": "park", "type": "STEP_TYPE_WAIT_FOR_SIGNAL", "args": {"signal": "go"}},
        ],
        "edges": [{"source_ref": "first", "target_ref": "park"}],
    }


def rss_bytes(pid: int) -> int:
    """The resident set size of process `pid`."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def parked(server: Server) -> int:
    """How many runs are waiting on a signal, read from the store."""
    sql = "SELECT COUNT(*) FROM waits"
    if server.database_url is not None:
        with psycopg.connect(server.database_url) as conn:
            row = conn.execute(sql).fetchone()
    else:
        with sqlite3.connect(server.data_dir / "ductor.db") as conn:
            row = conn.execute(sql).fetchone()
    assert row is not None
    return int(row[0])


async def start_runs(server: Server, key: str, count: int, *, first: int = 0) -> None:
    """Start runs `first` to `first + count` (publishing the workflow before the
    very first)."""
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=60) as http:
        if first == 0:
            answer = await http.post("/v1/workflows", json=waiting_workflow())
            assert answer.status_code == 201, answer.text
        for n in range(first, first + count, BATCH):
            size = min(BATCH, first + count - n)
            runs = [{"family_slug": "bench-waiting", "input": {"i": n + i}} for i in range(size)]
            answer = await http.post(
                "/v1/runs/batch",
                json={"runs": runs},
                headers={"Idempotency-Key": f"memory-{n}"},
            )
            assert answer.status_code == 201, answer.text


def wait_parked(server: Server, runs: int) -> None:
    deadline = time.monotonic() + 600
    while (count := parked(server)) < runs:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {count} of {runs} runs reached their wait in 600 s")
        time.sleep(0.5)


def measure(backend: str, runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, Server(backend, Path(tmp)) as server:
        assert server.proc is not None
        pid = server.proc.pid
        key = server.api_key()
        time.sleep(SETTLE_SECONDS)
        cold = rss_bytes(pid)
        asyncio.run(start_runs(server, key, WARM_UP))
        wait_parked(server, WARM_UP)
        time.sleep(SETTLE_SECONDS)
        warm = rss_bytes(pid)
        started = time.perf_counter()
        asyncio.run(start_runs(server, key, runs, first=WARM_UP))
        wait_parked(server, WARM_UP + runs)
        elapsed = time.perf_counter() - started
        time.sleep(SETTLE_SECONDS)
        loaded = rss_bytes(pid)
    growth = (loaded - warm) * 10_000 / runs
    from_cold = (loaded - cold) * 10_000 / (runs + WARM_UP)
    mib = 1024 * 1024
    print(
        f"{backend}: idle {cold / mib:.1f} MiB cold, {warm / mib:.1f} MiB after a first"
        f" {WARM_UP} runs; {runs} more runs waiting (parked in {elapsed:.1f} s)"
        f" {loaded / mib:.1f} MiB; growth {growth / mib:+.1f} MiB per 10,000 waiting runs"
        f" = {growth / warm:.3f}x the idle size (from cold: {from_cold / mib:+.1f} MiB)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--backend", choices=("postgres", "sqlite"), default="postgres")
    args = parser.parse_args()
    measure(args.backend, args.runs)


if __name__ == "__main__":
    main()
