"""The W3C trace context stored with runs and tasks (OpenTelemetry), read back by
another store on the same database as after a restart, and the ready-task counts
behind the `ductor.queue.depth` gauge."""

from __future__ import annotations

from datetime import timedelta

from opentelemetry import trace

from ductor_core.runs import DispatchTask
from ductor_server.engine.queuedepth import OTHER_TENANTS, readings
from ductor_server.storage import NewTask, RunRef, Store, TaskRef, open_store
from ductor_server.telemetry import MAX_TRACESTATE, context_from

from .builders import NOW, at, new_run, new_task

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
WITH_STATE = f"{PARENT} congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
LEASE = timedelta(seconds=30)


def _ids(stored: str | None) -> tuple[str, str]:
    context = context_from(stored)
    assert context is not None, stored
    span = trace.get_current_span(context).get_span_context()
    return f"{span.trace_id:032x}", f"{span.span_id:016x}"


async def test_trace_context_survives_the_store_and_a_restart(
    store: Store, store_target: str
) -> None:
    dispatch = DispatchTask(
        step_ref="call",
        attempt=1,
        step_type="STEP_TYPE_ACTION",
        handler="action:http",
        idempotency_key="r1:call:-1:1",
    )
    async with store.transaction() as tx:
        [traced, plain] = await tx.insert_runs(
            [new_run("t1", "r1", trace_context=WITH_STATE), new_run("t1", "r2")]
        )
        assert traced.run.trace_context == WITH_STATE
        assert plain.run.trace_context is None
        await tx.enqueue_tasks(
            [
                NewTask.from_dispatch("t1", "r1", dispatch, available_at=NOW, trace_context=PARENT),
                new_task("t1", "r2", "untraced"),
            ]
        )
    # Another store on the same database: what a restarted process reads.
    again = open_store(store_target)
    await again.open()
    try:
        async with again.transaction() as tx:
            runs = await tx.get_runs(
                [RunRef(tenant_id="t1", run_id="r1"), RunRef(tenant_id="t1", run_id="r2")]
            )
            leased = await tx.lease_tasks(owner="w", limit=5, lease_for=LEASE, now=NOW)
            by_step = {t.step_ref: t for t in leased}
            fetched = await tx.get_task("t1", by_step["call"].id)
            await tx.release_tasks(
                [TaskRef(tenant_id="t1", task_id=t.id) for t in leased], available_at=NOW
            )
            chosen = await tx.lease_chosen_tasks(
                [TaskRef(tenant_id="t1", task_id=by_step["call"].id)],
                owner="w2",
                lease_for=LEASE,
                now=NOW,
            )
    finally:
        await again.close()
    stored = {r.id: r.trace_context for r in runs}
    assert stored == {"r1": WITH_STATE, "r2": None}
    assert by_step["call"].trace_context == PARENT
    assert by_step["untraced"].trace_context is None
    assert fetched is not None
    assert fetched.trace_context == PARENT
    assert chosen[0] is not None
    assert chosen[0].trace_context == PARENT
    # The stored form parses back to the span that made the row.
    assert _ids(stored["r1"]) == ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
    context = context_from(WITH_STATE)
    assert context is not None
    state = trace.get_current_span(context).get_span_context().trace_state
    assert state.get("congo") == "t61rcWkgMzE"


def test_stored_trace_context_is_checked_when_read() -> None:
    assert context_from(None) is None
    assert context_from("") is None
    assert context_from("not-a-traceparent") is None
    assert context_from("00-00000000000000000000000000000000-00f067aa0ba902b7-01") is None
    assert _ids(f"{PARENT} {'x' * (MAX_TRACESTATE + 1)}")[0] == "4bf92f3577b34da6a3ce929d0e0e4736"


async def test_queue_depth_counts_ready_tasks_by_tier_and_tenant(store: Store) -> None:
    tasks = [
        *(new_task("t1", "r1", f"a{i}") for i in range(5)),
        *(new_task("t2", "r2", f"b{i}") for i in range(3)),
        *(new_task("t3", "r3", f"c{i}") for i in range(1)),
        *(new_task("t1", "r1", f"u{i}", tier=5) for i in range(2)),
        new_task("t4", "r4", "later", available_at=at(60)),  # not due: not ready
        new_task("t4", "r4", "leased"),
    ]
    async with store.transaction() as tx:
        await tx.enqueue_tasks(tasks)
        leased = await tx.lease_chosen_tasks(
            [
                TaskRef(tenant_id="t4", task_id=t.id)
                for t in await tx.ready_tasks(now=NOW, limit=100)
                if t.tenant_id == "t4"
            ],
            owner="w",
            lease_for=LEASE,
            now=NOW,
        )
        assert len(leased) == 1
        depth = await tx.queue_depth(now=NOW, tenants=3)
        everything = await tx.queue_depth(now=NOW, tenants=100)
        nothing_yet = await tx.queue_depth(now=at(-1), tenants=100)
    assert depth.tiers == {0: 9, 5: 2}
    assert depth.tenants == [(0, "t1", 5), (0, "t2", 3), (5, "t1", 2)]
    assert readings(depth) == {
        (0, "t1"): 5,
        (0, "t2"): 3,
        (5, "t1"): 2,
        (0, OTHER_TENANTS): 1,
    }
    assert readings(everything) == {(0, "t1"): 5, (0, "t2"): 3, (0, "t3"): 1, (5, "t1"): 2}
    assert readings(nothing_yet) == {}
