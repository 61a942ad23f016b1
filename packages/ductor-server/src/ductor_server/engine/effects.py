"""Carrying out a tick inside the caller's transaction: starting DAG runs and
turning tick commands into store writes (tasks, timers, waits, child runs, run ends).

Every write goes through the given `Tx`; the caller commits. Nothing here
reads the clock or wakes loops itself: it records which loops to wake. Runs of
other kinds are reached through `EngineParts.kinds`, never imported.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, assert_never

from ductor_core.builtin_steps import BUILTIN_STEP_SPECS
from ductor_core.concurrency import ConcurrencyOption, key_value, stored_key
from ductor_core.definitions import WorkflowDefinition
from ductor_core.expressions import ExpressionEngine, default_engine
from ductor_core.runs import (
    CancelChildRuns,
    CancelRequested,
    CancelTimer,
    ChildRunEnded,
    ClearWait,
    Command,
    DispatchTask,
    RegisterWait,
    RunFinished,
    RunStatus,
    SendNotifications,
    SetTimer,
    StartChildRun,
    TickResult,
)
from ductor_core.step_specs import StepSpecs
from ductor_core.tick import start_run
from ductor_server.engine.catalog import WorkflowCatalog
from ductor_server.engine.cheap import cheap
from ductor_server.engine.history import transition_entries
from ductor_server.engine.inboxfeed import InboxFeed
from ductor_server.engine.inputs import refuse_bad_input
from ductor_server.engine.kinds import RunKinds
from ductor_server.engine.notify import write_notifications
from ductor_server.engine.offload import (
    ENGINE,
    portable_engine,
    portable_specs,
    resolve_engine,
    resolve_specs,
)
from ductor_server.engine.queue import Topic, WakeUp
from ductor_server.errors import RunInputInvalid
from ductor_server.storage.protocol import Tx
from ductor_server.storage.records import (
    NewHistoryEntry,
    NewInboxItem,
    NewRun,
    NewTask,
    RunInsert,
    RunLimits,
    RunRecord,
    RunRef,
    TimerRecord,
    TimerRef,
    WaitRecord,
    WaitRef,
    WorkflowVersionRecord,
)
from ductor_server.storage.usage import BudgetedCounter, UsageIncrement, add_usage
from ductor_server.telemetry import current_trace_context

METERED_HISTORY: dict[str, str] = {
    "run.created": "runs",
    "step.succeeded": "steps",
    "step.failed": "steps",
}
"""The history kinds that are usage, and the built-in meter each counts on."""

MAX_START_DEPTH = 16
"""How deep child runs may start one another inside one transaction."""


def new_run_id() -> str:
    """A fresh run id."""
    return f"run_{uuid.uuid4().hex}"


@dataclass(frozen=True, slots=True)
class StartedRun:
    """A run created in this transaction, as the task queue schedules its tasks:
    its workflow (family slug) and its own limits (None: none)."""

    workflow: str
    limits: RunLimits | None


class TaskTaker(Protocol):
    """Queues a batch's new tasks and leases some of them at once, in the same
    transaction, to a worker of this process (`Workers`): the one that reported
    the steps before them, or the one a trigger hands its new run's first tasks."""

    async def enqueue(
        self,
        tx: Tx,
        tasks: Sequence[NewTask],
        started: Mapping[tuple[str, str], StartedRun],
    ) -> bool:
        """Queue `tasks` through `tx`; True if any was left for the queue.
        `started` holds the runs this transaction created, by (tenant, run id)."""
        ...


class StartTaker(TaskTaker, Protocol):
    """A trigger's `TaskTaker`: told whether its transaction committed."""

    async def settle(self, committed: bool) -> None:
        """Start the tasks taken at once if the transaction committed, else
        forget them; either way the worker's slot held for them is freed."""
        ...


@dataclass
class Effects:
    """Writes gathered from many ticks, flushed in one batch per kind, plus the
    loops to wake once the transaction commits.

    Batching turns "one statement per run" into "one statement per kind" for a
    whole coordinator batch. Removals are flushed before additions, so a tick
    that replaces a timer or a wait ends with the new one; the ended runs'
    timers, waits and queued tasks go first of all.

    Runs created and steps ended are metered as the history is flushed
    (`METERED_HISTORY`); `budgeted` then holds the budget-watched counters that
    flush changed, for a caller that refuses work past a blocking budget. A
    caller that refuses nothing (the engine's ticks) sets `watch_budgets` off:
    the usage is written all the same, without waiting for its answer.
    """

    topics: set[Topic] = field(default_factory=set)
    history: list[NewHistoryEntry] = field(default_factory=list)
    tasks: list[NewTask] = field(default_factory=list)
    set_timers: list[TimerRecord] = field(default_factory=list)
    cancel_timers: list[TimerRef] = field(default_factory=list)
    add_waits: list[WaitRecord] = field(default_factory=list)
    clear_waits: list[WaitRef] = field(default_factory=list)
    ended: list[RunRef] = field(default_factory=list)  # runs whose timers, waits, tasks go
    inbox: list[NewInboxItem] = field(default_factory=list)
    budgeted: list[BudgetedCounter] = field(default_factory=list)
    inbox_keys: set[tuple[str, str]] = field(default_factory=set)
    taker: TaskTaker | None = None  # takes some new tasks at once (a report, a trigger)
    started: dict[tuple[str, str], StartedRun] = field(default_factory=dict)  # for `taker`
    watch_budgets: bool = True  # fill `budgeted` (see `add_usage`)

    async def flush(self, tx: Tx) -> None:
        """Write everything gathered so far through `tx` (call before it commits)."""
        self.budgeted = []
        if self.ended:
            await tx.clear_ended_runs(self.ended)
        if self.cancel_timers:
            await tx.delete_timers(self.cancel_timers)
        if self.clear_waits:
            await tx.clear_waits(self.clear_waits)
        if self.set_timers:
            await tx.set_timers(self.set_timers)
            self.topics.add(Topic.TIMERS)
        if self.add_waits:
            await tx.add_waits(self.add_waits)
        if self.tasks:
            if self.taker is None:
                await tx.enqueue_tasks(self.tasks)
                self.topics.add(Topic.TASKS)
            elif await self.taker.enqueue(tx, self.tasks, self.started):
                self.topics.add(Topic.TASKS)
        if self.inbox:
            await tx.enqueue_inbox(self.inbox)
            self.topics.add(Topic.INBOX)
        if self.history:
            await tx.append_history(self.history)
            # Runs started and steps ended are usage: one upsert per tenant and
            # meter for the whole batch, last, so its row locks are held briefly.
            usage = [
                UsageIncrement(entry.tenant_id, METERED_HISTORY[entry.kind], 1)
                for entry in self.history
                if entry.kind in METERED_HISTORY
            ]
            if usage:
                self.budgeted = await add_usage(
                    tx.session, usage, self.history[0].at, watch=self.watch_budgets
                )
        self.cancel_timers, self.clear_waits, self.set_timers = [], [], []
        self.add_waits, self.tasks, self.inbox, self.history = [], [], [], []

    def notify(self, wake: WakeUp, feed: InboxFeed | None = None) -> None:
        """Wake the loops of every recorded topic, and the inbox sessions of every
        subscriber a notification was written for (call after the commit)."""
        for topic in sorted(self.topics):
            wake.notify(topic)
        if self.ended:  # the requests that wait for runs to end (`RunEndings`)
            wake.notify(Topic.ENDED)
        if self.inbox_keys and feed is not None:
            feed.announce(sorted(self.inbox_keys))
        self.inbox_keys = set()


class RunFinishedHook(Protocol):
    """Called in the transaction that ends a run, after its kind's own `on_finish`.

    It writes only through `tx` (a failure rolls the whole tick back and it is
    retried), so it must be idempotent. The composition root plugs hooks in
    (signed run receipts); the engine never imports them.
    """

    async def __call__(
        self, tx: Tx, *, run: RunRecord, finished: RunFinished, now: datetime
    ) -> None: ...


@dataclass(frozen=True, kw_only=True)
class EngineParts:
    """What carrying out commands needs besides the transaction.

    Attributes:
        catalog: the decoded-definition cache.
        engine: the CEL engine (the default engine if None).
        kinds: the run kinds of this runtime (only the DAG kind if not given).
        specs: the step types definitions may use (the built-ins if not given); a
            worker-run type also needs its handler in the runtime's registry.
        on_finish: hooks called in the transaction that ends each run (none by
            default, so ending a run costs nothing more).
    """

    catalog: WorkflowCatalog
    engine: ExpressionEngine | None = None
    kinds: RunKinds = field(default_factory=RunKinds)
    specs: StepSpecs = BUILTIN_STEP_SPECS
    on_finish: list[RunFinishedHook] = field(default_factory=list)

    def expressions(self) -> ExpressionEngine:
        """The CEL engine to evaluate with."""
        return self.engine or default_engine()

    def portable(self) -> tuple[ExpressionEngine | str, StepSpecs | None]:
        """The engine and step types in a form a worker process can rebuild
        (names for the shared ones; see `offload.portable_engine`)."""
        return portable_engine(self.engine), portable_specs(self.specs)


@dataclass(frozen=True)
class FirstTick:
    """A new run's id and first tick (`start_run`), and its own limits in the
    task queue (its definition's `concurrency` with the key evaluated over its
    input), computed before it is inserted."""

    run_id: str
    result: TickResult
    limits: RunLimits | None = None


def run_limits(
    option: ConcurrencyOption | None, engine: ExpressionEngine, input: Any
) -> RunLimits | None:
    """A run's own limits from its workflow's `concurrency` option: the option's
    key evaluated once over `input` (None without the option)."""
    if option is None:
        return None
    return RunLimits(
        key=stored_key(key_value(engine, option.key, input)),
        concurrency=option.limit,
        rate=option.per_second,
        burst=option.rate.burst if option.rate is not None else 1,
    )


def first_tick(
    definition: WorkflowDefinition,
    *,
    input: Any,
    now: datetime,
    engine: ExpressionEngine | str | None,
    specs: StepSpecs | None,
) -> FirstTick:
    """Compute a new run's first tick (pure and possibly heavy: it evaluates the
    root steps' CEL over `input`), in a lane's worker; `engine` and `specs` as
    `EngineParts.portable` gives them."""
    run_id = new_run_id()
    cel = resolve_engine(engine)
    result = start_run(
        definition,
        run_id=run_id,
        input=input,
        now=now,
        engine=cel,
        specs=resolve_specs(specs),
    )
    return FirstTick(run_id, result, run_limits(definition.concurrency, cel, input))


async def compute_first_tick(
    parts: EngineParts,
    definition: WorkflowDefinition,
    *,
    input: Any,
    now: datetime,
    tenant_id: str,
) -> FirstTick:
    """A new run's first tick: on the loop when it is cheap (`engine.cheap`: the
    root steps' CEL is cheap over `input`), else in the engine lane.

    Raises:
        RunInputInvalid: `input` does not satisfy the version's `input_schema`.
    """
    await refuse_bad_input(definition, input, tenant_id=tenant_id)
    engine, specs = parts.portable()
    if cheap(definition, parts.specs, parts.expressions(), [input]):
        return first_tick(definition, input=input, now=now, engine=engine, specs=specs)
    return await ENGINE.run(
        first_tick, definition, input=input, now=now, engine=engine, specs=specs
    )


@dataclass(frozen=True, kw_only=True)
class RunStart:
    """One run for `create_runs` to insert (see `create_run` for the fields)."""

    tenant_id: str
    record: WorkflowVersionRecord
    definition: WorkflowDefinition
    input: Any
    idempotency_key: str | None = None
    parent: RunRecord | None = None
    parent_step_ref: str | None = None
    parent_item_index: int = -1
    child_key: str | None = None
    first: FirstTick | None = None


async def create_run(
    tx: Tx,
    parts: EngineParts,
    effects: Effects,
    *,
    tenant_id: str,
    record: WorkflowVersionRecord,
    definition: WorkflowDefinition,
    input: Any,
    now: datetime,
    idempotency_key: str | None = None,
    parent: RunRecord | None = None,
    parent_step_ref: str | None = None,
    parent_item_index: int = -1,
    child_key: str | None = None,
    depth: int = 0,
    first: FirstTick | None = None,
) -> RunInsert:
    """Insert a run with its first tick and gather that tick's commands into
    `effects` (the caller flushes them before committing).

    `first` is the first tick computed beforehand (`first_tick`, for `input`
    and `now`), so the transaction need not wait for it; without it the tick
    runs here (`compute_first_tick`). If the idempotency key or child key is
    already taken, nothing is written and the existing run comes back with
    `created=False`.
    """
    start = RunStart(
        tenant_id=tenant_id,
        record=record,
        definition=definition,
        input=input,
        idempotency_key=idempotency_key,
        parent=parent,
        parent_step_ref=parent_step_ref,
        parent_item_index=parent_item_index,
        child_key=child_key,
        first=first,
    )
    [inserted] = await create_runs(tx, parts, effects, [start], now=now, depth=depth)
    return inserted


async def _keyed_runs(tx: Tx, starts: Sequence[RunStart]) -> dict[int, RunRecord]:
    """The runs already named by the idempotency keys of the `starts` whose input
    is still to be checked against a schema, by index (one read per tenant; none
    at all when no such start has a key)."""
    asked: dict[str, list[tuple[int, str]]] = {}
    for index, start in enumerate(starts):
        key = start.idempotency_key
        if start.first is None and key is not None and start.definition.input_schema is not None:
            asked.setdefault(start.tenant_id, []).append((index, key))
    found: dict[int, RunRecord] = {}
    for tenant_id, wanted in asked.items():
        runs = await tx.find_runs_by_idempotency_keys(tenant_id, [key for _, key in wanted])
        found.update({index: run for (index, _), run in zip(wanted, runs, strict=True) if run})
    return found


async def create_runs(
    tx: Tx,
    parts: EngineParts,
    effects: Effects,
    starts: Sequence[RunStart],
    *,
    now: datetime,
    depth: int = 0,
) -> list[RunInsert]:
    """`create_run` for many runs with one insert, in order.

    A start without its first tick whose idempotency key already names a run
    gets that run, whatever its input; any other start's input is checked
    against its version's `input_schema` first.

    Raises:
        RunInputInvalid: a start's input does not satisfy the schema
            (`start_index` says which); nothing is written.
    """
    found = await _keyed_runs(tx, starts)
    firsts: list[FirstTick] = []
    for index, start in enumerate(starts):
        if start.first is not None:
            firsts.append(start.first)
            continue
        if index in found:
            continue
        try:
            first = await compute_first_tick(
                parts, start.definition, input=start.input, now=now, tenant_id=start.tenant_id
            )
        except RunInputInvalid as error:
            error.start_index = index
            raise
        firsts.append(first)
    if found:
        ready = iter(firsts)
        fresh = [
            dataclasses.replace(start, first=next(ready))
            for index, start in enumerate(starts)
            if index not in found
        ]
        made = iter(await create_runs(tx, parts, effects, fresh, now=now, depth=depth))
        return [
            RunInsert(run=found[index], created=False) if index in found else next(made)
            for index in range(len(starts))
        ]
    inserted = await tx.insert_runs(
        [
            NewRun(
                tenant_id=start.tenant_id,
                family_slug=start.record.family_slug,
                version=start.record.version,
                state=first.result.state,
                parent_run_id=start.parent.id if start.parent is not None else None,
                parent_step_ref=start.parent_step_ref,
                parent_item_index=start.parent_item_index,
                child_key=start.child_key,
                idempotency_key=start.idempotency_key,
                trace_context=current_trace_context(),
                limits=first.limits,
            )
            for start, first in zip(starts, firsts, strict=True)
        ]
    )
    for start, first, one in zip(starts, firsts, inserted, strict=True):
        if not one.created:
            continue
        record, parent = start.record, start.parent
        if effects.taker is not None:
            effects.started[(start.tenant_id, first.run_id)] = StartedRun(
                workflow=record.family_slug, limits=first.limits
            )
        created_data: dict[str, Any] = {
            "family_slug": record.family_slug,
            "version": record.version,
        }
        if parent is not None:
            created_data.update(parent_run_id=parent.id, parent_step_ref=start.parent_step_ref)
        effects.history.append(
            NewHistoryEntry(
                tenant_id=start.tenant_id,
                run_id=first.run_id,
                at=now,
                kind="run.created",
                data=created_data,
            )
        )
        effects.history.extend(
            transition_entries(start.tenant_id, None, first.result.state, at=now)
        )
        await apply_commands(
            tx, parts, effects, run=one.run, commands=first.result.commands, now=now, depth=depth
        )
    return inserted


async def apply_commands(
    tx: Tx,
    parts: EngineParts,
    effects: Effects,
    *,
    run: RunRecord,
    commands: Sequence[Command],
    now: datetime,
    depth: int = 0,
) -> None:
    """Gather the writes a tick of `run` asked for into `effects` (child runs
    are inserted at once); `effects.flush(tx)` writes the rest. New tasks carry
    the current span's trace context (the trigger's, or the coordinator's tick)."""
    tenant_id = run.tenant_id
    trace_context = current_trace_context()
    children: list[StartChildRun] = []
    cancel_children: list[CancelChildRuns] = []
    finished: RunFinished | None = None
    tasks: list[NewTask] = []
    timers: list[TimerRecord] = []
    waits: list[WaitRecord] = []
    for command in commands:
        # Every command type has a case: a new one is a type error here, not a
        # command silently dropped.
        match command:
            case DispatchTask():
                tasks.append(
                    NewTask.from_dispatch(
                        tenant_id, run.id, command, available_at=now, trace_context=trace_context
                    )
                )
            case SetTimer():
                timers.append(
                    TimerRecord(
                        tenant_id=tenant_id,
                        run_id=run.id,
                        timer_id=command.timer_id,
                        fire_at=command.fire_at,
                    )
                )
            case CancelTimer():
                effects.cancel_timers.append(
                    TimerRef(tenant_id=tenant_id, run_id=run.id, timer_id=command.timer_id)
                )
            case RegisterWait():
                waits.append(
                    WaitRecord(
                        tenant_id=tenant_id,
                        run_id=run.id,
                        step_ref=command.step_ref,
                        kind=command.kind,
                        name=command.name,
                        created_at=now,
                    )
                )
            case ClearWait():
                effects.clear_waits.append(
                    WaitRef(tenant_id=tenant_id, run_id=run.id, step_ref=command.step_ref)
                )
            case StartChildRun():
                children.append(command)
            case CancelChildRuns():
                cancel_children.append(command)
            case RunFinished():
                finished = command
            case SendNotifications():
                # Written even when the same tick ends the run: the step succeeded.
                written = await write_notifications(tx, run=run, command=command, now=now)
                effects.inbox_keys.update(written.moved)
                effects.history.append(written.entry)
                if written.emails:
                    effects.topics.add(Topic.EMAIL)
            case _:
                assert_never(command)

    if finished is None:
        effects.tasks.extend(tasks)
        effects.set_timers.extend(timers)
        effects.add_waits.extend(waits)
        for child in children:
            await _start_child(tx, parts, effects, parent=run, command=child, now=now, depth=depth)
    for cancel in cancel_children:
        await _cancel_children(tx, effects, run=run, step_ref=cancel.step_ref, now=now)
    if finished is not None:
        await _finish(tx, parts, effects, run=run, finished=finished, now=now)


async def _start_child(
    tx: Tx,
    parts: EngineParts,
    effects: Effects,
    *,
    parent: RunRecord,
    command: StartChildRun,
    now: datetime,
    depth: int,
) -> None:
    # The child's family slug picks its kind (a DAG definition, an SDK workflow...).
    kind = parts.kinds.for_slug(command.family_slug)
    error = await kind.start_child(
        tx, parts, effects, parent=parent, command=command, now=now, depth=depth
    )
    if error is None:
        return
    effects.inbox.append(
        NewInboxItem(
            tenant_id=parent.tenant_id,
            run_id=parent.id,
            input=ChildRunEnded(
                step_ref=command.step_ref,
                item_index=command.item_index,
                child_run_id="",
                status=RunStatus.FAILED,
                error=error,
            ),
            available_at=now,
        )
    )


async def _cancel_children(
    tx: Tx, effects: Effects, *, run: RunRecord, step_ref: str | None, now: datetime
) -> None:
    children = await tx.list_child_runs(run.tenant_id, run.id, step_ref=step_ref)
    live = [child for child in children if not child.status.terminal]
    if not live:
        return
    effects.inbox.extend(
        NewInboxItem(
            tenant_id=child.tenant_id,
            run_id=child.id,
            input=CancelRequested(reason=f"parent run {run.id} cancelled"),
            available_at=now,
        )
        for child in live
    )


async def _finish(
    tx: Tx,
    parts: EngineParts,
    effects: Effects,
    *,
    run: RunRecord,
    finished: RunFinished,
    now: datetime,
) -> None:
    effects.ended.append(RunRef(tenant_id=run.tenant_id, run_id=run.id))
    # The run's kind frees what it held (a bridge run its concurrency slot).
    await parts.kinds.get(run.kind).on_finish(
        tx, parts, effects, run=run, finished=finished, now=now
    )
    for hook in parts.on_finish:
        await hook(tx, run=run, finished=finished, now=now)
    if run.parent_run_id is None or run.parent_step_ref is None:
        return
    effects.inbox.append(
        NewInboxItem(
            tenant_id=run.tenant_id,
            run_id=run.parent_run_id,
            input=ChildRunEnded(
                step_ref=run.parent_step_ref,
                item_index=run.parent_item_index,
                child_run_id=run.id,
                status=finished.status,
                output=finished.output,
                error=finished.error,
            ),
            available_at=now,
        )
    )
