"""Focused tests of the pure tick: every step type, joins, retries, waits, cancel."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ductor_core import (
    AttemptResult,
    CancelChildRuns,
    CancelRequested,
    CancelTimer,
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
    SendNotifications,
    SetTimer,
    SignalReceived,
    StartChildRun,
    StepStatus,
    TickResult,
    TimerFired,
    WorkflowDefinition,
    decode_definition,
    definition_from_obj,
    start_run,
    tick,
)
from ductor_core.durations import MAX_DURATION
from ductor_core.tick import MAX_KEPT_SIGNAL_BYTES, MAX_SCATTER_ITEMS

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
DATA = Path(__file__).parent / "data"


def wf(
    steps: list[dict[str, Any]],
    edges: list[tuple[str, str] | tuple[str, str, str] | tuple[str, str, str, str]] = (),  # type: ignore[assignment]
    output: Any = None,
) -> WorkflowDefinition:
    edge_objs = []
    for edge in edges:
        obj: dict[str, Any] = {"source_ref": edge[0], "target_ref": edge[1]}
        if len(edge) > 2:
            obj["type"] = f"EDGE_TYPE_{edge[2]}"
        if len(edge) > 3:
            obj["condition"] = edge[3]
        edge_objs.append(obj)
    body: dict[str, Any] = {"family_slug": "t", "steps": steps, "edges": edge_objs}
    if output is not None:
        body["output"] = output
    return definition_from_obj(body)


def action(ref: str, **extra: Any) -> dict[str, Any]:
    args = {"action": "http.post", "params": extra.pop("params", {})}
    return {"ref": ref, "type": "STEP_TYPE_ACTION", "args": args, **extra}


def dataflow(ref: str, **args: Any) -> dict[str, Any]:
    return {"ref": ref, "type": "STEP_TYPE_DATAFLOW", "args": args}


def of(result: TickResult, kind: type[Any]) -> list[Any]:
    return [c for c in result.commands if isinstance(c, kind)]


def ok(ref: str, attempt: int = 1, output: Any = None, index: int = -1) -> AttemptResult:
    return AttemptResult(step_ref=ref, item_index=index, attempt=attempt, ok=True, output=output)


def err(
    ref: str,
    attempt: int = 1,
    code: str = "boom",
    *,
    retryable: bool = True,
    index: int = -1,
    retry_after: float | None = None,
) -> AttemptResult:
    return AttemptResult(
        step_ref=ref,
        item_index=index,
        attempt=attempt,
        ok=False,
        error=ErrorInfo(
            code=code, message="it broke", retryable=retryable, retry_after_seconds=retry_after
        ),
    )


def status(result: TickResult, ref: str) -> StepStatus:
    return result.state.steps[ref].status


def step_tick(
    definition: WorkflowDefinition,
    prev: TickResult,
    *inputs: RunInput,
    at: datetime = NOW,
) -> TickResult:
    return tick(definition, prev.state, list(inputs), at)


# --- hello world, dataflow ---------------------------------------------------------


def test_hello_world_runs_to_the_wait_output() -> None:
    definition = decode_definition((DATA / "hello-world.json").read_bytes())
    first = start_run(definition, run_id="r1", input={}, now=NOW)
    assert first.state.status is RunStatus.RUNNING
    assert status(first, "greet") is StepStatus.SUCCEEDED
    assert first.state.steps["greet"].output == {"message": "hello"}
    assert first.commands == [
        SetTimer(timer_id="pause:-1:wait:1", fire_at=NOW + timedelta(seconds=2))
    ]
    assert status(first, "pause") is StepStatus.WAITING
    done = step_tick(definition, first, TimerFired(timer_id="pause:-1:wait:1"), at=NOW)
    assert done.state.status is RunStatus.SUCCEEDED
    assert done.state.output == {"pause": {"waited_until": "2026-01-01T12:00:02Z"}}
    assert of(done, RunFinished) == [
        RunFinished(status=RunStatus.SUCCEEDED, output=done.state.output)
    ]
    again = step_tick(definition, done, TimerFired(timer_id="pause:-1:wait:1"))
    assert again.commands == []
    assert len(again.ignored) == 1
    assert again.state == done.state


def test_dataflow_chain_finishes_in_one_tick() -> None:
    definition = wf(
        [
            dataflow("p", operation="project", project={"n": "input.n", "xs": "[1, 2, 3, 4]"}),
            dataflow("f", operation="filter", items="steps.p.output.xs", predicate="item > 2"),
            dataflow("m", operation="map", items="steps.f.output", expression="item * 10 + index"),
            dataflow(
                "g",
                operation="merge",
                sources=['{"a": 1, "b": 1}', '{"b": 2, "m": steps.m.output}'],
            ),
            dataflow("k", operation="pick", source="steps.g.output", keys=["m", "zz", "a"]),
        ],
        [("p", "f"), ("f", "m"), ("m", "g"), ("g", "k")],
    )
    result = start_run(definition, run_id="r", input={"n": 7}, now=NOW)
    assert result.state.status is RunStatus.SUCCEEDED
    outputs = {ref: s.output for ref, s in result.state.steps.items()}
    assert outputs["p"] == {"n": 7, "xs": [1, 2, 3, 4]}
    assert outputs["f"] == [3, 4]
    assert outputs["m"] == [30, 41]
    assert outputs["g"] == {"a": 1, "b": 2, "m": [30, 41]}
    assert outputs["k"] == {"m": [30, 41], "a": 1}
    assert result.state.output == {"k": {"m": [30, 41], "a": 1}}
    assert len(of(result, RunFinished)) == 1


def test_activation_exposes_run_and_step_status() -> None:
    definition = wf(
        [
            dataflow("a", operation="project", project={"v": "1"}),
            dataflow(
                "b",
                operation="project",
                project={"id": "run.id", "now": "run.now", "st": "steps.a.status"},
            ),
        ],
        [("a", "b")],
    )
    result = start_run(definition, run_id="run-9", input=None, now=NOW)
    assert result.state.steps["b"].output == {
        "id": "run-9",
        "now": "2026-01-01T12:00:00Z",
        "st": "STEP_STATUS_SUCCEEDED",
    }


def test_dataflow_error_fails_step_and_unhandled_fails_run() -> None:
    definition = wf([dataflow("a", operation="project", project={"x": "input.missing.deep"})])
    result = start_run(definition, run_id="r", input={}, now=NOW)
    step = result.state.steps["a"]
    assert step.status is StepStatus.FAILED
    assert step.error is not None
    assert step.error.code == "expression.evaluation"
    assert not step.error.retryable
    assert result.state.status is RunStatus.FAILED
    assert result.state.error is not None
    assert result.state.error.details == {"step_ref": "a", "error": "expression.evaluation"}
    assert len(of(result, RunFinished)) == 1


def test_failure_edge_handles_a_failure() -> None:
    definition = wf(
        [
            dataflow("a", operation="project", project={"x": "1 / 0"}),
            dataflow("ok", operation="project", project={"x": "1"}),
            dataflow("handler", operation="project", project={"why": "steps.a.status"}),
        ],
        [("a", "ok"), ("a", "handler", "FAILURE")],
    )
    result = start_run(definition, run_id="r", input={}, now=NOW)
    assert status(result, "a") is StepStatus.FAILED
    assert status(result, "ok") is StepStatus.SKIPPED
    assert status(result, "handler") is StepStatus.SUCCEEDED
    assert result.state.status is RunStatus.SUCCEEDED
    # ok was skipped, so only the handler sink contributes
    assert result.state.output == {"handler": {"why": "STEP_STATUS_FAILED"}}


def test_always_edge_runs_after_success_and_after_failure() -> None:
    for expr, expected in (("1", StepStatus.SUCCEEDED), ("1 / 0", StepStatus.FAILED)):
        definition = wf(
            [
                dataflow("a", operation="project", project={"x": expr}),
                dataflow("cleanup", operation="project", project={"x": "2"}),
            ],
            [("a", "cleanup", "ALWAYS")],
        )
        result = start_run(definition, run_id="r", input={}, now=NOW)
        assert status(result, "a") is expected
        assert status(result, "cleanup") is StepStatus.SUCCEEDED
        assert result.state.status is RunStatus.SUCCEEDED


# --- joins, conditions, skips --------------------------------------------------------


def test_join_waits_for_every_incoming_edge() -> None:
    definition = wf(
        [action("a"), action("b"), action("c")],
        [("a", "c"), ("b", "c")],
    )
    first = start_run(definition, run_id="r", input={}, now=NOW)
    assert [c.step_ref for c in of(first, DispatchTask)] == ["a", "b"]
    after_a = step_tick(definition, first, ok("a", output=1))
    assert of(after_a, DispatchTask) == []
    assert status(after_a, "c") is StepStatus.PENDING
    after_b = step_tick(definition, after_a, ok("b", output=2))
    assert [c.step_ref for c in of(after_b, DispatchTask)] == ["c"]
    end = step_tick(definition, after_b, ok("c", output=3))
    assert end.state.status is RunStatus.SUCCEEDED
    assert end.state.output == {"c": 3}


def test_condition_edges_pick_a_branch_and_skips_propagate_to_a_join() -> None:
    definition = wf(
        [
            dataflow("score", operation="project", project={"v": "input.v"}),
            dataflow("high", operation="project", project={"b": '"high"'}),
            dataflow("low", operation="project", project={"b": '"low"'}),
            dataflow("after_low", operation="project", project={"b": '"after"'}),
            dataflow("join", operation="project", project={"done": "true"}),
        ],
        [
            ("score", "high", "CONDITION", "output.v > 10"),
            ("score", "low", "CONDITION", "output.v <= 10"),
            ("low", "after_low"),
            ("high", "join"),
            ("after_low", "join"),
        ],
    )
    high = start_run(definition, run_id="r", input={"v": 50}, now=NOW)
    assert status(high, "high") is StepStatus.SUCCEEDED
    assert status(high, "low") is StepStatus.SKIPPED
    assert status(high, "after_low") is StepStatus.SKIPPED
    assert status(high, "join") is StepStatus.SUCCEEDED
    assert high.state.status is RunStatus.SUCCEEDED
    low = start_run(definition, run_id="r", input={"v": 3}, now=NOW)
    assert status(low, "high") is StepStatus.SKIPPED
    assert status(low, "after_low") is StepStatus.SUCCEEDED
    assert status(low, "join") is StepStatus.SUCCEEDED


def test_step_with_no_taken_edge_is_skipped_and_run_still_succeeds() -> None:
    definition = wf(
        [
            dataflow("a", operation="project", project={"v": "1"}),
            dataflow("b", operation="project", project={"v": "2"}),
        ],
        [("a", "b", "FAILURE")],
    )
    result = start_run(definition, run_id="r", input={}, now=NOW)
    assert status(result, "b") is StepStatus.SKIPPED
    assert result.state.status is RunStatus.SUCCEEDED
    assert result.state.output == {}  # the only sink was skipped


def test_condition_error_counts_as_not_taken_and_is_noted() -> None:
    definition = wf(
        [
            dataflow("a", operation="project", project={"v": "1"}),
            dataflow("b", operation="project", project={"v": "2"}),
        ],
        [("a", "b", "CONDITION", "output.nope > 1")],
    )
    result = start_run(definition, run_id="r", input={}, now=NOW)
    b = result.state.steps["b"]
    assert b.status is StepStatus.SKIPPED
    assert b.data["condition_errors"][0]["source_ref"] == "a"


def test_run_output_expression_string_and_map() -> None:
    steps = [dataflow("a", operation="project", project={"v": "input.v * 2"})]
    as_string = start_run(
        wf(steps, output="steps.a.output.v + 1"), run_id="r", input={"v": 4}, now=NOW
    )
    assert as_string.state.output == 9
    as_map = start_run(
        wf(steps, output={"double": "steps.a.output.v", "orig": "input.v"}),
        run_id="r",
        input={"v": 4},
        now=NOW,
    )
    assert as_map.state.output == {"double": 8, "orig": 4}
    broken = start_run(wf(steps, output="steps.zz.output"), run_id="r", input={"v": 4}, now=NOW)
    assert broken.state.status is RunStatus.FAILED
    assert broken.state.error is not None
    assert broken.state.error.code == "expression.evaluation"


def test_empty_workflow_succeeds_at_once() -> None:
    result = start_run(wf([]), run_id="r", input={}, now=NOW)
    assert result.state.status is RunStatus.SUCCEEDED
    assert result.commands == [RunFinished(status=RunStatus.SUCCEEDED, output={})]


# --- worker steps --------------------------------------------------------------------


def test_action_dispatch_payload_key_and_timeout() -> None:
    definition = wf(
        [
            action(
                "call",
                params={"url": '"https://x.test/" + input.id', "n": "input.n + 1"},
                timeout="30s",
            )
        ]
    )
    result = start_run(definition, run_id="run-1", input={"id": "abc", "n": 1}, now=NOW)
    assert result.commands == [
        DispatchTask(
            step_ref="call",
            item_index=-1,
            attempt=1,
            step_type="STEP_TYPE_ACTION",
            handler="action:http.post",
            payload={"params": {"url": "https://x.test/abc", "n": 2}, "connection": None},
            idempotency_key="run-1:call:-1:1",
            timeout_seconds=30.0,
        ),
        SetTimer(timer_id="call:-1:timeout:1", fire_at=NOW + timedelta(seconds=30)),
    ]
    step = result.state.steps["call"]
    assert step.status is StepStatus.RUNNING
    assert step.attempt == 1
    assert step.started_at == NOW

    done = step_tick(definition, result, ok("call", output={"status": 200}))
    assert done.commands[0] == CancelTimer(timer_id="call:-1:timeout:1")
    assert done.state.status is RunStatus.SUCCEEDED
    assert done.state.timers == {}


def test_action_through_a_connection_dispatches_its_evaluated_input() -> None:
    step = {
        "ref": "push",
        "type": "STEP_TYPE_ACTION",
        "args": {
            "connection": "crm",
            "operation": "send",
            "input": {"path": '"/leads/" + input.id', "count": "input.n * 2"},
        },
    }
    result = start_run(wf([step]), run_id="run-2", input={"id": "x7", "n": 4}, now=NOW)
    assert result.commands == [
        DispatchTask(
            step_ref="push",
            item_index=-1,
            attempt=1,
            step_type="STEP_TYPE_ACTION",
            handler="connection",
            payload={
                "connection": "crm",
                "operation": "send",
                "input": {"path": "/leads/x7", "count": 8},
            },
            idempotency_key="run-2:push:-1:1",
        )
    ]


def test_bridge_route_notify_payloads() -> None:
    definition = wf(
        [
            {
                "ref": "b",
                "type": "STEP_TYPE_BRIDGE",
                "args": {"app_id": "billing", "workflow": "charge", "input": "input"},
            },
            {
                "ref": "r",
                "type": "STEP_TYPE_ROUTE",
                "args": {
                    "kind": "lead",
                    "attributes": {"state": "input.state"},
                    "pool": "buyers",
                    "price": "1500000",
                    "await_completion": True,
                    "timeout": "1h",
                },
            },
            {
                "ref": "n",
                "type": "STEP_TYPE_NOTIFY",
                "args": {"recipients": '"ops"', "title": '"hi " + input.state'},
            },
        ]
    )
    result = start_run(definition, run_id="r", input={"state": "CA"}, now=NOW)
    tasks = {t.step_ref: t for t in of(result, DispatchTask)}
    assert tasks["b"].handler == "bridge"
    assert tasks["b"].payload == {
        "app_id": "billing",
        "workflow": "charge",
        "input": {"state": "CA"},
    }
    assert tasks["r"].handler == "route"
    assert tasks["r"].payload == {
        "kind": "lead",
        "attributes": {"state": "CA"},
        "pool": "buyers",
        "price": 1500000,
        "await_completion": True,
    }
    assert tasks["r"].timeout_seconds == 3600.0
    [sent] = of(result, SendNotifications)
    assert (sent.step_ref, sent.recipients, sent.title, sent.body) == ("n", ["ops"], "hi CA", "")
    assert sent.group_id == "r:n"
    assert sent.feed == "default"
    assert result.state.steps["n"].status is StepStatus.SUCCEEDED
    assert result.state.steps["n"].output == {"group_id": "r:n", "recipients": ["ops"]}


def test_bad_param_expression_fails_step_without_dispatch() -> None:
    definition = wf([action("a", params={"x": "input.nope"})])
    result = start_run(definition, run_id="r", input={}, now=NOW)
    assert of(result, DispatchTask) == []
    assert status(result, "a") is StepStatus.FAILED
    assert result.state.status is RunStatus.FAILED


def test_stale_duplicate_and_unknown_results_are_ignored() -> None:
    definition = wf([action("a"), action("b")], [("a", "b")])
    first = start_run(definition, run_id="r", input={}, now=NOW)
    result = step_tick(
        definition,
        first,
        ok("zzz"),
        ok("a", attempt=2),
        ok("b"),
        ok("a", output="first"),
        ok("a", output="second"),
    )
    assert result.state.steps["a"].output == "first"
    reasons = [i.reason for i in result.ignored]
    assert len(reasons) == 4
    assert "unknown step" in reasons[0]
    assert "stale or duplicate" in reasons[1]
    assert "stale or duplicate" in reasons[2]  # b was not dispatched yet
    assert "stale or duplicate" in reasons[3]
    assert [t.step_ref for t in of(result, DispatchTask)] == ["b"]


# --- retries and timeouts --------------------------------------------------------------


def test_retry_backoff_then_fail_after_max_attempts() -> None:
    definition = wf(
        [
            action(
                "a",
                retry={
                    "max_attempts": 3,
                    "initial_interval": "10s",
                    "backoff_coefficient": 3,
                    "max_interval": "1h",
                },
            )
        ]
    )
    state = start_run(definition, run_id="r", input={}, now=NOW)
    now = NOW
    for attempt, base in ((1, 10.0), (2, 30.0)):
        failed = step_tick(definition, state, err("a", attempt), at=now)
        step = failed.state.steps["a"]
        assert step.status is StepStatus.RETRYING
        assert step.error is not None
        timers = of(failed, SetTimer)
        assert [t.timer_id for t in timers] == [f"a:-1:retry:{attempt + 1}"]
        delay = (timers[0].fire_at - now).total_seconds()
        assert base * 0.9 <= delay <= base * 1.1
        assert step.retry_at == timers[0].fire_at
        now = timers[0].fire_at
        state = step_tick(definition, failed, TimerFired(timer_id=timers[0].timer_id), at=now)
        tasks = of(state, DispatchTask)
        assert [(t.attempt, t.idempotency_key) for t in tasks] == [
            (attempt + 1, f"r:a:-1:{attempt + 1}")
        ]
        assert state.state.steps["a"].status is StepStatus.RUNNING
    final = step_tick(definition, state, err("a", 3), at=now)
    assert status(final, "a") is StepStatus.FAILED
    assert final.state.status is RunStatus.FAILED


def test_default_retry_policy_is_three_attempts_from_one_second() -> None:
    definition = wf([action("a")])
    state = start_run(definition, run_id="r", input={}, now=NOW)
    failed = step_tick(definition, state, err("a", 1))
    delay = (of(failed, SetTimer)[0].fire_at - NOW).total_seconds()
    assert 0.9 <= delay <= 1.1
    second = step_tick(definition, failed, TimerFired(timer_id="a:-1:retry:2"))
    failed2 = step_tick(definition, second, err("a", 2))
    delay2 = (of(failed2, SetTimer)[0].fire_at - NOW).total_seconds()
    assert 1.8 <= delay2 <= 2.2
    third = step_tick(definition, failed2, TimerFired(timer_id="a:-1:retry:3"))
    assert status(step_tick(definition, third, err("a", 3)), "a") is StepStatus.FAILED


def test_backoff_is_capped_and_jitter_is_deterministic() -> None:
    definition = wf(
        [
            action(
                "a",
                retry={
                    "max_attempts": 10,
                    "initial_interval": "1m",
                    "backoff_coefficient": 10,
                    "max_interval": "2m",
                },
            )
        ]
    )

    def delay_for(run_id: str) -> float:
        first = start_run(definition, run_id=run_id, input={}, now=NOW)
        state = first
        now = NOW
        for attempt in (1, 2):
            state = step_tick(definition, state, err("a", attempt), at=now)
            fire = of(state, SetTimer)[0]
            gap = (fire.fire_at - now).total_seconds()
            now = fire.fire_at
            state = step_tick(definition, state, TimerFired(timer_id=fire.timer_id), at=now)
        return gap

    gap = delay_for("r-1")
    assert 108.0 <= gap <= 132.0  # capped at 2m, then +-10%
    assert delay_for("r-1") == gap
    assert len({delay_for(f"r-{i}") for i in range(8)}) > 1


def test_non_retryable_errors_fail_at_once() -> None:
    definition = wf([action("a", retry={"non_retryable_codes": ["card.declined"]})])
    state = start_run(definition, run_id="r", input={}, now=NOW)
    flagged = step_tick(definition, state, err("a", 1, retryable=False))
    assert status(flagged, "a") is StepStatus.FAILED
    listed = step_tick(definition, state, err("a", 1, code="card.declined"))
    assert status(listed, "a") is StepStatus.FAILED
    assert of(listed, SetTimer) == []


def test_retry_after_overrides_backoff() -> None:
    definition = wf([action("a")])
    state = start_run(definition, run_id="r", input={}, now=NOW)
    result = step_tick(definition, state, err("a", 1, retry_after=42.5))
    assert of(result, SetTimer)[0].fire_at == NOW + timedelta(seconds=42.5)


@pytest.mark.parametrize("asked", [float("inf"), 1e20, 4e11])
def test_a_retry_after_beyond_any_clock_waits_the_longest_duration(asked: float) -> None:
    # An outside answer may ask for any wait; past 36500d it would overflow the
    # clock and fail the tick, so it is held to the longest duration a definition takes.
    definition = wf([action("a")])
    state = start_run(definition, run_id="r", input={}, now=NOW)
    result = step_tick(definition, state, err("a", 1, retry_after=asked))
    assert status(result, "a") is StepStatus.RETRYING
    assert of(result, SetTimer)[0].fire_at == NOW + MAX_DURATION


def test_attempt_timeout_retries_and_ignores_the_late_result() -> None:
    definition = wf([action("a", timeout="5s")])
    state = start_run(definition, run_id="r", input={}, now=NOW)
    later = NOW + timedelta(seconds=5)
    timed_out = step_tick(definition, state, TimerFired(timer_id="a:-1:timeout:1"), at=later)
    step = timed_out.state.steps["a"]
    assert step.status is StepStatus.RETRYING
    assert step.error is not None
    assert step.error.code == "step.timeout"
    late = step_tick(definition, timed_out, ok("a", 1, output="late"), at=later)
    assert late.ignored
    assert late.state.steps["a"].status is StepStatus.RETRYING
    retry = of(timed_out, SetTimer)[0]
    second = step_tick(definition, late, TimerFired(timer_id=retry.timer_id), at=retry.fire_at)
    assert [t.attempt for t in of(second, DispatchTask)] == [2]
    assert [t.timer_id for t in of(second, SetTimer)] == ["a:-1:timeout:2"]
    done = step_tick(definition, second, ok("a", 2, output="on time"), at=retry.fire_at)
    assert done.state.output == {"a": "on time"}
    assert of(done, CancelTimer) == [CancelTimer(timer_id="a:-1:timeout:2")]


# --- waits ---------------------------------------------------------------------------------


def test_wait_until_expression() -> None:
    definition = wf([{"ref": "w", "type": "STEP_TYPE_WAIT", "args": {"until": "input.at"}}])
    result = start_run(definition, run_id="r", input={"at": "2026-01-02T00:00:00Z"}, now=NOW)
    assert of(result, SetTimer) == [
        SetTimer(timer_id="w:-1:wait:1", fire_at=datetime(2026, 1, 2, tzinfo=UTC))
    ]
    assert result.state.steps["w"].waiting_for is not None
    past = start_run(definition, run_id="r", input={"at": "2020-01-01T00:00:00Z"}, now=NOW)
    assert past.state.status is RunStatus.SUCCEEDED


def _event_wf(timeout: str | None = "1h") -> WorkflowDefinition:
    args: dict[str, Any] = {"event": "order.shipped", "match": "event.data.order == input.order"}
    if timeout:
        args["timeout"] = timeout
    return wf([{"ref": "e", "type": "STEP_TYPE_WAIT_FOR_EVENT", "args": args}])


def test_wait_for_event_matches_consumes_once_and_clears() -> None:
    definition = _event_wf()
    first = start_run(definition, run_id="r", input={"order": 7}, now=NOW)
    assert first.commands == [
        RegisterWait(step_ref="e", kind="event", name="order.shipped"),
        SetTimer(timer_id="e:-1:event_timeout:1", fire_at=NOW + timedelta(hours=1)),
    ]
    assert status(first, "e") is StepStatus.WAITING
    other = EventReceived(event_id="ev1", name="order.shipped", data={"order": 8})
    bad = EventReceived(event_id="ev2", name="order.shipped", data={"nothing": 1})
    good = EventReceived(event_id="ev3", name="order.shipped", data={"order": 7})
    result = step_tick(definition, first, other, bad, good, good)
    assert [i.input for i in result.ignored] == [other, bad, good]
    assert "matched" in result.ignored[1].reason
    assert result.state.steps["e"].output == {
        "id": "ev3",
        "name": "order.shipped",
        "data": {"order": 7},
    }
    assert result.commands[:2] == [
        ClearWait(step_ref="e"),
        CancelTimer(timer_id="e:-1:event_timeout:1"),
    ]
    assert result.state.status is RunStatus.SUCCEEDED


def test_wait_for_event_timeout_succeeds_with_null() -> None:
    definition = _event_wf()
    first = start_run(definition, run_id="r", input={"order": 7}, now=NOW)
    result = step_tick(definition, first, TimerFired(timer_id="e:-1:event_timeout:1"))
    assert result.commands[0] == ClearWait(step_ref="e")
    assert status(result, "e") is StepStatus.SUCCEEDED
    assert result.state.output == {"e": None}


def _signal_wf(first: dict[str, Any] | None = None) -> WorkflowDefinition:
    wait = {
        "ref": "s",
        "type": "STEP_TYPE_WAIT_FOR_SIGNAL",
        "args": {"signal": "approve", "timeout": "1d"},
    }
    if first is None:
        return wf([wait])
    return wf([first, wait], [(first["ref"], "s")])


def test_signal_while_waiting_is_consumed() -> None:
    definition = _signal_wf()
    first = start_run(definition, run_id="r", input={}, now=NOW)
    assert RegisterWait(step_ref="s", kind="signal", name="approve") in first.commands
    sig = SignalReceived(signal_id="s1", name="approve", payload={"by": "ann"})
    result = step_tick(definition, first, sig, sig)
    assert result.state.steps["s"].output == {"by": "ann"}
    assert result.ignored[0].input == sig
    assert CancelTimer(timer_id="s:-1:signal_timeout:1") in result.commands


def test_signal_before_the_wait_is_buffered_then_consumed() -> None:
    definition = _signal_wf(action("prep"))
    first = start_run(definition, run_id="r", input={}, now=NOW)
    early = SignalReceived(signal_id="s1", name="approve", payload=1)
    unrelated = SignalReceived(signal_id="s2", name="other", payload=2)
    buffered = step_tick(definition, first, early, unrelated)
    assert [i.input for i in buffered.ignored] == [unrelated]
    assert [s.signal_id for s in buffered.state.pending_signals] == ["s1"]
    dup = step_tick(definition, buffered, early)
    assert dup.ignored
    assert len(dup.state.pending_signals) == 1
    done = step_tick(definition, dup, ok("prep"))
    assert done.state.steps["s"].output == 1
    assert done.state.pending_signals == []
    assert of(done, RegisterWait) == []
    assert done.state.status is RunStatus.SUCCEEDED


def test_signals_are_kept_one_per_step_yet_to_take_them() -> None:
    # Two steps wait for "approve" after "prep": two early signals are kept, a
    # third is ignored (no step could ever take it) and not remembered.
    second = {
        "ref": "s2",
        "type": "STEP_TYPE_WAIT_FOR_SIGNAL",
        "args": {"signal": "approve", "timeout": "1d"},
    }
    first_wait = {"ref": "s", "type": "STEP_TYPE_WAIT_FOR_SIGNAL", "args": {"signal": "approve"}}
    definition = wf([action("prep"), first_wait, second], [("prep", "s"), ("prep", "s2")])
    first = start_run(definition, run_id="r", input={}, now=NOW)
    sigs = [SignalReceived(signal_id=f"s{i}", name="approve", payload=i) for i in range(3)]
    kept = step_tick(definition, first, *sigs)
    assert [s.signal_id for s in kept.state.pending_signals] == ["s0", "s1"]
    assert [i.input for i in kept.ignored] == [sigs[2]]
    assert "no step left to take it: 2 kept for the 2 yet to start" in kept.ignored[0].reason
    assert "signal:s2" not in kept.state.received_ids
    done = step_tick(definition, kept, ok("prep"))
    assert done.state.output == {"s": 0, "s2": 1}
    assert done.state.status is RunStatus.SUCCEEDED


def test_kept_signals_hold_at_most_a_mebibyte_of_payload() -> None:
    definition = _signal_wf(action("prep"))
    first = start_run(definition, run_id="r", input={}, now=NOW)
    big = "x" * (MAX_KEPT_SIGNAL_BYTES - 2)  # its JSON, with the quotes, is the limit
    over = SignalReceived(signal_id="over", name="approve", payload=big + "x")
    at_limit = SignalReceived(signal_id="fits", name="approve", payload=big)
    result = step_tick(definition, first, over, at_limit)
    assert [i.input for i in result.ignored] == [over]
    assert "would be over 1,048,576" in result.ignored[0].reason
    assert [s.signal_id for s in result.state.pending_signals] == ["fits"]
    done = step_tick(definition, result, ok("prep"))
    assert done.state.steps["s"].output == big
    # A step waiting now takes a signal of any size: nothing is kept.
    waiting = start_run(_signal_wf(), run_id="r", input={}, now=NOW)
    taken = step_tick(_signal_wf(), waiting, over)
    assert taken.state.steps["s"].output == big + "x"


def test_signal_timeout_succeeds_with_null() -> None:
    definition = _signal_wf()
    first = start_run(definition, run_id="r", input={}, now=NOW)
    result = step_tick(definition, first, TimerFired(timer_id="s:-1:signal_timeout:1"))
    assert result.state.output == {"s": None}


# --- sub-workflows ------------------------------------------------------------------------------


def _sub_wf(timeout: str | None = None) -> WorkflowDefinition:
    step: dict[str, Any] = {
        "ref": "child",
        "type": "STEP_TYPE_SUBWORKFLOW",
        "args": {"family_slug": "kid", "version": 2, "input": "{'x': input.x}"},
    }
    if timeout:
        step["timeout"] = timeout
    return wf([step])


def test_subworkflow_start_and_success() -> None:
    definition = _sub_wf()
    first = start_run(definition, run_id="r", input={"x": 5}, now=NOW)
    assert first.commands == [
        StartChildRun(
            step_ref="child", child_key="r:child:-1", family_slug="kid", version=2, input={"x": 5}
        )
    ]
    assert status(first, "child") is StepStatus.WAITING
    ended = ChildRunEnded(
        step_ref="child", child_run_id="c1", status=RunStatus.SUCCEEDED, output={"y": 1}
    )
    result = step_tick(definition, first, ended, ended)
    assert result.state.steps["child"].output == {"y": 1}
    assert result.state.steps["child"].child_run_id == "c1"
    assert len(result.ignored) == 1
    assert result.state.status is RunStatus.SUCCEEDED


def test_subworkflow_failure_and_timeout() -> None:
    definition = _sub_wf(timeout="10m")
    first = start_run(definition, run_id="r", input={"x": 5}, now=NOW)
    failed = step_tick(
        definition,
        first,
        ChildRunEnded(step_ref="child", child_run_id="c1", status=RunStatus.FAILED),
    )
    child = failed.state.steps["child"]
    assert child.status is StepStatus.FAILED
    assert child.error is not None
    assert child.error.code == "child.failed"
    timed = step_tick(definition, first, TimerFired(timer_id="child:-1:timeout:1"))
    assert CancelChildRuns(step_ref="child") in timed.commands
    assert timed.state.steps["child"].error is not None
    assert timed.state.steps["child"].error.code == "step.timeout"


# --- scatter / gather -----------------------------------------------------------------------


def _scatter_wf(
    *, concurrency: int = 2, tolerate: bool = False, items: str = "input.items"
) -> WorkflowDefinition:
    return wf(
        [
            {
                "ref": "fan",
                "type": "STEP_TYPE_SCATTER",
                "args": {
                    "items": items,
                    "max_concurrency": concurrency,
                    "tolerate_failures": tolerate,
                    "step": {
                        "type": "STEP_TYPE_ACTION",
                        "args": {"action": "score", "params": {"v": "item", "i": "index"}},
                        "retry": {"max_attempts": 1},
                    },
                },
            },
            {"ref": "gather", "type": "STEP_TYPE_GATHER", "args": {"scatter": "fan"}},
        ],
        [("fan", "gather", "ALWAYS")],
    )


def test_scatter_respects_concurrency_and_keeps_item_order() -> None:
    definition = _scatter_wf()
    first = start_run(definition, run_id="r", input={"items": [10, 20, 30, 40]}, now=NOW)
    tasks = of(first, DispatchTask)
    assert [(t.item_index, t.payload["params"]) for t in tasks] == [
        (0, {"v": 10, "i": 0}),
        (1, {"v": 20, "i": 1}),
    ]
    assert tasks[1].idempotency_key == "r:fan:1:1"
    second = step_tick(definition, first, ok("fan", output="b", index=1))
    assert [t.item_index for t in of(second, DispatchTask)] == [2]
    third = step_tick(
        definition,
        second,
        ok("fan", output="c", index=2),
        ok("fan", output="a", index=0),
        ok("fan", output="dup", index=0),
    )
    assert [t.item_index for t in of(third, DispatchTask)] == [3]
    assert len(third.ignored) == 1
    done = step_tick(definition, third, ok("fan", output="d", index=3))
    assert done.state.steps["fan"].output == ["a", "b", "c", "d"]
    assert done.state.steps["gather"].output == {
        "items": ["a", "b", "c", "d"],
        "succeeded": 4,
        "failed": 0,
    }
    assert done.state.status is RunStatus.SUCCEEDED


def test_scatter_failure_without_and_with_tolerance() -> None:
    for tolerate in (False, True):
        definition = _scatter_wf(concurrency=5, tolerate=tolerate)
        first = start_run(definition, run_id="r", input={"items": [1, 2, 3]}, now=NOW)
        done = step_tick(
            definition,
            first,
            ok("fan", output="x", index=0),
            err("fan", index=1, retryable=False),
            ok("fan", output="z", index=2),
        )
        fan = done.state.steps["fan"]
        gather = done.state.steps["gather"]
        assert gather.output == {"items": ["x", None, "z"], "succeeded": 2, "failed": 1}
        if tolerate:
            assert fan.status is StepStatus.SUCCEEDED
            assert fan.output == ["x", None, "z"]
        else:
            assert fan.status is StepStatus.FAILED
            assert fan.error is not None
            assert fan.error.details == {"failed": [1]}
        # the ALWAYS edge handles the failure either way
        assert done.state.status is RunStatus.SUCCEEDED


def test_scatter_per_item_retry() -> None:
    definition = wf(
        [
            {
                "ref": "fan",
                "type": "STEP_TYPE_SCATTER",
                "args": {
                    "items": "[1]",
                    "step": {"type": "STEP_TYPE_ACTION", "args": {"action": "x"}},
                },
            }
        ]
    )
    first = start_run(definition, run_id="r", input={}, now=NOW)
    failed = step_tick(definition, first, err("fan", index=0))
    assert failed.state.steps["fan"].items is not None
    assert failed.state.steps["fan"].items[0].status is StepStatus.RETRYING
    assert [t.timer_id for t in of(failed, SetTimer)] == ["fan:0:retry:2"]
    again = step_tick(definition, failed, TimerFired(timer_id="fan:0:retry:2"))
    assert [(t.item_index, t.attempt) for t in of(again, DispatchTask)] == [(0, 2)]


def test_scatter_empty_items_succeeds_with_empty_list() -> None:
    result = start_run(_scatter_wf(items="[]"), run_id="r", input={}, now=NOW)
    assert result.state.steps["fan"].output == []
    assert result.state.status is RunStatus.SUCCEEDED


def test_scatter_of_more_than_the_limit_fails_and_starts_no_item() -> None:
    at_limit = start_run(
        _scatter_wf(concurrency=3), run_id="r", input={"items": [0] * MAX_SCATTER_ITEMS}, now=NOW
    )
    assert len(of(at_limit, DispatchTask)) == 3
    assert at_limit.state.steps["fan"].status is StepStatus.RUNNING

    over = start_run(
        _scatter_wf(concurrency=3),
        run_id="r",
        input={"items": [0] * (MAX_SCATTER_ITEMS + 1)},
        now=NOW,
    )
    assert of(over, DispatchTask) == []
    fan = over.state.steps["fan"]
    assert fan.status is StepStatus.FAILED
    assert fan.error is not None
    assert fan.error.code == "scatter.too_many_items"
    assert not fan.error.retryable
    assert fan.error.details == {"items": MAX_SCATTER_ITEMS + 1, "limit": MAX_SCATTER_ITEMS}
    assert "10,001 items" in fan.error.message
    assert fan.items is None  # no item state kept for the refused list


def test_a_run_state_pickles_as_its_json() -> None:
    # A tick computed in another process gets the state and gives it back pickled.
    started = start_run(
        _scatter_wf(concurrency=2),
        run_id="r",
        input={"items": [1, "two", {"three": [3.5, None, True]}]},
        now=datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=timezone(timedelta(hours=5))),
    )
    state = msgspec.structs.replace(
        started.state,
        timers={"fan:0:retry:2": NOW},
        received_ids=["event:e1"],
        cancel_requested=True,
    )
    data = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    assert msgspec.json.encode(state) in data
    back = pickle.loads(data)
    assert back == state
    assert back.created_at.utcoffset() == timedelta(hours=5)
    assert back.steps["fan"].items == state.steps["fan"].items


def test_scatter_of_workflows_starts_children_per_item() -> None:
    definition = wf(
        [
            {
                "ref": "fan",
                "type": "STEP_TYPE_SCATTER",
                "args": {
                    "items": "input.ids",
                    "workflow": {"family_slug": "kid"},
                    "input": "{'id': item, 'pos': index}",
                    "max_concurrency": 1,
                },
            }
        ]
    )
    first = start_run(definition, run_id="r", input={"ids": ["a", "b"]}, now=NOW)
    assert of(first, StartChildRun) == [
        StartChildRun(
            step_ref="fan",
            item_index=0,
            child_key="r:fan:0",
            family_slug="kid",
            input={"id": "a", "pos": 0},
        )
    ]
    nxt = step_tick(
        definition,
        first,
        ChildRunEnded(
            step_ref="fan", item_index=0, child_run_id="c0", status=RunStatus.SUCCEEDED, output=1
        ),
    )
    assert [c.child_key for c in of(nxt, StartChildRun)] == ["r:fan:1"]
    done = step_tick(
        definition,
        nxt,
        ChildRunEnded(
            step_ref="fan", item_index=1, child_run_id="c1", status=RunStatus.SUCCEEDED, output=2
        ),
    )
    assert done.state.output == {"fan": [1, 2]}


# --- fail fast and cancel -----------------------------------------------------------------------


def test_unhandled_failure_fails_fast_and_cancels_in_flight_work() -> None:
    definition = wf(
        [
            action("a", retry={"max_attempts": 1}),
            {
                "ref": "w",
                "type": "STEP_TYPE_WAIT_FOR_EVENT",
                "args": {"event": "x", "timeout": "7d"},
            },
            {"ref": "child", "type": "STEP_TYPE_SUBWORKFLOW", "args": {"family_slug": "k"}},
            action("after"),
        ],
        [("a", "after"), ("w", "after"), ("child", "after")],
    )
    first = start_run(definition, run_id="r", input={}, now=NOW)
    failed = step_tick(definition, first, err("a"), ok("a"))
    assert failed.state.status is RunStatus.FAILED
    assert status(failed, "w") is StepStatus.CANCELLED
    assert status(failed, "after") is StepStatus.CANCELLED
    assert ClearWait(step_ref="w") in failed.commands
    assert CancelTimer(timer_id="w:-1:event_timeout:1") in failed.commands
    assert CancelChildRuns() in failed.commands
    assert failed.state.timers == {}
    assert len(of(failed, RunFinished)) == 1
    assert len(failed.ignored) == 1


def test_cancel_is_complete_and_idempotent() -> None:
    definition = wf(
        [
            action("a", timeout="1m"),
            {"ref": "w", "type": "STEP_TYPE_WAIT", "args": {"duration": "1h"}},
        ]
    )
    first = start_run(definition, run_id="r", input={}, now=NOW)
    cancelled = step_tick(definition, first, CancelRequested(reason="user asked"))
    assert cancelled.state.status is RunStatus.CANCELLED
    assert cancelled.state.cancel_requested
    assert all(s.status is StepStatus.CANCELLED for s in cancelled.state.steps.values())
    assert {c.timer_id for c in of(cancelled, CancelTimer)} == {"a:-1:timeout:1", "w:-1:wait:1"}
    assert of(cancelled, RunFinished)[0].status is RunStatus.CANCELLED
    again = step_tick(definition, cancelled, CancelRequested(), ok("a"))
    assert again.commands == []
    assert len(again.ignored) == 2
    assert again.state == cancelled.state


# --- purity --------------------------------------------------------------------------------------


def test_tick_is_pure_and_leaves_its_input_state_alone() -> None:
    definition = _scatter_wf()
    first = start_run(definition, run_id="r", input={"items": [1, 2, 3]}, now=NOW)
    before = msgspec.json.encode(first.state)
    inputs: list[RunInput] = [ok("fan", output="a", index=0), err("fan", index=1)]
    one = tick(definition, first.state, inputs, NOW)
    two = tick(definition, first.state, inputs, NOW)
    assert msgspec.json.encode(first.state) == before
    assert one == two
    decoded = msgspec.json.decode(msgspec.json.encode(one.state), type=RunState)
    assert tick(definition, decoded, [ok("fan", output="c", index=2)], NOW) == tick(
        definition, one.state, [ok("fan", output="c", index=2)], NOW
    )


@pytest.mark.parametrize("bad", ["a:-1:wait:1", "nope", "a:x:retry:1"])
def test_unknown_timers_are_ignored(bad: str) -> None:
    definition = wf([action("a")])
    first = start_run(definition, run_id="r", input={}, now=NOW)
    result = step_tick(definition, first, TimerFired(timer_id=bad))
    assert result.commands == []
    assert len(result.ignored) == 1


def test_commands_encode_as_a_tagged_union() -> None:
    result = start_run(_scatter_wf(), run_id="r", input={"items": [1]}, now=NOW)
    raw = msgspec.json.encode(result.commands)
    assert msgspec.json.decode(raw, type=list[Command]) == result.commands


def test_expressions_see_every_finished_step_however_they_name_it() -> None:
    definition = wf(
        [
            dataflow("a", operation="project", project={"v": "1"}),
            dataflow("b", operation="project", project={"v": "2"}),
            dataflow(
                "c",
                operation="project",
                project={
                    "count": "size(steps)",
                    "by_index": 'steps["a"].output.v',
                    "by_field": "steps.b.output.v",
                    "has_later": "has(steps.d)",
                },
            ),
            dataflow("d", operation="project", project={"v": "4"}),
        ],
        [("a", "c"), ("b", "c"), ("c", "d")],
    )
    result = start_run(definition, run_id="r", input={}, now=NOW)
    assert result.state.steps["c"].output == {
        "count": 2,
        "by_index": 1,
        "by_field": 2,
        "has_later": False,
    }


def test_referenced_steps_never_leaves_a_use_out() -> None:
    from ductor_core._step_index import referenced_steps

    assert referenced_steps(["steps.a.output + steps.b_2.output", "input.x"]) == ("a", "b_2")
    assert referenced_steps(["1 + 1"]) == ()
    assert referenced_steps(['steps["a-b"].output']) is None
    assert referenced_steps(["size(steps) > 0"]) is None
    assert referenced_steps(["steps.a.output", "steps"]) is None
    assert referenced_steps(["my_steps.x + steps . c.output"]) == ("c",)


def test_scatter_item_timeout_retries_that_item_only() -> None:
    definition = wf(
        [
            {
                "ref": "fan",
                "type": "STEP_TYPE_SCATTER",
                "args": {
                    "items": "[1, 2]",
                    "step": {
                        "type": "STEP_TYPE_ACTION",
                        "args": {"action": "x"},
                        "timeout": "10s",
                        "retry": {"max_attempts": 2},
                    },
                },
            }
        ]
    )
    first = start_run(definition, run_id="r", input={}, now=NOW)
    assert [t.timer_id for t in of(first, SetTimer)] == ["fan:0:timeout:1", "fan:1:timeout:1"]
    assert [t.timeout_seconds for t in of(first, DispatchTask)] == [10.0, 10.0]
    timed = step_tick(definition, first, TimerFired(timer_id="fan:1:timeout:1"))
    items = timed.state.steps["fan"].items
    assert items is not None
    assert [i.status for i in items] == [StepStatus.RUNNING, StepStatus.RETRYING]
    assert items[1].error is not None
    assert items[1].error.code == "step.timeout"
    late = step_tick(definition, timed, ok("fan", 1, "late", index=1))
    assert len(late.ignored) == 1
    retried = step_tick(definition, late, TimerFired(timer_id="fan:1:retry:2"))
    assert [(t.item_index, t.attempt) for t in of(retried, DispatchTask)] == [(1, 2)]
    done = step_tick(definition, retried, ok("fan", 1, "a", index=0), ok("fan", 2, "b", index=1))
    assert done.state.output == {"fan": ["a", "b"]}


def test_cancelled_child_fails_the_step_with_its_own_code() -> None:
    definition = _sub_wf()
    first = start_run(definition, run_id="r", input={"x": 1}, now=NOW)
    result = step_tick(
        definition,
        first,
        ChildRunEnded(step_ref="child", child_run_id="c1", status=RunStatus.CANCELLED),
    )
    error = result.state.steps["child"].error
    assert error is not None
    assert error.code == "child.cancelled"
    assert result.state.status is RunStatus.FAILED


def test_child_run_end_for_a_running_child_status_is_ignored() -> None:
    definition = _sub_wf()
    first = start_run(definition, run_id="r", input={"x": 1}, now=NOW)
    result = step_tick(
        definition,
        first,
        ChildRunEnded(step_ref="child", child_run_id="c1", status=RunStatus.RUNNING),
        ChildRunEnded(step_ref="nope", child_run_id="c1", status=RunStatus.SUCCEEDED),
    )
    assert len(result.ignored) == 2
    assert status(result, "child") is StepStatus.WAITING


def test_wait_until_accepts_cel_timestamp_arithmetic() -> None:
    definition = wf(
        [
            {
                "ref": "w",
                "type": "STEP_TYPE_WAIT",
                "args": {"until": "timestamp(run.now) + duration('90m')"},
            }
        ]
    )
    result = start_run(definition, run_id="r", input={}, now=NOW)
    assert of(result, SetTimer)[0].fire_at == NOW + timedelta(minutes=90)


def test_one_event_satisfies_every_step_waiting_for_it() -> None:
    waits = [
        {"ref": ref, "type": "STEP_TYPE_WAIT_FOR_EVENT", "args": {"event": "go"}}
        for ref in ("e1", "e2")
    ]
    definition = wf(waits)
    first = start_run(definition, run_id="r", input={}, now=NOW)
    result = step_tick(definition, first, EventReceived(event_id="x", name="go", data=1))
    assert status(result, "e1") is StepStatus.SUCCEEDED
    assert status(result, "e2") is StepStatus.SUCCEEDED
    assert result.state.status is RunStatus.SUCCEEDED


def test_a_signal_goes_to_one_waiting_step_in_document_order() -> None:
    waits = [
        {"ref": ref, "type": "STEP_TYPE_WAIT_FOR_SIGNAL", "args": {"signal": "go"}}
        for ref in ("s1", "s2")
    ]
    definition = wf(waits)
    first = start_run(definition, run_id="r", input={}, now=NOW)
    one = step_tick(definition, first, SignalReceived(signal_id="a", name="go", payload="A"))
    assert status(one, "s1") is StepStatus.SUCCEEDED
    assert status(one, "s2") is StepStatus.WAITING
    two = step_tick(definition, one, SignalReceived(signal_id="b", name="go", payload="B"))
    assert two.state.output == {"s1": "A", "s2": "B"}


def test_results_for_steps_not_run_by_workers_are_ignored() -> None:
    definition = wf(
        [
            {"ref": "w", "type": "STEP_TYPE_WAIT", "args": {"duration": "1m"}},
            {
                "ref": "fan",
                "type": "STEP_TYPE_SCATTER",
                "args": {
                    "items": "[1]",
                    "step": {"type": "STEP_TYPE_ACTION", "args": {"action": "x"}},
                },
            },
        ]
    )
    first = start_run(definition, run_id="r", input={}, now=NOW)
    result = step_tick(definition, first, ok("w"), ok("fan", index=5), ok("fan"))
    assert len(result.ignored) == 3
    assert status(result, "w") is StepStatus.WAITING


def test_a_failing_inline_root_stops_the_other_roots_from_starting() -> None:
    definition = wf([dataflow("bad", operation="project", project={"x": "1 / 0"}), action("later")])
    result = start_run(definition, run_id="r", input={}, now=NOW)
    assert result.state.status is RunStatus.FAILED
    assert of(result, DispatchTask) == []
    assert status(result, "later") is StepStatus.CANCELLED


def test_a_cyclic_definition_fails_at_start_instead_of_hanging() -> None:
    definition = wf(
        [action("root"), action("a"), action("b")],
        [("root", "a"), ("a", "b"), ("b", "a")],
    )
    result = start_run(definition, run_id="r", input={}, now=NOW)
    assert result.state.status is RunStatus.FAILED
    assert result.state.error is not None
    assert result.state.error.code == "definition.cycle"
    assert of(result, DispatchTask) == []
    assert len(of(result, RunFinished)) == 1


def test_a_state_stored_without_the_tick_bookkeeping_fields_still_ticks() -> None:
    definition = wf([action("a"), action("b")], [("a", "b")])
    first = start_run(definition, run_id="r", input={}, now=NOW)
    raw = msgspec.to_builtins(first.state)
    for name in ("timers", "pending_signals", "received_ids", "open_steps"):
        raw.pop(name, None)  # the empty ones are not written at all
    del raw["steps"]["b"]  # a state written before b was known
    old = msgspec.convert(raw, RunState)
    assert old.open_steps is None
    nxt = tick(definition, old, [ok("a")], NOW)
    assert [t.step_ref for t in of(nxt, DispatchTask)] == ["b"]
    done = tick(definition, nxt.state, [ok("b", output=2)], NOW)
    assert done.state.status is RunStatus.SUCCEEDED
    assert done.state.open_steps == 0


def test_wait_for_signal_falls_back_to_the_step_timeout() -> None:
    definition = wf(
        [
            {
                "ref": "s",
                "type": "STEP_TYPE_WAIT_FOR_SIGNAL",
                "args": {"signal": "go"},
                "timeout": "15m",
            }
        ]
    )
    first = start_run(definition, run_id="r", input={}, now=NOW)
    assert of(first, SetTimer) == [
        SetTimer(timer_id="s:-1:signal_timeout:1", fire_at=NOW + timedelta(minutes=15))
    ]


def test_equal_definitions_share_one_index_but_keep_their_own_identity() -> None:
    from ductor_core._step_index import index_for

    raw = (DATA / "hello-world.json").read_bytes()
    one, two = decode_definition(raw), decode_definition(raw)
    first, second = index_for(one), index_for(two)
    assert first.steps is second.steps  # built once, found by content
    assert first.definition is one
    assert second.definition is two
    assert index_for(one) is first
    assert start_run(one, run_id="r", input={}, now=NOW) == start_run(
        two, run_id="r", input={}, now=NOW
    )


def test_both_engines_drive_a_run_to_the_same_state() -> None:
    from ductor_core.expressions import engine_by_name

    definition = wf(
        [
            dataflow("p", operation="project", project={"xs": "input.xs", "n": "size(input.xs)"}),
            dataflow("f", operation="filter", items="steps.p.output.xs", predicate="item % 2 == 0"),
            dataflow("m", operation="map", items="steps.f.output", expression="item * index"),
            dataflow("big", operation="project", project={"v": '"big"'}),
            dataflow("small", operation="project", project={"v": '"small"'}),
            action("call", params={"sum": "steps.m.output.size() + steps.p.output.n"}),
        ],
        [
            ("p", "f"),
            ("f", "m"),
            ("m", "big", "CONDITION", "size(output) > 1"),
            ("m", "small", "CONDITION", "size(output) <= 1"),
            ("big", "call", "ALWAYS"),
            ("small", "call", "ALWAYS"),
        ],
    )
    results = [
        start_run(
            definition, run_id="r", input={"xs": [1, 2, 3, 4, 6]}, now=NOW, engine=engine_by_name(n)
        )
        for n in ("cel-python", "cel-rust")
    ]
    assert results[0] == results[1]
    assert results[0].state.steps["m"].output == [0, 4, 12]
    assert status(results[0], "small") is StepStatus.SKIPPED
    assert of(results[0], DispatchTask)[0].payload["params"] == {"sum": 8}


# --- NOTIFY ------------------------------------------------------------------------


def _notify_wf(**extra: Any) -> WorkflowDefinition:
    args = {
        "recipients": "input.to",
        "title": "'Approve ' + input.what",
        "feed": "approvals",
        "data": "{'what': input.what}",
        "ctas": [
            {"label": "'Approve'", "action": "approve"},
            {"label": "'Open'", "url": "'https://example.com/' + input.what"},
        ],
        **extra,
    }
    return wf([{"ref": "ask", "type": "STEP_TYPE_NOTIFY", "args": args}])


def test_notify_sends_once_per_distinct_recipient_and_succeeds() -> None:
    definition = _notify_wf()
    first = start_run(definition, run_id="r", input={"to": ["a", "b", "a"], "what": "x"}, now=NOW)
    [sent] = of(first, SendNotifications)
    assert sent.recipients == ["a", "b"]
    assert sent.ctas == [
        {"label": "Approve", "action": "approve"},
        {"label": "Open", "url": "https://example.com/x"},
    ]
    assert (sent.title, sent.data, sent.feed) == ("Approve x", {"what": "x"}, "approvals")
    assert first.state.status is RunStatus.SUCCEEDED
    assert first.state.output == {"ask": {"group_id": "r:ask", "recipients": ["a", "b"]}}


def test_notify_awaiting_an_action_resumes_once_with_who_clicked() -> None:
    definition = _notify_wf(await_action=True, timeout="1h")
    first = start_run(definition, run_id="r", input={"to": "a", "what": "x"}, now=NOW)
    assert first.state.steps["ask"].status is StepStatus.WAITING
    assert RegisterWait(step_ref="ask", kind="signal", name="inbox.action:ask") in first.commands
    click = SignalReceived(
        signal_id="inbox:r:ask",
        name="inbox.action:ask",
        payload={"action": "approve", "subscriber_id": "a", "notification_id": "n1"},
    )
    done = step_tick(definition, first, click, click)
    assert done.state.steps["ask"].output == {
        "group_id": "r:ask",
        "recipients": ["a"],
        "action": "approve",
        "subscriber_id": "a",
        "notification_id": "n1",
        "timed_out": False,
    }
    assert done.ignored[0].input == click
    assert done.state.status is RunStatus.SUCCEEDED


def test_notify_awaiting_an_action_times_out_with_no_action() -> None:
    definition = _notify_wf(await_action=True, timeout="1m")
    first = start_run(definition, run_id="r", input={"to": "a", "what": "x"}, now=NOW)
    [timer] = of(first, SetTimer)
    done = step_tick(definition, first, TimerFired(timer_id=timer.timer_id))
    assert done.state.steps["ask"].output == {
        "group_id": "r:ask",
        "recipients": ["a"],
        "action": None,
        "timed_out": True,
    }


def test_notify_with_bad_recipients_fails_the_step() -> None:
    definition = _notify_wf()
    first = start_run(definition, run_id="r", input={"to": 7, "what": "x"}, now=NOW)
    assert of(first, SendNotifications) == []
    error = first.state.steps["ask"].error
    assert error is not None
    assert error.code == "notify.bad_recipients"


def test_notify_takes_1_to_1000_recipients_once_duplicates_are_dropped() -> None:
    definition = _notify_wf()

    def started(to: Any) -> tuple[list[str] | None, str | None]:
        first = start_run(definition, run_id="r", input={"to": to, "what": "x"}, now=NOW)
        sent = of(first, SendNotifications)
        error = first.state.steps["ask"].error
        return (sent[0].recipients if sent else None), (error.code if error else None)

    most = [f"s{i}" for i in range(1000)]
    assert started(most) == (most, None)
    assert started([*most, "s1000"]) == (None, "notify.bad_recipients")
    assert started(["ann"] * 5000) == (["ann"], None)
    assert started([]) == (None, "notify.bad_recipients")
    assert started(["ann", 7]) == (None, "notify.bad_recipients")


BAD_LINKS = [
    "javascript:alert(document.cookie)",
    "JavaScript:alert(1)",
    " https://example.com/",
    "data:text/html,<script>alert(1)</script>",
    "vbscript:msgbox(1)",
    "/relative/path",
    "//evil.example/x",
    "https:evil.example",
    "https://example.com/a b",
    "https://example.com/\x00",
    "https://example.com/" + "x" * 2029,
    "",
]
BAD_LABELS = ["", "x" * 201, "Open\nnow", "Open\x1b[31m", "Open\x85"]


def _failed_notify(extra: dict[str, Any], value: str) -> ErrorInfo:
    data = {"to": "a", "what": "x", "value": value}
    first = start_run(_notify_wf(**extra), run_id="r", input=data, now=NOW)
    assert of(first, SendNotifications) == []
    assert first.state.status is RunStatus.FAILED
    error = first.state.steps["ask"].error
    assert error is not None
    return error


@pytest.mark.parametrize("link", BAD_LINKS)
def test_notify_fails_on_a_url_or_avatar_a_client_could_not_render_safely(link: str) -> None:
    approve = {"label": "'Approve'", "action": "approve"}
    for extra, pointer in (
        ({"ctas": [approve, {"label": "'Open'", "url": "input.value"}]}, "/args/ctas/1/url"),
        ({"avatar": "input.value"}, "/args/avatar"),
    ):
        error = _failed_notify(extra, link)
        assert (error.code, error.details) == ("notify.bad_value", {"pointer": pointer}), error
        assert "absolute http or https URL" in error.message


@pytest.mark.parametrize("label", BAD_LABELS)
def test_notify_fails_on_an_empty_long_or_control_character_label(label: str) -> None:
    error = _failed_notify({"ctas": [{"label": "input.value", "action": "go"}]}, label)
    assert (error.code, error.details) == ("notify.bad_value", {"pointer": "/args/ctas/0/label"})
    assert "1 to 200 characters" in error.message


def test_notify_fails_on_a_nul_in_its_title_body_data_or_email_subject() -> None:
    # The send API refuses a NUL anywhere in its body; a PostgreSQL text column
    # cannot hold one, so a step that wrote one could never commit its tick.
    email = {"email": {"connection": "mail", "subject": "input.value"}}
    for extra, value, pointer in (
        ({"title": "input.value"}, "a\x00b", "/args/title"),
        ({"body": "input.value"}, "\x00", "/args/body"),
        ({"data": "{'k': input.value}"}, "a\x00", "/args/data"),
        ({"data": "{input.value: 1}"}, "\\\x00", "/args/data"),
        (email, "Shipped\x00", "/args/email/subject"),
    ):
        error = _failed_notify(extra, value)
        assert (error.code, error.details) == ("notify.bad_value", {"pointer": pointer}), error
    # A backslash followed by the text u0000 is no NUL.
    first = start_run(
        _notify_wf(data="{'k': input.value}"),
        run_id="r",
        input={"to": "a", "what": "x", "value": "\\u0000"},
        now=NOW,
    )
    [sent] = of(first, SendNotifications)
    assert sent.data == {"k": "\\u0000"}


def test_notify_takes_http_links_and_a_printable_label_up_to_their_limits() -> None:
    link = "HTTPS://[::1]:8443/" + "x" * (2048 - 19)
    extra = {
        "avatar": "input.avatar",
        "ctas": [{"label": "input.label", "url": "input.link"}],
    }
    label = "Öffnen ✓" * 25
    data = {"to": "a", "what": "x", "link": link, "label": label, "avatar": "http://i.example/a"}
    first = start_run(_notify_wf(**extra), run_id="r", input=data, now=NOW)
    [sent] = of(first, SendNotifications)
    assert sent.avatar == "http://i.example/a"
    assert sent.ctas == [{"label": label, "url": link}]
    assert first.state.status is RunStatus.SUCCEEDED


def test_terminal_statuses_are_exactly_the_ended_runs_and_decided_steps() -> None:
    ended = {s for s in RunStatus if s.terminal}
    assert ended == {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED}
    decided = {s for s in StepStatus if s.terminal}
    assert decided == {
        StepStatus.SUCCEEDED,
        StepStatus.FAILED,
        StepStatus.SKIPPED,
        StepStatus.CANCELLED,
    }
