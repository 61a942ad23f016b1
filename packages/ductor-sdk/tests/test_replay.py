"""Memoized replay: every primitive, exactly-once bodies, parallel planning, errors,
and detection of code that changed under a running run."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from ductor import (
    Client,
    Context,
    DuctorError,
    Event,
    NonRetriableError,
    RetryAfterError,
    Signal,
    StepFailed,
)
from ductor.protocol import (
    SIGNATURE_HEADER,
    ErrorInfo,
    ExecuteRequest,
    ExecuteResponse,
    InvokeOp,
    OpcodeName,
    RunCompleteOp,
    RunErrorOp,
    RunFailedOp,
    SigningKeys,
    SleepOp,
    StepErrorOp,
    StepFailedOp,
    StepKeys,
    StepPlannedOp,
    StepRecord,
    StepRunOp,
    WaitForEventOp,
    WaitForSignalOp,
    decode,
    encode,
    step_id,
)
from ductor.testing import ChildFailed, LocalEngine, direct


class Order(msgspec.Struct, frozen=True):
    id: int
    total: int


def make_client() -> Client:
    return Client("shop", signing_key="signkey-test-0001")


def sid(name: str, n: int = 0) -> str:
    return step_id(name if n == 0 else f"{name}:{n}")


async def test_every_primitive_end_to_end_with_memoized_bodies() -> None:
    client = make_client()
    calls: Counter[str] = Counter()

    async def charge(order: dict[str, Any]) -> dict[str, Any]:
        calls["charge"] += 1
        return {"charged": order["total"]}

    def tax(total: int) -> int:  # a plain function works too
        calls["tax"] += 1
        return total // 10

    @client.workflow("charge-order", trigger="order.created", retries=2)
    async def charge_order(ctx: Context, order: dict[str, Any]) -> dict[str, Any]:
        charged = await ctx.step.run("charge", charge, order)
        taxed = await ctx.step.run("tax", tax, order["total"])
        await ctx.step.sleep("cool-off", "10m")
        await ctx.step.sleep_until("midnight", datetime(2030, 1, 1, tzinfo=UTC))
        shipped = await ctx.step.wait_for_event(
            "shipped", event="order.shipped", match="event.data.id == input.id", timeout="7d"
        )
        approval = await ctx.step.wait_for_signal("approve", timeout="1d")
        refund = await ctx.step.wait_for_event("refund", event="order.refunded", timeout="1h")
        receipt = await ctx.step.invoke("receipt", workflow="send-receipt", input=charged)
        return {
            "charged": charged,
            "tax": taxed,
            "shipped": None if shipped is None else shipped.data,
            "approval": None if approval is None else approval.data,
            "refund": refund,
            "receipt": receipt,
        }

    invoked: list[InvokeOp] = []

    async def invoke(op: InvokeOp) -> Any:
        invoked.append(op)
        return {"receipt_for": op.input}

    engine = LocalEngine(
        direct(client),
        events={"order.shipped": Event(name="order.shipped", data={"id": 7})},
        signals={"approve": Signal(name="approve", data="yes")},
        invoke=invoke,
    )
    outcome = await engine.run("charge-order", {"id": 7, "total": 500})

    assert outcome.status == "RUN_STATUS_SUCCEEDED"
    assert outcome.output == {
        "charged": {"charged": 500},
        "tax": 50,
        "shipped": {"id": 7},
        "approval": "yes",
        "refund": None,
        "receipt": {"receipt_for": {"charged": 500}},
    }
    # each body ran exactly once although the function was replayed 9 times
    assert calls == {"charge": 1, "tax": 1}
    assert len(engine.requests) == 9
    kinds = [type(r.opcodes[0]) for r in outcome.responses]
    assert kinds == [
        StepRunOp,
        StepRunOp,
        SleepOp,
        SleepOp,
        WaitForEventOp,
        WaitForSignalOp,
        WaitForEventOp,
        InvokeOp,
        RunCompleteOp,
    ]
    sleep, until = outcome.responses[2].opcodes[0], outcome.responses[3].opcodes[0]
    assert isinstance(sleep, SleepOp)
    assert (sleep.duration, sleep.until) == ("10m", None)
    assert isinstance(until, SleepOp)
    assert until.until == "2030-01-01T00:00:00Z"
    wait = outcome.responses[4].opcodes[0]
    assert isinstance(wait, WaitForEventOp)
    assert (wait.event, wait.match, wait.timeout) == (
        "order.shipped",
        "event.data.id == input.id",
        "7d",
    )
    assert [(op.workflow, op.app_id, op.version) for op in invoked] == [
        ("send-receipt", None, None)
    ]
    assert [r.id for r in outcome.history] == [
        sid(n)
        for n in (
            "charge",
            "tax",
            "cool-off",
            "midnight",
            "shipped",
            "approve",
            "refund",
            "receipt",
        )
    ]


async def test_repeated_step_names_are_numbered_and_each_runs_once() -> None:
    client = make_client()
    seen: list[int] = []

    async def record(i: int) -> int:
        seen.append(i)
        return i * i

    @client.workflow("loop")
    async def loop(ctx: Context, n: int) -> list[int]:
        return [await ctx.step.run("square", record, i) for i in range(n)]

    outcome = await LocalEngine(direct(client)).run("loop", 4)
    assert outcome.output == [0, 1, 4, 9]
    assert seen == [0, 1, 2, 3]
    assert [r.id for r in outcome.history] == [sid("square", i) for i in range(4)]


def test_step_keys_never_collide_with_names_that_look_like_repeats() -> None:
    keys = StepKeys()
    assert [keys.key(n) for n in ["a", "a:1", "a", "a", "a:1"]] == [
        "a",
        "a:1",
        "a:2",
        "a:3",
        "a:1:1",
    ]


async def test_gather_reports_planned_steps_and_runs_each_once_by_target() -> None:
    client = make_client()
    calls: Counter[str] = Counter()

    async def work(name: str) -> str:
        calls[name] += 1
        await asyncio.sleep(0)
        return name.upper()

    @client.workflow("fan-out")
    async def fan_out(ctx: Context, _: None) -> list[str]:
        first = await ctx.step.run("first", work, "first")
        parts = await asyncio.gather(*(ctx.step.run(f"part-{i}", work, f"p{i}") for i in range(3)))
        return [first, *parts]

    engine = LocalEngine(direct(client), reverse_parallel=True)
    outcome = await engine.run("fan-out", None)
    assert outcome.output == ["FIRST", "P0", "P1", "P2"]
    assert calls == {"first": 1, "p0": 1, "p1": 1, "p2": 1}
    planned = outcome.responses[1].opcodes
    assert [type(op) for op in planned] == [StepPlannedOp] * 3
    assert [op.name for op in planned if isinstance(op, StepPlannedOp)] == [
        "part-0",
        "part-1",
        "part-2",
    ]
    targets = [r.target_step for r in engine.requests if r.target_step]
    assert targets == [sid(f"part-{i}") for i in range(3)]


async def test_gather_of_a_step_and_a_sleep_plans_the_step_and_reports_the_sleep() -> None:
    client = make_client()

    @client.workflow("mixed")
    async def mixed(ctx: Context, _: None) -> str:
        value, _nap = await asyncio.gather(
            ctx.step.run("work", lambda: "done"), ctx.step.sleep("nap", timedelta(seconds=90))
        )
        return value

    engine = LocalEngine(direct(client))
    outcome = await engine.run("mixed", None)
    assert outcome.output == "done"
    first = outcome.responses[0].opcodes
    assert [type(op) for op in first] == [StepPlannedOp, SleepOp]
    assert isinstance(first[1], SleepOp)
    assert first[1].duration == "1m30s"


async def test_target_step_that_was_not_found_is_a_clear_protocol_error() -> None:
    client = make_client()

    @client.workflow("one")
    async def one(ctx: Context, _: None) -> int:
        return await ctx.step.run("a", lambda: 1)

    from ductor.errors import ProtocolError

    request = ExecuteRequest(run_id="r", workflow_id="one", target_step=sid("zzz"))
    with pytest.raises(ProtocolError, match="target step") as info:
        await client.execute(request)
    assert info.value.code == "step.target_not_found"


async def test_step_errors_are_retried_up_to_retries_then_fail_and_can_be_caught() -> None:
    client = make_client()
    tries: Counter[str] = Counter()

    async def flaky() -> str:
        tries["flaky"] += 1
        raise ValueError(f"boom {tries['flaky']}")

    @client.workflow("retrying", retries=2)
    async def retrying(ctx: Context, _: None) -> dict[str, Any]:
        try:
            await ctx.step.run("flaky", flaky)
        except StepFailed as failed:
            return {"caught": failed.step, "code": failed.code, "message": failed.error_message}
        return {"caught": None}

    outcome = await LocalEngine(direct(client)).run("retrying", None)
    assert tries["flaky"] == 3  # first try + 2 retries
    ops = [r.opcodes[0] for r in outcome.responses]
    assert [type(op) for op in ops] == [StepErrorOp, StepErrorOp, StepFailedOp, RunCompleteOp]
    assert outcome.output == {"caught": "flaky", "code": "step.error", "message": "boom 3"}
    error_op = ops[0]
    assert isinstance(error_op, StepErrorOp)
    assert error_op.error == ErrorInfo(
        code="step.error", message="boom 1", name="ValueError", retryable=True
    )


async def test_non_retriable_and_retry_after_errors() -> None:
    client = make_client()
    tries: Counter[str] = Counter()

    async def throttled() -> str:
        tries["throttled"] += 1
        if tries["throttled"] == 1:
            raise RetryAfterError("slow down", retry_after=timedelta(seconds=30))
        return "ok"

    async def fatal() -> None:
        tries["fatal"] += 1
        raise NonRetriableError("card declined", code="card.declined", details={"bin": "4242"})

    @client.workflow("errs", retries=5)
    async def errs(ctx: Context, _: None) -> str:
        await ctx.step.run("throttled", throttled)
        await ctx.step.run("fatal", fatal)
        return "unreachable"

    outcome = await LocalEngine(direct(client)).run("errs", None)
    first = outcome.responses[0].opcodes[0]
    assert isinstance(first, StepErrorOp)
    assert first.retry_after == "30s"
    assert first.error.code == "step.retry_after"
    assert tries == {"throttled": 2, "fatal": 1}
    assert outcome.status == "RUN_STATUS_FAILED"
    assert outcome.error is not None
    assert outcome.error.code == "card.declined"
    assert outcome.error.message == "step 'fatal' failed: card declined"
    failed_step = outcome.history[-1]
    assert failed_step.op is OpcodeName.STEP_FAILED
    assert failed_step.error is not None
    assert failed_step.error.details == {"bin": "4242"}


async def test_durations_the_server_cannot_keep_are_errors_of_the_step_or_body() -> None:
    """A retry_after that is not a timedelta fails the try that raised it (it was a
    TypeError out of the handler, a 500 that ran the step again); one past the
    longest duration is that longest; a sleep past it is refused, not sent as a
    duration the server reads as no sleep at all."""
    client = make_client()

    async def bad_delay() -> None:
        raise RetryAfterError("slow down", retry_after=30)  # type: ignore[arg-type]

    async def endless_delay() -> None:
        raise RetryAfterError("slow down", retry_after=timedelta(days=10**6))

    @client.workflow("bad-delay")
    async def bad(ctx: Context, _: None) -> None:
        await ctx.step.run("call", bad_delay)

    @client.workflow("endless-delay")
    async def endless(ctx: Context, _: None) -> None:
        await ctx.step.run("call", endless_delay)

    @client.workflow("long-nap", retries=0)
    async def long_nap(ctx: Context, _: None) -> None:
        await ctx.step.sleep("nap", timedelta(days=40_000))

    (retried,) = await _execute(client, "bad-delay", [])
    assert isinstance(retried, StepErrorOp)
    assert retried.retry_after is None
    assert (retried.error.name, retried.error.message) == (
        "TypeError",
        "retry_after must be a timedelta, got 30",
    )
    (later,) = await _execute(client, "endless-delay", [])
    assert isinstance(later, StepErrorOp)
    assert later.retry_after == "36500d"
    (refused,) = await _execute(client, "long-nap", [])
    assert isinstance(refused, RunFailedOp)
    assert refused.error.code == "duration.invalid"
    assert "36500d" in refused.error.message


async def test_a_step_called_inside_a_step_fails_that_step_instead_of_hanging() -> None:
    """The inner call waited for the outer step it ran in, so the execute never
    answered; it fails the outer step, non-retriable, naming both."""
    client = make_client()

    @client.workflow("nested")
    async def nested(ctx: Context, _: None) -> str:
        async def outer() -> int:
            return await ctx.step.run("inner", lambda: 1)

        try:
            await ctx.step.run("outer", outer)
        except StepFailed as failed:
            return failed.code
        return "ran"

    @client.workflow("child")
    async def child(ctx: Context, n: int) -> int:
        return await ctx.step.run("double", lambda: n * 2)

    @client.workflow("runs-a-child-in-a-step")
    async def runs_child(ctx: Context, _: None) -> Any:
        async def in_process() -> Any:  # another run, not a nested step
            return (await LocalEngine(direct(client)).run("child", 21)).output

        return await ctx.step.run("child", in_process)

    (failed,) = await asyncio.wait_for(_execute(client, "nested", []), timeout=10)
    assert isinstance(failed, StepFailedOp)
    assert failed.name == "outer"
    assert failed.error.code == "step.nested"
    assert "('inner') was called inside step 'outer'" in failed.error.message
    outcome = await LocalEngine(direct(client)).run("nested")
    assert outcome.output == "step.nested"
    assert (await LocalEngine(direct(client)).run("runs-a-child-in-a-step")).output == 42


async def test_a_cancelled_error_raised_by_user_code_is_an_error_of_its_step_or_body() -> None:
    """Awaiting a future cancelled elsewhere raises CancelledError in the step: it
    went out of the handler (no answer, and the engine ran the step again); only a
    cancellation of the request itself still stops the execute."""
    client = make_client()
    started = asyncio.Event()

    async def awaits_a_cancelled_future() -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.cancel()
        await future

    async def slow() -> None:
        started.set()
        await asyncio.sleep(60)

    @client.workflow("step-cancelled")
    async def step_cancelled(ctx: Context, _: None) -> None:
        await ctx.step.run("call", awaits_a_cancelled_future)

    @client.workflow("body-cancelled")
    async def body_cancelled(ctx: Context, _: None) -> None:
        raise asyncio.CancelledError

    @client.workflow("slow")
    async def slow_wf(ctx: Context, _: None) -> None:
        await ctx.step.run("slow", slow)

    (retried,) = await _execute(client, "step-cancelled", [])
    assert isinstance(retried, StepErrorOp)
    assert retried.error.name == "CancelledError"
    (body,) = await _execute(client, "body-cancelled", [])
    assert isinstance(body, RunErrorOp)
    assert body.error.message == "the workflow body raised CancelledError"
    request = asyncio.ensure_future(_execute(client, "slow", []))
    await started.wait()
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request


async def test_body_errors_become_run_error_then_run_failed() -> None:
    client = make_client()

    @client.workflow("bad-body", retries=1)
    async def bad_body(ctx: Context, _: None) -> None:
        raise KeyError("missing")

    outcome = await LocalEngine(direct(client)).run("bad-body", None)
    ops = [r.opcodes[0] for r in outcome.responses]
    assert [type(op) for op in ops] == [RunErrorOp, RunFailedOp]
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.name) == ("workflow.error", "KeyError")


async def test_control_flow_is_not_swallowed_by_except_exception() -> None:
    client = make_client()
    swallowed: list[BaseException] = []
    after: list[str] = []

    @client.workflow("greedy")
    async def greedy(ctx: Context, _: None) -> str:
        try:
            await ctx.step.sleep("nap", "1s")
        except Exception as exc:  # the user's catch-all must not see the SDK's interrupt
            swallowed.append(exc)
        after.append("after")
        return "done"

    response = await client.execute(ExecuteRequest(run_id="r", workflow_id="greedy"))
    assert [type(op) for op in response.opcodes] == [SleepOp]
    assert swallowed == []
    assert after == []


async def test_typed_input_is_converted_and_invalid_input_fails_the_run() -> None:
    client = make_client()

    @client.workflow("typed")
    async def typed(ctx: Context, order: Order) -> int:
        return order.total * 2

    good = await LocalEngine(direct(client)).run("typed", {"id": 1, "total": 21})
    assert good.output == 42
    bad = await LocalEngine(direct(client)).run("typed", {"id": "x"})
    assert bad.status == "RUN_STATUS_FAILED"
    assert bad.error is not None
    assert bad.error.code == "workflow.input_invalid"


async def test_failed_child_raises_step_failed_in_the_parent() -> None:
    client = make_client()

    @client.workflow("parent")
    async def parent(ctx: Context, _: None) -> str:
        try:
            await ctx.step.invoke(
                "child", workflow="child-wf", app_id="shop", input={"x": 1}, timeout="1h"
            )
        except StepFailed as failed:
            return f"child failed: {failed.code}"
        return "child ok"

    async def invoke(op: InvokeOp) -> Any:
        assert (op.workflow, op.app_id, op.input, op.timeout) == (
            "child-wf",
            "shop",
            {"x": 1},
            "1h",
        )
        raise ChildFailed(ErrorInfo(code="child.boom", message="nope"))

    outcome = await LocalEngine(direct(client), invoke=invoke).run("parent", None)
    assert outcome.output == "child failed: child.boom"


async def test_unserializable_step_result_fails_the_step() -> None:
    client = make_client()

    @client.workflow("odd")
    async def odd(ctx: Context, _: None) -> Any:
        return await ctx.step.run("obj", lambda: object())

    outcome = await LocalEngine(direct(client)).run("odd", None)
    assert outcome.status == "RUN_STATUS_FAILED"
    assert outcome.error is not None
    assert outcome.error.code == "step.result_invalid"


async def test_a_lone_surrogate_fails_the_step_or_run_and_an_error_holding_one_is_kept() -> None:
    """Text no JSON reader takes ("\\ud800") is not JSON: a step result or a workflow
    output holding it fails cleanly, and an error message holding it is recorded with
    U+FFFD in its place rather than breaking the answer."""
    client = make_client()
    tries = Counter[str]()

    @client.workflow("step-text")
    async def step_text(ctx: Context, _: None) -> Any:
        return await ctx.step.run("s", lambda: {"k": "a\ud800b"})

    @client.workflow("output-text")
    async def output_text(ctx: Context, _: None) -> Any:
        return ["\udfff"]

    @client.workflow("error-text", retries=1)
    async def error_text(ctx: Context, _: None) -> Any:
        def fails() -> None:
            tries["e"] += 1
            raise DuctorError("boom \ud800!", code="app.failed", details={"why": "\udc00"})

        return await ctx.step.run("e", fails)

    engine = LocalEngine(direct(client))
    failed = await engine.run("step-text", None)
    assert failed.status == "RUN_STATUS_FAILED"
    assert failed.error is not None
    assert failed.error.code == "step.result_invalid"
    output = await engine.run("output-text", None)
    assert output.status == "RUN_STATUS_FAILED"
    assert output.error is not None
    assert output.error.code == "workflow.output_invalid"
    errored = await engine.run("error-text", None)
    assert errored.status == "RUN_STATUS_FAILED"
    assert tries["e"] == 2  # recorded and retried like any error
    assert errored.error is not None
    assert "boom \ufffd!" in errored.error.message
    msgspec.json.encode(errored.error)  # all of it is JSON


# ---------------------------------------------------------------- changed code


def _record(name: str, op: OpcodeName, result: Any = None, n: int = 0) -> StepRecord:
    return StepRecord(id=sid(name, n), name=name, op=op, result=result)


async def _execute(client: Client, workflow: str, steps: list[StepRecord]) -> Any:
    response = await client.execute(ExecuteRequest(run_id="r", workflow_id=workflow, steps=steps))
    return response.opcodes


async def test_renamed_or_inserted_step_is_detected_naming_the_step() -> None:
    client = make_client()
    ran: list[str] = []

    @client.workflow("v2")
    async def v2(ctx: Context, _: None) -> str:
        await ctx.step.run("validate", lambda: ran.append("validate"))  # inserted in v2
        return await ctx.step.run("charge", lambda: "charged")

    ops = await _execute(client, "v2", [_record("charge", OpcodeName.STEP_RUN, "charged")])
    assert len(ops) == 1
    failed = ops[0]
    assert isinstance(failed, RunFailedOp)
    assert failed.error.code == "workflow.changed"
    assert "'validate'" in failed.error.message
    assert "'charge'" in failed.error.message
    assert failed.error.details == {"step": "validate"}
    assert ran == []  # nothing ran


async def test_removed_step_is_detected_at_completion() -> None:
    client = make_client()

    @client.workflow("shrunk")
    async def shrunk(ctx: Context, _: None) -> str:
        return await ctx.step.run("b", lambda: "b")

    history = [_record("a", OpcodeName.STEP_RUN, "a"), _record("b", OpcodeName.STEP_RUN, "b")]
    ops = await _execute(client, "shrunk", history)
    assert isinstance(ops[0], RunFailedOp)
    assert ops[0].error.code == "workflow.changed"
    assert "'a'" in ops[0].error.message


async def test_step_of_another_kind_is_detected() -> None:
    client = make_client()

    @client.workflow("kind")
    async def kind(ctx: Context, _: None) -> None:
        await ctx.step.run("pause", lambda: None)

    ops = await _execute(client, "kind", [_record("pause", OpcodeName.SLEEP)])
    assert isinstance(ops[0], RunFailedOp)
    assert ops[0].error.code == "workflow.changed"
    assert "SLEEP" in ops[0].error.message
    assert "step.run" in ops[0].error.message


async def test_reordered_sequential_steps_are_detected_but_parallel_order_is_free() -> None:
    client = make_client()

    @client.workflow("seq")
    async def seq(ctx: Context, _: None) -> list[str]:
        b = await ctx.step.run("b", lambda: "b")
        a = await ctx.step.run("a", lambda: "a")
        return [a, b]

    @client.workflow("par")
    async def par(ctx: Context, _: None) -> list[str]:
        return list(
            await asyncio.gather(ctx.step.run("b", lambda: "b"), ctx.step.run("a", lambda: "a"))
        )

    history = [_record("a", OpcodeName.STEP_RUN, "a"), _record("b", OpcodeName.STEP_RUN, "b")]
    ops = await _execute(client, "seq", history)
    assert isinstance(ops[0], RunFailedOp)
    assert ops[0].error.code == "workflow.changed"
    assert "reordered" in ops[0].error.message
    ops = await _execute(client, "par", history)
    assert ops == [RunCompleteOp(output=["b", "a"])]


async def test_change_is_reported_even_if_user_code_catches_everything() -> None:
    client = make_client()

    @client.workflow("stubborn")
    async def stubborn(ctx: Context, _: None) -> str:
        with contextlib.suppress(Exception):
            await ctx.step.sleep("pause", "1s")
        return "done"

    ops = await _execute(client, "stubborn", [_record("pause", OpcodeName.STEP_RUN, 1)])
    assert isinstance(ops[0], RunFailedOp)
    assert ops[0].error.code == "workflow.changed"


# ---------------------------------------------------------------- deeper parallelism


async def test_nested_gathers_and_task_groups_plan_every_branch() -> None:
    client = make_client()
    calls: Counter[str] = Counter()

    def body(label: str) -> str:
        calls[label] += 1
        return label

    async def branch(ctx: Context, tag: str) -> list[str]:
        first = await ctx.step.run(f"{tag}-1", body, f"{tag}-1")
        second = await ctx.step.run(f"{tag}-2", body, f"{tag}-2")
        return [first, second]

    async def both(ctx: Context) -> list[list[str]]:
        return list(await asyncio.gather(branch(ctx, "r1"), branch(ctx, "r2")))

    @client.workflow("nested")
    async def nested(ctx: Context, _: None) -> list[Any]:
        async with asyncio.TaskGroup() as group:
            left = group.create_task(branch(ctx, "left"))
            right = group.create_task(both(ctx))
        return [left.result(), right.result()]

    engine = LocalEngine(direct(client), reverse_parallel=True)
    outcome = await engine.run("nested", None)
    assert outcome.output == [["left-1", "left-2"], [["r1-1", "r1-2"], ["r2-1", "r2-2"]]]
    assert all(count == 1 for count in calls.values())
    assert len(calls) == 6
    first = outcome.responses[0].opcodes
    assert sorted(op.name for op in first if isinstance(op, StepPlannedOp)) == [
        "left-1",
        "r1-1",
        "r2-1",
    ]


async def test_cancel_handlers() -> None:
    client = make_client()
    seen: list[tuple[str, str | None, Any]] = []

    async def on_cancel(ctx: Any, order: Any) -> None:
        seen.append((ctx.run_id, ctx.reason, order))
        if order == "explode":
            raise RuntimeError("refund api down")

    @client.workflow("with-handler", on_cancel=on_cancel)
    async def with_handler(ctx: Context, _: Any) -> None:
        return None

    @client.workflow("without-handler")
    async def without_handler(ctx: Context, _: Any) -> None:
        return None

    from ductor.protocol import CancelRequest

    ok = await client.cancel(
        CancelRequest(run_id="r1", workflow_id="with-handler", input={"id": 1}, reason="user")
    )
    assert (ok.handled, ok.error) == (True, None)
    failed = await client.cancel(
        CancelRequest(run_id="r2", workflow_id="with-handler", input="explode")
    )
    assert failed.handled is True
    assert failed.error is not None
    assert (failed.error.code, failed.error.message) == ("cancel.error", "refund api down")
    none = await client.cancel(CancelRequest(run_id="r3", workflow_id="without-handler"))
    assert none.handled is False
    assert seen == [("r1", "user", {"id": 1}), ("r2", None, "explode")]


async def test_a_cancel_handler_error_is_answered_once_whatever_its_text() -> None:
    """A handler error whose text cannot be read is still the cancel's answer (200),
    not a 500 the engine would retry by calling the handler again."""
    client = make_client()
    calls: list[str] = []

    class Unreadable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    async def on_cancel(ctx: Any, order: Any) -> None:
        calls.append(ctx.run_id)
        if order == "unreadable":
            raise Unreadable()
        raise NonRetriableError("refund \ud800 refused", code="refund.refused", details={"n": 1})

    @client.workflow("with-handler", on_cancel=on_cancel)
    async def with_handler(ctx: Context, _: Any) -> None:
        return None

    from ductor.protocol import CancelRequest, CancelResponse

    keys = SigningKeys("signkey-test-0001")
    errors = []
    for run_id, order in (("r1", "unreadable"), ("r2", "coded")):
        body = encode(CancelRequest(run_id=run_id, workflow_id="with-handler", input=order))
        headers = {SIGNATURE_HEADER: keys.request_header(body, now=int(time.time()))}
        answer = await client.handle("POST", headers, body)
        assert answer.status == 200, answer.body
        response = decode(answer.body, CancelResponse)
        assert response.handled is True
        assert response.error is not None
        errors.append(response.error)
    assert calls == ["r1", "r2"]
    assert (errors[0].code, errors[0].name) == ("cancel.error", "Unreadable")
    assert "could not be read" in errors[0].message
    assert (errors[1].code, errors[1].message) == ("refund.refused", "refund \ufffd refused")
    assert errors[1].details == {"n": 1}


async def test_recorded_wait_results_are_typed_for_the_body() -> None:
    client = make_client()

    @client.workflow("waits")
    async def waits(ctx: Context, _: None) -> list[Any]:
        event = await ctx.step.wait_for_event("ev", event="x", timeout="1m")
        signal = await ctx.step.wait_for_signal("sig", signal="go", timeout="1m")
        return [type(event).__name__, event.data if event else None, type(signal).__name__]

    history = [
        _record("ev", OpcodeName.WAIT_FOR_EVENT, {"name": "x", "data": 5, "id": None, "ts": None}),
        _record("sig", OpcodeName.WAIT_FOR_SIGNAL, None),
    ]
    ops = await _execute(client, "waits", history)
    assert ops == [RunCompleteOp(output=["Event", 5, "NoneType"])]


async def test_a_slow_parallel_branch_is_not_mistaken_for_changed_code() -> None:
    client = make_client()

    async def slow_branch(ctx: Context) -> list[str]:
        await asyncio.sleep(0.05)  # a non-step await: discouraged, but not a change
        b = await ctx.step.run("b", lambda: "b")
        return [b, await ctx.step.run("c", lambda: "c")]

    @client.workflow("slow")
    async def slow(ctx: Context, _: None) -> list[Any]:
        return list(await asyncio.gather(ctx.step.run("a", lambda: "a"), slow_branch(ctx)))

    ops = await _execute(client, "slow", [_record("b", OpcodeName.STEP_RUN, "b")])
    assert ops == [
        StepPlannedOp(id=sid("a"), name="a"),
        StepPlannedOp(id=sid("c"), name="c"),
    ]


async def test_context_carries_the_run_and_the_trace() -> None:
    client = make_client()

    @client.workflow("ctx")
    async def ctx_wf(ctx: Context, _: None) -> list[Any]:
        return [ctx.run_id, ctx.workflow_id, ctx.attempt, ctx.traceparent]

    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    response = await client.execute(
        ExecuteRequest(run_id="run-7", workflow_id="ctx", attempt=2, traceparent=trace)
    )
    assert response.opcodes == [RunCompleteOp(output=["run-7", "ctx", 2, trace])]


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


async def test_a_value_nested_too_deep_for_json_fails_the_step_or_run_not_the_answer() -> None:
    """A result, output or error details nested deeper than the encoder goes has no
    JSON form: the step fails with step.result_invalid (the run with
    workflow.output_invalid), the error is recorded, and the answer is still a 200."""
    client = make_client()
    tries = Counter[str]()

    @client.workflow("deep-step")
    async def deep_step(ctx: Context, _: None) -> Any:
        def deep() -> list[Any]:
            tries["deep"] += 1
            return _nested(5000)

        return await ctx.step.run("s", deep)

    @client.workflow("deep-output")
    async def deep_output(ctx: Context, _: None) -> Any:
        return _nested(5000)

    @client.workflow("deep-details", retries=0)
    async def deep_details(ctx: Context, _: None) -> Any:
        def fails() -> None:
            raise NonRetriableError("boom", code="app.failed", details=_nested(5000))

        return await ctx.step.run("e", fails)

    engine = LocalEngine(direct(client))
    failed = await engine.run("deep-step", None)
    assert (failed.status, failed.error and failed.error.code) == (
        "RUN_STATUS_FAILED",
        "step.result_invalid",
    )
    assert tries["deep"] == 1  # not run again: the failure is recorded
    output = await engine.run("deep-output", None)
    assert (output.status, output.error and output.error.code) == (
        "RUN_STATUS_FAILED",
        "workflow.output_invalid",
    )
    errored = await engine.run("deep-details", None)
    assert (errored.status, errored.error and errored.error.code) == (
        "RUN_STATUS_FAILED",
        "app.failed",
    )
    assert isinstance(errored.error.details, str)  # its text, as for any value not JSON

    body = encode(ExecuteRequest(run_id="r", workflow_id="deep-output"))
    header = SigningKeys("signkey-test-0001").request_header(body, now=int(time.time()))
    answer = await client.handle("POST", {SIGNATURE_HEADER: header}, body)
    assert answer.status == 200, answer.body
    (op,) = decode(answer.body, ExecuteResponse).opcodes
    assert isinstance(op, RunFailedOp)
    assert op.error.code == "workflow.output_invalid"


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for this error")


async def test_an_error_whose_text_cannot_be_read_is_still_recorded() -> None:
    """An exception whose str() raises, or overflows on a deep value, fails the step
    (and the body) like any error, under a text naming its type, instead of making
    the whole answer a 500 that the engine retries by running the step again."""
    client = make_client()
    tries = Counter[str]()

    def raiser(exc: Exception) -> Any:
        def fail() -> None:
            tries[type(exc).__name__] += 1
            raise exc

        return fail

    @client.workflow("unprintable-step", retries=1)
    async def unprintable_step(ctx: Context, _: None) -> Any:
        return await ctx.step.run("s", raiser(_Unprintable()))

    @client.workflow("deep-message", retries=0)
    async def deep_message(ctx: Context, _: None) -> Any:
        return await ctx.step.run("s", raiser(ValueError(_nested(5000))))

    @client.workflow("unprintable-body", retries=0)
    async def unprintable_body(ctx: Context, _: None) -> Any:
        raise _Unprintable()

    engine = LocalEngine(direct(client))
    step = await engine.run("unprintable-step", None)
    assert step.status == "RUN_STATUS_FAILED"
    assert step.error is not None
    assert step.error.code == "step.error"  # the step's failure fails the run
    assert "_Unprintable (its message could not be read" in step.error.message
    assert tries["_Unprintable"] == 2  # retried, then recorded as failed
    deep = await engine.run("deep-message", None)
    assert deep.error is not None
    assert deep.error.code == "step.error"
    assert "ValueError (its message could not be read" in deep.error.message
    body = await engine.run("unprintable-body", None)
    assert body.error is not None
    assert (body.error.code, body.error.name) == ("workflow.error", "_Unprintable")
