"""The fast engine, cel-rust (PyPI `common-expression-language`, import `cel`).

The only module that imports `cel`. Same protocol, same custom functions and the
same JSON conversions as the reference engine; the shared corpus in the tests
holds the two to the same answers.
"""

from __future__ import annotations

import functools
import importlib
import logging
import re
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from ductor_core.errors import ExpressionError
from ductor_core.expressions._functions import (
    CustomFunction,
    FunctionRegistry,
    default_registry,
    unknown_functions,
)
from ductor_core.expressions._limits import check_source
from ductor_core.expressions._program_cache import ProgramCache
from ductor_core.expressions._values import ValueConversionError, to_json, to_plain

CEL_RUST_ENGINE_NAME = "cel-rust"


@functools.cache
def _cel() -> ModuleType:
    # Imported on first use: the `cel` package also loads its command-line tool
    # (prompt_toolkit, rich), which costs about a second of every process start.
    return importlib.import_module("cel")


# Operators show up in a program's function list as `_+_`, `!_`, `@in`, ...;
# only plain identifiers are function calls.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class _DropFunctionFailureWarnings(logging.Filter):
    """cel logs every failing Python function; we raise it as an ExpressionError."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Python function ")


_cel_logger = logging.getLogger("cel")
if not any(isinstance(f, _DropFunctionFailureWarnings) for f in _cel_logger.filters):
    _cel_logger.addFilter(_DropFunctionFailureWarnings())


def _wrap(function: CustomFunction) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        return to_plain(function.impl(*(to_json(arg) for arg in args)))

    call.__name__ = function.name
    return call


def _message(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 300 else text[:297] + "..."


def _evaluation_error(source: str, message: str) -> ExpressionError:
    return ExpressionError(
        f"evaluation failed: {message}", expression=source, code="expression.evaluation"
    )


class CelRustBoundVariables:
    """Variables converted once into a cel-rust context, for many evaluations.

    Evaluating against a bound set skips converting the variables again, which
    is most of the cost of an evaluation. The context also carries the
    engine's functions, so only the engine that bound it takes it. Not
    thread-safe: use one per thread.
    """

    __slots__ = ("_context", "_engine")

    def __init__(self, context: Any, engine: CelRustEngine) -> None:
        self._context = context
        self._engine = engine

    @property
    def engine_name(self) -> str:
        return CEL_RUST_ENGINE_NAME


class CelRustProgram:
    """A compiled cel-rust program. Safe to share between threads."""

    __slots__ = ("_engine", "_program", "source")

    def __init__(self, source: str, program: Any, engine: CelRustEngine) -> None:
        self.source = source
        self._program = program
        self._engine = engine

    def evaluate(self, activation: Mapping[str, Any] | CelRustBoundVariables) -> Any:
        """Evaluate against JSON variables (or bound ones); return a JSON value."""
        if isinstance(activation, CelRustBoundVariables):
            if activation._engine is not self._engine:
                raise TypeError(
                    "these variables were bound by another cel-rust engine; bind them again"
                )
            context = activation._context
        elif isinstance(activation, Mapping):
            context = self._engine._context(activation, self.source)
        else:
            raise TypeError(
                f"cannot evaluate on {CEL_RUST_ENGINE_NAME} against {type(activation).__name__}; "
                "pass a mapping or variables bound by the same engine"
            )
        try:
            result = self._program.execute(context)
        except Exception as exc:
            raise _evaluation_error(self.source, _message(exc)) from exc
        try:
            return to_json(result)
        except ValueConversionError as exc:
            raise _evaluation_error(self.source, str(exc)) from exc


class CelRustEngine:
    """The fast engine: cel-rust through its Python bindings.

    Args:
        functions: the custom functions to expose (read once, now); the
            process-wide default registry when omitted.
        cache_size: how many compiled programs to keep.
    """

    def __init__(
        self, functions: FunctionRegistry | None = None, *, cache_size: int = 4096
    ) -> None:
        self._registry = (functions or default_registry()).copy()
        self._functions = {f.name: _wrap(f) for f in self._registry}
        self._cache: ProgramCache[CelRustProgram] = ProgramCache(cache_size)

    @property
    def name(self) -> str:
        return CEL_RUST_ENGINE_NAME

    @property
    def functions(self) -> FunctionRegistry:
        """The custom functions this engine exposes (a snapshot)."""
        return self._registry

    def compile(self, source: str) -> CelRustProgram:
        """Compile `source` once (cached); raises ExpressionError."""
        return self._cache.get_or_compile(source, self._compile)

    def evaluate(self, source: str, activation: Mapping[str, Any] | CelRustBoundVariables) -> Any:
        """Compile (cached) and evaluate `source`."""
        return self.compile(source).evaluate(activation)

    def bind(self, activation: Mapping[str, Any]) -> CelRustBoundVariables:
        """Convert `activation` once, to evaluate many expressions against it."""
        return CelRustBoundVariables(self._context(activation, "<bind>"), self)

    def _context(self, activation: Mapping[str, Any], source: str) -> Any:
        try:
            variables = {name: to_plain(value) for name, value in activation.items()}
        except ValueConversionError as exc:
            raise _evaluation_error(source, str(exc)) from exc
        return _cel().Context(variables=variables, functions=self._functions)

    def _compile(self, source: str) -> CelRustProgram:
        check_source(source)
        try:
            program = _cel().compile(source)
        except Exception as exc:
            raise ExpressionError(
                f"syntax error: {_syntax_message(exc)}",
                expression=source,
                code="expression.syntax",
            ) from exc
        called = {name for name in program.functions() if _IDENTIFIER.match(name)}
        if "has" in called:
            # The macro never shows up as a call; a `has` that does is has()
            # with no argument or several, which cel-rust leaves to run time.
            raise ExpressionError(
                "syntax error: invalid argument to has(): it takes a field, has(e.f)",
                expression=source,
                code="expression.syntax",
            )
        unknown = unknown_functions(called, self._registry)
        if unknown:
            raise ExpressionError(
                f"unknown function {', '.join(unknown)}",
                expression=source,
                code="expression.unknown_function",
            )
        return CelRustProgram(source, program, self)


def _syntax_message(exc: BaseException) -> str:
    # "Failed to parse expression '...': ERROR: <input>:1:4: Syntax error: ..."
    text = str(exc)
    marker = "ERROR: <input>:"
    if marker in text:
        text = text.split(marker, 1)[1].split("\n", 1)[0]
        position, _, detail = text.partition(": ")
        line, _, column = position.partition(":")
        return f"line {line} column {column}: {detail}"
    return text.split("\n", 1)[0]
