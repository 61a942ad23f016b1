"""Memoized replay: the step API user code calls, and the driver of one execute.

Holds `Context`, `Steps` and `execute_workflow`; turns a run's recorded history
plus the workflow function into the opcodes of one execute. No HTTP here: the
only I/O is the optional checkpoint callback the caller passes in.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import reprlib
from asyncio import FIRST_COMPLETED
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ParamSpec, TypeVar, overload

import msgspec

from ductor import _telemetry
from ductor.durations import MAX_DURATION, canonical_duration
from ductor.errors import (
    DuctorError,
    NonDeterminismError,
    NonRetriableError,
    ProtocolError,
    RetryAfterError,
    StepFailed,
    StepInterrupt,
)
from ductor.protocol import (
    ErrorInfo,
    Event,
    InvokeOp,
    Opcode,
    OpcodeName,
    RunCompleteOp,
    RunErrorOp,
    RunFailedOp,
    Signal,
    SleepOp,
    StepErrorOp,
    StepFailedOp,
    StepKeys,
    StepPlannedOp,
    StepRecord,
    StepRunOp,
    WaitForEventOp,
    WaitForSignalOp,
    step_id,
)
from ductor.protocol import json_safe_text as _text

P = ParamSpec("P")
T = TypeVar("T")

SETTLE_ROUNDS = 10
"""Event-loop turns with no new step call after which discovery is complete."""

CHANGE_GRACE_SECONDS = 0.5
"""Before calling the code changed (a new step while a recorded one was not
replayed) inside parallel branches, wait this long for a slower branch to
reach its steps. Sequential code is judged at once."""


@dataclass(frozen=True, slots=True, eq=False)
class _Kind:
    """A kind of step: how the code calls it and the recorded ops it may match.

    Plain objects compared by identity: an Enum's Python-level hash showed up
    in replay benchmarks.
    """

    label: str
    ops: tuple[OpcodeName, ...]


_RUN = _Kind("step.run", (OpcodeName.STEP_RUN, OpcodeName.STEP_FAILED))
_SLEEP = _Kind("step.sleep", (OpcodeName.SLEEP,))
_EVENT = _Kind("step.wait_for_event", (OpcodeName.WAIT_FOR_EVENT,))
_SIGNAL = _Kind("step.wait_for_signal", (OpcodeName.WAIT_FOR_SIGNAL,))
_INVOKE = _Kind("step.invoke", (OpcodeName.INVOKE,))


@dataclass(eq=False)
class _Pending:
    """A step the code asked for that has no recorded result yet."""

    id: str
    name: str
    kind: _Kind
    op: Opcode
    future: asyncio.Future[Any]
    task: asyncio.Task[Any] | None
    fn: Callable[..., Any] | None = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


class _Replay:
    """The replay state of one execute: recorded steps, visits, and new steps found."""

    def __init__(self, steps: list[StepRecord]) -> None:
        self.records: dict[str, tuple[int, StepRecord]] = {}
        for index, record in enumerate(steps):
            self.records.setdefault(record.id, (index, record))
        self.visited: set[str] = set()
        self.keys = StepKeys()
        self.pending: list[_Pending] = []
        self.last_index: dict[asyncio.Task[Any] | None, int] = {}
        self.error: NonDeterminismError | None = None
        self.calls = 0
        self.closed = False
        self.woken: asyncio.Event = asyncio.Event()

    def changed(self, message: str, step: str) -> StepInterrupt:
        if self.error is None:
            self.error = NonDeterminismError(message, step=step)
        self.woken.set()
        return StepInterrupt()

    async def step(
        self,
        name: str,
        kind: _Kind,
        make_op: Callable[[str], Opcode],
        fn: Callable[..., Any] | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if not isinstance(name, str) or not name:
            raise TypeError(f"{kind.label} needs a non-empty step name, got {name!r}")
        outer = _RUNNING_STEP.get()
        if outer is not None:  # it would wait for the step it runs in: forever
            raise _NestedStep(
                f"{kind.label}({name!r}) was called inside step {outer!r}: steps cannot be"
                " nested; call it from the workflow body"
            )
        self.calls += 1
        if self.closed or self.error is not None:
            raise StepInterrupt()
        sid = step_id(self.keys.key(name))
        task = asyncio.current_task()
        found = self.records.get(sid)
        if found is not None:
            index, record = found
            if record.op not in kind.ops:
                raise self.changed(
                    f"workflow changed under a running run: step {name!r} was recorded as"
                    f" {record.op.value} but the code now calls {kind.label}",
                    name,
                )
            if index < self.last_index.get(task, -1):
                raise self.changed(
                    f"workflow changed under a running run: step {name!r} was recorded"
                    " before a step this code already replayed; steps were reordered",
                    name,
                )
            self.last_index[task] = index
            self.visited.add(sid)
            if record.error is not None:
                raise StepFailed(
                    name,
                    code=record.error.code,
                    message=record.error.message,
                    details=record.error.details,
                )
            return record.result
        loop = asyncio.get_running_loop()
        pending = _Pending(
            id=sid,
            name=name,
            kind=kind,
            op=make_op(sid),
            future=loop.create_future(),
            task=task,
            fn=fn,
            args=args,
            kwargs=kwargs or {},
        )
        self.pending.append(pending)
        self.woken.set()
        return await pending.future

    def record(self, pending: _Pending, op: StepRunOp | StepFailedOp) -> None:
        """Make a step run in-process part of the history (checkpoint mode)."""
        index = len(self.records)
        if isinstance(op, StepRunOp):
            self.records[op.id] = (
                index,
                StepRecord(id=op.id, name=op.name, op=OpcodeName.STEP_RUN, result=op.result),
            )
        else:
            self.records[op.id] = (
                index,
                StepRecord(id=op.id, name=op.name, op=OpcodeName.STEP_FAILED, error=op.error),
            )
        self.visited.add(op.id)
        self.last_index[pending.task] = index

    def unvisited(self) -> StepRecord | None:
        """The first recorded step the code has not asked for, if any."""
        missing = [(i, r) for sid, (i, r) in self.records.items() if sid not in self.visited]
        return min(missing, key=lambda pair: pair[0])[1] if missing else None

    async def settle(self, task: asyncio.Task[Any]) -> None:
        """Wait until the body finished, or found new steps and stopped finding more."""
        while not task.done() and not self.pending and self.error is None:
            self.woken.clear()
            waiter = asyncio.ensure_future(self.woken.wait())
            try:
                await asyncio.wait({task, waiter}, return_when=FIRST_COMPLETED)
            finally:
                waiter.cancel()
        if task.done():
            return
        quiet = 0
        seen = (self.calls, len(self.pending))
        while quiet < SETTLE_ROUNDS and not task.done():
            await asyncio.sleep(0)
            now = (self.calls, len(self.pending))
            quiet = quiet + 1 if now == seen else 0
            seen = now

    async def progress_within(self, task: asyncio.Task[Any], seconds: float) -> bool:
        """Whether the body calls another step (or ends) within `seconds`."""
        calls = self.calls
        self.woken.clear()
        waiter = asyncio.ensure_future(self.woken.wait())
        try:
            await asyncio.wait({task, waiter}, timeout=seconds, return_when=FIRST_COMPLETED)
        finally:
            waiter.cancel()
        return self.calls != calls and not task.done()

    async def close(self, task: asyncio.Task[Any]) -> None:
        """Stop the body: interrupt every step still waiting, then reap the task."""
        self.closed = True
        for _ in range(SETTLE_ROUNDS):
            for pending in self.pending:
                if not pending.future.done():
                    pending.future.set_exception(StepInterrupt())
            if task.done():
                break
            await asyncio.sleep(0)
        if not task.done():
            task.cancel()
        # The body's end is already decided; whatever it raises now is noise.
        with contextlib.suppress(BaseException):
            await task


class Steps:
    """The step API of a workflow body: `ctx.step.run(...)`, `ctx.step.sleep(...)`, ...

    Every method takes a step `name`, unique in the run (repeats are numbered),
    which with its position identifies the step across replays.
    """

    __slots__ = ("_replay",)

    def __init__(self, replay: _Replay) -> None:
        self._replay = replay

    @overload
    async def run(
        self,
        name: str,
        fn: Callable[P, Awaitable[T]],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T: ...

    @overload
    async def run(
        self,
        name: str,
        fn: Callable[P, T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T: ...

    async def run(
        self,
        name: str,
        fn: Callable[P, Any],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> Any:
        """Run `fn(*args, **kwargs)` once per run and memoize its JSON result.

        On replay the recorded result is returned without calling `fn`. The
        result must be JSON-encodable; replay returns its JSON form.

        Raises:
            StepFailed: the step failed for good (recorded), on every replay.
        """
        return await self._replay.step(
            name,
            _RUN,
            lambda sid: StepPlannedOp(id=sid, name=name),
            fn,
            args,
            dict(kwargs),
        )

    async def sleep(self, name: str, duration: str | timedelta) -> None:
        """Sleep durably for `duration` ("10m", "1h30m" or a timedelta)."""
        text = canonical_duration(duration)
        await self._replay.step(name, _SLEEP, lambda sid: SleepOp(id=sid, name=name, duration=text))

    async def sleep_until(self, name: str, until: datetime) -> None:
        """Sleep durably until `until` (a timezone-aware datetime)."""
        if until.tzinfo is None:
            raise ValueError(f"sleep_until({name!r}) needs a timezone-aware datetime")
        text = until.astimezone(UTC).isoformat().replace("+00:00", "Z")
        await self._replay.step(name, _SLEEP, lambda sid: SleepOp(id=sid, name=name, until=text))

    async def wait_for_event(
        self,
        name: str,
        *,
        event: str,
        timeout: str | timedelta,  # noqa: ASYNC109 - a durable timeout, not an I/O one
        match: str | None = None,
    ) -> Event | None:
        """Wait for an event named `event` whose CEL `match` holds.

        `match` sees `event` (the candidate) and `input` (the run's input).

        Returns:
            The event, or None when `timeout` passed first.
        """
        text = canonical_duration(timeout)
        result = await self._replay.step(
            name,
            _EVENT,
            lambda sid: WaitForEventOp(id=sid, name=name, event=event, match=match, timeout=text),
        )
        return None if result is None else msgspec.convert(result, Event)

    async def wait_for_signal(
        self,
        name: str,
        *,
        timeout: str | timedelta,  # noqa: ASYNC109 - a durable timeout, not an I/O one
        signal: str | None = None,
    ) -> Signal | None:
        """Wait for a signal sent to this run (named `signal`, default: `name`).

        Returns:
            The signal, or None when `timeout` passed first.
        """
        text = canonical_duration(timeout)
        signal_name = signal or name
        result = await self._replay.step(
            name,
            _SIGNAL,
            lambda sid: WaitForSignalOp(id=sid, name=name, signal=signal_name, timeout=text),
        )
        return None if result is None else msgspec.convert(result, Signal)

    async def invoke(
        self,
        name: str,
        *,
        workflow: str,
        input: Any = None,
        app_id: str | None = None,
        version: int | None = None,
        timeout: str | timedelta | None = None,  # noqa: ASYNC109 - a durable timeout
    ) -> Any:
        """Run another workflow and return its output.

        Args:
            name: the step name.
            workflow: a DAG family slug, or with `app_id` an SDK workflow id.
            input: the child's input (JSON-encodable).
            app_id: the app serving `workflow` when it is SDK-hosted.
            version: pin a DAG family version (default: latest).
            timeout: fail the child after this long.

        Raises:
            StepFailed: the child run failed (or timed out).
        """
        payload = _to_json(input)
        text = None if timeout is None else canonical_duration(timeout)
        return await self._replay.step(
            name,
            _INVOKE,
            lambda sid: InvokeOp(
                id=sid,
                name=name,
                workflow=workflow,
                app_id=app_id,
                input=payload,
                version=version,
                timeout=text,
            ),
        )


class Context:
    """What a workflow body gets besides its input: the run and the step API.

    Attributes:
        run_id: the run being advanced.
        workflow_id: the workflow's id.
        attempt: failed attempts so far of what this execute runs (0 first).
        event: the event that triggered the run, if any.
        step: the step API.
        traceparent: the engine's W3C trace context, to continue its trace.
    """

    __slots__ = ("attempt", "event", "run_id", "step", "traceparent", "workflow_id")

    def __init__(
        self,
        *,
        run_id: str,
        workflow_id: str,
        attempt: int,
        event: Event | None,
        step: Steps,
        traceparent: str | None = None,
    ) -> None:
        self.run_id = run_id
        self.workflow_id = workflow_id
        self.attempt = attempt
        self.event = event
        self.step = step
        self.traceparent = traceparent


_NOT_JSON = (TypeError, msgspec.EncodeError, UnicodeEncodeError, RecursionError)
"""What encoding a value that has no JSON form raises (an object, a lone surrogate,
values nested deeper than the interpreter's recursion limit)."""


def _to_json(value: Any) -> Any:
    """The JSON form of a value, exactly as a replay would return it.

    Raises:
        TypeError, msgspec.EncodeError, UnicodeEncodeError, RecursionError:
            (`_NOT_JSON`) the value has no JSON form, e.g. an object, a string
            holding a lone surrogate, or lists nested thousands deep.
    """
    return msgspec.json.decode(msgspec.json.encode(value))


def error_info(exc: BaseException, *, default_code: str, retryable: bool) -> ErrorInfo:
    """The wire form of an exception raised by user code (its texts made JSON-safe,
    so the error itself is always recorded)."""
    if isinstance(exc, DuctorError):
        return ErrorInfo(
            code=_text(exc.code),
            message=_text(exc.message),
            name=type(exc).__name__,
            retryable=retryable,
            details=_details(exc.details),
        )
    return ErrorInfo(
        code=default_code, message=_message(exc), name=type(exc).__name__, retryable=retryable
    )


def _message(exc: BaseException) -> str:
    """The exception's text; a `__str__` that raises (or overflows on a deep value)
    still leaves an error to record, named by its type."""
    try:
        return _text(str(exc))
    except Exception as err:
        return f"{type(exc).__name__} (its message could not be read: {type(err).__name__})"


def _details(details: Any) -> Any:
    try:
        return _to_json(details)
    except _NOT_JSON:
        try:
            return _text(repr(details))
        except RecursionError:  # reprlib stops at a few levels, where repr() overflows
            return _text(reprlib.repr(details))


def _retry_after(exc: BaseException) -> str | None:
    if isinstance(exc, RetryAfterError):
        # A longer wait than the server can keep is the longest it keeps.
        return canonical_duration(min(max(exc.retry_after, timedelta(0)), MAX_DURATION))
    return None


def _final(exc: BaseException, attempt: int, retries: int) -> bool:
    """Whether this failure ends the step (or the run) rather than being retried."""
    if isinstance(exc, NonRetriableError | StepFailed | NonDeterminismError):
        return True
    return attempt >= retries


async def _run_step(
    pending: _Pending, attempt: int, retries: int
) -> StepRunOp | StepErrorOp | StepFailedOp:
    assert pending.fn is not None
    with _telemetry.step_span(pending.name, attempt=attempt) as span:
        op = await _call_step(pending, attempt, retries)
        if not isinstance(op, StepRunOp):
            _telemetry.failed(span, op.error.code)
        return op


async def _call_step(
    pending: _Pending, attempt: int, retries: int
) -> StepRunOp | StepErrorOp | StepFailedOp:
    assert pending.fn is not None
    running = _RUNNING_STEP.set(pending.name)
    try:
        value = pending.fn(*pending.args, **pending.kwargs)
        if inspect.isawaitable(value):
            value = await value
    except (Exception, asyncio.CancelledError) as exc:
        if isinstance(exc, asyncio.CancelledError) and _cancelling():
            raise  # this request is being cancelled, not a step that raised it
        if _final(exc, attempt, retries):
            return StepFailedOp(
                id=pending.id,
                name=pending.name,
                error=error_info(exc, default_code="step.error", retryable=False),
            )
        return StepErrorOp(
            id=pending.id,
            name=pending.name,
            error=error_info(exc, default_code="step.error", retryable=True),
            retry_after=_retry_after(exc),
        )
    finally:
        _RUNNING_STEP.reset(running)
    try:
        result = _to_json(value)
    except _NOT_JSON as exc:
        return StepFailedOp(
            id=pending.id,
            name=pending.name,
            error=ErrorInfo(
                code="step.result_invalid",
                message=_text(f"step {pending.name!r} returned a value that is not JSON: {exc}"),
                name=type(exc).__name__,
            ),
        )
    return StepRunOp(id=pending.id, name=pending.name, result=result)


Checkpoint = Callable[[list[Opcode]], Awaitable[bool]]
"""Reports opcodes produced in-process; True when the server recorded them."""


@dataclass(frozen=True, kw_only=True)
class ExecuteParams:
    """Everything one execute needs besides the workflow function."""

    run_id: str
    workflow_id: str
    attempt: int
    input: Any
    steps: list[StepRecord]
    event: Event | None
    target_step: str | None
    retries: int
    traceparent: str | None = None


_RUNNING_STEP: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "ductor_running_step", default=None
)
"""The name of the step whose body is running in this context, if any."""


class _NestedStep(NonRetriableError):
    code = "step.nested"


def _cancelling() -> bool:
    """Whether the running task is being cancelled (and not a step's code that
    raised CancelledError of its own, such as awaiting a future cancelled elsewhere)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _outside_steps() -> contextvars.Context:
    context = contextvars.copy_context()
    context.run(_RUNNING_STEP.set, None)
    return context


async def execute_workflow(
    fn: Callable[[Context, Any], Awaitable[Any]],
    params: ExecuteParams,
    *,
    checkpoint: Checkpoint | None = None,
) -> list[Opcode]:
    """Replay `fn` over the recorded steps and return the opcodes of this execute.

    With `checkpoint`, a step run in-process is reported through it and, once
    recorded, the body continues to the next step in the same request; if the
    report fails, the step's opcode is returned instead (one step per call).
    """
    replay = _Replay(params.steps)
    ctx = Context(
        run_id=params.run_id,
        workflow_id=params.workflow_id,
        attempt=params.attempt,
        event=params.event,
        step=Steps(replay),
        traceparent=params.traceparent,
    )
    attempt = params.attempt
    # The body runs outside any step, even when this execute runs inside one
    # (a step that runs another workflow in-process).
    task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(
        _call(fn, ctx, params.input), context=_outside_steps()
    )
    try:
        while True:
            await replay.settle(task)
            if replay.error is not None:
                return [_changed_op(replay.error)]
            if not replay.pending:
                return [_outcome(replay, task, attempt, params.retries)]
            missing = replay.unvisited()
            if (
                missing is not None
                and any(p.task is not task for p in replay.pending)  # inside parallel branches
                and await replay.progress_within(task, CHANGE_GRACE_SECONDS)
            ):
                continue  # a slower branch is still replaying; look again
            if missing is not None:
                new = replay.pending[0]
                return [
                    _changed_op(
                        NonDeterminismError(
                            f"workflow changed under a running run: the code asks for new step"
                            f" {new.name!r} before recorded step {missing.name!r}",
                            step=new.name,
                        )
                    )
                ]
            chosen = _choose(replay.pending, params.target_step)
            if chosen is None:
                return [_suspend_op(p) for p in replay.pending]
            op = await _run_step(chosen, attempt, params.retries)
            if (
                checkpoint is None
                or isinstance(op, StepErrorOp)
                or len(replay.pending) != 1
                or not await checkpoint([op])
            ):
                return [op]
            replay.record(chosen, op)
            replay.pending.clear()
            attempt = 0
            if isinstance(op, StepRunOp):
                chosen.future.set_result(op.result)
            else:
                chosen.future.set_exception(
                    StepFailed(
                        op.name,
                        code=op.error.code,
                        message=op.error.message,
                        details=op.error.details,
                    )
                )
    finally:
        await replay.close(task)


async def _call(fn: Callable[[Context, Any], Awaitable[Any]], ctx: Context, value: Any) -> Any:
    return await fn(ctx, value)


def _choose(pending: list[_Pending], target: str | None) -> _Pending | None:
    """The one step to run now: the target, or the only step found; else none."""
    if target is not None:
        for candidate in pending:
            if candidate.id == target and candidate.kind is _RUN:
                return candidate
        names = ", ".join(repr(p.name) for p in pending) or "none"
        raise ProtocolError(
            f"target step {target!r} is not a runnable step found in this execute (found: {names})",
            code="step.target_not_found",
        )
    if len(pending) == 1 and pending[0].kind is _RUN:
        return pending[0]
    return None


def _suspend_op(pending: _Pending) -> Opcode:
    return pending.op


def _changed_op(error: NonDeterminismError) -> RunFailedOp:
    return RunFailedOp(
        error=ErrorInfo(
            code=error.code,
            message=error.message,
            name=type(error).__name__,
            details={"step": error.step},
        )
    )


def _outcome(replay: _Replay, task: asyncio.Task[Any], attempt: int, retries: int) -> Opcode:
    """The run-level opcode of a body that finished without asking for a new step."""
    # A body that raised CancelledError itself (this request was not cancelled:
    # that would have stopped us before here) failed like any other error.
    exc = (
        asyncio.CancelledError("the workflow body raised CancelledError")
        if task.cancelled()
        else task.exception()
    )
    if exc is None:
        missing = replay.unvisited()
        if missing is not None:
            return _changed_op(
                NonDeterminismError(
                    f"workflow changed under a running run: recorded step {missing.name!r}"
                    " is no longer asked for by the code",
                    step=missing.name,
                )
            )
        try:
            return RunCompleteOp(output=_to_json(task.result()))
        except _NOT_JSON as err:
            return RunFailedOp(
                error=ErrorInfo(
                    code="workflow.output_invalid",
                    message=_text(f"the workflow returned a value that is not JSON: {err}"),
                    name=type(err).__name__,
                )
            )
    if not isinstance(exc, Exception | asyncio.CancelledError):
        raise exc
    if _final(exc, attempt, retries):
        return RunFailedOp(error=error_info(exc, default_code="workflow.error", retryable=False))
    return RunErrorOp(
        error=error_info(exc, default_code="workflow.error", retryable=True),
        retry_after=_retry_after(exc),
    )
