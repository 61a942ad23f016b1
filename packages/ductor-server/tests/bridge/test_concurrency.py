"""A workflow's `concurrency` option enforced by the task queue, on both
backends: at most `limit` steps of a key run at once (a run that waits holds
none), other keys run beside them, a rate spaces the starts; a bad option is
refused at sync with its pointer; runs an earlier release left waiting for a
slot in the slot table still start when the runs before them end; plus the
pure tick's part for those runs."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from ductor import Client, Concurrency, Context, Rate
from ductor.protocol import (
    ConcurrencyInfo,
    DescribeResponse,
    RateInfo,
    TriggerInfo,
    WorkflowInfo,
)
from ductor_core.runs import CancelRequested, Command, DispatchTask, RunStatus, TimerFired
from ductor_server.bridge.tick import BRIDGE_KIND, SLOT_TIMER, bridge_start, bridge_tick
from ductor_server.errors import RequestInvalid
from ductor_server.services import RunView
from ductor_server.services.bridge import BridgeCaller
from ductor_server.storage import NewRun, Store

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
        self.started: list[float] = []
        self.both_in = asyncio.Event()

    async def work(self, key: str, tag: Any, *, hold: float, meet: bool = False) -> Any:
        self.active[key] = self.active.get(key, 0) + 1
        self.most[key] = max(self.most.get(key, 0), self.active[key])
        overall = sum(self.active.values())
        self.most_overall = max(self.most_overall, overall)
        self.order.append(tag)
        self.started.append(asyncio.get_running_loop().time())
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
        return await ctx.step.run("leave", tracker.work, "gated", -input["n"], hold=0.0)

    @client.workflow(
        "paced", concurrency=Concurrency(rate=Rate(limit=2, period="1s"), key="input.user")
    )
    async def paced(ctx: Context, input: dict[str, Any]) -> Any:
        return await ctx.step.run("work", tracker.work, "paced", input["n"], hold=0.0)

    return client


async def _slot_rows(store: Store) -> list[tuple[Any, ...]]:
    async with store.transaction() as tx:
        rows = await tx.session.fetch_all(
            "SELECT run_id, active FROM bridge_concurrency WHERE tenant_id = %s ORDER BY seq",
            (TENANT,),
        )
    return [(r[0], bool(r[1])) for r in rows]


async def test_a_limit_of_one_runs_the_steps_of_three_runs_one_at_a_time(
    make_engine: Any,
) -> None:
    tracker = Tracker()
    async with make_engine(_app(tracker)) as engine:
        views = [
            (await engine.services.runs.trigger(TENANT, "bridge:shop:serial", None, {"n": n})).value
            for n in range(3)
        ]
        # Every run starts at once; the queue holds their steps to the limit.
        assert not any(_queued(v) for v in views)
        ended = [await engine.wait_run(v.id) for v in views]
        rows = await _slot_rows(engine.store)
    assert [v.status for v in ended] == [RunStatus.SUCCEEDED] * 3
    assert [v.output for v in ended] == [0, 1, 2]
    assert tracker.most == {"all": 1}
    assert tracker.order == [0, 1, 2]  # in creation order
    assert rows == []  # the slot table of earlier releases is not used


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


async def test_a_run_waiting_for_a_signal_holds_no_slot(make_engine: Any) -> None:
    tracker = Tracker()
    async with make_engine(_app(tracker)) as engine:
        svc = engine.services
        first, second = [
            (await svc.runs.trigger(TENANT, "bridge:shop:gated", None, {"n": n})).value
            for n in (1, 2)
        ]
        # Both get through their first step while the other waits for its signal.
        await engine.wait_run(first.id, _waiting_for("signal go"), "wait for its signal")
        await engine.wait_run(second.id, _waiting_for("signal go"), "wait for its signal")
        for run in (first, second):
            await svc.runs.signal(TENANT, run.id, "go", None, None)
        ended = [await engine.wait_run(run.id) for run in (first, second)]
    assert [v.status for v in ended] == [RunStatus.SUCCEEDED] * 2
    assert tracker.most == {"gated": 1}  # never two steps at once
    assert sorted(tracker.order) == [-2, -1, 1, 2]


async def test_a_rate_spaces_the_starts_of_a_keys_steps(make_engine: Any) -> None:
    tracker = Tracker()
    async with make_engine(_app(tracker)) as engine:
        runs = [
            (
                await engine.services.runs.trigger(
                    TENANT, "bridge:shop:paced", None, {"user": "ann", "n": n}
                )
            ).value
            for n in range(3)
        ]
        ended = [await engine.wait_run(r.id) for r in runs]
        async with engine.store.transaction() as tx:
            stored = await tx.session.fetch_all(
                "SELECT limit_key, key_concurrency, key_rate, key_burst FROM runs"
                " WHERE tenant_id = %s AND id = %s",
                (TENANT, runs[0].id),
            )
    assert [v.status for v in ended] == [RunStatus.SUCCEEDED] * 3
    assert [tuple(r) for r in stored] == [("ann", None, 2.0, 1)]
    # 2 task starts a second, one at a time: each run's step call and its
    # completing call take a start each, so step bodies begin 0.5 s apart (less
    # what the calls' own latency moves them: well under 0.2 s).
    gaps = [b - a for a, b in itertools.pairwise(tracker.started)]
    assert len(gaps) == 2
    assert min(gaps) >= 0.3


async def test_runs_left_waiting_by_an_earlier_release_start_when_their_slot_frees(
    make_engine: Any,
) -> None:
    tracker = Tracker()
    async with make_engine(_app(tracker)) as engine:
        svc = engine.services
        holder = (await svc.runs.trigger(TENANT, "bridge:shop:gated", None, {"n": 1})).value
        await engine.wait_run(holder.id, _waiting_for("signal go"), "wait for its signal")
        # As an earlier release left them: the holder has the slot, a second run
        # waits for it (PENDING, nothing dispatched).
        waiting = bridge_start(
            run_id="run_legacy",
            app_id="shop",
            workflow_id="gated",
            input={"n": 2},
            now=datetime.now(UTC),
            queued=True,
        )
        async with engine.store.transaction() as tx:
            await tx.insert_runs(
                [
                    NewRun(
                        tenant_id=TENANT,
                        family_slug="bridge:shop:gated",
                        version=1,
                        state=waiting.state,
                        kind=BRIDGE_KIND,
                        kind_state=msgspec.to_builtins(waiting.data),
                    )
                ]
            )
            for run_id, active in ((holder.id, True), ("run_legacy", False)):
                await tx.session.execute(
                    "INSERT INTO bridge_concurrency (tenant_id, run_id, family_slug, conc_key,"
                    " active, created_at) VALUES (%s, %s, %s, %s, %s, %s)",
                    (
                        TENANT,
                        run_id,
                        "bridge:shop:gated",
                        "",
                        active,
                        tx.session.to_timestamp(datetime.now(UTC)),
                    ),
                )
        assert _queued(await svc.runs.get(TENANT, "run_legacy"))
        await svc.runs.signal(TENANT, holder.id, "go", None, None)
        assert (await engine.wait_run(holder.id)).status == RunStatus.SUCCEEDED
        await engine.wait_run("run_legacy", _waiting_for("signal go"), "get the freed slot")
        await svc.runs.signal(TENANT, "run_legacy", "go", None, None)
        assert (await engine.wait_run("run_legacy")).status == RunStatus.SUCCEEDED
        assert await _slot_rows(engine.store) == []


async def test_a_sync_with_options_that_cannot_work_is_refused_saying_where(
    make_engine: Any,
) -> None:
    async with make_engine(_app(Tracker())) as engine:
        describe = DescribeResponse(
            app_id="shop",
            sdk="test",
            sdk_version="0",
            workflows=[
                WorkflowInfo(id="fine", retries=0, concurrency=ConcurrencyInfo(limit=2)),
                WorkflowInfo(
                    id="broken",
                    retries=0,
                    concurrency=ConcurrencyInfo(
                        limit=0, key="1 +", rate=RateInfo(limit=5, period="soon")
                    ),
                ),
                WorkflowInfo(id="empty", retries=0, concurrency=ConcurrencyInfo()),
                WorkflowInfo(id="slow", retries=0, timeout="zz"),
                WorkflowInfo(id="timed", retries=0, timeout="1h30m"),
                WorkflowInfo(id="instant", retries=0, timeout="0s"),
            ],
        )
        caller = BridgeCaller(tenant_id=TENANT, app_id="shop", own_key=False)
        with pytest.raises(RequestInvalid) as refused:
            await engine.services.bridge.sync(TENANT, describe, caller=caller)
    details = refused.value.details
    assert details is not None
    assert [p["pointer"] for p in details["problems"]] == [
        "/workflows/1/concurrency/limit",
        "/workflows/1/concurrency/rate/period",
        "/workflows/1/concurrency/key",
        "/workflows/2/concurrency",
        "/workflows/3/timeout",
        "/workflows/5/timeout",
    ]
    assert details["pointer"] == "/workflows/1/concurrency/limit"


async def test_a_sync_whose_key_or_match_reads_what_it_is_not_given_is_refused(
    make_engine: Any,
) -> None:
    # The key is evaluated over the run's input alone, a trigger's match over the
    # event alone: reading anything else would fail (or share one key) every time.
    async with make_engine(_app(Tracker())) as engine:
        describe = DescribeResponse(
            app_id="shop",
            sdk="test",
            sdk_version="0",
            workflows=[
                WorkflowInfo(
                    id="fine",
                    retries=0,
                    triggers=[TriggerInfo(event="paid", match="event.data.items.all(i, i > 0)")],
                    concurrency=ConcurrencyInfo(limit=2, key="input.customer"),
                ),
                WorkflowInfo(
                    id="misread",
                    retries=0,
                    triggers=[TriggerInfo(event="paid", match="event.data.id == input.id")],
                    concurrency=ConcurrencyInfo(limit=2, key="steps.a.output"),
                ),
            ],
        )
        caller = BridgeCaller(tenant_id=TENANT, app_id="shop", own_key=False)
        with pytest.raises(RequestInvalid) as refused:
            await engine.services.bridge.sync(TENANT, describe, caller=caller)
    details = refused.value.details
    assert details is not None
    assert details["problems"] == [
        {
            "pointer": "/workflows/1/triggers/0/match",
            "message": "the match reads 'input', but it sees only 'event':"
            " 'event.data.id == input.id'",
        },
        {
            "pointer": "/workflows/1/concurrency/key",
            "message": "the key reads 'steps', but it sees only 'input': 'steps.a.output'",
        },
    ]


def test_the_sdk_refuses_an_option_that_cannot_work() -> None:
    with pytest.raises(ValueError, match="limit=, a rate= or both"):
        Concurrency(key="input.user")
    with pytest.raises(ValueError, match="burst"):
        Rate(limit=2, period="1s", burst=3)
    info = Concurrency(rate=Rate(limit=100, period="60s"), key="input.user").info()
    assert msgspec.json.encode(info) == b'{"key":"input.user","rate":{"limit":100,"period":"1m"}}'


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
