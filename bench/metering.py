"""What metering costs the engine: steps per second with usage counted, against the
same engine with metering switched off, measured in the same run.

The engine meters runs created and steps ended as it flushes a batch's writes:
one upsert per tenant and meter of its hour, day and month counters (joined with
the budgets on Postgres), in the transaction of the batch. This bench runs
`bench/engine.py`'s load (N chains of no-op steps, default runtime, fresh store)
in interleaved rounds of three variants:

- `off`: `METERED_HISTORY` emptied, so nothing is counted (the baseline);
- `on`: as shipped, no budgets;
- `budgets`: as shipped, with alert-only budgets on `runs` and `steps` (so every
  flush also reads the budgets and checks the alert thresholds).

Printed: the median steps/s of each and the ratios on / off and budgets / off.

    uv run python bench/metering.py [--runs 300] [--steps 10] [--rounds 3]
        [--backend postgres|sqlite|both]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import engine as engine_bench  # bench/engine.py, beside this file

from ductor_server.composition import build_services
from ductor_server.engine import effects
from ductor_server.engine.actions import default_registry
from ductor_server.engine.runtime import Runtime
from ductor_server.services.metering import BudgetBody
from ductor_server.storage import open_store
from ductor_settlement import UsageWindow

TENANT = engine_bench.TENANT
METERED = dict(effects.METERED_HISTORY)
VARIANTS = ("off", "on", "budgets")


async def steps_per_second(target: str | Path, runs: int, steps: int, variant: str) -> float:
    """One round of the engine load on a fresh store; steps/s."""
    effects.METERED_HISTORY.clear()
    if variant != "off":
        effects.METERED_HISTORY.update(METERED)
    store = open_store(target)
    await store.open()
    try:
        await store.migrate()
        async with store.transaction() as tx:
            await tx.ensure_tenant(TENANT, name="bench", now=datetime.now(UTC))
        async with Runtime.start(store, actions=default_registry()) as runtime:
            services = build_services(runtime)
            await services.workflows.publish(TENANT, engine_bench.chain(steps))
            if variant == "budgets":
                for meter in ("runs", "steps"):
                    await services.metering.create_budget(
                        TENANT,
                        BudgetBody(
                            meter=meter,
                            window=UsageWindow.DAY,
                            limit=runs * steps * 2,
                            alert_percents=(10, 50, 90),
                            block=False,
                        ),
                    )
            started = time.perf_counter()
            for i in range(runs):
                await services.runs.trigger(TENANT, "bench-chain", None, {"i": i}, None)
            while True:
                await asyncio.sleep(0.2)
                counts = await engine_bench._run_counts(store, TENANT)
                if counts.get("RUN_STATUS_SUCCEEDED", 0) == runs:
                    break
                if counts.get("RUN_STATUS_FAILED", 0) or counts.get("RUN_STATUS_CANCELLED", 0):
                    raise SystemExit(f"runs ended badly: {counts}")
            elapsed = time.perf_counter() - started
            if variant != "off":
                async with store.transaction() as tx:
                    row = await tx.session.fetch_one(
                        "SELECT value FROM usage_counters WHERE tenant_id = %s"
                        " AND meter = 'steps' AND win = 'month'",
                        (TENANT,),
                    )
                assert row is not None
                assert int(row[0]) == runs * steps, row
    finally:
        await store.close()
        effects.METERED_HISTORY.update(METERED)
    return runs * steps / elapsed


def _report(backend: str, rates: dict[str, list[float]], runs: int, steps: int) -> None:
    med = {v: statistics.median(r) for v, r in rates.items()}
    print(
        f"{backend:9} off {med['off']:7.0f} steps/s | on {med['on']:7.0f} | budgets"
        f" {med['budgets']:7.0f} | ratio on/off {med['on'] / med['off']:.3f},"
        f" budgets/off {med['budgets'] / med['off']:.3f}"
        f" ({runs} runs x {steps} steps, {len(rates['off'])} rounds, medians)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="postgres")
    args = parser.parse_args()
    if args.backend in ("sqlite", "both"):
        rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for _ in range(args.rounds):
            for variant in VARIANTS:
                with tempfile.TemporaryDirectory() as tmp:
                    rates[variant].append(
                        asyncio.run(
                            steps_per_second(Path(tmp) / "b.db", args.runs, args.steps, variant)
                        )
                    )
        _report("sqlite", rates, args.runs, args.steps)
    if args.backend in ("postgres", "both"):
        from ductor_server.pytest_plugin import admin_database_url, create_database, drop_database

        admin = os.environ.get("DUCTOR_BENCH_DATABASE_URL", admin_database_url())
        rates = {v: [] for v in VARIANTS}
        for _ in range(args.rounds):
            for variant in VARIANTS:
                try:
                    url = create_database(admin)
                except Exception as exc:  # no server: say so and go on
                    print(f"postgres  skipped: {exc}")
                    return
                try:
                    rates[variant].append(
                        asyncio.run(steps_per_second(url, args.runs, args.steps, variant))
                    )
                finally:
                    drop_database(url, admin)
        _report("postgres", rates, args.runs, args.steps)


if __name__ == "__main__":
    main()
