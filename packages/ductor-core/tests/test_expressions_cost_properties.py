"""Properties of the cost estimate: monotone, and a true bound of what cel-python does.

Expressions are generated from a small grammar (literals, variables, the
operators, string functions, list literals and every comprehension macro).
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ductor_core.errors import ExpressionError
from ductor_core.expressions import CelPyEngine, CostEstimate, CostLimits, estimate_cost

leaves = st.sampled_from(
    [
        "0",
        "1",
        "2.5",
        "'a'",
        "'abc'",
        "true",
        "null",
        "x",
        "v.i",
        "v.s",
        "v.l",
        "v.m",
        "v.ls",
        "[1, 2, 3]",
        "['p', 'q']",
    ]
)


def _extend(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    operators = st.sampled_from(["+", "-", "*", "==", "!=", "<", "&&", "||", "in"])
    functions = st.sampled_from(["size", "string", "lower", "upper", "trim", "dyn"])
    methods = st.sampled_from(["contains", "startsWith", "matches"])
    macros = st.sampled_from(["map", "filter", "all", "exists", "exists_one"])
    return (
        st.tuples(children, operators, children).map(lambda t: f"({t[0]} {t[1]} {t[2]})")
        | st.tuples(children, children, children).map(lambda t: f"({t[0]} ? {t[1]} : {t[2]})")
        | st.tuples(functions, children).map(lambda t: f"{t[0]}({t[1]})")
        | st.tuples(children, methods, children).map(lambda t: f"({t[0]}).{t[1]}({t[2]})")
        | st.tuples(children, children).map(lambda t: f"split({t[0]}, ',') + [{t[1]}]")
        | st.tuples(children, children).map(lambda t: f"join([{t[0]}, {t[1]}], '-')")
        | st.lists(children, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]")
        | st.tuples(children, macros, children).map(lambda t: f"({t[0]}).{t[1]}(x, {t[2]})")
    )


expressions = st.recursive(leaves, _extend, max_leaves=10)

# celpy raises Python's recursion limit when its first environment is made;
# make it now, not inside a test (hypothesis warns about the change).
CelPyEngine()

# Wrappers that keep the wrapped value in their result, and ones that only
# test it. `w` is never a generated name, so wrapping binds nothing inside.
KEEPING = [
    "[1, 2, 3].map(w, {e})",
    "v.l.map(w, {e})",
    "v.l.map(w, true, {e})",
    "[{e}]",
    "true ? {e} : 1",
    "{{'k': {e}}}",
]
TESTING = [
    "v.l.all(w, {e})",
    "v.l.exists(w, {e})",
    "[1, 2].exists_one(w, {e})",
    "v.l.filter(w, {e})",
]


def estimate(source: str, limits: CostLimits | None = None) -> CostEstimate:
    try:
        return estimate_cost(source, limits)
    except ExpressionError:
        assume(False)
        raise  # never reached: assume(False) stops the example


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(source=expressions, wrapper=st.sampled_from(KEEPING + TESTING))
def test_wrapping_an_expression_never_lowers_its_cost(source: str, wrapper: str) -> None:
    inner = estimate(source)
    outer = estimate(wrapper.format(e=source))
    if wrapper in KEEPING:
        assert outer.cost >= inner.cost, (source, wrapper)
    else:
        # A test's value is not handed back: only evaluating it counts.
        assert outer.cost >= inner.cost - inner.result_cost, (source, wrapper)
    assert outer.longest_string >= inner.longest_string
    assert outer.longest_list >= inner.longest_list


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    source=expressions,
    items=st.integers(min_value=1, max_value=300),
    chars=st.integers(min_value=1, max_value=3000),
    more_items=st.integers(min_value=0, max_value=300),
    more_chars=st.integers(min_value=0, max_value=3000),
)
def test_bigger_variables_never_make_an_expression_cheaper(
    source: str, items: int, chars: int, more_items: int, more_chars: int
) -> None:
    # What makes the check before an evaluation sound: the sizes it finds
    # are at least the assumed ones, so its estimate is at least as high.
    small = estimate(source, CostLimits(assumed_items=items, assumed_chars=chars))
    big = estimate(
        source,
        CostLimits(assumed_items=items + more_items, assumed_chars=chars + more_chars),
    )
    assert big.cost >= small.cost
    assert big.longest_string >= small.longest_string
    assert big.longest_list >= small.longest_list


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(source=expressions, extra=st.integers(min_value=1, max_value=20))
def test_a_longer_range_never_costs_less(source: str, extra: int) -> None:
    short = estimate(f"[1, 2].map(w, {source})")
    long = estimate(f"[{', '.join(['1'] * (2 + extra))}].map(w, {source})")
    assert long.cost > short.cost


def _variables(draw: st.DrawFn) -> dict[str, Any]:
    text = st.text(alphabet="ab,c ", max_size=12)
    return {
        "v": {
            "i": draw(st.integers(min_value=-5, max_value=5)),
            "s": draw(text),
            "l": draw(st.lists(st.integers(min_value=0, max_value=9), max_size=6)),
            "ls": draw(st.lists(text, max_size=6)),
            "m": draw(st.dictionaries(st.sampled_from("abc"), st.integers(), max_size=3)),
        },
        "x": draw(st.one_of(st.integers(min_value=0, max_value=3), text)),
    }


variables = st.composite(_variables)()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(source=expressions, activation=variables)
def test_an_accepted_expression_evaluates_within_its_estimate_on_cel_python(
    source: str, activation: dict[str, Any]
) -> None:
    # The engine's budget is exactly the estimate, so its step limit is the
    # default multiple of it; if the estimate missed work that cel-python
    # does, the evaluation would run out of steps.
    cost = estimate(source, CostLimits(max_cost=20_000)).cost
    assume(cost <= 20_000)
    engine = CelPyEngine(limits=CostLimits(max_cost=cost))
    try:
        engine.evaluate(source, activation)
    except ExpressionError as exc:
        code = exc.code
    else:
        code = "value"
    # Type errors and the like are fine; running out of steps is not.
    assert code in ("value", "expression.evaluation"), source
