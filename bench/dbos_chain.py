"""The engine against DBOS, side by side: chains of no-op steps on fresh Postgres.

DBOS (durable execution as a Python library over Postgres) runs N workflows of
`--steps` no-op steps, all started at once with `DBOS.start_workflow_async`, on a
database of its own created for the run; the clock stops when the last result
is back. Then the same chains go through Ductor exactly as `bench/engine.py`
runs them (a real `ductor serve --migrate` on a fresh database, the runs started
through the API). Printed: each one's steps per second and Ductor's ratio to
DBOS, measured in the same run.

DBOS is not one of Ductor's dependencies; bring it for this run only:

    uv run --with dbos python bench/dbos_chain.py [--runs 1000] [--steps 10]

DBOS runs in this process, without HTTP; Ductor serves every start through its
API, so the comparison gives DBOS the easier path.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

from engine import server_steps_per_second


def dbos_steps_per_second(admin: str, runs: int, steps: int) -> tuple[float, float]:
    """Run `runs` DBOS workflows of `steps` no-op steps on a new database; return
    (steps/s, seconds)."""
    from dbos import DBOS

    from ductor_server.pytest_plugin import create_database, drop_database

    url = create_database(admin)
    try:
        DBOS(config={"name": "ductor-bench", "system_database_url": url})

        @DBOS.step()
        async def noop(i: int) -> int:
            return i

        @DBOS.workflow()
        async def chain(n: int) -> int:
            for s in range(steps):
                await noop(s)
            return n

        async def all_runs() -> float:
            DBOS.launch()
            started = time.perf_counter()
            handles: list[Any] = await asyncio.gather(
                *(DBOS.start_workflow_async(chain, i) for i in range(runs))
            )
            await asyncio.gather(*(handle.get_result() for handle in handles))
            return time.perf_counter() - started

        elapsed = asyncio.run(all_runs())
        DBOS.destroy()
    finally:
        drop_database(url, admin)
    return runs * steps / elapsed, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    from ductor_server.pytest_plugin import admin_database_url

    admin = os.environ.get("DUCTOR_BENCH_DATABASE_URL", admin_database_url())
    dbos_rate, dbos_elapsed = dbos_steps_per_second(admin, args.runs, args.steps)
    rate, elapsed = server_steps_per_second("postgres", args.runs, args.steps, None)
    print(
        f"dbos      {dbos_rate:8.0f} steps/s ({args.runs} runs x {args.steps} steps,"
        f" in process, {dbos_elapsed:.1f}s)\n"
        f"ductor    {rate:8.0f} steps/s ({args.runs} runs x {args.steps} steps, server + API,"
        f" {elapsed:.1f}s) | ratio {rate / dbos_rate:.1f}x DBOS"
    )


if __name__ == "__main__":
    main()
