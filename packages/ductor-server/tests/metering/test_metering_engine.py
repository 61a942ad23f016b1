"""Usage the engine meters on its own, on both backends: runs and steps counted in the
transaction of the tick, child runs never refused; and concurrent calls through the
services straight from one event loop (on Postgres each on its own pooled
connection, so they really overlap): triggers never pass a budget, new workflow
families never pass the plan's limit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ductor_core.runs import RunStatus
from ductor_server.composition import build_services
from ductor_server.engine.clock import ManualClock
from ductor_server.engine.runtime import Runtime, RuntimeConfig
from ductor_server.metering import MeteringTx
from ductor_server.services import Services
from ductor_server.services.metering import BudgetBody, PlanAssignBody, PlanBody
from ductor_server.storage import Store, open_store
from ductor_settlement import (
    BudgetExceeded,
    Entitlement,
    EntitlementLimitExceeded,
    UsageWindow,
    window_start,
)

TENANT = "t-meter"
CONFIG = RuntimeConfig(poll_interval=0.05, lease_seconds=30.0, stop_grace=2.0)


def _chain(slug: str, steps: int) -> dict[str, object]:
    return {
        "family_slug": slug,
        "steps": [
            {"ref": f"s{i}", "type": "STEP_TYPE_ACTION", "args": {"action": "noop"}}
            for i in range(steps)
        ],
        "edges": [{"source_ref": f"s{i}", "target_ref": f"s{i + 1}"} for i in range(steps - 1)],
    }


PARENT = {
    "family_slug": "parent",
    "steps": [
        {"ref": "a", "type": "STEP_TYPE_ACTION", "args": {"action": "noop"}},
        {"ref": "sub1", "type": "STEP_TYPE_SUBWORKFLOW", "args": {"family_slug": "three"}},
        {"ref": "sub2", "type": "STEP_TYPE_SUBWORKFLOW", "args": {"family_slug": "three"}},
    ],
    "edges": [{"source_ref": "a", "target_ref": "sub1"}, {"source_ref": "a", "target_ref": "sub2"}],
}
"""Its children start in a later engine tick, not in the trigger's transaction."""


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    target = (
        request.getfixturevalue("postgres_url")
        if request.param == "postgres"
        else str(tmp_path / "ductor.db")
    )
    opened = open_store(target)
    await opened.open()
    await opened.migrate()
    async with opened.transaction() as tx:
        await tx.ensure_tenant(TENANT, name="m", now=ManualClock().now())
    try:
        yield opened
    finally:
        await opened.close()


async def _counter(store: Store, meter: str, clock: ManualClock) -> int:
    async with store.transaction() as tx:
        start = window_start(UsageWindow.DAY, clock.now())
        return await MeteringTx(tx).counter(TENANT, meter, UsageWindow.DAY, start)


async def _wait_ended(services: Services, run_id: str) -> None:
    for _ in range(2000):
        view = await services.runs.get(TENANT, run_id)
        if view.status.terminal:
            assert view.status is RunStatus.SUCCEEDED, view
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"run {run_id} did not end")


async def test_the_engine_meters_runs_and_steps_and_never_refuses_its_own_work(
    store: Store,
) -> None:
    clock = ManualClock()
    async with Runtime.start(store, config=CONFIG, clock=clock) as runtime:
        services = build_services(runtime)
        await services.workflows.publish(TENANT, _chain("three", 3))
        await services.workflows.publish(TENANT, PARENT)
        # Two runs in the month: the parent uses both; its two children pass it.
        await services.metering.create_budget(
            TENANT, BudgetBody(meter="runs", window=UsageWindow.MONTH, limit=2)
        )
        first = (await services.runs.trigger(TENANT, "three")).value
        parent = (await services.runs.trigger(TENANT, "parent")).value
        await _wait_ended(services, first.id)
        await _wait_ended(services, parent.id)
        # 2 triggered + 2 children; 3 steps x 3 runs of "three" + the parent's 3.
        assert await _counter(store, "runs", clock) == 4
        assert await _counter(store, "steps", clock) == 12
        with pytest.raises(BudgetExceeded) as refused:
            await services.runs.trigger(TENANT, "three")
        assert refused.value.details["meter"] == "runs"
        assert refused.value.details["current"] == 4
        runs = await services.runs.page(TENANT)
        assert len(runs.items) == 4


async def test_the_engine_records_each_alert_its_steps_cross_once(store: Store) -> None:
    # The engine writes its usage without waiting for the answer (one round trip
    # less per step on Postgres): the statement records the alerts itself.
    clock = ManualClock()
    async with Runtime.start(store, config=CONFIG, clock=clock) as runtime:
        services = build_services(runtime)
        await services.workflows.publish(TENANT, _chain("three", 3))
        await services.metering.create_budget(
            TENANT,
            BudgetBody(
                meter="steps",
                window=UsageWindow.DAY,
                limit=4,
                alert_percents=(50, 75, 100, 200),
                block=True,  # the engine never refuses its own steps even so
            ),
        )
        for _ in range(2):  # one step ended per report: 1, 2, ... 6 steps
            run = (await services.runs.trigger(TENANT, "three")).value
            await _wait_ended(services, run.id)
        assert await _counter(store, "steps", clock) == 6
        async with store.read() as tx:
            alerts = await tx.session.fetch_all(
                "SELECT percent, lim, value FROM budget_alerts"
                " WHERE tenant_id = %s AND meter = %s ORDER BY percent",
                (TENANT, "steps"),
            )
    assert [tuple(int(v) for v in row) for row in alerts] == [(50, 4, 2), (75, 4, 3), (100, 4, 4)]


async def test_twenty_concurrent_service_triggers_never_pass_ten(store: Store) -> None:
    clock = ManualClock()
    runtime = Runtime(store, roles=(), clock=clock)
    services = build_services(runtime)
    await services.workflows.publish(TENANT, _chain("one", 1))
    await services.metering.create_budget(
        TENANT, BudgetBody(meter="runs", window=UsageWindow.DAY, limit=10)
    )
    results = await asyncio.gather(
        *(services.runs.trigger(TENANT, "one") for _ in range(20)), return_exceptions=True
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(errors) == 10
    assert all(isinstance(e, BudgetExceeded) for e in errors), errors
    assert await _counter(store, "runs", clock) == 10
    assert len((await services.runs.page(TENANT)).items) == 10


async def test_concurrent_new_families_never_pass_the_plans_workflow_limit(store: Store) -> None:
    runtime = Runtime(store, roles=(), clock=ManualClock())
    services = build_services(runtime)
    limits = {"workflows": Entitlement(limit=3)}
    await services.metering.create_plan(TENANT, PlanBody(id="small", entitlements=limits))
    await services.metering.assign_plan(TENANT, PlanAssignBody(plan="small"))
    results = await asyncio.gather(
        *(services.workflows.publish(TENANT, _chain(f"f{n}", 1)) for n in range(8)),
        return_exceptions=True,
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(errors) == 5
    assert all(isinstance(e, EntitlementLimitExceeded) for e in errors), errors
    assert len(await services.workflows.families(TENANT)) == 3
