"""The Redis queue's per-key limits at the exact moments a fault can land.

Each fault is real: FLUSHALL on a redis-server of the test's own, a process
whose client cannot reach Redis at all, a second process leasing while the
first one's choice is on its way from Redis to the store. A hook on the first
process's client, awaited before or after each command it sends, puts the
fault at one precise point of a lease, so each test fails the same way every
time the queue has the gap it names.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from ductor_core.runs import RunState, RunStatus
from ductor_server.engine.clock import ManualClock
from ductor_server.engine.fairqueue import LocalFairQueue
from ductor_server.engine.redisqueue import RECONCILE_AFTER, RedisFairQueue
from ductor_server.storage import (
    NewRun,
    NewTask,
    RunLimits,
    Store,
    TaskRecord,
    TaskRef,
)
from ductor_server.testing import free_port

from .conftest import TENANT, OwnRedis
from .test_fairqueue import _runs_with_limits

MINUTE = timedelta(minutes=1)
MEANWHILE = 0.5
"""Seconds a hook gives another process's lease to finish while this one's
choice is on its way to the store (enough for a lease that need not wait)."""

Hook = Callable[[tuple[Any, ...]], Awaitable[None]]
AfterHook = Callable[[tuple[Any, ...], Any], Awaitable[None]]


class HookedRedis(Redis):
    """A client of the test's redis-server that awaits `before` (with the
    command) and `after` (with the command and its reply), when set, around
    every command it sends, scripts included."""

    def __init__(self, port: int) -> None:
        super().__init__(port=port, socket_connect_timeout=1)
        self.before: Hook | None = None
        self.after: AfterHook | None = None

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        if self.before is not None:
            await self.before(args)
        result = await super().execute_command(*args, **options)
        if self.after is not None:
            await self.after(args, result)
        return result


class FlushBefore:
    """A hook that flushes Redis before the `position`-th command (from 1)."""

    def __init__(self, position: int, redis: Redis) -> None:
        self.position = position
        self.redis = redis
        self.sent = 0

    async def __call__(self, args: tuple[Any, ...]) -> None:
        self.sent += 1
        if self.sent == self.position:
            await self.redis.flushall()


def _runs(script: Any, args: tuple[Any, ...]) -> bool:
    return len(args) > 1 and args[0] == "EVALSHA" and args[1] == script.sha


def _chose(script: Any, args: tuple[Any, ...], reply: Any) -> bool:
    """True if the command was a pick by `script` that chose a task."""
    return _runs(script, args) and isinstance(reply, list) and bool(reply)


@pytest.fixture
async def hooked(own_redis: OwnRedis) -> AsyncIterator[HookedRedis]:
    client = HookedRedis(own_redis.port)
    try:
        yield client
    finally:
        await client.aclose()


async def _leased_of(store: Store, key: str, now: datetime) -> int:
    """How many tasks of limit key `key` the store has leased at `now`."""
    async with store.transaction() as tx:
        rows = await tx.leased_tasks(now=now)
    return sum(1 for row in rows if row.limits is not None and row.limits.key == key)


async def _complete(queue: RedisFairQueue, tasks: list[TaskRecord]) -> None:
    async with queue.store.transaction() as tx:
        await queue.complete(tx, [TaskRef(tenant_id=t.tenant_id, task_id=t.id) for t in tasks])
    await queue.record_ends()


async def _key_tasks(store: Store, available: list[datetime], *, concurrency: int) -> None:
    """One run of limit key "ann" per entry of `available`, each with one task
    that becomes ready then (task ids in this order: a retry waiting for its
    backoff has an older id than a task that is ready now)."""
    async with store.transaction() as tx:
        await tx.insert_runs(
            [
                NewRun(
                    tenant_id=TENANT,
                    family_slug="sync",
                    version=1,
                    state=RunState(run_id=f"run{i}", status=RunStatus.RUNNING, created_at=at),
                    limits=RunLimits(key="ann", concurrency=concurrency),
                )
                for i, at in enumerate(available)
            ]
        )
        await tx.enqueue_tasks(
            [
                NewTask(
                    tenant_id=TENANT,
                    run_id=f"run{i}",
                    step_ref="s",
                    attempt=1,
                    step_type="STEP_TYPE_ACTION",
                    handler="action:noop",
                    idempotency_key=f"run{i}:s",
                    available_at=at,
                )
                for i, at in enumerate(available)
            ]
        )


async def test_a_flush_before_any_command_of_a_lease_lets_no_key_past_its_limit(
    store: Store, redis: Redis, hooked: HookedRedis
) -> None:
    now = ManualClock().now()
    # Every lease also looks below the highest id seen, so each files the held-back
    # tasks again and sends every command a lease can send.
    queue = RedisFairQueue(store, hooked, prefix="t:", resync_seconds=3600, rescan_every=0)
    await _runs_with_limits(store, TENANT, ["ann"] * 6, now, {"concurrency": 2})
    assert len(await queue.lease(owner="w", limit=10, lease_for=MINUTE, now=now)) == 2
    position = 0
    while True:
        position += 1
        # Redis holds the queue again (a lease with no fault rebuilds it if need be).
        assert await queue.lease(owner="w", limit=10, lease_for=MINUTE, now=now) == []
        flush = FlushBefore(position, redis)
        hooked.before = flush
        leased = await queue.lease(owner="w", limit=10, lease_for=MINUTE, now=now)
        hooked.before = None
        assert leased == [], f"a flush before command {position} let {len(leased)} more start"
        assert await _leased_of(store, "ann", now) == 2
        if flush.sent < position:
            break  # the lease sent fewer commands: a flush was tried before each
    assert position > 4


async def test_a_lease_from_redis_counts_what_a_process_leased_without_it(
    store: Store, redis: Redis
) -> None:
    now = ManualClock().now()
    online = RedisFairQueue(store, redis, prefix="t:", resync_seconds=3600)
    # A process whose client cannot reach Redis leases from the store meanwhile.
    unreachable = Redis(port=free_port(), socket_connect_timeout=0.2, retry=None)
    offline = RedisFairQueue(store, unreachable, prefix="t:", resync_seconds=3600)
    try:
        await _runs_with_limits(store, TENANT, ["ann"] * 6, now, {"concurrency": 2})
        assert len(await online.lease(owner="w1", limit=1, lease_for=MINUTE, now=now)) == 1
        assert len(await offline.lease(owner="w2", limit=10, lease_for=MINUTE, now=now)) == 1
        assert offline.fallbacks == 1
        for _ in range(3):
            assert await online.lease(owner="w1", limit=10, lease_for=MINUTE, now=now) == []
        assert await _leased_of(store, "ann", now) == 2
    finally:
        await unreachable.aclose()


async def test_a_rebuild_waits_for_a_choice_on_its_way_to_the_store(
    pg_store: Store, redis: Redis, hooked: HookedRedis
) -> None:
    store = pg_store
    clock = ManualClock()
    start = clock.now()
    # run0 is a retry due in 5 seconds (the oldest id), run1 is ready now.
    await _key_tasks(store, [start + timedelta(seconds=5), start], concurrency=1)
    first = RedisFairQueue(store, hooked, prefix="t:", resync_seconds=3600)
    second = RedisFairQueue(store, redis, prefix="t:", resync_seconds=3600)
    # The queue is built (with nothing ready yet): the next lease picks with the
    # lock shared, as leases do but for a count of the store's leases.
    early = start - timedelta(seconds=1)
    assert await first.lease(owner="w1", limit=10, lease_for=MINUTE, now=early) == []
    at = start + timedelta(seconds=5)
    elsewhere: list[asyncio.Task[list[TaskRecord]]] = []

    async def flush_and_lease_elsewhere(args: tuple[Any, ...], reply: Any) -> None:
        if _chose(first._pick, args, reply):
            hooked.after = None
            await redis.flushall()
            # Another process, its clock a little behind, rebuilds the queue
            # before the choice just made here is leased in the store.
            behind = at - timedelta(milliseconds=5)
            lease = second.lease(owner="w2", limit=10, lease_for=MINUTE, now=behind)
            elsewhere.append(asyncio.ensure_future(lease))
            await asyncio.wait(elsewhere, timeout=MEANWHILE)

    hooked.after = flush_and_lease_elsewhere
    [chosen] = await first.lease(owner="w1", limit=10, lease_for=MINUTE, now=at)
    assert chosen.run_id == "run0"
    assert await elsewhere[0] == []
    assert await _leased_of(store, "ann", at) == 1


async def test_a_lease_from_the_store_waits_for_a_choice_on_its_way_to_it(
    pg_store: Store, redis: Redis, hooked: HookedRedis
) -> None:
    store = pg_store
    clock = ManualClock()
    start = clock.now()
    await _key_tasks(store, [start + timedelta(seconds=5), start], concurrency=1)
    online = RedisFairQueue(store, hooked, prefix="t:", resync_seconds=3600)
    unreachable = Redis(port=free_port(), socket_connect_timeout=0.2, retry=None)
    offline = RedisFairQueue(store, unreachable, prefix="t:", resync_seconds=3600)
    early = start - timedelta(seconds=1)
    assert await online.lease(owner="w1", limit=10, lease_for=MINUTE, now=early) == []
    at = start + timedelta(seconds=5)
    elsewhere: list[asyncio.Task[list[TaskRecord]]] = []

    async def lease_elsewhere(args: tuple[Any, ...], reply: Any) -> None:
        if _chose(online._pick, args, reply):
            hooked.after = None
            behind = at - timedelta(milliseconds=5)
            lease = offline.lease(owner="w2", limit=10, lease_for=MINUTE, now=behind)
            elsewhere.append(asyncio.ensure_future(lease))
            await asyncio.wait(elsewhere, timeout=MEANWHILE)

    try:
        hooked.after = lease_elsewhere
        [chosen] = await online.lease(owner="w1", limit=10, lease_for=MINUTE, now=at)
        assert chosen.run_id == "run0"
        assert await elsewhere[0] == []
        assert offline.fallbacks == 1
        assert await _leased_of(store, "ann", at) == 1
    finally:
        await unreachable.aclose()


async def test_a_choice_slow_to_reach_the_store_still_counts(
    pg_store: Store, redis: Redis, hooked: HookedRedis
) -> None:
    store = pg_store
    start = ManualClock().now()
    # run0 (the older id) becomes ready only later: a retry waiting out its backoff.
    await _key_tasks(store, [start + timedelta(seconds=20), start], concurrency=1)
    slow = RedisFairQueue(store, hooked, prefix="t:", resync_seconds=3600)
    early = start - timedelta(seconds=1)
    assert await slow.lease(owner="w1", limit=10, lease_for=MINUTE, now=early) == []
    # Another process looks at the whole store at every lease.
    other = RedisFairQueue(store, redis, prefix="t:", resync_seconds=0)
    at = start + timedelta(seconds=5)
    elsewhere: list[asyncio.Task[list[TaskRecord]]] = []

    async def lease_elsewhere(args: tuple[Any, ...], reply: Any) -> None:
        if _chose(slow._pick, args, reply):
            hooked.after = None
            # Long after the choice (as the other process's clock has it), while
            # it is still on its way to the store.
            later = at + timedelta(seconds=RECONCILE_AFTER + 6)
            lease = other.lease(owner="w2", limit=10, lease_for=MINUTE, now=later)
            elsewhere.append(asyncio.ensure_future(lease))
            await asyncio.wait(elsewhere, timeout=MEANWHILE)

    hooked.after = lease_elsewhere
    [chosen] = await slow.lease(owner="w1", limit=10, lease_for=MINUTE, now=at)
    assert chosen.run_id == "run1"
    assert await elsewhere[0] == []
    assert await _leased_of(store, "ann", at) == 1


async def test_a_look_at_the_store_does_not_count_a_task_that_ended_meanwhile(
    pg_store: Store, redis: Redis, hooked: HookedRedis
) -> None:
    store = pg_store
    now = ManualClock().now()
    # A full look at the store at every lease.
    queue = RedisFairQueue(store, hooked, prefix="t:", resync_seconds=0)
    other = RedisFairQueue(store, redis, prefix="t:", resync_seconds=3600)
    await _runs_with_limits(store, TENANT, ["ann"] * 3, now, {"concurrency": 1})
    [first] = await queue.lease(owner="w", limit=5, lease_for=MINUTE, now=now)

    async def end_it_meanwhile(args: tuple[Any, ...]) -> None:
        if _runs(queue._sync, args):
            hooked.before = None
            # The task's report commits after this look read the store's leases
            # and before it counts them in Redis.
            await _complete(other, [first])

    hooked.before = end_it_meanwhile
    leased = await queue.lease(owner="w", limit=5, lease_for=MINUTE, now=now)
    assert [t.run_id for t in leased] == [f"{TENANT}-run1"]


async def test_more_blocked_keys_than_a_pick_looks_at_do_not_hide_a_ready_one(
    store: Store, redis: Redis
) -> None:
    now = ManualClock().now()
    # 70 customers with two runs each (one at a time per customer), then one
    # more customer: each lease can start one run of every customer.
    keys = [f"c{i:02}" for i in range(70) for _ in range(2)] + ["late"]
    await _runs_with_limits(store, TENANT, keys, now, {"concurrency": 1})
    queue = RedisFairQueue(store, redis, prefix="t:", resync_seconds=3600)
    local = LocalFairQueue(store)
    leased = await queue.lease(owner="w", limit=200, lease_for=MINUTE, now=now)
    assert len(leased) == 71
    # The in-process queue, by the same rules, would have chosen the same runs.
    async with store.transaction() as tx:
        await tx.release_tasks(
            [TaskRef(tenant_id=t.tenant_id, task_id=t.id) for t in leased], available_at=now
        )
    again = await local.lease(owner="w", limit=200, lease_for=MINUTE, now=now)
    assert sorted(t.run_id for t in again) == sorted(t.run_id for t in leased)
