"""The `TaskQueue` port: the SQL queue's lease, heartbeat, completion and release on
both backends, and workers that take every task through whatever queue they get."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ductor_server.engine.actions import default_registry
from ductor_server.engine.clock import ManualClock
from ductor_server.engine.runtime import Runtime
from ductor_server.engine.taskqueue import SqlTaskQueue, TaskQueue
from ductor_server.storage import NewTask, Store, TaskRecord, TaskRef, TaskStatus
from ductor_server.storage.protocol import Tx

from .conftest import SUCCEEDED, TENANT, TEST_CONFIG, Engine

MINUTE = timedelta(minutes=1)


def _task(run_id: str, ref: str, now: datetime) -> NewTask:
    return NewTask(
        tenant_id=TENANT,
        run_id=run_id,
        step_ref=ref,
        attempt=1,
        step_type="STEP_TYPE_ACTION",
        handler="action:noop",
        idempotency_key=f"{run_id}:{ref}:-1:1",
        available_at=now,
    )


def _ref(task: TaskRecord) -> TaskRef:
    return TaskRef(tenant_id=task.tenant_id, task_id=task.id)


async def test_the_sql_queue_leases_extends_completes_and_releases(store: Store) -> None:
    now = ManualClock().now()
    queue: TaskQueue = SqlTaskQueue(store)
    async with store.transaction() as tx:
        await tx.enqueue_tasks([_task("r1", ref, now) for ref in ("a", "b", "c")])
    first = await queue.lease(owner="w1", limit=2, lease_for=MINUTE, now=now)
    assert [t.step_ref for t in first] == ["a", "b"]
    assert all(t.lease_owner == "w1" and t.deliveries == 1 for t in first)
    refs = [_ref(t) for t in first]
    assert await queue.extend(refs, owner="w1", lease_until=now + 2 * MINUTE) == [True, True]
    assert await queue.extend(refs, owner="w2", lease_until=now + 2 * MINUTE) == [False, False]
    assert await queue.extend([], owner="w1", lease_until=now) == []
    async with store.transaction() as tx:
        await queue.complete(tx, refs[:1])
        await queue.complete(tx, refs[:1])  # already done: nothing changes
        # A statement that answers sees what the queued ones did.
        assert await tx.complete_tasks(refs[:1]) == [False]
    assert await queue.release(refs[1:], available_at=now) == 1
    assert await queue.release([], available_at=now) == 0
    again = await queue.lease(owner="w2", limit=5, lease_for=MINUTE, now=now)
    assert sorted(t.step_ref for t in again) == ["b", "c"]
    [b] = [t for t in again if t.step_ref == "b"]
    assert b.deliveries == 2  # handed out a second time after the release
    async with store.transaction() as tx:
        done = await tx.get_task(TENANT, first[0].id)
    assert done is not None
    assert done.status == TaskStatus.DONE
    # A lease that was never extended expires and the task goes to the next worker.
    later = await queue.lease(owner="w3", limit=5, lease_for=MINUTE, now=now + 3 * MINUTE)
    assert sorted(t.step_ref for t in later) == ["b", "c"]


@dataclass
class FrontQueue:
    """A queue in front of the SQL one, as a dispatcher would be: it forwards every
    call and remembers what passed through it."""

    inner: TaskQueue
    leased: list[str] = field(default_factory=list)
    completed: list[str] = field(default_factory=list)

    async def lease(
        self,
        *,
        owner: str,
        limit: int,
        lease_for: timedelta,
        now: datetime,
        handlers: Sequence[str] | None = None,
    ) -> list[TaskRecord]:
        tasks = await self.inner.lease(
            owner=owner, limit=limit, lease_for=lease_for, now=now, handlers=handlers
        )
        self.leased.extend(t.step_ref for t in tasks)
        return tasks

    async def extend(
        self, refs: Sequence[TaskRef], *, owner: str, lease_until: datetime
    ) -> list[bool]:
        return await self.inner.extend(refs, owner=owner, lease_until=lease_until)

    async def complete(self, tx: Tx, refs: Sequence[TaskRef]) -> None:
        await self.inner.complete(tx, refs)
        self.completed.extend(r.task_id for r in refs)

    async def release(self, refs: Sequence[TaskRef], *, available_at: datetime) -> int:
        return await self.inner.release(refs, available_at=available_at)


ACTIONS = {
    "family_slug": "two-actions",
    "title": "Two actions",
    "steps": [
        {
            "ref": ref,
            "type": "STEP_TYPE_ACTION",
            "title": ref,
            "args": {"action": "noop", "params": {"step": f'"{ref}"'}},
        }
        for ref in ("first", "second")
    ],
    "edges": [{"source_ref": "first", "target_ref": "second", "type": "EDGE_TYPE_SUCCESS"}],
}


async def test_workers_take_every_task_through_the_queue_they_are_given(store: Store) -> None:
    front = FrontQueue(SqlTaskQueue(store))
    clock = ManualClock()
    actions = default_registry()
    async with Runtime.start(
        store, config=TEST_CONFIG, clock=clock, actions=actions, queue=front
    ) as runtime:
        engine = Engine(store=store, clock=clock, actions=actions, runtime=runtime)
        assert runtime.queue is front
        assert runtime.workers.queue is front
        await engine.publish(ACTIONS)
        run = await engine.trigger("two-actions", {})
        done = await engine.wait_run(run.id)
    assert done.status == SUCCEEDED
    assert done.output == {"second": {"step": "second"}}
    assert front.leased == ["first", "second"]
    assert len(front.completed) == 2
