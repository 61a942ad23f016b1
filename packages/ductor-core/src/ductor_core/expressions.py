"""CEL expressions: the only module that touches a CEL library.

Everything else speaks to an `ExpressionEngine`: compile once (cached by
source), evaluate against an activation of plain JSON values, get plain JSON
values back. Errors are `ExpressionError`s that name the expression.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import celpy
from celpy import celtypes

from ductor_core.errors import ExpressionError


@runtime_checkable
class CompiledExpression(Protocol):
    """A compiled program, safe to evaluate many times."""

    @property
    def source(self) -> str: ...

    def evaluate(self, activation: Mapping[str, Any]) -> Any:
        """Evaluate against JSON-valued variables; return a JSON value."""
        ...


@runtime_checkable
class ExpressionEngine(Protocol):
    """A CEL engine: compiles and evaluates expressions over JSON values."""

    @property
    def name(self) -> str: ...

    def compile(self, source: str) -> CompiledExpression:
        """Compile `source` (cached); raises ExpressionError on bad syntax."""
        ...

    def evaluate(self, source: str, activation: Mapping[str, Any]) -> Any:
        """Compile (cached) and evaluate `source` in one call."""
        ...


def to_json(value: Any) -> Any:
    """Convert a CEL value back to plain JSON-compatible Python."""
    if isinstance(value, celtypes.BoolType | bool):
        return bool(value)
    if isinstance(value, celtypes.IntType | celtypes.UintType):
        return int(value)
    if isinstance(value, celtypes.DoubleType):
        return float(value)
    if isinstance(value, celtypes.StringType):
        return str(value)
    if isinstance(value, celtypes.BytesType):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, celtypes.TimestampType):
        return value.astimezone(datetime.UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, celtypes.DurationType):
        return f"{value.total_seconds():g}s"
    if isinstance(value, Mapping):
        return {str(to_json(k)): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if value is None or isinstance(value, celtypes.NullType):
        return None
    return value


class _CelPyProgram:
    __slots__ = ("_lock", "_program", "source")

    def __init__(self, source: str, program: Any) -> None:
        self.source = source
        self._program = program
        self._lock = threading.Lock()

    def evaluate(self, activation: Mapping[str, Any]) -> Any:
        cel_activation = {name: celpy.json_to_cel(value) for name, value in activation.items()}
        try:
            result = self._program.evaluate(cel_activation)
        except celpy.CELEvalError as exc:
            raise ExpressionError(
                f"evaluation failed: {exc.args[0] if exc.args else exc}",
                expression=self.source,
                code="expression.evaluation",
            ) from exc
        if isinstance(result, celpy.CELEvalError):
            raise ExpressionError(
                f"evaluation failed: {result.args[0] if result.args else result}",
                expression=self.source,
                code="expression.evaluation",
            )
        return to_json(result)


class CelPyEngine:
    """The reference engine, cel-python (interpreted runner)."""

    name = "cel-python"

    def __init__(self) -> None:
        self._env = celpy.Environment()
        self._cache: dict[str, _CelPyProgram] = {}

    def compile(self, source: str) -> _CelPyProgram:
        cached = self._cache.get(source)
        if cached is not None:
            return cached
        try:
            ast = self._env.compile(source)
        except celpy.CELParseError as exc:
            raise ExpressionError(
                f"syntax error: {exc.args[0] if exc.args else exc}",
                expression=source,
                code="expression.syntax",
            ) from exc
        program = _CelPyProgram(source, self._env.program(ast))
        self._cache[source] = program
        return program

    def evaluate(self, source: str, activation: Mapping[str, Any]) -> Any:
        return self.compile(source).evaluate(activation)


_default: ExpressionEngine | None = None


def default_engine() -> ExpressionEngine:
    """The process-wide default engine."""
    global _default
    if _default is None:
        _default = CelPyEngine()
    return _default
