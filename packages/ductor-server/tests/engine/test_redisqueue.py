"""The Redis fair queue on both backends, on a redis-server of the test's own:
fair across processes, limits global, and after FLUSHALL or a Redis restart the
queue rebuilds from the store with no task lost or leased twice."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

from redis.asyncio import Redis

from ductor_server.engine.clock import ManualClock
from ductor_server.engine.fairness import FairPolicy, TenantPolicy
from ductor_server.engine.queue import InProcessWakeUp, Topic
from ductor_server.engine.redisqueue import RECONCILE_AFTER, RedisFairQueue, policy_version
from ductor_server.engine.rediswake import RedisWakeUp
from ductor_server.storage import NewTask, Store, TaskRecord, TaskRef, open_store
from ductor_server.storage.queuepolicies import put_queue_policy

from .conftest import OTHER_TENANT, TENANT, OwnRedis
from .test_fairqueue import _run_keys, _runs_with_limits

MINUTE = timedelta(minutes=1)


async def _enqueue(store: Store, tenant: str, count: int, now: datetime, tag: str = "") -> None:
    async with store.transaction() as tx:
        await tx.enqueue_tasks(
            [
                NewTask(
                    tenant_id=tenant,
                    run_id=f"r{tag}{i}",
                    step_ref="s",
                    attempt=1,
                    step_type="STEP_TYPE_ACTION",
                    handler="action:noop",
                    idempotency_key=f"{tenant}:{tag}{i}",
                    available_at=now,
                )
                for i in range(count)
            ]
        )


def _refs(tasks: list[TaskRecord]) -> list[TaskRef]:
    return [TaskRef(tenant_id=t.tenant_id, task_id=t.id) for t in tasks]


async def test_a_late_tenant_is_served_at_once_by_any_process(store: Store, redis: Redis) -> None:
    now = ManualClock().now()
    first, second = (RedisFairQueue(store, redis, prefix="t:") for _ in range(2))
    await _enqueue(store, TENANT, 300, now)
    assert len(await first.lease(owner="w1", limit=4, lease_for=MINUTE, now=now)) == 4
    await _enqueue(store, OTHER_TENANT, 5, now)
    leased = await second.lease(owner="w2", limit=10, lease_for=MINUTE, now=now)
    assert Counter(t.tenant_id for t in leased) == Counter({TENANT: 5, OTHER_TENANT: 5})
    assert first.fallbacks == second.fallbacks == 0


async def test_a_tenant_limit_holds_across_processes(store: Store, redis: Redis) -> None:
    now = ManualClock().now()
    policy = FairPolicy(tenants={TENANT: TenantPolicy(max_running=3)})
    first, second = (RedisFairQueue(store, redis, prefix="t:", policy=policy) for _ in range(2))
    await _enqueue(store, TENANT, 10, now)
    a = await first.lease(owner="w1", limit=2, lease_for=MINUTE, now=now)
    b = await second.lease(owner="w2", limit=10, lease_for=MINUTE, now=now)
    assert (len(a), len(b)) == (2, 1)
    async with store.transaction() as tx:
        await first.complete(tx, _refs(a[:1]))
    await first.record_ends()
    assert len(await second.lease(owner="w2", limit=10, lease_for=MINUTE, now=now)) == 1
    assert first.fallbacks == second.fallbacks == 0


async def _drain(queue: RedisFairQueue, now: datetime, seen: list[str]) -> None:
    while batch := await queue.lease(owner="w", limit=7, lease_for=MINUTE, now=now):
        seen.extend(t.id for t in batch)


async def test_flushall_rebuilds_from_the_store(store: Store, redis: Redis) -> None:
    now = ManualClock().now()
    queue = RedisFairQueue(store, redis, prefix="t:", resync_seconds=3600)
    await _enqueue(store, TENANT, 20, now)
    await _enqueue(store, OTHER_TENANT, 20, now)
    seen = [t.id for t in await queue.lease(owner="w", limit=10, lease_for=MINUTE, now=now)]
    await redis.flushall()
    await _drain(queue, now, seen)
    assert len(seen) == 40
    assert len(set(seen)) == 40  # every task once: none lost, none leased twice
    assert queue.rebuilds == 2  # the first lease, and after the flush
    assert queue.fallbacks == 0


async def test_a_redis_restart_loses_nothing(
    store: Store, redis: Redis, own_redis: OwnRedis
) -> None:
    now = ManualClock().now()
    queue = RedisFairQueue(store, redis, prefix="t:", resync_seconds=3600)
    await _enqueue(store, TENANT, 30, now)
    seen = [t.id for t in await queue.lease(owner="w", limit=10, lease_for=MINUTE, now=now)]
    own_redis.stop()
    # While Redis is down the store's own order serves the workers.
    seen.extend(t.id for t in await queue.lease(owner="w", limit=5, lease_for=MINUTE, now=now))
    assert queue.fallbacks == 1
    own_redis.start()
    await _drain(queue, now, seen)
    assert sorted(seen) == sorted(set(seen))
    assert len(seen) == 30
    # Leases that run out (their process died) come back once, counted as deaths,
    # found by another process's look at the whole ready set.
    later = now + 3 * MINUTE
    other = RedisFairQueue(store, redis, prefix="t:")
    again = await other.lease(owner="w2", limit=50, lease_for=MINUTE, now=later)
    assert len(again) == 30
    assert all(t.deaths == 1 for t in again)


async def test_run_limit_keys_hold_across_processes_and_a_flushall(
    store: Store, redis: Redis
) -> None:
    now = ManualClock().now()
    first, second = (
        RedisFairQueue(store, redis, prefix="t:", resync_seconds=3600) for _ in range(2)
    )
    await _runs_with_limits(store, TENANT, ["ann"] * 6 + ["bob"], now, {"concurrency": 2})
    a = await first.lease(owner="w1", limit=1, lease_for=MINUTE, now=now)
    b = await second.lease(owner="w2", limit=10, lease_for=MINUTE, now=now)
    assert _run_keys(a + b) == [f"{TENANT}-run{i}" for i in (0, 1, 6)]
    await redis.flushall()
    # Rebuilt from the store, the two leased tasks of "ann" still count.
    assert await second.lease(owner="w2", limit=10, lease_for=MINUTE, now=now) == []
    assert (first.rebuilds, second.rebuilds) == (1, 1)  # the first look, then after the flush
    async with store.transaction() as tx:
        await first.complete(tx, _refs(a))
    await first.record_ends()
    [c] = await second.lease(owner="w2", limit=10, lease_for=MINUTE, now=now)
    assert c.run_id == f"{TENANT}-run2"


async def test_a_choice_that_never_reached_the_store_is_ready_again(
    store: Store, redis: Redis
) -> None:
    now = ManualClock().now()
    queue = RedisFairQueue(store, redis, prefix="t:", resync_seconds=0)
    await _runs_with_limits(store, TENANT, ["ann"] * 3, now, {"concurrency": 1})
    [task] = await queue.lease(owner="w", limit=5, lease_for=MINUTE, now=now)
    async with store.transaction() as tx:
        await queue.complete(tx, _refs([task]))
    await queue.record_ends()
    # A process chooses the next task in Redis and dies before leasing it in the store.
    args = [queue.keys, 1, repr(now.timestamp()), 0, policy_version(queue.policy), 64, "x", 0]
    [chosen, _] = await queue._pick(args=args)
    assert await queue.lease(owner="w", limit=5, lease_for=MINUTE, now=now) == []
    later = now + timedelta(seconds=RECONCILE_AFTER + 1)
    [again] = await queue.lease(owner="w", limit=5, lease_for=MINUTE, now=later)
    assert again.id == chosen.decode()
    assert queue.reconciled == 1


async def test_an_operator_policy_reaches_every_process(store: Store, redis: Redis) -> None:
    now = ManualClock().now()
    wakes = [
        RedisWakeUp(Redis(port=redis.connection_pool.connection_kwargs["port"]), prefix="t:")
        for _ in range(2)
    ]
    try:
        queue = RedisFairQueue(store, redis, prefix="t:", wake=wakes[1])
        await _enqueue(store, TENANT, 10, now)
        assert len(await queue.lease(owner="w", limit=2, lease_for=MINUTE, now=now)) == 2
        async with store.transaction() as tx:
            await put_queue_policy(tx, TENANT, {"max_running": 3}, now=now)
        wakes[0].notify(Topic.POLICY)  # another process's admin call
        deadline = asyncio.get_running_loop().time() + 10
        while queue.policies.policy.of(TENANT).max_running != 3:
            assert asyncio.get_running_loop().time() < deadline, "the change never arrived"
            async with store.transaction() as tx:
                await queue.policies.current(tx)
            await asyncio.sleep(0.02)
        assert queue.policies.reloads == 2  # at start, and once told of the change
        assert len(await queue.lease(owner="w", limit=10, lease_for=MINUTE, now=now)) == 1
    finally:
        for wake in wakes:
            await wake.aclose()
            await wake.redis.aclose()


async def test_limits_hold_across_processes_while_redis_is_down(
    store: Store, redis: Redis, own_redis: OwnRedis
) -> None:
    now = ManualClock().now()
    first, second = (RedisFairQueue(store, redis, prefix="t:") for _ in range(2))
    await _runs_with_limits(store, TENANT, ["ann"] * 6 + ["bob"] * 2, now, {"concurrency": 2})
    a = await first.lease(owner="w1", limit=1, lease_for=MINUTE, now=now)
    own_redis.stop()
    # Each process now chooses by itself, counting the other's lease from the store.
    b = await second.lease(owner="w2", limit=10, lease_for=MINUTE, now=now)
    assert _run_keys(a + b) == [f"{TENANT}-run{i}" for i in (0, 1, 6, 7)]
    assert await first.lease(owner="w1", limit=10, lease_for=MINUTE, now=now) == []
    async with store.transaction() as tx:
        await second.complete(tx, _refs(b[:1]))
    [c] = await first.lease(owner="w1", limit=10, lease_for=MINUTE, now=now)
    assert c.run_id == f"{TENANT}-run2"
    assert (first.fallbacks, second.fallbacks) == (2, 1)


async def test_a_task_behind_more_ready_tasks_than_a_full_look_holds_is_found(
    store: Store, redis: Redis
) -> None:
    now = ManualClock().now()
    queue = RedisFairQueue(store, redis, prefix="t:", resync_seconds=0, scan_limit=5)
    await _enqueue(store, TENANT, 8, now)
    assert len(await queue.lease(owner="w", limit=1, lease_for=MINUTE, now=now)) == 1
    await _enqueue(store, OTHER_TENANT, 1, now, tag="b")
    leased = await queue.lease(owner="w", limit=2, lease_for=MINUTE, now=now)
    assert OTHER_TENANT in {t.tenant_id for t in leased}


async def test_a_tier_set_by_an_operator_files_the_ready_tasks_again(
    store: Store, redis: Redis
) -> None:
    now = ManualClock().now()
    wake = InProcessWakeUp()
    queue = RedisFairQueue(store, redis, prefix="t:", wake=wake, resync_seconds=3600)
    await _enqueue(store, TENANT, 10, now)
    await _enqueue(store, OTHER_TENANT, 10, now, tag="b")
    first = await queue.lease(owner="w", limit=2, lease_for=MINUTE, now=now)
    assert Counter(t.tenant_id for t in first) == {TENANT: 1, OTHER_TENANT: 1}
    async with store.transaction() as tx:
        await put_queue_policy(tx, OTHER_TENANT, {"tier": 2}, now=now)
    wake.notify(Topic.POLICY)
    leased = await queue.lease(owner="w", limit=9, lease_for=MINUTE, now=now)
    assert [t.tenant_id for t in leased] == [OTHER_TENANT] * 9


async def test_a_completion_still_uncommitted_is_not_counted_as_running_again(
    postgres_url: str, redis: Redis
) -> None:
    # A full look at the store that reads while a completion is not yet
    # committed still sees the task leased. Counting it as running again held a
    # tenant's slots until the reconciliation, RECONCILE_AFTER seconds later;
    # under load that throttled the whole queue to a fifth of its speed.
    store = open_store(postgres_url)
    await store.open()
    try:
        await store.migrate()
        now = ManualClock().now()
        async with store.transaction() as tx:
            await tx.ensure_tenant(TENANT, name="Acme", now=now)
        policy = FairPolicy(tenants={TENANT: TenantPolicy(max_running=1)})
        queue = RedisFairQueue(store, redis, prefix="t:", policy=policy, resync_seconds=0)
        await _enqueue(store, TENANT, 3, now)
        [first] = await queue.lease(owner="w", limit=5, lease_for=MINUTE, now=now)
        async with store.transaction() as tx:
            await queue.complete(tx, _refs([first]))
            # Not committed: the slot is not free yet, and this look at the store
            # sees the task still leased.
            assert await queue.lease(owner="w", limit=5, lease_for=MINUTE, now=now) == []
        [second] = await queue.lease(owner="w", limit=5, lease_for=MINUTE, now=now)
        async with store.transaction() as tx:
            await queue.complete(tx, _refs([second]))
        [third] = await queue.lease(owner="w", limit=5, lease_for=MINUTE, now=now)
        assert len({first.id, second.id, third.id}) == 3
        assert await redis.hkeys(queue.keys + "leased") == [third.id.encode()]
        assert queue.reconciled == 0  # nothing was counted that had to be taken back
    finally:
        await store.close()


async def test_each_database_has_a_queue_of_its_own_in_one_redis(
    store: Store, redis: Redis, tmp_path: Path
) -> None:
    # A Redis that served another database (or this one before a restore) under
    # the same prefix: its ready set, leases and cursor are not this database's.
    now = ManualClock().now()
    await _enqueue(store, TENANT, 5, now)
    first = RedisFairQueue(store, redis, prefix="t:", resync_seconds=3600)
    held = await first.lease(owner="w", limit=5, lease_for=MINUTE, now=now)
    assert len(held) == 5
    other = open_store(tmp_path / "other.db")
    await other.open()
    try:
        await other.migrate()
        async with other.transaction() as tx:
            await tx.ensure_tenant(TENANT, name="Acme", now=now)
        await _enqueue(other, TENANT, 3, now, tag="o")
        second = RedisFairQueue(other, redis, prefix="t:", resync_seconds=3600)
        fresh = await second.lease(owner="w", limit=5, lease_for=MINUTE, now=now)
        assert sorted(t.run_id for t in fresh) == ["ro0", "ro1", "ro2"]
        assert second.keys != first.keys
        assert second.keys.startswith("t:q:")
        assert first.keys.startswith("t:q:")
    finally:
        await other.close()
