"""Waiting for runs to end (`RunEndings`, behind `GET /v1/runs/{id}?wait=`), on both
stores: runs this process ended answer their waiters, and only theirs; another
process's notify (through Redis) makes it read the store; a run ended where no
wake-up reaches is seen by the slow look; a tenant's waiters are capped; a run
that ends inside the engine wakes its waiter."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis

from ductor_core.runs import RunState, RunStatus
from ductor_server.engine.effects import Effects
from ductor_server.engine.endings import RunEndings
from ductor_server.engine.queue import InProcessWakeUp, NullWakeUp, Topic
from ductor_server.engine.rediswake import RedisWakeUp
from ductor_server.errors import RunWaitLimit
from ductor_server.storage import NewRun, RunRef, RunUpdate, Store

from .conftest import OTHER_TENANT, TENANT, WAIT_SECONDS, Engine

NOW = datetime(2026, 1, 1, tzinfo=UTC)


async def _runs(store: Store, *keys: tuple[str, str]) -> None:
    async with store.transaction() as tx:
        await tx.insert_runs(
            [
                NewRun(
                    tenant_id=tenant,
                    family_slug="fam",
                    version=1,
                    state=RunState(run_id=run_id, status=RunStatus.RUNNING, created_at=NOW),
                )
                for tenant, run_id in keys
            ]
        )


async def _end(store: Store, tenant: str, run_id: str) -> None:
    async with store.transaction() as tx:
        run = await tx.get_run(tenant, run_id)
        assert run is not None
        done = RunState(run_id=run_id, status=RunStatus.SUCCEEDED, created_at=NOW)
        [applied] = await tx.update_runs(
            [
                RunUpdate(
                    tenant_id=tenant,
                    run_id=run_id,
                    expected_lock_version=run.lock_version,
                    state=done,
                    updated_at=run.updated_at,
                )
            ]
        )
        assert applied


async def test_runs_this_process_ended_answer_their_waiters_without_a_look(
    store: Store,
) -> None:
    await _runs(store, (TENANT, "r1"), (TENANT, "r2"))
    endings = RunEndings(store, InProcessWakeUp(), poll=3600)
    try:
        with (
            endings.watch(TENANT, "r1") as one,
            endings.watch(TENANT, "r1") as again,
            endings.watch(TENANT, "r2") as two,
            endings.watch(OTHER_TENANT, "r1") as theirs,  # another tenant's id
        ):
            assert endings.waiting == 4
            endings.ended([RunRef(tenant_id=TENANT, run_id="r1")])
            async with asyncio.timeout(WAIT_SECONDS):
                await asyncio.gather(one, again)
            assert not two.done()
            assert not theirs.done()
            assert endings.looks == 0  # nothing was read
        assert endings.waiting == 0
    finally:
        await endings.close()


async def test_another_process_ending_runs_wakes_a_look_at_the_store(
    store: Store, redis_url: str
) -> None:
    # Two processes share a wake-up through Redis: this one waits, the other
    # ends the run and notifies; no slow look comes in between (poll 3600 s).
    await _runs(store, (TENANT, "r1"), (TENANT, "r2"), (OTHER_TENANT, "r3"))
    prefix = f"endings-{uuid.uuid4().hex}:"
    clients = [Redis.from_url(redis_url) for _ in range(2)]
    here, there = (RedisWakeUp(c, prefix=prefix) for c in clients)
    endings = RunEndings(store, here, poll=3600)
    try:
        async with asyncio.timeout(WAIT_SECONDS):
            await here.subscribed()
            await there.subscribed()
        with (
            endings.watch(TENANT, "r1") as one,
            endings.watch(TENANT, "r2") as two,
            endings.watch(OTHER_TENANT, "r1") as missing,  # no such run of theirs
            endings.watch(OTHER_TENANT, "r3") as three,
        ):
            await _end(store, TENANT, "r1")
            there.notify(Topic.ENDED)
            async with asyncio.timeout(WAIT_SECONDS):
                await one
            assert endings.looks >= 1
            assert not two.done()
            assert not three.done()
            # A run that does not exist answers its waiter, who reads it again.
            assert missing.done()
    finally:
        await endings.close()
        for wake in (here, there):
            await wake.aclose()
        for client in clients:
            await client.aclose()


async def test_a_run_ended_where_no_wake_up_reaches_is_seen_by_the_slow_look(
    store: Store,
) -> None:
    await _runs(store, (TENANT, "r1"))
    endings = RunEndings(store, NullWakeUp(), poll=0.05)
    try:
        with endings.watch(TENANT, "r1") as ended:
            await asyncio.sleep(0.2)
            assert not ended.done()
            looks = endings.looks
            assert looks >= 1  # it looked, and the run still ran
            await _end(store, TENANT, "r1")
            async with asyncio.timeout(WAIT_SECONDS):
                await ended
    finally:
        await endings.close()


async def test_a_tenant_has_at_most_its_cap_of_waiters(store: Store) -> None:
    await _runs(store, (TENANT, "r1"), (OTHER_TENANT, "r2"))
    endings = RunEndings(store, InProcessWakeUp(), poll=3600, per_tenant=2)
    try:
        with endings.watch(TENANT, "r1"), endings.watch(TENANT, "r1"):
            with pytest.raises(RunWaitLimit) as refused, endings.watch(TENANT, "r1"):
                pass
            assert refused.value.details == {"limit": 2}
            with endings.watch(OTHER_TENANT, "r2"):  # other tenants are not held back
                assert endings.waiting == 3
        with endings.watch(TENANT, "r1"):  # freed on leaving
            assert endings.waiting == 1
    finally:
        await endings.close()


async def test_a_run_the_engine_ends_wakes_its_waiter(engine: Engine) -> None:
    # The engine's own wake-up, not the slow look, answers the request.
    engine.runtime.endings.poll = 3600
    await engine.publish(
        {
            "family_slug": "gated",
            "steps": [
                {
                    "ref": "hold",
                    "type": "STEP_TYPE_WAIT_FOR_SIGNAL",
                    "args": {"signal": "go", "timeout": "1h"},
                },
                {"ref": "after", "type": "STEP_TYPE_ACTION", "args": {"action": "noop"}},
            ],
            "edges": [{"source_ref": "hold", "target_ref": "after"}],
        }
    )
    run = (await engine.services.runs.trigger(TENANT, "gated")).value
    waiting = asyncio.create_task(engine.services.runs.get(TENANT, run.id, wait=WAIT_SECONDS))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await engine.services.runs.signal(TENANT, run.id, "go")
    async with asyncio.timeout(WAIT_SECONDS / 2):
        view = await waiting
    assert view.status is RunStatus.SUCCEEDED
    assert engine.runtime.endings.waiting == 0


async def test_a_commit_that_ended_runs_wakes_the_ended_topic() -> None:
    # What reaches other processes through a shared wake-up (see the Redis test).
    wake = InProcessWakeUp()
    Effects().notify(wake)
    assert not await wake.wait(Topic.ENDED, 0)
    ended = Effects()
    ended.ended.append(RunRef(tenant_id=TENANT, run_id="r1"))
    ended.notify(wake)
    assert await wake.wait(Topic.ENDED, 0)
