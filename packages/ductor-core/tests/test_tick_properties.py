"""Property tests of the tick: random DAGs driven by a simulated server loop.

The driver plays the coordinator: it persists state (msgspec round trip), turns
commands into future inputs (results, timer firings, events, child ends) and
delivers them in a hypothesis-chosen order, in batches, with duplicates and
with timers that were cancelled still firing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ductor_core import (
    AttemptResult,
    CancelRequested,
    CancelTimer,
    ChildRunEnded,
    ClearWait,
    DispatchTask,
    EdgeType,
    ErrorInfo,
    EventReceived,
    RegisterWait,
    RetryPolicy,
    RunFinished,
    RunInput,
    RunState,
    RunStatus,
    SetTimer,
    SignalReceived,
    StartChildRun,
    StepStatus,
    TickResult,
    TimerFired,
    WorkflowDefinition,
    default_engine,
    definition_from_obj,
    start_run,
    tick,
)
from ductor_core._retry import backoff_delay

NOW = datetime(2026, 3, 1, tzinfo=UTC)

# The CEL parser raises the recursion limit the first time it runs; do that
# before hypothesis starts watching (it warns about limits changed under it).
default_engine().evaluate("1 + 1", {})
MAX_TICKS = 400

# (ref, item_index, attempt) -> (ok, output, retryable)
Script = dict[tuple[str, int, int], tuple[bool, int, bool]]


@dataclass
class Scenario:
    definition: WorkflowDefinition
    script: Script
    children: dict[tuple[str, int], tuple[bool, int]]  # (ref, item) -> (succeeded, output)
    signals: list[SignalReceived]

    def __repr__(self) -> str:  # readable falsifying examples
        return msgspec.json.encode(self.definition).decode() + f" script={self.script}"


_OUT = st.integers(0, 1)
_MOSTLY = st.sampled_from([True, True, True, False])  # mostly success, so runs get far


@st.composite
def scenarios(draw: st.DrawFn, *, timeouts: bool = False) -> Scenario:
    """A random DAG with a scripted outcome for every attempt and child run.

    With `timeouts`, worker steps, waits and children get timeouts too; then a
    run's end depends on whether a result or its timer comes first, so only
    the invariants can be checked, not sameness across orders.
    """
    count = draw(st.integers(1, 9))
    scatters: list[str] = []
    extra_edges: list[dict[str, Any]] = []
    timeout: dict[str, Any] = {"timeout": "30s"} if timeouts else {}
    steps: list[dict[str, Any]] = []
    script: Script = {}
    children: dict[tuple[str, int], tuple[bool, int]] = {}
    signals: list[SignalReceived] = []

    def attempts(ref: str, index: int, max_attempts: int) -> None:
        for attempt in range(1, max_attempts + 1):
            script[(ref, index, attempt)] = (
                draw(_MOSTLY),
                draw(_OUT),
                draw(_MOSTLY),
            )

    for i in range(count):
        ref = f"s{i}"
        kinds = ["action", "dataflow", "wait", "signal", "event", "sub", "scatter", "fan_wf"]
        kind = draw(st.sampled_from(kinds + (["gather"] if scatters else [])))
        if kind == "action":
            max_attempts = draw(st.integers(1, 3))
            steps.append(
                {
                    "ref": ref,
                    "type": "STEP_TYPE_ACTION",
                    "args": {"action": "do", "params": {"i": "input.i"}},
                    "retry": {"max_attempts": max_attempts, "initial_interval": "1s"},
                    **timeout,
                }
            )
            attempts(ref, -1, max_attempts)
        elif kind == "dataflow":
            expr = draw(st.sampled_from(["1", "0", "input.i", "input.i - 1", "1 / 0"]))
            steps.append(
                {
                    "ref": ref,
                    "type": "STEP_TYPE_DATAFLOW",
                    "args": {"operation": "project", "project": {"v": expr}},
                }
            )
        elif kind == "wait":
            steps.append({"ref": ref, "type": "STEP_TYPE_WAIT", "args": {"duration": "5s"}})
        elif kind == "signal":
            steps.append(
                {
                    "ref": ref,
                    "type": "STEP_TYPE_WAIT_FOR_SIGNAL",
                    "args": {"signal": f"go-{ref}"},
                    **timeout,
                }
            )
            signals.append(SignalReceived(signal_id=f"sig-{ref}", name=f"go-{ref}", payload=i))
        elif kind == "event":
            steps.append(
                {
                    "ref": ref,
                    "type": "STEP_TYPE_WAIT_FOR_EVENT",
                    "args": {"event": f"ev-{ref}", "match": "event.data.k == 1"},
                    **timeout,
                }
            )
        elif kind == "sub":
            steps.append(
                {
                    "ref": ref,
                    "type": "STEP_TYPE_SUBWORKFLOW",
                    "args": {"family_slug": "kid"},
                    **timeout,
                }
            )
            children[(ref, -1)] = (draw(_MOSTLY), draw(_OUT))
        elif kind == "fan_wf":
            size = draw(st.integers(0, 3))
            steps.append(
                {
                    "ref": ref,
                    "type": "STEP_TYPE_SCATTER",
                    "args": {
                        "items": str(list(range(size))),
                        "workflow": {"family_slug": "kid"},
                        "max_concurrency": draw(st.integers(1, 2)),
                        "tolerate_failures": draw(st.booleans()),
                    },
                }
            )
            for index in range(size):
                children[(ref, index)] = (draw(_MOSTLY), draw(_OUT))
            scatters.append(ref)
        elif kind == "gather":
            source = draw(st.sampled_from(scatters))
            steps.append({"ref": ref, "type": "STEP_TYPE_GATHER", "args": {"scatter": source}})
            # a gather reads its scatter's items, so it must come after it
            extra_edges.append(
                {"source_ref": source, "target_ref": ref, "type": "EDGE_TYPE_ALWAYS"}
            )
        else:
            size = draw(st.integers(0, 3))
            max_attempts = draw(st.integers(1, 2))
            steps.append(
                {
                    "ref": ref,
                    "type": "STEP_TYPE_SCATTER",
                    "args": {
                        "items": str(list(range(size))),
                        "max_concurrency": draw(st.integers(1, 2)),
                        "tolerate_failures": draw(st.booleans()),
                        "step": {
                            "type": "STEP_TYPE_ACTION",
                            "args": {"action": "each", "params": {"x": "item"}},
                            "retry": {"max_attempts": max_attempts, "initial_interval": "1s"},
                            **timeout,
                        },
                    },
                }
            )
            for index in range(size):
                attempts(ref, index, max_attempts)
            scatters.append(ref)
    edges: list[dict[str, Any]] = list(extra_edges)
    for j in range(1, count):
        for source in draw(st.lists(st.integers(0, j - 1), unique=True, max_size=3)):
            edge_type = draw(st.sampled_from(["SUCCESS", "SUCCESS", "FAILURE", "ALWAYS", "COND"]))
            edge: dict[str, Any] = {"source_ref": f"s{source}", "target_ref": f"s{j}"}
            if edge_type == "COND":
                edge["type"] = "EDGE_TYPE_CONDITION"
                edge["condition"] = draw(st.sampled_from(["output == 1", "output != 1"]))
            else:
                edge["type"] = f"EDGE_TYPE_{edge_type}"
            edges.append(edge)
    definition = definition_from_obj({"family_slug": "prop", "steps": steps, "edges": edges})
    return Scenario(definition=definition, script=script, children=children, signals=signals)


@dataclass
class Chooser:
    """Which pending input goes next, in what batch, and whether to deliver it twice."""

    pick: Callable[[int], int]
    batch: Callable[[], int]
    replay: Callable[[], bool]  # deliver again something delivered before
    cancel: Callable[[], bool] = lambda: False  # ask to cancel the run now


FIFO = Chooser(pick=lambda n: 0, batch=lambda: 1, replay=lambda: False)


def hypothesis_chooser(data: st.DataObject, *, cancels: bool = False) -> Chooser:
    return Chooser(
        pick=lambda n: data.draw(st.integers(0, n - 1), label="pick"),
        batch=lambda: data.draw(st.integers(1, 3), label="batch"),
        replay=lambda: data.draw(st.sampled_from([False, False, True]), label="replay"),
        cancel=(lambda: data.draw(st.integers(0, 9), label="cancel") == 0)
        if cancels
        else (lambda: False),
    )


class ServerMirror:
    """What the server keeps from the commands: live timers, registered waits,
    started children. After every tick it must agree with the run state."""

    def __init__(self) -> None:
        self.timers: dict[str, datetime] = {}
        self.waits: set[str] = set()
        self.children: set[str] = set()
        self.just_fired: set[str] = set()

    def apply(self, command: object) -> None:
        if isinstance(command, SetTimer):
            self.timers[command.timer_id] = command.fire_at
        elif isinstance(command, CancelTimer):
            # a timer whose firing is in this very batch may be cancelled when an
            # earlier input of the batch ended the run; for the server that is a no-op
            known = command.timer_id in self.timers or command.timer_id in self.just_fired
            assert known, f"cancel of unknown timer {command}"
            self.timers.pop(command.timer_id, None)
        elif isinstance(command, RegisterWait):
            assert command.step_ref not in self.waits
            self.waits.add(command.step_ref)
        elif isinstance(command, ClearWait):
            assert command.step_ref in self.waits, f"clear of unknown wait {command}"
            self.waits.discard(command.step_ref)
        elif isinstance(command, StartChildRun):
            assert command.child_key not in self.children, "child started twice"
            self.children.add(command.child_key)

    def fired(self, batch: list[RunInput]) -> None:
        self.just_fired = {i.timer_id for i in batch if isinstance(i, TimerFired)}
        for timer_id in self.just_fired:
            self.timers.pop(timer_id, None)

    def check(self, definition: WorkflowDefinition, state: RunState) -> None:
        assert state.timers == self.timers
        waiting = {
            ref
            for ref, step in state.steps.items()
            if step.status is StepStatus.WAITING
            and step.waiting_for is not None
            and step.waiting_for.startswith(("event ", "signal "))
        }
        assert waiting == self.waits


@dataclass
class Trace:
    final: RunState
    dispatched: list[str] = field(default_factory=list)
    finished: list[RunFinished] = field(default_factory=list)
    ticks: int = 0


def drive(scenario: Scenario, chooser: Chooser) -> Trace:
    definition = scenario.definition
    pool: list[RunInput] = list(scenario.signals)
    history: list[RunInput] = []
    trace = Trace(final=RunState(run_id="-", status=RunStatus.PENDING, created_at=NOW))
    mirror = ServerMirror()

    def absorb(result: TickResult) -> None:
        for command in result.commands:
            mirror.apply(command)
            if isinstance(command, DispatchTask):
                trace.dispatched.append(command.idempotency_key)
                ok, output, retryable = scenario.script[
                    (command.step_ref, command.item_index, command.attempt)
                ]
                pool.append(
                    AttemptResult(
                        step_ref=command.step_ref,
                        item_index=command.item_index,
                        attempt=command.attempt,
                        ok=ok,
                        output=output if ok else None,
                        error=None
                        if ok
                        else ErrorInfo(code="x.failed", message="no", retryable=retryable),
                    )
                )
            elif isinstance(command, SetTimer):
                pool.append(TimerFired(timer_id=command.timer_id))
            elif isinstance(command, RegisterWait) and command.kind == "event":
                for n, k in ((0, 0), (1, 1)):
                    pool.append(
                        EventReceived(
                            event_id=f"{command.step_ref}-{n}", name=command.name, data={"k": k}
                        )
                    )
            elif isinstance(command, StartChildRun):
                succeeded, output = scenario.children[(command.step_ref, command.item_index)]
                pool.append(
                    ChildRunEnded(
                        step_ref=command.step_ref,
                        item_index=command.item_index,
                        child_run_id=f"child-{command.child_key}",
                        status=RunStatus.SUCCEEDED if succeeded else RunStatus.FAILED,
                        output=output if succeeded else None,
                    )
                )
            elif isinstance(command, RunFinished):
                trace.finished.append(command)
            # CancelTimer is deliberately not honoured: stale firings must be ignored.

    result = start_run(definition, run_id="run", input={"i": 1}, now=NOW)
    absorb(result)
    state = result.state
    mirror.check(definition, state)
    while not state.status.terminal:
        assert pool, f"run is stuck: {state}"
        trace.ticks += 1
        assert trace.ticks <= MAX_TICKS, "run does not terminate"
        batch: list[RunInput] = []
        if chooser.cancel():
            batch.append(CancelRequested(reason="test"))
        for _ in range(chooser.batch()):
            if not pool:
                break
            if history and chooser.replay():
                batch.append(history[chooser.pick(len(history))])
                continue
            item = pool.pop(chooser.pick(len(pool)))
            history.append(item)
            batch.append(item)
        # persisted and reloaded between ticks, as the coordinator does
        state = msgspec.json.decode(msgspec.json.encode(state), type=RunState)
        result = tick(definition, state, batch, NOW)
        mirror.fired(batch)
        absorb(result)
        state = result.state
        mirror.check(definition, state)
        assert len(result.ignored) <= len(batch)
    # anything still undelivered arrives after the end and must be ignored
    if pool:
        after = tick(definition, state, pool, NOW)
        assert after.commands == []
        assert len(after.ignored) == len(pool)
        assert after.state == state
    trace.final = state
    assert mirror.timers == {}, "a terminal run left timers behind"
    assert mirror.waits == set(), "a terminal run left waits registered"
    return trace


def outcome(definition: WorkflowDefinition, state: RunState) -> Any:
    """What must not depend on delivery order. A failed run cancels whatever was
    still in flight (fail fast), so only its status is order-free."""
    if state.status is RunStatus.FAILED:
        return state.status
    return (
        state.status,
        state.output,
        {
            ref: (
                s.status,
                s.output,
                s.attempt,
                None if s.error is None else s.error.code,
                None if s.items is None else [(i.status, i.output, i.attempt) for i in s.items],
            )
            for ref, s in state.steps.items()
        },
    )


def unhandled_failures(definition: WorkflowDefinition, state: RunState) -> list[str]:
    handled = {
        e.source_ref
        for e in definition.edges
        if e.type in (EdgeType.FAILURE.value, EdgeType.ALWAYS.value)
    }
    return [
        ref
        for ref, s in state.steps.items()
        if s.status is StepStatus.FAILED and ref not in handled
    ]


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(scenario=scenarios(), data=st.data())
def test_any_delivery_order_reaches_the_same_end(scenario: Scenario, data: st.DataObject) -> None:
    reference = drive(scenario, FIFO)
    shuffled = drive(scenario, hypothesis_chooser(data))
    definition = scenario.definition
    event(f"run {reference.final.status.value}")
    event(f"ticks {min(shuffled.ticks // 10 * 10, 50)}+")
    for trace in (reference, shuffled):
        # terminated, announced exactly once
        assert trace.final.status.terminal
        assert len(trace.finished) == 1
        assert trace.finished[0].status is trace.final.status
        # no step dispatched twice for the same attempt
        assert len(trace.dispatched) == len(set(trace.dispatched))
        # never both succeeded and left a failure unhandled
        unhandled = unhandled_failures(definition, trace.final)
        if trace.final.status is RunStatus.SUCCEEDED:
            assert unhandled == []
            assert all(s.status.terminal for s in trace.final.steps.values())
            assert trace.final.timers == {}
        else:
            assert trace.final.status is RunStatus.FAILED
            # steps that failed in the same instant may both be unhandled
            assert unhandled
            assert trace.final.error is not None
            assert trace.final.error.details["step_ref"] in unhandled
        assert not any(s.status is StepStatus.PENDING for s in trace.final.steps.values())
    assert outcome(definition, shuffled.final) == outcome(definition, reference.final)
    if reference.final.status is RunStatus.SUCCEEDED:
        assert sorted(shuffled.dispatched) == sorted(reference.dispatched)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios(), data=st.data())
def test_tick_is_deterministic_and_does_not_touch_its_input(
    scenario: Scenario, data: st.DataObject
) -> None:
    definition = scenario.definition
    first = start_run(definition, run_id="run", input={"i": 1}, now=NOW)
    assert first == start_run(definition, run_id="run", input={"i": 1}, now=NOW)
    inputs: list[RunInput] = []
    for command in first.commands:
        if isinstance(command, DispatchTask):
            ok, output, retryable = scenario.script[
                (command.step_ref, command.item_index, command.attempt)
            ]
            inputs.append(
                AttemptResult(
                    step_ref=command.step_ref,
                    item_index=command.item_index,
                    attempt=command.attempt,
                    ok=ok,
                    output=output,
                    error=None if ok else ErrorInfo(code="e", message="m", retryable=retryable),
                )
            )
        elif isinstance(command, SetTimer):
            inputs.append(TimerFired(timer_id=command.timer_id))
    inputs.extend(scenario.signals)
    inputs = data.draw(st.permutations(inputs))
    before = msgspec.json.encode(first.state)
    one = tick(definition, first.state, inputs, NOW)
    assert msgspec.json.encode(first.state) == before
    assert one == tick(definition, first.state, inputs, NOW)
    assert len(one.ignored) <= len(inputs)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios(), data=st.data())
def test_cancel_at_any_moment_leaves_nothing_behind(
    scenario: Scenario, data: st.DataObject
) -> None:
    trace = drive(scenario, hypothesis_chooser(data, cancels=True))
    final = trace.final
    event(f"run {final.status.value}")
    assert len(trace.finished) == 1
    assert all(step.status.terminal for step in final.steps.values())
    assert final.timers == {}
    if final.status is RunStatus.CANCELLED:
        assert final.cancel_requested
        assert final.error is not None
        assert final.error.code == "run.cancelled"
        assert not any(s.status is StepStatus.RUNNING for s in final.steps.values())


@settings(max_examples=200, deadline=None)
@given(
    initial_ms=st.integers(1, 120_000),
    coefficient=st.floats(1.0, 10.0),
    cap_s=st.integers(1, 3600),
    attempt=st.integers(1, 60),
    run_id=st.text(min_size=1, max_size=8),
    index=st.integers(-1, 5),
)
def test_backoff_is_bounded_capped_and_deterministic(
    initial_ms: int, coefficient: float, cap_s: int, attempt: int, run_id: str, index: int
) -> None:
    policy = RetryPolicy(
        max_attempts=100,
        initial_interval=f"{initial_ms}ms",
        backoff_coefficient=coefficient,
        max_interval=f"{cap_s}s",
    )
    error = ErrorInfo(code="x", message="m")

    def delay() -> float:
        return backoff_delay(
            policy, error, run_id=run_id, step_ref="s", item_index=index, attempt=attempt
        ).total_seconds()

    base = min(initial_ms / 1000 * coefficient ** (attempt - 1), float(cap_s))
    got = delay()
    assert base * 0.9 - 1e-6 <= got <= base * 1.1 + 1e-6
    assert got == delay()
    later = ErrorInfo(code="x", message="m", retry_after_seconds=attempt / 2)
    assert backoff_delay(
        policy, later, run_id=run_id, step_ref="s", item_index=index, attempt=attempt
    ).total_seconds() == pytest.approx(attempt / 2)


@settings(max_examples=100, deadline=None)
@given(
    size=st.integers(0, 12),
    concurrency=st.integers(1, 4),
    data=st.data(),
)
def test_scatter_never_exceeds_its_concurrency_and_keeps_item_order(
    size: int, concurrency: int, data: st.DataObject
) -> None:
    definition = definition_from_obj(
        {
            "family_slug": "fan",
            "steps": [
                {
                    "ref": "fan",
                    "type": "STEP_TYPE_SCATTER",
                    "args": {
                        "items": str(list(range(size))),
                        "max_concurrency": concurrency,
                        "step": {
                            "type": "STEP_TYPE_ACTION",
                            "args": {"action": "x", "params": {"v": "item * 3"}},
                        },
                    },
                }
            ],
        }
    )
    result = start_run(definition, run_id="r", input=None, now=NOW)
    in_flight: list[DispatchTask] = []
    while True:
        in_flight.extend(c for c in result.commands if isinstance(c, DispatchTask))
        fan = result.state.steps["fan"]
        busy = [i for i in fan.items or [] if i.status is StepStatus.RUNNING]
        assert len(busy) == len(in_flight) <= concurrency
        if result.state.status.terminal:
            break
        task = in_flight.pop(data.draw(st.integers(0, len(in_flight) - 1)))
        value = task.payload["params"]["v"]
        result = tick(
            definition,
            result.state,
            [
                AttemptResult(
                    step_ref="fan",
                    item_index=task.item_index,
                    attempt=task.attempt,
                    ok=True,
                    output=value,
                )
            ],
            NOW,
        )
    assert result.state.status is RunStatus.SUCCEEDED
    assert result.state.output == {"fan": [i * 3 for i in range(size)]}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios(timeouts=True), data=st.data())
def test_with_timeouts_racing_results_every_run_still_ends_cleanly(
    scenario: Scenario, data: st.DataObject
) -> None:
    trace = drive(scenario, hypothesis_chooser(data, cancels=True))
    final = trace.final
    event(f"run {final.status.value}")
    assert len(trace.finished) == 1
    assert len(trace.dispatched) == len(set(trace.dispatched))
    assert all(step.status.terminal for step in final.steps.values())
    assert final.timers == {}
    if final.status is RunStatus.SUCCEEDED:
        assert unhandled_failures(scenario.definition, final) == []


def _garbage(refs: list[str]) -> st.SearchStrategy[RunInput]:
    ref = st.sampled_from([*refs, "nope"])
    index = st.integers(-2, 4)
    attempt = st.integers(-1, 4)
    purpose = st.sampled_from(
        ["wait", "retry", "timeout", "event_timeout", "signal_timeout", "bogus"]
    )
    error = st.builds(
        ErrorInfo,
        code=st.sampled_from(["x", "step.timeout"]),
        message=st.just("m"),
        retryable=st.booleans(),
        retry_after_seconds=st.none() | st.floats(0, 100),
    )
    return st.one_of(
        st.builds(
            AttemptResult,
            step_ref=ref,
            item_index=index,
            attempt=attempt,
            ok=st.booleans(),
            output=_OUT,
            error=st.none() | error,
        ),
        st.builds(
            lambda r, i, p, a: TimerFired(timer_id=f"{r}:{i}:{p}:{a}"),
            ref,
            index,
            purpose,
            attempt,
        ),
        st.builds(TimerFired, timer_id=st.text(max_size=12)),
        st.builds(
            EventReceived,
            event_id=st.text(max_size=3),
            name=st.sampled_from([f"ev-{r}" for r in refs] + ["other"]),
            data=st.none() | st.fixed_dictionaries({"k": _OUT}),
        ),
        st.builds(
            SignalReceived,
            signal_id=st.text(max_size=3),
            name=st.sampled_from([f"go-{r}" for r in refs] + ["other"]),
            payload=_OUT,
        ),
        st.builds(
            ChildRunEnded,
            step_ref=ref,
            item_index=index,
            child_run_id=st.just("c"),
            status=st.sampled_from(list(RunStatus)),
            output=_OUT,
        ),
        st.builds(CancelRequested, reason=st.just("fuzz")),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios(timeouts=True), data=st.data())
def test_garbage_inputs_never_raise_and_are_applied_or_reported(
    scenario: Scenario, data: st.DataObject
) -> None:
    """The coordinator feeds whatever its inbox holds; the tick must neither
    raise nor lose track of an input, whatever the input names."""
    definition = scenario.definition
    refs = [s.ref for s in definition.steps]
    result = start_run(definition, run_id="run", input={"i": 1}, now=NOW)
    mirror = ServerMirror()
    for command in result.commands:
        mirror.apply(command)
    for _ in range(data.draw(st.integers(1, 6))):
        batch = data.draw(st.lists(_garbage(refs), min_size=1, max_size=4))
        mirror.fired(batch)
        was_terminal = result.state.status.terminal
        result = tick(definition, result.state, batch, NOW)
        for command in result.commands:
            mirror.apply(command)
        mirror.check(definition, result.state)
        assert len(result.ignored) <= len(batch)
        if was_terminal:
            assert len(result.ignored) == len(batch)
            assert result.commands == []
        finished = [c for c in result.commands if isinstance(c, RunFinished)]
        assert len(finished) == (1 if result.state.status.terminal and not was_terminal else 0)
