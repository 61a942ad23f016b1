from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ductor_core import (
    DefinitionError,
    Edge,
    Problem,
    Step,
    ValidationReport,
    WorkflowDefinition,
    decode_definition,
    default_engine,
    definition_from_obj,
    validate_definition,
    validate_definition_json,
)
from ductor_core.expressions import (
    BoundVariables,
    CompiledExpression,
    ExpressionEngine,
    FunctionRegistry,
)

DATA = Path(__file__).parent / "data"
HELLO = (DATA / "hello-world.json").read_bytes()
VALID = sorted((DATA / "valid").glob("*.json"))


def _codes(report: ValidationReport) -> list[tuple[str, str]]:
    return [(p.code, p.pointer) for p in report.problems]


def test_seed_hello_world_validates_clean_in_every_form() -> None:
    assert validate_definition(json.loads(HELLO)) == ValidationReport(valid=True, problems=[])
    assert validate_definition(decode_definition(HELLO)).valid
    assert validate_definition_json(HELLO).valid


@pytest.mark.parametrize("path", VALID, ids=[p.stem for p in VALID])
def test_rich_valid_definitions_validate_clean_and_decode(path: Path) -> None:
    raw = json.loads(path.read_text())
    report = validate_definition(raw)
    assert report.problems == []
    assert report.valid
    definition = definition_from_obj(raw)
    for step in definition.steps:
        step.typed_args()
    assert validate_definition(definition).valid


def test_valid_corpus_covers_every_step_and_edge_type() -> None:
    step_types: set[str] = set()
    edge_types: set[str] = set()
    for path in VALID:
        raw = json.loads(path.read_text())
        step_types |= {s["type"] for s in raw["steps"]}
        edge_types |= {e.get("type", "EDGE_TYPE_SUCCESS") for e in raw.get("edges", [])}
    assert len(step_types) == 11
    assert len(edge_types) == 4


def _hello(**changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(HELLO)
    raw.update(changes)
    return raw


def test_messages_name_the_step_and_what_is_wrong() -> None:
    raw = _hello()
    raw["steps"][1]["args"] = {}
    (problem,) = validate_definition(raw).problems
    assert problem == Problem(
        code="definition.bad_args",
        message="step 'pause': WAIT needs exactly one of 'duration' or 'until'",
        pointer="/steps/1/args",
    )


def test_cycle_message_shows_the_path_and_points_at_an_edge_of_it() -> None:
    raw = _hello()
    raw["steps"].append({"ref": "again", "type": "STEP_TYPE_WAIT", "args": {"duration": "1s"}})
    raw["edges"] += [
        {"source_ref": "pause", "target_ref": "again"},
        {"source_ref": "again", "target_ref": "pause"},
    ]
    (problem,) = validate_definition(raw).problems
    assert problem.code == "definition.cycle"
    assert "pause -> again -> pause" in problem.message
    assert problem.pointer == "/edges/2"


def test_unknown_names_come_with_a_suggestion() -> None:
    raw = _hello()
    raw["steps"][1]["type"] = "STEP_TYPE_WAITT"
    raw["steps"][0]["tiltle"] = "x"
    messages = [p.message for p in validate_definition(raw).problems]
    assert "did you mean 'title'?" in messages[0]
    assert "did you mean 'STEP_TYPE_WAIT'?" in messages[1]


def test_bad_expression_message_is_one_line_with_position() -> None:
    raw = _hello()
    raw["steps"][0]["args"]["project"]["message"] = '"hello" +'
    (problem,) = validate_definition(raw).problems
    assert problem.code == "definition.bad_expression"
    assert problem.pointer == "/steps/0/args/project/message"
    assert "column" in problem.message
    assert "\n" not in problem.message


def test_unknown_function_is_a_bad_expression() -> None:
    raw = _hello(output="no_such_function(steps)")
    assert _codes(validate_definition(raw)) == [("definition.bad_expression", "/output")]


def test_gather_may_follow_its_scatter_through_any_path() -> None:
    raw = _hello()
    raw["steps"] += [
        {
            "ref": "fan",
            "type": "STEP_TYPE_SCATTER",
            "args": {
                "items": "input.xs",
                "step": {
                    "type": "STEP_TYPE_ROUTE",
                    "args": {"kind": "k", "attributes": {"x": "item"}},
                },
            },
        },
        {"ref": "mid", "type": "STEP_TYPE_WAIT", "args": {"duration": "1s"}},
        {"ref": "collect", "type": "STEP_TYPE_GATHER", "args": {"scatter": "fan"}},
    ]
    raw["edges"] += [
        {"source_ref": "pause", "target_ref": "fan"},
        {"source_ref": "fan", "target_ref": "mid", "type": "EDGE_TYPE_ALWAYS"},
        {"source_ref": "mid", "target_ref": "collect", "type": "EDGE_TYPE_FAILURE"},
    ]
    assert validate_definition(raw).valid
    raw["edges"].pop()
    assert _codes(validate_definition(raw)) == [("definition.bad_args", "/steps/4/args/scatter")]


def test_not_json_is_one_malformed_problem() -> None:
    report = validate_definition_json(b'{"family_slug": ')
    assert _codes(report) == [("definition.malformed", "")]
    assert not report.valid


def test_raise_for_problems_carries_every_problem() -> None:
    validate_definition(json.loads(HELLO)).raise_for_problems()
    report = validate_definition(_hello(family_slug="Bad Slug", output=""))
    with pytest.raises(DefinitionError) as info:
        report.raise_for_problems()
    assert info.value.code == "definition.invalid"
    assert "and 1 more problem" in info.value.message
    assert [p["code"] for p in info.value.details] == [
        "definition.bad_slug",
        "definition.bad_output",
    ]


def test_report_encodes_to_the_wire_shape() -> None:
    report = validate_definition(_hello(family_slug="X"))
    wire = json.loads(msgspec.json.encode(report))
    assert wire["valid"] is False
    assert wire["problems"][0]["code"] == "definition.bad_slug"
    assert set(wire["problems"][0]) == {"code", "message", "pointer"}


class _CountingEngine:
    """A real engine that counts how often each source is compiled."""

    name = "counting"

    def __init__(self) -> None:
        self.inner = default_engine()
        self.compiled: Counter[str] = Counter()

    def compile(self, source: str) -> CompiledExpression:
        self.compiled[source] += 1
        return self.inner.compile(source)

    @property
    def functions(self) -> FunctionRegistry:
        return self.inner.functions

    def evaluate(self, source: str, activation: Any) -> Any:
        return self.inner.evaluate(source, activation)

    def bind(self, activation: Mapping[str, Any]) -> BoundVariables:
        return self.inner.bind(activation)


def test_uses_the_given_engine_and_compiles_each_source_once() -> None:
    raw = _hello(output={"a": "steps.greet.output", "b": "steps.greet.output"})
    raw["edges"][0] = {
        "source_ref": "greet",
        "target_ref": "pause",
        "type": "EDGE_TYPE_CONDITION",
        "condition": "steps.greet.output != null",
    }
    engine = _CountingEngine()
    assert isinstance(engine, ExpressionEngine)
    assert validate_definition(raw, engine=engine).valid
    assert engine.compiled == {
        '"hello"': 1,
        "steps.greet.output != null": 1,
        "steps.greet.output": 1,
    }


def test_a_definition_built_in_code_is_checked_too() -> None:
    definition = WorkflowDefinition(
        family_slug="built",
        steps=[
            Step(ref="a", type="STEP_TYPE_WAIT", args={"duration": "soon"}),
            Step(ref="b c", type="STEP_TYPE_NOTIFY", args={"recipients": "'x'"}),
        ],
        edges=[Edge(source_ref="a", target_ref="b c", condition="true")],
    )
    assert _codes(validate_definition(definition)) == [
        ("definition.bad_duration", "/steps/0/args/duration"),
        ("definition.bad_ref", "/steps/1/ref"),
        ("definition.bad_args", "/steps/1/args/title"),
        ("definition.condition_unexpected", "/edges/0/condition"),
    ]


def test_step_reads_skip_strings_and_other_fields_but_see_brackets() -> None:
    raw = _hello()
    raw["steps"][1]["args"] = {
        "until": "timestamp(\"steps.ghost\" + 'steps.ghost' + string(input.steps.ghost))"
    }
    assert validate_definition(raw).valid
    raw["steps"][1]["args"] = {"until": "timestamp(steps['greet'].output + steps[\"ghost\"])"}
    assert _codes(validate_definition(raw)) == [
        ("definition.bad_step_reference", "/steps/1/args/until")
    ]
    assert "there is no step 'ghost'" in validate_definition(raw).problems[0].message


def test_step_reads_are_not_judged_on_a_cyclic_graph() -> None:
    raw = _hello()
    raw["steps"][0]["args"]["project"]["back"] = "steps.pause.output"
    raw["edges"].append({"source_ref": "pause", "target_ref": "greet"})
    codes = [code for code, _ in _codes(validate_definition(raw))]
    assert "definition.cycle" in codes
    assert "definition.bad_step_reference" not in codes


def test_a_notify_feed_is_1_to_64_letters_digits_or_punctuation_as_the_inbox_api_takes() -> None:
    def feed_problems(feed: str) -> list[tuple[str, str]]:
        raw = _hello()
        raw["steps"][1] = {
            "ref": "pause",
            "type": "STEP_TYPE_NOTIFY",
            "args": {"recipients": "'ann'", "title": "'hi'", "feed": feed},
        }
        return _codes(validate_definition(raw))

    for feed in ("-x", "_x", ".x", ":", "a" * 64, "team.ops:alerts"):
        assert feed_problems(feed) == [], feed
    for feed in ("", "no spaces", "a" * 65, "é"):
        assert feed_problems(feed) == [("definition.bad_args", "/steps/1/args/feed")], feed


def test_a_notify_literal_link_or_label_a_client_cannot_render_safely_is_refused() -> None:
    def problems(avatar: str, label: str, url: str) -> list[tuple[str, str]]:
        raw = _hello()
        ctas = [{"label": label, "url": url}]
        args = {"recipients": "'ann'", "title": "'hi'", "avatar": avatar, "ctas": ctas}
        raw["steps"][1] = {"ref": "pause", "type": "STEP_TYPE_NOTIFY", "args": args}
        return _codes(validate_definition(raw))

    avatar, label, url = "'https://img.example/a.png'", "'Open'", '"http://shop.example/o/1"'
    assert problems(avatar, label, url) == []
    # An expression is judged when the step runs; a string literal already now.
    assert problems("input.avatar", "input.label", "'javascript:' + input.x") == []
    at = "/steps/1/args"
    for bad in ("'javascript:alert(1)'", "r'data:text/html,x'", "'/o/1'", "'https://a b'"):
        assert problems(bad, label, url) == [("definition.bad_args", f"{at}/avatar")], bad
        assert problems(avatar, label, bad) == [("definition.bad_args", f"{at}/ctas/0/url")], bad
    too_long = "'https://shop.example/" + "x" * 2028 + "'"
    assert problems(avatar, label, too_long) == [("definition.bad_args", f"{at}/ctas/0/url")]
    for bad in ("''", "'" + "x" * 201 + "'", r"'Open\nnow'", "'''two\nlines'''"):
        assert problems(avatar, bad, url) == [("definition.bad_args", f"{at}/ctas/0/label")], bad
    raw = _hello()
    args = {
        "recipients": "'ann'",
        "title": "'hi'",
        "ctas": [{"label": "'Go'", "url": "'vbscript:x'"}],
    }
    raw["steps"][1] = {"ref": "pause", "type": "STEP_TYPE_NOTIFY", "args": args}
    (problem,) = validate_definition(raw).problems
    assert problem.message == (
        "step 'pause': 'args.ctas[0].url' must be an absolute http or https URL of at most"
        " 2048 characters without whitespace or control characters, got 'vbscript:x'"
    )


def test_a_route_kind_or_pool_no_routable_could_name_is_refused() -> None:
    # POST /v1/route refuses such a kind or pool: the step could only ever fail.
    def problems(**args: str) -> list[tuple[str, str]]:
        raw = _hello()
        raw["steps"][1] = {"ref": "pause", "type": "STEP_TYPE_ROUTE", "args": args}
        return _codes(validate_definition(raw))

    assert problems(kind="k" * 256, pool="p" * 256) == []
    for bad in ("k" * 257, "lead\n", "tab\there", "del\x7f", "nul\x00"):
        assert problems(kind=bad) == [("definition.bad_args", "/steps/1/args/kind")], bad
        assert problems(kind="lead", pool=bad) == [("definition.bad_args", "/steps/1/args/pool")], (
            bad
        )
    raw = _hello()
    raw["steps"][1] = {"ref": "pause", "type": "STEP_TYPE_ROUTE", "args": {"kind": "a\nb"}}
    (problem,) = validate_definition(raw).problems
    assert problem.message == (
        "step 'pause': 'args.kind' holds a control character, which no routing id may: 'a\\nb'"
    )


# --- what each place's expressions may read ---------------------------------------


def test_a_concurrency_key_that_reads_more_than_input_is_refused() -> None:
    # The key is evaluated over the run's input alone (concurrency.key_value).
    raw = _hello(concurrency={"limit": 1, "key": "steps.greet.output.message"})
    (problem,) = validate_definition(raw).problems
    assert problem == Problem(
        code="definition.bad_expression",
        message="concurrency: 'concurrency.key' reads 'steps', but it sees only 'input':"
        " 'steps.greet.output.message'",
        pointer="/concurrency/key",
    )
    for source in ("run.id", "event.data.customer", "input.id + now"):
        raw = _hello(concurrency={"rate": {"limit": 5, "period": "1m"}, "key": source})
        assert _codes(validate_definition(raw)) == [
            ("definition.bad_expression", "/concurrency/key")
        ], source
    assert validate_definition(_hello(concurrency={"limit": 1, "key": "input.customer"})).valid


def test_a_trigger_filter_that_reads_more_than_event_is_refused() -> None:
    # A trigger's filter is evaluated over the event alone, before any run exists.
    raw = _hello(triggers=[{"event": "order.created", "filter": "input.total > 100"}])
    (problem,) = validate_definition(raw).problems
    assert problem == Problem(
        code="definition.bad_expression",
        message="triggers[0]: 'filter' reads 'input', but it sees only 'event':"
        " 'input.total > 100'",
        pointer="/triggers/0/filter",
    )
    raw = _hello(
        triggers=[
            {"event": "a", "filter": "event.data.total > 100"},
            {"event": "b", "filter": "steps.greet.output != null && run.id != ''"},
        ]
    )
    assert _codes(validate_definition(raw)) == [("definition.bad_expression", "/triggers/1/filter")]
    assert "reads 'steps' and 'run'" in validate_definition(raw).problems[0].message


def test_a_step_arg_that_reads_a_variable_no_step_has_is_refused() -> None:
    raw = _hello()
    raw["steps"][0]["args"]["project"] = {"m": "event.data.name", "n": "item + index"}
    raw["steps"][1]["args"] = {"until": "now"}
    problems = validate_definition(raw).problems
    assert [(p.code, p.pointer) for p in problems] == [
        ("definition.bad_expression", "/steps/0/args/project/m"),
        ("definition.bad_expression", "/steps/0/args/project/n"),
        ("definition.bad_expression", "/steps/1/args/until"),
    ]
    assert problems[1].message == (
        "step 'greet': 'args.project.n' reads 'item' and 'index', but it sees only"
        " 'input', 'steps' and 'run': 'item + index'"
    )
    # `output` is a condition's own: the run's output expressions do not see it.
    raw = _hello(output="output")
    assert _codes(validate_definition(raw)) == [("definition.bad_expression", "/output")]


def test_each_place_may_read_what_it_is_given() -> None:
    raw = _hello(
        triggers=[{"event": "go", "filter": "event.data.items.exists(i, i.qty > 0)"}],
        concurrency={"limit": 2, "key": "string(input.customer)"},
        output={"m": "steps.greet.output.message + input.x + run.id"},
    )
    raw["steps"][0]["args"]["project"] = {
        # comprehension variables, type names, functions and google.protobuf types
        "a": "input.xs.map(x, x * 2).filter(y, y > 2).all(z, type(z) == int)",
        "b": "[1, 2].exists_one(n, n == 1) && dyn(input).size() > 0",
        "c": "lower(string(run.now)) + string(google.protobuf.Int64Value{value: 1})",
        "d": "{'k': input}.all(k, v, k != '')",  # the two-variable form: not judged
    }
    raw["steps"].append(
        {
            "ref": "wait",
            "type": "STEP_TYPE_WAIT_FOR_EVENT",
            "args": {
                "event": "ok",
                "match": "event.data.id == input.id && steps.greet.output != 1",
            },
        }
    )
    raw["steps"].append(
        {
            "ref": "fan",
            "type": "STEP_TYPE_SCATTER",
            "args": {
                "items": "input.xs",
                "step": {
                    "type": "STEP_TYPE_DATAFLOW",
                    "args": {
                        "operation": "map",
                        "items": "item.parts",
                        "expression": "[item, index, input]",
                    },
                },
            },
        }
    )
    raw["steps"].append(
        {
            "ref": "kids",
            "type": "STEP_TYPE_SCATTER",
            "args": {
                "items": "input.xs",
                "workflow": {"family_slug": "child"},
                "input": "{'i': index, 'v': item}",
            },
        }
    )
    raw["steps"].append(
        {
            "ref": "keep",
            "type": "STEP_TYPE_DATAFLOW",
            "args": {"operation": "filter", "items": "input.xs", "predicate": "item > index"},
        }
    )
    raw["edges"] = [
        {
            "source_ref": "greet",
            "target_ref": "pause",
            "type": "EDGE_TYPE_CONDITION",
            "condition": "output.message == 'hello' && input.go && run.id != ''",
        },
        {"source_ref": "greet", "target_ref": "wait"},
    ]
    assert validate_definition(raw).problems == []
    # what a SCATTER's items and a top-level DATAFLOW's items see: no item
    raw["steps"][3]["args"]["items"] = "item"
    raw["steps"][5]["args"]["items"] = "index"
    assert _codes(validate_definition(raw)) == [
        ("definition.bad_expression", "/steps/3/args/items"),
        ("definition.bad_expression", "/steps/5/args/items"),
    ]


def test_a_step_type_the_server_adds_is_not_judged_on_its_variables() -> None:
    # Its handler may evaluate its CEL with variables of its own.
    from ductor_core.builtin_steps import BUILTIN_STEP_SPECS
    from ductor_core.step_args import DefinitionStruct
    from ductor_core.step_specs import OnWorker, StepSpec

    class EchoArgs(DefinitionStruct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        message: str

    echo = StepSpec(
        type="STEP_TYPE_ECHO",
        args=EchoArgs,
        start=OnWorker(handler="echo"),
        expressions=("message",),
    )
    raw = _hello()
    raw["steps"][1] = {"ref": "pause", "type": "STEP_TYPE_ECHO", "args": {"message": "reply.text"}}
    assert validate_definition(raw, specs=BUILTIN_STEP_SPECS.with_specs(echo)).valid
