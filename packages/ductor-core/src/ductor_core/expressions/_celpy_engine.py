"""The reference engine, cel-python (`celpy`), behind the `ExpressionEngine` protocol.

The only module that imports celpy. It uses the interpreted runner and never
the compiled one: celpy 0.5.0's CompiledRunner loses custom functions and
`has()`, and mixing the two runner classes in one process crashes.
"""

from __future__ import annotations

import datetime
import decimal
import math
from collections.abc import Callable, Mapping
from typing import Any

import celpy
from celpy import celtypes
from lark import Tree

from ductor_core.errors import ExpressionError
from ductor_core.expressions._functions import (
    CustomFunction,
    FunctionRegistry,
    default_registry,
    unknown_functions,
)
from ductor_core.expressions._program_cache import ProgramCache
from ductor_core.expressions._values import ValueConversionError, to_json, to_plain

CELPY_ENGINE_NAME = "cel-python"


# ---------------------------------------------------------------- values in


def _to_cel(value: Any) -> Any:
    """A value already passed through `to_plain`, as celpy types."""
    if value is None:
        return None
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        if value > 2**63 - 1:
            return celtypes.UintType(value)
        return celtypes.IntType(value)
    if isinstance(value, float):
        return celtypes.DoubleType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    if isinstance(value, dict):
        return celtypes.MapType({_to_cel(k): _to_cel(v) for k, v in value.items()})
    if isinstance(value, list):
        return celtypes.ListType([_to_cel(v) for v in value])
    if isinstance(value, datetime.datetime):
        return celtypes.TimestampType(value)
    if isinstance(value, datetime.timedelta):
        return celtypes.DurationType(value)
    if isinstance(value, bytes):
        return celtypes.BytesType(value)
    raise ValueConversionError(f"value of type {type(value).__name__} is not JSON")


# ------------------------------------------- operators with CEL spec semantics
#
# celpy 0.5.0 departs from the CEL spec on mixed numbers: `1 == 1.0` and
# `1 < 1.5` are errors, `1 + 1u` and `2.5 * 2` succeed, `1 == 'a'` is an
# error. The overrides below give the spec's answers (numbers compare across
# int/uint/double by value, values of other different types are unequal,
# arithmetic never mixes types), which is also what cel-rust does.

_NUMBER_KINDS = frozenset({"int", "uint", "double"})
_ORDERED_KINDS = frozenset({"string", "bytes", "bool", "timestamp", "duration"})


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool | celtypes.BoolType):
        return "bool"
    if isinstance(value, celtypes.UintType):
        return "uint"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bytes):
        return "bytes"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "map"
    if isinstance(value, datetime.datetime):
        return "timestamp"
    if isinstance(value, datetime.timedelta):
        return "duration"
    if isinstance(value, type):
        return "type"
    return "other"


def _equal(a: Any, b: Any) -> bool:
    ka, kb = _kind(a), _kind(b)
    if ka in _NUMBER_KINDS and kb in _NUMBER_KINDS:
        # Python compares int with float exactly (no rounding), as CEL asks.
        return _number(a, ka) == _number(b, kb)
    if ka != kb:
        return False
    if ka == "list":
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if ka == "map":
        if len(a) != len(b):
            return False
        for key, value in a.items():
            found = _map_lookup(b, key)
            if found is _MISSING or not _equal(value, found):
                return False
        return True
    if ka == "type":
        return a is b
    return bool(a == b)


_MISSING = object()


def _number(value: Any, kind: str) -> int | float:
    # Plain Python numbers: celpy's own types refuse to meet each other.
    return float(value) if kind == "double" else int(value)


def _map_lookup(mapping: dict[Any, Any], key: Any) -> Any:
    try:
        return mapping[key]
    except (KeyError, TypeError):
        pass
    for candidate, value in mapping.items():
        if _equal(candidate, key):
            return value
    return _MISSING


def _eq(a: Any, b: Any) -> celtypes.BoolType:
    return celtypes.BoolType(_equal(a, b))


def _ne(a: Any, b: Any) -> celtypes.BoolType:
    return celtypes.BoolType(not _equal(a, b))


def _ordering(test: Callable[[Any, Any], bool]) -> Callable[[Any, Any], celtypes.BoolType]:
    def compare(a: Any, b: Any) -> celtypes.BoolType:
        ka, kb = _kind(a), _kind(b)
        if ka in _NUMBER_KINDS and kb in _NUMBER_KINDS:
            return celtypes.BoolType(test(_number(a, ka), _number(b, kb)))
        if ka == kb and ka in _ORDERED_KINDS:
            return celtypes.BoolType(test(a, b))
        raise TypeError(f"no such overload: {ka} and {kb} cannot be ordered")

    return compare


def _in(item: Any, container: Any) -> celtypes.BoolType:
    kind = _kind(container)
    if kind == "list":
        return celtypes.BoolType(any(_equal(item, element) for element in container))
    if kind == "map":
        if _kind(item) not in {"string", "int", "uint", "bool"}:
            raise TypeError(f"no such overload: {_kind(item)} cannot be a map key")
        return celtypes.BoolType(_map_lookup(container, item) is not _MISSING)
    raise TypeError(f"no such overload: 'in' on {kind}")


def _strict(operation: Callable[[Any, Any], Any], symbol: str) -> Callable[[Any, Any], Any]:
    def apply(a: Any, b: Any) -> Any:
        ka, kb = _kind(a), _kind(b)
        if (
            ka == "bool"
            or kb == "bool"
            or (ka != kb and (ka in _NUMBER_KINDS or kb in _NUMBER_KINDS))
        ):
            raise TypeError(f"no such overload: {ka} {symbol} {kb}")
        return operation(a, b)

    return apply


def _format_double(value: float) -> str:
    # Positional notation with the shortest round-trip digits, no trailing
    # ".0" (1.0 -> "1", 1e20 -> "100000000000000000000"), as cel-rust prints.
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    text = format(decimal.Decimal(repr(value)), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def _string(value: Any) -> Any:
    kind = _kind(value)
    if kind == "double":
        return celtypes.StringType(_format_double(float(value)))
    if kind == "bool":
        return celtypes.StringType("true" if value else "false")
    return celtypes.StringType(value)


def _spec_functions() -> dict[str, Callable[..., Any]]:
    base = celpy.evaluation.base_functions
    return {
        "_==_": _eq,
        "_!=_": _ne,
        "_<_": _ordering(lambda a, b: a < b),
        "_<=_": _ordering(lambda a, b: a <= b),
        "_>_": _ordering(lambda a, b: a > b),
        "_>=_": _ordering(lambda a, b: a >= b),
        "_in_": _in,
        "_+_": _strict(base["_+_"], "+"),
        "_-_": _strict(base["_-_"], "-"),
        "_*_": _strict(base["_*_"], "*"),
        "_/_": _strict(base["_/_"], "/"),
        "_%_": _strict(base["_%_"], "%"),
        "string": _string,
    }


# ------------------------------------------------------------ custom functions


def _wrap(function: CustomFunction) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        for arg in args:
            if isinstance(arg, celpy.CELEvalError):
                return arg
        try:
            result = function.impl(*(to_json(arg) for arg in args))
            return _to_cel(to_plain(result))
        except Exception as exc:
            # An error value, not a raise: CEL's `||`/`&&` may still absorb it.
            return celpy.CELEvalError(
                f"function {function.name!r} failed: {type(exc).__name__}: {exc}",
                type(exc),
                exc.args,
            )

    return call


def _called_functions(ast: Tree[Any]) -> set[str]:
    names: set[str] = set()
    for node in ast.iter_subtrees():
        if node.data in ("ident_arg", "dot_ident_arg"):
            names.add(str(node.children[0]))
        elif node.data == "member_dot_arg":
            names.add(str(node.children[1]))
    return names


def _describe(exc: BaseException) -> str:
    text = str(exc.args[0]) if exc.args else str(exc)
    # celpy appends a dump of the whole activation to some messages.
    text = text.split(" (in activation", 1)[0]
    return text if len(text) <= 300 else text[:297] + "..."


# ------------------------------------------------------------------ the engine


class CelPyBoundVariables:
    """Variables converted once to celpy values, for many evaluations."""

    __slots__ = ("_variables",)

    def __init__(self, variables: dict[str, Any]) -> None:
        self._variables = variables

    @property
    def engine_name(self) -> str:
        return CELPY_ENGINE_NAME


class CelPyProgram:
    """A compiled celpy program (interpreted runner). Safe to share between threads."""

    __slots__ = ("_engine", "_runner", "source")

    def __init__(self, source: str, runner: Any, engine: CelPyEngine) -> None:
        self.source = source
        self._runner = runner
        self._engine = engine

    def evaluate(self, activation: Mapping[str, Any] | CelPyBoundVariables) -> Any:
        """Evaluate against JSON variables (or bound ones); return a JSON value."""
        if isinstance(activation, CelPyBoundVariables):
            variables = activation._variables
        else:
            variables = self._engine._convert(activation, self.source)
        try:
            result = self._runner.evaluate(variables)
        except celpy.CELEvalError as exc:
            raise _evaluation_error(self.source, _describe(exc)) from exc
        except Exception as exc:
            raise _evaluation_error(self.source, f"{type(exc).__name__}: {exc}") from exc
        if isinstance(result, celpy.CELEvalError):
            raise _evaluation_error(self.source, _describe(result))
        try:
            return to_json(result)
        except ValueConversionError as exc:
            raise _evaluation_error(self.source, str(exc)) from exc


def _evaluation_error(source: str, message: str) -> ExpressionError:
    return ExpressionError(
        f"evaluation failed: {message}", expression=source, code="expression.evaluation"
    )


class CelPyEngine:
    """The reference engine: cel-python, interpreted, with CEL spec number semantics.

    Args:
        functions: the custom functions to expose (read once, now); the
            process-wide default registry when omitted.
        cache_size: how many compiled programs to keep.
    """

    def __init__(
        self, functions: FunctionRegistry | None = None, *, cache_size: int = 4096
    ) -> None:
        self._registry = (functions or default_registry()).copy()
        self._env = celpy.Environment()
        self._functions: dict[str, Callable[..., Any]] = _spec_functions()
        for function in self._registry:
            self._functions[function.name] = _wrap(function)
        self._cache: ProgramCache[CelPyProgram] = ProgramCache(cache_size)

    @property
    def name(self) -> str:
        return CELPY_ENGINE_NAME

    @property
    def functions(self) -> FunctionRegistry:
        """The custom functions this engine exposes (a snapshot)."""
        return self._registry

    def compile(self, source: str) -> CelPyProgram:
        """Compile `source` once (cached); raises ExpressionError."""
        return self._cache.get_or_compile(source, self._compile)

    def evaluate(self, source: str, activation: Mapping[str, Any] | CelPyBoundVariables) -> Any:
        """Compile (cached) and evaluate `source`."""
        return self.compile(source).evaluate(activation)

    def bind(self, activation: Mapping[str, Any]) -> CelPyBoundVariables:
        """Convert `activation` once, to evaluate many expressions against it."""
        return CelPyBoundVariables(self._convert(activation, "<bind>"))

    def _convert(self, activation: Mapping[str, Any], source: str) -> dict[str, Any]:
        try:
            return {name: _to_cel(to_plain(value)) for name, value in activation.items()}
        except ValueConversionError as exc:
            raise _evaluation_error(source, str(exc)) from exc

    def _compile(self, source: str) -> CelPyProgram:
        if not isinstance(source, str):
            raise TypeError("a CEL expression is a string")
        try:
            ast = self._env.compile(source)
        except celpy.CELParseError as exc:
            raise ExpressionError(
                f"syntax error at line {exc.line} column {exc.column}",
                expression=source,
                code="expression.syntax",
            ) from exc
        except Exception as exc:
            raise ExpressionError(
                f"syntax error: {type(exc).__name__}: {exc}",
                expression=source,
                code="expression.syntax",
            ) from exc
        unknown = unknown_functions(_called_functions(ast), self._registry)
        if unknown:
            raise ExpressionError(
                f"unknown function {', '.join(unknown)}",
                expression=source,
                code="expression.unknown_function",
            )
        runner = self._env.program(ast, functions=self._functions)
        return CelPyProgram(source, runner, self)
