"""Cron triggers of SDK workflows, on both backends: a sync refuses a cron that
does not parse, with its pointer; the timer loop starts one run per scheduled
time (two timer loops, or a scan repeated after a restart, start it once), a
missed stretch starts only its latest time, and a cron a later sync removes or
changes stops or changes. Time is a `ManualClock` the runtime reads."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ductor import Client, Context, Trigger
from ductor.asgi import BridgeApp
from ductor.protocol import DescribeResponse, SigningKeys, TriggerInfo, WorkflowInfo
from ductor_core.runs import RunStatus
from ductor_server.bridge import Cron, cron_problem, cron_run_key, install
from ductor_server.bridge.registry import list_schedules
from ductor_server.composition import build_services
from ductor_server.engine.clock import ManualClock
from ductor_server.engine.queue import InProcessWakeUp, Topic
from ductor_server.engine.runtime import Runtime
from ductor_server.engine.timers import Timers
from ductor_server.errors import RequestInvalid
from ductor_server.services.bridge import MAX_CRONS_PER_APP, BridgeCaller
from ductor_server.services.metering import BudgetBody
from ductor_server.storage import Store
from ductor_settlement import UsageWindow

from .conftest import APP_URL, CONFIG, KEY, TENANT, WAIT_SECONDS, BridgeEngine

CALLER = BridgeCaller(tenant_id=TENANT, app_id="clock", own_key=False)
SLUG = "bridge:clock:tick"


def _app(cron: str = "* * * * *") -> Client:
    client = Client("clock", signing_key=KEY)

    async def stamp(at: str) -> str:
        return at

    @client.workflow("tick", trigger=Trigger(cron=cron))
    async def tick(ctx: Context, input: dict[str, Any]) -> Any:
        return await ctx.step.run("stamp", stamp, input["scheduled_at"])

    return client


def _start() -> datetime:
    # The app checks signatures against its own clock: stay near the real time.
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    return now + timedelta(seconds=30)


@asynccontextmanager
async def _engine(store: Store, client: Client, clock: ManualClock) -> AsyncIterator[BridgeEngine]:
    drivers = []

    def setup(runtime: Runtime) -> None:
        transport = httpx.ASGITransport(app=BridgeApp(client))
        drivers.append(install(runtime, keys=SigningKeys(KEY), transport=transport))

    async with Runtime.start(store, config=CONFIG, clock=clock, setup=setup) as runtime:
        engine = BridgeEngine(store=store, runtime=runtime, driver=drivers[0])
        await engine.services.bridge.sync(TENANT, client.describe(APP_URL), caller=CALLER)
        yield engine


async def _runs(store: Store, slug: str = SLUG, tenant: str = TENANT) -> list[Any]:
    async with store.transaction() as tx:
        page = await tx.list_runs(tenant, family_slug=slug, limit=100)
    return sorted(page.items, key=lambda r: r.created_at)


async def _wait_for(check: Callable[[], Any], what: str) -> Any:
    deadline = asyncio.get_running_loop().time() + WAIT_SECONDS
    while True:
        found = await check()
        if found:
            return found
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def test_a_cron_workflow_runs_at_each_time_through_the_app(store: Store) -> None:
    clock = ManualClock(_start())
    first = clock.now().replace(second=0) + timedelta(minutes=1)
    async with _engine(store, _app(), clock) as engine:
        await asyncio.sleep(0.2)  # the timer loop looks a few times: nothing is due
        assert await _runs(store) == []

        ends = []
        for at in (first, first + timedelta(minutes=1)):
            clock.set(at + timedelta(seconds=2))
            engine.runtime.wakeup.notify(Topic.TIMERS)
            key = cron_run_key("clock", "tick", at)

            async def started(key: str = key) -> Any:
                async with store.transaction() as tx:
                    return await tx.find_run_by_idempotency_key(TENANT, key)

            run = await _wait_for(started, f"the run of {at}")
            view = await engine.wait_run(run.id)
            assert view.status == RunStatus.SUCCEEDED, view
            stamp = at.isoformat().replace("+00:00", "Z")
            assert view.input == {"scheduled_at": stamp}
            assert view.output == stamp
            ends.append(view.id)
        assert len(await _runs(store)) == 2
        assert len(set(ends)) == 2


async def _fire(store: Store, timers: list[Timers]) -> None:
    await asyncio.gather(*(t.fire_due() for t in timers))


def _timers(store: Store, clock: ManualClock, loops: int = 1) -> list[Timers]:
    """Timer loops as separate processes would run them, with the bridge's schedules."""
    runtime = Runtime(store, clock=clock)
    install(runtime, keys=SigningKeys(KEY))
    out = []
    for _ in range(loops):
        timers = Timers(store, clock=clock, wake=InProcessWakeUp())
        timers.schedules = runtime.timers.schedules
        out.append(timers)
    return out


async def _sync(
    store: Store, clock: ManualClock, describe: DescribeResponse, tenant: str = TENANT
) -> None:
    runtime = Runtime(store, clock=clock)
    install(runtime, keys=SigningKeys(KEY))
    caller = BridgeCaller(tenant_id=tenant, app_id="clock", own_key=False)
    await build_services(runtime).bridge.sync(tenant, describe, caller=caller)


def _describe(*workflows: tuple[str, list[TriggerInfo]]) -> DescribeResponse:
    return DescribeResponse(
        app_id="clock",
        sdk="test",
        sdk_version="0",
        url=APP_URL,
        workflows=[WorkflowInfo(id=wf, retries=0, triggers=triggers) for wf, triggers in workflows],
    )


T0 = datetime(2030, 1, 1, 12, 3, 20, tzinfo=UTC)


async def test_one_time_starts_one_run_whoever_fires_it(store: Store) -> None:
    clock = ManualClock(T0)
    await _sync(store, clock, _describe(("tick", [TriggerInfo(cron="*/5 * * * *")])))
    loops = _timers(store, clock, loops=2)
    await _fire(store, loops)
    assert await _runs(store) == []

    clock.set(datetime(2030, 1, 1, 12, 5, 0, 400000, tzinfo=UTC))
    await _fire(store, loops)  # two timer loops at once
    await _fire(store, loops)  # and again at the same moment
    [run] = await _runs(store)
    assert run.idempotency_key == "cron:clock:tick:2030-01-01T12:05:00Z"

    # A timer process that read the schedule before the start was committed
    # (or restarted from an old copy) finds the time's run key taken.
    async with store.transaction() as tx:
        await tx.session.execute(
            "UPDATE bridge_schedules SET next_at = %s WHERE tenant_id = %s",
            (tx.session.to_timestamp(datetime(2030, 1, 1, 12, 5, tzinfo=UTC)), TENANT),
        )
    await _fire(store, loops)
    assert len(await _runs(store)) == 1

    clock.set(datetime(2030, 1, 1, 12, 10, 1, tzinfo=UTC))
    await _fire(store, loops)
    runs = await _runs(store)
    assert [r.idempotency_key for r in runs] == [
        "cron:clock:tick:2030-01-01T12:05:00Z",
        "cron:clock:tick:2030-01-01T12:10:00Z",
    ]


async def test_a_missed_stretch_starts_only_its_latest_time(store: Store) -> None:
    clock = ManualClock(T0)
    await _sync(store, clock, _describe(("tick", [TriggerInfo(cron="*/5 * * * *")])))
    [timers] = _timers(store, clock)
    clock.set(datetime(2030, 1, 1, 13, 31, 0, tzinfo=UTC))  # 18 times went by unseen
    await timers.fire_due()
    [run] = await _runs(store)
    assert run.idempotency_key == "cron:clock:tick:2030-01-01T13:30:00Z"
    async with store.transaction() as tx:
        [schedule] = await list_schedules(tx, TENANT, "clock")
    assert schedule.next_at == datetime(2030, 1, 1, 13, 35, tzinfo=UTC)


async def test_a_cron_run_a_budget_refuses_skips_its_time_and_holds_up_no_one(
    store: Store,
) -> None:
    """Another tenant's cron run that its blocking budget refuses is not started,
    its time is skipped (tried no more), and this tenant's run at the same time
    starts in the same turn; once the budget is gone, its next time starts."""
    clock = ManualClock(T0)
    every5 = _describe(("tick", [TriggerInfo(cron="*/5 * * * *")]))
    await _sync(store, clock, every5)
    await _sync(store, clock, every5, tenant="other")
    services = build_services(Runtime(store, clock=clock))
    await services.metering.create_budget(
        "other", BudgetBody(meter="runs", window=UsageWindow.DAY, limit=0)
    )
    [timers] = _timers(store, clock)
    clock.set(datetime(2030, 1, 1, 12, 5, 1, tzinfo=UTC))
    await timers.fire_due()
    [ours] = await _runs(store)
    assert ours.idempotency_key == "cron:clock:tick:2030-01-01T12:05:00Z"
    assert await _runs(store, tenant="other") == []
    async with store.transaction() as tx:
        [skipped] = await list_schedules(tx, "other", "clock")
    assert skipped.next_at == datetime(2030, 1, 1, 12, 10, tzinfo=UTC)

    await services.metering.delete_budget("other", "runs")
    clock.set(datetime(2030, 1, 1, 12, 10, 1, tzinfo=UTC))
    await timers.fire_due()
    [theirs] = await _runs(store, tenant="other")
    assert theirs.idempotency_key == "cron:clock:tick:2030-01-01T12:10:00Z"
    assert len(await _runs(store)) == 2


async def test_a_later_sync_stops_or_changes_a_cron(store: Store) -> None:
    clock = ManualClock(T0)
    hourly, every5 = TriggerInfo(cron="0 * * * *"), TriggerInfo(cron="*/5 * * * *")
    await _sync(store, clock, _describe(("tick", [every5]), ("tock", [hourly]), ("gone", [every5])))
    [timers] = _timers(store, clock)

    # A re-sync keeps a kept cron's next time; "tick" changes, "tock" loses its
    # cron, "gone" is no longer served.
    clock.set(datetime(2030, 1, 1, 12, 4, 0, tzinfo=UTC))
    await _sync(
        store,
        clock,
        _describe(("tick", [hourly]), ("tock", [TriggerInfo(event="tock.now")])),
    )
    async with store.transaction() as tx:
        schedules = await list_schedules(tx, TENANT, "clock")
    assert [(s.workflow_id, s.cron, s.next_at) for s in schedules] == [
        ("tick", "0 * * * *", datetime(2030, 1, 1, 13, 0, tzinfo=UTC))
    ]
    clock.set(datetime(2030, 1, 1, 12, 59, 30, tzinfo=UTC))
    await timers.fire_due()
    assert await _runs(store, "bridge:clock:gone") == []
    assert await _runs(store, "bridge:clock:tock") == []
    assert await _runs(store) == []
    clock.set(datetime(2030, 1, 1, 13, 0, 5, tzinfo=UTC))
    await timers.fire_due()
    [run] = await _runs(store)
    assert run.idempotency_key == "cron:clock:tick:2030-01-01T13:00:00Z"

    # An unchanged re-sync just before a time does not lose it.
    clock.set(datetime(2030, 1, 1, 14, 0, 0, 500000, tzinfo=UTC))
    await _sync(store, clock, _describe(("tick", [hourly])))
    await timers.fire_due()
    assert len(await _runs(store)) == 2


async def test_a_sync_with_a_cron_that_does_not_parse_is_refused_saying_where(
    store: Store,
) -> None:
    clock = ManualClock(T0)
    describe = _describe(
        ("fine", [TriggerInfo(event="x"), TriggerInfo(cron="TZ=Europe/Paris 0 9 * * MON-FRI")]),
        ("broken", [TriggerInfo(event="x"), TriggerInfo(cron="61 * * * *")]),
        ("short", [TriggerInfo(cron="* * * *")]),
        ("both", [TriggerInfo(cron="* * * * *", event="x")]),
        ("never", [TriggerInfo(cron="0 0 30 2 *")]),
    )
    with pytest.raises(RequestInvalid) as refused:
        await _sync(store, clock, describe)
    details = refused.value.details
    assert details is not None
    assert [p["pointer"] for p in details["problems"]] == [
        "/workflows/1/triggers/1/cron",
        "/workflows/2/triggers/0/cron",
        "/workflows/3/triggers/0",
        "/workflows/4/triggers/0/cron",
    ]
    assert details["pointer"] == "/workflows/1/triggers/1/cron"
    assert refused.value.code == "request.invalid"
    async with store.transaction() as tx:
        assert await list_schedules(tx, TENANT, "clock") == []


async def test_a_sync_with_more_than_100_cron_triggers_is_refused(store: Store) -> None:
    clock = ManualClock(T0)
    many = [(f"w{i}", [TriggerInfo(cron="* * * * *")]) for i in range(MAX_CRONS_PER_APP + 1)]
    with pytest.raises(RequestInvalid) as refused:
        await _sync(store, clock, _describe(*many))
    assert refused.value.details["pointer"] == "/workflows"
    assert "at most 100" in refused.value.message
    async with store.transaction() as tx:
        assert await list_schedules(tx, TENANT, "clock") == []
    await _sync(store, clock, _describe(*many[:MAX_CRONS_PER_APP]))  # 100 is fine
    async with store.transaction() as tx:
        assert len(await list_schedules(tx, TENANT, "clock")) == MAX_CRONS_PER_APP


def test_the_accepted_cron_syntax() -> None:
    at = datetime(2030, 1, 1, 12, 3, 20, tzinfo=UTC)  # a Tuesday
    assert Cron.parse("*/5 * * * *").next_after(at) == datetime(2030, 1, 1, 12, 5, tzinfo=UTC)
    assert Cron.parse("0 9 * JAN MON").next_after(at) == datetime(2030, 1, 7, 9, tzinfo=UTC)
    assert Cron.parse("30 8-10/2 1,15 * *").latest_until(at) == datetime(
        2030, 1, 1, 10, 30, tzinfo=UTC
    )
    # Europe/Paris is UTC+1 in January.
    paris = Cron.parse("TZ=Europe/Paris 0 9 * * *")
    assert paris.next_after(at) == datetime(2030, 1, 2, 8, tzinfo=UTC)
    for bad in ("* * * *", "* * * * * *", "60 * * * *", "0 0 30 2 *", "TZ=Nowhere/At 0 * * * *"):
        assert cron_problem(bad) is not None, bad
    # Hostile input is a problem, never a crash or a long parse: a zone name that is
    # a directory of the zone database, and an expression of 200,000 characters.
    assert cron_problem("TZ=America * * * * *") == "unknown time zone 'America'"
    huge = ",".join(["5"] * 100_000) + " * * * *"
    assert cron_problem(huge) == "a cron expression is at most 256 characters"
    assert cron_problem(",".join(["5"] * 60) + " * * * *") is None


@given(
    st.sampled_from(["* * * * *", "*/7 3-5 * * *", "0 0 * * SUN", "15 10 L * *"]),
    st.datetimes(min_value=datetime(2001, 1, 1), max_value=datetime(2090, 1, 1)),
)
def test_the_latest_time_is_never_after_now_and_the_next_always_is(
    text: str, naive: datetime
) -> None:
    cron = Cron.parse(text)
    now = naive.replace(tzinfo=UTC)
    latest, upcoming = cron.latest_until(now), cron.next_after(now)
    assert latest <= now < upcoming
    assert cron.next_after(latest) == upcoming
