"""Caps, budgets and capacity hold under concurrency: many simultaneous route calls,
from several services (as several processes would be), on real databases."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ductor_core.expressions import engine_by_name
from ductor_routing import Cap, CounterScope, KindSchema, Member, Pool, Worker
from ductor_routing.pools import Budget, Window
from ductor_server.engine.clock import ManualClock
from ductor_server.routing import RoutingTx
from ductor_server.services.routing import RouteBody, RoutingService, RulesBody, counter_text
from ductor_server.storage import Store, open_store
from ductor_server.storage.protocol import Store as StoreProtocol

NOON = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
TENANT = "t-conc"


async def _open(target: str) -> Store:
    store = open_store(target)
    await store.open()
    await store.migrate()
    return store


async def configure(
    service: RoutingService, *, workers: int, cap: int, capacity: int | None, budget: int | None
) -> None:
    for i in range(workers):
        await service.put_worker(
            TENANT,
            Worker(id=f"w{i}", capacity={} if capacity is None else {"leads": capacity}),
        )
    members = tuple(
        Member(
            worker=f"w{i}",
            caps=(Cap(window=Window.DAY, limit=cap),),
            budget=None if budget is None else Budget(limit=budget, window=Window.DAY),
            bid=1_000_000,
        )
        for i in range(workers)
    )
    await service.put_pool(TENANT, Pool(id="tight", channel="leads", members=members))
    await service.publish_rules(TENANT, _rules())


def _rules() -> RulesBody:
    return RulesBody(kinds={"lead": KindSchema()}, default_pool="tight")


async def assignment_counts(store: StoreProtocol) -> Counter[str]:
    async with store.transaction() as tx:
        counts = await RoutingTx(tx).count_assignments(TENANT)
    out: Counter[str] = Counter()
    for (_, worker, status), n in counts.items():
        if status in ("assigned", "accepted"):
            out[worker] += n
    return out


async def storm(services: list[RoutingService], calls: int) -> list[str | None]:
    async def one(i: int) -> str | None:
        service = services[i % len(services)]
        decision = await service.route(TENANT, RouteBody(id=f"lead-{i}", kind="lead"))
        return decision.value.worker

    return list(await asyncio.gather(*(one(i) for i in range(calls))))


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
async def test_simultaneous_decisions_never_overfill_a_cap(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    target = (
        request.getfixturevalue("postgres_url") if backend == "postgres" else str(tmp_path / "db")
    )
    clock = ManualClock(NOON)
    # Four services on four connection pools: four "processes" racing for the same rows.
    stores = [await _open(target) for _ in range(4)]
    engine = engine_by_name("cel-rust")
    services = [RoutingService(s, engine=engine, clock=clock) for s in stores]
    try:
        await configure(services[0], workers=5, cap=3, capacity=None, budget=None)
        picks = await storm(services, 120)
        per_worker = Counter(p for p in picks if p is not None)
        assert max(per_worker.values()) <= 3
        # Demand far exceeds supply, so every slot is used, and no more.
        assert sum(per_worker.values()) == 15
        assert picks.count(None) == 105
        assert await assignment_counts(stores[0]) == per_worker
        router = await services[0]._router(TENANT)
        async with stores[0].transaction() as tx:
            rtx = RoutingTx(tx)
            keys = [k for k in router.counter_keys("tight", NOON) if k.scope is CounterScope.CAP]
            values = await rtx.read_counters(TENANT, [counter_text(k) for k in keys])
        assert sorted(values.values()) == [3, 3, 3, 3, 3]
        if backend == "postgres":
            # Snapshots went stale under the storm: the commit caught it and routed again.
            assert sum(s.conflicts for s in services) > 0
        # The next day the caps open again.
        clock.advance(timedelta(days=1))
        assert (await services[1].route(TENANT, RouteBody(id="tomorrow", kind="lead"))).value.worker
    finally:
        for s in stores:
            await s.close()


async def test_capacity_and_budget_hold_and_completion_frees_capacity(postgres_url: str) -> None:
    clock = ManualClock(NOON)
    stores = [await _open(postgres_url) for _ in range(3)]
    engine = engine_by_name("cel-rust")
    services = [RoutingService(s, engine=engine, clock=clock) for s in stores]
    try:
        # capacity 2 on the channel, a budget of 4 leads at 1 USD, cap far away.
        await configure(services[0], workers=3, cap=100, capacity=2, budget=4_000_000)
        picks = await storm(services, 60)
        per_worker = Counter(p for p in picks if p is not None)
        assert per_worker == {"w0": 2, "w1": 2, "w2": 2}
        # Complete everything: load goes back, budget stays spent (2 more each fit).
        async with stores[0].transaction() as tx:
            rtx = RoutingTx(tx)
            held = [
                a
                for i in range(60)
                for a in await rtx.list_assignments_of_routable(TENANT, f"lead-{i}")
            ]
        for a in held:
            await services[0].move_assignment(TENANT, a.id, "completed")
        more = Counter(p for p in await storm(services, 30) if p is not None)
        assert more == {"w0": 2, "w1": 2, "w2": 2}
        for i in range(30):
            async with stores[0].transaction() as tx:
                for a in await RoutingTx(tx).list_assignments_of_routable(TENANT, f"lead-{i}"):
                    if a.status == "assigned":
                        await services[0].move_assignment(TENANT, a.id, "completed")
        # Budget of 4 spent by everyone: nothing more today even with free capacity.
        assert Counter(p for p in await storm(services, 10) if p is not None) == Counter()
    finally:
        for s in stores:
            await s.close()


@settings(max_examples=8, deadline=None)
@given(
    caps=st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=4),
    calls=st.integers(min_value=1, max_value=25),
)
def test_property_assignments_never_exceed_caps(
    caps: list[int], calls: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    async def scenario() -> None:
        path = tmp_path_factory.mktemp("prop") / "db"
        store = await _open(str(path))
        service = RoutingService(store, engine=engine_by_name("cel-rust"), clock=ManualClock(NOON))
        try:
            for i in range(len(caps)):
                await service.put_worker(TENANT, Worker(id=f"w{i}"))
            members = tuple(
                Member(worker=f"w{i}", caps=(Cap(window=Window.TOTAL, limit=c),))
                for i, c in enumerate(caps)
            )
            await service.put_pool(TENANT, Pool(id="tight", members=members))
            await service.publish_rules(TENANT, _rules())
            picks = await storm([service], calls)
            per_worker = Counter(p for p in picks if p is not None)
            for i, c in enumerate(caps):
                assert per_worker[f"w{i}"] <= c
            assert sum(per_worker.values()) == min(calls, sum(caps))
        finally:
            await store.close()

    asyncio.run(scenario())
