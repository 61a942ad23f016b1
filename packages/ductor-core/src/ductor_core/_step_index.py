"""A definition indexed for the tick: steps by ref with their specs and typed args,
edges by source and target.

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

from ductor_core.builtin_steps import BUILTIN_STEP_SPECS
from ductor_core.definitions import (
    Edge,
    EdgeType,
    NotifyArgs,
    RetryPolicy,
    ScatterArgs,
    Step,
    StepTemplate,
    WaitForEventArgs,
    WaitForSignalArgs,
    WorkflowDefinition,
)
from ductor_core.durations import parse_duration
from ductor_core.errors import DuctorError
from ductor_core.graph import Graph
from ductor_core.step_specs import InCoordinator, OnWorker, StepSpec, StepSpecs

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
    spec: StepSpec[Any] | None
    args: msgspec.Struct | None
    problem: DuctorError | None  # why the step cannot run (bad type, args, timeout...)
    timeout: timedelta | None
    incoming: list[IndexedEdge] = field(default_factory=list)
    outgoing: list[IndexedEdge] = field(default_factory=list)
    template_spec: StepSpec[Any] | None = None  # SCATTER of a step: the template's type
    template_args: msgspec.Struct | None = None
    template_timeout: timedelta | None = None
    uses: tuple[str, ...] | None = None  # refs its expressions read (None: all)

    @property
    def kind(self) -> str | None:
        """The step's type (None if it is unknown)."""
        return None if self.spec is None else self.spec.type

    @property
    def template_kind(self) -> str | None:
        """A SCATTER's template's type (None without a step template)."""
        return None if self.template_spec is None else self.template_spec.type

    @property
    def start(self) -> OnWorker[Any] | InCoordinator | None:
        """How the step starts (None if its type is unknown)."""
        return None if self.spec is None else self.spec.start

    @property
    def template_start(self) -> OnWorker[Any] | InCoordinator | None:
        """How a SCATTER's template starts (None without a step template)."""
        return None if self.template_spec is None else self.template_spec.start

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
    specs: StepSpecs
    steps: dict[str, StepIndex]
    order: list[str]
    roots: list[str]
    sinks: list[str]
    event_waiters: dict[str, list[str]]
    signal_waiters: dict[str, list[str]]
    problem: DuctorError | None = None  # the graph cannot run at all (a cycle)


def _timeout(text: str | None) -> timedelta | None:
    return None if text is None else parse_duration(text)


def _index_template(info: StepIndex, template: StepTemplate, specs: StepSpecs) -> None:
    spec = specs.get(template.type)
    if spec is None:
        info.problem = DuctorError(
            f"unknown scatter template type {template.type!r}",
            code="definition.unknown_step_type",
        )
        return
    info.template_spec = spec
    info.template_args = spec.decode(template.args)
    info.template_timeout = _timeout(template.timeout)


def _index_step(position: int, step: Step, specs: StepSpecs) -> StepIndex:
    info = StepIndex(step=step, position=position, spec=None, args=None, problem=None, timeout=None)
    info.uses = referenced_steps(_strings(step.args))
    try:
        info.spec = specs.require(step.type)
        info.args = info.spec.decode(step.args)
        info.timeout = _timeout(step.timeout)
        if isinstance(info.args, ScatterArgs) and info.args.step is not None:
            _index_template(info, info.args.step, specs)
    except DuctorError as exc:
        info.problem = exc
    return info


def build_index(
    definition: WorkflowDefinition, specs: StepSpecs = BUILTIN_STEP_SPECS
) -> DefinitionIndex:
    """Index `definition` against the step types `specs`; problems are recorded per
    step, never raised."""
    graph = Graph.from_definition(definition)
    steps: dict[str, StepIndex] = {}
    for position, step in enumerate(definition.steps):
        if step.ref not in steps:  # validation rejects duplicates; the first one wins here
            steps[step.ref] = _index_step(position, step, specs)
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
        elif isinstance(info.args, NotifyArgs) and info.args.await_action:
            # A clicked action resumes its own NOTIFY step (`tick.notify_signal`).
            signal_waiters.setdefault(f"inbox.action:{ref}", []).append(ref)
    problem: DuctorError | None = None
    try:
        graph.topological_order()
    except DuctorError as exc:
        problem = exc
    return DefinitionIndex(
        problem=problem,
        definition=definition,
        specs=specs,
        steps=steps,
        order=order,
        roots=graph.roots,
        sinks=graph.sinks,
        event_waiters=event_waiters,
        signal_waiters=signal_waiters,
    )


_by_identity: OrderedDict[tuple[int, int], DefinitionIndex] = OrderedDict()
_by_content: OrderedDict[tuple[bytes, int], DefinitionIndex] = OrderedDict()
_cache_lock = threading.Lock()


def _remember(cache: OrderedDict[Any, DefinitionIndex], key: Any, index: DefinitionIndex) -> None:
    cache[key] = index
    cache.move_to_end(key)
    while len(cache) > _CACHE_SIZE:
        cache.popitem(last=False)


def index_for(
    definition: WorkflowDefinition, specs: StepSpecs = BUILTIN_STEP_SPECS
) -> DefinitionIndex:
    """The cached index of `definition` against the step types `specs`.

    Looked up by object identity first (the entry keeps the definition and the
    specs alive, so neither id is reused while cached), then by content, so a
    coordinator that decodes the same definition afresh for every tick pays
    one encode and hash instead of a rebuild.
    """
    key = (id(definition), id(specs))
    with _cache_lock:
        hit = _by_identity.get(key)
        if hit is not None and hit.definition is definition and hit.specs is specs:
            _by_identity.move_to_end(key)
            return hit
    digest = hashlib.blake2b(msgspec.json.encode(definition), digest_size=20).digest()
    content_key = (digest, id(specs))
    with _cache_lock:
        shared = _by_content.get(content_key)
    if shared is None or shared.specs is not specs:
        shared = build_index(definition, specs)
        with _cache_lock:
            _remember(_by_content, content_key, shared)
    index = shared if shared.definition is definition else replace(shared, definition=definition)
    with _cache_lock:
        _remember(_by_identity, key, index)
    return index
