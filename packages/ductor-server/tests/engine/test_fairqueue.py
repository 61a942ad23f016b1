"""The in-process fair queue on both backends: a late tenant is served at once,
limits hold across leases, the store's word wins over the queue's memory
(tasks taken elsewhere are refused, released and expired ones come back)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import datetime, timedelta

import pytest

from ductor_core.runs import RunState, RunStatus
from ductor_server.engine.actions import default_registry
from ductor_server.engine.clock import ManualClock
from ductor_server.engine.fairness import FairPolicy, TenantPolicy, Ticket
from ductor_server.engine.fairqueue import RESCAN_EVERY, LocalFairQueue, LookPace, Taking
from ductor_server.engine.queue import InProcessWakeUp, Topic
from ductor_server.engine.taskqueue import SqlTaskQueue
from ductor_server.engine.workers import Workers, _Taker
from ductor_server.storage import NewRun, NewTask, RunLimits, Store, TaskRecord, TaskRef, Tx
from ductor_server.storage.queuepolicies import delete_queue_policy, put_queue_policy

from .conftest import OTHER_TENANT, TENANT

MINUTE = timedelta(minutes=1)


def _task(tenant: str, name: str, now: datetime) -> NewTask:
    """A task of run `r<name>`, ready at `now`."""
    return NewTask(
        tenant_id=tenant,
        run_id=f"r{name}",
        step_ref="s",
        attempt=1,
        step_type="STEP_TYPE_ACTION",
        handler="action:noop",
        idempotency_key=f"{tenant}:{name}",
        available_at=now,
    )


async def _enqueue(store: Store, tenant: str, count: int, now: datetime, tag: str = "") -> None:
    async with store.transaction() as tx:
        await tx.enqueue_tasks([_task(tenant, f"{tag}{i}", now) for i in range(count)])


async def _one_running(
    store: Store, queue: LocalFairQueue, now: datetime, owner: str = "w"
) -> tuple[TaskRecord, Ticket]:
    """One task of TENANT queued and leased through `queue`, with its ticket: the
    step before a run's next task."""
    await _enqueue(store, TENANT, 1, now)
    [first] = await queue.lease(owner=owner, limit=1, lease_for=MINUTE, now=now)
    return first, queue.tickets_of(_refs([first]))[first.id]


async def _taking(
    queue: LocalFairQueue, tx: Tx, task: NewTask, like: Ticket, now: datetime
) -> tuple[list[str | None], list[TaskRecord]]:
    """Queue `task` as the run's next, taken at once by "w" if it may start now;
    its id and the tasks taken, read at once (a report reads them after COMMIT)."""
    taking = await queue.enqueue_taking_later(
        tx, [(task, like)], owner="w", limit=1, lease_for=MINUTE, now=now
    )
    return await taking.result()


def _refs(tasks: list[TaskRecord]) -> list[TaskRef]:
    return [TaskRef(tenant_id=t.tenant_id, task_id=t.id) for t in tasks]


async def test_a_tenant_behind_a_large_backlog_is_served_in_the_next_lease(store: Store) -> None:
    now = ManualClock().now()
    queue = LocalFairQueue(store)
    await _enqueue(store, TENANT, 300, now)
    first = await queue.lease(owner="w", limit=4, lease_for=MINUTE, now=now)
    assert {t.tenant_id for t in first} == {TENANT}
    await _enqueue(store, OTHER_TENANT, 5, now)
    # The SQL queue would hand out the oldest 296 of the first tenant first.
    leased = await queue.lease(owner="w", limit=10, lease_for=MINUTE, now=now)
    assert Counter(t.tenant_id for t in leased) == Counter({TENANT: 5, OTHER_TENANT: 5})
    assert all(t.lease_owner == "w" and t.deliveries == 1 for t in leased)


async def test_a_tenant_limit_holds_across_leases_and_frees_on_completion(store: Store) -> None:
    now = ManualClock().now()
    wake = InProcessWakeUp()
    policy = FairPolicy(tenants={TENANT: TenantPolicy(max_running=3)})
    queue = LocalFairQueue(store, policy=policy, wake=wake)
    await _enqueue(store, TENANT, 10, now)
    first = await queue.lease(owner="w", limit=10, lease_for=MINUTE, now=now)
    assert len(first) == 3
    assert await queue.lease(owner="w", limit=10, lease_for=MINUTE, now=now) == []
    assert not await wake.wait(Topic.TASKS, 0)
    async with store.transaction() as tx:
        await queue.complete(tx, _refs(first[:1]))
    assert await wake.wait(Topic.TASKS, 0)  # a held-back task can start now
    again = await queue.lease(owner="w", limit=10, lease_for=MINUTE, now=now)
    assert len(again) == 1
    assert queue.scheduler.running_of(TENANT) == 3


async def test_tasks_taken_elsewhere_are_refused_and_forgotten(store: Store) -> None:
    now = ManualClock().now()
    queue = LocalFairQueue(store, resync_seconds=3600)
    await _enqueue(store, TENANT, 6, now)
    assert len(await queue.lease(owner="w1", limit=1, lease_for=MINUTE, now=now)) == 1
    assert queue.scheduler.ready_count == 5
    other = await SqlTaskQueue(store).lease(owner="w2", limit=10, lease_for=MINUTE, now=now)
    assert len(other) == 5
    assert await queue.lease(owner="w1", limit=10, lease_for=MINUTE, now=now) == []
    assert queue.refused == 5
    assert queue.scheduler.ready_count == 0


async def test_released_and_expired_tasks_come_back(store: Store) -> None:
    now = ManualClock().now()
    queue = LocalFairQueue(store)
    await _enqueue(store, TENANT, 2, now)
    leased = await queue.lease(owner="w1", limit=2, lease_for=MINUTE, now=now)
    assert await queue.release(_refs(leased[:1]), available_at=now) == 1
    [back] = await queue.lease(owner="w1", limit=5, lease_for=MINUTE, now=now)
    assert back.id == leased[0].id
    assert back.deliveries == 2
    assert back.deaths == 0
    # A new process (a fresh queue) finds both leases expired later on.
    fresh = LocalFairQueue(store)
    later = now + 3 * MINUTE
    again = await fresh.lease(owner="w2", limit=5, lease_for=MINUTE, now=later)
    assert sorted(t.id for t in again) == sorted(t.id for t in leased)
    assert all(t.deaths == 1 and t.lease_owner == "w2" for t in again)


async def test_a_rebuild_forgets_tasks_that_ended_elsewhere(store: Store) -> None:
    now = ManualClock().now()
    queue = LocalFairQueue(store, resync_seconds=0)
    await _enqueue(store, TENANT, 4, now)
    assert len(await queue.lease(owner="w", limit=1, lease_for=MINUTE, now=now)) == 1
    async with store.transaction() as tx:
        await tx.drop_run_tasks(TENANT, "r1")
        await tx.drop_run_tasks(TENANT, "r2")
    leased = await queue.lease(owner="w", limit=5, lease_for=MINUTE, now=now)
    assert [t.run_id for t in leased] == ["r3"]
    assert queue.refused == 0  # the rebuild knew before choosing


async def _runs_with_limits(
    store: Store, tenant: str, keys: list[str], now: datetime, limits: dict[str, object]
) -> None:
    """One run per entry of `keys` (limit key, e.g. a customer), with one task each."""
    async with store.transaction() as tx:
        await tx.insert_runs(
            [
                NewRun(
                    tenant_id=tenant,
                    family_slug="sync",
                    version=1,
                    state=RunState(
                        run_id=f"{tenant}-run{i}", status=RunStatus.RUNNING, created_at=now
                    ),
                    limits=RunLimits(key=key, **limits),  # type: ignore[arg-type]
                )
                for i, key in enumerate(keys)
            ]
        )
        await tx.enqueue_tasks(
            [
                NewTask(
                    tenant_id=tenant,
                    run_id=f"{tenant}-run{i}",
                    step_ref="s",
                    attempt=1,
                    step_type="STEP_TYPE_ACTION",
                    handler="action:noop",
                    idempotency_key=f"{tenant}-run{i}:s",
                    available_at=now,
                )
                for i in range(len(keys))
            ]
        )


def _run_keys(tasks: list[TaskRecord]) -> list[str]:
    return sorted(t.run_id for t in tasks)


async def test_a_run_limit_key_holds_across_leases_and_other_keys_pass(store: Store) -> None:
    now = ManualClock().now()
    queue = LocalFairQueue(store)
    # Five runs for customer "ann" (at most 2 of its tasks at once), then one for "bob".
    await _runs_with_limits(store, TENANT, ["ann"] * 5 + ["bob"], now, {"concurrency": 2})
    first = await queue.lease(owner="w", limit=10, lease_for=MINUTE, now=now)
    assert _run_keys(first) == [f"{TENANT}-run{i}" for i in (0, 1, 5)]
    assert await queue.lease(owner="w", limit=10, lease_for=MINUTE, now=now) == []
    async with store.transaction() as tx:
        await queue.complete(tx, _refs(first[:1]))
    [next_one] = await queue.lease(owner="w", limit=10, lease_for=MINUTE, now=now)
    assert next_one.run_id == f"{TENANT}-run2"


async def test_an_operator_policy_applies_without_a_restart(store: Store) -> None:
    now = ManualClock().now()
    wake = InProcessWakeUp()
    queue = LocalFairQueue(store, wake=wake)
    await _enqueue(store, TENANT, 10, now)
    assert len(await queue.lease(owner="w", limit=2, lease_for=MINUTE, now=now)) == 2
    async with store.transaction() as tx:
        await put_queue_policy(tx, TENANT, {"max_running": 3}, now=now)
    wake.notify(Topic.POLICY)  # what the admin service announces after its commit
    assert len(await queue.lease(owner="w", limit=10, lease_for=MINUTE, now=now)) == 1
    assert queue.scheduler.policy.of(TENANT).max_running == 3
    async with store.transaction() as tx:
        await delete_queue_policy(tx, TENANT)
    # Unannounced, a change is still read within the reload interval.
    queue.policies.reload_seconds = 0
    assert len(await queue.lease(owner="w", limit=10, lease_for=MINUTE, now=now)) == 7


async def test_a_task_behind_more_ready_tasks_than_a_full_look_holds_is_found(
    store: Store,
) -> None:
    # A full look at every lease, and it holds only the 5 oldest ready tasks: the
    # other tenant's task, the newest of 8, is still found by its id.
    now = ManualClock().now()
    queue = LocalFairQueue(store, resync_seconds=0, scan_limit=5)
    await _enqueue(store, TENANT, 8, now)
    assert len(await queue.lease(owner="w", limit=1, lease_for=MINUTE, now=now)) == 1
    await _enqueue(store, OTHER_TENANT, 1, now, tag="b")
    leased = await queue.lease(owner="w", limit=2, lease_for=MINUTE, now=now)
    assert OTHER_TENANT in {t.tenant_id for t in leased}


async def test_a_task_committed_after_a_newer_one_is_found_without_a_full_look(
    pg_store: Store,
) -> None:
    # Postgres only: two writers interleave. The task with the smaller id commits
    # last; the lease that saw the newer one has moved past its id, and the next
    # look that starts below the highest id seen (within RESCAN_EVERY) finds it.
    store = pg_store
    now = ManualClock().now()
    queue = LocalFairQueue(store, resync_seconds=3600)  # no full look after the first
    assert await queue.lease(owner="w", limit=10, lease_for=MINUTE, now=now) == []
    late = asyncio.Event()
    written = asyncio.Event()

    async def slow_writer() -> None:
        async with store.transaction() as tx:
            await tx.enqueue_tasks([_task(TENANT, "slow", now)])
            written.set()
            await late.wait()

    writer = asyncio.create_task(slow_writer())
    await written.wait()
    await _enqueue(store, TENANT, 1, now, tag="fast")
    [fast] = await queue.lease(owner="w", limit=10, lease_for=MINUTE, now=now)
    assert fast.run_id == "rfast0"
    late.set()
    await writer
    found: list[TaskRecord] = []
    deadline = time.monotonic() + 10
    while not found and time.monotonic() < deadline:
        await asyncio.sleep(RESCAN_EVERY / 2)
        found = await queue.lease(owner="w", limit=10, lease_for=MINUTE, now=now)
    assert [t.run_id for t in found] == ["rslow"]
    assert int(found[0].id) < int(fast.id)
    assert queue.pace.rescans >= 1


async def test_no_look_below_the_highest_id_seen_while_no_id_under_it_is_missing(
    store: Store,
) -> None:
    # Every id up to the highest seen was returned: the waiting tasks are not
    # read again, however often leases come.
    now = ManualClock().now()
    queue = LocalFairQueue(store, resync_seconds=3600)
    await _enqueue(store, TENANT, 12, now)
    leased = await queue.lease(owner="w", limit=4, lease_for=MINUTE, now=now)
    for tag in "abc":
        await asyncio.sleep(RESCAN_EVERY * 1.5)
        await _enqueue(store, TENANT, 2, now, tag=tag)
        leased += await queue.lease(owner="w", limit=4, lease_for=MINUTE, now=now)
    while more := await queue.lease(owner="w", limit=4, lease_for=MINUTE, now=now):
        leased += more
    assert len({t.id for t in leased}) == 18
    assert queue.pace.rescans == 0


async def test_a_runs_next_task_is_taken_at_once_only_while_nothing_waits(store: Store) -> None:
    # The worker that ran a run's step leases the run's next task in the
    # transaction that queues it, as the ticket of that step, while no other
    # task waits its turn; otherwise it stays queued for the next lease.
    now = ManualClock().now()
    policy = FairPolicy(tenants={OTHER_TENANT: TenantPolicy(max_running=1)})
    queue = LocalFairQueue(store, policy=policy, resync_seconds=3600, capacity=8)
    first, like = await _one_running(store, queue, now)
    assert like.tenant == TENANT
    nxt = _task(TENANT, "next", now)
    async with store.transaction() as tx:
        await queue.complete(tx, _refs([first]))
        [task_id], [taken] = await _taking(queue, tx, nxt, like, now)
        assert task_id is not None
    # It runs under its id, not the stand-in it was chosen under.
    assert queue.scheduler.running_ticket(taken.id) is not None
    assert {t.key for t in queue.scheduler.running()} == {taken.id}
    assert (taken.id, taken.status, taken.lease_owner, taken.deliveries) == (
        task_id,
        "leased",
        "w",
        1,
    )
    assert queue.scheduler.running_of(TENANT) == 1
    # Another tenant's task waits (held back by its limit): the run's following
    # task waits its turn too.
    await _enqueue(store, OTHER_TENANT, 2, now)
    [other] = await queue.lease(owner="w", limit=5, lease_for=MINUTE, now=now)
    assert other.tenant_id == OTHER_TENANT
    assert not queue.takes_now()
    behind = _task(TENANT, "behind", now)
    async with store.transaction() as tx:
        await queue.complete(tx, _refs([taken]))
        [behind_id], refused = await _taking(queue, tx, behind, like, now)
        assert behind_id is not None
        assert refused == []
        await queue.complete(tx, _refs([other]))
    leased = await queue.lease(owner="w", limit=5, lease_for=MINUTE, now=now)
    assert Counter(t.tenant_id for t in leased) == Counter({TENANT: 1, OTHER_TENANT: 1})
    assert behind_id in {t.id for t in leased}


@pytest.mark.parametrize("answered", [False, True])
async def test_a_task_taken_at_once_in_a_rolled_back_transaction_is_forgotten(
    store: Store, answered: bool
) -> None:
    # The transaction fails before the insert's answer was read (it went out
    # with COMMIT), or after: either way the queue forgets the task it chose.
    now = ManualClock().now()
    queue = LocalFairQueue(store, resync_seconds=3600)
    _, like = await _one_running(store, queue, now)
    nxt = _task(TENANT, "next", now)
    queued: list[Taking] = []

    async def report() -> None:
        async with store.transaction() as tx:
            taking = await queue.enqueue_taking_later(
                tx, [(nxt, like)], owner="w", limit=1, lease_for=MINUTE, now=now
            )
            queued.append(taking)
            assert (taking.leasing, taking.left) == (1, False)
            assert queue.scheduler.running_of(TENANT) == 2  # chosen: it counts at once
            if answered:
                _, taken = await taking.result()
                assert len(taken) == 1
            raise RuntimeError("the report fails before its commit")

    with pytest.raises(RuntimeError):
        await report()
    [taking] = queued
    taking.untake()
    assert await taking.result() == ([], [])
    assert queue.scheduler.running_of(TENANT) == 1  # only the first task
    assert await queue.lease(owner="w", limit=5, lease_for=MINUTE, now=now) == []


async def test_a_task_taken_at_once_is_known_by_its_id_once_the_commit_answered(
    store: Store,
) -> None:
    now = ManualClock().now()
    queue = LocalFairQueue(store, resync_seconds=3600)
    first, like = await _one_running(store, queue, now)
    async with store.transaction() as tx:
        await queue.complete(tx, _refs([first]))
        taking = await queue.enqueue_taking_later(
            tx,
            [(_task(TENANT, "next", now), like), (_task(TENANT, "other", now), None)],
            owner="w",
            limit=1,
            lease_for=MINUTE,
            now=now,
        )
    assert (taking.leasing, taking.left) == (1, True)  # "other" is left to the queue
    ids, [taken] = await taking.result()
    assert ids[0] == taken.id
    assert ids[1] not in (None, taken.id)
    assert await taking.result() == (ids, [taken])  # the same answer when asked again
    assert queue.tickets_of(_refs([taken])).keys() == {taken.id}
    assert (taken.lease_owner, taken.run_id) == ("w", "rnext")
    [other] = await queue.lease(owner="w", limit=5, lease_for=MINUTE, now=now)
    assert other.id == ids[1]


async def test_a_worker_that_cannot_read_what_it_took_at_once_holds_none_of_it(
    store: Store,
) -> None:
    # Should the insert's answer not be read after the commit, the queue must
    # not count the chosen task as running for good (its lease lapses instead).
    clock = ManualClock()
    now = clock.now()
    queue = LocalFairQueue(store, resync_seconds=3600)
    workers = Workers(store, default_registry(), clock=clock, wake=InProcessWakeUp(), queue=queue)
    _, ticket = await _one_running(store, queue, now, workers.owner)
    taker = _Taker(
        queue,
        {(TENANT, "rnext"): ticket},
        owner=workers.owner,
        slots=1,
        lease_for=MINUTE,
        clock=clock,
    )
    async with store.transaction() as tx:
        left = await taker.enqueue(tx, [_task(TENANT, "next", now)], {})
    assert left is False
    assert queue.scheduler.running_of(TENANT) == 2

    async def unreadable() -> list[TaskRecord | None]:
        raise RuntimeError("the answer is lost")

    [taking] = taker._takings
    assert isinstance(taking, Taking)
    taking.stored = unreadable
    assert await workers._collect(taker) == []
    assert queue.scheduler.running_of(TENANT) == 1  # only the first task


async def test_ids_taken_at_once_are_never_looked_for_again(store: Store) -> None:
    # A task leased as it was queued is never ready: the look by id must not
    # count its id as missing and read the ready tasks below it again.
    now = ManualClock().now()
    queue = LocalFairQueue(store, resync_seconds=3600)
    first, like = await _one_running(store, queue, now)
    for n in range(3):
        nxt = _task(TENANT, f"next{n}", now)
        async with store.transaction() as tx:
            await queue.complete(tx, _refs([first]))
            _, [first] = await _taking(queue, tx, nxt, like, now)
        await _enqueue(store, TENANT, 1, now, tag=f"queued{n}")
        await asyncio.sleep(RESCAN_EVERY * 1.5)
        [queued] = await queue.lease(owner="w", limit=1, lease_for=MINUTE, now=now)
        async with store.transaction() as tx:
            await queue.complete(tx, _refs([queued]))
    assert queue.pace.rescans == 0


def test_the_ids_taken_at_once_kept_in_memory_stay_bounded() -> None:
    # A long stretch of tasks taken at once with no look in between (one long
    # run, no other work): only the newest ids a look could miss are kept.
    pace = LookPace(RESCAN_EVERY, 512)
    for task_id in range(1, 100_001):
        pace.taken([task_id])
    assert len(pace._taken) <= 1024
    pace.saw(0, [100_002], clock=0.0)
    # 100,001 was never seen: missing. The taken ids below it are not.
    assert set(pace._missing) == {100_001}
