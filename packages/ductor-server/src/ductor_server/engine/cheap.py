"""Whether a tick is cheap enough to compute on the event loop, decided without
evaluating anything: from the static cost of the definition's CEL and a bounded
measure of the values the tick would bind. Pure; reads no store.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import msgspec

from ductor_core.builtin_steps import ACTION
from ductor_core.definitions import WorkflowDefinition
from ductor_core.errors import DuctorError
from ductor_core.expressions import CostLimits, ExpressionEngine, estimate_cost
from ductor_core.runs import RunInput, RunState
from ductor_core.step_specs import InCoordinator, StepSpecs

INLINE_BYTES = 4 * 1024
"""The most a tick of a definition with CEL may bind (run input, finished steps'
outputs, pending inputs; about their JSON size) and still run on the loop.

Converting the variables is most of an evaluation: on cel-rust, binding 64 KiB
of small objects takes 11-15 ms before any expression runs, 4 KiB well under
1 ms. A definition without CEL converts nothing, so it is cheap at any size.
"""

INLINE_COST: Mapping[str, int] = {"cel-rust": 2_000, "cel-python": 500}
"""The most the CEL of a definition may cost in all (`estimate_cost` units, with
every variable as big as `INLINE_BYTES` allows) and still run on the loop, per
engine. A unit is about 0.05 to 2 us on cel-rust and 10 to 40 us on
cel-python; an engine not named here never evaluates on the loop."""

INLINE_LIMITS = CostLimits(assumed_items=INLINE_BYTES // 2, assumed_chars=INLINE_BYTES)
"""The sizes assumed when estimating for the loop: the largest list and string a
value of `INLINE_BYTES` can hold ("1," per item), not the engine's defaults."""

_NO_CEL = 0
_COSTLY = -1
_CACHE_SIZE = 1024

# The types whose tick evaluates args beyond their spec's `expressions` (dataflow
# operations, scatter items and templates, event matches): every string counts.
_EVALUATES_ANY_ARG = frozenset(
    {InCoordinator.DATAFLOW, InCoordinator.SCATTER, InCoordinator.WAIT_FOR_EVENT}
)

_costs: OrderedDict[tuple[int, int], tuple[WorkflowDefinition, StepSpecs, int]] = OrderedDict()
_costs_lock = threading.Lock()


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def cel_sources(definition: WorkflowDefinition, specs: StepSpecs) -> Iterator[str]:
    """Every string the tick (or a trigger match) of `definition` may evaluate as
    CEL. Over-inclusive where a step type's own code picks what it evaluates."""
    for edge in definition.edges:
        if edge.condition is not None:
            yield edge.condition
    output = definition.output
    if isinstance(output, str):
        yield output
    elif isinstance(output, dict):
        yield from output.values()
    for trigger in definition.triggers:
        if trigger.filter is not None:
            yield trigger.filter
    if definition.concurrency is not None and definition.concurrency.key:
        yield definition.concurrency.key
    for step in definition.steps:
        spec = specs.get(step.type)
        worker = spec.worker if spec is not None else None
        precise = (
            spec is not None
            and spec.start not in _EVALUATES_ANY_ARG
            and (worker is None or worker.payload is None or spec is ACTION)
        )
        if spec is not None and precise:
            for name in spec.expressions:
                yield from _strings(step.args.get(name))
            if spec.start is InCoordinator.NOTIFY:
                yield from _notify_sources(step.args)
        else:
            yield from _strings(step.args)


def _notify_sources(args: Mapping[str, Any]) -> Iterator[str]:
    # A NOTIFY's CTA labels and URLs and its email subject are CEL too; its feed,
    # action names and timeout are not.
    ctas = args.get("ctas")
    for cta in ctas if isinstance(ctas, list) else ():
        if isinstance(cta, Mapping):
            for name in ("label", "url"):
                if isinstance(cta.get(name), str):
                    yield cta[name]
    email = args.get("email")
    if isinstance(email, Mapping) and isinstance(email.get("subject"), str):
        yield email["subject"]


def _total_cost(sources: Iterable[str]) -> int:
    total = _NO_CEL
    for source in sources:
        try:
            total += estimate_cost(source, INLINE_LIMITS).cost
        except DuctorError:
            return _COSTLY  # unreadable or over a structural limit: not ours to judge
    return total


def definition_cost(definition: WorkflowDefinition, specs: StepSpecs) -> int:
    """The estimated cost of all of `definition`'s CEL at the inline sizes: 0
    without CEL, -1 when some expression cannot be estimated. Cached per
    definition object (the catalog hands out the same one for a version)."""
    key = (id(definition), id(specs))
    with _costs_lock:
        hit = _costs.get(key)
        if hit is not None and hit[0] is definition and hit[1] is specs:
            _costs.move_to_end(key)
            return hit[2]
    cost = _total_cost(cel_sources(definition, specs))
    with _costs_lock:
        _costs[key] = (definition, specs, cost)  # kept alive, so the ids stay unique
        while len(_costs) > _CACHE_SIZE:
            _costs.popitem(last=False)
    return cost


def small(values: Iterable[Any], limit: int = INLINE_BYTES) -> bool:
    """Whether `values` together take about `limit` bytes of JSON or less.

    Walks at most about `limit` nodes whatever the size of the values, so
    asking about a huge input is as quick as about a small one.
    """
    budget = limit
    stack: list[Any] = list(values)
    while stack:
        value = stack.pop()
        if isinstance(value, str | bytes):
            budget -= len(value) + 2
        elif isinstance(value, dict):
            budget -= 2 + len(value)
            for key, item in value.items():
                stack.append(key)
                stack.append(item)
        elif isinstance(value, list | tuple):
            budget -= 2 + len(value)
            stack.extend(value)
        elif isinstance(value, msgspec.Struct):
            budget -= 2
            stack.extend(msgspec.structs.astuple(value))
        else:
            budget -= 8  # a number, a boolean, null, a timestamp
        if budget < 0:
            return False
    return True


def cheap(
    definition: WorkflowDefinition,
    specs: StepSpecs,
    engine: ExpressionEngine,
    bound: Iterable[Any],
) -> bool:
    """Whether evaluating `definition`'s CEL over the values in `bound` is cheap
    enough for the event loop: no CEL at all, or CEL within `INLINE_COST` for
    the engine over values within `INLINE_BYTES`."""
    cost = definition_cost(definition, specs)
    if cost == _NO_CEL:
        return True
    if cost < 0 or cost > INLINE_COST.get(engine.name, -1):
        return False
    return small(bound)


def tick_binds(state: RunState, inputs: Iterable[RunInput]) -> Iterator[Any]:
    """What a tick of a run may bind: its input, its finished steps' outputs and
    the inputs it is given."""
    yield state.input
    for step in state.steps.values():
        yield step.output
    yield from inputs


__all__ = [
    "INLINE_BYTES",
    "INLINE_COST",
    "INLINE_LIMITS",
    "cel_sources",
    "cheap",
    "definition_cost",
    "small",
    "tick_binds",
]
