"""The durable task queue (leases, expiry, completion) and append-only attempts."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta

import msgspec
import pytest

from ductor_core.runs import DispatchTask, ErrorInfo, TimerFired
from ductor_server.storage import AttemptRecord, NewTask, Store, TaskRecord, TaskRef, TaskStatus
from ductor_server.storage.records import NewInboxItem, RunRef, TimerRecord, WaitRecord

from .builders import NOW, at, new_task

LEASE = timedelta(seconds=30)


def ref(task_id: str, tenant_id: str = "t1") -> TaskRef:
    return TaskRef(tenant_id=tenant_id, task_id=task_id)


async def test_a_task_reads_back_as_queued(store: Store) -> None:
    command = DispatchTask(
        step_ref="call",
        item_index=2,
        attempt=3,
        step_type="STEP_TYPE_ACTION",
        handler="action:http",
        payload={"url": "http://127.0.0.1/x", "body": [1, "two"]},
        idempotency_key="r1:call:2:3",
        timeout_seconds=2.5,
    )
    task = NewTask.from_dispatch("t1", "r1", command, available_at=NOW)
    later = msgspec.structs.replace(
        task, idempotency_key="r1:call:2:4", available_at=at(20), created_at=NOW
    )
    async with store.transaction() as tx:
        assert await tx.enqueue_tasks([task, task, later]) == [True, False, True]
        [leased] = await tx.lease_tasks(owner="w1", limit=10, lease_for=LEASE, now=NOW)
        stored = await tx.get_task("t1", leased.id)
        [scheduled] = await tx.lease_tasks(owner="w1", limit=10, lease_for=LEASE, now=at(25))
    assert scheduled.available_at == at(20)
    assert scheduled.created_at == NOW
    assert stored == leased
    assert (leased.step_ref, leased.item_index, leased.attempt) == ("call", 2, 3)
    assert leased.handler == "action:http"
    assert leased.payload == command.payload
    assert leased.idempotency_key == "r1:call:2:3"
    assert leased.timeout_seconds == 2.5
    assert leased.status is TaskStatus.LEASED
    assert leased.lease_owner == "w1"
    assert leased.lease_until == NOW + LEASE
    assert leased.deliveries == 1
    assert leased.created_at == NOW


async def test_leasing_order_availability_and_handlers(store: Store) -> None:
    async with store.transaction() as tx:
        await tx.enqueue_tasks(
            [
                new_task("t1", "r1", "late", available_at=at(20)),
                new_task("t1", "r1", "a", available_at=at(-2)),
                new_task("t2", "r2", "b", available_at=at(-3)),
                new_task("t1", "r1", "urgent", available_at=at(0), tier=5),
                new_task("t1", "r1", "bridge", available_at=at(-9), handler="bridge"),
            ]
        )
    async with store.transaction() as tx:
        first = await tx.lease_tasks(
            owner="w", limit=2, lease_for=LEASE, now=NOW, handlers=["action:noop"]
        )
        assert [t.step_ref for t in first] == ["urgent", "b"]
        assert await tx.lease_tasks(owner="w", limit=5, lease_for=LEASE, now=NOW, handlers=[]) == []
        rest = await tx.lease_tasks(owner="w", limit=10, lease_for=LEASE, now=NOW)
        assert [t.step_ref for t in rest] == ["bridge", "a"]
        assert await tx.lease_tasks(owner="w", limit=10, lease_for=LEASE, now=NOW) == []
        assert await tx.count_tasks(now=NOW) == {"ready": 0, "scheduled": 1, "leased": 4}
        late = await tx.lease_tasks(owner="w", limit=10, lease_for=LEASE, now=at(20))
        assert [t.step_ref for t in late] == ["late"]


async def test_an_expired_lease_is_leased_again(store: Store) -> None:
    async with store.transaction() as tx:
        await tx.enqueue_tasks([new_task("t1", "r1", "a")])
        [task] = await tx.lease_tasks(owner="w1", limit=1, lease_for=LEASE, now=NOW)
    async with store.transaction() as tx:
        # still held: nobody else gets it
        assert await tx.lease_tasks(owner="w2", limit=1, lease_for=LEASE, now=at(29)) == []
        # heartbeat by the holder pushes the lease; a stranger cannot
        assert await tx.extend_leases([ref(task.id)], owner="w2", lease_until=at(90)) == [False]
        assert await tx.extend_leases([ref(task.id)], owner="w1", lease_until=at(45)) == [True]
        assert await tx.lease_tasks(owner="w2", limit=1, lease_for=LEASE, now=at(44)) == []
        [again] = await tx.lease_tasks(owner="w2", limit=1, lease_for=LEASE, now=at(45))
    assert again.id == task.id
    assert again.idempotency_key == task.idempotency_key  # same attempt key: dedupe works
    assert again.lease_owner == "w2"
    assert again.deliveries == 2
    assert again.lease_until == at(45) + LEASE


async def test_tasks_inserted_leased_are_held_by_their_owner_and_the_rest_queued(
    store: Store,
) -> None:
    async with store.transaction() as tx:
        await tx.enqueue_tasks([new_task("t1", "r1", "dup")])
    batch = [new_task("t1", "r1", s) for s in ("a", "b", "dup", "c")]
    async with store.transaction() as tx:
        stored = await (
            await tx.enqueue_tasks_leasing_later(
                batch, [True, False, True, True], owner="w", lease_for=LEASE, now=NOW
            )
        )()
        one = await (
            await tx.enqueue_tasks_leasing_later(
                [new_task("t2", "r9", "x")], [True], owner="w", lease_for=LEASE, now=NOW
            )
        )()
    a, b, dup, c = stored
    assert dup is None  # its attempt key was queued already: nothing inserted
    assert a is not None
    assert b is not None
    assert c is not None
    assert len({a.id, b.id, c.id}) == 3
    assert (a.status, a.lease_owner, a.lease_until, a.deliveries, a.deaths) == (
        TaskStatus.LEASED,
        "w",
        NOW + LEASE,
        1,
        0,
    )
    assert (a.step_ref, a.payload, a.available_at) == ("a", {"step": "a"}, NOW)
    assert (b.status, b.lease_owner, b.lease_until, b.deliveries) == (
        TaskStatus.QUEUED,
        None,
        None,
        0,
    )
    assert one[0] is not None
    assert one[0].tenant_id == "t2"
    async with store.transaction() as tx:
        assert await tx.get_task("t1", a.id) == a
        # Only the queued ones are leased by others, until the leases run out.
        leased = await tx.lease_tasks(owner="w2", limit=10, lease_for=LEASE, now=NOW)
        assert sorted(t.step_ref for t in leased if t.tenant_id == "t1") == ["b", "dup"]
        later = await tx.lease_tasks(owner="w2", limit=10, lease_for=LEASE, now=at(100))
        assert {t.step_ref for t in later} >= {"a", "c", "x"}
        assert all(t.deaths == 1 for t in later if t.step_ref in ("a", "c", "x"))


async def test_tasks_inserted_leased_later_answer_like_the_others(store: Store) -> None:
    # Asked for after another statement (on Postgres the insert goes out with
    # it), or after COMMIT (it went out with it), twice alike.
    async with store.transaction() as tx:
        await tx.enqueue_tasks([new_task("t1", "r1", "dup")])
    async with store.transaction() as tx:

        async def later(steps: dict[str, bool]) -> Callable[[], Awaitable[list[TaskRecord | None]]]:
            tasks = [new_task("t1", "r1", step) for step in steps]
            leased = list(steps.values())
            return await tx.enqueue_tasks_leasing_later(
                tasks, leased, owner="w", lease_for=LEASE, now=NOW
            )

        first = await later({"a": True, "dup": True})
        assert await tx.count_tasks(now=NOW) == {"ready": 1, "scheduled": 0, "leased": 1}
        second = await later({"b": False, "c": True})
    a, dup = await first()
    b, c = await second()
    assert dup is None
    assert None not in (a, b, c)
    assert [(t.step_ref, t.status, t.lease_owner) for t in (a, b, c)] == [
        ("a", TaskStatus.LEASED, "w"),
        ("b", TaskStatus.QUEUED, None),
        ("c", TaskStatus.LEASED, "w"),
    ]
    assert await second() == [b, c]
    async with store.transaction() as tx:
        assert [await tx.get_task("t1", t.id) for t in (a, b, c)] == [a, b, c]


async def test_finished_tasks_are_done_for_the_next_statement_and_after_commit(
    store: Store,
) -> None:
    async with store.transaction() as tx:
        await tx.enqueue_tasks([new_task("t1", "r1", s) for s in "ab"])
        leased = await tx.lease_tasks(owner="w", limit=2, lease_for=LEASE, now=NOW)
        ids = [t.id for t in leased]
        await tx.finish_tasks([ref(ids[0]), ref(ids[1], "t2")])  # not another tenant's
        await tx.finish_tasks([])
        assert await tx.complete_tasks([ref(ids[0]), ref(ids[1])]) == [False, True]

    async def rolled_back() -> None:
        async with store.transaction() as tx:
            await tx.enqueue_tasks([new_task("t1", "r2", "c")])
            [c] = await tx.lease_tasks(owner="w", limit=1, lease_for=LEASE, now=NOW)
            await tx.finish_tasks([ref(c.id)])
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        await rolled_back()
    async with store.transaction() as tx:
        for task_id in ids:
            task = await tx.get_task("t1", task_id)
            assert task is not None
            assert task.status is TaskStatus.DONE
        assert await tx.lease_tasks(owner="w", limit=5, lease_for=LEASE, now=at(1000)) == []


async def test_completed_tasks_are_never_leased_again(store: Store) -> None:
    async with store.transaction() as tx:
        await tx.enqueue_tasks([new_task("t1", "r1", s) for s in "abc"])
        leased = await tx.lease_tasks(owner="w", limit=3, lease_for=LEASE, now=NOW)
        ids = [t.id for t in leased]
        assert await tx.complete_tasks([ref(ids[0]), ref(ids[0]), ref(ids[1], "t2")]) == [
            True,
            False,
            False,  # another tenant cannot complete it
        ]
        assert await tx.complete_tasks([ref("nope"), ref("999999")]) == [False, False]
        assert await tx.release_tasks([ref(ids[1])], available_at=at(5)) == 1
        assert await tx.release_tasks([ref(ids[0])], available_at=at(5)) == 0  # done stays done
        done = await tx.get_task("t1", ids[0])
        assert done is not None
        assert done.status is TaskStatus.DONE
        assert done.lease_owner is None
        # long after every lease expired, only the released task comes back
        later = await tx.lease_tasks(owner="w2", limit=10, lease_for=LEASE, now=at(10))
        assert [t.id for t in later] == [ids[1]]
        # ...and the one whose lease expired
        expired = await tx.lease_tasks(owner="w3", limit=10, lease_for=LEASE, now=at(100))
        assert sorted(t.id for t in expired) == sorted([ids[1], ids[2]])
        assert await tx.get_task("t1", "not-a-number") is None
        assert await tx.get_task("t2", ids[1]) is None


async def test_a_batch_of_chosen_tasks_answers_each_choice_in_order(store: Store) -> None:
    async with store.transaction() as tx:
        await tx.enqueue_tasks(
            [
                new_task("t1", "r1", "due"),
                new_task("t1", "r1", "later", available_at=at(60)),
                new_task("t2", "r2", "held"),
                new_task("t2", "r2", "due"),
            ]
        )
        ready = await tx.ready_tasks(now=at(60), limit=10)
        ids = {(t.tenant_id, t.id) for t in ready}
        by_step = {}
        for tenant, task_id in ids:
            task = await tx.get_task(tenant, task_id)
            assert task is not None
            by_step[tenant, task.step_ref] = task_id
        [held] = await tx.lease_chosen_tasks(
            [ref(by_step["t2", "held"], "t2")], owner="w0", lease_for=LEASE, now=NOW
        )
        assert held is not None
        chosen = await tx.lease_chosen_tasks(
            [
                ref(by_step["t2", "due"], "t2"),
                ref(by_step["t1", "later"]),  # not due yet
                ref(by_step["t2", "held"], "t2"),  # leased, and the lease holds
                ref(by_step["t1", "due"], "t2"),  # another tenant's task
                ref("999999"),
                ref(by_step["t1", "due"]),
            ],
            owner="w1",
            lease_for=LEASE,
            now=NOW,
        )
        assert [None if t is None else (t.tenant_id, t.step_ref) for t in chosen] == [
            ("t2", "due"),
            None,
            None,
            None,
            None,
            ("t1", "due"),
        ]
        assert all(t is None or (t.lease_owner, t.deliveries) == ("w1", 1) for t in chosen)
        assert await tx.complete_tasks(
            [ref(by_step["t1", "later"]), ref(by_step["t1", "due"]), ref(by_step["t2", "held"])]
        ) == [True, True, False]


async def test_dropping_a_runs_tasks_leaves_leased_and_other_runs_alone(store: Store) -> None:
    async with store.transaction() as tx:
        await tx.enqueue_tasks(
            [
                new_task("t1", "r1", "leased"),
                new_task("t1", "r1", "queued", available_at=at(1)),
                new_task("t1", "r2", "other", available_at=at(1)),
            ]
        )
        await tx.lease_tasks(owner="w", limit=1, lease_for=LEASE, now=NOW)
        assert await tx.drop_run_tasks("t2", "r1") == 0
        assert await tx.drop_run_tasks("t1", "r1") == 1
        rest = await tx.lease_tasks(owner="w", limit=10, lease_for=LEASE, now=at(1))
        assert [t.step_ref for t in rest] == ["other"]


async def test_clearing_ended_runs_forgets_only_what_those_runs_held(store: Store) -> None:
    # Two ended runs of t1 (one named twice): their timers and waits go and
    # their queued tasks are done, in one call (one statement per kind of row on
    # Postgres); a leased task, another run, and t2's run of the same id stay.
    def timer(tenant_id: str, run_id: str) -> TimerRecord:
        return TimerRecord(tenant_id=tenant_id, run_id=run_id, timer_id="t", fire_at=at(5))

    def wait(tenant_id: str, run_id: str) -> WaitRecord:
        return WaitRecord(
            tenant_id=tenant_id,
            run_id=run_id,
            step_ref="w",
            kind="signal",
            name="go",
            created_at=NOW,
        )

    pairs = [("t1", "r1"), ("t1", "r2"), ("t1", "r3"), ("t2", "r1")]
    async with store.transaction() as tx:
        await tx.enqueue_tasks(
            [new_task("t1", "r1", "leased")]
            + [new_task(t, r, "queued", available_at=at(1)) for t, r in pairs]
        )
        [leased] = await tx.lease_tasks(owner="w", limit=1, lease_for=LEASE, now=NOW)
        await tx.set_timers([timer(t, r) for t, r in pairs])
        await tx.add_waits([wait(t, r) for t, r in pairs])
    ended = [RunRef(tenant_id="t1", run_id=r) for r in ("r1", "r2", "r1")]
    async with store.transaction() as tx:
        await tx.clear_ended_runs(ended)
        # Seen by the transaction's next statement, and after its commit.
        assert [(t.tenant_id, t.run_id) for t in await tx.due_timers(now=at(9), limit=10)] == [
            ("t1", "r3"),
            ("t2", "r1"),
        ]
    async with store.transaction() as tx:
        assert await tx.list_run_waits("t1", "r1") == []
        assert await tx.list_run_waits("t1", "r2") == []
        assert len(await tx.list_run_waits("t1", "r3")) == 1
        assert len(await tx.list_run_waits("t2", "r1")) == 1
        assert len(await tx.due_timers(now=at(9), limit=10)) == 2
        held = await tx.get_task("t1", leased.id)
        rest = await tx.lease_tasks(owner="w", limit=10, lease_for=LEASE, now=at(1))
    assert held is not None
    assert held.status is TaskStatus.LEASED
    assert sorted((t.tenant_id, t.run_id) for t in rest) == [("t1", "r3"), ("t2", "r1")]


async def test_concurrent_leasers_get_disjoint_tasks(store: Store) -> None:
    count = 120
    async with store.transaction() as tx:
        await tx.enqueue_tasks([new_task("t1", f"r{i}", "a") for i in range(count)])

    async def leaser(name: str) -> list[str]:
        got: list[str] = []
        while True:
            async with store.transaction() as tx:
                batch = await tx.lease_tasks(owner=name, limit=7, lease_for=LEASE, now=NOW)
                await asyncio.sleep(0)  # let the others run while our rows are locked
            if not batch:
                return got
            got += [t.id for t in batch]

    results = await asyncio.wait_for(
        asyncio.gather(*(leaser(f"w{i}") for i in range(4))), timeout=60
    )
    every = [task_id for got in results for task_id in got]
    assert len(every) == count
    assert len(set(every)) == count
    if store.backend == "postgres":
        assert sum(1 for got in results if got) > 1  # really concurrent, not one after another


def attempt(
    n: int, *, ok: bool = True, output: object = None, run_id: str = "r1", tenant_id: str = "t1"
) -> AttemptRecord:
    return AttemptRecord(
        tenant_id=tenant_id,
        run_id=run_id,
        step_ref="a",
        item_index=-1,
        attempt=n,
        ok=ok,
        output=output,
        error=None if ok else ErrorInfo(code="boom", message="it broke", retryable=True),
        started_at=at(n),
        finished_at=at(n + 0.5),
    )


async def test_a_duplicate_attempt_writes_nothing(store: Store) -> None:
    async with store.transaction() as tx:
        assert await tx.record_attempts([attempt(1, ok=False)]) == [True]
        assert await tx.record_attempts(
            [attempt(1, output="second delivery"), attempt(2, output={"v": 1}), attempt(2)]
        ) == [False, True, False]
        assert await tx.record_attempts([attempt(1, tenant_id="t2")]) == [True]
    async with store.transaction() as tx:
        stored = await tx.list_attempts("t1", "r1")
    assert [(a.attempt, a.ok, a.output) for a in stored] == [(1, False, None), (2, True, {"v": 1})]
    assert stored[0].error == ErrorInfo(code="boom", message="it broke", retryable=True)
    assert stored[1].started_at == at(2)
    assert stored[1].finished_at == at(2.5)


async def test_attempts_recorded_later_answer_like_the_others(store: Store) -> None:
    # Their answer is asked for after other statements (on Postgres the insert
    # goes out with the next one that answers); asked twice, it answers the same.
    async with store.transaction() as tx:
        first = await tx.record_attempts_later([attempt(1, ok=False)])
        assert await tx.list_attempts("t1", "r1") != []  # sent with this read
        second = await tx.record_attempts_later(
            [attempt(1, output="second delivery"), attempt(2, output={"v": 1}), attempt(2)]
        )
        third = await tx.record_attempts_later([attempt(1, tenant_id="t2")])
        assert await second() == [False, True, False]  # sent now, with `third`
        assert await first() == [True]
        assert await third() == [True]
        assert await second() == [False, True, False]
        fourth = await tx.record_attempts_later([attempt(3), attempt(3)])  # sent with COMMIT
    assert await fourth() == [True, False]
    async with store.transaction() as tx:
        stored = await tx.list_attempts("t1", "r1")
    assert [(a.attempt, a.ok, a.output) for a in stored] == [
        (1, False, None),
        (2, True, {"v": 1}),
        (3, True, None),
    ]


async def test_concurrent_deliveries_of_one_attempt_record_it_once(store: Store) -> None:
    async def deliver(tag: int) -> bool:
        async with store.transaction() as tx:
            [new] = await tx.record_attempts([attempt(1, output=tag)])
            return new

    results = await asyncio.gather(*(deliver(i) for i in range(5)))
    assert results.count(True) == 1
    async with store.transaction() as tx:
        [stored] = await tx.list_attempts("t1", "r1")
    assert stored.output == results.index(True)


async def test_overdue_leases_come_before_queued_tasks(store: Store) -> None:
    async with store.transaction() as tx:
        await tx.enqueue_tasks([new_task("t1", "r1", "stuck"), new_task("t1", "r1", "stuck2")])
        await tx.lease_tasks(owner="w1", limit=2, lease_for=LEASE, now=NOW)
        await tx.enqueue_tasks([new_task("t1", "r1", "vip", tier=9, available_at=at(1))])
        first = await tx.lease_tasks(owner="w2", limit=1, lease_for=LEASE, now=at(31))
        rest = await tx.lease_tasks(owner="w2", limit=5, lease_for=LEASE, now=at(31))
    assert [t.step_ref for t in first] == ["stuck"]
    assert [t.step_ref for t in rest] == ["stuck2", "vip"]
    assert [t.deliveries for t in first + rest] == [2, 2, 1]


async def test_purging_removes_only_old_done_tasks(store: Store) -> None:
    async with store.transaction() as tx:
        await tx.enqueue_tasks(
            [
                new_task("t1", "r1", "old-done", available_at=at(0)),
                new_task("t2", "r2", "old-done-2", available_at=at(1)),
                new_task("t1", "r1", "old-queued", available_at=at(2)),
                new_task("t1", "r1", "new-done", available_at=at(50)),
            ]
        )
        leased = await tx.lease_tasks(owner="w", limit=10, lease_for=LEASE, now=at(100))
        by_step = {t.step_ref: t for t in leased}
        await tx.complete_tasks(
            [
                ref(by_step["old-done"].id),
                ref(by_step["old-done-2"].id, "t2"),
                ref(by_step["new-done"].id),
            ]
        )
        assert await tx.purge_done_tasks(created_before=at(10), limit=1) == 1
        assert await tx.purge_done_tasks(created_before=at(10)) == 1
        assert await tx.purge_done_tasks(created_before=at(10)) == 0
        assert await tx.get_task("t1", by_step["old-done"].id) is None
        assert await tx.get_task("t1", by_step["old-queued"].id) is not None
        assert await tx.get_task("t1", by_step["new-done"].id) is not None


async def test_only_an_expired_lease_counts_a_death(store: Store) -> None:
    async with store.transaction() as tx:
        await tx.enqueue_tasks([new_task("t1", "r1", "a"), new_task("t1", "r1", "b")])
    deaths: list[dict[str, int]] = []
    for n in range(4):
        now = at(40 * n)  # every earlier lease (30 s) has expired by now
        async with store.transaction() as tx:
            got = {
                t.step_ref: t
                for t in await tx.lease_tasks(owner=f"w{n}", limit=5, lease_for=LEASE, now=now)
            }
            deaths.append({k: t.deaths for k, t in sorted(got.items())})
            # b's holder stops gracefully and gives it back; a's holder dies
            assert await tx.release_tasks([ref(got["b"].id)], available_at=now) == 1
    assert deaths == [{"a": 0, "b": 0}, {"a": 1, "b": 0}, {"a": 2, "b": 0}, {"a": 3, "b": 0}]
    a_id = got["a"].id
    async with store.transaction() as tx:
        assert await tx.complete_tasks([ref(a_id)]) == [True]
        stored = await tx.get_task("t1", a_id)
        later = await tx.lease_tasks(owner="late", limit=5, lease_for=LEASE, now=at(999))
    assert stored is not None
    assert (stored.deaths, stored.deliveries) == (3, 4)
    # a completed task never comes back; b was always given back cleanly
    assert [(t.step_ref, t.deaths, t.deliveries) for t in later] == [("b", 0, 5)]


async def test_batches_larger_than_one_statement_answer_each_row_in_order(store: Store) -> None:
    # 250 rows: on Postgres three statements of at most BATCH_ROWS rows each, and
    # every answer still lands on the row it belongs to, duplicates included.
    count = 250
    tasks = [new_task("t1", f"r{i}", "a") for i in range(count)]
    again = [tasks[i] for i in range(0, count, 7)]
    async with store.transaction() as tx:
        assert await tx.enqueue_tasks(tasks[:120]) == [True] * 120
        fresh = await tx.enqueue_tasks(tasks[120:] + again + [new_task("t1", "extra", "a")])
        assert fresh == [True] * (count - 120) + [False] * len(again) + [True]
        seqs = await tx.enqueue_inbox(
            [
                NewInboxItem(
                    tenant_id="t1",
                    run_id=f"r{i % 3}",
                    input=TimerFired(timer_id=str(i)),
                    available_at=NOW,
                )
                for i in range(count)
            ]
        )
        assert seqs == sorted(seqs)
        assert len(set(seqs)) == count
        inbox = await tx.load_inbox([RunRef(tenant_id="t1", run_id="r1")], now=NOW)
        assert [i.input for i in inbox] == [TimerFired(timer_id=str(i)) for i in range(1, count, 3)]
        leased = await tx.lease_tasks(owner="w", limit=count + 1, lease_for=LEASE, now=NOW)
        assert len(leased) == count + 1
        attempts = [
            AttemptRecord(
                tenant_id="t1",
                run_id=t.run_id,
                step_ref="a",
                item_index=-1,
                attempt=1,
                ok=True,
                output=i,
                started_at=NOW,
                finished_at=NOW,
            )
            for i, t in enumerate(leased)
        ]
        assert await tx.record_attempts(attempts[:50]) == [True] * 50
        assert await tx.record_attempts(attempts) == [False] * 50 + [True] * (count + 1 - 50)
