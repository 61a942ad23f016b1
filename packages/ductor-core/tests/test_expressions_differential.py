"""Differential test: random CEL expressions give the same answer on both engines.

The generator stays clear of the documented differences (errors inside macros,
`string(bool)`, unary minus on non-numbers, non-ASCII `size`) and makes no map
values at all (their iteration order differs, `1` and `true` collide as keys
on cel-python, and cel-rust adds a map to a list); maps are in the corpus.
Everything else must agree, value for value and error code for error code.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ductor_core.errors import ExpressionError
from ductor_core.expressions import CelPyEngine, CelRustEngine, ExpressionEngine

ENGINES: tuple[ExpressionEngine, ExpressionEngine] = (CelPyEngine(), CelRustEngine())
ACTIVATION = {
    "v": {
        "i": 3,
        "d": 2.5,
        "s": "aB",
        "l": [1, "a", 2.0],
        "m": {"k": "v", "n": None},
        "n": None,
        "b": True,
    }
}

scalars = st.sampled_from(
    [
        *(str(n) for n in range(-3, 4)),
        "9223372036854775807",
        "-9223372036854775807",
        "4611686018427387904",
        "0u",
        "2u",
        "18446744073709551615u",
        "0.0",
        "-0.0",
        "0.5",
        "2.0",
        "-1.5",
        "1e300",
        "''",
        "'a'",
        "'ab'",
        "'B'",
        "true",
        "false",
        "null",
        "v.i",
        "v.d",
        "v.s",
        "v.l",
        "v.n",
        "v.b",
        "v.l[0]",
        "v.m.k",
        "v['m']['k']",
        "v.missing",
        "timestamp('2024-03-01T12:30:00Z')",
        "duration('90s')",
        "duration('-1.5s')",
        "b'ab'",
        "'2024-03-01T12:30:00Z'",
        "'1h'",
        "'12'",
        "'-3.5'",
        "'1e3'",
        "v.l[5]",
    ]
)


def _lists(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.lists(children, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]")


def _extend(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    operators = st.sampled_from(
        ["+", "-", "*", "/", "%", "==", "!=", "<", "<=", ">", ">=", "&&", "||", "in"]
    )
    functions = st.sampled_from(
        [
            *("int", "uint", "double", "bytes", "timestamp", "duration"),
            *("lower", "upper", "dyn", "type", "size"),
        ]
    )
    methods = st.sampled_from(["contains", "startsWith", "endsWith", "matches"])
    accessors = st.sampled_from(
        ["getHours", "getMinutes", "getMilliseconds", "getFullYear", "getDayOfWeek"]
    )
    macros = st.sampled_from(
        ["map(x, x)", "filter(x, x == 1)", "map(x, size(x))", "exists_one(x, x == 'a')"]
    )
    return (
        st.tuples(children, operators, children).map(lambda t: f"({t[0]} {t[1]} {t[2]})")
        | st.tuples(children, children, children).map(lambda t: f"({t[0]} ? {t[1]} : {t[2]})")
        | children.map(lambda c: f"!({c})")
        | st.tuples(functions, children).map(lambda t: f"{t[0]}({t[1]})")
        | st.tuples(children, methods, children).map(lambda t: f"({t[0]}).{t[1]}({t[2]})")
        | st.tuples(children, accessors).map(lambda t: f"({t[0]}).{t[1]}()")
        | st.tuples(children, children).map(lambda t: f"{t[0]}[{t[1]}]")
        | st.tuples(_lists(children), macros).map(lambda t: f"{t[0]}.{t[1]}")
        | _lists(children)
    )


expressions = st.recursive(scalars, _extend, max_leaves=8)


def _outcome(engine: ExpressionEngine, source: str) -> tuple[str, Any]:
    try:
        return ("value", engine.evaluate(source, ACTIVATION))
    except ExpressionError as exc:
        return ("error", exc.code)


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(source=expressions)
def test_random_expressions_agree_on_both_engines(source: str) -> None:
    reference, fast = (_outcome(engine, source) for engine in ENGINES)
    assert reference[0] == fast[0], (source, reference, fast)
    if reference[0] == "value":
        assert _same(reference[1], fast[1]), (source, reference, fast)
    else:
        assert reference[1] == fast[1], (source, reference, fast)
