"""A definition indexed for the tick: steps by ref, edges by source and target, typed args.

Built once per definition and cached (small LRUs keyed by identity and by
content), so a tick costs in proportion to the steps it touches, not to the
size of the graph.
Holds no run state and does no I/O.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import msgspec

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

_STEPS_TOKEN = re.compile(r"\bsteps\b")
_STEPS_FIELD = re.compile(r"\bsteps\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)")


def referenced_steps(sources: Iterable[str]) -> tuple[str, ...] | None:
    """The refs that `sources` name as `steps.<ref>`, or None if any uses `steps`
    another way (`steps["a-b"]`, `size(steps)`), so the whole map is needed.

    Over-inclusion is harmless (a literal "steps.x" adds x); a use of `steps`
    that is not `steps.<ident>` always gives None, so nothing is ever left out.
    """
    refs: dict[str, None] = {}
    for source in sources:
        fields = _STEPS_FIELD.findall(source)
        if len(_STEPS_TOKEN.findall(source)) != len(fields):
            return None
        refs.update(dict.fromkeys(fields))
    return tuple(refs)


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


@dataclass(frozen=True, slots=True)
class IndexedEdge:
    """An edge with its position in the definition and its parsed type (None if unknown)."""

    position: int
    edge: Edge
    kind: EdgeType | None
    uses: tuple[str, ...] | None = ()  # refs the condition reads (None: all)


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
    uses: tuple[str, ...] | None = None  # refs its expressions read (None: all)

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
    problem: DuctorError | None = None  # the graph cannot run at all (a cycle)


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
    info.uses = referenced_steps(_strings(step.args))
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
        uses = referenced_steps([edge.condition] if edge.condition is not None else [])
        edges.append(IndexedEdge(position=position, edge=edge, kind=kind, uses=uses))
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
    problem: DuctorError | None = None
    try:
        graph.topological_order()
    except DuctorError as exc:
        problem = exc
    return DefinitionIndex(
        problem=problem,
        definition=definition,
        steps=steps,
        order=order,
        roots=graph.roots,
        sinks=graph.sinks,
        event_waiters=event_waiters,
        signal_waiters=signal_waiters,
    )


_by_identity: OrderedDict[int, DefinitionIndex] = OrderedDict()
_by_content: OrderedDict[bytes, DefinitionIndex] = OrderedDict()
_cache_lock = threading.Lock()


def _remember(cache: OrderedDict[Any, DefinitionIndex], key: Any, index: DefinitionIndex) -> None:
    cache[key] = index
    cache.move_to_end(key)
    while len(cache) > _CACHE_SIZE:
        cache.popitem(last=False)


def index_for(definition: WorkflowDefinition) -> DefinitionIndex:
    """The cached index of `definition`.

    Looked up by object identity first (the entry keeps the object alive, so
    an id is never reused while cached), then by content, so a coordinator
    that decodes the same definition afresh for every tick pays one encode and
    hash instead of a rebuild.
    """
    key = id(definition)
    with _cache_lock:
        hit = _by_identity.get(key)
        if hit is not None and hit.definition is definition:
            _by_identity.move_to_end(key)
            return hit
    digest = hashlib.blake2b(msgspec.json.encode(definition), digest_size=20).digest()
    with _cache_lock:
        shared = _by_content.get(digest)
    if shared is None:
        shared = build_index(definition)
        with _cache_lock:
            _remember(_by_content, digest, shared)
    index = shared if shared.definition is definition else replace(shared, definition=definition)
    with _cache_lock:
        _remember(_by_identity, key, index)
    return index
