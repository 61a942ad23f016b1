"""The pure bridge tick: targeted cases, and a property run against the real SDK
with inputs delivered late, out of order and twice."""

from __future__ import annotations

import asyncio
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ductor import Client, Context
from ductor.protocol import (
    SIGNATURE_HEADER,
    ExecuteRequest,
    ExecuteResponse,
    InvokeOp,
    Opcode,
    RunCompleteOp,
    SigningKeys,
    SleepOp,
    StepErrorOp,
    StepFailedOp,
    StepPlannedOp,
    StepRunOp,
    WaitForEventOp,
    WaitForSignalOp,
    decode,
    encode,
)
from ductor.protocol import (
    ErrorInfo as WireError,
)
from ductor_core.runs import (
    AttemptResult,
    CancelChildRuns,
    CancelRequested,
    ChildRunEnded,
    ClearWait,
    Command,
    DispatchTask,
    ErrorInfo,
    EventReceived,
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
    TimerFired,
)
from ductor_server.bridge.tick import (
    INLINE_GRACE,
    MAX_TRANSPORT_FAILURES,
    BridgeData,
    BridgeTickResult,
    bridge_slug,
    bridge_start,
    bridge_tick,
    checkpoint_input,
    is_bridge_slug,
    parse_bridge_slug,
    read_data,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _start(**kw: Any) -> BridgeTickResult:
    return bridge_start(
        run_id="run-1", app_id="shop", workflow_id="wf", input={"id": 7}, now=T0, **kw
    )


def _dispatches(result: BridgeTickResult) -> list[DispatchTask]:
    return [c for c in result.commands if isinstance(c, DispatchTask)]


def _answer(task: DispatchTask, *ops: Opcode) -> AttemptResult:
    return AttemptResult(
        step_ref=task.step_ref,
        attempt=task.attempt,
        ok=True,
        output={"opcodes": msgspec.to_builtins(list(ops))},
    )


def _of(commands: list[Command], kind: type[Any]) -> list[Any]:
    return [c for c in commands if isinstance(c, kind)]


def test_slugs_round_trip() -> None:
    slug = bridge_slug("shop", "charge-order")
    assert slug == "bridge:shop:charge-order"
    assert is_bridge_slug(slug)
    assert not is_bridge_slug("charge-order")
    assert parse_bridge_slug(slug) == ("shop", "charge-order")


def test_start_dispatches_one_execute_with_the_input() -> None:
    result = _start()
    assert result.state.status == RunStatus.RUNNING
    [task] = _dispatches(result)
    assert task.handler == "bridge"
    request = msgspec.convert(task.payload["request"], ExecuteRequest)
    assert request.input == {"id": 7}
    assert request.steps == []
    assert request.target_step is None


def test_a_recorded_step_is_sent_back_and_a_stale_answer_is_ignored() -> None:
    first = _start()
    [task] = _dispatches(first)
    op = StepRunOp(id="a" * 32, name="charge", result=5)
    second = bridge_tick(first.state, first.data, [_answer(task, op)], T0)
    [next_task] = _dispatches(second)
    request = msgspec.convert(next_task.payload["request"], ExecuteRequest)
    assert [r.name for r in request.steps] == ["charge"]
    assert next_task.attempt > task.attempt
    # The same answer delivered again changes nothing.
    third = bridge_tick(second.state, second.data, [_answer(task, op)], T0)
    assert _dispatches(third) == []
    assert len(third.ignored) == 1
    assert len(third.data.history) == 1


def test_a_run_stored_with_its_bookkeeping_in_the_bridge_step_still_ticks() -> None:
    # Earlier releases kept BridgeData in the `_bridge` step's data (kind_state NULL).
    first = _start()
    [task] = _dispatches(first)
    assert first.state.steps["_bridge"].data == {}
    holder = StepState(
        ref="_bridge", status=StepStatus.RUNNING, data=msgspec.to_builtins(first.data)
    )
    legacy = msgspec.structs.replace(first.state, steps={"_bridge": holder})
    assert read_data(None, legacy) == first.data
    assert read_data(msgspec.to_builtins(first.data), first.state) == first.data
    with pytest.raises(KeyError):
        read_data(None, first.state)
    op = StepRunOp(id="a" * 32, name="charge", result=5)
    second = bridge_tick(legacy, read_data(None, legacy), [_answer(task, op)], T0)
    assert [r.name for r in second.data.history] == ["charge"]
    assert second.state.steps["_bridge"].data == {}  # the bookkeeping now travels apart
    assert second.state.steps["_bridge"].status == StepStatus.RUNNING


def test_sleep_wait_and_invoke_become_timers_waits_and_child_runs() -> None:
    first = _start()
    [task] = _dispatches(first)
    sleep = SleepOp(id="s" * 32, name="nap", duration="10m")
    result = bridge_tick(first.state, first.data, [_answer(task, sleep)], T0)
    [timer] = _of(result.commands, SetTimer)
    assert timer.fire_at == T0 + timedelta(minutes=10)
    assert _dispatches(result) == []
    fired = bridge_tick(
        result.state, result.data, [TimerFired(timer_id=timer.timer_id)], timer.fire_at
    )
    [task] = _dispatches(fired)

    wait = WaitForEventOp(
        id="e" * 32,
        name="shipped",
        event="order.shipped",
        match="event.data.id == input.id",
        timeout="1h",
    )
    invoke = InvokeOp(id="i" * 32, name="child", workflow="receipt", app_id="shop", input=1)
    result = bridge_tick(fired.state, fired.data, [_answer(task, wait, invoke)], T0)
    [register] = _of(result.commands, RegisterWait)
    assert (register.kind, register.name) == ("event", "order.shipped")
    [child] = _of(result.commands, StartChildRun)
    assert child.family_slug == "bridge:shop:receipt"

    other = EventReceived(event_id="e1", name="order.shipped", data={"id": 8})
    result = bridge_tick(result.state, result.data, [other], T0)
    assert _of(result.commands, ClearWait) == []
    mine = EventReceived(event_id="e2", name="order.shipped", data={"id": 7})
    result = bridge_tick(result.state, result.data, [mine, mine], T0)
    assert len(_of(result.commands, ClearWait)) == 1
    assert _dispatches(result) == []  # the invoke is still out
    ended = ChildRunEnded(
        step_ref=child.step_ref,
        child_run_id="run-2",
        status=RunStatus.FAILED,
        error=ErrorInfo(code="boom", message="child failed", retryable=False),
    )
    result = bridge_tick(result.state, result.data, [ended], T0)
    [task] = _dispatches(result)
    steps = msgspec.convert(task.payload["request"], ExecuteRequest).steps
    assert [r.name for r in steps] == ["nap", "shipped", "child"]
    assert steps[1].result["data"] == {"id": 7}
    assert steps[2].error is not None
    assert steps[2].error.code == "boom"


def _step(result: BridgeTickResult, ref: str) -> StepState:
    return result.state.steps[ref]


def test_retries_and_waits_read_as_a_dag_run_s() -> None:
    """A failed try shows as RETRYING with its attempt, error and time, for a step
    of the body and for a planned (parallel) one; a recorded step shows its tries;
    sleeps and invokes wait in the DAG's words."""
    first = _start()
    [task] = _dispatches(first)
    boom = WireError(code="boom", message="try failed", retryable=True)
    body = StepErrorOp(id="b" * 32, name="charge", error=boom)
    result = bridge_tick(first.state, first.data, [_answer(task, body)], T0)
    step = _step(result, "charge")
    assert (step.status, step.attempt) == (StepStatus.RETRYING, 1)
    assert step.error is not None
    assert (step.error.code, step.error.message) == ("boom", "try failed")
    assert step.retry_at is not None
    assert step.retry_at > T0
    assert step.waiting_for == f"retry at {step.retry_at.isoformat().replace('+00:00', 'Z')}"
    [timer] = _of(result.commands, SetTimer)
    result = bridge_tick(result.state, result.data, [TimerFired(timer_id=timer.timer_id)], T0)
    assert (_step(result, "charge").status, _step(result, "charge").attempt) == (
        StepStatus.RUNNING,
        2,
    )
    [task] = _dispatches(result)
    done = StepRunOp(id="b" * 32, name="charge", result=1)
    planned = [StepPlannedOp(id="p" * 32, name="left"), StepPlannedOp(id="q" * 32, name="right")]
    result = bridge_tick(result.state, result.data, [_answer(task, done, *planned)], T0)
    assert (_step(result, "charge").status, _step(result, "charge").attempt) == (
        StepStatus.SUCCEEDED,
        2,
    )
    assert _step(result, "left").attempt == 1
    left = next(t for t in _dispatches(result) if "p" * 32 in str(t.payload))
    failed_left = StepErrorOp(id="p" * 32, name="left", error=boom)
    result = bridge_tick(result.state, result.data, [_answer(left, failed_left)], T0)
    step = _step(result, "left")
    assert (step.status, step.attempt) == (StepStatus.RETRYING, 1)
    assert step.error is not None
    assert step.retry_at is not None
    assert (step.waiting_for or "").startswith("retry at ")

    fresh = _start()
    [task] = _dispatches(fresh)
    nap = SleepOp(id="s" * 32, name="nap", duration="10m")
    invoke = InvokeOp(id="i" * 32, name="child", workflow="receipt", app_id="shop", input=1)
    result = bridge_tick(fresh.state, fresh.data, [_answer(task, nap, invoke)], T0)
    assert _step(result, "nap").waiting_for == "timer 2026-01-01T00:10:00Z"
    assert _step(result, "child").waiting_for == "child run"


def test_a_wait_times_out_with_null_and_an_early_signal_is_buffered() -> None:
    first = _start()
    early = bridge_tick(
        first.state, first.data, [SignalReceived(signal_id="x", name="go", payload=1)], T0
    )
    [task] = _dispatches(first)
    wait = WaitForSignalOp(id="w" * 32, name="go", signal="go", timeout="5m")
    result = bridge_tick(early.state, early.data, [_answer(task, wait)], T0)
    [task] = _dispatches(result)
    steps = msgspec.convert(task.payload["request"], ExecuteRequest).steps
    assert steps[0].result == {"name": "go", "data": 1}

    timeout_wait = WaitForSignalOp(id="v" * 32, name="late", signal="late", timeout="5m")
    result = bridge_tick(result.state, result.data, [_answer(task, timeout_wait)], T0)
    [timer] = _of(result.commands, SetTimer)
    result = bridge_tick(
        result.state, result.data, [TimerFired(timer_id=timer.timer_id)], timer.fire_at
    )
    [task] = _dispatches(result)
    steps = msgspec.convert(task.payload["request"], ExecuteRequest).steps
    assert steps[1].name == "late"
    assert steps[1].result is None


def test_unreachable_app_is_retried_then_the_run_fails() -> None:
    result = _start()
    state, data = result.state, result.data
    [task] = _dispatches(result)
    error = ErrorInfo(code="bridge.unreachable", message="down", retryable=True)
    for _ in range(MAX_TRANSPORT_FAILURES):
        result = bridge_tick(
            state,
            data,
            [AttemptResult(step_ref=task.step_ref, attempt=task.attempt, ok=False, error=error)],
            T0,
        )
        if result.state.status.terminal:
            break
        [timer] = _of(result.commands, SetTimer)
        assert timer.timer_id == "retry:main"
        fired = bridge_tick(
            result.state, result.data, [TimerFired(timer_id="retry:main")], timer.fire_at
        )
        [task] = _dispatches(fired)
        state, data = fired.state, fired.data
    assert result.state.status == RunStatus.FAILED
    assert result.state.error is not None
    assert result.state.error.code == "bridge.unreachable"


def test_a_signature_failure_fails_at_once() -> None:
    first = _start()
    [task] = _dispatches(first)
    error = ErrorInfo(code="signature.mismatch", message="bad", retryable=False)
    result = bridge_tick(
        first.state,
        first.data,
        [AttemptResult(step_ref=task.step_ref, attempt=task.attempt, ok=False, error=error)],
        T0,
    )
    assert result.state.status == RunStatus.FAILED
    assert _of(result.commands, RunFinished)[0].error.code == "signature.mismatch"
    assert result.data.history == []


def test_cancel_ends_the_run_and_cancels_children() -> None:
    start = _start()
    result = bridge_tick(start.state, start.data, [CancelRequested(reason="no")], T0)
    assert result.state.status == RunStatus.CANCELLED
    assert _of(result.commands, CancelChildRuns) == [CancelChildRuns()]
    late = bridge_tick(result.state, result.data, [TimerFired(timer_id="x")], T0)
    assert late.commands == []


def test_inline_runs_wait_for_checkpoints_and_are_taken_over_when_silent() -> None:
    first = _start(inline=True)
    assert _dispatches(first) == []
    op = StepRunOp(id="a" * 32, name="hello", result="hi")
    result = bridge_tick(first.state, first.data, [checkpoint_input(0, [op])], T0)
    assert _dispatches(result) == []
    assert [r.name for r in result.data.history] == ["hello"]
    done = bridge_tick(
        first.state, first.data, [checkpoint_input(0, [op, RunCompleteOp(output="HI")])], T0
    )
    assert done.state.status == RunStatus.SUCCEEDED
    assert done.state.output == "HI"
    silent = bridge_tick(
        result.state, result.data, [TimerFired(timer_id="inline")], T0 + INLINE_GRACE
    )
    [task] = _dispatches(silent)
    assert [r.name for r in msgspec.convert(task.payload["request"], ExecuteRequest).steps] == [
        "hello"
    ]


def test_a_failed_step_record_is_kept_with_its_error() -> None:
    first = _start()
    [task] = _dispatches(first)
    failed = StepFailedOp(
        id="f" * 32, name="charge", error=WireError(code="card.declined", message="no")
    )
    result = bridge_tick(first.state, first.data, [_answer(task, failed)], T0)
    [task] = _dispatches(result)
    [record] = msgspec.convert(task.payload["request"], ExecuteRequest).steps
    assert record.error is not None
    assert record.error.code == "card.declined"


# --- property: a random workflow, inputs shuffled and redelivered -------------------

KEY = "signkey-prop"
KINDS = ("run", "sleep", "signal", "pair", "flaky")


def _workflow_app(executed: dict[str, int]) -> Client:
    client = Client("shop", signing_key=KEY)
    failed_once: set[str] = set()

    def body(name: str, flaky: bool = False) -> Any:
        def run() -> str:
            if flaky and name not in failed_once:
                failed_once.add(name)
                raise RuntimeError("first try fails")
            executed[name] = executed.get(name, 0) + 1
            return name.upper()

        return run

    @client.workflow("gen", retries=2)
    async def gen(ctx: Context, spec: list[str]) -> list[Any]:
        out: list[Any] = []
        for i, kind in enumerate(spec):
            if kind == "run":
                out.append(await ctx.step.run(f"r{i}", body(f"r{i}")))
            elif kind == "flaky":
                out.append(await ctx.step.run(f"f{i}", body(f"f{i}", flaky=True)))
            elif kind == "sleep":
                await ctx.step.sleep(f"z{i}", "5s")
                out.append("slept")
            elif kind == "signal":
                got = await ctx.step.wait_for_signal(f"w{i}", signal=f"go{i}", timeout="1h")
                out.append(None if got is None else got.data)
            else:
                pair = await asyncio.gather(
                    ctx.step.run(f"a{i}", body(f"a{i}")), ctx.step.run(f"b{i}", body(f"b{i}"))
                )
                out.append(list(pair))
        return out

    return client


def _expected(spec: list[str]) -> list[Any]:
    out: list[Any] = []
    for i, kind in enumerate(spec):
        if kind == "run":
            out.append(f"R{i}")
        elif kind == "flaky":
            out.append(f"F{i}")
        elif kind == "sleep":
            out.append("slept")
        elif kind == "signal":
            out.append(i)
        else:
            out.append([f"A{i}", f"B{i}"])
    return out


async def _drive(
    spec: list[str], rng: random.Random
) -> tuple[RunState, BridgeData, dict[str, int]]:
    executed: dict[str, int] = {}
    client = _workflow_app(executed)
    keys = SigningKeys(KEY)
    result = bridge_start(run_id="run-p", app_id="shop", workflow_id="gen", input=spec, now=T0)
    state, data, now = result.state, result.data, T0
    timers: dict[str, datetime] = {}
    inbox: list[RunInput] = []
    commands = list(result.commands)
    for _ in range(400):
        for command in commands:
            if isinstance(command, DispatchTask):
                body = encode(msgspec.convert(command.payload["request"], ExecuteRequest))
                headers = {SIGNATURE_HEADER: keys.request_header(body, now=int(time.time()))}
                answer = await client.handle("POST", headers, body)
                assert answer.status == 200, answer.body
                ops = decode(answer.body, ExecuteResponse).opcodes
                item = AttemptResult(
                    step_ref=command.step_ref,
                    attempt=command.attempt,
                    ok=True,
                    output={"opcodes": msgspec.to_builtins(ops)},
                )
                inbox.append(item)
                if rng.random() < 0.3:
                    inbox.append(item)  # a redelivery
            elif isinstance(command, SetTimer):
                timers[command.timer_id] = command.fire_at
            elif isinstance(command, RegisterWait):
                index = int(command.name.removeprefix("go"))
                inbox.append(
                    SignalReceived(signal_id=f"sig{index}", name=command.name, payload=index)
                )
        if state.status.terminal:
            return state, data, executed
        if not inbox:
            assert timers, "stuck: nothing in flight"
            timer_id = min(timers, key=lambda t: timers[t])
            now = max(now, timers.pop(timer_id))
            inbox.append(TimerFired(timer_id=timer_id))
            if rng.random() < 0.3:
                inbox.append(TimerFired(timer_id=timer_id))  # fired twice
        rng.shuffle(inbox)
        take = rng.randint(1, len(inbox))
        batch, inbox = inbox[:take], inbox[take:]
        result = bridge_tick(state, data, batch, now)
        state, data, commands = result.state, result.data, list(result.commands)
        for command in commands:
            if hasattr(command, "timer_id") and not isinstance(command, SetTimer):
                timers.pop(command.timer_id, None)
    raise AssertionError("the run did not end in 400 ticks")


@settings(max_examples=25, deadline=None)
@given(spec=st.lists(st.sampled_from(KINDS), max_size=6), seed=st.integers(0, 2**16))
def test_any_workflow_completes_once_whatever_the_delivery_order(
    spec: list[str], seed: int
) -> None:
    state, data, executed = asyncio.run(_drive(spec, random.Random(seed)))
    assert state.status == RunStatus.SUCCEEDED, state.error
    assert state.output == _expected(spec)
    assert all(count == 1 for count in executed.values()), executed
    assert len({r.id for r in data.history}) == len(data.history)


def test_the_workflow_timeout_fails_a_run_still_going() -> None:
    first = _start(timeout="1m")
    timers = {c.timer_id: c.fire_at for c in _of(first.commands, SetTimer)}
    assert timers == {"run-timeout": T0 + timedelta(minutes=1)}
    result = bridge_tick(
        first.state, first.data, [TimerFired(timer_id="run-timeout")], T0 + timedelta(minutes=1)
    )
    assert result.state.status == RunStatus.FAILED
    assert result.state.error is not None
    assert result.state.error.code == "run.timeout"
    assert CancelChildRuns() in result.commands
    assert _dispatches(result) == []


def test_a_cancellable_run_calls_the_app_before_it_ends() -> None:
    first = _start(cancellable=True)
    [execute] = _dispatches(first)
    result = bridge_tick(first.state, first.data, [CancelRequested(reason="stop")], T0)
    assert result.state.status == RunStatus.RUNNING
    assert result.state.cancel_requested
    [cancel] = _dispatches(result)
    assert cancel.step_ref == "cancel"
    assert cancel.payload["cancel"]["reason"] == "stop"
    # Whatever else arrives meanwhile is ignored; the cancel call's end ends the run.
    late = _answer(execute, StepRunOp(id="a" * 32, name="x", result=1))
    done = AttemptResult(
        step_ref="cancel", attempt=cancel.attempt, ok=True, output={"handled": True}
    )
    result = bridge_tick(result.state, result.data, [late, done], T0)
    assert result.state.status == RunStatus.CANCELLED
    assert result.state.error is not None
    assert result.state.error.details == {"handled": True}
    assert result.data.history == []


def test_answers_without_progress_back_off_and_end_the_run() -> None:
    result = _start()
    for _ in range(MAX_TRANSPORT_FAILURES):
        [task] = _dispatches(result)
        result = bridge_tick(result.state, result.data, [_answer(task)], T0)  # no opcode at all
        if result.state.status.terminal:
            break
        [timer] = _of(result.commands, SetTimer)
        result = bridge_tick(
            result.state, result.data, [TimerFired(timer_id=timer.timer_id)], timer.fire_at
        )
    assert result.state.status == RunStatus.FAILED
    assert result.state.error is not None
    assert result.state.error.code == "bridge.no_progress"
