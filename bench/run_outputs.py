"""What a run's ticks write when its steps answer large outputs: kept in the
state (rewritten whole at every tick) against kept out of it (written once).

On a fresh PostgreSQL database, through the store: `--runs` runs of a chain of
`--steps` steps are ticked as the coordinator does, one step succeeding per tick
with an output of its own of `--output-bytes` (text that compresses about as
well as prose). The baseline is the same store with the outputs left in the
state (`OUTLINE_BYTES` set past any output), measured in the same run on a
database of its own; the two alternate, twice each, and the faster of each
counts. Printed for each: WAL bytes per step, seconds, and the ratios.

    uv run python bench/run_outputs.py [--runs 300] [--steps 10] [--output-bytes 4096]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime, timedelta

import msgspec
from prose import prose

from ductor_core.runs import RunState, RunStatus, StepState, StepStatus
from ductor_server.pytest_plugin import create_database, drop_database
from ductor_server.storage import NewRun, RunRef, RunUpdate, Store, _outlined, open_store

NOW = datetime(2026, 1, 1, tzinfo=UTC)


async def wal(store: Store) -> int:
    async with store.transaction() as tx:
        row = await tx.session.fetch_one("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
    assert row is not None
    return int(row[0])


async def ticks(url: str, runs: int, steps: int, size: int) -> tuple[float, float]:
    """(WAL bytes per step, seconds) for ticking every run to its end."""
    store = open_store(url)
    await store.open()
    try:
        await store.migrate()
        pending = {f"s{n}": StepState(ref=f"s{n}") for n in range(steps)}
        states = {
            f"r{i}": RunState(
                run_id=f"r{i}", status=RunStatus.RUNNING, created_at=NOW, steps=pending
            )
            for i in range(runs)
        }
        async with store.transaction() as tx:
            inserted = await tx.insert_runs(
                [
                    NewRun(tenant_id="t", family_slug="chain", version=1, state=state)
                    for state in states.values()
                ]
            )
        records = {r.run.id: r.run for r in inserted}
        started, before = time.perf_counter(), await wal(store)
        for step in range(steps):
            ref = f"s{step}"
            updates = []
            for run_id, record in records.items():
                done = StepState(
                    ref=ref,
                    status=StepStatus.SUCCEEDED,
                    attempt=1,
                    output={"text": prose(f"{run_id}:{ref}", size)},
                )
                state = msgspec.structs.replace(
                    record.state, steps={**record.state.steps, ref: done}
                )
                updates.append(
                    RunUpdate(
                        tenant_id="t",
                        run_id=run_id,
                        expected_lock_version=record.lock_version,
                        state=state,
                        updated_at=NOW + timedelta(seconds=step),
                        outlined=record.outlined,
                    )
                )
            for at in range(0, len(updates), 64):  # the coordinator's batch
                async with store.transaction() as tx:
                    assert all(await tx.update_runs(updates[at : at + 64]))
            async with store.transaction() as tx:
                found = await tx.get_runs(
                    [RunRef(tenant_id=u.tenant_id, run_id=u.run_id) for u in updates]
                )
            records = {r.id: r for r in found}
        seconds = time.perf_counter() - started
        return (await wal(store) - before) / (runs * steps), seconds
    finally:
        await store.close()


def measure(runs: int, steps: int, size: int, *, outline: bool) -> tuple[float, float]:
    keep = _outlined.OUTLINE_BYTES
    if not outline:
        _outlined.OUTLINE_BYTES = 1 << 40
    url = create_database()
    try:
        return asyncio.run(ticks(url, runs, steps, size))
    finally:
        _outlined.OUTLINE_BYTES = keep
        drop_database(url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--output-bytes", type=int, default=4096)
    args = parser.parse_args()
    # Alternated, twice each, the faster of each kept (the first run also warms
    # the process up).
    pairs = [
        (
            measure(args.runs, args.steps, args.output_bytes, outline=False),
            measure(args.runs, args.steps, args.output_bytes, outline=True),
        )
        for _ in range(2)
    ]
    inline = min((p[0] for p in pairs), key=lambda m: m[1])
    apart = min((p[1] for p in pairs), key=lambda m: m[1])
    print(
        f"{args.runs} runs x {args.steps} steps, {args.output_bytes} B outputs:"
        f" in the state {inline[0]:,.0f} WAL B/step ({inline[1]:.1f} s);"
        f" out of it {apart[0]:,.0f} WAL B/step ({apart[1]:.1f} s);"
        f" ratio {inline[0] / apart[0]:.1f}x fewer WAL bytes, {inline[1] / apart[1]:.1f}x faster"
    )


if __name__ == "__main__":
    main()
