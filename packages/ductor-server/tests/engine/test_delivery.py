"""Delivery guarantees: the http action end to end, redelivery after a lease
expiry, several engines on one store, handler timeouts and crashes."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import msgspec
import pytest
from opentelemetry import trace

from ductor_core.runs import CancelRequested, SignalReceived
from ductor_server.composition import build_services
from ductor_server.engine.actions import ActionCall, ActionRegistry, default_registry
from ductor_server.engine.clock import ManualClock
from ductor_server.engine.coordinator import REPORT_STATE_BYTES
from ductor_server.engine.fairqueue import LocalFairQueue
from ductor_server.engine.queue import InProcessWakeUp
from ductor_server.engine.runtime import Role, Runtime, RuntimeConfig
from ductor_server.engine.workers import Workers
from ductor_server.services.runs import RunRequest
from ductor_server.storage import Store
from ductor_server.storage.errors import StoreError
from ductor_server.storage.protocol import INBOX_SIZE_PER_RUN
from ductor_server.storage.records import NewInboxItem, RunRef
from ductor_server.telemetry import tracing_enabled

from .conftest import FAILED, SUCCEEDED, TENANT, TEST_CONFIG, Engine, step
from .httpsink import HttpSink


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as s:
        yield s


async def test_http_action_retries_a_503_and_sends_the_attempt_key(
    engine: Engine, sink: HttpSink
) -> None:
    await engine.publish(
        {
            "family_slug": "webhook",
            "steps": [
                {
                    "ref": "call",
                    "type": "STEP_TYPE_ACTION",
                    "args": {
                        "action": "http",
                        "params": {
                            "url": f"'{sink.url}/flaky/1'",
                            "body": "{'order': input.id}",
                            "headers": "{'X-Source': 'ductor'}",
                        },
                    },
                    "retry": {"max_attempts": 3, "initial_interval": "1s"},
                }
            ],
        }
    )
    run = await engine.trigger("webhook", {"id": "o-9"})
    done = await engine.wait_run(run.id)
    assert done.status == SUCCEEDED
    seen = sink.requests_to("/flaky")
    assert [s.headers["idempotency-key"] for s in seen] == [
        f"{run.id}:call:-1:1",
        f"{run.id}:call:-1:2",
    ]
    assert all(msgspec.json.decode(s.body) == {"order": "o-9"} for s in seen)
    assert all(s.headers["x-source"] == "ductor" for s in seen)
    output = step(done, "call").output
    assert output["status"] == 200
    assert output["body"]["key"] == f"{run.id}:call:-1:2"


async def test_http_4xx_fails_without_retry(engine: Engine, sink: HttpSink) -> None:
    await engine.publish(
        {
            "family_slug": "bad-request",
            "steps": [
                {
                    "ref": "call",
                    "type": "STEP_TYPE_ACTION",
                    "args": {"action": "http", "params": {"url": f"'{sink.url}/status/422'"}},
                }
            ],
        }
    )
    done = await engine.wait_run((await engine.trigger("bad-request", {})).id)
    assert done.status == FAILED
    assert step(done, "call").error.code == "http.422"
    assert step(done, "call").attempt == 1
    assert len(sink.requests_to("/status/422")) == 1


async def test_a_redelivered_task_is_applied_once(store: Store) -> None:
    """Worker A leases the task and stalls past its lease; worker B leases it again
    and finishes; when A finally finishes, its duplicate outcome writes nothing."""
    clock = ManualClock()
    calls: list[str] = []
    release_a = asyncio.Event()

    async def slowpoke(call: ActionCall) -> Any:
        who = "a" if not calls else "b"
        calls.append(who)
        if who == "a":
            await release_a.wait()
        return {"by": who}

    registry = default_registry()
    registry.register_action("slowpoke", slowpoke)
    roles = [Role.COORDINATOR, Role.TIMER]
    async with Runtime.start(
        store, roles=roles, config=TEST_CONFIG, clock=clock, actions=registry
    ) as runtime:
        services = build_services(runtime)
        await services.workflows.publish(
            TENANT,
            {
                "family_slug": "once",
                "steps": [{"ref": "s", "type": "STEP_TYPE_ACTION", "args": {"action": "slowpoke"}}],
            },
        )
        run = (await services.runs.trigger(TENANT, "once", None, {}, None)).value
        wake = InProcessWakeUp()
        a = Workers(store, registry, clock=clock, wake=wake, lease_seconds=10, owner="worker-a")
        b = Workers(
            store, registry, clock=clock, wake=runtime.wakeup, lease_seconds=10, owner="worker-b"
        )
        reporters = [
            asyncio.create_task(a.report_forever()),
            asyncio.create_task(b.report_forever()),
        ]
        try:
            [leased_a] = await a.lease_batch(5)
            assert await b.lease_batch(5) == []  # leased to A
            clock.advance(11)  # A's lease expires (A sends no heartbeat here)
            [leased_b] = await b.lease_batch(5)
            assert leased_b.id == leased_a.id
            assert leased_b.deliveries == 2
            view = await _wait_end(services, run.id)
            assert view.status == SUCCEEDED
            assert step(view, "s").output == {"by": "b"}
            release_a.set()
            await _until(lambda: a.redeliveries_dropped == 1)
        finally:
            for task in reporters:
                task.cancel()
            await asyncio.gather(*reporters, return_exceptions=True)
        assert calls == ["a", "b"]
        assert a.attempts_recorded == 0
        assert b.attempts_recorded == 1
        async with store.transaction() as tx:
            attempts = await tx.list_attempts(TENANT, run.id)
            task = await tx.get_task(TENANT, leased_a.id)
        assert [(x.attempt, x.output) for x in attempts] == [(1, {"by": "b"})]
        assert task is not None
        assert task.status.value == "done"
        final = await services.runs.get(TENANT, run.id)
        assert step(final, "s").output == {"by": "b"}
        assert step(final, "s").attempt == 1


async def _one_step_run(runtime: Runtime, family_slug: str, action: str) -> Any:
    services = build_services(runtime)
    await services.workflows.publish(
        TENANT,
        {
            "family_slug": family_slug,
            "steps": [{"ref": "s", "type": "STEP_TYPE_ACTION", "args": {"action": action}}],
        },
    )
    return services, (await services.runs.trigger(TENANT, family_slug, None, {}, None)).value


async def test_a_finished_task_awaiting_its_report_keeps_its_lease(store: Store) -> None:
    """The handler has finished but its outcome waits for the store (a report
    behind other writers): the heartbeat still extends the task's lease, so no
    other worker takes it over and runs its side effect a second time."""
    clock = ManualClock()
    calls: list[str] = []

    async def effect(call: ActionCall) -> Any:
        calls.append(call.idempotency_key)
        return {"n": len(calls)}

    registry = default_registry()
    registry.register_action("effect", effect)
    roles = [Role.COORDINATOR, Role.TIMER]
    async with Runtime.start(
        store, roles=roles, config=TEST_CONFIG, clock=clock, actions=registry
    ) as runtime:
        services, run = await _one_step_run(runtime, "reported-late", "effect")
        wake = InProcessWakeUp()
        # A short lease, so the heartbeat beats every 0.1 s (on the manual clock).
        a = Workers(store, registry, clock=clock, wake=wake, lease_seconds=0.3, owner="worker-a")
        b = Workers(store, registry, clock=clock, wake=wake, lease_seconds=0.3, owner="worker-b")
        [leased] = await a.lease_batch(5)
        await _until(lambda: not a._inflight)  # finished; not reported (no reporter runs)
        first = clock.now() + timedelta(seconds=0.3)
        clock.advance(0.2)
        heartbeat = asyncio.create_task(a.heartbeat_forever())
        try:
            extended = clock.now() + timedelta(seconds=0.3)
            for _ in range(200):
                async with store.transaction() as tx:
                    held = await tx.get_task(TENANT, leased.id)
                if held is not None and held.lease_until == extended:
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("the lease of the finished, unreported task was not extended")
        finally:
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)
        clock.advance(0.2)  # past the first lease, within the extended one
        assert clock.now() > first
        assert await b.lease_batch(5) == []
        reporter = asyncio.create_task(a.report_forever())
        try:
            view = await _wait_end(services, run.id)
        finally:
            reporter.cancel()
            await asyncio.gather(reporter, return_exceptions=True)
        assert view.status == SUCCEEDED
        assert calls == [f"{run.id}:s:-1:1"]
        assert a.attempts_recorded == 1
        async with store.transaction() as tx:
            task = await tx.get_task(TENANT, leased.id)
        assert task is not None
        assert task.status.value == "done"
        assert task.deliveries == 1


async def test_a_worker_does_not_rerun_its_own_task_whose_lease_ran_out(store: Store) -> None:
    """A worker stalls past its lease while its handler still runs (no heartbeat got
    through) and leases the task again itself: it does not start the handler a
    second time; the first run's outcome is the one recorded."""
    clock = ManualClock()
    calls: list[str] = []
    release = asyncio.Event()

    async def effect(call: ActionCall) -> Any:
        calls.append(call.idempotency_key)
        await release.wait()
        return {"n": len(calls)}

    registry = default_registry()
    registry.register_action("effect", effect)
    roles = [Role.COORDINATOR, Role.TIMER]
    async with Runtime.start(
        store, roles=roles, config=TEST_CONFIG, clock=clock, actions=registry
    ) as runtime:
        services, run = await _one_step_run(runtime, "stalled", "effect")
        a = Workers(
            store, registry, clock=clock, wake=InProcessWakeUp(), lease_seconds=10, owner="a"
        )
        reporter = asyncio.create_task(a.report_forever())
        try:
            [leased] = await a.lease_batch(5)
            await _until(lambda: len(calls) == 1)
            clock.advance(11)  # the lease ran out with the handler in flight
            assert await a.lease_batch(5) == []  # leased to `a` again, not started again
            assert a.stalls == 1
            await asyncio.sleep(0.05)
            assert calls == [f"{run.id}:s:-1:1"]
            release.set()
            view = await _wait_end(services, run.id)
        finally:
            reporter.cancel()
            await asyncio.gather(reporter, return_exceptions=True)
        assert view.status == SUCCEEDED
        assert step(view, "s").output == {"n": 1}
        assert calls == [f"{run.id}:s:-1:1"]
        assert a.attempts_recorded == 1
        assert a.redeliveries_dropped == 0
        async with store.transaction() as tx:
            task = await tx.get_task(TENANT, leased.id)
        assert task is not None
        assert task.status.value == "done"
        # Once reported, the worker holds it no more: a later expiry is someone else's.
        assert leased.id not in a._leased


async def _wait_end(services: Any, run_id: str) -> Any:
    for _ in range(2000):
        view = await services.runs.get(TENANT, run_id)
        if view.status.terminal:
            return view
        await asyncio.sleep(0.01)
    raise AssertionError(f"run {run_id} did not end")


async def _until(predicate: Any) -> None:
    for _ in range(2000):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


def _counted_chain(steps: int) -> tuple[ActionRegistry, dict[str, int], dict[str, Any]]:
    """A registry whose `count` action counts its calls by idempotency key, the
    counts, and a chain of `steps` such actions."""
    counts: dict[str, int] = {}

    async def count(call: ActionCall) -> Any:
        counts[call.idempotency_key] = counts.get(call.idempotency_key, 0) + 1
        await asyncio.sleep(0)
        return call.step_ref

    registry = default_registry()
    registry.register_action("count", count)
    chain = {
        "family_slug": "chain",
        "steps": [
            {"ref": f"s{i}", "type": "STEP_TYPE_ACTION", "args": {"action": "count"}}
            for i in range(steps)
        ],
        "edges": [{"source_ref": f"s{i}", "target_ref": f"s{i + 1}"} for i in range(steps - 1)],
    }
    return registry, counts, chain


def _gated_chain(gate: asyncio.Event) -> tuple[ActionRegistry, dict[str, int], dict[str, Any]]:
    """`_counted_chain(2)` whose first step answers once `gate` is set (uncounted)."""
    registry, counts, chain = _counted_chain(2)

    async def gated(call: ActionCall) -> Any:
        await gate.wait()
        return "first"

    registry.register_action("gated", gated)
    chain["steps"][0]["args"]["action"] = "gated"
    return registry, counts, chain


async def _each_ends_once(
    services: Any, slug: str, count: int, output: dict[str, Any], *, steps: int
) -> None:
    """Trigger `count` runs of `slug`, then check that each succeeded with
    `output`, every one of its `steps` steps once, and ended once."""
    started = [
        (await services.runs.trigger(TENANT, slug, None, {"i": i}, None)).value
        for i in range(count)
    ]
    for run in started:
        view = await _wait_end(services, run.id)
        assert view.status == SUCCEEDED
        assert view.output == output
        kinds = [h.kind for h in await services.runs.history(TENANT, run.id)]
        assert kinds.count("step.succeeded") == steps
        assert kinds.count("run.succeeded") == 1


async def _chains_one_at_a_time(rt: Runtime, chain: dict[str, Any], count: int) -> tuple[Any, Any]:
    """Publish `chain` and run it `count` times, one run after another, each to
    its success with every step once; return the last run and its view."""
    services = build_services(rt)
    await services.workflows.publish(TENANT, chain)
    # A trigger takes its first task at once only into a free slot: not while
    # the worker's first lease, at its start, holds them all.
    await _until(lambda: rt.workers._leasing == 0)
    steps = len(chain["steps"])
    for i in range(count):
        run = (await services.runs.trigger(TENANT, "chain", None, {"i": i}, None)).value
        view = await _wait_end(services, run.id)
        assert view.status == SUCCEEDED
        assert view.output == {f"s{steps - 1}": f"s{steps - 1}"}
        kinds = [h.kind for h in await services.runs.history(TENANT, run.id)]
        assert kinds.count("step.succeeded") == steps
    return run, view


async def test_two_engines_on_one_store_run_every_step_once(store: Store) -> None:
    clock = ManualClock()
    registry, counts, chain = _counted_chain(3)
    async with (
        Runtime.start(store, config=TEST_CONFIG, clock=clock, actions=registry) as one,
        Runtime.start(store, config=TEST_CONFIG, clock=clock, actions=registry) as two,
    ):
        await build_services(one).workflows.publish(TENANT, chain)
        runs = []
        for i in range(12):
            services = build_services(one if i % 2 else two)
            runs.append((await services.runs.trigger(TENANT, "chain", None, {"i": i}, None)).value)
        for run in runs:
            view = await _wait_end(build_services(one), run.id)
            assert view.status == SUCCEEDED
            assert view.output == {"s2": "s2"}
    assert len(counts) == 36
    assert set(counts.values()) == {1}
    assert one.coordinator.ticks + two.coordinator.ticks >= 36


async def test_several_coordinator_loops_in_one_process_tick_every_run_once(store: Store) -> None:
    # Four loops claim concurrently (on Postgres each skips the runs the others
    # hold); every step still runs once and every run ends once.
    registry, counts, chain = _counted_chain(4)
    config = dataclasses.replace(TEST_CONFIG, coordinator_loops=4)
    async with Runtime.start(store, config=config, clock=ManualClock(), actions=registry) as rt:
        loops = sorted(t.get_name() for t in rt._loops if "coordinator" in t.get_name())
        assert loops == [
            "ductor-coordinator",
            "ductor-coordinator-1",
            "ductor-coordinator-2",
            "ductor-coordinator-3",
        ]
        services = build_services(rt)
        await services.workflows.publish(TENANT, chain)
        await _each_ends_once(services, "chain", 40, {"s3": "s3"}, steps=4)
    assert len(counts) == 160
    assert set(counts.values()) == {1}
    # The trigger starts a run itself; each of its four results is one applied tick,
    # whichever loop applied it.
    assert rt.coordinator.ticks == 160


async def test_several_report_loops_report_every_attempt_once(store: Store) -> None:
    # Fan-out runs: a run's branches finish together, so their results are
    # reported by different loops at once; a run one report holds is skipped
    # by the other (its result goes to the claim). Every step runs once, every
    # attempt is recorded once, and every run ends once.
    registry, counts, _ = _counted_chain(1)
    branches = [f"b{i}" for i in range(6)]
    fan = {
        "family_slug": "fan",
        "steps": [
            {"ref": ref, "type": "STEP_TYPE_ACTION", "args": {"action": "count"}}
            for ref in ["root", *branches, "join"]
        ],
        "edges": [{"source_ref": "root", "target_ref": b} for b in branches]
        + [{"source_ref": b, "target_ref": "join"} for b in branches],
    }
    config = dataclasses.replace(TEST_CONFIG, report_loops=3)
    async with Runtime.start(store, config=config, clock=ManualClock(), actions=registry) as rt:
        loops = sorted(t.get_name() for t in rt._loops if "reports" in t.get_name())
        assert loops == [
            "ductor-worker-reports",
            "ductor-worker-reports-1",
            "ductor-worker-reports-2",
        ]
        services = build_services(rt)
        await services.workflows.publish(TENANT, fan)
        await _each_ends_once(services, "fan", 30, {"join": "join"}, steps=8)
        assert rt.workers.most_reports_at_once >= 2
    assert len(counts) == 30 * 8
    assert set(counts.values()) == {1}
    assert rt.workers.attempts_recorded == 30 * 8
    assert rt.workers.redeliveries_dropped == 0


@pytest.mark.parametrize("loops", [1, 3])
async def test_one_wake_up_sends_one_coordinator_loop_to_claim(store: Store, loops: int) -> None:
    # Runs one after another: each result's wake-up finds one run to tick. Every
    # loop woken by it would claim, and all but one would find nothing; one
    # watching loop at a time claims it, however many loops there are.
    registry, counts, chain = _counted_chain(3)
    config = dataclasses.replace(
        TEST_CONFIG, coordinator_loops=loops, poll_interval=60.0, tick_reported=False
    )
    async with Runtime.start(store, config=config, clock=ManualClock(), actions=registry) as rt:
        services = build_services(rt)
        await services.workflows.publish(TENANT, chain)
        for i in range(8):
            run = (await services.runs.trigger(TENANT, "chain", None, {"i": i}, None)).value
            assert (await _wait_end(services, run.id)).status == SUCCEEDED
        await asyncio.sleep(0.1)  # wake-ups of the last tick settle
        coordinator = rt.coordinator
        assert coordinator.ticks == 24
        # Each loop's first look at start finds nothing, and a claim may still come
        # up empty now and then (a wake-up whose input a batch in flight took); with
        # every loop woken by every wake-up, three loops made 52 empty claims here.
        assert coordinator.empty_rounds <= loops + 4, coordinator.empty_rounds
    assert len(counts) == 24


@pytest.mark.parametrize("tick_reported", [True, False])
async def test_a_workers_report_ticks_the_runs_of_its_results(
    store: Store, tick_reported: bool
) -> None:
    # Worker and coordinator in one process: each result is ticked in the
    # transaction that reports it, and the coordinator's claim is not needed.
    registry, counts, chain = _counted_chain(3)
    config = dataclasses.replace(TEST_CONFIG, poll_interval=60.0, tick_reported=tick_reported)
    async with Runtime.start(store, config=config, clock=ManualClock(), actions=registry) as rt:
        run, view = await _chains_one_at_a_time(rt, chain, 8)
        coordinator = rt.coordinator
        assert coordinator.ticks == 24
        assert coordinator.direct_batches == (24 if tick_reported else 0)
        assert coordinator.batches == 24
    assert len(counts) == 24
    assert set(counts.values()) == {1}
    # Ticked in their reports, the results never went through the inbox: the
    # next inbox row is its first (its numbers are never reused).
    async with store.transaction() as tx:
        late = CancelRequested(reason="probe")
        item = NewInboxItem(
            tenant_id=TENANT, run_id=run.id, input=late, available_at=view.updated_at
        )
        [seq] = await tx.enqueue_inbox([item])
    assert seq == (1 if tick_reported else 25)


async def test_a_run_with_a_long_state_is_ticked_by_the_claim_not_in_reports(
    store: Store,
) -> None:
    # A report's transaction carries every tenant's results: a run whose state is
    # over REPORT_STATE_BYTES is not decoded and ticked there. Its results go to
    # its inbox, and the coordinator's claim ticks them. Each step of the "long"
    # chain answers 900 characters (under the 1 KiB kept out of the state).
    steps = 80
    registry, counts, short = _counted_chain(steps)

    async def pad(call: ActionCall) -> Any:
        counts[call.idempotency_key] = counts.get(call.idempotency_key, 0) + 1
        return "x" * 900

    registry.register_action("pad", pad)
    long = {
        **short,
        "family_slug": "long",
        "steps": [{**step, "args": {"action": "pad"}} for step in short["steps"]],
    }
    assert steps * 900 > REPORT_STATE_BYTES
    config = dataclasses.replace(TEST_CONFIG, poll_interval=60.0)
    async with Runtime.start(store, config=config, clock=ManualClock(), actions=registry) as rt:
        services = build_services(rt)
        coordinator = rt.coordinator
        direct: dict[str, int] = {}
        for chain in (short, long):  # no CEL: cheap at any size
            await services.workflows.publish(TENANT, chain)
            before = coordinator.direct_batches
            slug = str(chain["family_slug"])
            run = (await services.runs.trigger(TENANT, slug, None, {}, None)).value
            view = await _wait_end(services, run.id)
            assert view.status == SUCCEEDED
            direct[slug] = coordinator.direct_batches - before
    assert direct["chain"] == steps
    # Ticked in reports until the state passed the limit, by the claim after.
    assert 0 < direct["long"] < steps - 10, direct
    assert len(counts) == 2 * steps
    assert set(counts.values()) == {1}


async def test_a_result_comes_after_stored_input_that_one_load_does_not_take(
    store: Store,
) -> None:
    # Five signals of 1 MiB wait in the run's inbox when its step reports: one
    # load takes at most INBOX_SIZE_PER_RUN of them, so the report must not tick
    # the result after only the first four. It goes to the claim, after all five.
    gate = asyncio.Event()
    registry, counts, chain = _gated_chain(gate)
    clock = ManualClock()
    config = dataclasses.replace(TEST_CONFIG, poll_interval=60.0)
    async with Runtime.start(store, config=config, clock=clock, actions=registry) as rt:
        services = build_services(rt)
        await services.workflows.publish(TENANT, chain)
        run = (await services.runs.trigger(TENANT, "chain", None, {}, None)).value
        await _until(lambda: rt.workers._inflight)
        later = clock.now() + timedelta(hours=1)  # not due yet: no claim takes them
        payload = "x" * (INBOX_SIZE_PER_RUN // 4)
        signals = [
            NewInboxItem(
                tenant_id=TENANT,
                run_id=run.id,
                input=SignalReceived(signal_id=f"big{i}", name="go", payload=payload),
                available_at=later,
            )
            for i in range(5)
        ]
        async with store.transaction() as tx:
            await tx.enqueue_inbox(signals)
        clock.advance(timedelta(hours=2))  # due now, for the report's load
        gate.set()
        view = await _wait_end(services, run.id)
        assert view.status == SUCCEEDED
        history = await services.runs.history(TENANT, run.id)
        order = [
            h.data.get("step_ref") if h.kind == "step.succeeded" else "signal"
            for h in history
            if h.kind == "step.succeeded"
            or (h.kind == "input.ignored" and h.data.get("input") == "SignalReceived")
        ]
        assert order == ["signal"] * 5 + ["s0", "s1"], order
    assert list(counts.values()) == [1]


@pytest.mark.parametrize("take_at_once", [True, False])
async def test_a_runs_next_step_goes_to_the_worker_that_ran_the_last_one(
    store: Store, take_at_once: bool
) -> None:
    # One run at a time: a run's first step is leased in the trigger's
    # transaction, each next step in the report of the step before it, and
    # each is started at once: the worker's loop leases nothing.
    registry, counts, chain = _counted_chain(4)
    config = dataclasses.replace(TEST_CONFIG, poll_interval=60.0, take_at_once=take_at_once)
    async with Runtime.start(store, config=config, clock=ManualClock(), actions=registry) as rt:
        await _chains_one_at_a_time(rt, chain, 6)
        workers = rt.workers
        assert workers.taken_at_once == (24 if take_at_once else 0)
        assert workers.lease_batches == (0 if take_at_once else 24)
        assert workers.attempts_recorded == 24
        assert workers._holding == set()
        assert workers._free() == workers.concurrency
    assert len(counts) == 24
    assert set(counts.values()) == {1}
    async with store.transaction() as tx:
        counted = await tx.count_tasks(now=ManualClock().now())
    assert counted.get("leased", 0) == 0, counted  # every lease was completed


@pytest.mark.parametrize("tick_reported", [True, False])
async def test_a_result_that_comes_after_its_run_ended_is_recorded_as_ignored_once(
    store: Store, tick_reported: bool
) -> None:
    gate = asyncio.Event()
    registry, counts, chain = _gated_chain(gate)
    config = dataclasses.replace(TEST_CONFIG, tick_reported=tick_reported)
    async with Runtime.start(store, config=config, clock=ManualClock(), actions=registry) as rt:
        services = build_services(rt)
        await services.workflows.publish(TENANT, chain)
        run = (await services.runs.trigger(TENANT, "chain", None, {}, None)).value
        await _until(lambda: rt.workers._inflight)
        await services.runs.cancel(TENANT, run.id, "enough")
        assert (await _wait_end(services, run.id)).status.value == "RUN_STATUS_CANCELLED"
        recorded = rt.workers.attempts_recorded
        ticks = rt.coordinator.ticks + rt.coordinator.batches
        gate.set()
        await _until(lambda: rt.workers.attempts_recorded > recorded)
        await _until(lambda: rt.coordinator.ticks + rt.coordinator.batches > ticks)
        await asyncio.sleep(0.1)  # a second record of it would have come by now
        history = await services.runs.history(TENANT, run.id)
        ignored = [h.data for h in history if h.kind == "input.ignored"]
        assert ignored == [
            {
                "reason": "run has ended",
                "input": "AttemptResult",
                "step_ref": "s0",
                "item_index": -1,
                "attempt": 1,
            }
        ]
        view = await services.runs.get(TENANT, run.id)
        assert view.status.value == "RUN_STATUS_CANCELLED"
    assert counts == {}


async def test_a_result_whose_run_another_transaction_holds_is_left_to_the_claim(
    pg_store: Store,
) -> None:
    # Postgres only (SQLite has one writer): the report cannot lock the run, so
    # it only queues the result, and the coordinator ticks it once the run is free.
    store = pg_store
    gate = asyncio.Event()
    registry, counts, chain = _gated_chain(gate)
    config = dataclasses.replace(TEST_CONFIG, poll_interval=0.1)
    async with Runtime.start(store, config=config, clock=ManualClock(), actions=registry) as rt:
        services = build_services(rt)
        await services.workflows.publish(TENANT, chain)
        run = (await services.runs.trigger(TENANT, "chain", None, {}, None)).value
        await _until(lambda: rt.workers._inflight)
        async with store.transaction() as tx:
            ref = RunRef(tenant_id=TENANT, run_id=run.id)
            assert [r.id for r, _ in await tx.lock_runs([ref])] == [run.id]
            reports = rt.workers.report_batches
            gate.set()
            await _until(lambda: rt.workers.report_batches > reports)
            await asyncio.sleep(0.3)  # polls of the coordinator pass over the held run
            assert rt.coordinator.ticks == 0
        view = await _wait_end(services, run.id)
        assert view.status == SUCCEEDED
        assert view.output == {"s1": "s1"}
        # The first result through the claim, the second in its report.
        assert rt.coordinator.ticks == 2
        assert rt.coordinator.direct_batches == 1
    assert list(counts.values()) == [1]


async def _fail_history_once(store: Store, kind: str, why: str, *, nth: int = 1) -> None:
    """Make the `nth` insert of a `kind` history entry fail, once, in Postgres
    itself ("injected: <why>"); the sequence `fail_once` counts the inserts."""
    async with store.transaction() as tx:
        for statement in (
            "CREATE SEQUENCE fail_once",
            "CREATE FUNCTION fail_once() RETURNS trigger LANGUAGE plpgsql AS $$"
            f" BEGIN IF NEW.kind = '{kind}' AND nextval('fail_once') = {nth} THEN"
            f" RAISE EXCEPTION 'injected: {why}';"
            " END IF; RETURN NEW; END $$",
            "CREATE TRIGGER fail_once BEFORE INSERT ON run_history"
            " FOR EACH ROW EXECUTE FUNCTION fail_once()",
        ):
            await tx.execute(statement)


async def test_a_report_that_fails_after_taking_the_next_task_loses_and_repeats_nothing(
    pg_store: Store,
) -> None:
    # Postgres only (a trigger of the database's own fails the report): the
    # report of s0 takes s1 at once, then its transaction fails at its history.
    # The queue forgets s1, the slot is free again, the retried report queues
    # the result for the claim, and the run ends with every step run once.
    store = pg_store
    await _fail_history_once(store, "step.succeeded", "the report fails after taking its next task")
    registry, counts, chain = _counted_chain(3)
    config = dataclasses.replace(TEST_CONFIG, poll_interval=60.0)
    async with Runtime.start(store, config=config, clock=ManualClock(), actions=registry) as rt:
        services = build_services(rt)
        await services.workflows.publish(TENANT, chain)
        await _until(lambda: rt.workers._leasing == 0)  # see _chains_one_at_a_time
        run = (await services.runs.trigger(TENANT, "chain", None, {}, None)).value
        view = await _wait_end(services, run.id)
        assert view.status == SUCCEEDED
        assert view.output == {"s2": "s2"}
        workers = rt.workers
        # s0 was taken by the trigger, s1's take was rolled back with its
        # report, and s2 was taken at once.
        assert workers.taken_at_once == 2
        await _until(lambda: not workers._holding and not workers._inflight)
        assert workers._free() == workers.concurrency
        queue = rt.queue
        assert isinstance(queue, LocalFairQueue)
        assert queue.scheduler.running_count == 0
    assert counts == {f"{run.id}:s{i}:-1:1": 1 for i in range(3)}
    async with store.transaction() as tx:
        counted = await tx.count_tasks(now=ManualClock().now())
        failed = await tx.fetch_one("SELECT last_value FROM fail_once")
    assert counted.get("leased", 0) == 0, counted
    # The injected failure happened: the failed insert, then the three step ends.
    assert failed == (4,)


async def test_a_trigger_that_fails_after_taking_its_first_task_loses_and_repeats_nothing(
    pg_store: Store,
) -> None:
    # Postgres only (a trigger of the database's own fails the run's creation
    # at its history, after the first task was taken at once): the queue
    # forgets the task, the slot held for it is free again, nothing is left in
    # the store, and the same trigger sent again runs every step once.
    store = pg_store
    await _fail_history_once(store, "run.created", "the trigger fails after taking its first task")
    registry, counts, chain = _counted_chain(3)
    config = dataclasses.replace(TEST_CONFIG, poll_interval=60.0)
    async with Runtime.start(store, config=config, clock=ManualClock(), actions=registry) as rt:
        services = build_services(rt)
        await services.workflows.publish(TENANT, chain)
        workers, queue = rt.workers, rt.queue
        assert isinstance(queue, LocalFairQueue)
        await _until(lambda: workers._leasing == 0)  # see _chains_one_at_a_time
        with pytest.raises(StoreError, match="injected"):
            await services.runs.trigger(TENANT, "chain", None, {}, "once")
        assert workers.taken_at_once == 0
        assert workers._free() == workers.concurrency
        assert queue.scheduler.running_count == 0  # checked to fail without the untake
        async with store.transaction() as tx:
            counted = await tx.count_tasks(now=ManualClock().now())
        assert sum(counted.values()) == 0, counted
        run = (await services.runs.trigger(TENANT, "chain", None, {}, "once")).value
        view = await _wait_end(services, run.id)
        assert view.status == SUCCEEDED
        assert workers.taken_at_once == 3  # the first step by the trigger, then two reports
        assert workers.lease_batches == 0
        await _until(lambda: not workers._holding and not workers._inflight)
        assert workers._free() == workers.concurrency
        assert queue.scheduler.running_count == 0
    assert counts == {f"{run.id}:s{i}:-1:1": 1 for i in range(3)}


async def test_an_event_hands_the_first_task_of_the_run_it_starts_to_the_worker_at_once(
    store: Store,
) -> None:
    # As a trigger does: the event's transaction leases the new run's first
    # task to this process's worker, and the reports take the rest.
    registry, counts, chain = _counted_chain(3)
    chain["triggers"] = [{"event": "order.placed"}]
    config = dataclasses.replace(TEST_CONFIG, poll_interval=60.0)
    async with Runtime.start(store, config=config, clock=ManualClock(), actions=registry) as rt:
        services = build_services(rt)
        await services.workflows.publish(TENANT, chain)
        await _until(lambda: rt.workers._leasing == 0)  # see _chains_one_at_a_time
        accepted = (await services.events.send(TENANT, "order.placed", {}, "evt-1")).value
        [run_id] = accepted.runs_started
        view = await _wait_end(services, run_id)
        assert view.status == SUCCEEDED
        assert rt.workers.taken_at_once == 3
        assert rt.workers.lease_batches == 0
    assert counts == {f"{run_id}:s{i}:-1:1": 1 for i in range(3)}


async def test_a_batch_start_hands_its_runs_first_tasks_to_the_free_slots_at_once(
    store: Store,
) -> None:
    # A batch of 6 runs with 4 free slots: its transaction leases to this
    # process's worker at once as many first tasks as one tenant may hold (all
    # slots but the fair queue's headroom) and leaves the rest to the queue,
    # which leases them once slots free up; every step runs once and every slot
    # held for the batch is given back (checked to fail when batch starts take
    # nothing).
    gate = asyncio.Event()
    registry, counts, chain = _counted_chain(2)

    async def gated(call: ActionCall) -> Any:
        await gate.wait()
        counts[call.idempotency_key] = counts.get(call.idempotency_key, 0) + 1
        return call.step_ref

    registry.register_action("gated", gated)
    chain["steps"][0]["args"]["action"] = "gated"
    config = dataclasses.replace(TEST_CONFIG, poll_interval=60.0, worker_concurrency=4)
    async with Runtime.start(store, config=config, clock=ManualClock(), actions=registry) as rt:
        services = build_services(rt)
        await services.workflows.publish(TENANT, chain)
        workers = rt.workers
        await _until(lambda: workers._leasing == 0)  # see _chains_one_at_a_time
        started = await services.runs.trigger_many(
            TENANT, [RunRequest(family_slug="chain", input={"n": n}) for n in range(6)]
        )
        assert started.value.created == 6
        queue = rt.queue
        assert isinstance(queue, LocalFairQueue)
        held = queue.scheduler.tenant_cap(4)
        assert 1 < held < 6
        assert workers.taken_at_once == held
        assert len(workers._inflight) == held
        assert workers._starting == 0
        assert workers.lease_batches == 0
        gate.set()
        for run in started.value.runs:
            assert (await _wait_end(services, run.id)).status == SUCCEEDED
        assert workers.lease_batches >= 1  # the 2 left to the queue
        await _until(lambda: not workers._holding and not workers._inflight)
        assert workers._free() == workers.concurrency
        assert queue.scheduler.running_count == 0
    assert counts == {f"{run.id}:s{i}:-1:1": 1 for run in started.value.runs for i in range(2)}


async def test_a_batch_start_that_fails_after_taking_first_tasks_loses_and_repeats_nothing(
    pg_store: Store,
) -> None:
    # Postgres only (a trigger of the database's own fails the batch at its
    # third run's history, after the first tasks were taken at once): the queue
    # forgets them, every slot held for the batch is free again, nothing is
    # left in the store, and the same batch sent again runs every step once.
    store = pg_store
    await _fail_history_once(
        store, "run.created", "the batch fails after taking first tasks", nth=3
    )
    registry, counts, chain = _counted_chain(2)
    config = dataclasses.replace(TEST_CONFIG, poll_interval=60.0)
    requests = [RunRequest(family_slug="chain", input={"n": n}) for n in range(3)]
    async with Runtime.start(store, config=config, clock=ManualClock(), actions=registry) as rt:
        services = build_services(rt)
        await services.workflows.publish(TENANT, chain)
        workers, queue = rt.workers, rt.queue
        assert isinstance(queue, LocalFairQueue)
        await _until(lambda: workers._leasing == 0)  # see _chains_one_at_a_time
        with pytest.raises(StoreError, match="injected"):
            await services.runs.trigger_many(TENANT, requests, idempotency_key="batch")
        assert workers.taken_at_once == 0
        assert workers._free() == workers.concurrency
        assert queue.scheduler.running_count == 0  # checked to fail without the untake
        async with store.transaction() as tx:
            counted = await tx.count_tasks(now=ManualClock().now())
        assert sum(counted.values()) == 0, counted
        started = await services.runs.trigger_many(TENANT, requests, idempotency_key="batch")
        for run in started.value.runs:
            assert (await _wait_end(services, run.id)).status == SUCCEEDED
        assert workers.taken_at_once == 6  # the first steps by the batch, then three reports
        assert workers.lease_batches == 0
        await _until(lambda: not workers._holding and not workers._inflight)
        assert workers._free() == workers.concurrency
        assert queue.scheduler.running_count == 0
    assert counts == {f"{run.id}:s{i}:-1:1": 1 for run in started.value.runs for i in range(2)}


def test_tracing_is_on_once_a_tracer_provider_is_set() -> None:
    # In a fresh interpreter: the global provider can be set only once.
    script = (
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from ductor_server.telemetry import tracing_enabled\n"
        "before = tracing_enabled()\n"
        "trace.set_tracer_provider(TracerProvider())\n"
        "print(before, tracing_enabled())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]


async def test_with_no_tracer_provider_steps_continue_only_a_stored_trace(store: Store) -> None:
    # No SDK is set up in this process: the engine makes no spans of its own,
    # yet a run started inside a caller's trace still runs every step in that
    # trace (the second step gets it only from its stored task), and a run
    # started outside any trace runs its steps with no current trace.
    assert not tracing_enabled()
    seen: dict[str, int | None] = {}

    async def look(call: ActionCall) -> Any:
        context = trace.get_current_span().get_span_context()
        seen[f"{call.run_id}:{call.step_ref}"] = context.trace_id if context.is_valid else None
        return call.step_ref

    registry, _, chain = _counted_chain(2)
    registry.register_action("look", look)
    for spec in chain["steps"]:
        spec["args"]["action"] = "look"
    caller = trace.SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0x00F067AA0BA902B7,
        is_remote=True,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
    )
    config = dataclasses.replace(TEST_CONFIG, poll_interval=60.0)
    async with Runtime.start(store, config=config, clock=ManualClock(), actions=registry) as rt:
        services = build_services(rt)
        await services.workflows.publish(TENANT, chain)
        with trace.use_span(trace.NonRecordingSpan(caller)):
            traced_run = (await services.runs.trigger(TENANT, "chain", None, {}, None)).value
        plain_run = (await services.runs.trigger(TENANT, "chain", None, {}, None)).value
        for run in (traced_run, plain_run):
            assert (await _wait_end(services, run.id)).status == SUCCEEDED
    assert seen == {
        f"{traced_run.id}:s0": caller.trace_id,
        f"{traced_run.id}:s1": caller.trace_id,
        f"{plain_run.id}:s0": None,
        f"{plain_run.id}:s1": None,
    }


async def test_a_runs_first_task_is_taken_at_once_only_within_its_limits(store: Store) -> None:
    # The first task of a run is scheduled as its workflow's limits say: with one
    # task of a key at once, a second run of the key waits in the queue while
    # the first holds its step, and starts once that step ends (checked to
    # fail with the task scheduled without its run's limits).
    gate = asyncio.Event()
    running: dict[str, int] = {"now": 0, "most": 0}

    async def held(call: ActionCall) -> Any:
        running["now"] += 1
        running["most"] = max(running["most"], running["now"])
        try:
            await gate.wait()
        finally:
            running["now"] -= 1
        return call.step_ref

    registry = default_registry()
    registry.register_action("held", held)
    limited = {
        "family_slug": "limited",
        "concurrency": {"limit": 1, "key": "input.customer"},
        "steps": [{"ref": "s", "type": "STEP_TYPE_ACTION", "args": {"action": "held"}}],
    }
    config = dataclasses.replace(TEST_CONFIG, poll_interval=60.0)
    async with Runtime.start(store, config=config, clock=ManualClock(), actions=registry) as rt:
        services = build_services(rt)
        await services.workflows.publish(TENANT, limited)
        await _until(lambda: rt.workers._leasing == 0)  # see _chains_one_at_a_time
        ann = [
            (await services.runs.trigger(TENANT, "limited", None, {"customer": "ann"}, None)).value
            for _ in range(2)
        ]
        # ann's first run was taken at once; her second was not (her key's one
        # slot is held) and waits its turn in the queue, once the lease loop's
        # look has seen it (a trigger in between could still be taken at once).
        assert rt.workers.taken_at_once == 1
        queue = rt.queue
        assert isinstance(queue, LocalFairQueue)
        await _until(lambda: queue.scheduler.ready_count == 1)
        bob = (
            await services.runs.trigger(TENANT, "limited", None, {"customer": "bob"}, None)
        ).value
        # So bob's was not taken at once either (something waits) but leased.
        assert rt.workers.taken_at_once == 1
        await _until(lambda: running["now"] == 2)
        await asyncio.sleep(0.2)
        assert running["now"] == 2
        gate.set()
        for run in [*ann, bob]:
            assert (await _wait_end(services, run.id)).status == SUCCEEDED
    assert running["most"] == 2


async def test_an_attempt_that_overruns_its_timeout_fails_with_step_timeout(engine: Engine) -> None:
    async def sleepy(call: ActionCall) -> Any:
        await asyncio.sleep(5)

    engine.actions.register_action("sleepy", sleepy)
    await engine.publish(
        {
            "family_slug": "timeout",
            "steps": [
                {
                    "ref": "s",
                    "type": "STEP_TYPE_ACTION",
                    "args": {"action": "sleepy"},
                    "timeout": "100ms",
                    "retry": {"max_attempts": 1},
                }
            ],
        }
    )
    done = await engine.wait_run((await engine.trigger("timeout", {})).id)
    assert done.status == FAILED
    assert step(done, "s").error.code == "step.timeout"


async def test_a_crashing_handler_fails_the_attempt_not_the_worker(engine: Engine) -> None:
    async def crash(call: ActionCall) -> Any:
        raise RuntimeError("kaboom")

    engine.actions.register_action("crash", crash)
    await engine.publish(
        {
            "family_slug": "crash",
            "steps": [
                {
                    "ref": "s",
                    "type": "STEP_TYPE_ACTION",
                    "args": {"action": "crash"},
                    "retry": {"max_attempts": 2, "initial_interval": "1s"},
                }
            ],
        }
    )
    run = await engine.trigger("crash", {})
    await engine.wait_step(run.id, "s", "retrying")
    await engine.advance(2)
    done = await engine.wait_run(run.id)
    assert done.status == FAILED
    assert step(done, "s").error.code == "handler.crashed"
    assert "kaboom" in step(done, "s").error.message
    assert step(done, "s").attempt == 2
    # The worker is still serving.
    await engine.publish(
        {
            "family_slug": "after-crash",
            "steps": [{"ref": "n", "type": "STEP_TYPE_ACTION", "args": {"action": "noop"}}],
        }
    )
    assert (await engine.wait_run((await engine.trigger("after-crash", {})).id)).status == SUCCEEDED


async def test_stopping_reports_quick_handlers_and_releases_slow_ones(store: Store) -> None:
    clock = ManualClock()
    started: list[str] = []
    gate = asyncio.Event()

    async def handler(call: ActionCall) -> Any:
        started.append(call.step_ref)
        if call.step_ref == "slow" and len(started) <= 2:
            await asyncio.sleep(30)  # outlives the stop grace: released, run again later
        elif call.step_ref == "quick":
            await gate.wait()
        return {"ref": call.step_ref}

    registry = default_registry()
    registry.register_action("h", handler)
    config = RuntimeConfig(poll_interval=0.05, lease_seconds=300, stop_grace=0.5)
    first = Runtime(store, config=config, clock=clock, actions=registry)
    first.launch()
    services = build_services(first)
    await services.workflows.publish(
        TENANT,
        {
            "family_slug": "two",
            "steps": [
                {"ref": "slow", "type": "STEP_TYPE_ACTION", "args": {"action": "h"}},
                {"ref": "quick", "type": "STEP_TYPE_ACTION", "args": {"action": "h"}},
            ],
        },
    )
    run = (await services.runs.trigger(TENANT, "two", None, {}, None)).value
    await _until(lambda: set(started) == {"slow", "quick"})
    stopping = asyncio.create_task(first.stop())
    await asyncio.sleep(0.1)
    gate.set()  # "quick" finishes inside the grace period
    await stopping
    async with store.transaction() as tx:
        attempts = await tx.list_attempts(TENANT, run.id)
        depth = await tx.count_tasks(now=clock.now())
    assert [a.step_ref for a in attempts] == ["quick"]
    assert depth["ready"] == 1  # "slow" went back to the queue, no lease to wait out
    assert depth["leased"] == 0
    async with Runtime.start(store, config=config, clock=clock, actions=registry) as second:
        done = await _wait_end(build_services(second), run.id)
    assert done.status == SUCCEEDED
    assert step(done, "slow").output == {"ref": "slow"}
    assert started.count("slow") == 2
    assert started.count("quick") == 1


async def test_roles_split_across_runtimes_cooperate_by_polling(store: Store) -> None:
    """Coordinator+timer in one runtime, workers in another, an API-only one that
    triggers: no shared wake-ups, the loops find their work by polling."""
    clock = ManualClock()
    registry = default_registry()
    async with (
        Runtime.start(store, roles=["api"], config=TEST_CONFIG, clock=clock) as api,
        Runtime.start(store, roles=["coordinator", "timer"], config=TEST_CONFIG, clock=clock),
        Runtime.start(store, roles=["worker"], config=TEST_CONFIG, clock=clock, actions=registry),
    ):
        assert api.roles == {Role.API}
        api_services = build_services(api)
        await api_services.workflows.publish(
            TENANT,
            {
                "family_slug": "split",
                "steps": [
                    {
                        "ref": "a",
                        "type": "STEP_TYPE_ACTION",
                        "args": {"action": "noop", "params": {"v": "1"}},
                    },
                    {"ref": "w", "type": "STEP_TYPE_WAIT", "args": {"duration": "1s"}},
                ],
                "edges": [{"source_ref": "a", "target_ref": "w"}],
            },
        )
        run = (await api_services.runs.trigger(TENANT, "split", None, {}, None)).value
        for _ in range(2000):
            view = await api_services.runs.get(TENANT, run.id)
            if step(view, "w").status.value == "STEP_STATUS_WAITING":
                break
            await asyncio.sleep(0.01)
        clock.advance(1)
        done = await _wait_end(api_services, run.id)
    assert done.status == SUCCEEDED
    assert step(done, "a").output == {"v": 1}
