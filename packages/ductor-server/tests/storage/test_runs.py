"""Runs, the run inbox, optimistic locking, listing with cursors, and history."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, timedelta

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ductor_core.runs import (
    AttemptResult,
    CancelRequested,
    ChildRunEnded,
    ErrorInfo,
    EventReceived,
    ItemState,
    RunInput,
    RunState,
    RunStatus,
    SignalReceived,
    StepState,
    StepStatus,
    TimerFired,
)
from ductor_server.storage import (
    InboxItem,
    InboxRef,
    InvalidCursor,
    NewHistoryEntry,
    NewInboxItem,
    RunRef,
    RunUpdate,
    Store,
)

from .builders import NOW, at, new_run

_TENANTS = itertools.count()

RICH_STATE = RunState(
    run_id="r1",
    status=RunStatus.RUNNING,
    input={"order": {"id": 7, "lines": [1, 2.5, "x", None, True], "név": "ünï"}},
    steps={
        "a": StepState(
            ref="a",
            status=StepStatus.SUCCEEDED,
            attempt=2,
            output={"ok": 1},
            started_at=at(1),
            finished_at=at(2),
        ),
        "b": StepState(
            ref="b",
            status=StepStatus.RETRYING,
            error=ErrorInfo(code="http.502", message="bad gateway", details={"s": 502}),
            retry_at=at(30),
            items=[ItemState(index=0, status=StepStatus.RUNNING, attempt=1)],
            data={"cursor": [1, 2]},
        ),
    },
    created_at=NOW,
)


async def test_a_run_reads_back_exactly_as_written(store: Store) -> None:
    run = msgspec.structs.replace(new_run("t1", "r1"), state=RICH_STATE)
    async with store.transaction() as tx:
        [inserted] = await tx.insert_runs([run])
    async with store.transaction() as tx:
        stored = await tx.get_run("t1", "r1")
    assert inserted.created
    assert stored == inserted.run
    assert stored.state == RICH_STATE
    assert stored.input == RICH_STATE.input
    assert stored.lock_version == 0
    assert stored.status is RunStatus.RUNNING
    assert stored.created_at == NOW
    assert stored.created_at.tzinfo is not None
    assert stored.finished_at is None


async def test_an_idempotency_key_or_child_key_returns_the_existing_run(store: Store) -> None:
    async with store.transaction() as tx:
        first = await tx.insert_runs(
            [
                new_run("t1", "r1", idempotency_key="k1"),
                new_run("t1", "c1", child_key="p:s:0", parent_run_id="p", parent_step_ref="s"),
            ]
        )
        again = await tx.insert_runs(
            [
                new_run("t1", "r2", idempotency_key="k1"),
                new_run("t1", "c2", child_key="p:s:0", parent_run_id="p", parent_step_ref="s"),
                new_run("t1", "r1"),  # same id, no keys
                new_run("t2", "r3", idempotency_key="k1"),  # another tenant: its own key space
            ]
        )
        assert [r.created for r in first] == [True, True]
        assert [(r.run.id, r.created) for r in again] == [
            ("r1", False),
            ("c1", False),
            ("r1", False),
            ("r3", True),
        ]
        assert await tx.get_run("t1", "r2") is None
        # Two new runs of one batch with one key: the first is made, the second
        # answers it (one statement for the batch on Postgres).
        same = await tx.insert_runs(
            [new_run("t1", "r5", idempotency_key="k5"), new_run("t1", "r6", idempotency_key="k5")]
        )
        assert [(r.run.id, r.created) for r in same] == [("r5", True), ("r5", False)]
        found = await tx.find_run_by_idempotency_key("t1", "k1")
        assert found is not None
        assert found.id == "r1"
        assert (await tx.find_run_by_idempotency_key("t2", "k1")).id == "r3"  # type: ignore[union-attr]
        # Many keys at once, in order; a missing key (or another tenant's) is None.
        many = await tx.find_runs_by_idempotency_keys("t1", ["nope", "k1", "k1", "other"])
        assert [None if r is None else r.id for r in many] == [None, "r1", "r1", None]
        assert [r.id for r in await tx.find_runs_by_idempotency_keys("t2", ["k1"]) if r] == ["r3"]
        assert await tx.find_runs_by_idempotency_keys("t1", []) == []
        children = await tx.list_child_runs("t1", "p")
        assert [c.id for c in children] == ["c1"]
        assert await tx.list_child_runs("t1", "p", step_ref="other") == []
        assert await tx.list_child_runs("t2", "p") == []


async def test_optimistic_lock_lets_one_writer_win(store: Store) -> None:
    inserted = new_run("t1", "r1")
    # RICH_STATE's input from the start: a tick never changes a run's input.
    inserted = msgspec.structs.replace(
        inserted, state=msgspec.structs.replace(inserted.state, input=RICH_STATE.input)
    )
    async with store.transaction() as tx:
        await tx.insert_runs([inserted])
    done = msgspec.structs.replace(
        RICH_STATE,
        status=RunStatus.SUCCEEDED,
        output={"answer": 42},
        finished_at=at(60),
    )
    failed = msgspec.structs.replace(
        RICH_STATE,
        status=RunStatus.FAILED,
        error=ErrorInfo(code="x", message="y", retryable=False),
        finished_at=at(61),
    )
    async with store.transaction() as tx:
        applied = await tx.update_runs(
            [
                RunUpdate(
                    tenant_id="t1",
                    run_id="r1",
                    expected_lock_version=0,
                    state=done,
                    updated_at=at(60),
                ),
                RunUpdate(
                    tenant_id="t1",
                    run_id="r1",
                    expected_lock_version=0,
                    state=failed,
                    updated_at=at(61),
                ),
                RunUpdate(
                    tenant_id="t2",
                    run_id="r1",
                    expected_lock_version=1,
                    state=failed,
                    updated_at=at(61),
                ),
            ]
        )
    assert applied == [True, False, False]
    async with store.transaction() as tx:
        stored = await tx.get_run("t1", "r1")
        assert stored is not None
        assert stored.lock_version == 1
        assert stored.status is RunStatus.SUCCEEDED
        assert stored.output == {"answer": 42}
        assert stored.error is None
        assert stored.finished_at == at(60)
        assert stored.updated_at == at(60)
        assert stored.state == done
        # The next writer must hold the new version.
        assert await tx.update_runs(
            [
                RunUpdate(
                    tenant_id="t1",
                    run_id="r1",
                    expected_lock_version=1,
                    state=failed,
                    updated_at=at(61),
                )
            ]
        ) == [True]
        assert (await tx.get_run("t1", "r1")).lock_version == 2  # type: ignore[union-attr]


async def test_a_batch_of_updates_answers_each_run_in_order(store: Store) -> None:
    async with store.transaction() as tx:
        await tx.insert_runs([new_run("t1", f"r{i}") for i in range(3)] + [new_run("t2", "s0")])

    def update(tenant: str, run_id: str, version: int, n: int) -> RunUpdate:
        state = msgspec.structs.replace(RICH_STATE, run_id=run_id, output={"n": n})
        return RunUpdate(
            tenant_id=tenant,
            run_id=run_id,
            expected_lock_version=version,
            state=state,
            updated_at=at(n),
        )

    async with store.transaction() as tx:
        applied = await tx.update_runs(
            [
                update("t1", "r2", 0, 1),
                update("t1", "r1", 1, 2),  # stale: r1 is at version 0
                update("t2", "s0", 0, 3),
                update("t1", "s0", 0, 4),  # another tenant's run
                update("t1", "r9", 0, 5),  # no such run
                update("t1", "r0", 0, 6),
            ]
        )
    assert applied == [True, False, True, False, False, True]
    async with store.transaction() as tx:
        found = {
            (r.tenant_id, r.id): (r.lock_version, r.output, r.updated_at)
            for r in await tx.get_runs(
                [RunRef(tenant_id="t1", run_id=f"r{i}") for i in range(3)]
                + [RunRef(tenant_id="t2", run_id="s0")]
            )
        }
    assert found == {
        ("t1", "r0"): (1, {"n": 6}, at(6)),
        ("t1", "r1"): (0, None, NOW),
        ("t1", "r2"): (1, {"n": 1}, at(1)),
        ("t2", "s0"): (1, {"n": 3}, at(3)),
    }


async def test_updates_of_runs_locked_in_the_transaction_all_apply(store: Store) -> None:
    # A caller holding the rows' locks (`lock_runs`) writes without waiting for
    # the guard's answer; the runs read under the lock, at their versions.
    async with store.transaction() as tx:
        await tx.insert_runs([new_run("t1", f"r{i}") for i in range(3)] + [new_run("t2", "s0")])
    async with store.transaction() as tx:
        refs = [RunRef(tenant_id="t1", run_id="r0"), RunRef(tenant_id="t2", run_id="s0")]
        locked = [run for run, _ in await tx.lock_runs(refs)]
        assert [(r.tenant_id, r.lock_version) for r in locked] == [("t1", 0), ("t2", 0)]
        applied = await tx.update_runs(
            [
                RunUpdate(
                    tenant_id=run.tenant_id,
                    run_id=run.id,
                    expected_lock_version=run.lock_version,
                    state=msgspec.structs.replace(RICH_STATE, output={"t": run.tenant_id}),
                    updated_at=at(5),
                )
                for run in locked
            ],
            locked=True,
        )
        assert applied == [True, True]
        # Read back in the same transaction: the queued update went first.
        mine = await tx.get_run("t1", "r0")
        assert mine is not None
        assert (mine.lock_version, mine.output) == (1, {"t": "t1"})
    async with store.transaction() as tx:
        found = {
            (r.tenant_id, r.id): (r.lock_version, r.output)
            for r in await tx.get_runs(
                [RunRef(tenant_id="t1", run_id=f"r{i}") for i in range(3)]
                + [RunRef(tenant_id="t2", run_id="s0")]
            )
        }
    assert found == {
        ("t1", "r0"): (1, {"t": "t1"}),
        ("t1", "r1"): (0, None),
        ("t1", "r2"): (0, None),
        ("t2", "s0"): (1, {"t": "t2"}),
    }


async def test_run_statuses_answer_each_ref_in_order(store: Store) -> None:
    async with store.transaction() as tx:
        await tx.insert_runs(
            [
                new_run("t1", "r0"),
                new_run("t1", "r1", status=RunStatus.SUCCEEDED),
                new_run("t2", "s0", status=RunStatus.CANCELLED),
            ]
        )
    async with store.read() as tx:
        found = await tx.run_statuses(
            [
                RunRef(tenant_id="t1", run_id="r1"),
                RunRef(tenant_id="t2", run_id="r0"),  # another tenant's id
                RunRef(tenant_id="t1", run_id="r0"),
                RunRef(tenant_id="t1", run_id="nope"),
                RunRef(tenant_id="t2", run_id="s0"),
                RunRef(tenant_id="t1", run_id="r1"),  # named twice
            ]
        )
        assert await tx.run_statuses([]) == []
    assert found == [
        RunStatus.SUCCEEDED,
        None,
        RunStatus.RUNNING,
        None,
        RunStatus.CANCELLED,
        RunStatus.SUCCEEDED,
    ]


async def test_concurrent_writers_of_one_version_never_both_apply(store: Store) -> None:
    async with store.transaction() as tx:
        await tx.insert_runs([new_run("t1", "r1")])

    async def write(tag: int) -> bool:
        state = msgspec.structs.replace(RICH_STATE, output={"writer": tag})
        async with store.transaction() as tx:
            [ok] = await tx.update_runs(
                [
                    RunUpdate(
                        tenant_id="t1",
                        run_id="r1",
                        expected_lock_version=0,
                        state=state,
                        updated_at=NOW,
                    )
                ]
            )
            return ok

    results = await asyncio.gather(*(write(i) for i in range(6)))
    assert results.count(True) == 1
    async with store.transaction() as tx:
        stored = await tx.get_run("t1", "r1")
    assert stored is not None
    assert stored.lock_version == 1
    assert stored.output == {"writer": results.index(True)}


ALL_INPUTS: list[RunInput] = [
    AttemptResult(step_ref="a", attempt=1, ok=True, output={"x": 1}),
    AttemptResult(
        step_ref="a", item_index=3, attempt=2, ok=False, error=ErrorInfo(code="c", message="m")
    ),
    TimerFired(timer_id="a:-1:retry:1"),
    EventReceived(event_id="e1", name="order.shipped", data={"id": 1}),
    SignalReceived(signal_id="s1", name="approve", payload=[1, 2]),
    ChildRunEnded(step_ref="sub", child_run_id="c1", status=RunStatus.SUCCEEDED, output=5),
    CancelRequested(reason="user"),
]


async def test_inbox_round_trips_every_input_in_order(store: Store) -> None:
    async with store.transaction() as tx:
        await tx.insert_runs([new_run("t1", "r1"), new_run("t1", "r2")])
        seqs = await tx.enqueue_inbox(
            [
                NewInboxItem(tenant_id="t1", run_id="r1", input=i, available_at=NOW)
                for i in ALL_INPUTS
            ]
        )
        assert seqs == sorted(seqs)
        assert len(set(seqs)) == len(seqs)
    async with store.transaction() as tx:
        claimed = await tx.claim_runs_with_inbox(now=NOW, limit=10)
        assert claimed == [RunRef(tenant_id="t1", run_id="r1")]
        items = await tx.load_inbox(claimed, now=NOW)
        assert [i.input for i in items] == ALL_INPUTS
        assert [i.seq for i in items] == seqs
        assert await tx.load_inbox(claimed, now=NOW, limit_per_run=2) == items[:2]
        assert await tx.delete_inbox([InboxRef(tenant_id="t1", seq=i.seq) for i in items]) == 7
    async with store.transaction() as tx:
        assert await tx.claim_runs_with_inbox(now=NOW, limit=10) == []


async def test_an_inbox_load_stops_at_a_number_of_items_and_a_length_of_json(
    store: Store,
) -> None:
    def signal(run: str, n: int, size: int) -> NewInboxItem:
        payload = "x" * size
        sent = SignalReceived(signal_id=f"{run}-{n}", name="go", payload=payload)
        return NewInboxItem(tenant_id="t1", run_id=run, input=sent, available_at=NOW)

    sizes = [3000, 3000, 100, 5000, 10]
    async with store.transaction() as tx:
        await tx.insert_runs([new_run("t1", "r1"), new_run("t1", "r2")])
        await tx.enqueue_inbox([signal("r1", n, size) for n, size in enumerate(sizes)])
        await tx.enqueue_inbox([signal("r2", n, 50) for n in range(3)])
    one = [RunRef(tenant_id="t1", run_id="r1")]
    both = [*one, RunRef(tenant_id="t1", run_id="r2")]

    def ids(items: list[InboxItem]) -> list[str]:
        return [i.input.signal_id for i in items if isinstance(i.input, SignalReceived)]

    async with store.transaction() as tx:
        everything = await tx.load_inbox(both, now=NOW, size_per_run=0)
        assert ids(everything) == ["r1-0", "r1-1", "r1-2", "r1-3", "r1-4", "r2-0", "r2-1", "r2-2"]
        # Each input's JSON is a little longer than its payload: the items whose
        # lengths before them add up to under the limit are taken.
        assert ids(await tx.load_inbox(one, now=NOW, size_per_run=6000)) == ["r1-0", "r1-1"]
        assert ids(await tx.load_inbox(one, now=NOW, size_per_run=6300)) == [
            "r1-0",
            "r1-1",
            "r1-2",
        ]
        # The first item is always taken, however long; every run has its own limit.
        assert ids(await tx.load_inbox(both, now=NOW, size_per_run=10)) == ["r1-0", "r2-0"]
        assert ids(await tx.load_inbox(both, now=NOW, size_per_run=6300, limit_per_run=2)) == [
            "r1-0",
            "r1-1",
            "r2-0",
            "r2-1",
        ]
        # The default takes a few megabytes: all of these.
        assert await tx.load_inbox(both, now=NOW) == everything


async def test_a_run_keeps_its_kind_and_the_kinds_own_state(store: Store) -> None:
    bookkeeping = {"app_id": "shop", "history": [{"id": "s1"}], "seq": 3}
    async with store.transaction() as tx:
        [dag, other] = await tx.insert_runs(
            [
                new_run("t1", "r1"),
                new_run("t1", "r2", kind="bridge", kind_state=bookkeeping),
            ]
        )
    assert (dag.run.kind, dag.run.kind_state) == ("dag", None)
    assert (other.run.kind, other.run.kind_state) == ("bridge", bookkeeping)
    async with store.transaction() as tx:
        stored = await tx.get_runs(
            [RunRef(tenant_id="t1", run_id="r1"), RunRef(tenant_id="t1", run_id="r2")]
        )
        assert stored == [dag.run, other.run]
        moved = {**bookkeeping, "seq": 4}
        assert await tx.update_runs(
            [
                RunUpdate(
                    tenant_id="t1",
                    run_id="r2",
                    expected_lock_version=0,
                    state=other.run.state,
                    updated_at=at(1),
                    kind_state=moved,
                )
            ]
        ) == [True]
    async with store.transaction() as tx:
        after = await tx.get_run("t1", "r2")
    assert after is not None
    assert (after.kind, after.kind_state, after.lock_version) == ("bridge", moved, 1)


async def test_deferred_inbox_input_waits_until_its_new_time(store: Store) -> None:
    async with store.transaction() as tx:
        await tx.insert_runs([new_run("t1", "r1"), new_run("t1", "r2")])
        await tx.enqueue_inbox(
            [
                NewInboxItem(tenant_id="t1", run_id=r, input=TimerFired(timer_id=t), available_at=a)
                for r, t, a in [("r1", "x", NOW), ("r1", "later", at(99)), ("r2", "x", NOW)]
            ]
        )
    async with store.transaction() as tx:
        moved = await tx.defer_inbox([RunRef(tenant_id="t1", run_id="r1")], now=NOW, until=at(30))
        assert moved == 1  # the not-yet-available input keeps its own time
    async with store.transaction() as tx:
        assert [r.run_id for r in await tx.claim_runs_with_inbox(now=at(29), limit=10)] == ["r2"]
        assert {r.run_id for r in await tx.claim_runs_with_inbox(now=at(30), limit=10)} == {
            "r1",
            "r2",
        }
        items = await tx.load_inbox([RunRef(tenant_id="t1", run_id="r1")], now=at(99))
    assert [(i.input, i.available_at) for i in items] == [
        (TimerFired(timer_id="x"), at(30)),
        (TimerFired(timer_id="later"), at(99)),
    ]


async def test_claims_let_tenants_take_turns_whatever_came_first(store: Store) -> None:
    # Tenant "a" has a backlog of six runs with input, all older than tenant "b"'s two.
    runs = [new_run("a", f"a{i}") for i in range(6)] + [new_run("b", f"b{i}") for i in range(2)]
    async with store.transaction() as tx:
        await tx.insert_runs(runs)
        await tx.enqueue_inbox(
            [
                NewInboxItem(
                    tenant_id=run.tenant_id,
                    run_id=run.state.run_id,
                    input=TimerFired(timer_id="x"),
                    available_at=NOW,
                )
                for run in runs
            ]
        )
    async with store.transaction() as tx:
        claimed = await tx.claim_runs_with_inbox(now=NOW, limit=4)
    # Each tenant's oldest, then each one's second oldest: "b" is not behind "a"'s backlog.
    assert [r.run_id for r in claimed] == ["a0", "b0", "a1", "b1"]
    async with store.transaction() as tx:
        everything = await tx.claim_runs_with_inbox(now=NOW, limit=10)
    assert [r.run_id for r in everything] == ["a0", "b0", "a1", "b1", "a2", "a3", "a4", "a5"]


async def test_inbox_respects_available_at_and_claims_oldest_input_first(store: Store) -> None:
    async with store.transaction() as tx:
        await tx.insert_runs([new_run("t1", f"r{i}") for i in range(4)])
        await tx.enqueue_inbox(
            [
                NewInboxItem(
                    tenant_id="t1", run_id="r2", input=TimerFired(timer_id="x"), available_at=NOW
                ),
                NewInboxItem(
                    tenant_id="t1", run_id="r0", input=TimerFired(timer_id="x"), available_at=NOW
                ),
                NewInboxItem(
                    tenant_id="t1", run_id="r1", input=TimerFired(timer_id="x"), available_at=at(10)
                ),
                NewInboxItem(
                    tenant_id="t1", run_id="r2", input=TimerFired(timer_id="y"), available_at=NOW
                ),
                # an orphan input (no such run) is never claimed
                NewInboxItem(
                    tenant_id="t1", run_id="ghost", input=TimerFired(timer_id="x"), available_at=NOW
                ),
            ]
        )
    async with store.transaction() as tx:
        assert [r.run_id for r in await tx.claim_runs_with_inbox(now=NOW, limit=10)] == ["r2", "r0"]
        assert [r.run_id for r in await tx.claim_runs_with_inbox(now=NOW, limit=1)] == ["r2"]
        later = await tx.claim_runs_with_inbox(now=at(10), limit=10)
        assert [r.run_id for r in later] == ["r2", "r0", "r1"]
        # The claim that reads the runs too: the same runs in the same order, whole.
        assert await tx.claim_runs(now=at(10), limit=10) == await tx.get_runs(later)
        assert [r.id for r in await tx.claim_runs(now=NOW, limit=1)] == ["r2"]
        items = await tx.load_inbox([RunRef(tenant_id="t1", run_id="r1")], now=NOW)
        assert items == []


async def test_claimed_runs_are_skipped_by_a_concurrent_claimer(pg_store: Store) -> None:
    # Postgres only: on SQLite a second claimer waits for the single writer instead.
    store = pg_store
    async with store.transaction() as tx:
        await tx.insert_runs([new_run("t1", f"r{i}") for i in range(6)])
        await tx.enqueue_inbox(
            [
                NewInboxItem(
                    tenant_id="t1", run_id=f"r{i}", input=TimerFired(timer_id="x"), available_at=NOW
                )
                for i in range(6)
            ]
        )
    first_claimed = asyncio.Event()
    release = asyncio.Event()
    seen: dict[str, list[str]] = {}

    async def first() -> None:
        async with store.transaction() as tx:
            seen["first"] = [r.run_id for r in await tx.claim_runs_with_inbox(now=NOW, limit=3)]
            first_claimed.set()
            await release.wait()

    async def second() -> None:
        await first_claimed.wait()
        async with store.transaction() as tx:
            seen["second"] = [r.run_id for r in await tx.claim_runs_with_inbox(now=NOW, limit=10)]
            seen["reading"] = [r.id for r in await tx.claim_runs(now=NOW, limit=10)]
        release.set()

    await asyncio.wait_for(asyncio.gather(first(), second()), timeout=20)
    assert seen["first"] == ["r0", "r1", "r2"]
    assert seen["second"] == ["r3", "r4", "r5"]
    assert seen["reading"] == ["r3", "r4", "r5"]


async def test_locking_runs_passes_over_the_ones_another_transaction_holds(
    pg_store: Store,
) -> None:
    # Postgres only: on SQLite there is one writer, and every run is returned.
    store = pg_store
    async with store.transaction() as tx:
        await tx.insert_runs([new_run("t1", f"r{i}") for i in range(4)])
    held = asyncio.Event()
    release = asyncio.Event()
    seen: dict[str, list[str]] = {}

    async def holder() -> None:
        async with store.transaction() as tx:
            refs = [RunRef(tenant_id="t1", run_id=r) for r in ("r1", "r2")]
            seen["holder"] = [r.id for r, _ in await tx.lock_runs(refs)]
            held.set()
            await release.wait()

    async def other() -> None:
        await held.wait()
        async with store.transaction() as tx:
            refs = [RunRef(tenant_id="t1", run_id=f"r{i}") for i in (3, 2, 1, 0)]
            refs.append(RunRef(tenant_id="t1", run_id="missing"))
            seen["other"] = [r.id for r, _ in await tx.lock_runs(refs)]
            # One run alone goes through the one-row statement.
            one = [RunRef(tenant_id="t1", run_id="r1")]
            seen["one"] = [r.id for r, _ in await tx.lock_runs(one)]
        release.set()

    await asyncio.wait_for(asyncio.gather(holder(), other()), timeout=20)
    assert seen == {"holder": ["r1", "r2"], "other": ["r3", "r0"], "one": []}
    async with store.transaction() as tx:
        refs = [RunRef(tenant_id="t1", run_id=f"r{i}") for i in range(4)]
        assert [r.id for r, _ in await tx.lock_runs(refs)] == ["r0", "r1", "r2", "r3"]
        assert await tx.lock_runs([]) == []


async def test_locking_runs_reads_them_as_get_runs_does(store: Store) -> None:
    async with store.transaction() as tx:
        await tx.insert_runs([new_run("t1", f"r{i}") for i in range(3)])
        refs = [RunRef(tenant_id="t1", run_id=r) for r in ("r2", "nope", "r0")]
        assert [r for r, _ in await tx.lock_runs(refs)] == await tx.get_runs(refs)
        assert [r.id for r, _ in await tx.lock_runs(refs)] == ["r2", "r0"]
        # Each with whether its inbox holds input, due or not.
        later = NewInboxItem(
            tenant_id="t1", run_id="r0", input=TimerFired(timer_id="t"), available_at=at(3600)
        )
        await tx.enqueue_inbox([later])
        assert [(r.id, has) for r, has in await tx.lock_runs(refs)] == [
            ("r2", False),
            ("r0", True),
        ]


async def test_locking_runs_with_a_state_limit_leaves_out_the_longer_states(store: Store) -> None:
    small = new_run("t1", "small")
    big = new_run("t1", "big")
    big = msgspec.structs.replace(
        big, state=msgspec.structs.replace(big.state, received_ids=["x" * 5000])
    )
    async with store.transaction() as tx:
        await tx.insert_runs([small, big])
    refs = [RunRef(tenant_id="t1", run_id=r) for r in ("big", "small")]
    async with store.transaction() as tx:
        assert [r.id for r, _ in await tx.lock_runs(refs, max_state_bytes=4096)] == ["small"]
        assert [r.id for r, _ in await tx.lock_runs(refs, max_state_bytes=8192)] == [
            "big",
            "small",
        ]
        assert [r.id for r, _ in await tx.lock_runs(refs)] == ["big", "small"]
        # One run alone goes through the one-row statement.
        assert await tx.lock_runs(refs[:1], max_state_bytes=4096) == []


async def test_runs_batch_read_keeps_order_and_drops_missing(store: Store) -> None:
    async with store.transaction() as tx:
        await tx.insert_runs([new_run("t1", f"r{i}") for i in range(500)])
        refs = [RunRef(tenant_id="t1", run_id=f"r{i}") for i in (499, 3, 250)]
        refs.append(RunRef(tenant_id="t2", run_id="r1"))
        refs.append(RunRef(tenant_id="t1", run_id="nope"))
        assert [r.id for r in await tx.get_runs(refs)] == ["r499", "r3", "r250"]
        many = [RunRef(tenant_id="t1", run_id=f"r{i}") for i in range(500)]
        assert len(await tx.get_runs(many)) == 500


async def test_listing_pages_newest_first_with_filters(store: Store) -> None:
    async with store.transaction() as tx:
        runs = []
        for i in range(23):
            status = RunStatus.SUCCEEDED if i % 3 == 0 else RunStatus.RUNNING
            family = "a" if i % 2 else "b"
            # pairs of runs share a created_at: the id breaks the tie
            runs.append(
                new_run("t1", f"r{i:02d}", created_at=at(i // 2), status=status, family_slug=family)
            )
        await tx.insert_runs(runs)
        await tx.insert_runs([new_run("t2", "x", created_at=at(5))])

    async def collect(page_size: int, **filters: str) -> list[str]:
        ids: list[str] = []
        cursor = None
        while True:
            async with store.transaction() as tx:
                page = await tx.list_runs("t1", cursor=cursor, limit=page_size, **filters)
            ids += [r.id for r in page.items]
            assert len(page.items) <= page_size
            if page.next_cursor is None:
                return ids
            cursor = page.next_cursor

    newest_first = [f"r{i:02d}" for i in sorted(range(23), key=lambda i: (i // 2, i), reverse=True)]
    assert await collect(5) == newest_first
    assert await collect(23) == newest_first
    assert await collect(100) == newest_first
    assert await collect(1) == newest_first
    succeeded = [r for r in newest_first if int(r[1:]) % 3 == 0]
    assert await collect(4, status=str(RunStatus.SUCCEEDED)) == succeeded
    family_a = [r for r in newest_first if int(r[1:]) % 2]
    assert await collect(3, family_slug="a") == family_a
    both = [r for r in family_a if r in succeeded]
    assert await collect(2, family_slug="a", status=str(RunStatus.SUCCEEDED)) == both
    async with store.transaction() as tx:
        assert (await tx.list_runs("t1", family_slug="zzz")).items == []


FOREIGN_CURSORS = ["", "not-base64!", "eyJhIjoxfQ", "W10", "WyJub3QgYSBkYXRlIiwieCJd"]


async def test_a_foreign_cursor_is_invalid(store: Store) -> None:
    async with store.transaction() as tx:
        for cursor in FOREIGN_CURSORS:
            with pytest.raises(InvalidCursor) as info:
                await tx.list_runs("t1", cursor=cursor)
            assert info.value.code == "request.invalid"
        with pytest.raises(InvalidCursor):
            await tx.list_runs("t1", limit=0)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    offsets=st.lists(st.integers(min_value=0, max_value=5), min_size=0, max_size=20),
    page_size=st.integers(min_value=1, max_value=7),
)
async def test_paging_visits_every_run_once_in_order(
    store: Store, offsets: list[int], page_size: int
) -> None:
    tenant_id = f"tenant-{next(_TENANTS)}"  # a fresh tenant per example, same database
    created = {f"r{i:03d}": at(off) for i, off in enumerate(offsets)}
    async with store.transaction() as tx:
        await tx.insert_runs(
            [new_run(tenant_id, f"{tenant_id}-{rid}", created_at=c) for rid, c in created.items()]
        )
    seen: list[str] = []
    cursor = None
    for _ in range(len(offsets) + 2):
        async with store.transaction() as tx:
            page = await tx.list_runs(tenant_id, cursor=cursor, limit=page_size)
        seen += [r.id.removeprefix(f"{tenant_id}-") for r in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert cursor is None
    assert seen == sorted(created, key=lambda rid: (created[rid], rid), reverse=True)


async def test_history_keeps_append_order_per_run(store: Store) -> None:
    kinds = [f"k{i}" for i in range(12)]
    async with store.transaction() as tx:
        await tx.append_history(
            [
                NewHistoryEntry(tenant_id="t1", run_id="r1", at=at(0), kind=k, data={"i": i})
                for i, k in enumerate(kinds[:5])
            ]
        )
        await tx.append_history(
            [NewHistoryEntry(tenant_id="t1", run_id="r2", at=at(0), kind="other")]
        )
    async with store.transaction() as tx:
        # entries with older timestamps still come after: order is append order
        await tx.append_history(
            [NewHistoryEntry(tenant_id="t1", run_id="r1", at=at(-100), kind=k) for k in kinds[5:]]
        )
    async with store.transaction() as tx:
        history = await tx.list_history("t1", "r1")
        assert [h.kind for h in history] == kinds
        assert [h.seq for h in history] == sorted(h.seq for h in history)
        assert history[0].data == {"i": 0}
        assert history[0].at == at(0)
        assert history[-1].data is None
        tail = await tx.list_history("t1", "r1", after_seq=history[3].seq, limit=2)
        assert [h.kind for h in tail] == ["k4", "k5"]
        assert [h.kind for h in await tx.list_history("t1", "r2")] == ["other"]
        assert await tx.list_history("t2", "r1") == []


async def test_naive_times_are_taken_as_utc(store: Store) -> None:
    naive = NOW.replace(tzinfo=None) + timedelta(hours=1)
    async with store.transaction() as tx:
        await tx.append_history([NewHistoryEntry(tenant_id="t1", run_id="r1", at=naive, kind="k")])
        [entry] = await tx.list_history("t1", "r1")
    assert entry.at == naive.replace(tzinfo=UTC)


async def test_concurrent_triggers_with_one_idempotency_key_make_one_run(store: Store) -> None:
    async def trigger(i: int) -> tuple[str, bool]:
        async with store.transaction() as tx:
            [result] = await tx.insert_runs([new_run("t1", f"r{i}", idempotency_key="same")])
            await asyncio.sleep(0)
            return result.run.id, result.created

    results = await asyncio.gather(*(trigger(i) for i in range(6)))
    assert sum(created for _, created in results) == 1
    winner = next(run_id for run_id, created in results if created)
    assert {run_id for run_id, _ in results} == {winner}
    async with store.transaction() as tx:
        assert [r.id for r in (await tx.list_runs("t1")).items] == [winner]
