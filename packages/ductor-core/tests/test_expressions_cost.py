"""Cost limits: the static estimate, its limits and errors, and each engine's runtime limits."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

from ductor_core.errors import ExpressionError
from ductor_core.expressions import (
    DEFAULT_COST_LIMITS,
    ENGINE_NAMES,
    CelPyEngine,
    CelRustEngine,
    CelRustProgram,
    CostLimits,
    ExpressionEngine,
    FunctionRegistry,
    builtin_registry,
    estimate_cost,
)
from ductor_core.expressions._cost import CostAnalysis, regex_weight
from ductor_core.expressions._engine_base import CachedEngine

EngineFactory = Callable[..., ExpressionEngine]
FACTORIES: dict[str, EngineFactory] = {"cel-python": CelPyEngine, "cel-rust": CelRustEngine}


@pytest.fixture(params=ENGINE_NAMES)
def factory(request: pytest.FixtureRequest) -> EngineFactory:
    return FACTORIES[request.param]


def refusal(engine: ExpressionEngine, source: str, activation: Any = None) -> ExpressionError:
    """The too_costly error compiling (or, with an activation, evaluating) `source`."""

    def attempt() -> None:
        if activation is None:
            engine.compile(source)
        else:
            engine.evaluate(source, activation)

    with pytest.raises(ExpressionError) as info:
        attempt()
    error = info.value
    assert error.code == "expression.too_costly", str(error)
    assert error.expression == source
    assert repr(source) in str(error)
    return error


def cost(source: str, **limits: int) -> int:
    return estimate_cost(source, CostLimits(**limits)).cost


def chain(terms: int) -> str:
    return "1" + " + 1" * (terms - 1)


# ------------------------------------------------------------ the estimate


def test_every_node_costs_at_least_one() -> None:
    assert cost("1") == 1
    assert cost("1 + 2") == 3
    assert cost("-1") == 2
    assert cost("true && false || true") == 5
    assert cost("[1, 2, 3]") == 4 + 1  # the list, its items, and copying it out
    assert cost("size('abc')") == 2


def test_a_comprehension_multiplies_its_body_by_the_size_of_its_range() -> None:
    three = cost("[1, 2, 3].map(x, x * 2)")
    six = cost("[1, 2, 3, 4, 5, 6].map(x, x * 2)")
    body = 3 + 1  # `x * 2` and one unit per run
    assert six - three == 3 * body + 3  # three more items: more runs, more literals
    nested = cost("[1, 2, 3].map(x, [1, 2, 3].map(y, x * y))")
    assert nested > 3 * cost("[1, 2, 3].map(y, 2 * y)")


@pytest.mark.parametrize(
    "macro",
    [
        "all(x, x > 0)",
        "exists(x, x > 0)",
        "exists_one(x, x > 0)",
        "existsOne(x, x > 0)",
        "map(x, x + 1)",
        "map(x, x > 0, x + 1)",
        "filter(x, x > 0)",
    ],
)
def test_every_macro_is_a_comprehension(macro: str) -> None:
    # Each item added to the range adds at least the body (3 units) and a run.
    two = cost(f"[1, 2].{macro}")
    forty = cost(f"[{', '.join(['1'] * 40)}].{macro}")
    assert forty - two >= 38 * 4
    assert cost(f"input.{macro}", assumed_items=20) - cost(f"input.{macro}", assumed_items=10) >= 40


def test_lists_from_variables_have_the_assumed_size() -> None:
    source = "input.items.map(x, x.price * 2)"
    assert cost(source, assumed_items=10) < cost(source, assumed_items=1000)
    estimate = estimate_cost(source, CostLimits(assumed_items=7, assumed_chars=11))
    assert (estimate.assumed_items, estimate.assumed_chars) == (7, 11)
    # Items of a list from a variable are themselves of the assumed size.
    nested = "input.a.map(x, x.map(y, y))"
    assert cost(nested, assumed_items=20) > 3 * cost(nested, assumed_items=10)


def test_string_sizes_are_tracked_and_doubling_grows_exponentially() -> None:
    assert estimate_cost("'abc' + 'de'").longest_string == 5
    sizes = [
        estimate_cost("['ab']" + ".map(s, s + s)" * doublings).longest_string
        for doublings in range(1, 8)
    ]
    assert sizes == [2 * 2**k for k in range(1, 8)]
    lists = [
        estimate_cost("[[1, 2, 3]]" + ".map(l, l + l)" * doublings).longest_list
        for doublings in range(1, 6)
    ]
    assert lists == [3 * 2**k for k in range(1, 6)]
    doubled = estimate_cost("input.name + input.name", CostLimits(assumed_chars=40))
    assert doubled.longest_string == 80


def test_a_result_that_shares_its_items_is_counted_in_full() -> None:
    # [a, a] is cheap to build (both engines share a), but copying the result
    # out walks 2^k leaves.
    costs = [cost("['x']" + ".map(a, [a, a])" * k) for k in (10, 11, 12)]
    assert costs[1] > 1.8 * costs[0]
    assert costs[2] > 1.8 * costs[1]


def test_function_costs() -> None:
    text = "input.text"
    assert cost(f"size({text})") < cost(f"{text}.contains('x')") < cost(f"{text}.matches('x+y')")
    # matches costs the string times the pattern.
    assert cost(f"{text}.matches('{'a' * 40}')") > 5 * cost(f"{text}.matches('a')")
    assert cost(f"{text}.matches('a')", assumed_chars=10_000) > cost(
        f"{text}.matches('a')", assumed_chars=100
    )
    # Custom functions pay for converting their arguments and result.
    assert cost("lower(input.text)") > cost("size(input.text)")
    assert estimate_cost("split(input.csv, ',')", CostLimits(assumed_chars=50)).longest_list == 51
    assert estimate_cost("join(['ab', 'cd'], '--')").longest_string == 8
    # 'ß' is two bytes of UTF-8; case mapping may triple a string ('ß' -> 'SS').
    assert estimate_cost("upper('ß')").longest_string == 6


@pytest.mark.parametrize(
    ("pattern", "weight"),
    [
        ("abc", 3),
        ("a{10000}", 10_000),
        (".{10000}", 400_000),
        ("\\w{1000}", 500_000),
        ("(\\d{10}){100}", 200_000),
        ("[a-z]{100}", 300),
        ("[^a]{100}", 3_000),
        ("a{3,}", 4),
        ("(ab|cd)+", 4),
    ],
)
def test_a_regex_weighs_its_atoms_times_their_repetitions(pattern: str, weight: int) -> None:
    assert regex_weight(pattern) == weight


def test_compiling_a_pattern_is_costed_on_every_call() -> None:
    # cel-rust compiles the pattern of each matches() call anew: a heavy
    # literal pattern costs its weight each time, any other pattern the worst.
    light = cost("input.items.map(x, x.matches('^a+$'))")
    heavy = cost("input.items.map(x, x.matches('.{10000}'))")
    unknown = cost("input.items.map(x, x.matches(input.pattern))")
    assert heavy - light > 100 * 39_000
    assert unknown > heavy
    assert cost("input.email.matches(input.pattern)") < 100_000
    # CEL escapes are read before weighing: '\\d' is the class \d.
    assert cost("'1'.matches('\\\\d{100}')") > cost("'1'.matches('d{100}')") + 1000


def test_the_most_costly_comprehension_is_named() -> None:
    source = "[1, 2].map(a, input.items.map(b, input.items.map(c, c)))"
    estimate = estimate_cost(source)
    assert estimate.hottest == (source.rindex("map") + 1, "map", 2 * 100 * 100)
    assert estimate_cost("1 + 1").hottest is None


def test_conditional_costs_its_dearer_branch() -> None:
    dear = "input.items.map(x, x)"
    assert cost(f"true ? {dear} : 1") == cost(f"false ? 1 : {dear}")
    assert cost(f"true ? {dear} : 1") >= cost(dear) + 2


# ----------------------------------------------------- structural limits


@pytest.mark.parametrize(
    ("limit", "accepted", "refused"),
    [
        ("depth", chain(64), chain(65)),
        ("depth", "!" * 63 + "true", "!" * 64 + "true"),
        ("depth", "input" + ".a" * 63, "input" + ".a" * 64),
        ("nesting", "[" * 24 + "1" + "]" * 24, "[" * 25 + "1" + "]" * 25),
        ("nesting", "(" * 24 + "1" + ")" * 24, "(" * 25 + "1" + ")" * 25),
        ("tokens", "[" + ", ".join(["1"] * 499) + "]", "[" + ", ".join(["1"] * 500) + "]"),
    ],
)
def test_structural_limits_are_exact(
    factory: EngineFactory, limit: str, accepted: str, refused: str
) -> None:
    engine = factory()
    engine.compile(accepted)
    error = refusal(engine, refused)
    assert error.details["limit"] == limit
    assert error.details["phase"] == "compile"
    assert error.details["found"] > error.details["maximum"]
    assert f"the limit is {error.details['maximum']:,}" in error.message


def test_structural_limits_are_checked_before_the_engine_parses() -> None:
    # A source past the token limit is refused after reading 1,001 tokens:
    # the error is about tokens, whatever follows (here a syntax error).
    broken = "[" + ", ".join(["1"] * 2000) + ", ]]]"
    for engine in (CelPyEngine(), CelRustEngine()):
        error = refusal(engine, broken)
        assert error.details == {
            "limit": "tokens",
            "found": DEFAULT_COST_LIMITS.max_tokens + 1,
            "maximum": DEFAULT_COST_LIMITS.max_tokens,
            "phase": "compile",
        }


def test_the_deepest_expressions_the_limits_accept_run_on_both_engines_in_threads() -> None:
    # cel-python runs out of Python stack on about 45 nested brackets or 250
    # chained operators; cel-rust's stack is smaller in threads. Every shape
    # at the limits must still evaluate, in the main thread and in another.
    script = textwrap.dedent(
        """
        import threading
        from ductor_core.expressions import CelPyEngine, CelRustEngine
        def chain(n):
            return "1" + " + 1" * (n - 1)
        sources = [
            chain(64),
            "!" * 63 + "true",
            "-" * 63 + "1",
            "(" * 24 + chain(63) + ")" * 24,
            "[" * 24 + "1" + "]" * 24,
            "{'a': " * 24 + "1" + "}" * 24,
            "[1].map(x, " * 23 + chain(40) + ")" * 23,
            "[1].map(x, (" * 12 + chain(40) + "))" * 12,
            "true ? 1 : " * 31 + "1",
            "input" + ".a" * 63,
        ]
        variables = {"input": {"a": None}}
        engines = [CelPyEngine(), CelRustEngine()]
        results = []
        def run():
            for engine in engines:
                for source in sources:
                    try:
                        results.append(str(engine.evaluate(source, variables))[:20])
                    except Exception as exc:
                        results.append(getattr(exc, "code", type(exc).__name__))
        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        run()
        print(results)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    results = eval(done.stdout)  # a printed list of short strings
    expected = [
        "64",
        "False",
        "-1",
        "63",
        "[" * 20,
        "{'a': {'a': {'a': {'",
        "[" * 20,
        "[" * 12 + "40" + "]" * 6,
        "1",
        "expression.evaluation",  # `input.a` is null: no field `a`
    ]
    assert results == expected * 4


# -------------------------------------------------------------- the error


def test_the_error_names_the_expression_the_estimate_and_the_limit(
    factory: EngineFactory,
) -> None:
    source = "input.a.map(x, input.a.map(y, input.a.map(z, x + y + z)))"
    error = refusal(factory(), source)
    estimate = estimate_cost(source).cost
    assert error.details == {
        "limit": "cost",
        "found": estimate,
        "maximum": 1_000_000,
        "phase": "compile",
    }
    assert f"estimated cost {estimate:,} is over the limit of 1,000,000" in error.message
    assert "assumed to hold up to 100 items" in error.message
    column = source.rindex("map") + 1
    assert f"map() at column {column} may run its body 1,000,000 times" in error.message
    assert error.retryable is False


def test_sizes_are_refused_whatever_the_cost(factory: EngineFactory) -> None:
    engine = factory(limits=CostLimits(max_string_length=1000, max_list_length=50))
    engine.compile("['x']" + ".map(s, s + s)" * 9)  # 512 characters
    error = refusal(engine, "['x']" + ".map(s, s + s)" * 10)
    assert error.details["limit"] == "string_length"
    assert "a string of 1,024 characters; the limit is 1,000" in error.message
    engine.compile("[[1, 2, 3, 4]]" + ".map(l, l + l)" * 3)  # 32 items
    error = refusal(engine, "[[1, 2, 3, 4]]" + ".map(l, l + l)" * 4)
    assert error.details["limit"] == "list_length"


# ---------------------------------------------------------- configuration


def test_limits_are_configurable_per_engine(factory: EngineFactory) -> None:
    source = "input.items.map(x, x * 2)"
    default = factory()
    assert default.limits == DEFAULT_COST_LIMITS  # type: ignore[attr-defined]
    default.compile(source)
    strict = factory(limits=CostLimits(max_cost=100))
    assert strict.limits.max_cost == 100  # type: ignore[attr-defined]
    assert refusal(strict, source).details["maximum"] == 100
    # Fewer assumed items make the same source cheap enough again.
    factory(limits=CostLimits(max_cost=100, assumed_items=10)).compile(source)


@pytest.mark.parametrize("field", ["max_cost", "max_depth", "assumed_items", "max_steps"])
@pytest.mark.parametrize("value", [0, -1, True, 1.5])
def test_limits_must_be_positive_ints(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        CostLimits(**{field: value})


def test_the_cache_keeps_refusals_out(factory: EngineFactory) -> None:
    engine = factory()
    source = "['x']" + ".map(s, s + s)" * 30
    for _ in range(2):
        refusal(engine, source)
    assert source not in engine._cache  # type: ignore[attr-defined]


class _AcceptingEngine(CachedEngine[str]):
    """An engine whose parser reads anything, to reach what the estimator cannot."""

    def __init__(self) -> None:
        super().__init__(builtin_registry(), 8, None)

    def _compile(self, source: str, analysis: CostAnalysis | None) -> str:
        return source


def test_a_source_the_estimator_cannot_read_is_refused_when_the_engine_takes_it() -> None:
    engine = _AcceptingEngine()
    assert engine.compile("1 + 1") == "1 + 1"
    with pytest.raises(ExpressionError) as info:
        engine.compile("a.?b")
    assert info.value.code == "expression.too_costly"
    assert "cannot be estimated" in info.value.message


def test_an_unreadable_source_gets_the_engines_syntax_error(factory: EngineFactory) -> None:
    with pytest.raises(ExpressionError) as info:
        factory().compile("a.?b")
    assert info.value.code == "expression.syntax"
    with pytest.raises(ExpressionError) as info:
        estimate_cost("a.?b")
    assert info.value.code == "expression.syntax"


# ------------------------------------------------------------ at run time


NESTED = "input.a.map(x, input.a.map(y, x))"


def test_variables_bigger_than_assumed_are_estimated_again(factory: EngineFactory) -> None:
    engine = factory()
    engine.compile(NESTED)  # 100 x 100 runs: fine
    assert engine.evaluate(NESTED, {"input": {"a": [1, 2]}}) == [[1, 1], [2, 2]]
    big = {"input": {"a": list(range(2000))}}
    error = refusal(engine, NESTED, big)
    assert error.details["phase"] == "evaluate"
    assert error.details["limit"] == "cost"
    assert "the variables of this evaluation hold lists of up to 2,048 items" in error.message
    # The same for bound variables, and for an unrelated long list: the
    # largest list anywhere stands for every list.
    bound = engine.bind({"input": {"a": [1], "other": list(range(2000))}})
    with pytest.raises(ExpressionError) as info:
        engine.compile(NESTED).evaluate(bound)
    assert info.value.code == "expression.too_costly"
    # A cheap expression is not refused for big variables.
    assert engine.evaluate("size(input.a)", big) == 2000


def test_long_strings_in_variables_are_estimated_again(factory: EngineFactory) -> None:
    engine = factory(limits=CostLimits(max_string_length=10_000))
    source = "input.s + input.s"
    assert engine.evaluate(source, {"input": {"s": "ab"}}) == "abab"
    error = refusal(engine, source, {"input": {"s": "x" * 6000}})
    assert error.details == {
        "limit": "string_length",
        "found": 12_288,
        "maximum": 10_000,
        "phase": "evaluate",
    }


FILTER = "input.items.filter(x, x.paid).size()"


def _heavy_items(numbers: int) -> dict[str, Any]:
    # 100 items (the assumed count), each holding a list of `numbers` numbers.
    return {"input": {"items": [{"paid": True, "lines": list(range(numbers))}] * 100}}


def test_cel_rust_prices_the_weight_of_the_items_map_and_filter_copy() -> None:
    # cel-rust's filter() copies the list it builds at every step, deeply:
    # 100 items of 1,000 numbers take it about half a second.
    engine = CelRustEngine()
    program = engine.compile(FILTER)
    assert isinstance(program, CelRustProgram)
    assert estimate_cost(FILTER).cost < 1_000  # the static estimate is unchanged
    light = {"input": {"items": [{"paid": True, "lines": [1, 2]}] * 10}}
    assert program.admit(light)[1] == estimate_cost(FILTER).cost
    heavy = _heavy_items(1000)
    assert 100_000 < program.admit(engine.bind(heavy))[1] < engine.limits.max_cost
    assert program.evaluate(heavy) == 100
    # Several such filters are refused.
    several = " + ".join([FILTER] * 3)
    with pytest.raises(ExpressionError) as info:
        engine.evaluate(several, _heavy_items(2500))
    assert info.value.details["phase"] == "evaluate"
    assert info.value.details["limit"] == "cost"
    # exists() copies nothing it builds: no such price.
    assert CelRustEngine().compile("input.items.exists(x, !x.paid)").admit(heavy)[1] < 10_000


def test_both_engines_agree_on_heavy_items() -> None:
    for numbers in (10, 1000):
        heavy = _heavy_items(numbers)
        assert CelPyEngine().evaluate(FILTER, heavy) == CelRustEngine().evaluate(FILTER, heavy)


def _big_text_registry(size: int) -> FunctionRegistry:
    registry = builtin_registry()
    registry.register("big", lambda: "x" * size, doc="big(): a long string")
    return registry


def test_cel_python_stops_a_custom_function_result_that_is_too_long() -> None:
    limits = CostLimits(max_string_length=1500)
    engine = CelPyEngine(_big_text_registry(2000), limits=limits)
    error = refusal(engine, "big()", {})
    assert error.details == {
        "limit": "string_length",
        "found": 2000,
        "maximum": 1500,
        "phase": "evaluate",
    }
    # Not an error value: `||` cannot absorb a limit.
    assert refusal(engine, "size(big()) > 0 || true", {}).details["limit"] == "string_length"


def test_cel_python_stops_a_concatenation_that_is_too_long() -> None:
    # The estimator takes a custom function's result to be of the assumed
    # size; the check on `+` holds even when that is wrong.
    limits = CostLimits(max_string_length=1500, assumed_chars=10)
    engine = CelPyEngine(_big_text_registry(1000), limits=limits)
    assert len(engine.evaluate("big()", {})) == 1000
    error = refusal(engine, "big() + big()", {})
    assert error.details["limit"] == "string_length"
    assert "it built a string of 2,000 characters; the limit is 1,500" in error.message


def test_cel_python_counts_steps() -> None:
    source = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].map(x, [1, 2, 3, 4, 5].map(y, x * y))"
    roomy = CelPyEngine(limits=CostLimits(max_steps=10_000))
    assert len(roomy.evaluate(source, {})) == 10
    tight = CelPyEngine(limits=CostLimits(max_steps=200))
    error = refusal(tight, source, {})
    assert error.details == {"limit": "steps", "found": 201, "maximum": 200, "phase": "evaluate"}
    # A step limit is not an error value that `||` or exists() can absorb.
    assert refusal(tight, f"{source} == [] || true", {}).details["limit"] == "steps"
    # The count is per evaluation (this one takes 64 steps).
    small = CelPyEngine(limits=CostLimits(max_steps=64))
    for _ in range(3):
        assert small.evaluate("[1, 2].map(x, x + 1)", {}) == [2, 3]


def test_macros_take_lists_and_maps_only_on_both_engines(factory: EngineFactory) -> None:
    # cel-python used to walk a string's characters; the estimate counts
    # items, so both engines refuse, as cel-rust always did.
    engine = factory()
    for source in ("'abc'.map(c, c)", "'abc'.all(c, true)", "'abc'.exists(c, true)"):
        with pytest.raises(ExpressionError) as info:
            engine.evaluate(source, {})
        assert info.value.code == "expression.evaluation"
    assert engine.evaluate("{'a': 1}.all(k, k == 'a')", {}) is True


def test_macro_bodies_follow_the_spec_on_cel_python() -> None:
    # Bodies ran on celpy's own evaluator, outside the spec fixes (and the
    # step count); now `has()` inside a macro behaves as outside it.
    for engine in (CelPyEngine(), CelRustEngine()):
        with pytest.raises(ExpressionError) as info:
            engine.evaluate("[[1]].map(x, has(x.a))", {})
        assert info.value.code == "expression.evaluation"
        assert engine.evaluate("[{'a': 1}].map(x, has(x.a))", {}) == [True]
