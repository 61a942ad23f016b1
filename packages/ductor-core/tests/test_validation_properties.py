"""Property tests: validation never raises, points at real places, agrees with the
decoder, and passes every well-formed DAG."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ductor_core import (
    BUILTIN_STEP_SPECS,
    DefinitionError,
    StepType,
    decode_args,
    default_engine,
    definition_from_obj,
    validate_definition,
)
from ductor_core.validation import _STEP_READS, PROBLEM_CODES, _step_reads

# Build the engine before any example runs: cel-python raises the recursion
# limit when it is created, which hypothesis would warn about mid-test.
default_engine().compile("1")

DATA = Path(__file__).parent / "data"
SEEDS = [json.loads(p.read_text()) for p in sorted((DATA / "valid").glob("*.json"))]
SEEDS.append(json.loads((DATA / "hello-world.json").read_text()))

_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
_field_names = st.sampled_from(
    [
        "family_slug", "steps", "edges", "triggers", "output", "input_schema", "ref", "type",
        "args", "retry", "timeout", "source_ref", "target_ref", "condition", "duration",
        "until", "operation", "project", "items", "step", "workflow", "scatter", "event",
    ]
)  # fmt: skip


def _resolves(document: Any, pointer: str) -> bool:
    """Whether the pointer's parent exists in the document (a missing field's
    pointer names the place where it belongs)."""
    if pointer == "":
        return True
    assert pointer.startswith("/")
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer[1:].split("/")]
    node = document
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return isinstance(node, dict | list)


def _check_report(document: Any) -> None:
    before = copy.deepcopy(document)
    report = validate_definition(document)
    assert _same(document, before), "validation changed its input"
    assert validate_definition(document) == report, "validation is not deterministic"
    assert report.valid is (not report.problems)
    for problem in report.problems:
        assert problem.code in PROBLEM_CODES
        assert problem.message
        assert _resolves(document, problem.pointer), problem
    _agrees_with_decoder(document, {p.code for p in report.problems}, report.problems)


def _same(a: Any, b: Any) -> bool:
    """Equality that treats NaN as equal to itself (hypothesis draws NaN)."""
    return json.dumps(a, sort_keys=True, default=repr) == json.dumps(
        b, sort_keys=True, default=repr
    )


_STRUCTURAL = {
    "definition.malformed",
    "definition.unknown_field",
    "definition.bad_output",
    "definition.bad_input_schema",
}


def _agrees_with_decoder(document: Any, codes: set[str], problems: list[Any]) -> None:
    """Where validation finds no structural problem, the strict decoder succeeds;
    where the decoder succeeds, validation reports no malformed or unknown field."""
    try:
        definition = definition_from_obj(document)
    except DefinitionError:
        assert codes & _STRUCTURAL
        return
    assert not codes & {"definition.malformed", "definition.unknown_field"}
    for i, step in enumerate(definition.steps):
        try:
            step_type = StepType(step.type)
        except ValueError:
            continue
        under = f"/steps/{i}/args"
        flagged = any(p.pointer.startswith(under) for p in problems)
        try:
            decode_args(step_type, step.args)
        except DefinitionError:
            assert flagged, f"steps[{i}] args do not decode but nothing was reported"


@settings(max_examples=300, deadline=None)
@given(document=_json)
def test_arbitrary_json_never_raises(document: Any) -> None:
    _check_report(document)


@settings(max_examples=200, deadline=None)
@given(document=st.fixed_dictionaries({}, optional={"family_slug": _json, "steps": _json}).flatmap(
    lambda d: st.dictionaries(_field_names, _json, max_size=3).map(lambda extra: {**d, **extra})
))  # fmt: skip
def test_object_shaped_junk_never_raises(document: dict[str, Any]) -> None:
    _check_report(document)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _paths(value, (*prefix, i))
    return found


@st.composite
def _mutated(draw: st.DrawFn) -> Any:
    document = copy.deepcopy(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(document)
        path = draw(st.sampled_from(paths))
        if not path:
            continue
        parent = document
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(_json | _field_names)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(_field_names)] = draw(_json)
        else:
            parent.append(draw(_json))
    return document


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=_mutated())
def test_mutated_valid_definitions_never_raise_and_agree_with_the_decoder(document: Any) -> None:
    _check_report(document)


# --- random valid DAGs ---------------------------------------------------------------

_ARGS: dict[str, list[dict[str, Any]]] = {
    "STEP_TYPE_DATAFLOW": [
        {"operation": "project", "project": {"x": "input.x", "y": "1 + 2"}},
        {"operation": "filter", "items": "input.xs", "predicate": "item > 1"},
        {"operation": "map", "items": "input.xs", "expression": "item * index"},
        {"operation": "merge", "sources": ["input", "{'a': 1}"]},
        {"operation": "pick", "source": "input", "keys": ["a", "b"]},
    ],
    "STEP_TYPE_WAIT": [{"duration": "2s"}, {"until": "timestamp('2030-01-01T00:00:00Z')"}],
    "STEP_TYPE_WAIT_FOR_EVENT": [{"event": "order.shipped", "match": "true", "timeout": "7d"}],
    "STEP_TYPE_WAIT_FOR_SIGNAL": [{"signal": "approve"}, {"signal": "go", "timeout": "1h"}],
    "STEP_TYPE_ACTION": [{"action": "http.post", "params": {"body": "input"}}],
    "STEP_TYPE_SUBWORKFLOW": [{"family_slug": "child", "version": 2, "input": "input"}],
    "STEP_TYPE_BRIDGE": [{"app_id": "billing", "workflow": "charge", "input": "input.order"}],
    "STEP_TYPE_ROUTE": [
        {"kind": "lead", "attributes": {"score": "input.score"}, "price": "100"},
        {"kind": "ticket", "await_completion": True, "timeout": "1d"},
    ],
    "STEP_TYPE_NOTIFY": [
        {"recipients": "'ops'", "title": "'hi'", "body": "'there'"},
        {
            "recipients": "['a', 'b']",
            "title": "'hi'",
            "feed": "approvals",
            "ctas": [
                {"label": "'Approve'", "action": "approve"},
                {"label": "'Open'", "url": "'https://shop.example/o'"},
            ],
            "await_action": True,
            "timeout": "1h",
        },
    ],
    "STEP_TYPE_SCATTER": [
        {"items": "input.xs", "step": {"type": "STEP_TYPE_ACTION", "args": {"action": "a"}}},
        {"items": "input.xs", "workflow": {"family_slug": "per-item"}, "max_concurrency": 3},
    ],
}
# The step options each built-in type uses (NOTIFY's `timeout` only with `await_action`).
_OPTIONS = {spec.type: spec.options for spec in BUILTIN_STEP_SPECS}
_EDGE_TYPES = ["EDGE_TYPE_SUCCESS", "EDGE_TYPE_FAILURE", "EDGE_TYPE_ALWAYS", "EDGE_TYPE_CONDITION"]


def _uses(step: dict[str, Any], option: str) -> bool:
    if option not in _OPTIONS[step["type"]]:
        return False
    return step["type"] != "STEP_TYPE_NOTIFY" or step["args"].get("await_action") is True


@st.composite
def _valid_dag(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 14))
    refs = [f"s{i}" for i in range(n)]
    steps: list[dict[str, Any]] = []
    edges: dict[tuple[int, int, str], dict[str, Any]] = {}
    scatters: list[int] = []
    for i, ref in enumerate(refs):
        kind = draw(st.sampled_from([*sorted(_ARGS), "STEP_TYPE_GATHER"]))
        if kind == "STEP_TYPE_GATHER" and not scatters:
            kind = "STEP_TYPE_NOTIFY"
        if kind == "STEP_TYPE_GATHER":
            scatter = draw(st.sampled_from(scatters))
            args: dict[str, Any] = {"scatter": refs[scatter]}
            edges[(scatter, i, "EDGE_TYPE_SUCCESS")] = {
                "source_ref": refs[scatter],
                "target_ref": ref,
            }
        else:
            args = copy.deepcopy(draw(st.sampled_from(_ARGS[kind])))
        if kind == "STEP_TYPE_SCATTER":
            scatters.append(i)
        step: dict[str, Any] = {"ref": ref, "type": kind, "args": args}
        if _uses(step, "retry") and draw(st.booleans()):
            step["retry"] = {"max_attempts": draw(st.integers(1, 5)), "max_interval": "10m"}
        if _uses(step, "timeout") and draw(st.booleans()):
            step["timeout"] = "1h"
        steps.append(step)
    # edges only go forward in creation order, so the graph is acyclic
    for j in range(1, n):
        for i in draw(st.sets(st.integers(0, j - 1), max_size=3)):
            edge_type = draw(st.sampled_from(_EDGE_TYPES))
            edge: dict[str, Any] = {"source_ref": refs[i], "target_ref": refs[j], "type": edge_type}
            if edge_type == "EDGE_TYPE_CONDITION":
                edge["condition"] = f"steps.{refs[i]}.output != null"
            edges[(i, j, edge_type)] = edge
    # what each step may read: the steps some path of edges leads from
    before: list[set[int]] = [set() for _ in refs]
    for i, j, _ in sorted(edges, key=lambda key: key[1]):
        before[j] |= before[i] | {i}
    for j, step in enumerate(steps):
        if step["type"] == "STEP_TYPE_ACTION" and before[j]:
            read = refs[draw(st.sampled_from(sorted(before[j])))]
            step["args"]["params"]["read"] = f"steps.{read}.output"
    order = draw(st.permutations(steps))
    edge_list = draw(st.permutations(list(edges.values())))
    return {
        "family_slug": draw(st.from_regex(r"[a-z0-9][a-z0-9-]{0,20}", fullmatch=True)),
        "steps": order,
        "edges": edge_list,
        "output": {ref: f"steps.{ref}.output" for ref in refs[-2:]},
        "description": json.dumps([sorted(refs[i] for i in b) for b in before]),
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(definition=_valid_dag())
def test_any_well_formed_dag_validates_clean(definition: dict[str, Any]) -> None:
    report = validate_definition(definition)
    assert report.problems == []
    decoded = definition_from_obj(definition)
    assert validate_definition(decoded).valid


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(definition=_valid_dag(), data=st.data())
def test_reading_a_step_that_is_not_before_is_the_one_problem(
    definition: dict[str, Any], data: st.DataObject
) -> None:
    before: list[list[str]] = json.loads(definition["description"])
    position = {step["ref"]: k for k, step in enumerate(definition["steps"])}
    choices = [
        (reader, other)
        for reader in position
        for other in position
        if other not in before[int(reader[1:])]
        # a GATHER may name a SCATTER, which must stay one
        and definition["steps"][position[reader]]["type"] != "STEP_TYPE_SCATTER"
    ]
    assume(choices)
    reader, other = data.draw(st.sampled_from(choices))
    step = definition["steps"][position[reader]]
    step["type"], step["args"] = "STEP_TYPE_NOTIFY", {"recipients": "'a'", "title": "'t'"}
    step.pop("retry", None)
    step.pop("timeout", None)
    step["args"]["body"] = f"string(steps['{other}'].output)"
    pointer = f"/steps/{position[reader]}/args/body"
    got = [(p.code, p.pointer) for p in validate_definition(definition).problems]
    assert got == [("definition.bad_step_reference", pointer)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(definition=_valid_dag(), data=st.data())
def test_a_step_option_its_type_ignores_is_the_one_problem(
    definition: dict[str, Any], data: st.DataObject
) -> None:
    k = data.draw(st.integers(0, len(definition["steps"]) - 1))
    option = data.draw(st.sampled_from(["retry", "timeout"]))
    step = definition["steps"][k]
    step[option] = {"max_attempts": 2} if option == "retry" else "30s"
    got = [(p.code, p.pointer) for p in validate_definition(definition).problems]
    if _uses(step, option):
        assert got == []
    else:
        assert got == [("definition.bad_step_option", f"/steps/{k}/{option}")]


_cel_words = st.sampled_from(["steps", ".", "a", "b_1", " ", "[", "]", "x", "(", ")", "+", "_"])


@settings(max_examples=300, deadline=None)
@given(words=st.lists(_cel_words, max_size=12))
def test_quick_and_full_step_read_scans_agree(words: list[str]) -> None:
    source = "".join(words)
    full = [m.group("field") for m in _STEP_READS.finditer(source) if m.group("field")]
    assert _step_reads(source) == list(dict.fromkeys(full))
