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

from ductor_core.expressions._cost import CostAnalysis
from ductor_core.expressions._engine_base import (
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
from ductor_core.expressions._functions import CustomFunction, FunctionRegistry
from ductor_core.expressions._limits import CostLimits
from ductor_core.expressions._values import Sizes, ValueConversionError, to_json, to_plain

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


class CelRustBoundVariables:
    """Variables converted once into a cel-rust context, for many evaluations.

    Evaluating against a bound set skips converting the variables again, which
    is most of the cost of an evaluation. The context also carries the
    engine's functions, so only the engine that bound it takes it. Not
    thread-safe: use one per thread.
    """

    __slots__ = ("_context", "_engine", "_sizes")

    def __init__(self, context: Any, sizes: tuple[int, int, int], engine: CelRustEngine) -> None:
        self._context = context
        self._sizes = sizes
        self._engine = engine

    @property
    def engine_name(self) -> str:
        return CEL_RUST_ENGINE_NAME


class CelRustProgram:
    """A compiled cel-rust program. Safe to share between threads.

    cel-rust cannot be stopped once it runs, so the only runtime limit is the
    check before: the cost estimated again with the sizes of the variables and
    the weight of their lists' items.
    """

    __slots__ = ("_analysis", "_engine", "_names", "_program", "source")

    def __init__(
        self, source: str, program: Any, analysis: CostAnalysis | None, engine: CelRustEngine
    ) -> None:
        self.source = source
        self._program = program
        self._analysis = analysis
        self._engine = engine
        self._names = read_names(source)

    def admit(
        self, activation: Mapping[str, Any] | CelRustBoundVariables
    ) -> tuple[CelRustBoundVariables, int]:
        """The variables converted for an evaluation (bound ones as they are) and its
        cost estimated with their sizes; raises `expression.too_costly` over the limits.

        `evaluate` does the same first; a caller that runs costly evaluations
        elsewhere (the server's sandbox) asks here, then evaluates the variables
        returned.
        """
        if isinstance(activation, CelRustBoundVariables):
            if activation._engine is not self._engine:
                raise TypeError(
                    "these variables were bound by another cel-rust engine; bind them again"
                )
            bound = activation
        elif isinstance(activation, Mapping):
            context, sizes = self._engine._context(only_named(activation, self._names), self.source)
            bound = CelRustBoundVariables(context, sizes, self._engine)
        else:
            raise wrong_activation(CEL_RUST_ENGINE_NAME, activation)
        if self._analysis is None:
            return bound, 0
        return bound, self._analysis.admit(*bound._sizes)

    def evaluate(self, activation: Mapping[str, Any] | CelRustBoundVariables) -> Any:
        """Evaluate against JSON variables (or bound ones); return a JSON value."""
        if isinstance(activation, CelRustBoundVariables):
            if activation._engine is not self._engine:
                raise TypeError(
                    "these variables were bound by another cel-rust engine; bind them again"
                )
            context, sizes = activation._context, activation._sizes
        elif isinstance(activation, Mapping):
            context, sizes = self._engine._context(only_named(activation, self._names), self.source)
        else:
            raise wrong_activation(CEL_RUST_ENGINE_NAME, activation)
        if self._analysis is not None:
            self._analysis.admit(*sizes)
        try:
            result = self._program.execute(context)
        except Exception as exc:
            raise evaluation_error(
                self.source, clip_message(f"{type(exc).__name__}: {exc}")
            ) from exc
        return result_to_json(self.source, result)


class CelRustEngine(CachedEngine[CelRustProgram]):
    """The fast engine: cel-rust through its Python bindings.

    Args:
        functions: the custom functions to expose (read once, now); the
            process-wide default registry when omitted.
        cache_size: how many compiled programs to keep.
        limits: the cost limits (`DEFAULT_COST_LIMITS` when omitted); the
            engine has no step limit (`max_steps` is not used).
    """

    def __init__(
        self,
        functions: FunctionRegistry | None = None,
        *,
        cache_size: int = 4096,
        limits: CostLimits | None = None,
    ) -> None:
        super().__init__(functions, cache_size, limits)
        self._functions = {f.name: _wrap(f) for f in self._registry}

    @property
    def name(self) -> str:
        return CEL_RUST_ENGINE_NAME

    def evaluate(self, source: str, activation: Mapping[str, Any] | CelRustBoundVariables) -> Any:
        """Compile (cached) and evaluate `source`."""
        return self.compile(source).evaluate(activation)

    def bind(self, activation: Mapping[str, Any]) -> CelRustBoundVariables:
        """Convert `activation` once, to evaluate many expressions against it."""
        context, sizes = self._context(activation, "<bind>")
        return CelRustBoundVariables(context, sizes, self)

    def _context(
        self, activation: Mapping[str, Any], source: str
    ) -> tuple[Any, tuple[int, int, int]]:
        sizes = Sizes()
        try:
            variables = {name: to_plain(value, 0, sizes) for name, value in activation.items()}
        except ValueConversionError as exc:
            raise evaluation_error(source, str(exc)) from exc
        try:
            context = _cel().Context(variables=variables, functions=self._functions)
        except (ValueError, TypeError, OverflowError) as exc:
            # to_plain checks what cel-rust is known to refuse; anything else it
            # refuses is still the caller's value, not a crash.
            raise evaluation_error(source, clip_message(str(exc))) from exc
        return context, (sizes.items, sizes.chars, sizes.heft)

    def _compile(self, source: str, analysis: CostAnalysis | None) -> CelRustProgram:
        try:
            program = _cel().compile(source)
        except Exception as exc:
            raise syntax_error(source, _syntax_message(exc)) from exc
        called = {name for name in program.functions() if _IDENTIFIER.match(name)}
        if "has" in called:
            # The macro never shows up as a call; a `has` that does is has()
            # with no argument or several, which cel-rust leaves to run time.
            raise invalid_has_error(source)
        check_functions(source, called, self._registry)
        return CelRustProgram(source, program, analysis, self)


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
