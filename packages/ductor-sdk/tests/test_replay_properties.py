"""Property tests of replay over random workflows: same decisions on every replay,
memoized bodies never re-run, gathers plan, changed code is detected."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ductor import Client, Context, NonRetriableError, StepFailed
from ductor.protocol import (
    ExecuteRequest,
    OpcodeName,
    RunCompleteOp,
    RunErrorOp,
    RunFailedOp,
    StepErrorOp,
    StepFailedOp,
    StepPlannedOp,
    StepRunOp,
    encode,
)
from ductor.testing import LocalEngine, direct

RESULT_OPS = (StepRunOp, StepErrorOp, StepFailedOp, RunCompleteOp, RunFailedOp, RunErrorOp)
BODIES = ("run", "fail", "flaky")
STEP_OUTCOMES = (StepRunOp, StepErrorOp, StepFailedOp)
NAMES = st.sampled_from(["a", "b", "c", "a:1"])
Op = tuple[str, Any]

OPS = st.one_of(
    st.tuples(st.just("run"), NAMES),
    st.tuples(st.just("sleep"), NAMES),
    st.tuples(st.just("event"), NAMES),
    st.tuples(st.just("signal"), NAMES),
    st.tuples(st.just("gather"), st.lists(NAMES, min_size=1, max_size=3)),
    st.tuples(st.just("fail"), NAMES),
    st.tuples(st.just("flaky"), NAMES),
)
PROGRAMS = st.lists(OPS, min_size=0, max_size=7)


@dataclass
class Harness:
    client: Client
    calls: Counter[str]


def build(program: list[Op]) -> Harness:
    """A workflow that interprets `program`, counting each step body's runs."""
    client = Client("prop", signing_key="k")
    calls: Counter[str] = Counter()

    async def body(label: str) -> str:
        calls[label] += 1
        return label

    async def fail(label: str) -> str:
        calls[label] += 1
        raise NonRetriableError("no", code="prop.no")

    async def flaky(label: str, attempt: int) -> str:
        calls[label] += 1
        if attempt == 0:  # deterministic per request: the first try fails
            raise ConnectionError("first try fails")
        return label

    @client.workflow("prog", retries=1)
    async def prog(ctx: Context, _: None) -> list[Any]:
        out: list[Any] = []
        for index, (kind, arg) in enumerate(program):
            if kind == "run":
                out.append(await ctx.step.run(arg, body, f"{index}:{arg}"))
            elif kind == "sleep":
                await ctx.step.sleep(arg, "1s")
                out.append("slept")
            elif kind == "event":
                got = await ctx.step.wait_for_event(arg, event="e", timeout="1m")
                out.append(None if got is None else got.name)
            elif kind == "signal":
                sig = await ctx.step.wait_for_signal(arg, timeout="1m")
                out.append(None if sig is None else sig.data)
            elif kind == "fail":
                try:
                    await ctx.step.run(arg, fail, f"{index}:{arg}")
                except StepFailed as failed:
                    out.append(f"failed:{failed.code}")
            elif kind == "flaky":
                out.append(await ctx.step.run(arg, flaky, f"{index}:{arg}", ctx.attempt))
            else:
                parts = [ctx.step.run(n, body, f"{index}.{j}:{n}") for j, n in enumerate(arg)]
                out.append(list(await asyncio.gather(*parts)))
        return out

    return Harness(client, calls)


def expected_output(program: list[Op]) -> list[Any]:
    out: list[Any] = []
    for index, (kind, arg) in enumerate(program):
        if kind in ("run", "flaky"):
            out.append(f"{index}:{arg}")
        elif kind == "fail":
            out.append("failed:prop.no")
        elif kind == "sleep":
            out.append("slept")
        elif kind in ("event", "signal"):
            out.append(None)
        else:
            out.append([f"{index}.{j}:{n}" for j, n in enumerate(arg)])
    return out


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@settings(max_examples=100, deadline=None)
@given(program=PROGRAMS, reverse=st.booleans())
def test_random_workflows_complete_with_each_body_run_exactly_once(
    program: list[Op], reverse: bool
) -> None:
    harness = build(program)
    outcome = run(LocalEngine(direct(harness.client), reverse_parallel=reverse).run("prog"))
    assert outcome.status == "RUN_STATUS_SUCCEEDED", outcome.error
    assert outcome.output == expected_output(program)
    expected_calls = Counter(
        {f"{i}:{a}": 2 if k == "flaky" else 1 for i, (k, a) in enumerate(program) if k in BODIES}
    )
    for i, (k, a) in enumerate(program):
        if k == "gather":
            expected_calls.update(f"{i}.{j}:{n}" for j, n in enumerate(a))
    # each body ran once per successful attempt (a flaky one: one failure, one success)
    assert harness.calls == expected_calls
    for response in outcome.responses:
        ops = response.opcodes
        if len(ops) > 1:  # several steps found together: nothing was run
            assert not any(isinstance(op, RESULT_OPS) for op in ops)
    planned = [op for r in outcome.responses for op in r.opcodes if isinstance(op, StepPlannedOp)]
    gathered = sum(len(a) for k, a in program if k == "gather" and len(a) > 1)
    assert len(planned) == gathered


@settings(max_examples=100, deadline=None)
@given(program=PROGRAMS, reverse=st.booleans(), data=st.data())
def test_any_recorded_prefix_replays_to_the_same_decisions_without_rerunning(
    program: list[Op], reverse: bool, data: st.DataObject
) -> None:
    harness = build(program)
    engine = LocalEngine(direct(harness.client), reverse_parallel=reverse)
    outcome = run(engine.run("prog"))
    history = outcome.history
    # every request the engine made, replayed again, gives the same answer
    for request, response in zip(engine.requests, engine.responses, strict=True):
        before = Counter(harness.calls)
        again = run(harness.client.execute(request))
        assert encode(again) == encode(response)
        ran = harness.calls - before
        # only the one step the answer reports on ran, and nothing memoized
        reported = [op for op in again.opcodes if isinstance(op, STEP_OUTCOMES)]
        assert sum(ran.values()) == len(reported) <= 1
        executed = {op.result for op in reported if isinstance(op, StepRunOp)}
        assert not executed or set(ran) == executed
    # any prefix of the final history is a valid state: no false "code changed"
    k = data.draw(st.integers(min_value=0, max_value=len(history)), label="prefix")
    before = Counter(harness.calls)
    answer = run(
        harness.client.execute(ExecuteRequest(run_id="r", workflow_id="prog", steps=history[:k]))
    )
    assert not any(isinstance(op, RunFailedOp) for op in answer.opcodes), answer
    memoized = {r.result for r in history[:k] if r.op is OpcodeName.STEP_RUN}
    assert not (set(harness.calls - before) & memoized)
    failed = {r.name for r in history[:k] if r.op is OpcodeName.STEP_FAILED}
    assert all(
        r.error is not None and r.error.code == "prop.no"
        for r in history
        if r.name in failed and r.op is OpcodeName.STEP_FAILED
    )
    if k == len(history):
        assert answer.opcodes == [RunCompleteOp(output=expected_output(program))]


@settings(max_examples=100, deadline=None)
@given(program=PROGRAMS.filter(lambda p: any(k in BODIES for k, _ in p)), data=st.data())
def test_renaming_a_recorded_step_is_detected(program: list[Op], data: st.DataObject) -> None:
    harness = build(program)
    outcome = run(LocalEngine(direct(harness.client)).run("prog"))
    runs = [i for i, (k, _) in enumerate(program) if k in BODIES]
    target = data.draw(st.sampled_from(runs), label="renamed op")
    changed = list(program)
    changed[target] = ("run", "renamed")
    other = build(changed)
    answer = run(
        other.client.execute(ExecuteRequest(run_id="r", workflow_id="prog", steps=outcome.history))
    )
    assert len(answer.opcodes) == 1
    failed = answer.opcodes[0]
    assert isinstance(failed, RunFailedOp)
    assert failed.error.code == "workflow.changed"
    assert "'renamed'" in failed.error.message
    assert sum(other.calls.values()) == 0
