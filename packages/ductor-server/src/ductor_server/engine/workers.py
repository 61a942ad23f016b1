"""Step workers: lease tasks, run their handlers, and report each outcome.

A worker never touches run state. It takes tasks through the `TaskQueue` port.
For every finished attempt it appends the attempt row, queues an
`AttemptResult` in the run's inbox and completes the task, all in one
transaction (many attempts per transaction); a redelivered task whose attempt
is already recorded writes nothing but the completion. In a process that also
coordinates, the results go to the coordinator in that transaction first
(`ResultTicker`), which ticks the runs it can there; only the rest are queued.

Poisoned tasks: a task leased with `deaths >= poison_after` (its lease expired
that many times, so a process died or stalled with it in flight each time) is
not run again. Its attempt is recorded as failed with `attempt.poisoned`
(non-retryable) through the same report path, so one tenant's task that kills
its process cannot crash-loop the server for every tenant.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, StatusCode

from ductor_core.runs import AttemptResult, ErrorInfo
from ductor_server.engine.actions import ActionCall, ActionFailed, ActionRegistry
from ductor_server.engine.clock import Clock
from ductor_server.engine.fairness import Ticket
from ductor_server.engine.fairqueue import run_ticket
from ductor_server.engine.queue import Topic, WakeUp
from ductor_server.engine.taskqueue import QueuedTaking, SqlTaskQueue, TakesAtOnce, TaskQueue
from ductor_server.storage.protocol import Store, Tx
from ductor_server.storage.records import AttemptRecord, NewInboxItem, NewTask, TaskRecord, TaskRef
from ductor_server.telemetry import (
    ATTEMPT_DURATION,
    TASK_WAIT,
    attempt_outcome,
    context_from,
    meter,
    tracer,
    wants_spans,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ductor_server.engine.effects import StartedRun, TaskTaker

log = logging.getLogger("ductor.workers")
poisoned_counter = meter.create_counter(
    "ductor.attempts.poisoned",
    unit="{attempt}",
    description="Attempts quarantined because their task kept killing its process.",
)

POISONED = "attempt.poisoned"
"""The error code of an attempt quarantined instead of run."""


def worker_owner_id() -> str:
    """A lease owner id unique to this worker instance."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class ResultTicker(Protocol):
    """Ticks runs in the transaction that queued their results (the coordinator)."""

    async def tick_reported(
        self,
        tx: Tx,
        results: Sequence[NewInboxItem],
        now: datetime,
        *,
        taker: TaskTaker | None = None,
        fresh: Callable[[], Awaitable[list[bool]]] | None = None,
    ) -> tuple[list[NewInboxItem], Callable[[], None] | None]:
        """Returns the results it did not tick, and what to call once `tx`
        commits (None: nothing was ticked). The ticks' new tasks are queued
        through `taker` when given. With `fresh`, only the results it flags
        (per result, in order) are taken; it is asked once the runs are locked."""
        ...


class _Taker:
    """A report's `TaskTaker`: queues the ticks' new tasks, and leases to this
    worker, at once, those whose run's previous step it just reported and that
    the queue lets start now (`TakesAtOnce`), into the slots the reported tasks
    held for their report. Nothing waits for the insert: which tasks were
    leased is read once the transaction has committed (`collect`)."""

    def __init__(
        self,
        queue: TakesAtOnce,
        tickets: dict[tuple[str, str], Ticket],
        *,
        owner: str,
        slots: int,
        lease_for: timedelta,
        clock: Clock,
    ) -> None:
        self.queue = queue
        self.tickets = tickets  # (tenant, run) -> the ticket of its reported step
        self.owner = owner
        self.slots = slots
        self.lease_for = lease_for
        self.clock = clock
        self._takings: list[QueuedTaking] = []
        self._chosen = 0  # slots the queued takings may fill

    async def enqueue(
        self,
        tx: Tx,
        tasks: Sequence[NewTask],
        started: Mapping[tuple[str, str], StartedRun],
    ) -> bool:
        taking = await self.queue.enqueue_taking_later(
            tx,
            [(task, self._ticket(task, started)) for task in tasks],
            owner=self.owner,
            limit=self.slots - self._chosen,
            lease_for=self.lease_for,
            now=self.clock.now(),  # a retry's task due later is left to the queue
        )
        self._takings.append(taking)
        self._chosen += taking.leasing
        return taking.left

    async def collect(self) -> list[TaskRecord]:
        """Once the transaction has committed: the tasks it leased to this worker."""
        taken: list[TaskRecord] = []
        for taking in self._takings:
            taken.extend((await taking.result())[1])
        self._takings = []
        return taken

    def forget(self) -> None:
        """The transaction did not commit: the queue forgets what it leased."""
        takings, self._takings = self._takings, []
        for taking in takings:
            taking.untake()

    def _ticket(
        self, task: NewTask, started: Mapping[tuple[str, str], StartedRun]
    ) -> Ticket | None:
        """What `task` would be scheduled as (None: it is left to the queue): the
        ticket of its run's step this report holds."""
        return self.tickets.get((task.tenant_id, task.run_id))


class _StartTaker(_Taker):
    """A trigger's `StartTaker`: leases its new runs' first tasks to this worker at
    once, when the queue lets them start now, into the `slots` the worker holds
    for them while the trigger's transaction runs. Each task is scheduled as its
    run's workflow and limits say, as the queue's look would schedule it."""

    def __init__(self, workers: Workers, queue: TakesAtOnce, slots: int) -> None:
        super().__init__(
            queue,
            {},
            owner=workers.owner,
            slots=slots,
            lease_for=workers.lease,
            clock=workers.clock,
        )
        self.workers = workers

    def _ticket(
        self, task: NewTask, started: Mapping[tuple[str, str], StartedRun]
    ) -> Ticket | None:
        """The ticket of a run this trigger created: its workflow and limits."""
        run = started.get((task.tenant_id, task.run_id))
        return None if run is None else run_ticket("", task.tenant_id, run.workflow, run.limits)

    async def settle(self, committed: bool) -> None:
        await self.workers._settle_start(self, committed)


@contextlib.contextmanager
def _traced_task(task: TaskRecord) -> Iterator[Span]:
    """The task's span, which continues the trace of the tick (or trigger) that
    queued it, whichever process that was, and its attempt's span within it."""
    with (
        tracer.start_as_current_span(
            "ductor.task",
            context=context_from(task.trace_context),
            kind=SpanKind.CONSUMER,
            attributes={
                "ductor.tenant": task.tenant_id,
                "ductor.task_id": task.id,
                "ductor.run_id": task.run_id,
                "ductor.step_ref": task.step_ref,
                "ductor.item_index": task.item_index,
                "ductor.handler": task.handler,
                "ductor.tier": task.tier,
                "ductor.deliveries": task.deliveries,
                "ductor.deaths": task.deaths,
            },
        ),
        tracer.start_as_current_span(
            "ductor.attempt",
            attributes={
                "ductor.run_id": task.run_id,
                "ductor.step_ref": task.step_ref,
                "ductor.item_index": task.item_index,
                "ductor.attempt": task.attempt,
                "ductor.handler": task.handler,
            },
        ) as span,
    ):
        yield span


def _task_spans(task: TaskRecord) -> contextlib.AbstractContextManager[Span]:
    """`_traced_task`, or no span at all where none is wanted (`wants_spans`)."""
    if wants_spans(task.trace_context):
        return _traced_task(task)
    return contextlib.nullcontext(INVALID_SPAN)


@dataclass(frozen=True)
class _Outcome:
    task: TaskRecord
    attempt: AttemptRecord


def call_for(task: TaskRecord) -> ActionCall:
    """The handler call that carries out `task`."""
    return ActionCall(
        tenant_id=task.tenant_id,
        run_id=task.run_id,
        step_ref=task.step_ref,
        item_index=task.item_index,
        attempt=task.attempt,
        handler=task.handler,
        step_type=task.step_type,
        payload=task.payload,
        idempotency_key=task.idempotency_key,
        timeout_seconds=task.timeout_seconds,
    )


class _BadOutput(Exception):
    pass


def _as_json(value: Any) -> Any:
    """`value` as plain JSON data (tuples become lists, datetimes strings...)."""
    try:
        return msgspec.json.decode(msgspec.json.encode(value))
    except (TypeError, ValueError, msgspec.EncodeError) as exc:
        raise _BadOutput(str(exc)) from exc


_SPLIT_AFTER = 3  # failed tries before a batch is reported one outcome at a time
_GIVE_UP_AFTER = 8  # failed tries before one outcome is dropped (its lease will expire)


class Workers:
    """Leases tasks in batches and runs up to `concurrency` handlers at once.

    Tasks come through `queue` (the store's tasks table when not given). A task
    leased after `poison_after` deaths is quarantined, not run (0: never).
    """

    def __init__(
        self,
        store: Store,
        registry: ActionRegistry,
        *,
        clock: Clock,
        wake: WakeUp,
        batch: int = 64,
        concurrency: int = 64,
        lease_seconds: float = 60.0,
        poll_interval: float = 0.5,
        owner: str | None = None,
        queue: TaskQueue | None = None,
        poison_after: int = 3,
    ) -> None:
        self.store = store
        self.queue: TaskQueue = queue if queue is not None else SqlTaskQueue(store)
        self.registry = registry
        self.clock = clock
        self.wake = wake
        self.batch = batch
        self.concurrency = concurrency
        self.lease = timedelta(seconds=lease_seconds)
        self.poll_interval = poll_interval
        self.owner = owner or worker_owner_id()
        self.poison_after = poison_after
        self.stopped = False  # set by the Runtime on stop; loops exit at their next turn
        self.attempts_recorded = 0  # new attempts committed since start
        self.redeliveries_dropped = 0  # outcomes whose attempt was already recorded
        self.lease_batches = 0  # lease round trips that returned tasks
        self.poisoned = 0  # tasks quarantined instead of run
        self.stalls = 0  # own tasks re-leased after their lease ran out (not run again)
        self.report_batches = 0  # report transactions
        self.most_reports_at_once = 0  # the most report loops seen reporting together
        self._reporting = 0  # report loops reporting now
        self.ticker: ResultTicker | None = None  # set by the Runtime (see `report`)
        self.take_at_once = True  # with a ticker and a queue that `TakesAtOnce`
        self.taken_at_once = 0  # tasks leased in the report that queued them
        self._taking = self.queue if isinstance(self.queue, TakesAtOnce) else None
        self._holding: set[str] = set()  # finished tasks whose slots await their report
        self._leasing = 0  # slots a lease in flight may fill
        self._starting = 0  # slots held for triggers' first tasks (`start_taker`)
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._leased: dict[str, TaskRecord] = {}
        self._outcomes: asyncio.Queue[_Outcome] = asyncio.Queue()
        self._slot_free = asyncio.Event()

    # --- leasing ---------------------------------------------------------------

    async def run_forever(self) -> None:
        """Lease and run tasks until cancelled (then `stop` finishes the job)."""
        failures = 0
        while not self.stopped:
            free = self._free()
            if free <= 0:
                self._slot_free.clear()
                await self._slot_free.wait()
                continue
            limit = min(self.batch, free)
            self._leasing = limit
            try:
                leased = await self.lease_batch(limit)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception:
                failures += 1
                log.exception("leasing tasks failed (%d in a row)", failures)
                await asyncio.sleep(min(0.05 * 2**failures, 5.0))
                continue
            finally:
                self._leasing = 0
            # Fewer tasks than asked for: the queue had no more to give (a queue
            # that refused some it chose wakes this loop itself), so wait for the
            # next wake-up rather than look again at once.
            if len(leased) < limit:
                await self.wake.wait(Topic.TASKS, self.poll_interval)

    async def lease_batch(self, limit: int) -> list[TaskRecord]:
        """Lease up to `limit` tasks and start their handlers; return the started ones.

        A task this worker still holds (its handler runs, or its outcome awaits
        its report) whose lease expired comes back leased to it again and is not
        started twice.
        """
        held = set(self._leased)
        tasks = await self.queue.lease(
            owner=self.owner, limit=limit, lease_for=self.lease, now=self.clock.now()
        )
        if tasks:
            self.lease_batches += 1
        fresh: list[TaskRecord] = []
        for task in tasks:
            if task.id in held:
                # Our own lease ran out while the handler still ran or its outcome
                # waited to be reported (a stall, not a death): we hold the task
                # again, and running it a second time would repeat its side effect.
                self.stalls += 1
                self.wake.notify(Topic.TASKS)  # others may be ready in its place
                continue
            fresh.append(task)
            self._start(task)
        return fresh

    def _free(self) -> int:
        """Slots neither running a handler nor held for a lease or a report."""
        held = len(self._inflight) + len(self._holding) + self._leasing + self._starting
        return self.concurrency - held

    def _taking_queue(self) -> TakesAtOnce | None:
        """The queue, when a report may hand a finished task's slot to its run's
        next task (`TakesAtOnce`, `enqueue_taking_later`, a ticker in this process)."""
        if not self.take_at_once or self.ticker is None:
            return None
        return self._taking

    def start_taker(self, runs: int = 1) -> _StartTaker | None:
        """A taker for a trigger's transaction in this process, which starts `runs`
        runs: it may lease their first tasks to this worker at once (None: the
        queue cannot take tasks at once, something waits in it, or no slot is
        free). Up to `runs` free slots are held for it until `settle`, which the
        caller must call once the transaction ends."""
        queue = self._taking if self.take_at_once else None
        slots = min(runs, self._free())
        if self.stopped or queue is None or slots <= 0 or not queue.takes_now():
            return None
        self._starting += slots
        return _StartTaker(self, queue, slots)

    async def _settle_start(self, taker: _StartTaker, committed: bool) -> None:
        """A trigger's transaction ended: start what it took, or forget it, and
        free the slots it held and did not fill."""
        taken: list[TaskRecord] = []
        if committed:
            taken = await self._collect(taker)
        else:
            taker.forget()
        self._starting -= taker.slots
        self.taken_at_once += len(taken)
        for task in taken:
            self._start(task)
        if len(taken) < taker.slots:
            self._slot_free.set()

    async def _collect(self, taker: _Taker) -> list[TaskRecord]:
        """The tasks a committed transaction leased to this worker at once. Should
        their insert's answer not be read (it was, with the COMMIT), their leases
        lapse and the queue hands them out again."""
        try:
            return await taker.collect()
        except Exception:
            log.exception("reading the tasks taken at once failed (their leases will lapse)")
            taker.forget()  # the queue counts none of them as running here
            return []

    def _start(self, task: TaskRecord) -> None:
        self._leased[task.id] = task
        self._inflight[task.id] = asyncio.create_task(
            self._execute(task), name=f"ductor-task-{task.id}"
        )

    async def _execute(self, task: TaskRecord) -> None:
        started = self.clock.now()
        if task.deliveries <= 1:
            waited = (started - task.available_at).total_seconds()
            TASK_WAIT.record(max(waited, 0.0), {"ductor.handler": task.handler})
        try:
            with _task_spans(task) as span:
                clock = time.perf_counter()
                if 0 < self.poison_after <= task.deaths:
                    attempt = self._quarantine(task, started)
                else:
                    attempt = await self._attempt(task, started)
                error = attempt.error
                outcome = attempt_outcome(
                    ok=attempt.ok,
                    code=None if error is None else error.code,
                    retryable=error is not None and error.retryable,
                )
                ATTEMPT_DURATION.record(
                    time.perf_counter() - clock,
                    {"ductor.handler": task.handler, "ductor.outcome": outcome},
                )
                span.set_attribute("ductor.ok", attempt.ok)
                span.set_attribute("ductor.outcome", outcome)
                if error is not None:
                    span.set_attribute("ductor.error_code", error.code)
                    span.set_status(StatusCode.ERROR, error.code)
            # The slot waits for the report only while nothing waits its turn:
            # else the lease loop has work for it.
            taking = self._taking_queue()
            if taking is not None and taking.takes_now():
                self._holding.add(task.id)
            await self._outcomes.put(_Outcome(task=task, attempt=attempt))
        finally:
            self._inflight.pop(task.id, None)
            if task.id not in self._holding:
                self._slot_free.set()

    def _quarantine(self, task: TaskRecord, started: datetime) -> AttemptRecord:
        """The failed attempt of a task that killed its process too often."""
        self.poisoned += 1
        poisoned_counter.add(1, {"ductor.tenant": task.tenant_id, "ductor.handler": task.handler})
        item = "" if task.item_index < 0 else f" item {task.item_index}"
        log.error(
            "quarantined task %s (tenant %s, run %s, step %s%s, handler %s, attempt %d):"
            " its process died %d times with it in flight",
            task.id,
            task.tenant_id,
            task.run_id,
            task.step_ref,
            item,
            task.handler,
            task.attempt,
            task.deaths,
        )
        return AttemptRecord(
            tenant_id=task.tenant_id,
            run_id=task.run_id,
            step_ref=task.step_ref,
            item_index=task.item_index,
            attempt=task.attempt,
            ok=False,
            error=ErrorInfo(
                code=POISONED,
                message=(
                    f"step {task.step_ref!r}{item} was not run again: the process running"
                    f" its attempt {task.attempt} died {task.deaths} times before finishing it"
                ),
                retryable=False,
                details={"deaths": task.deaths, "handler": task.handler},
            ),
            started_at=started,
            finished_at=self.clock.now(),
        )

    async def _attempt(self, task: TaskRecord, started: datetime) -> AttemptRecord:
        ok, output, error = False, None, None
        try:
            if task.timeout_seconds is not None and task.timeout_seconds > 0:
                async with asyncio.timeout(task.timeout_seconds):
                    output = await self.registry.run(call_for(task))
            else:
                output = await self.registry.run(call_for(task))
            output = _as_json(output)
            ok = True
        except _BadOutput as exc:
            output = None
            error = ErrorInfo(
                code="handler.bad_output",
                message=f"the handler returned a value that is not JSON: {exc}",
                retryable=False,
            )
        except ActionFailed as exc:
            error = exc.error
        except TimeoutError:
            error = ErrorInfo(
                code="step.timeout",
                message=f"attempt did not finish within {task.timeout_seconds:g}s",
                retryable=True,
            )
        except (Exception, SystemExit) as exc:
            # A handler's bug (or its sys.exit()) fails the attempt, not the worker's process.
            log.exception("handler %s crashed on task %s", task.handler, task.id)
            error = ErrorInfo(
                code="handler.crashed", message=f"{type(exc).__name__}: {exc}", retryable=True
            )
        return AttemptRecord(
            tenant_id=task.tenant_id,
            run_id=task.run_id,
            step_ref=task.step_ref,
            item_index=task.item_index,
            attempt=task.attempt,
            ok=ok,
            output=output,
            error=error,
            started_at=started,
            finished_at=self.clock.now(),
        )

    # --- reporting -------------------------------------------------------------

    async def report_forever(self) -> None:
        """Commit finished attempts in batches until cancelled.

        Several loops may run at once (`RuntimeConfig.report_loops`): each takes
        what has finished when it comes round, so one loop's batch is built and
        ticked while another waits for the database.
        """
        while not self.stopped:
            first = await self._outcomes.get()
            batch = [first]
            while not self._outcomes.empty() and len(batch) < 512:
                batch.append(self._outcomes.get_nowait())
            self._reporting += 1
            self.most_reports_at_once = max(self.most_reports_at_once, self._reporting)
            try:
                await self._report_with_retry(batch)
            finally:
                self._reporting -= 1

    async def _report_with_retry(self, batch: list[_Outcome]) -> None:
        """Report a batch; if it keeps failing, report its outcomes one by one, and
        drop one that still fails (its task is re-leased when the lease expires,
        so the attempt runs again: at-least-once, never lost)."""
        failures = 0
        while not self.stopped:
            try:
                # A retry only reports: whatever failed may have been the tick.
                await self.report(batch, tick=not failures)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                failures += 1
                log.exception("reporting %d attempts failed (%d in a row)", len(batch), failures)
            if len(batch) > 1 and failures >= _SPLIT_AFTER:
                for outcome in batch:
                    await self._report_with_retry([outcome])
                return
            if failures >= _GIVE_UP_AFTER:
                [outcome] = batch
                log.error(
                    "dropping the outcome of task %s after %d tries", outcome.task.id, failures
                )
                self._leased.pop(outcome.task.id, None)
                self._release_slots([outcome])
                return
            await asyncio.sleep(min(0.05 * 2**failures, 5.0))

    async def report(self, batch: list[_Outcome], *, tick: bool = True) -> None:
        """Record attempts, queue their results and complete their tasks, in one commit.

        With a `ticker` (the coordinator of this process) and `tick`, the
        results go to the ticker first, which ticks their runs in that commit
        where it can; only the rest are queued in the inbox. The ticks' new
        tasks that the queue lets start now are leased to this worker in that
        commit too, and started once it is done (`TakesAtOnce`).
        """
        refs = [TaskRef(tenant_id=o.task.tenant_id, task_id=o.task.id) for o in batch]
        ticking = tick and self.ticker is not None
        taker = self._taker(batch) if ticking else None
        ticked: Callable[[], None] | None = None
        try:
            async with self.store.transaction() as tx:
                # Nothing waits for the attempts' insert or the completions: they go
                # out with the ticker's lock of the runs, in one round trip.
                fresh = await tx.record_attempts_later([o.attempt for o in batch])
                await self.queue.complete(tx, refs)
                candidates = [
                    NewInboxItem(
                        tenant_id=o.task.tenant_id,
                        run_id=o.task.run_id,
                        input=AttemptResult(
                            step_ref=o.attempt.step_ref,
                            item_index=o.attempt.item_index,
                            attempt=o.attempt.attempt,
                            ok=o.attempt.ok,
                            output=o.attempt.output,
                            error=o.attempt.error,
                        ),
                        available_at=o.attempt.finished_at,
                    )
                    for o in batch
                ]
                queued: list[NewInboxItem] | None = None
                if ticking and self.ticker is not None:
                    queued, ticked = await self.ticker.tick_reported(
                        tx, candidates, self.clock.now(), taker=taker, fresh=fresh
                    )
                new = await fresh()
                results = [c for c, recorded in zip(candidates, new, strict=True) if recorded]
                if queued is None:
                    queued = results
                if queued:
                    await tx.enqueue_inbox(queued)
        except BaseException:
            if taker is not None:
                taker.forget()
            raise
        taken = [] if taker is None else await self._collect(taker)
        for o in batch:
            self._leased.pop(o.task.id, None)
        # The batch's slots pass to the tasks taken at once; the rest are free.
        self._release_slots(batch)
        self.taken_at_once += len(taken)
        for task in taken:
            self._start(task)
        self.report_batches += 1
        self.attempts_recorded += len(results)
        self.redeliveries_dropped += len(batch) - len(results)
        if ticked is not None:
            ticked()
        if queued:
            self.wake.notify(Topic.INBOX)

    def _release_slots(self, batch: list[_Outcome]) -> None:
        """The reported tasks' slots are no longer held for their report."""
        held = len(self._holding)
        for o in batch:
            self._holding.discard(o.task.id)
        if len(self._holding) < held:
            self._slot_free.set()

    def _taker(self, batch: list[_Outcome]) -> _Taker | None:
        """The taker of a report's new tasks: it may fill the slots the batch's
        tasks held for their report (None: none, or the queue cannot take
        tasks at once). Called before the tasks complete, while the queue
        still holds their tickets."""
        queue = self._taking_queue()
        held = [o for o in batch if o.task.id in self._holding]
        if self.stopped or queue is None or not held:
            return None
        by_task = queue.tickets_of(
            [TaskRef(tenant_id=o.task.tenant_id, task_id=o.task.id) for o in held]
        )
        tickets = {
            (o.task.tenant_id, o.task.run_id): by_task[o.task.id]
            for o in held
            if o.task.id in by_task
        }
        slots = len(tickets)
        if slots <= 0:
            return None
        return _Taker(
            queue,
            tickets,
            owner=self.owner,
            slots=slots,
            lease_for=self.lease,
            clock=self.clock,
        )

    # --- leases ------------------------------------------------------------------

    async def heartbeat_forever(self) -> None:
        """Extend the leases of held tasks every third of the lease, until cancelled."""
        interval = max(self.lease.total_seconds() / 3, 0.05)
        while not self.stopped:
            await asyncio.sleep(interval)
            try:
                await self.heartbeat()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("extending %d leases failed", len(self._leased))

    async def heartbeat(self) -> int:
        """Extend the lease of every task this worker holds; return how many.

        Held means running *or finished and not yet reported*: a finished task
        whose report waits (a busy store) is still this worker's, and letting its
        lease lapse would hand it to another worker that runs it again.
        """
        held = list(self._leased.values())
        if not held:
            return 0
        await self.queue.extend(
            [TaskRef(tenant_id=t.tenant_id, task_id=t.id) for t in held],
            owner=self.owner,
            lease_until=self.clock.now() + self.lease,
        )
        return len(held)

    async def drain(self, grace: float) -> None:
        """On shutdown: let running handlers finish for up to `grace` seconds, report
        what finished, and put the rest back in the queue."""
        if self._inflight:
            await asyncio.wait(list(self._inflight.values()), timeout=max(grace, 0.01))
        for task in list(self._inflight.values()):
            task.cancel()
        for task in list(self._inflight.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        batch: list[_Outcome] = []
        while not self._outcomes.empty():
            batch.append(self._outcomes.get_nowait())
        if batch:
            try:
                await self.report(batch)
            except Exception:
                log.exception("reporting %d attempts at shutdown failed", len(batch))
        if self._leased:
            unfinished = [
                TaskRef(tenant_id=t.tenant_id, task_id=t.id) for t in self._leased.values()
            ]
            try:
                await self.queue.release(unfinished, available_at=self.clock.now())
            except Exception:
                log.exception("releasing %d leases at shutdown failed", len(unfinished))
            self._leased.clear()
