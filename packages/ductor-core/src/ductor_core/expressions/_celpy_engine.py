"""The reference engine, cel-python (`celpy`), behind the `ExpressionEngine` protocol.

The only module that imports celpy. It uses the interpreted runner and never
the compiled one: celpy 0.5.0's CompiledRunner loses custom functions and
`has()`, and mixing the two runner classes in one process crashes. Being pure
Python, it also enforces the runtime limits: it counts the tree nodes each
evaluation visits and checks the size of every string and list `+` and the
custom functions build.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import celpy
from celpy import celtypes
from lark import Tree

from ductor_core.errors import ExpressionError
from ductor_core.expressions._cost import CostAnalysis, too_costly_error
from ductor_core.expressions._engine_base import (
    CELPY_ENGINE_NAME,
    CachedEngine,
    check_functions,
    clip_message,
    evaluation_error,
    invalid_has_error,
    only_named,
    read_names,
    result_to_json,
    syntax_error,
    wrong_activation,
)
from ductor_core.expressions._functions import (
    TIMESTAMP_ACCESSORS,
    CustomFunction,
    FunctionRegistry,
)
from ductor_core.expressions._limits import CostLimits
from ductor_core.expressions._literals import LiteralError, decode_double, decode_string
from ductor_core.expressions._values import (
    INT64_MIN,
    Sizes,
    ValueConversionError,
    to_json,
    to_plain,
)

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


# ----------------------------------------------------------- runtime limits


class _OverLimit(BaseException):
    """An evaluation went past a runtime limit.

    A BaseException, so that neither celpy (which turns exceptions into CEL
    error values) nor CEL's `||` and `&&` (which absorb error values) can
    swallow it: a resource limit is not an answer.
    """

    def __init__(self, limit: str, found: int, maximum: int, message: str) -> None:
        super().__init__(message)
        self.limit = limit
        self.found = found
        self.maximum = maximum
        self.message = message


def _check_length(is_list: bool, length: int, limits: CostLimits) -> None:
    """Raise `_OverLimit` if a list (or map) or a string (or bytes) this long is too long."""
    if is_list:
        if length > limits.max_list_length:
            raise _OverLimit(
                "list_length",
                length,
                limits.max_list_length,
                f"it built a list of {length:,} items; the limit is {limits.max_list_length:,}",
            )
    elif length > limits.max_string_length:
        raise _OverLimit(
            "string_length",
            length,
            limits.max_string_length,
            f"it built a string of {length:,} characters; "
            f"the limit is {limits.max_string_length:,}",
        )


def _check_size(value: Any, limits: CostLimits) -> None:
    """Raise `_OverLimit` if `value` is a string, bytes, list or map too long."""
    if isinstance(value, str | bytes):
        _check_length(False, len(value), limits)
    elif isinstance(value, list | dict):
        _check_length(True, len(value), limits)


def _bounded_concatenation(
    add: Callable[[Any, Any], Any], limits: CostLimits
) -> Callable[[Any, Any], Any]:
    # The length is checked before the value is built, not after.
    def apply(a: Any, b: Any) -> Any:
        if isinstance(a, str | bytes | list) and isinstance(b, str | bytes | list):
            _check_length(isinstance(a, list), len(a) + len(b), limits)
        return add(a, b)

    return apply


class _Budget:
    """One evaluation's count of visited tree nodes."""

    __slots__ = ("maximum", "steps")

    def __init__(self, maximum: int) -> None:
        self.steps = 0
        self.maximum = maximum


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
    if isinstance(value, type | _TypeConversion):
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
        return _as_type(a) is _as_type(b)
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


def _index(container: Any, key: Any) -> Any:
    # Lists take an int or uint in range, maps a key of a key type; strings
    # are not indexable in CEL (celpy 0.5.0 indexes them, and takes -1).
    kind, key_kind = _kind(container), _kind(key)
    if kind == "list":
        if key_kind not in ("int", "uint"):
            raise TypeError(f"no such overload: list index of type {key_kind}")
        if not 0 <= int(key) < len(container):
            return celpy.CELEvalError(f"index {int(key)} out of range", IndexError, (int(key),))
        return container[int(key)]
    if kind == "map":
        if key_kind not in ("string", "int", "uint", "bool"):
            raise TypeError(f"no such overload: map key of type {key_kind}")
        found = _map_lookup(container, key)
        if found is _MISSING:
            return celpy.CELEvalError(f"no such key: {to_json(key)!r}", KeyError, (key,))
        return found
    raise TypeError(f"no such overload: {kind} cannot be indexed")


_SAME_NUMBERS = {(kind, kind) for kind in ("int", "uint", "double")}
# The operand kinds each arithmetic operator has an overload for in CEL;
# celpy also takes mixed numbers, bools, `duration / duration` and more.
_ARITHMETIC: dict[str, set[tuple[str, str]]] = {
    "+": _SAME_NUMBERS
    | {
        ("string", "string"),
        ("bytes", "bytes"),
        ("list", "list"),
        ("duration", "duration"),
        ("timestamp", "duration"),
        # Not ("duration", "timestamp"): the spec has it, cel-rust does not;
        # write `timestamp + duration`.
    },
    "-": _SAME_NUMBERS
    | {("duration", "duration"), ("timestamp", "timestamp"), ("timestamp", "duration")},
    "*": _SAME_NUMBERS,
    "/": _SAME_NUMBERS,
    "%": {("int", "int"), ("uint", "uint")},
}


def _strict(operation: Callable[[Any, Any], Any], symbol: str) -> Callable[[Any, Any], Any]:
    allowed = _ARITHMETIC[symbol]

    def apply(a: Any, b: Any) -> Any:
        ka, kb = _kind(a), _kind(b)
        if (ka, kb) not in allowed:
            raise TypeError(f"no such overload: {ka} {symbol} {kb}")
        return operation(a, b)

    return apply


def _divide(a: Any, b: Any) -> Any:
    # IEEE 754 for doubles, as the spec: x / 0.0 is +-inf and 0.0 / 0.0 is NaN
    # (celpy 0.5.0 answers inf for the latter).
    if _kind(a) == "double" and _kind(b) == "double" and float(b) == 0.0:
        x, y = float(a), float(b)
        if x == 0.0 or math.isnan(x):
            return celtypes.DoubleType(math.nan)
        return celtypes.DoubleType(math.copysign(math.inf, x) * math.copysign(1.0, y))
    return _strict(celpy.evaluation.base_functions["_/_"], "/")(a, b)


def _remainder(a: Any, b: Any) -> Any:
    # The smallest int64 by -1 overflows, as its quotient does (cel-go and
    # cel-rust say so); celpy 0.5.0 answers 0.
    if _kind(a) == "int" and _kind(b) == "int" and int(a) == INT64_MIN and int(b) == -1:
        raise ValueError("overflow")
    return _strict(celpy.evaluation.base_functions["_%_"], "%")(a, b)


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


def _size(value: Any) -> Any:
    kind = _kind(value)
    if kind not in ("string", "bytes", "list", "map"):
        raise TypeError(f"no such overload: size of {kind}")
    return celtypes.IntType(len(value))


def _or(x: Any, y: Any) -> Any:
    # As the spec: true wins over anything (errors too), then an error is the
    # answer, then anything not a bool is an error. celpy answers `false || 4u`
    # with 4u.
    if (_kind(x) == "bool" and x) or (_kind(y) == "bool" and y):
        return celtypes.BoolType(True)
    return _logic_rest(x, y, "||")


def _and(x: Any, y: Any) -> Any:
    if (_kind(x) == "bool" and not x) or (_kind(y) == "bool" and not y):
        return celtypes.BoolType(False)
    return _logic_rest(x, y, "&&")


def _logic_rest(x: Any, y: Any, symbol: str) -> Any:
    if _kind(x) == "bool" and _kind(y) == "bool":
        return celtypes.BoolType(bool(x) if symbol == "||" else bool(x and y))
    for value in (x, y):
        if isinstance(value, celpy.CELEvalError):
            return value
    raise TypeError(f"no such overload: {_kind(x)} {symbol} {_kind(y)}")


def _passing_errors(function: Callable[..., Any]) -> Callable[..., Any]:
    # celpy hands error values to operator functions as arguments; an
    # operator must return them, never compare or combine them.
    def guarded(*args: Any) -> Any:
        for arg in args:
            if isinstance(arg, celpy.CELEvalError):
                return arg
        return function(*args)

    guarded.__name__ = getattr(function, "__name__", "operator")
    return guarded


_LOOSE_NUMBER = re.compile(r"[\s_]")
_DECIMAL_INTEGER = re.compile(r"[+-]?[0-9]+\Z")


def _strict_number(name: str, text: str) -> bool:
    if name == "double":
        return text.isascii() and not _LOOSE_NUMBER.search(text)
    return _DECIMAL_INTEGER.match(text) is not None


class _TypeConversion:
    """A CEL type name used as a conversion function (`int(x)`) and as a type
    value (`type(x) == int`): celpy resolves both through one function table."""

    __slots__ = ("accepts", "cel_type", "convert", "name")

    def __init__(
        self,
        cel_type: type,
        accepts: frozenset[str],
        name: str,
        convert: Callable[[Any], Any] | None = None,
    ) -> None:
        self.cel_type = cel_type
        self.accepts = accepts
        self.name = name
        self.convert = convert or cel_type

    def __call__(self, value: Any) -> Any:
        # celpy converts anything Python can (`int(true)`, `int(null)` ...);
        # CEL has overloads for these argument types only.
        if isinstance(value, celpy.CELEvalError):
            return value
        kind = _kind(value)
        if kind not in self.accepts:
            raise TypeError(f"no such overload: {self.name}({kind})")
        if self.name == "uint" and kind == "double" and float(value) < 0:
            raise ValueError(f"uint({float(value)!r}) is out of range")
        if kind == "string" and self.name in _NUMBER_KINDS and not _strict_number(self.name, value):
            # Python's int()/float() take " 5", "1_000" and other scripts' digits
            # (Arabic-Indic "\u0661"), celpy's int() hex ("0x10"); CEL's parsers take none of them.
            raise ValueError(f"{self.name}({str(value)!r}): not a number")
        return self.convert(value)


def _as_type(value: Any) -> Any:
    return value.cel_type if isinstance(value, _TypeConversion) else value


# RFC 3339 as cel-rust reads it: seconds required, `T`, `t` or a space between
# date and time, `Z`, `z` or a numeric offset with a colon. celpy's parser also
# takes bare dates, offsets without a colon and more.
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})\Z")
# Units as the spec lists them (celpy also takes `d`).
_DURATION = re.compile(r"[+-]?(\d+(\.\d+)?(h|ms|us|ns|m|s))+\Z")


def _timestamp(value: Any) -> Any:
    if _kind(value) == "string":
        text = str(value)
        if not _RFC3339.match(text):
            raise ValueError(f"timestamp({text!r}): not an RFC 3339 date-time")
        value = celtypes.StringType(text[:10] + "T" + text[11:].upper())
    return celtypes.TimestampType(value)


def _duration(value: Any) -> Any:
    if _kind(value) == "string" and not _DURATION.match(str(value)):
        raise ValueError(f"duration({str(value)!r}): not a duration")
    return celtypes.DurationType(value)


def _accessor(name: str) -> Callable[..., Any]:
    # cel-rust has no time zone argument (`getHours('Europe/Paris')`), so
    # neither do we; `local_time(ts, zone)` is the portable way.
    method = celpy.evaluation.base_functions[name]

    def call(value: Any, *extra: Any) -> Any:
        if extra:
            raise TypeError(f"no such overload: {name} with a time zone; use local_time()")
        return method(value)

    return call


def _string_method(name: str) -> Callable[[Any, Any], Any]:
    # `contains`, `startsWith`, `endsWith` and `matches` take strings only;
    # celpy also answers them for lists and maps.
    method = celpy.evaluation.base_functions[name]

    def call(receiver: Any, argument: Any) -> Any:
        if _kind(receiver) != "string" or _kind(argument) != "string":
            raise TypeError(f"no such overload: {_kind(receiver)}.{name}({_kind(argument)})")
        return method(receiver, argument)

    return call


def _spec_functions(limits: CostLimits) -> dict[str, Callable[..., Any]]:
    base = celpy.evaluation.base_functions
    functions: dict[str, Callable[..., Any]] = {
        "_==_": _eq,
        "_!=_": _ne,
        "_<_": _ordering(lambda a, b: a < b),
        "_<=_": _ordering(lambda a, b: a <= b),
        "_>_": _ordering(lambda a, b: a > b),
        "_>=_": _ordering(lambda a, b: a >= b),
        "_in_": _in,
        "_[_]": _index,
        "_+_": _bounded_concatenation(_strict(base["_+_"], "+"), limits),
        "_-_": _strict(base["_-_"], "-"),
        "_*_": _strict(base["_*_"], "*"),
        "_/_": _divide,
        "_%_": _remainder,
        "size": _size,
        "contains": _string_method("contains"),
        "startsWith": _string_method("startsWith"),
        "endsWith": _string_method("endsWith"),
        "matches": _string_method("matches"),
        **{name: _accessor(name) for name in TIMESTAMP_ACCESSORS},
    }
    guarded = {name: _passing_errors(function) for name, function in functions.items()}
    numbers = frozenset({"int", "uint", "double", "string"})
    everything = frozenset(
        {"int", "uint", "double", "string", "bytes", "bool", "timestamp", "duration"}
    )
    return {
        **guarded,
        # Not guarded: `||` and `&&` must see errors to absorb them.
        "_||_": _or,
        "_&&_": _and,
        "int": _TypeConversion(celtypes.IntType, numbers, "int"),
        "uint": _TypeConversion(celtypes.UintType, numbers, "uint"),
        "double": _TypeConversion(celtypes.DoubleType, numbers, "double"),
        "string": _TypeConversion(celtypes.StringType, everything, "string", _string),
        "bytes": _TypeConversion(celtypes.BytesType, frozenset({"string", "bytes"}), "bytes"),
        "timestamp": _TypeConversion(
            celtypes.TimestampType, frozenset({"string", "timestamp"}), "timestamp", _timestamp
        ),
        "duration": _TypeConversion(
            celtypes.DurationType, frozenset({"string", "duration"}), "duration", _duration
        ),
    }


# ------------------------------------------------------------ the evaluator


def _has_selection(exprlist: Any) -> Tree[Any] | None:
    """The `e.f` inside has(e.f), or None when the argument is not one."""
    node: Any = exprlist
    while isinstance(node, Tree) and node.data != "member_dot" and len(node.children) == 1:
        node = node.children[0]
    if isinstance(node, Tree) and node.data == "member_dot":
        return node
    return None


class _SpecEvaluator(celpy.Evaluator):  # type: ignore[misc]
    """celpy's evaluator, but an error inside a map literal is the map's value.

    celpy 0.5.0 builds `{'a': 1 / 0}` as a map holding an error value (lists
    already propagate the error); the spec, and cel-rust, make it an error.
    """

    def mapinits(self, tree: Tree[Any]) -> Any:
        keys_values = self.visit_children(tree)
        for item in keys_values:
            if isinstance(item, celpy.CELEvalError):
                return item
        result = celtypes.MapType()
        for key, value in zip(keys_values[0::2], keys_values[1::2], strict=True):
            if key in result:
                raise ValueError(f"Duplicate key {key!r}")
            result[key] = value
        return result

    # Set by `_SpecRunner` (and passed on to every sub-evaluator) before use.
    budget: _Budget

    def literal(self, tree: Tree[Any]) -> Any:
        # celpy's own decoding keeps unknown escapes and drops none of `\?`,
        # `\``, `\X41`; `_check_literals` has refused what the spec refuses.
        token = tree.children[0]
        kind = getattr(token, "type", "")
        if kind in _TEXT_LITERALS:
            value = decode_string(str(token))
            if isinstance(value, bytes):
                return celtypes.BytesType(value)
            return celtypes.StringType(value)
        return super().literal(tree)

    def _visit_tree(self, tree: Tree[Any]) -> Any:
        # Every node visit of lark's Interpreter passes here (`visit` and
        # `visit_children` both call it): the one place to count steps.
        budget = self.budget
        budget.steps += 1
        if budget.steps > budget.maximum:
            raise _OverLimit(
                "steps",
                budget.steps,
                budget.maximum,
                f"evaluation went past {budget.maximum:,} steps",
            )
        return super()._visit_tree(tree)

    def sub_evaluator(self, ast: Tree[Any]) -> Any:
        # celpy builds a plain Evaluator for a macro's body; the body must
        # count against the same budget and keep the spec semantics.
        nested = _SpecEvaluator(ast=ast, activation=self.activation)
        nested.budget = self.budget
        return nested

    def member_dot_arg(self, tree: Tree[Any]) -> Any:
        # The macros take lists and maps only (celpy also walks a string's
        # characters); filter() and exists_one() take Python truthiness in
        # celpy (`[1, 2].filter(x, x)` keeps both); CEL wants a bool predicate.
        method = str(tree.children[1])
        if method not in _MACRO_METHODS:
            return super().member_dot_arg(tree)
        source = self.visit(tree.children[0])
        if isinstance(source, celpy.CELEvalError):
            return source
        if _kind(source) not in ("list", "map"):
            return celpy.CELEvalError(
                f"no such overload: {method}() on a {_kind(source)}", TypeError, ()
            )
        arguments = tree.children[2] if len(tree.children) > 2 else None
        if not isinstance(arguments, Tree) or len(arguments.children) != 2:
            return celpy.CELEvalError(
                f"no such overload: {method}() takes a variable and an expression", TypeError, ()
            )
        if method == "map":
            return celtypes.ListType(map(self.build_macro_eval(tree), source))
        if method in ("all", "exists"):
            combine = celpy.evaluation.eval_error("no such overload", TypeError)(
                celtypes.logical_and if method == "all" else celtypes.logical_or
            )
            return functools.reduce(
                combine,
                map(self.build_ss_macro_eval(tree), source),
                celtypes.BoolType(method == "all"),
            )
        predicate = self.build_macro_eval(tree)
        kept = []
        for item in source:
            verdict = predicate(item)
            if isinstance(verdict, celpy.CELEvalError):
                return verdict
            if _kind(verdict) != "bool":
                return celpy.CELEvalError(
                    f"no such overload: the {method}() predicate gave a {_kind(verdict)}",
                    TypeError,
                    (),
                )
            if verdict:
                kept.append(item)
        if method == "filter":
            return celtypes.ListType(kept)
        return celtypes.BoolType(len(kept) == 1)

    def macro_has_eval(self, exprlist: Tree[Any]) -> Any:
        # celpy answers has(e.f) with "did e.f evaluate", so a missing `e`, or
        # an `e` that is a number, gives false. The spec (and cel-rust): e
        # must evaluate, to a map, and the answer is whether f is a key.
        node = _has_selection(exprlist)
        if node is None:
            return celpy.CELEvalError("has() needs a field selection: has(e.f)", TypeError, ())
        member_tree, field = node.children
        member = self.visit(member_tree)
        if isinstance(member, celpy.CELEvalError):
            return member
        if _kind(member) != "map":
            return celpy.CELEvalError(
                f"has() on a {_kind(member)}: no such field", TypeError, (str(field),)
            )
        return celtypes.BoolType(_map_lookup(member, celtypes.StringType(field)) is not _MISSING)


# `existsOne` is the newer spelling of `exists_one` (cel-go, cel-rust); celpy has only the old.
_MACRO_METHODS = frozenset({"map", "filter", "all", "exists", "exists_one", "existsOne"})


class _SpecRunner(celpy.InterpretedRunner):  # type: ignore[misc]
    """The interpreted runner (same tree class) with `_SpecEvaluator`, counting steps."""

    # Set by the engine right after celpy builds the runner.
    max_steps: int

    def evaluate(self, context: Any) -> Any:
        evaluator = _SpecEvaluator(ast=self.ast, activation=self.new_activation())
        evaluator.budget = _Budget(self.max_steps)
        return evaluator.evaluate(context)


# ------------------------------------------------------------ custom functions


def _wrap(function: CustomFunction, limits: CostLimits) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        for arg in args:
            if isinstance(arg, celpy.CELEvalError):
                return arg
        try:
            result = function.impl(*(to_json(arg) for arg in args))
            _check_size(result, limits)
            return _to_cel(to_plain(result))
        except (_OverLimit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            # SystemExit too: a function's exit fails its call, as on cel-rust, and
            # never the process. An error value, not a raise: CEL's `||`/`&&` may
            # still absorb it.
            return celpy.CELEvalError(
                f"function {function.name!r} failed: {type(exc).__name__}: {exc}",
                type(exc),
                exc.args,
            )

    return call


_TEXT_LITERALS = frozenset({"STRING_LIT", "MLSTRING_LIT", "BYTES_LIT"})


def _check_macro_variables(source: str, ast: Tree[Any]) -> None:
    """Raise `expression.syntax` for a macro whose variable is not a name
    (`[1].map(x.y, x)`), as the spec and cel-rust do; celpy takes the first
    name it finds in it."""
    for node in ast.iter_subtrees():
        if node.data != "member_dot_arg" or str(node.children[1]) not in _MACRO_METHODS:
            continue
        arguments = node.children[2] if len(node.children) > 2 else None
        if not isinstance(arguments, Tree) or len(arguments.children) < 2:
            continue
        variable: Any = arguments.children[0]
        while isinstance(variable, Tree) and variable.data != "ident":
            if len(variable.children) != 1:
                break
            variable = variable.children[0]
        if not (isinstance(variable, Tree) and variable.data == "ident"):
            method = node.children[1]
            where = f"line {method.line} column {method.column}"
            raise syntax_error(source, f"{where}: the variable of {method}() must be a name")


def _check_literals(source: str, ast: Tree[Any]) -> None:
    """Raise `expression.syntax` for a literal the spec refuses (as cel-rust does)."""
    for node in ast.iter_subtrees():
        if node.data != "literal" or not node.children:
            continue
        token = node.children[0]
        kind = getattr(token, "type", "")
        try:
            if kind in _TEXT_LITERALS:
                decode_string(str(token))
            elif kind == "FLOAT_LIT":
                decode_double(str(token))
        except LiteralError as exc:
            where = f"line {token.line} column {token.column}"
            raise syntax_error(source, f"{where}: {exc}") from None


def _called_functions(ast: Tree[Any]) -> set[str]:
    names: set[str] = set()
    for node in ast.iter_subtrees():
        if node.data in ("ident_arg", "dot_ident_arg"):
            names.add(str(node.children[0]))
        elif node.data == "member_dot_arg":
            names.add(str(node.children[1]))
    return names


_GENERIC_MESSAGES = frozenset({"return error for overflow", "no such overload"})


def _describe(exc: BaseException) -> str:
    # A CELEvalError's args are (message, cause class, cause args).
    args = exc.args
    text = str(args[0]) if args else str(exc)
    # celpy appends a dump of the whole activation to some messages.
    text = text.split(" (in activation", 1)[0]
    if len(args) >= 3 and isinstance(args[1], type) and args[2]:
        cause = args[2]
        detail = "; ".join(map(str, cause)) if isinstance(cause, tuple) else str(cause)
        detail = detail.split(" (in activation", 1)[0]
        if text in _GENERIC_MESSAGES:
            # celpy says "return error for overflow" for every ValueError.
            text = f"{args[1].__name__}: {detail}"
        else:
            text = f"{text} ({args[1].__name__}: {detail})"
    return clip_message(text)


# ------------------------------------------------------------------ the engine


class CelPyBoundVariables:
    """Variables converted once to celpy values, for many evaluations."""

    __slots__ = ("_sizes", "_variables")

    def __init__(self, variables: dict[str, Any], sizes: tuple[int, int]) -> None:
        self._variables = variables
        self._sizes = sizes

    @property
    def engine_name(self) -> str:
        return CELPY_ENGINE_NAME


class CelPyProgram:
    """A compiled celpy program (interpreted runner). Safe to share between threads."""

    __slots__ = ("_analysis", "_engine", "_names", "_runner", "source")

    def __init__(
        self, source: str, runner: Any, analysis: CostAnalysis | None, engine: CelPyEngine
    ) -> None:
        self.source = source
        self._runner = runner
        self._analysis = analysis
        self._engine = engine
        self._names = read_names(source)

    def evaluate(self, activation: Mapping[str, Any] | CelPyBoundVariables) -> Any:
        """Evaluate against JSON variables (or bound ones); return a JSON value."""
        if isinstance(activation, CelPyBoundVariables):
            variables, sizes = activation._variables, activation._sizes
        elif isinstance(activation, Mapping):
            variables, sizes = self._engine._convert(
                only_named(activation, self._names), self.source
            )
        else:
            raise wrong_activation(CELPY_ENGINE_NAME, activation)
        if self._analysis is not None:
            self._analysis.admit(*sizes)
        try:
            result = self._runner.evaluate(variables)
        except _OverLimit as exc:
            raise too_costly_error(
                self.source,
                exc.message,
                limit=exc.limit,
                found=exc.found,
                maximum=exc.maximum,
                phase="evaluate",
            ) from None
        except celpy.CELEvalError as exc:
            raise evaluation_error(self.source, _describe(exc)) from exc
        except Exception as exc:
            raise evaluation_error(self.source, f"{type(exc).__name__}: {exc}") from exc
        if isinstance(result, celpy.CELEvalError):
            raise evaluation_error(self.source, _describe(result))
        return result_to_json(self.source, _as_type(result))


class CelPyEngine(CachedEngine[CelPyProgram]):
    """The reference engine: cel-python, interpreted, with CEL spec number semantics.

    Args:
        functions: the custom functions to expose (read once, now); the
            process-wide default registry when omitted.
        cache_size: how many compiled programs to keep.
        limits: the cost limits (`DEFAULT_COST_LIMITS` when omitted), whose
            `step_limit` bounds each evaluation.
    """

    def __init__(
        self,
        functions: FunctionRegistry | None = None,
        *,
        cache_size: int = 4096,
        limits: CostLimits | None = None,
    ) -> None:
        super().__init__(functions, cache_size, limits)
        self._env = celpy.Environment(runner_class=_SpecRunner)
        self._functions: dict[str, Callable[..., Any]] = _spec_functions(self._limits)
        for function in self._registry:
            self._functions[function.name] = _wrap(function, self._limits)

    @property
    def name(self) -> str:
        return CELPY_ENGINE_NAME

    def evaluate(self, source: str, activation: Mapping[str, Any] | CelPyBoundVariables) -> Any:
        """Compile (cached) and evaluate `source`."""
        return self.compile(source).evaluate(activation)

    def bind(self, activation: Mapping[str, Any]) -> CelPyBoundVariables:
        """Convert `activation` once, to evaluate many expressions against it."""
        return CelPyBoundVariables(*self._convert(activation, "<bind>"))

    def _convert(
        self, activation: Mapping[str, Any], source: str
    ) -> tuple[dict[str, Any], tuple[int, int]]:
        sizes = Sizes()
        try:
            variables = {
                name: _to_cel(to_plain(value, 0, sizes)) for name, value in activation.items()
            }
        except ValueConversionError as exc:
            raise evaluation_error(source, str(exc)) from exc
        return variables, sizes.pair()

    def _compile(self, source: str, analysis: CostAnalysis | None) -> CelPyProgram:
        try:
            ast = self._env.compile(source)
        except celpy.CELParseError as exc:
            raise ExpressionError(
                f"syntax error at line {exc.line} column {exc.column}",
                expression=source,
                code="expression.syntax",
            ) from exc
        except Exception as exc:
            raise syntax_error(source, f"{type(exc).__name__}: {exc}") from exc
        for node in ast.iter_subtrees():
            if (
                node.data == "ident_arg"
                and str(node.children[0]) == "has"
                and (len(node.children) < 2 or _has_selection(node.children[1]) is None)
            ):
                raise invalid_has_error(source)
        _check_literals(source, ast)
        _check_macro_variables(source, ast)
        check_functions(source, _called_functions(ast), self._registry)
        runner = self._env.program(ast, functions=self._functions)
        runner.max_steps = self._limits.step_limit
        return CelPyProgram(source, runner, analysis, self)
