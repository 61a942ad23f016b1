"""What the CEL engines share: the cached-engine base, compile checks, error builders.

Imports no CEL library; each engine module supplies its own parsing and running.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from ductor_core.errors import ExpressionError
from ductor_core.expressions._cost import CostAnalysis, analyse, too_costly_error
from ductor_core.expressions._functions import (
    FunctionRegistry,
    default_registry,
    unknown_functions,
)
from ductor_core.expressions._limits import DEFAULT_COST_LIMITS, CostLimits, check_source
from ductor_core.expressions._program_cache import ProgramCache
from ductor_core.expressions._syntax import LimitExceeded, Unreadable, tokenize
from ductor_core.expressions._values import ValueConversionError, to_json

P = TypeVar("P")

# Here rather than in the engine's module, so naming the engine loads no CEL library.
CELPY_ENGINE_NAME = "cel-python"

_MAX_MESSAGE = 300


def clip_message(text: str) -> str:
    """`text`, cut to at most 300 characters."""
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def read_names(source: str) -> frozenset[str] | None:
    """Every name in `source` outside its strings and comments: a superset of the
    variables it can read. None when the source does not tokenize (read them all)."""
    try:
        tokens = tokenize(source, max_tokens=len(source) + 1, max_nesting=len(source) + 1)
    except (Unreadable, LimitExceeded):
        return None
    return frozenset(token.text for token in tokens if token.kind == "ident")


def only_named(activation: Mapping[str, Any], names: frozenset[str] | None) -> Mapping[str, Any]:
    """The variables of `activation` that `names` holds (all of them if None).

    Converting a variable walks its whole value, so one the expression never
    reads is left out: a SCATTER evaluates its template once per item with the
    run's whole `input` at hand, which would make the run quadratic in its items.
    """
    if names is None:
        return activation
    return {name: value for name, value in activation.items() if name in names}


def evaluation_error(source: str, message: str) -> ExpressionError:
    """The `expression.evaluation` error for `source`."""
    return ExpressionError(
        f"evaluation failed: {message}", expression=source, code="expression.evaluation"
    )


def syntax_error(source: str, message: str) -> ExpressionError:
    """The `expression.syntax` error for `source`."""
    return ExpressionError(f"syntax error: {message}", expression=source, code="expression.syntax")


def invalid_has_error(source: str) -> ExpressionError:
    """The syntax error for a `has()` whose argument is not a field selection."""
    return syntax_error(source, "invalid argument to has(): it takes a field, has(e.f)")


def check_functions(source: str, called: set[str], registry: FunctionRegistry) -> None:
    """Raise `expression.unknown_function` if `source` calls a function nobody provides."""
    unknown = unknown_functions(called, registry)
    if unknown:
        raise ExpressionError(
            f"unknown function {', '.join(unknown)}",
            expression=source,
            code="expression.unknown_function",
        )


def wrong_activation(engine_name: str, activation: object) -> TypeError:
    """The error for evaluating against something neither a mapping nor bound variables."""
    return TypeError(
        f"cannot evaluate on {engine_name} against {type(activation).__name__}; "
        "pass a mapping or variables bound by the same engine"
    )


def result_to_json(source: str, result: Any) -> Any:
    """An engine's result as a JSON value (evaluation error if it has none)."""
    try:
        return to_json(result)
    except ValueConversionError as exc:
        raise evaluation_error(source, str(exc)) from exc


class CachedEngine(Generic[P]):
    """The part of an engine that keeps its functions, limits and compiled programs.

    Subclasses implement `_compile(source, analysis)`, called once per source
    not cached; `compile` has already checked the source's length and cost.

    Args:
        functions: the custom functions to expose (read once, now); the
            process-wide default registry when omitted.
        cache_size: how many compiled programs to keep.
        limits: the cost limits; `DEFAULT_COST_LIMITS` when omitted.
    """

    def __init__(
        self, functions: FunctionRegistry | None, cache_size: int, limits: CostLimits | None
    ) -> None:
        self._registry = (functions or default_registry()).copy()
        self._cache: ProgramCache[P] = ProgramCache(cache_size)
        self._limits = limits or DEFAULT_COST_LIMITS

    @property
    def functions(self) -> FunctionRegistry:
        """The custom functions this engine exposes (a snapshot)."""
        return self._registry

    @property
    def limits(self) -> CostLimits:
        """The cost limits this engine applies."""
        return self._limits

    def compile(self, source: str) -> P:
        """Compile `source` once (cached); raises ExpressionError."""
        return self._cache.get_or_compile(source, self._checked_compile)

    def _checked_compile(self, source: str) -> P:
        check_source(source)
        # The estimate comes first: it refuses a costly source before the
        # engine's (slower) parser sees it.
        analysis = analyse(source, self._limits)
        program = self._compile(source, analysis)
        if analysis is None:
            # The engine read what the estimator could not: nothing bounds it.
            raise too_costly_error(
                source,
                "its cost cannot be estimated (the estimator does not read this syntax)",
                limit="cost",
                found=-1,
                maximum=self._limits.max_cost,
                phase="compile",
            )
        return program

    def _compile(self, source: str, analysis: CostAnalysis | None) -> P:
        # Each engine (cel-python, cel-rust) supplies its own compiler.
        raise NotImplementedError(f"{type(self).__name__} must implement _compile")


def _copy_units(value: Any, budget: int) -> int:
    """What copying `value` into an engine costs: 1 per 10 items, entries and
    characters, as the estimate prices a copy. Stops counting past `budget`."""
    count = 0
    stack = [value]
    while stack and count <= budget * 10:
        item = stack.pop()
        if isinstance(item, str):
            count += len(item)
        elif isinstance(item, list | tuple):
            count += len(item)
            stack.extend(item)
        elif isinstance(item, Mapping):
            count += len(item)
            stack.extend(item.values())
            stack.extend(k for k in item if isinstance(k, str))
        elif isinstance(item, bytes):
            count += len(item)
    return count // 10


def admit_repeated(
    source: str,
    activation: Mapping[str, Any],
    times: int,
    limits: CostLimits,
    *,
    per_item: frozenset[str] = frozenset(),
) -> None:
    """Refuse `source` evaluated `times` times against `activation`, when copying
    the variables it names (those in `per_item` aside, which change each time)
    that often costs more than `limits.max_cost`.

    Every evaluation converts the variables it names, so a filter or map over a
    list of n items whose expression also reads the list does n times n work.

    Raises:
        ExpressionError: `expression.too_costly` (limit `cost`, phase `evaluate`).
    """
    if times <= 1:
        return
    named = only_named(activation, read_names(source))
    budget = limits.max_cost // times
    units = sum(_copy_units(value, budget) for name, value in named.items() if name not in per_item)
    total = units * times
    if total > limits.max_cost:
        raise too_costly_error(
            source,
            f"evaluated once for each of {times:,} items, it copies the variables it"
            f" reads (about {units:,} units) each time: estimated cost {total:,} is over"
            f" the limit of {limits.max_cost:,}",
            limit="cost",
            found=total,
            maximum=limits.max_cost,
            phase="evaluate",
        )
