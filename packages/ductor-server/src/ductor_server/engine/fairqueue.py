"""The in-process fair `TaskQueue`: the store's tasks, handed out in the order
of `engine.fairness` (tiers, weights, limits).

It keeps in memory which tasks are ready (learned from the store by id, a
full look every `resync_seconds`) and which it leased; the store stays the
truth: each chosen task is leased there by its key, and one that another
worker took meanwhile, or that ended, is refused and forgotten. Limits and
shares hold per process (the Redis queue holds them across processes).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from ductor_server.engine.fairness import FairPolicy, FairScheduler, Ticket
from ductor_server.engine.queue import Topic, WakeUp
from ductor_server.engine.queuepolicy import QueuePolicies
from ductor_server.engine.taskqueue import SqlTaskQueue
from ductor_server.storage.protocol import Store, Tx
from ductor_server.storage.queuefence import hold_queue, raise_fence
from ductor_server.storage.records import NewTask, ReadyTask, RunLimits, TaskRecord, TaskRef

log = logging.getLogger("ductor.fairqueue")

RESCAN_SLACK = 512
"""How far below the highest id seen a look may start again: a task whose
insert committed after one with a larger id is found by such a look, not only
by the next full one."""
RESCAN_EVERY = 0.02
"""Seconds between looks below the highest id seen; the looks in between start
at it."""
GAP_SECONDS = 2.0
"""How long a missing id is looked for below the highest id seen. An insert
that takes longer to commit is found by the next full look."""
EXPIRED_EVERY = timedelta(seconds=1)
"""How often, by the queue's clock, a lease looks for leases that ran out (a
process died or stalled with its task): such a task is free again within this
of its lease's end rather than at the very next lease."""


class Taking:
    """What `LocalFairQueue.enqueue_taking_later` queued in a transaction: the
    tasks leased to the worker are known once the insert has answered."""

    def __init__(
        self,
        queue: LocalFairQueue,
        chosen: dict[int, Ticket],
        stored: Callable[[], Awaitable[list[TaskRecord | None]]],
        *,
        left: bool,
    ) -> None:
        self.queue = queue
        self.chosen = chosen  # the tasks' positions chosen to be taken, with their tickets
        self.stored = stored  # the insert's answer, asked for once
        self.left = left  # some task is left for the queue: wake its lease loop on commit
        self._answer: tuple[list[str | None], list[TaskRecord]] | None = None

    @property
    def leasing(self) -> int:
        """The tasks it leases at most."""
        return len(self.chosen)

    async def result(self) -> tuple[list[str | None], list[TaskRecord]]:
        """Each task's id (None: its attempt key was already queued) and the tasks
        leased, once the insert has answered (the same answer when asked again).
        The chosen tickets then run under their tasks' ids."""
        if self._answer is not None:
            return self._answer
        stored = await self.stored()
        scheduler = self.queue.scheduler
        taken: list[TaskRecord] = []
        for i, ticket in self.chosen.items():
            task = stored[i]
            if task is None:  # its attempt key was queued already: nothing to run
                scheduler.finish(ticket.key)
                continue
            scheduler.rekey(ticket.key, replace(ticket, key=task.id, seq=int(task.id)))
            taken.append(task)
        self.queue.pace.taken(int(t.id) for t in taken)
        self._answer = ([None if task is None else task.id for task in stored], taken)
        return self._answer

    def untake(self) -> None:
        """The transaction did not commit: the chosen tickets run no more."""
        if self._answer is None:
            keys = [ticket.key for ticket in self.chosen.values()]
        else:
            keys = [task.id for task in self._answer[1]]
        self.chosen = {}
        self._answer = ([], [])
        for key in keys:
            self.queue.scheduler.finish(key)


class LookPace:
    """How often a fair queue's cheap look at the store also looks further:
    below the highest task id seen (every `rescan_every` seconds, and only
    while an id under it is missing) and for leases that ran out (every
    `EXPIRED_EVERY` of the queue's clock). Both queues keep one.

    A missing id is one below the highest seen that no look returned: an insert
    not committed yet (two writers commit out of id order), a task not ready
    yet, taken by another process, or an id never used (a rolled-back insert).
    Only the first kind is worth a look, and only for a little while, so a look
    below the highest id starts at the lowest id missing for less than
    `GAP_SECONDS` (never more than `slack` below), and there is none while no id
    is missing: under load the waiting tasks are not read again each time.
    """

    def __init__(self, rescan_every: float, slack: int) -> None:
        self.rescan_every = rescan_every
        self.slack = slack
        self.rescans = 0  # looks that started below the highest id seen
        self._rescanned = 0.0
        self._expired_looked: datetime | None = None
        self._missing: dict[int, float] = {}  # id -> when it was first missed
        self._taken: set[int] = set()  # ids leased as they were queued (never missing)

    def saw_expired(self, now: datetime) -> None:
        """A full look at `now` held the expired leases too."""
        self._expired_looked = now

    def expired_due(self, now: datetime) -> bool:
        """Whether this look also reads the leases that ran out (then counted as done)."""
        if self._expired_looked is not None and now - self._expired_looked < EXPIRED_EVERY:
            return False
        self._expired_looked = now
        return True

    def saw(self, above: int, ids: Iterable[int], clock: float) -> None:
        """A look returned the ready tasks `ids` when the highest id seen was
        `above`: each id it skipped up to its highest is missing from now on
        (unless it was taken as it was queued), and each it returned is missing
        no more."""
        found = set(ids)
        if not found:
            return
        for task_id in found:
            self._missing.pop(task_id, None)
        top = max(found)
        floor = max(above, top - self.slack)
        for task_id in range(floor + 1, top):
            if task_id not in found and task_id not in self._taken:
                self._missing.setdefault(task_id, clock)
        if self._taken:
            self._taken = {task_id for task_id in self._taken if task_id > floor}

    def taken(self, ids: Iterable[int]) -> None:
        """Tasks leased in the transaction that queued them: no look will find
        them ready, and none needs to. Only the newest `slack` or so are kept
        (a look only counts ids that far below its highest as missing), so a
        long stretch of tasks taken at once with no look in between keeps no
        more."""
        for task_id in ids:
            self._missing.pop(task_id, None)
            self._taken.add(task_id)
        if len(self._taken) > 2 * self.slack:
            top = max(self._taken)
            self._taken = {task_id for task_id in self._taken if task_id > top - self.slack}

    def after(self, cursor: int, clock: float) -> int:
        """The id the look by id starts after: `cursor`, or the lowest id still
        missing when a look below it is due."""
        if not self._missing or clock - self._rescanned < self.rescan_every:
            return cursor
        self._rescanned = clock
        floor = cursor - self.slack
        self._missing = {
            task_id: first
            for task_id, first in self._missing.items()
            if task_id > floor and clock - first < GAP_SECONDS
        }
        if not self._missing:
            return cursor
        self.rescans += 1
        return min(self._missing) - 1


def ticket_of(task: ReadyTask) -> Ticket:
    """The scheduler's view of a ready task."""
    return run_ticket(
        task.id, task.tenant_id, task.workflow, task.limits, tier=task.tier, seq=int(task.id)
    )


def run_ticket(
    key: str,
    tenant: str,
    workflow: str,
    limits: RunLimits | None,
    *,
    tier: int = 0,
    seq: int = 0,
) -> Ticket:
    """The ticket of a task of a run of `workflow` with the run's own `limits`."""
    if limits is None:
        return Ticket(key=key, tenant=tenant, workflow=workflow, tier=tier, seq=seq)
    return Ticket(
        key=key,
        tenant=tenant,
        workflow=workflow,
        tier=tier,
        seq=seq,
        limit_key=limits.key,
        key_concurrency=limits.concurrency,
        key_rate=limits.rate,
        key_burst=limits.burst,
    )


class LocalFairQueue:
    """A `TaskQueue` that leases the store's tasks in fair order.

    Args:
        store: where the tasks are.
        policy: the tenants' weights and limits (the settings'); the operators'
            per-tenant policies in the store take its place for their tenants.
        capacity: the worker slots of this process (for the slot shares and
            the headroom); None to share only the order of starts.
        wake: notified (TASKS) when a finished task lets a held-back one start.
        resync_seconds: how often, at most, the whole ready set is read again
            (the safety net for what the cheap look by id misses); never more
            often than ten times the last such read took; 0: at every lease.
        rescan_every: seconds between looks that start below the highest task id
            seen (`RESCAN_EVERY`; 0: at every lease).
        policies: where the policy comes from (built from `policy` and `wake` if None).
        shared: count every process's leases, not only this one's: each lease
            holds the queue lock alone (`storage.queuefence`), reads the tasks
            the store has leased, and raises the queue's fence when it leases
            any (the Redis queue's stand-in while Redis cannot be reached, so
            that the limits still hold across processes, and the Redis queue
            counts these leases before it picks again).
    """

    def __init__(
        self,
        store: Store,
        *,
        policy: FairPolicy | None = None,
        capacity: int | None = None,
        wake: WakeUp | None = None,
        resync_seconds: float = 0.25,
        rescan_every: float = RESCAN_EVERY,
        scan_limit: int = 10_000,
        policies: QueuePolicies | None = None,
        shared: bool = False,
    ) -> None:
        self.store = store
        self.policies = policies or QueuePolicies(policy, wake=wake)
        self.shared = shared
        self.scheduler = FairScheduler(self.policies.policy)
        self.capacity = capacity
        self.wake = wake
        self.resync_seconds = resync_seconds
        self.scan_limit = scan_limit
        self.pace = LookPace(rescan_every, min(RESCAN_SLACK, scan_limit // 2))
        self.refused = 0  # chosen tasks the store would not lease (taken or ended)
        self._sql = SqlTaskQueue(store)
        self._cursor: int | None = None
        self._resynced = 0.0
        self._resync_every = resync_seconds
        self._timer: asyncio.TimerHandle | None = None
        self._standins = 0  # keys of tasks chosen to be taken before their insert

    async def lease(
        self,
        *,
        owner: str,
        limit: int,
        lease_for: timedelta,
        now: datetime,
        handlers: Sequence[str] | None = None,
    ) -> list[TaskRecord]:
        """Lease up to `limit` tasks in fair order. With `handlers` (a worker that
        runs only some handlers) the store's own order applies instead."""
        if handlers is not None:
            return await self._sql.lease(
                owner=owner, limit=limit, lease_for=lease_for, now=now, handlers=handlers
            )
        if limit < 1:
            return []
        at = now.timestamp()
        async with self.store.transaction() as tx:
            if self.shared:
                await hold_queue(tx, alone=True)
            policy = await self.policies.current(tx)
            if policy is not self.scheduler.policy:
                self.scheduler.set_policy(policy)
            await self._refresh(tx, now)
            if self.shared:
                await self._count_leases(tx, now)
            picked = self.scheduler.pick(limit, at, capacity=self.capacity)
            if not picked:
                self._wake_for_rate(at)
                return []
            try:
                leased = await _lease(tx, picked, owner=owner, lease_for=lease_for, now=now)
                if self.shared and any(task is not None for task in leased):
                    await raise_fence(tx)
            except BaseException:
                for ticket in picked:
                    self.scheduler.requeue(ticket.key)
                raise
        out = self._kept(picked, leased)
        if len(out) < len(picked) and self.wake is not None:
            # Others may be ready in place of the refused: look again at once.
            self.wake.notify(Topic.TASKS)
        if len(picked) < limit:
            self._wake_for_rate(at)
        return out

    def takes_now(self) -> bool:
        """Whether no task waits its turn (see `FairScheduler.start_at_once`)."""
        return not self.shared and self.scheduler.ready_count == 0

    def tickets_of(self, refs: Sequence[TaskRef]) -> dict[str, Ticket]:
        """The running tickets of these tasks, by task id (before they complete):
        what a run's next task inherits when it is taken at once."""
        found: dict[str, Ticket] = {}
        for ref in refs:
            ticket = self.scheduler.running_ticket(ref.task_id)
            if ticket is not None:
                found[ref.task_id] = ticket
        return found

    async def enqueue_taking_later(
        self,
        tx: Tx,
        tasks: Sequence[tuple[NewTask, Ticket | None]],
        *,
        owner: str,
        limit: int,
        lease_for: timedelta,
        now: datetime,
    ) -> Taking:
        """Queue `tasks` in `tx`, inserting leased to `owner` up to `limit` of those
        with a ticket (the run's step before them) that may start without
        waiting their turn (`FairScheduler.start_at_once`); the others stay
        queued. Each chosen one counts as running from the choice, under a
        stand-in key until the insert's answer gives its id (`Taking.result`,
        asked once `tx` commits); if `tx` does not commit, `Taking.untake`."""
        at = now.timestamp()
        chosen: dict[int, Ticket] = {}
        if not self.shared:
            for i, (new, like) in enumerate(tasks):
                if len(chosen) >= limit:
                    break
                if like is None or new.available_at > now:
                    continue
                self._standins += 1
                ticket = replace(like, key=f"taking-{self._standins}", seq=0, tier=new.tier)
                if self.scheduler.start_at_once(ticket, at, capacity=self.capacity):
                    chosen[i] = ticket
        try:
            stored = await tx.enqueue_tasks_leasing_later(
                [new for new, _ in tasks],
                [i in chosen for i in range(len(tasks))],
                owner=owner,
                lease_for=lease_for,
                now=now,
            )
        except BaseException:
            for ticket in chosen.values():
                self.scheduler.finish(ticket.key)
            raise
        return Taking(self, chosen, stored, left=len(chosen) < len(tasks))

    def _kept(self, tickets: list[Ticket], leased: list[TaskRecord | None]) -> list[TaskRecord]:
        """The tasks the store leased; the tickets of those it refused (taken or
        ended elsewhere) are finished."""
        out: list[TaskRecord] = []
        for ticket, task in zip(tickets, leased, strict=True):
            if task is None:
                self.refused += 1
                self.scheduler.finish(ticket.key)
            else:
                out.append(task)
        return out

    async def _refresh(self, tx: Tx, now: datetime) -> None:
        clock = time.monotonic()
        if self._cursor is None or clock - self._resynced >= self._resync_every:
            rows = await tx.ready_tasks(now=now, limit=self.scan_limit)
            self._rebuild(rows, full=len(rows) < self.scan_limit)
            self.pace.saw(self._cursor or 0, (int(r.id) for r in rows), clock)
            self._advance(rows)
            self.pace.saw_expired(now)
            self._resynced = time.monotonic()
            # A full look costs more as the backlog grows: the next one comes no
            # sooner than ten times what this one took (0: at every lease).
            if self.resync_seconds > 0:
                took = self._resynced - clock
                self._resync_every = max(self.resync_seconds, 10 * took)
            if len(rows) < self.scan_limit:
                return  # it saw every ready task
        elif self.pace.expired_due(now):
            # Leases that ran out (a process died or stalled with its task) are
            # free again.
            for row in await tx.ready_tasks(now=now, expired_only=True, limit=self.scan_limit):
                if not self.scheduler.requeue(row.id) and row.id not in self.scheduler:
                    self.scheduler.push(ticket_of(row))
        # New tasks by id, also after a full look that could not hold every
        # ready task (it holds the oldest; the newest are found here).
        cursor = self._cursor or 0
        after = self.pace.after(cursor, clock)
        rows = await tx.ready_tasks(now=now, after_id=str(after), limit=self.scan_limit)
        for row in rows:
            if row.id not in self.scheduler:
                self.scheduler.push(ticket_of(row))
        self.pace.saw(cursor, (int(r.id) for r in rows), clock)
        self._advance(rows)

    def _advance(self, rows: list[ReadyTask]) -> None:
        if rows:
            self._cursor = max(self._cursor or 0, max(int(r.id) for r in rows))

    async def _count_leases(self, tx: Tx, now: datetime) -> None:
        """Count as running exactly the tasks the store has leased now."""
        rows = await tx.leased_tasks(now=now, limit=self.scan_limit)
        held = {row.id for row in rows}
        if len(rows) < self.scan_limit:
            for ticket in list(self.scheduler.running()):
                if ticket.key not in held:
                    self.scheduler.finish(ticket.key)
        for row in rows:
            self.scheduler.mark_running(ticket_of(row))

    def _rebuild(self, rows: list[ReadyTask], *, full: bool) -> None:
        """Make the ready set what the store says (tasks this queue leased stay
        running; a ready task the store no longer has as ready is forgotten)."""
        seen = {row.id for row in rows}
        top = max((int(r.id) for r in rows), default=0)
        for ticket in list(self.scheduler.ready()):
            if ticket.key not in seen and (full or int(ticket.key) <= top):
                self.scheduler.discard(ticket.key)
        for row in rows:
            if row.expired:
                self.scheduler.requeue(row.id)
            if row.id not in self.scheduler:
                self.scheduler.push(ticket_of(row))

    def _wake_for_rate(self, at: float) -> None:
        # Tasks held back only by a rate limit: wake the workers when the first
        # can start rather than at their next poll.
        if self.wake is None or self._timer is not None:
            return
        when = self.scheduler.next_start_at(at)
        if when is None:
            return
        wake = self.wake

        def fire() -> None:
            self._timer = None
            wake.notify(Topic.TASKS)

        self._timer = asyncio.get_running_loop().call_later(max(when - at, 0.001), fire)

    async def extend(
        self, refs: Sequence[TaskRef], *, owner: str, lease_until: datetime
    ) -> list[bool]:
        """Push the leases in the store."""
        return await self._sql.extend(refs, owner=owner, lease_until=lease_until)

    async def complete(self, tx: Tx, refs: Sequence[TaskRef]) -> None:
        """Mark the tasks done in `tx`; their slots count as free from now on."""
        await tx.finish_tasks(refs)
        tenants = set()
        for ref in refs:
            if self.scheduler.finish(ref.task_id):
                tenants.add(ref.tenant_id)
        if self.wake is not None and any(self.scheduler.has_ready(t) for t in tenants):
            self.wake.notify(Topic.TASKS)

    async def release(self, refs: Sequence[TaskRef], *, available_at: datetime) -> int:
        """Give the tasks back in the store; they are ready again here too."""
        count = await self._sql.release(refs, available_at=available_at)
        for ref in refs:
            self.scheduler.requeue(ref.task_id)
        return count


async def _lease(
    tx: Tx, tickets: list[Ticket], *, owner: str, lease_for: timedelta, now: datetime
) -> list[TaskRecord | None]:
    """Lease the tasks of `tickets` in the store, by key (None: refused)."""
    refs = [TaskRef(tenant_id=t.tenant, task_id=t.key) for t in tickets]
    return await tx.lease_chosen_tasks(refs, owner=owner, lease_for=lease_for, now=now)


__all__ = [
    "EXPIRED_EVERY",
    "RESCAN_EVERY",
    "RESCAN_SLACK",
    "LocalFairQueue",
    "LookPace",
    "Taking",
    "run_ticket",
    "ticket_of",
]
