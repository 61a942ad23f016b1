"""A step type added from outside the core: one spec, no change to validation or the tick.

STEP_TYPE_ECHO is defined here only. It is validated (structure, CEL, its own
check) and run to completion through start_run/tick by passing a StepSpecs
that holds it; the built-in set alone does not know it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from ductor_core import (
    ARGS_BY_TYPE,
    BUILTIN_STEP_SPECS,
    ArgsCheck,
    AttemptResult,
    DataflowArgs,
    DefinitionError,
    DefinitionStruct,
    DispatchTask,
    ErrorInfo,
    InCoordinator,
    OnWorker,
    RunFinished,
    RunStatus,
    SetTimer,
    StepSpec,
    StepSpecs,
    StepStatus,
    StepType,
    TimerFired,
    decode_args,
    definition_from_obj,
    start_run,
    tick,
    validate_definition,
)

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


class EchoArgs(DefinitionStruct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Echo `message` (CEL) back, `repeat` times."""

    message: str
    repeat: int = 1


def _check_echo(a: ArgsCheck) -> None:
    repeat = a.fields.get("repeat")
    if isinstance(repeat, int) and not 1 <= repeat <= 10:
        a.problem(f"'{a.prefix}repeat' must be from 1 to 10, got {repeat}", "repeat")


ECHO = StepSpec(
    type="STEP_TYPE_ECHO",
    args=EchoArgs,
    start=OnWorker(handler="echo"),
    expressions=("message",),
    check=_check_echo,
    scatterable=True,
)
SPECS = BUILTIN_STEP_SPECS.with_specs(ECHO)


def echo_definition(**echo_args: Any) -> dict[str, Any]:
    args = {"message": "'hello ' + steps.greet.output.name", **echo_args}
    return {
        "family_slug": "echo-test",
        "steps": [
            {
                "ref": "greet",
                "type": "STEP_TYPE_DATAFLOW",
                "args": {"operation": "project", "project": {"name": "input.name"}},
            },
            {"ref": "echo", "type": "STEP_TYPE_ECHO", "args": args},
        ],
        "edges": [{"source_ref": "greet", "target_ref": "echo"}],
    }


def problems(definition: Any, specs: StepSpecs | None = SPECS) -> list[tuple[str, str]]:
    report = validate_definition(definition, specs=specs)
    assert report.valid is (not report.problems)
    return [(p.code, p.pointer) for p in report.problems]


# --- validation ----------------------------------------------------------------------


def test_a_definition_using_the_new_type_is_valid_with_its_spec() -> None:
    assert problems(echo_definition()) == []
    assert problems(definition_from_obj(echo_definition(repeat=3))) == []


def test_the_built_in_set_alone_does_not_know_the_new_type() -> None:
    assert problems(echo_definition(), specs=None) == [
        ("definition.unknown_step_type", "/steps/1/type")
    ]
    report = validate_definition(echo_definition())
    assert "unknown step type 'STEP_TYPE_ECHO'" in report.problems[0].message


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"message": None}, [("definition.bad_args", "/steps/1/args/message")]),
        ({"message": 42}, [("definition.bad_args", "/steps/1/args/message")]),
        ({"colour": "red"}, [("definition.bad_args", "/steps/1/args/colour")]),
        ({"message": "'unclosed"}, [("definition.bad_expression", "/steps/1/args/message")]),
        (
            {"message": "steps.nowhere.output"},
            [("definition.bad_step_reference", "/steps/1/args/message")],
        ),
        ({"repeat": 0}, [("definition.bad_args", "/steps/1/args/repeat")]),
        (
            {"repeat": 11, "message": "1 +"},
            [
                ("definition.bad_args", "/steps/1/args/repeat"),
                ("definition.bad_expression", "/steps/1/args/message"),
            ],
        ),
    ],
    ids=["missing", "wrong-type", "unknown-field", "bad-cel", "missing-step", "check", "both"],
)
def test_bad_args_of_the_new_type_are_reported_at_their_pointer(
    args: dict[str, Any], expected: list[tuple[str, str]]
) -> None:
    definition = echo_definition()
    raw = definition["steps"][1]["args"]
    for key, value in args.items():
        if value is None:
            del raw[key]
        else:
            raw[key] = value
    assert problems(definition) == expected


def test_missing_args_name_the_required_field() -> None:
    definition = echo_definition()
    del definition["steps"][1]["args"]
    report = validate_definition(definition, specs=SPECS)
    assert [(p.code, p.pointer) for p in report.problems] == [
        ("definition.bad_args", "/steps/1/args")
    ]
    assert "'message'" in report.problems[0].message


def test_a_scatter_may_run_the_new_type_per_item_and_checks_its_template() -> None:
    definition: dict[str, Any] = {
        "family_slug": "echo-each",
        "steps": [
            {
                "ref": "each",
                "type": "STEP_TYPE_SCATTER",
                "args": {"items": "input.names", "step": {"type": "STEP_TYPE_ECHO", "args": {}}},
            }
        ],
    }
    assert problems(definition) == [("definition.bad_args", "/steps/0/args/step/args/message")]
    definition["steps"][0]["args"]["step"]["args"] = {"message": "'hi ' + item"}
    assert problems(definition) == []


def test_a_check_that_raises_is_reported_not_raised() -> None:
    def broken(a: ArgsCheck) -> None:
        raise KeyError("oops")

    faulty = StepSpec(
        type="STEP_TYPE_ECHO", args=EchoArgs, start=OnWorker(handler="echo"), check=broken
    )
    report = validate_definition(echo_definition(), specs=BUILTIN_STEP_SPECS.with_specs(faulty))
    assert [(p.code, p.pointer) for p in report.problems] == [
        ("definition.bad_args", "/steps/1/args")
    ]
    assert "could not be checked (KeyError)" in report.problems[0].message


# --- running -------------------------------------------------------------------------


def test_the_tick_dispatches_the_new_type_and_finishes_the_run() -> None:
    definition = definition_from_obj(echo_definition(repeat=2))
    first = start_run(definition, run_id="r1", input={"name": "Ada"}, now=NOW, specs=SPECS)
    assert first.commands == [
        DispatchTask(
            step_ref="echo",
            item_index=-1,
            attempt=1,
            step_type="STEP_TYPE_ECHO",
            handler="echo",
            payload={"message": "hello Ada", "repeat": 2},
            idempotency_key="r1:echo:-1:1",
        )
    ]
    assert first.state.steps["greet"].status is StepStatus.SUCCEEDED
    assert first.state.steps["echo"].status is StepStatus.RUNNING

    result = AttemptResult(step_ref="echo", attempt=1, ok=True, output={"said": "hello Ada"})
    done = tick(definition, first.state, [result], NOW + timedelta(seconds=1), specs=SPECS)
    assert done.ignored == []
    assert done.state.status is RunStatus.SUCCEEDED
    assert done.state.output == {"echo": {"said": "hello Ada"}}
    assert done.commands == [
        RunFinished(status=RunStatus.SUCCEEDED, output={"echo": {"said": "hello Ada"}})
    ]


def test_a_failed_attempt_of_the_new_type_is_retried_by_the_usual_policy() -> None:
    raw = echo_definition()
    raw["steps"][1]["retry"] = {"max_attempts": 2, "initial_interval": "1s"}
    definition = definition_from_obj(raw)
    first = start_run(definition, run_id="r2", input={"name": "Bo"}, now=NOW, specs=SPECS)
    error = ErrorInfo(code="echo.busy", message="try later", retryable=True)
    failed = AttemptResult(step_ref="echo", attempt=1, ok=False, error=error)
    later = tick(definition, first.state, [failed], NOW, specs=SPECS)
    [timer] = [c for c in later.commands if isinstance(c, SetTimer)]
    assert timer.timer_id == "echo:-1:retry:2"
    again = tick(
        definition, later.state, [TimerFired(timer_id=timer.timer_id)], timer.fire_at, specs=SPECS
    )
    [task] = [c for c in again.commands if isinstance(c, DispatchTask)]
    assert (task.attempt, task.handler, task.payload) == (
        2,
        "echo",
        {"message": "hello Bo", "repeat": 1},
    )
    last = AttemptResult(step_ref="echo", attempt=2, ok=False, error=error)
    end = tick(definition, again.state, [last], timer.fire_at, specs=SPECS)
    assert end.state.status is RunStatus.FAILED
    assert end.state.steps["echo"].error == error


def test_a_scatter_of_the_new_type_dispatches_one_task_per_item() -> None:
    definition = definition_from_obj(
        {
            "family_slug": "echo-each",
            "steps": [
                {
                    "ref": "each",
                    "type": "STEP_TYPE_SCATTER",
                    "args": {
                        "items": "input.names",
                        "step": {"type": "STEP_TYPE_ECHO", "args": {"message": "'hi ' + item"}},
                    },
                }
            ],
        }
    )
    first = start_run(definition, run_id="r3", input={"names": ["a", "b"]}, now=NOW, specs=SPECS)
    tasks = [c for c in first.commands if isinstance(c, DispatchTask)]
    assert [(t.item_index, t.handler, t.payload["message"]) for t in tasks] == [
        (0, "echo", "hi a"),
        (1, "echo", "hi b"),
    ]
    results = [
        AttemptResult(step_ref="each", item_index=t.item_index, attempt=1, ok=True, output=i)
        for i, t in enumerate(tasks)
    ]
    done = tick(definition, first.state, results, NOW, specs=SPECS)
    assert done.state.status is RunStatus.SUCCEEDED
    assert done.state.output == {"each": [0, 1]}


def test_without_its_spec_the_tick_fails_the_step_instead_of_guessing() -> None:
    definition = definition_from_obj(echo_definition())
    result = start_run(definition, run_id="r4", input={"name": "Cy"}, now=NOW)
    assert result.state.status is RunStatus.FAILED
    error = result.state.steps["echo"].error
    assert error is not None
    assert error.code == "definition.unknown_step_type"


def test_decoding_the_new_type_needs_its_spec() -> None:
    assert decode_args("STEP_TYPE_ECHO", {"message": "1"}, specs=SPECS) == EchoArgs(message="1")
    step = definition_from_obj(echo_definition()).steps[1]
    assert step.typed_args(specs=SPECS) == EchoArgs(message="'hello ' + steps.greet.output.name")
    with pytest.raises(DefinitionError) as info:
        step.typed_args()
    assert info.value.code == "definition.unknown_step_type"


# --- the set of specs ----------------------------------------------------------------


def test_the_built_in_set_is_the_step_type_enum_and_args_table() -> None:
    assert BUILTIN_STEP_SPECS.names() == tuple(t.value for t in StepType)
    assert {StepType(s.type): s.args for s in BUILTIN_STEP_SPECS} == ARGS_BY_TYPE
    assert ARGS_BY_TYPE[StepType.DATAFLOW] is DataflowArgs
    assert BUILTIN_STEP_SPECS.worker_handlers() == {
        "STEP_TYPE_ACTION": "action",
        "STEP_TYPE_BRIDGE": "bridge",
        "STEP_TYPE_ROUTE": "route",
    }
    assert SPECS.worker_handlers()["STEP_TYPE_ECHO"] == "echo"
    assert "STEP_TYPE_ECHO" in SPECS
    assert "STEP_TYPE_ECHO" not in BUILTIN_STEP_SPECS


def test_a_worker_run_type_uses_timeout_and_retry_and_the_coordinator_ones_what_they_read() -> None:
    raw = echo_definition()
    raw["steps"][1] |= {"timeout": "5s", "retry": {"max_attempts": 2}}
    assert problems(raw) == []
    assert ECHO.options == {"timeout", "retry"}
    # What the tick reads of each built-in step's own `timeout` and `retry`.
    none: frozenset[str] = frozenset()
    assert {spec.type: spec.options for spec in BUILTIN_STEP_SPECS} == {
        "STEP_TYPE_ACTION": {"timeout", "retry"},
        "STEP_TYPE_BRIDGE": {"timeout", "retry"},
        "STEP_TYPE_ROUTE": {"timeout", "retry"},
        "STEP_TYPE_SUBWORKFLOW": {"timeout"},
        "STEP_TYPE_WAIT_FOR_EVENT": {"timeout"},
        "STEP_TYPE_WAIT_FOR_SIGNAL": {"timeout"},
        "STEP_TYPE_NOTIFY": {"timeout"},
        "STEP_TYPE_DATAFLOW": none,
        "STEP_TYPE_WAIT": none,
        "STEP_TYPE_SCATTER": none,
        "STEP_TYPE_GATHER": none,
    }


def test_a_type_cannot_be_specified_twice() -> None:
    with pytest.raises(ValueError, match="twice"):
        SPECS.with_specs(ECHO)


def test_a_spec_is_checked_when_it_is_made() -> None:
    class Loose(msgspec.Struct, frozen=True):
        message: str

    with pytest.raises(TypeError, match="forbid unknown fields"):
        StepSpec(type="STEP_TYPE_LOOSE", args=Loose, start=OnWorker(handler="loose"))
    with pytest.raises(ValueError, match="not an args field"):
        StepSpec(
            type="STEP_TYPE_X", args=EchoArgs, start=OnWorker(handler="x"), expressions=("nope",)
        )
    with pytest.raises(ValueError, match="handler name"):
        StepSpec(type="STEP_TYPE_X", args=EchoArgs, start=OnWorker(handler=""))
    with pytest.raises(TypeError, match="WaitArgs"):
        StepSpec(type="STEP_TYPE_X", args=EchoArgs, start=InCoordinator.WAIT)
