"""A definition indexed for the tick: steps by ref, edges by source and target, typed args.

Built once per definition object and cached (small LRU keyed by identity), so a
tick costs in proportion to the steps it touches, not to the size of the graph.
Holds no run state and does no I/O.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import timedelta

from ductor_core.definitions import (
    Edge,
    EdgeType,
    RetryPolicy,
    ScatterArgs,
    Step,
    StepArgs,
    StepTemplate,
    StepType,
    WaitForEventArgs,
    WaitForSignalArgs,
    WorkflowDefinition,
    decode_args,
)
from ductor_core.durations import parse_duration
from ductor_core.errors import DuctorError
from ductor_core.graph import Graph

_CACHE_SIZE = 128


@dataclass(frozen=True, slots=True)
class IndexedEdge:
    """An edge with its position in the definition and its parsed type (None if unknown)."""

    position: int
    edge: Edge
    kind: EdgeType | None


@dataclass(slots=True)
class StepIndex:
    """What the tick needs to know about one step, decoded once."""

    step: Step
    position: int
    kind: StepType | None
    args: StepArgs | None
    problem: DuctorError | None  # why the step cannot run (bad type, args, timeout...)
    timeout: timedelta | None
    incoming: list[IndexedEdge] = field(default_factory=list)
    outgoing: list[IndexedEdge] = field(default_factory=list)
    template_kind: StepType | None = None  # SCATTER of a step: the template's type
    template_args: StepArgs | None = None
    template_timeout: timedelta | None = None

    @property
    def handles_failure(self) -> bool:
        """True if a FAILURE or ALWAYS edge leaves this step (so its failure is handled)."""
        return any(e.kind in (EdgeType.FAILURE, EdgeType.ALWAYS) for e in self.outgoing)

    @property
    def retry(self) -> RetryPolicy | None:
        """The step's own retry policy, if any."""
        return self.step.retry


@dataclass(slots=True)
class DefinitionIndex:
    """A definition indexed by ref, with the waits by event / signal name."""

    definition: WorkflowDefinition
    steps: dict[str, StepIndex]
    order: list[str]
    roots: list[str]
    sinks: list[str]
    event_waiters: dict[str, list[str]]
    signal_waiters: dict[str, list[str]]


def _timeout(text: str | None) -> timedelta | None:
    return None if text is None else parse_duration(text)


def _index_template(info: StepIndex, template: StepTemplate) -> None:
    try:
        info.template_kind = StepType(template.type)
    except ValueError:
        info.problem = DuctorError(
            f"unknown scatter template type {template.type!r}",
            code="definition.unknown_step_type",
        )
        return
    info.template_args = decode_args(info.template_kind, template.args)
    info.template_timeout = _timeout(template.timeout)


def _index_step(position: int, step: Step) -> StepIndex:
    info = StepIndex(step=step, position=position, kind=None, args=None, problem=None, timeout=None)
    try:
        info.kind = step.step_type
        info.args = step.typed_args()
        info.timeout = _timeout(step.timeout)
        if isinstance(info.args, ScatterArgs) and info.args.step is not None:
            _index_template(info, info.args.step)
    except DuctorError as exc:
        info.problem = exc
    return info


def build_index(definition: WorkflowDefinition) -> DefinitionIndex:
    """Index `definition`; problems are recorded per step, never raised."""
    graph = Graph.from_definition(definition)
    steps: dict[str, StepIndex] = {}
    for position, step in enumerate(definition.steps):
        if step.ref not in steps:  # validation rejects duplicates; the first one wins here
            steps[step.ref] = _index_step(position, step)
    edges: list[IndexedEdge] = []
    for position, edge in enumerate(graph.edges):
        try:
            kind: EdgeType | None = edge.edge_type
        except DuctorError:
            kind = None
        edges.append(IndexedEdge(position=position, edge=edge, kind=kind))
    order = list(graph.refs)
    event_waiters: dict[str, list[str]] = {}
    signal_waiters: dict[str, list[str]] = {}
    for ref in order:
        info = steps[ref]
        info.incoming = [edges[p] for p in graph.incoming_positions(ref)]
        info.outgoing = [edges[p] for p in graph.outgoing_positions(ref)]
        if isinstance(info.args, WaitForEventArgs):
            event_waiters.setdefault(info.args.event, []).append(ref)
        elif isinstance(info.args, WaitForSignalArgs):
            signal_waiters.setdefault(info.args.signal, []).append(ref)
    return DefinitionIndex(
        definition=definition,
        steps=steps,
        order=order,
        roots=graph.roots,
        sinks=graph.sinks,
        event_waiters=event_waiters,
        signal_waiters=signal_waiters,
    )


_cache: OrderedDict[int, DefinitionIndex] = OrderedDict()
_cache_lock = threading.Lock()


def index_for(definition: WorkflowDefinition) -> DefinitionIndex:
    """The cached index of `definition` (by object identity; the entry keeps it alive)."""
    key = id(definition)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None and hit.definition is definition:
            _cache.move_to_end(key)
            return hit
    built = build_index(definition)
    with _cache_lock:
        _cache[key] = built
        _cache.move_to_end(key)
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return built
