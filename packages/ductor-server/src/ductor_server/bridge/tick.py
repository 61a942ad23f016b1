"""The bridge tick: the pure state machine of a run whose body an SDK app hosts.

Like the DAG tick (a `RunState` and `RunInput`s in, the new state and `Command`s
out), plus the bridge's own bookkeeping (`BridgeData`, stored in
`runs.kind_state`) in and out; no I/O, no clock reads (`now` is passed in).

The run state's steps are the API's view of the run: the recorded and pending
SDK steps, and a `_bridge` step that shows the run's own status: running,
waiting for a concurrency slot, or ended as the run did (failed with its error).
An app's checkpoint reaches the tick as an `AttemptResult` of step `checkpoint`
(see `checkpoint_input`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import msgspec

from ductor.protocol import (
    CancelRequest,
    Event,
    ExecuteRequest,
    InvokeOp,
    Opcode,
    OpcodeName,
    RunCompleteOp,
    RunErrorOp,
    RunFailedOp,
    SleepOp,
    StepErrorOp,
    StepFailedOp,
    StepPlannedOp,
    StepRecord,
    StepRunOp,
    WaitForEventOp,
    WaitForSignalOp,
    step_record,
)
from ductor.protocol import (
    ErrorInfo as WireError,
)
from ductor_core.durations import parse_duration
from ductor_core.errors import DuctorError
from ductor_core.expressions import ExpressionEngine, default_engine
from ductor_core.runs import (
    AttemptResult,
    BufferedSignal,
    CancelChildRuns,
    CancelRequested,
    CancelTimer,
    ChildRunEnded,
    ClearWait,
    Command,
    DispatchTask,
    ErrorInfo,
    EventReceived,
    IgnoredInput,
    RegisterWait,
    RunFinished,
    RunInput,
    RunState,
    RunStatus,
    SetTimer,
    SignalReceived,
    StartChildRun,
    StepState,
    StepStatus,
    TickResult,
    TimerFired,
)
from ductor_core.timestamps import utc_text

log = logging.getLogger("ductor.bridge")

BRIDGE_KIND: Final = "bridge"
"""The run kind (`runs.kind`) of bridge runs."""

BRIDGE_SLUG_PREFIX: Final = "bridge:"
"""Runs whose family slug starts with this are bridge runs (DAG slugs cannot hold ':')."""

STATE_KEY: Final = "_bridge"
"""The key of the `RunState.steps` entry that shows the run's own status (running,
waiting for a concurrency slot, or ended as the run did, a failed run's error with
it). Runs stored by earlier releases also kept their bookkeeping in its `data`
(see `read_data`)."""

EXECUTE_REF: Final = "execute"
"""Task `step_ref` of a plain execute (no target step)."""

CANCEL_REF: Final = "cancel"
"""Task `step_ref` of the `cancel` call that runs the workflow's `on_cancel` handler."""

CHECKPOINT_REF: Final = "checkpoint"
"""`AttemptResult.step_ref` of opcodes an app checkpointed (see `checkpoint_input`)."""

HANDLER: Final = "bridge"
"""The worker handler that calls the app's endpoint."""

MAX_TRANSPORT_FAILURES: Final = 40
"""Failed calls in a row (app down, bad signature...) before the run fails."""

INLINE_GRACE: Final = timedelta(seconds=60)
"""How long an inline run may go without a checkpoint before the engine takes over."""

RUN_TIMEOUT_TIMER: Final = "run-timeout"
"""The timer that fails a run still going when its workflow's `timeout` passes."""

SLOT_TIMER: Final = "concurrency"
"""The `TimerFired` id put in a waiting run's inbox when it is given a concurrency slot."""

_ENDED_STEP: Final = {
    RunStatus.SUCCEEDED: StepStatus.SUCCEEDED,
    RunStatus.FAILED: StepStatus.FAILED,
    RunStatus.CANCELLED: StepStatus.CANCELLED,
}
"""The status of the `_bridge` step of a run that ended so."""

_RETRY_BASE_SECONDS: Final = 0.5
_RETRY_MAX_SECONDS: Final = 60.0
_TRANSPORT_MAX_SECONDS: Final = 10.0


def bridge_slug(app_id: str, workflow_id: str) -> str:
    """The family slug of runs of `workflow_id` served by `app_id`."""
    return f"{BRIDGE_SLUG_PREFIX}{app_id}:{workflow_id}"


def is_bridge_slug(family_slug: str) -> bool:
    """True when runs of `family_slug` are bridge runs."""
    return family_slug.startswith(BRIDGE_SLUG_PREFIX)


def parse_bridge_slug(family_slug: str) -> tuple[str, str]:
    """(app_id, workflow_id) of a bridge slug.

    Raises:
        ValueError: not a bridge slug.
    """
    if not is_bridge_slug(family_slug):
        raise ValueError(f"{family_slug!r} is not a bridge slug")
    app_id, sep, workflow_id = family_slug[len(BRIDGE_SLUG_PREFIX) :].partition(":")
    if not sep or not app_id or not workflow_id:
        raise ValueError(f"{family_slug!r} is not a bridge slug")
    return app_id, workflow_id


class Pending(msgspec.Struct, frozen=True, kw_only=True):
    """A step opcode the engine is resolving: a planned step, a sleep, a wait or an invoke.

    `op` is the opcode as JSON; `attempt` the failed tries of a planned step;
    `task` the attempt number of its in-flight execute task, if any; `error`
    the last failed try's error.
    """

    id: str
    name: str
    op: dict[str, Any]
    attempt: int = 0
    task: int | None = None
    error: WireError | None = None


class Retrying(msgspec.Struct, frozen=True, kw_only=True):
    """A step of the body (not planned) whose last try failed and will be tried
    again by the next execute: `tries` so far, the last `error`, and when."""

    id: str
    name: str
    tries: int
    error: WireError
    retry_at: datetime


class BridgeData(msgspec.Struct, frozen=True, kw_only=True):
    """The bookkeeping of a bridge run, kept in `runs.kind_state`.

    Attributes:
        app_id: the app serving the workflow.
        workflow_id: the workflow's id on the app.
        event: the event that triggered the run, as JSON.
        history: recorded steps in recorded order (what execute sends back).
        attempt: failed tries of the body since the last step recorded.
        seq: the last task attempt number handed out (unique per run).
        main: attempt number of the plain execute in flight, if any.
        main_retry: a timer will dispatch the next plain execute.
        inline: the caller executes the body itself (inline run) until it hands over.
        failures: calls in a row that did not reach the app or were refused.
        pending: steps being resolved, by step id, in the order found.
        cancellable: the workflow has an `on_cancel` handler on the app.
        cancelling: attempt number of the `cancel` call in flight; the run ends
            CANCELLED when it returns.
        cancel_reason: why the run is being cancelled.
        queued: the run waits for a slot of its workflow's `concurrency` limit
            (it stays PENDING, dispatching nothing, until `SLOT_TIMER` fires).
        retrying: the body's step whose last try failed, until it is recorded.
        tries: how many tries each recorded `step.run` took, when more than one.
    """

    app_id: str
    workflow_id: str
    event: dict[str, Any] | None = None
    history: list[StepRecord] = []
    attempt: int = 0
    seq: int = 0
    main: int | None = None
    main_retry: bool = False
    inline: bool = False
    failures: int = 0
    pending: dict[str, Pending] = {}
    cancellable: bool = False
    cancelling: int | None = None
    cancel_reason: str = ""
    queued: bool = False
    retrying: Retrying | None = None
    tries: dict[str, int] = {}


_OPS_TYPE: Final = list[Opcode]


class BridgeTickResult(msgspec.Struct, frozen=True, kw_only=True):
    """One bridge tick's outcome: the new run state, the new bookkeeping, the
    commands to commit with them and the inputs it did not apply."""

    state: RunState
    data: BridgeData
    commands: list[Command] = []
    ignored: list[IgnoredInput] = []

    def tick_result(self) -> TickResult:
        """The engine's view of this tick (the bookkeeping travels apart)."""
        return TickResult(state=self.state, commands=self.commands, ignored=self.ignored)


def read_data(kind_state: Any, state: RunState) -> BridgeData:
    """The bookkeeping of a bridge run: its `runs.kind_state`, or, for a run last
    ticked by an earlier release, the `data` of its `_bridge` step.

    Raises:
        KeyError: neither holds any (not a bridge run).
        msgspec.ValidationError: what is stored is not bridge bookkeeping.
    """
    if kind_state is not None:
        return msgspec.convert(kind_state, BridgeData)
    holder = state.steps.get(STATE_KEY)
    if holder is None or not holder.data:
        raise KeyError(f"run {state.run_id} has no bridge bookkeeping")
    return msgspec.convert(holder.data, BridgeData)


def _op(raw: dict[str, Any]) -> Opcode:
    op: Opcode = msgspec.convert(raw, Opcode)
    return op


def core_error(error: WireError) -> ErrorInfo:
    """A wire error as the engine's `ErrorInfo` (the exception name goes into details)."""
    details: Any = error.details
    if error.name is not None:
        details = {"name": error.name, "details": error.details}
    return ErrorInfo(
        code=error.code, message=error.message, retryable=error.retryable, details=details
    )


def wire_error(error: ErrorInfo | None, default_code: str = "run.failed") -> WireError:
    """The engine's `ErrorInfo` as a wire error."""
    if error is None:
        return WireError(code=default_code, message="failed", retryable=False)
    return WireError(
        code=error.code, message=error.message, retryable=error.retryable, details=error.details
    )


def checkpoint_input(sequence: int, opcodes: list[Opcode]) -> AttemptResult:
    """The inbox input that carries a checkpoint's opcodes to the run's next tick."""
    return AttemptResult(
        step_ref=CHECKPOINT_REF,
        attempt=sequence,
        ok=True,
        output={"opcodes": msgspec.to_builtins(opcodes)},
    )


def opcode_problems(opcodes: Sequence[Opcode]) -> list[dict[str, str]]:
    """The times an app's opcodes give that the tick could not keep, each with its
    pointer (`/opcodes/0/duration`): a SLEEP with neither or both of `duration` and
    `until`, or a duration, timeout or `until` that does not parse. Without this
    the tick would read such a sleep or timeout as none at all."""
    problems: list[dict[str, str]] = []

    def duration(pointer: str, text: str | None) -> None:
        if text is None:
            return
        try:
            parse_duration(text)
        except DuctorError as exc:
            problems.append({"pointer": pointer, "message": exc.message})

    for i, op in enumerate(opcodes):
        at = f"/opcodes/{i}"
        if isinstance(op, SleepOp):
            if (op.duration is None) == (op.until is None):
                message = "a SLEEP needs exactly one of duration and until"
                problems.append({"pointer": at, "message": message})
            duration(f"{at}/duration", op.duration)
            if op.until is not None and _until(op.until) is None:
                message = f"not an ISO 8601 time like 2030-01-01T09:00:00Z: {op.until[:64]!r}"
                problems.append({"pointer": f"{at}/until", "message": message})
        elif isinstance(op, WaitForEventOp | WaitForSignalOp | InvokeOp):
            duration(f"{at}/timeout", op.timeout)
    return problems


def _until(text: str) -> datetime | None:
    """An opcode's `until` as an aware time (UTC when it names no offset), else None."""
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _backoff(attempt: int, cap: float) -> timedelta:
    return timedelta(seconds=min(_RETRY_BASE_SECONDS * 2 ** max(attempt - 1, 0), cap))


class _BridgeTick:
    """One tick of one bridge run: mutable scratch space, results read at the end."""

    def __init__(
        self, state: RunState, data: BridgeData, now: datetime, engine: ExpressionEngine | None
    ) -> None:
        self.state = state
        self.now = now
        self.engine = engine
        self.commands: list[Command] = []
        self.ignored: list[IgnoredInput] = []
        self.app_id = data.app_id
        self.workflow_id = data.workflow_id
        self.event = data.event
        self.history = list(data.history)
        self.recorded = {record.id for record in self.history}
        self.attempt = data.attempt
        self.seq = data.seq
        self.main = data.main
        self.main_retry = data.main_retry
        self.inline = data.inline
        self.failures = data.failures
        self.pending = dict(data.pending)
        self.cancellable = data.cancellable
        self.cancelling = data.cancelling
        self.cancel_reason = data.cancel_reason
        self.queued = data.queued
        self.retrying = data.retrying
        self.tries = dict(data.tries)
        self.timers = dict(state.timers)
        self.pending_signals = list(state.pending_signals)
        self.received_ids = list(state.received_ids)
        self.finished: RunFinished | None = None

    # --- results -------------------------------------------------------------------

    def data(self) -> BridgeData:
        return BridgeData(
            app_id=self.app_id,
            workflow_id=self.workflow_id,
            event=self.event,
            history=self.history,
            attempt=self.attempt,
            seq=self.seq,
            main=self.main,
            main_retry=self.main_retry,
            inline=self.inline,
            failures=self.failures,
            pending=self.pending,
            cancellable=self.cancellable,
            cancelling=self.cancelling,
            cancel_reason=self.cancel_reason,
            queued=self.queued,
            retrying=self.retrying,
            tries=self.tries,
        )

    def result(self) -> BridgeTickResult:
        state = self.state
        status = state.status
        output, error, finished_at = state.output, state.error, state.finished_at
        if self.finished is not None:
            status = self.finished.status
            output, error, finished_at = self.finished.output, self.finished.error, self.now
            self.commands.append(self.finished)
        elif status == RunStatus.PENDING and not self.queued:
            status = RunStatus.RUNNING  # a run waiting for a concurrency slot stays PENDING
        new_state = msgspec.structs.replace(
            state,
            status=status,
            output=output,
            error=error,
            finished_at=finished_at,
            steps=self.step_states(status, error),
            timers={} if self.finished is not None else self.timers,
            pending_signals=self.pending_signals,
            received_ids=self.received_ids,
            cancel_requested=state.cancel_requested or self.cancelling is not None,
        )
        return BridgeTickResult(
            state=new_state, data=self.data(), commands=self.commands, ignored=self.ignored
        )

    def step_states(self, status: RunStatus, error: ErrorInfo | None) -> dict[str, StepState]:
        """The API's view of the run's steps: its own status, then recorded, then pending."""
        previous = self.state.steps
        ended = status.terminal
        steps: dict[str, StepState] = {
            STATE_KEY: StepState(
                ref=STATE_KEY,
                status=_ENDED_STEP[status]
                if ended
                else StepStatus.WAITING
                if self.queued
                else StepStatus.RUNNING,
                error=error if status == RunStatus.FAILED else None,
                waiting_for="concurrency slot" if self.queued and not ended else None,
            )
        }
        keys: dict[str, str] = {}

        def key_of(step_id: str, name: str) -> str:
            key, n = name, 0
            while key in steps or key == STATE_KEY:
                n += 1
                key = f"{name}:{n}"
            keys[step_id] = key
            return key

        for record in self.history:
            key = key_of(record.id, record.name)
            old = previous.get(key)
            failed = record.op == OpcodeName.STEP_FAILED or record.error is not None
            ran = record.op in (OpcodeName.STEP_RUN, OpcodeName.STEP_FAILED)
            steps[key] = StepState(
                ref=key,
                status=StepStatus.FAILED if failed else StepStatus.SUCCEEDED,
                attempt=self.tries.get(record.id, 1) if ran else 0,
                output=record.result,
                error=core_error(record.error) if record.error is not None else None,
                started_at=old.started_at if old is not None else self.now,
                finished_at=old.finished_at if old is not None and old.finished_at else self.now,
                data={"id": record.id, "op": str(record.op)},
            )
        for pending in self.pending.values():
            key = key_of(pending.id, pending.name)
            old = previous.get(key)
            op = str(pending.op.get("op"))
            planned = op == OpcodeName.STEP_PLANNED
            retry_at = self.timers.get(f"retry:{pending.id}") if planned else None
            steps[key] = StepState(
                ref=key,
                status=StepStatus.CANCELLED
                if ended
                else StepStatus.RETRYING
                if retry_at is not None
                else StepStatus.RUNNING
                if planned
                else StepStatus.WAITING,
                # The try under way (or, retrying, the last one): 1 first, as DAG steps.
                attempt=pending.attempt + (0 if retry_at is not None else 1) if planned else 0,
                error=core_error(pending.error) if pending.error is not None else None,
                started_at=old.started_at if old is not None else self.now,
                retry_at=retry_at,
                waiting_for=self.waiting_for(pending, retry_at),
                data={"id": pending.id, "op": op},
            )
        if self.retrying is not None and not ended:
            failing = self.retrying
            key = key_of(failing.id, failing.name)
            old = previous.get(key)
            waiting = self.main_retry
            steps[key] = StepState(
                ref=key,
                status=StepStatus.RETRYING if waiting else StepStatus.RUNNING,
                attempt=failing.tries if waiting else failing.tries + 1,
                error=core_error(failing.error),
                started_at=old.started_at if old is not None else self.now,
                retry_at=failing.retry_at if waiting else None,
                waiting_for=f"retry at {utc_text(failing.retry_at)}" if waiting else None,
                data={"id": failing.id, "op": str(OpcodeName.STEP_RUN)},
            )
        return steps

    def waiting_for(self, pending: Pending, retry_at: datetime | None) -> str | None:
        """What a pending step waits for, in the words DAG steps use."""
        if retry_at is not None:
            return f"retry at {utc_text(retry_at)}"
        kind = pending.op.get("op")
        if kind == OpcodeName.SLEEP:
            fire_at = self.timers.get(f"sleep:{pending.id}")
            return "timer" if fire_at is None else f"timer {utc_text(fire_at)}"
        if kind == OpcodeName.WAIT_FOR_EVENT:
            return f"event {pending.op.get('event')}"
        if kind == OpcodeName.WAIT_FOR_SIGNAL:
            return f"signal {pending.op.get('signal')}"
        if kind == OpcodeName.INVOKE:
            return "child run"
        return None

    # --- commands ------------------------------------------------------------------

    def set_timer(self, timer_id: str, fire_at: datetime) -> None:
        self.timers[timer_id] = fire_at
        self.commands.append(SetTimer(timer_id=timer_id, fire_at=fire_at))

    def cancel_timer(self, timer_id: str) -> None:
        if self.timers.pop(timer_id, None) is not None:
            self.commands.append(CancelTimer(timer_id=timer_id))

    def dispatch(self, target: Pending | None) -> int:
        self.seq += 1
        request = ExecuteRequest(
            run_id=self.state.run_id,
            workflow_id=self.workflow_id,
            attempt=self.attempt if target is None else target.attempt,
            input=self.state.input,
            steps=self.history,
            event=msgspec.convert(self.event, Event) if self.event is not None else None,
            target_step=None if target is None else target.id,
        )
        ref = EXECUTE_REF if target is None else f"step:{target.id}"
        self.commands.append(
            DispatchTask(
                step_ref=ref,
                attempt=self.seq,
                step_type="STEP_TYPE_BRIDGE",
                handler=HANDLER,
                payload={
                    "app_id": self.app_id,
                    "workflow_id": self.workflow_id,
                    "request": msgspec.to_builtins(request),
                },
                idempotency_key=f"{self.state.run_id}:{ref}:{self.seq}",
            )
        )
        return self.seq

    def finish(
        self, status: RunStatus, *, output: Any = None, error: ErrorInfo | None = None
    ) -> None:
        if self.finished is None:
            self.finished = RunFinished(status=status, output=output, error=error)

    # --- inputs --------------------------------------------------------------------

    def apply(self, item: RunInput) -> None:
        if isinstance(item, AttemptResult):
            self.on_attempt(item)
        elif isinstance(item, TimerFired):
            self.on_timer(item)
        elif isinstance(item, EventReceived):
            self.on_event(item)
        elif isinstance(item, SignalReceived):
            self.on_signal(item)
        elif isinstance(item, ChildRunEnded):
            self.on_child(item)
        else:
            self.on_cancel(item)

    def on_cancel(self, item: CancelRequested) -> None:
        if self.cancelling is not None:
            self.ignored.append(IgnoredInput(input=item, reason="already cancelling"))
            return
        self.commands.append(CancelChildRuns())
        if not self.cancellable or self.queued:  # a waiting run never reached the app
            self.cancelled(item.reason, None)
            return
        # Run the workflow's on_cancel handler on the app first; end when it returns.
        self.cancel_reason = item.reason
        self.seq += 1
        self.cancelling = self.seq
        request = CancelRequest(
            run_id=self.state.run_id,
            workflow_id=self.workflow_id,
            input=self.state.input,
            reason=item.reason or None,
        )
        self.commands.append(
            DispatchTask(
                step_ref=CANCEL_REF,
                attempt=self.seq,
                step_type="STEP_TYPE_BRIDGE",
                handler=HANDLER,
                payload={
                    "app_id": self.app_id,
                    "workflow_id": self.workflow_id,
                    "cancel": msgspec.to_builtins(request),
                },
                idempotency_key=f"{self.state.run_id}:{CANCEL_REF}:{self.seq}",
            )
        )

    def cancelled(self, reason: str, details: Any) -> None:
        self.finish(
            RunStatus.CANCELLED,
            error=ErrorInfo(
                code="run.cancelled",
                message=reason or "cancelled",
                retryable=False,
                details=details,
            ),
        )

    def on_cancel_done(self, item: AttemptResult) -> None:
        if item.attempt != self.cancelling:
            self.ignored.append(IgnoredInput(input=item, reason="stale cancel call"))
            return
        if item.ok:
            details = item.output
        else:
            details = {"cancel_error": msgspec.to_builtins(item.error)}
        self.cancelled(self.cancel_reason, details)

    def on_attempt(self, item: AttemptResult) -> None:
        if item.step_ref == CANCEL_REF:
            self.on_cancel_done(item)
            return
        if item.step_ref == CHECKPOINT_REF:
            self.on_checkpoint(item)
            return
        target: Pending | None = None
        if item.step_ref == EXECUTE_REF:
            if self.main != item.attempt:
                self.ignored.append(IgnoredInput(input=item, reason="stale execute"))
                return
            self.main = None
        else:
            step_id = item.step_ref.removeprefix("step:")
            target = self.pending.get(step_id)
            if target is None or target.task != item.attempt:
                self.ignored.append(IgnoredInput(input=item, reason="stale step execute"))
                return
            target = msgspec.structs.replace(target, task=None)
            self.pending[step_id] = target
        if not item.ok:
            self.on_call_failed(item, target)
            return
        try:
            ops = msgspec.convert((item.output or {}).get("opcodes", []), _OPS_TYPE)
        except (msgspec.ValidationError, AttributeError) as exc:
            self.finish(
                RunStatus.FAILED,
                error=ErrorInfo(
                    code="bridge.bad_response",
                    message=f"the app answered opcodes that do not decode: {exc}",
                    retryable=False,
                ),
            )
            return
        before = self.progress()
        if target is not None:
            self.on_target_ops(target, ops)
        else:
            self.on_ops(ops)
        if self.progress() != before:
            self.failures = 0
        else:
            # An answer that changes nothing (no opcode, or only known steps) would
            # make the next execute ask the same again: back off as for a failed call.
            error = ErrorInfo(
                code="bridge.no_progress",
                message="the app answered without a new opcode",
                retryable=True,
            )
            self.on_call_failed(
                AttemptResult(step_ref=item.step_ref, attempt=item.attempt, ok=False, error=error),
                target,
            )

    def progress(self) -> tuple[Any, ...]:
        """What an answer must change to count as progress."""
        return (
            len(self.history),
            tuple(self.pending),
            tuple(p.attempt for p in self.pending.values()),
            self.attempt,
            self.finished,
            self.main_retry,
        )

    def on_checkpoint(self, item: AttemptResult) -> None:
        try:
            ops = msgspec.convert((item.output or {}).get("opcodes", []), _OPS_TYPE)
        except (msgspec.ValidationError, AttributeError):
            self.ignored.append(IgnoredInput(input=item, reason="checkpoint does not decode"))
            return
        if self.inline and self.finished is None:
            self.cancel_timer("inline")
            handed_over = any(not isinstance(op, StepRunOp | StepFailedOp) for op in ops)
            if handed_over:
                self.inline = False
            else:
                self.set_timer("inline", self.now + INLINE_GRACE)
        self.on_ops(ops)

    def on_call_failed(self, item: AttemptResult, target: Pending | None) -> None:
        error = item.error or ErrorInfo(code="bridge.call_failed", message="call failed")
        self.failures += 1
        if not error.retryable or self.failures >= MAX_TRANSPORT_FAILURES:
            self.finish(RunStatus.FAILED, error=error)
            return
        delay = _backoff(self.failures, _TRANSPORT_MAX_SECONDS)
        if error.retry_after_seconds is not None:
            delay = max(delay, timedelta(seconds=error.retry_after_seconds))
        if target is None:
            self.main_retry = True
            self.set_timer("retry:main", self.now + delay)
        else:
            self.set_timer(f"retry:{target.id}", self.now + delay)

    def record(self, record: StepRecord) -> bool:
        if record.id in self.recorded:
            return False
        self.history.append(record)
        self.recorded.add(record.id)
        pending = self.pending.pop(record.id, None)
        failed_tries = pending.attempt if pending is not None else 0
        if self.retrying is not None and self.retrying.id == record.id:
            failed_tries = self.retrying.tries
        if failed_tries:
            self.tries[record.id] = failed_tries + 1
        self.retrying = None
        self.attempt = 0
        return True

    def on_target_ops(self, target: Pending, ops: list[Opcode]) -> None:
        for op in ops:
            if isinstance(op, StepRunOp | StepFailedOp) and op.id == target.id:
                self.record(step_record(op))
            elif isinstance(op, StepErrorOp) and op.id == target.id:
                self.pending[target.id] = msgspec.structs.replace(
                    target, attempt=target.attempt + 1, error=op.error
                )
                self.set_timer(
                    f"retry:{target.id}",
                    self.now + self.retry_delay(op.retry_after, target.attempt + 1),
                )
            else:
                self.on_ops([op])

    def retry_delay(self, retry_after: str | None, attempt: int) -> timedelta:
        delay = _backoff(attempt, _RETRY_MAX_SECONDS)
        if retry_after:
            try:
                return max(parse_duration(retry_after), timedelta(0))
            except DuctorError:
                return delay
        return delay

    def on_ops(self, ops: list[Opcode]) -> None:
        for op in ops:
            if self.finished is not None:
                return
            if isinstance(op, StepRunOp | StepFailedOp):
                self.record(step_record(op))
            elif isinstance(op, StepErrorOp | RunErrorOp):
                self.attempt += 1
                delay = self.retry_delay(op.retry_after, self.attempt)
                self.schedule_main(delay)
                if isinstance(op, StepErrorOp):
                    tries = 1
                    if self.retrying is not None and self.retrying.id == op.id:
                        tries = self.retrying.tries + 1
                    self.retrying = Retrying(
                        id=op.id,
                        name=op.name,
                        tries=tries,
                        error=op.error,
                        retry_at=self.now + delay,
                    )
            elif isinstance(op, RunCompleteOp):
                self.finish(RunStatus.SUCCEEDED, output=op.output)
            elif isinstance(op, RunFailedOp):
                self.finish(RunStatus.FAILED, error=core_error(op.error))
            elif op.id in self.recorded or op.id in self.pending:
                continue
            else:
                self.start_pending(op)

    def schedule_main(self, delay: timedelta) -> None:
        self.main_retry = True
        self.set_timer("retry:main", self.now + delay)

    def start_pending(
        self, op: StepPlannedOp | SleepOp | WaitForEventOp | WaitForSignalOp | InvokeOp
    ) -> None:
        pending = Pending(id=op.id, name=op.name, op=msgspec.to_builtins(op))
        self.pending[op.id] = pending
        if isinstance(op, StepPlannedOp):
            self.pending[op.id] = msgspec.structs.replace(pending, task=self.dispatch(pending))
        elif isinstance(op, SleepOp):
            self.set_timer(f"sleep:{op.id}", self.sleep_until(op))
        elif isinstance(op, WaitForEventOp):
            self.commands.append(RegisterWait(step_ref=op.id, kind="event", name=op.event))
            self.set_timer(f"timeout:{op.id}", self.now + self.duration(op.timeout))
        elif isinstance(op, WaitForSignalOp):
            for index, buffered in enumerate(self.pending_signals):
                if buffered.name == op.signal:
                    del self.pending_signals[index]
                    self.record(
                        step_record(op, result={"name": buffered.name, "data": buffered.payload})
                    )
                    return
            self.commands.append(RegisterWait(step_ref=op.id, kind="signal", name=op.signal))
            self.set_timer(f"timeout:{op.id}", self.now + self.duration(op.timeout))
        else:
            self.commands.append(
                StartChildRun(
                    step_ref=f"invoke:{op.id}",
                    child_key=f"{self.state.run_id}:{op.id}",
                    family_slug=op.workflow
                    if op.app_id is None
                    else bridge_slug(op.app_id, op.workflow),
                    version=op.version,
                    input=op.input,
                )
            )
            if op.timeout:
                self.set_timer(f"timeout:{op.id}", self.now + self.duration(op.timeout))

    def duration(self, text: str) -> timedelta:
        try:
            return parse_duration(text)
        except DuctorError:
            return timedelta(0)

    def sleep_until(self, op: SleepOp) -> datetime:
        if op.until:
            # Read as `opcode_problems` checked it (no offset: UTC).
            return _until(op.until) or self.now
        return self.now + self.duration(op.duration or "0s")

    def on_timer(self, item: TimerFired) -> None:
        if item.timer_id == SLOT_TIMER:  # not a stored timer: the slot table's wake-up
            if not self.queued:
                self.ignored.append(IgnoredInput(input=item, reason="already holds a slot"))
            self.queued = False
            return
        if self.timers.pop(item.timer_id, None) is None:
            self.ignored.append(IgnoredInput(input=item, reason="unknown timer"))
            return
        kind, _, step_id = item.timer_id.partition(":")
        if item.timer_id == RUN_TIMEOUT_TIMER:
            self.commands.append(CancelChildRuns())
            self.finish(
                RunStatus.FAILED,
                error=ErrorInfo(
                    code="run.timeout",
                    message="the run did not end within its workflow's timeout",
                    retryable=False,
                ),
            )
        elif item.timer_id == "retry:main":
            self.main_retry = False
        elif item.timer_id == "inline":
            self.inline = False
        elif kind == "retry":
            target = self.pending.get(step_id)
            if target is not None and target.task is None:
                self.pending[step_id] = msgspec.structs.replace(target, task=self.dispatch(target))
        elif kind == "sleep":
            pending = self.pending.get(step_id)
            if pending is not None:
                self.record(step_record(_op(pending.op)))  # type: ignore[arg-type]
        elif kind == "timeout":
            self.on_timeout(step_id)

    def on_timeout(self, step_id: str) -> None:
        pending = self.pending.get(step_id)
        if pending is None:
            return
        op = _op(pending.op)
        if isinstance(op, WaitForEventOp | WaitForSignalOp):
            self.commands.append(ClearWait(step_ref=step_id))
            self.record(step_record(op, result=None))
        elif isinstance(op, InvokeOp):
            self.commands.append(CancelChildRuns(step_ref=f"invoke:{step_id}"))
            error = WireError(
                code="step.timeout",
                message=f"invoked workflow {op.workflow} did not end within {op.timeout}",
                retryable=False,
            )
            self.record(step_record(op, error=error))

    def on_event(self, item: EventReceived) -> None:
        key = f"event:{item.event_id}"
        if key in self.received_ids:
            self.ignored.append(IgnoredInput(input=item, reason="duplicate event"))
            return
        self.received_ids.append(key)
        event = {
            "name": item.name,
            "data": item.data,
            "id": item.event_id,
            "ts": utc_text(self.now),
        }
        for pending in list(self.pending.values()):
            op = _op(pending.op)
            if not isinstance(op, WaitForEventOp) or op.event != item.name:
                continue
            if op.match and not self.matches(op.match, event):
                continue
            self.commands.append(ClearWait(step_ref=op.id))
            self.cancel_timer(f"timeout:{op.id}")
            self.record(step_record(op, result=event))

    def matches(self, source: str, event: dict[str, Any]) -> bool:
        engine = self.engine or default_engine()
        try:
            return engine.evaluate(source, {"event": event, "input": self.state.input}) is True
        except DuctorError as exc:
            log.info("wait match %r did not evaluate: %s", source, exc)
            return False

    def on_signal(self, item: SignalReceived) -> None:
        key = f"signal:{item.signal_id}"
        if key in self.received_ids:
            self.ignored.append(IgnoredInput(input=item, reason="duplicate signal"))
            return
        self.received_ids.append(key)
        for pending in self.pending.values():
            op = _op(pending.op)
            if isinstance(op, WaitForSignalOp) and op.signal == item.name:
                self.commands.append(ClearWait(step_ref=op.id))
                self.cancel_timer(f"timeout:{op.id}")
                self.record(step_record(op, result={"name": item.name, "data": item.payload}))
                return
        self.pending_signals.append(
            BufferedSignal(signal_id=item.signal_id, name=item.name, payload=item.payload)
        )

    def on_child(self, item: ChildRunEnded) -> None:
        step_id = item.step_ref.removeprefix("invoke:")
        pending = self.pending.get(step_id)
        if pending is None:
            self.ignored.append(IgnoredInput(input=item, reason="no invoke waits for it"))
            return
        op = _op(pending.op)
        assert isinstance(op, InvokeOp)
        self.cancel_timer(f"timeout:{step_id}")
        if item.status == RunStatus.SUCCEEDED:
            self.record(step_record(op, result=item.output))
        else:
            default = "run.cancelled" if item.status == RunStatus.CANCELLED else "run.failed"
            self.record(step_record(op, error=wire_error(item.error, default)))

    # --- what next -----------------------------------------------------------------

    def advance(self) -> None:
        """Dispatch the next plain execute when nothing else is outstanding."""
        if self.finished is not None or self.main is not None or self.main_retry or self.inline:
            return
        if self.cancelling is not None or self.queued:
            return
        if self.pending:
            return
        self.main = self.dispatch(None)


def bridge_start(
    *,
    run_id: str,
    app_id: str,
    workflow_id: str,
    input: Any,
    now: datetime,
    event: Event | None = None,
    inline: bool = False,
    timeout: str | None = None,
    cancellable: bool = False,
    queued: bool = False,
) -> BridgeTickResult:
    """The first tick of a bridge run: dispatch its first execute (or, for an
    inline run, give the caller `INLINE_GRACE` to checkpoint before taking over;
    a `queued` run dispatches nothing until it is given a concurrency slot).

    With a `timeout` ("1h", the workflow's option) the run fails with
    `run.timeout` if it has not ended by then.
    """
    data = BridgeData(
        app_id=app_id,
        workflow_id=workflow_id,
        event=msgspec.to_builtins(event) if event is not None else None,
        inline=inline,
        cancellable=cancellable,
        queued=queued,
    )
    state = RunState(
        run_id=run_id,
        status=RunStatus.PENDING,
        input=input,
        created_at=now,
        steps={STATE_KEY: StepState(ref=STATE_KEY)},
    )
    work = _BridgeTick(state, data, now, None)
    if inline:
        work.set_timer("inline", now + INLINE_GRACE)
    if timeout:
        work.set_timer(RUN_TIMEOUT_TIMER, now + work.duration(timeout))
    work.advance()
    return work.result()


def bridge_tick(
    state: RunState,
    data: BridgeData,
    inputs: Sequence[RunInput],
    now: datetime,
    *,
    engine: ExpressionEngine | None = None,
) -> BridgeTickResult:
    """Apply `inputs` to a bridge run (its state and bookkeeping) and say what to
    do next (pure)."""
    if state.status.terminal:
        return BridgeTickResult(
            state=state,
            data=data,
            ignored=[IgnoredInput(input=item, reason="run has ended") for item in inputs],
        )
    work = _BridgeTick(state, data, now, engine)
    for item in inputs:
        if work.finished is not None:
            work.ignored.append(IgnoredInput(input=item, reason="run has ended"))
            continue
        cancel_done = isinstance(item, AttemptResult) and item.step_ref == CANCEL_REF
        if work.cancelling is not None and not cancel_done:
            work.ignored.append(IgnoredInput(input=item, reason="run is being cancelled"))
            continue
        work.apply(item)
    work.advance()
    return work.result()


__all__ = [
    "BRIDGE_KIND",
    "BRIDGE_SLUG_PREFIX",
    "CANCEL_REF",
    "CHECKPOINT_REF",
    "EXECUTE_REF",
    "HANDLER",
    "INLINE_GRACE",
    "MAX_TRANSPORT_FAILURES",
    "RUN_TIMEOUT_TIMER",
    "SLOT_TIMER",
    "STATE_KEY",
    "BridgeData",
    "BridgeTickResult",
    "Pending",
    "bridge_slug",
    "bridge_start",
    "bridge_tick",
    "checkpoint_input",
    "core_error",
    "is_bridge_slug",
    "opcode_problems",
    "parse_bridge_slug",
    "read_data",
    "wire_error",
]
