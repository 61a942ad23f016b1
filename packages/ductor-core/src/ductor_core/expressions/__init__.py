"""CEL expressions: the only package that touches a CEL library.

Everything else speaks to an `ExpressionEngine`: compile once (cached by
source), evaluate against an activation of plain JSON values, get plain JSON
values back. Errors are `ExpressionError`s that name the expression, with the
codes `expression.syntax`, `expression.unknown_function` (both raised by
`compile`), `expression.evaluation`, and `expression.too_costly` (raised by
`compile` when the static cost estimate is over the engine's `CostLimits`, and
by `evaluate` when the variables make it so, or when cel-python runs past its
step limit). Nothing here reads the clock or the environment: a caller that
needs "now" passes it as a variable.

Engines (see docs/expressions.md for the differences between them):

    cel-python   CelPyEngine     the reference (default); pure Python, slow
    cel-rust     CelRustEngine   Rust-backed, same answers on the shared corpus
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ductor_core.expressions._cel_rust_engine import (
    CEL_RUST_ENGINE_NAME,
    CelRustBoundVariables,
    CelRustEngine,
    CelRustProgram,
)
from ductor_core.expressions._cost import CostEstimate, estimate_cost
from ductor_core.expressions._engine_base import CELPY_ENGINE_NAME, admit_repeated
from ductor_core.expressions._functions import (
    BUILTIN_FUNCTIONS,
    MACROS,
    STANDARD_FUNCTIONS,
    CustomFunction,
    FunctionRegistry,
    JsonFunction,
    builtin_registry,
    default_registry,
)
from ductor_core.expressions._limits import (
    DEFAULT_COST_LIMITS,
    MAX_SOURCE_LENGTH,
    MAX_VALUE_DEPTH,
    CostLimits,
)
from ductor_core.expressions._literals import string_literal
from ductor_core.expressions._program_cache import ProgramCache
from ductor_core.expressions._values import ValueConversionError, to_json
from ductor_core.expressions._variables import free_variables

if TYPE_CHECKING:
    from ductor_core.expressions._celpy_engine import (
        CelPyBoundVariables,
        CelPyEngine,
        CelPyProgram,
    )

__all__ = [
    "BUILTIN_FUNCTIONS",
    "CELPY_ENGINE_NAME",
    "CEL_RUST_ENGINE_NAME",
    "DEFAULT_COST_LIMITS",
    "ENGINE_NAMES",
    "MACROS",
    "MAX_SOURCE_LENGTH",
    "MAX_VALUE_DEPTH",
    "STANDARD_FUNCTIONS",
    "VARIABLES",
    "BoundVariables",
    "CelPyBoundVariables",
    "CelPyEngine",
    "CelPyProgram",
    "CelRustBoundVariables",
    "CelRustEngine",
    "CelRustProgram",
    "CompiledExpression",
    "CostEstimate",
    "CostLimits",
    "CustomFunction",
    "ExpressionEngine",
    "FunctionRegistry",
    "JsonFunction",
    "ProgramCache",
    "ValueConversionError",
    "admit_repeated",
    "builtin_registry",
    "default_engine",
    "default_registry",
    "engine_by_name",
    "estimate_cost",
    "free_variables",
    "make_activation",
    "string_literal",
    "to_json",
]

# The names an expression sees. `event` and `item` only where they apply
# (trigger filters and wait matches; scatter items), `now` only when the
# caller passes the time in.
VARIABLES = ("input", "steps", "run", "event", "item", "now")

ENGINE_NAMES = (CELPY_ENGINE_NAME, CEL_RUST_ENGINE_NAME)


@runtime_checkable
class BoundVariables(Protocol):
    """Variables converted once by one engine, to evaluate many expressions against.

    Only the engine that made it accepts it. Use one per thread.
    """

    @property
    def engine_name(self) -> str: ...


@runtime_checkable
class CompiledExpression(Protocol):
    """A compiled program, safe to evaluate many times and from many threads."""

    @property
    def source(self) -> str: ...

    def evaluate(self, activation: Any) -> Any:
        """Evaluate against JSON-valued variables (a mapping, or `BoundVariables`
        from the same engine); return a JSON value. Raises ExpressionError."""
        ...


@runtime_checkable
class ExpressionEngine(Protocol):
    """A CEL engine: compiles and evaluates expressions over JSON values.

    Engines are safe to share between threads: the program cache takes a lock,
    compiled programs hold no per-evaluation state.
    """

    @property
    def name(self) -> str: ...

    @property
    def functions(self) -> FunctionRegistry:
        """The custom functions the engine exposes."""
        ...

    def compile(self, source: str) -> CompiledExpression:
        """Compile `source` (cached); raises ExpressionError on bad syntax, an
        unknown function, or an estimated cost over the engine's limits."""
        ...

    def evaluate(self, source: str, activation: Any) -> Any:
        """Compile (cached) and evaluate `source` in one call."""
        ...

    def bind(self, activation: Mapping[str, Any]) -> BoundVariables:
        """Convert `activation` once, for evaluating many expressions against it."""
        ...


def make_activation(
    *,
    input: Any = None,
    steps: Mapping[str, Any] | None = None,
    run: Mapping[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The standard variables: `input`, `steps.<ref>.output`, `run`, and extras.

    Args:
        input: the run's input.
        steps: each finished step's output, by step ref; exposed as
            `steps.<ref>.output`.
        run: facts about the run (id, family, version, started_at, ...).
        **extra: `event`, `item`, `now` and the like, passed as given.
    """
    activation: dict[str, Any] = {
        "input": input,
        "steps": {ref: {"output": output} for ref, output in (steps or {}).items()},
        "run": dict(run or {}),
    }
    activation.update(extra)
    return activation


_engines: dict[str, ExpressionEngine] = {}
_engines_lock = threading.Lock()


def engine_by_name(name: str) -> ExpressionEngine:
    """The process-wide engine called `name` ("cel-python" or "cel-rust").

    Built on first use with the default function registry and shared after.
    Domain code takes an engine as a parameter; only the server edge picks one.

    Raises:
        ValueError: an unknown engine name.
    """
    with _engines_lock:
        engine = _engines.get(name)
        if engine is None:
            if name == CELPY_ENGINE_NAME:
                from ductor_core.expressions._celpy_engine import CelPyEngine

                engine = CelPyEngine()
            elif name == CEL_RUST_ENGINE_NAME:
                engine = CelRustEngine()
            else:
                raise ValueError(
                    f"unknown expression engine {name!r}; choose one of {', '.join(ENGINE_NAMES)}"
                )
            _engines[name] = engine
        return engine


def default_engine() -> ExpressionEngine:
    """The process-wide default engine: cel-python, the reference."""
    return engine_by_name(CELPY_ENGINE_NAME)


# cel-python (celpy, lark, pendulum) is loaded on first use: a server on the
# cel-rust engine never needs it.
_CELPY_NAMES = frozenset({"CelPyBoundVariables", "CelPyEngine", "CelPyProgram"})


def __getattr__(name: str) -> Any:
    if name in _CELPY_NAMES:
        from ductor_core.expressions import _celpy_engine

        return getattr(_celpy_engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
