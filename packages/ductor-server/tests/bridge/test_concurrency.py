"""A workflow's `concurrency` option enforced by the server, on both backends:
runs beyond the limit wait PENDING and start in order as slots free, per key,
across cancels and across a restart of the runtime; plus the pure tick's part."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from typing import Any

from ductor import Client, Concurrency, Context
from ductor_core.expressions import default_engine
from ductor_core.runs import CancelRequested, Command, DispatchTask, RunStatus, TimerFired
from ductor_server.bridge.concurrency import concurrency_key
from ductor_server.bridge.tick import SLOT_TIMER, bridge_start, bridge_tick
from ductor_server.services import RunView
from ductor_server.storage import Store

from .conftest import KEY, TENANT

SLOT = "concurrency slot"


def _queued(view: RunView) -> bool:
    return view.status == RunStatus.PENDING and any(s.waiting_for == SLOT for s in view.steps)


def _waiting_for(what: str) -> Any:
    return lambda v: any(s.waiting_for == what for s in v.steps)


class Tracker:
    """Records, per key, how many step bodies run at once and the most ever seen."""

    def __init__(self) -> None:
        self.active: dict[str, int] = {}
        self.most: dict[str, int] = {}
        self.most_overall = 0
        self.order: list[Any] = []
        self.both_in = asyncio.Event()

    async def work(self, key: str, tag: Any, *, hold: float, meet: bool = False) -> Any:
        self.active[key] = self.active.get(key, 0) + 1
        self.most[key] = max(self.most.get(key, 0), self.active[key])
        overall = sum(self.active.values())
        self.most_overall = max(self.most_overall, overall)
        self.order.append(tag)
        if meet:
            # Two keys inside at once: let them both go (bounded when they never meet).
            if sum(1 for n in self.active.values() if n) >= 2:
                self.both_in.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.both_in.wait(), 5.0)
        await asyncio.sleep(hold)
        self.active[key] -= 1
        return tag


def _app(tracker: Tracker) -> Client:
    client = Client("shop", signing_key=KEY)

    @client.workflow("serial", trigger="job.queued", concurrency=1)
    async def serial(ctx: Context, input: dict[str, Any]) -> Any:
        return await ctx.step.run("work", tracker.work, "all", input["n"], hold=0.15)

    @client.workflow("per_user", concurrency=Concurrency(limit=1, key="input.user"))
    async def per_user(ctx: Context, input: dict[str, Any]) -> Any:
        return await ctx.step.run(
            "work", tracker.work, input["user"], input["n"], hold=0.15, meet=True
        )

    @client.workflow("gated", concurrency=1)
    async def gated(ctx: Context, input: dict[str, Any]) -> Any:
        await ctx.step.run("enter", tracker.work, "gated", input["n"], hold=0.0)
        await ctx.step.wait_for_signal("hold", signal="go", timeout="1h")
        return input["n"]

    return client


async def _slot_rows(store: Store) -> list[tuple[Any, ...]]:
    async with store.transaction() as tx:
        rows = await tx.session.fetch_all(
            "SELECT run_id, active FROM bridge_concurrency WHERE tenant_id = %s ORDER BY seq",
            (TENANT,),
        )
    return [(r[0], bool(r[1])) for r in rows]


async def test_a_limit_of_one_runs_three_runs_one_after_another(make_engine: Any) -> None:
    tracker = Tracker()
    async with make_engine(_app(tracker)) as engine:
        views = [
            (await engine.services.runs.trigger(TENANT, "bridge:shop:serial", None, {"n": n})).value
            for n in range(3)
        ]
        # Only the first may start; the others are created waiting for the slot.
        assert [_queued(v) for v in views] == [False, True, True]
        ended = [await engine.wait_run(v.id) for v in views]
        rows = await _slot_rows(engine.store)
    assert [v.status for v in ended] == [RunStatus.SUCCEEDED] * 3
    assert [v.output for v in ended] == [0, 1, 2]
    assert tracker.most == {"all": 1}
    assert tracker.order == [0, 1, 2]  # in creation order
    assert rows == []  # ended runs leave no slot behind


async def test_runs_started_by_events_sent_at_once_never_overlap(make_engine: Any) -> None:
    tracker = Tracker()
    async with make_engine(_app(tracker)) as engine:
        accepted = await asyncio.gather(
            *(
                engine.services.events.send(TENANT, "job.queued", {"n": n}, f"evt-{n}")
                for n in range(4)
            )
        )
        run_ids = [run_id for a in accepted for run_id in a.value.runs_started]
        assert len(run_ids) == 4
        ended = [await engine.wait_run(run_id) for run_id in run_ids]
    assert [v.status for v in ended] == [RunStatus.SUCCEEDED] * 4
    assert tracker.most == {"all": 1}
    assert sorted(tracker.order) == [0, 1, 2, 3]


async def test_a_keyed_limit_serializes_same_keys_and_runs_other_keys_in_parallel(
    make_engine: Any,
) -> None:
    tracker = Tracker()
    inputs = [{"user": "ann", "n": 0}, {"user": "ann", "n": 1}, {"user": "bob", "n": 2}]
    async with make_engine(_app(tracker)) as engine:
        runs = await asyncio.gather(
            *(
                engine.services.runs.trigger(TENANT, "bridge:shop:per_user", None, i, None)
                for i in inputs
            )
        )
        ended = [await engine.wait_run(r.value.id) for r in runs]
    assert [v.status for v in ended] == [RunStatus.SUCCEEDED] * 3
    assert tracker.most == {"ann": 1, "bob": 1}  # the same key never overlaps
    assert tracker.most_overall == 2  # ...while another key runs beside it
    assert tracker.both_in.is_set()


async def test_a_cancelled_waiting_run_never_starts_and_frees_nothing(make_engine: Any) -> None:
    tracker = Tracker()
    async with make_engine(_app(tracker)) as engine:
        svc = engine.services
        first, second, third = [
            (await svc.runs.trigger(TENANT, "bridge:shop:gated", None, {"n": n})).value
            for n in range(3)
        ]
        await engine.wait_run(first.id, _waiting_for("signal go"), "hold the slot")
        await svc.runs.cancel(TENANT, second.id, "not needed")
        cancelled = await engine.wait_run(second.id)
        assert cancelled.status == RunStatus.CANCELLED
        # The cancel freed no slot: the third run still waits behind the first.
        await asyncio.sleep(0.3)
        assert _queued(await svc.runs.get(TENANT, third.id))
        assert await _slot_rows(engine.store) == [(first.id, True), (third.id, False)]
        await svc.runs.signal(TENANT, first.id, "go", None, None)
        assert (await engine.wait_run(first.id)).status == RunStatus.SUCCEEDED
        await engine.wait_run(third.id, _waiting_for("signal go"), "get the freed slot")
        await svc.runs.signal(TENANT, third.id, "go", None, None)
        assert (await engine.wait_run(third.id)).status == RunStatus.SUCCEEDED
        assert await _slot_rows(engine.store) == []
    assert tracker.order == [0, 2]  # the cancelled run never reached the app


async def test_the_limit_survives_a_restart_of_the_runtime(make_engine: Any) -> None:
    tracker = Tracker()
    client = _app(tracker)
    async with make_engine(client) as engine:
        ids = [
            (
                await engine.services.runs.trigger(TENANT, "bridge:shop:gated", None, {"n": n})
            ).value.id
            for n in range(3)
        ]
        await engine.wait_run(ids[0], _waiting_for("signal go"), "hold the slot")
        assert [_queued(await engine.services.runs.get(TENANT, i)) for i in ids] == [
            False,
            True,
            True,
        ]
    # A new runtime over the same store: the waiting runs are still waiting.
    async with make_engine(client) as engine:
        for n, run_id in enumerate(ids):
            await engine.wait_run(run_id, _waiting_for("signal go"), f"start run {n}")
            later = [await engine.services.runs.get(TENANT, i) for i in ids[n + 1 :]]
            assert all(_queued(v) for v in later)
            await engine.services.runs.signal(TENANT, run_id, "go", None, None)
            assert (await engine.wait_run(run_id)).status == RunStatus.SUCCEEDED
    assert tracker.order == [0, 1, 2]
    assert tracker.most == {"gated": 1}


# --- the pure tick and the key, without a store ------------------------------------

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _dispatches(commands: list[Command]) -> list[DispatchTask]:
    return [c for c in commands if isinstance(c, DispatchTask)]


def test_a_queued_run_dispatches_nothing_until_it_is_given_a_slot() -> None:
    start = bridge_start(
        run_id="r1", app_id="shop", workflow_id="w", input={"n": 1}, now=T0, queued=True
    )
    assert start.state.status == RunStatus.PENDING
    assert _dispatches(start.commands) == []
    [holder] = [s for s in start.state.steps.values() if s.ref == "_bridge"]
    assert holder.waiting_for == SLOT
    woken = bridge_tick(start.state, start.data, [TimerFired(timer_id=SLOT_TIMER)], T0)
    assert woken.state.status == RunStatus.RUNNING
    assert [d.step_ref for d in _dispatches(woken.commands)] == ["execute"]
    assert not woken.data.queued
    # A second wake-up (a slot given twice) is ignored and dispatches nothing more.
    again = bridge_tick(woken.state, woken.data, [TimerFired(timer_id=SLOT_TIMER)], T0)
    assert _dispatches(again.commands) == []
    assert [i.reason for i in again.ignored] == ["already holds a slot"]


def test_cancelling_a_queued_run_ends_it_without_calling_the_app() -> None:
    start = bridge_start(
        run_id="r1",
        app_id="shop",
        workflow_id="w",
        input=None,
        now=T0,
        queued=True,
        cancellable=True,
    )
    ended = bridge_tick(start.state, start.data, [CancelRequested(reason="no")], T0)
    assert ended.state.status == RunStatus.CANCELLED
    assert _dispatches(ended.commands) == []  # no on_cancel call: the body never ran


def test_the_key_is_the_cel_value_over_input_as_text() -> None:
    cel = default_engine()
    assert concurrency_key(cel, None, {"user": "ann"}) == ""
    assert concurrency_key(cel, "input.user", {"user": "ann"}) == "ann"
    assert concurrency_key(cel, "input.shard", {"shard": 3}) == "3"
    assert concurrency_key(cel, "input.missing", {"user": "ann"}) == ""
