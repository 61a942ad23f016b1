"""The five DATAFLOW operations (project, filter, map, merge, pick), evaluated inline.

Pure: values in, value out, through an `ExpressionEngine`. Raises DuctorErrors;
the tick turns them into a failed step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ductor_core.definitions import DataflowArgs
from ductor_core.errors import DefinitionError, ExpressionError
from ductor_core.expressions import (
    DEFAULT_COST_LIMITS,
    CostLimits,
    ExpressionEngine,
    admit_repeated,
)

# Bound afresh for each item; the rest of the variables are converted again each time.
_PER_ITEM = frozenset({"item", "index"})


def _limits(engine: ExpressionEngine) -> CostLimits:
    # Every engine of this package holds its limits; one that does not gets the defaults.
    limits = getattr(engine, "limits", DEFAULT_COST_LIMITS)
    return limits if isinstance(limits, CostLimits) else DEFAULT_COST_LIMITS


def _need(value: Any, field: str, operation: str) -> Any:
    if value is None:
        raise DefinitionError(f"dataflow {operation!r} needs {field!r}", code="definition.bad_args")
    return value


def _list(engine: ExpressionEngine, source: str, activation: Mapping[str, Any]) -> list[Any]:
    value = engine.evaluate(source, activation)
    if not isinstance(value, list):
        raise ExpressionError(
            f"expected a list, got {type(value).__name__}",
            expression=source,
            code="expression.evaluation",
        )
    return value


def _map(engine: ExpressionEngine, source: str, activation: Mapping[str, Any]) -> dict[str, Any]:
    value = engine.evaluate(source, activation)
    if not isinstance(value, dict):
        raise ExpressionError(
            f"expected a map, got {type(value).__name__}",
            expression=source,
            code="expression.evaluation",
        )
    return value


def run_dataflow(
    args: DataflowArgs, engine: ExpressionEngine, activation: Mapping[str, Any]
) -> Any:
    """Evaluate a DATAFLOW step and return its output.

    - project: `{key: value of expression}`;
    - filter: the elements of `items` for which `predicate` (over `item`, `index`) is true;
    - map: `expression` (over `item`, `index`) for each element of `items`;
    - merge: the maps of `sources` merged left to right (later keys win);
    - pick: the `keys` present in the map `source` evaluates to (absent keys are left out).

    Raises:
        ExpressionError: an expression failed or gave the wrong kind of value.
        DefinitionError: the args lack what the operation needs.
    """
    op = args.operation
    if op == "project":
        project: dict[str, str] = _need(args.project, "project", op)
        return {key: engine.evaluate(expr, activation) for key, expr in project.items()}
    if op == "filter":
        items = _list(engine, _need(args.items, "items", op), activation)
        predicate: str = _need(args.predicate, "predicate", op)
        admit_repeated(predicate, activation, len(items), _limits(engine), per_item=_PER_ITEM)
        kept: list[Any] = []
        for index, item in enumerate(items):
            verdict = engine.evaluate(predicate, {**activation, "item": item, "index": index})
            if not isinstance(verdict, bool):
                raise ExpressionError(
                    f"predicate must be a bool, got {type(verdict).__name__}",
                    expression=predicate,
                    code="expression.evaluation",
                )
            if verdict:
                kept.append(item)
        return kept
    if op == "map":
        items = _list(engine, _need(args.items, "items", op), activation)
        expression: str = _need(args.expression, "expression", op)
        admit_repeated(expression, activation, len(items), _limits(engine), per_item=_PER_ITEM)
        return [
            engine.evaluate(expression, {**activation, "item": item, "index": index})
            for index, item in enumerate(items)
        ]
    if op == "merge":
        merged: dict[str, Any] = {}
        for source in _need(args.sources, "sources", op):
            merged.update(_map(engine, source, activation))
        return merged
    # pick
    picked = _map(engine, _need(args.source, "source", op), activation)
    return {key: picked[key] for key in _need(args.keys, "keys", op) if key in picked}
