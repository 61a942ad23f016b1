"""Input schemas: what a definition's `input_schema` may hold, and checking a
run's input against it within a bounded number of steps."""

from __future__ import annotations

import time
import tracemalloc
from typing import Any

import jsonschema
from hypothesis import given, settings
from hypothesis import strategies as st

from ductor_core.input_schemas import (
    MAX_PROBLEMS,
    MAX_SCHEMA_DEPTH,
    check_input,
    input_steps,
    schema_problems,
)
from ductor_core.validation import validate_definition

ORDER = {
    "type": "object",
    "required": ["id", "total"],
    "properties": {
        "id": {"type": "string"},
        "total": {"type": "number", "minimum": 0},
        "tags": {"type": "array", "uniqueItems": True, "items": {"type": "string"}},
    },
}


def pointers(schema: Any) -> list[str]:
    return [p.pointer for p in schema_problems(schema)]


def test_a_valid_schema_has_no_problem() -> None:
    assert schema_problems(ORDER) == []
    local = {"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"}
    assert schema_problems(local) == []
    assert schema_problems({"$schema": "http://json-schema.org/draft-07/schema#"}) == []


def test_a_schema_is_checked_against_its_meta_schema() -> None:
    assert pointers({"properties": {"a": {"type": "text"}}}) == ["/properties/a/type"]
    assert pointers({"required": "id"}) == ["/required"]


def test_nothing_may_reach_outside_the_schema() -> None:
    assert pointers({"$ref": "https://example.com/x.json"}) == ["/$ref"]
    assert pointers({"$ref": "other.json#/a"}) == ["/$ref"]
    assert pointers({"$ref": "#/$defs/missing"}) == ["/$ref"]
    assert pointers({"$id": "https://example.com/"}) == ["/$id"]
    assert pointers({"$defs": {"a": {"$dynamicRef": "#x"}}}) == ["/$defs/a/$dynamicRef"]
    # A property named like a keyword is a property, not a keyword.
    assert pointers({"properties": {"$id": {"type": "string"}}}) == []


def test_patterns_are_re2_and_bounded() -> None:
    assert pointers({"pattern": "^(a+)+$"}) == []
    assert pointers({"pattern": "(?=a)"}) == ["/pattern"]
    assert pointers({"pattern": r"(a)\1"}) == ["/pattern"]
    assert pointers({"pattern": "a" * 1001}) == ["/pattern"]
    assert pointers({"patternProperties": {"^a": {}}}) == ["/patternProperties"]


def test_a_schema_is_bounded_in_size_and_depth() -> None:
    assert pointers({"enum": ["x" * 1000] * 70}) == [""]
    deep: dict[str, Any] = {}
    for _ in range(MAX_SCHEMA_DEPTH):
        deep = {"not": deep}
    assert pointers(deep) == [""]


def test_definition_validation_reports_schema_problems_with_pointers() -> None:
    definition = {
        "family_slug": "f",
        "input_schema": {"type": "object", "properties": {"a": {"$ref": "http://x/"}}},
        "steps": [{"ref": "a", "type": "STEP_TYPE_WAIT", "args": {"duration": "1s"}}],
    }
    problems = validate_definition(definition).problems
    assert [(p.code, p.pointer) for p in problems] == [
        ("definition.bad_input_schema", "/input_schema/properties/a/$ref")
    ]


def test_an_input_is_checked_with_a_pointer_per_problem() -> None:
    found = check_input(ORDER, {"total": "x", "tags": ["a", "b", "a"]})
    assert not found.valid
    assert [p.pointer for p in found.problems] == ["/input/id", "/input/total", "/input/tags/2"]
    assert check_input(ORDER, {"id": "o", "total": 1.5}).valid


def test_messages_name_json_values_as_json_spells_them() -> None:
    # A caller sent JSON: null, true and false, not Python's None, True and False.
    found = check_input(ORDER, None)
    assert [p.message for p in found.problems] == ["null is not of type 'object'"]
    found = check_input(ORDER, {"id": True, "total": False})
    assert [p.message for p in found.problems] == [
        "true is not of type 'string'",
        "false is not of type 'number'",
    ]
    found = check_input({"type": "object"}, "None")
    assert [p.message for p in found.problems] == ["'None' is not of type 'object'"]


def test_unique_items_follows_json_equality() -> None:
    schema = {"uniqueItems": True}
    assert not check_input(schema, [1, 1.0]).valid
    assert check_input(schema, [1, True]).valid
    assert not check_input(schema, [{"a": [1]}, {"a": [1]}]).valid
    # Linear: a large array of objects is checked at once.
    began = time.perf_counter()
    assert check_input(schema, [{"n": i} for i in range(50_000)]).valid
    assert time.perf_counter() - began < 5


def test_problems_and_messages_are_bounded() -> None:
    found = check_input({"items": {"type": "integer"}}, ["x" * 10_000] * 100)
    assert len(found.problems) == MAX_PROBLEMS
    assert all(len(p.message) <= 200 for p in found.problems)


def test_an_exponential_check_stops_after_its_steps() -> None:
    branch = {"type": "array", "items": {"$ref": "#/$defs/n"}}
    bomb = {"$defs": {"n": {"anyOf": [branch, branch, {"type": "string"}]}}, "$ref": "#/$defs/n"}
    assert schema_problems(bomb) == []
    nested: Any = True
    for _ in range(60):
        nested = [nested]
    found = check_input(bomb, nested)
    assert not found.complete
    assert not found.valid
    assert "steps" in found.problems[-1].message
    assert input_steps(nested) < 12_000


def test_messages_quoting_a_large_input_are_paid_for_as_they_are_made() -> None:
    # Each branch's "is not of type" quotes the whole input; the branches' errors
    # used to be made and kept unpaid: 300 copies of the input here, 3,000 (and
    # gigabytes, for seconds) with a schema at its size limit.
    schema = {"anyOf": [{"type": "integer"}] * 300}
    tracemalloc.start()
    try:
        found = check_input(schema, "x" * 200_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not found.valid
    assert "steps" in found.problems[-1].message
    assert peak < 10 * 200_000


def test_a_reference_loop_is_refused_at_publish() -> None:
    # Checking an input against one recursed until Python's limit, which the
    # referencing library then hit inside Rust code and panicked: a 500 on every run.
    loop = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
    assert pointers(loop) == ["/$defs/b/$ref"]
    assert pointers({"$ref": "#"}) == ["/$ref"]
    assert pointers({"anyOf": [{"type": "string"}, {"$ref": "#"}]}) == ["/anyOf/1/$ref"]
    assert pointers({"if": {"type": "string"}, "then": {"not": {"$ref": "#"}}}) == [
        "/then/not/$ref"
    ]
    assert pointers({"dependentSchemas": {"a": {"$ref": "#"}}}) == ["/dependentSchemas/a/$ref"]
    closed_by_all_of = {"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}
    assert pointers(closed_by_all_of) == ["/$defs/a/allOf/0/$ref"]
    # Each round reads a smaller part of the input: not a loop.
    tree = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}}
    assert pointers(tree) == []
    assert check_input(tree, {"kids": [{"kids": [{"kids": 1}]}]}).problems[0].pointer == (
        "/input/kids/0/kids/0/kids"
    )
    # A draft-07 `$ref` makes its siblings ignored, so this `allOf` never runs.
    siblings = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "definitions": {"x": {"type": "string"}},
        "$ref": "#/definitions/x",
        "allOf": [{"$ref": "#"}],
    }
    assert pointers(siblings) == []
    # Published before this check: not run, as every schema refused today.
    assert check_input(loop, 1).valid


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-5, 5) | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4)
    ),
    max_leaves=12,
)
SCHEMAS = st.sampled_from(
    [
        ORDER,
        {"type": "array", "items": {"type": ["string", "null"]}, "maxItems": 3},
        {"anyOf": [{"type": "integer"}, {"type": "object", "required": [""]}]},
        {"oneOf": [{"type": "number"}, {"minimum": 0}]},
        {"not": {"type": "boolean"}, "const": None},
        {"type": "object", "additionalProperties": {"type": "string", "pattern": "^[a-c]*$"}},
        {"type": "array", "uniqueItems": True},
        {"propertyNames": {"maxLength": 1}, "minProperties": 1},
    ]
)


@settings(max_examples=300, deadline=None)
@given(SCHEMAS, JSON)
def test_the_check_agrees_with_the_library(schema: dict[str, Any], value: Any) -> None:
    assert check_input(schema, value).valid == jsonschema.Draft202012Validator(schema).is_valid(
        value
    )


def test_a_schema_refused_today_is_not_run() -> None:
    # A version published before these checks may hold one: its runs start as before.
    legacy = {"patternProperties": {"^(a+)+$": {"type": "integer"}}, "minLength": "x"}
    assert schema_problems(legacy)
    assert check_input(legacy, {"a" * 50 + "!": "x"}).valid
