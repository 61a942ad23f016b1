"""The `TaskQueue` port: how step workers take, hold, finish and give back tasks.

Tasks are enqueued by the coordinator's effects inside the tick transaction
(`Tx.enqueue_tasks`), so the store always holds the truth: every task, its
lease, its heartbeat and its completion. A queue decides only how workers find
work. `SqlTaskQueue` leases straight from the tasks table. A dispatcher (Redis)
may stand in front of it later, handing workers the ids it learned of, as long
as each lease is then taken in the store (where a task already leased or done
is refused) and everything else is recorded there too; flushing the dispatcher
then costs latency, never a task.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Protocol, runtime_checkable

from ductor_server.engine.fairness import Ticket
from ductor_server.storage.protocol import Store, Tx
from ductor_server.storage.records import NewTask, TaskRecord, TaskRef


class TaskQueue(Protocol):
    """What workers ask of the task queue (enqueueing is the tick's, not theirs)."""

    async def lease(
        self,
        *,
        owner: str,
        limit: int,
        lease_for: timedelta,
        now: datetime,
        handlers: Sequence[str] | None = None,
    ) -> list[TaskRecord]:
        """Lease up to `limit` tasks to `owner` until `now + lease_for` (an expired
        lease counts as free: delivery is at least once). Optionally only tasks
        whose handler is in `handlers`."""
        ...

    async def extend(
        self, refs: Sequence[TaskRef], *, owner: str, lease_until: datetime
    ) -> list[bool]:
        """Heartbeat: push the leases `owner` still holds; False where it lost one."""
        ...

    async def complete(self, tx: Tx, refs: Sequence[TaskRef]) -> None:
        """Mark tasks done inside `tx`, the transaction that records their attempts
        (so an attempt and its task's completion commit together). It answers
        nothing, so the store may send it with the transaction's next statement
        (`Tx.finish_tasks`)."""
        ...

    async def release(self, refs: Sequence[TaskRef], *, available_at: datetime) -> int:
        """Give leased tasks back (on shutdown), available again at `available_at`;
        returns how many."""
        ...


@runtime_checkable
class TakesAtOnce(Protocol):
    """A `TaskQueue` that can lease a run's next tasks to the worker that ran the
    step before them, in the transaction that reports that step and queues them
    (no lease transaction of their own, and no wait for a wake-up), when that
    takes no other task's turn."""

    def takes_now(self) -> bool:
        """Whether a task could be taken at once now (nothing waits its turn):
        a worker then keeps a finished task's slot for the run's next task
        rather than give it to its lease loop."""
        ...

    def tickets_of(self, refs: Sequence[TaskRef]) -> dict[str, Ticket]:
        """The queue's tickets of these leased tasks, by task id (before they
        complete): what a run's next task is scheduled as."""
        ...

    async def enqueue_taking_later(
        self,
        tx: Tx,
        tasks: Sequence[tuple[NewTask, Ticket | None]],
        *,
        owner: str,
        limit: int,
        lease_for: timedelta,
        now: datetime,
    ) -> QueuedTaking:
        """Queue `tasks` (each with what it would be scheduled as: the ticket of
        its run's previous step, or None to leave it to the queue) in `tx`, and
        lease to `owner`, as they are inserted, up to `limit` of them that may
        start now. Nothing waits for the insert's answer: ask the result for it
        once `tx` has committed, or untake it if `tx` did not commit."""
        ...


class QueuedTaking(Protocol):
    """The tasks `TakesAtOnce.enqueue_taking_later` queued in a transaction."""

    left: bool
    """Some of the tasks were left for the queue (its lease loop is to be woken
    once the transaction commits)."""

    @property
    def leasing(self) -> int:
        """How many of the tasks it leases at most (one whose attempt key was
        already queued is not inserted, so not leased either)."""
        ...

    async def result(self) -> tuple[list[str | None], list[TaskRecord]]:
        """Each task's id (None: its attempt key was already queued) and the
        tasks leased; asked once the transaction has committed."""
        ...

    def untake(self) -> None:
        """Forget the tasks leased: the transaction did not commit."""
        ...


class SqlTaskQueue:
    """The `TaskQueue` on the store's tasks table: one short transaction per call
    (SKIP LOCKED leases on Postgres), completion in the caller's transaction."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def lease(
        self,
        *,
        owner: str,
        limit: int,
        lease_for: timedelta,
        now: datetime,
        handlers: Sequence[str] | None = None,
    ) -> list[TaskRecord]:
        """Lease from the tasks table (see `Tx.lease_tasks` for the order)."""
        async with self.store.transaction() as tx:
            return await tx.lease_tasks(
                owner=owner, limit=limit, lease_for=lease_for, now=now, handlers=handlers
            )

    async def extend(
        self, refs: Sequence[TaskRef], *, owner: str, lease_until: datetime
    ) -> list[bool]:
        """Push the leases in one transaction."""
        if not refs:
            return []
        async with self.store.transaction() as tx:
            return await tx.extend_leases(refs, owner=owner, lease_until=lease_until)

    async def complete(self, tx: Tx, refs: Sequence[TaskRef]) -> None:
        """Mark the tasks done in the caller's transaction."""
        await tx.finish_tasks(refs)

    async def release(self, refs: Sequence[TaskRef], *, available_at: datetime) -> int:
        """Requeue the tasks in one transaction."""
        if not refs:
            return 0
        async with self.store.transaction() as tx:
            return await tx.release_tasks(refs, available_at=available_at)


__all__ = [
    "QueuedTaking",
    "SqlTaskQueue",
    "TakesAtOnce",
    "TaskQueue",
]
