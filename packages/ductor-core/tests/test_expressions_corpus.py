"""The shared CEL corpus: every engine gives the corpus answers, and so each other's."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ductor_core.errors import ExpressionError
from ductor_core.expressions import (
    ENGINE_NAMES,
    CelPyEngine,
    CelRustEngine,
    ExpressionEngine,
)

CORPUS = json.loads((Path(__file__).parent / "data" / "cel_corpus.json").read_text("utf-8"))
CASES: list[dict[str, Any]] = CORPUS["cases"]
ACTIVATIONS: dict[str, dict[str, Any]] = CORPUS["activations"]
AGREED = [case for case in CASES if "differs" not in case]
DIFFERING = [case for case in CASES if "differs" in case]

# Fresh engines (the built-in functions only), shared by the module: the
# corpus is also a test of the compile cache under reuse.
ENGINES: dict[str, ExpressionEngine] = {
    "cel-python": CelPyEngine(),
    "cel-rust": CelRustEngine(),
}


def strictly_equal(a: Any, b: Any) -> bool:
    """Equal values of equal JSON types: 1, 1.0 and True are three answers."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(strictly_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(strictly_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def outcome(engine: ExpressionEngine, case: dict[str, Any]) -> tuple[str, Any]:
    activation = ACTIVATIONS[case.get("activation", "default")]
    try:
        return ("value", engine.evaluate(case["expr"], activation))
    except ExpressionError as exc:
        error = exc
    # Every error names its expression.
    assert error.expression == case["expr"]
    assert repr(case["expr"]) in str(error)
    return ("error", error.code)


def check(engine: ExpressionEngine, case: dict[str, Any], expected: dict[str, Any]) -> None:
    kind, got = outcome(engine, case)
    if "error" in expected:
        assert (kind, got) == ("error", expected["error"]), f"{case['id']}: {case['expr']}"
    elif expected.get("unordered"):
        assert kind == "value", f"{case['id']}: {case['expr']} failed with {got}"
        assert sorted(got) == sorted(expected["expect"])
    else:
        assert kind == "value", f"{case['id']}: {case['expr']} failed with {got}"
        assert strictly_equal(got, expected["expect"]), f"{case['id']}: {got!r}"


def test_corpus_is_broad() -> None:
    groups = Counter(case["id"].rsplit("-", 1)[0] for case in AGREED)
    assert len(AGREED) >= 150
    for group in (
        "arithmetic",
        "numbers",
        "comparisons",
        "logic",
        "strings",
        "lists",
        "maps",
        "has",
        "null",
        "access",
        "time",
        "functions",
        "unknown_functions",
        "syntax",
        "routing",
        "dataflow",
    ):
        assert groups[group] >= 5, group
    codes = Counter(case["error"] for case in AGREED if "error" in case)
    assert set(codes) == {
        "expression.evaluation",
        "expression.syntax",
        "expression.unknown_function",
    }
    assert len({case["id"] for case in CASES}) == len(CASES)


@pytest.mark.parametrize("engine_name", ENGINE_NAMES)
@pytest.mark.parametrize("case", AGREED, ids=lambda case: case["id"])
def test_engine_gives_the_corpus_answer(engine_name: str, case: dict[str, Any]) -> None:
    check(ENGINES[engine_name], case, case)


@pytest.mark.parametrize("case", AGREED, ids=lambda case: case["id"])
def test_engines_agree(case: dict[str, Any]) -> None:
    reference, fast = (outcome(ENGINES[name], case) for name in ENGINE_NAMES)
    assert reference[0] == fast[0]
    if reference[0] == "value":
        assert strictly_equal(reference[1], fast[1])
    else:
        assert reference[1] == fast[1]


@pytest.mark.parametrize("engine_name", ENGINE_NAMES)
@pytest.mark.parametrize("case", DIFFERING, ids=lambda case: case["id"])
def test_known_difference_is_as_documented(engine_name: str, case: dict[str, Any]) -> None:
    # If a library upgrade removes a difference, this fails: move the case up.
    check(ENGINES[engine_name], case, case["engines"][engine_name])
    assert case["differs"]


def test_documented_differences_really_differ() -> None:
    for case in DIFFERING:
        answers = [outcome(ENGINES[name], case) for name in ENGINE_NAMES]
        assert answers[0] != answers[1] or case["engines"]["cel-rust"].get("unordered"), case["id"]
