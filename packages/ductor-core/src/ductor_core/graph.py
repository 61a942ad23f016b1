"""The step graph of a definition: edge indexes, roots, sinks, order, ancestry, cycles.

Pure and structural: it never looks at step types, args or expressions, and it
never decides whether a definition is valid (that is `validation`'s job).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Sequence

from ductor_core.definitions import Edge, WorkflowDefinition
from ductor_core.errors import DefinitionError


class Graph:
    """The directed graph of steps (nodes, by ref) and edges.

    Steps are kept in document order; a repeated ref counts once (its first
    occurrence). An edge whose source or target is not a step is *dangling*:
    it is kept in `edges` (so positions stay stable) but left out of every
    index and walk. Document order breaks every tie, so all answers are
    deterministic.

    Args:
        refs: the step refs, in document order.
        edges: the edges, in document order.
    """

    __slots__ = ("_ancestor_bits", "_incoming", "_index", "_outgoing", "edges", "refs")

    def __init__(self, refs: Iterable[str], edges: Sequence[Edge]) -> None:
        self.refs: tuple[str, ...] = tuple(dict.fromkeys(refs))
        self.edges: tuple[Edge, ...] = tuple(edges)
        self._index: dict[str, int] = {ref: i for i, ref in enumerate(self.refs)}
        self._incoming: dict[str, list[int]] = {ref: [] for ref in self.refs}
        self._outgoing: dict[str, list[int]] = {ref: [] for ref in self.refs}
        self._ancestor_bits: list[int] | None = None
        for position, edge in enumerate(self.edges):
            if edge.source_ref in self._index and edge.target_ref in self._index:
                self._outgoing[edge.source_ref].append(position)
                self._incoming[edge.target_ref].append(position)

    @classmethod
    def from_definition(cls, definition: WorkflowDefinition) -> Graph:
        """Build the graph of a decoded definition."""
        return cls((step.ref for step in definition.steps), definition.edges)

    def __contains__(self, ref: object) -> bool:
        return ref in self._index

    def incoming(self, ref: str) -> list[Edge]:
        """The edges into `ref`, in document order (empty for an unknown ref)."""
        return [self.edges[p] for p in self._incoming.get(ref, ())]

    def outgoing(self, ref: str) -> list[Edge]:
        """The edges out of `ref`, in document order (empty for an unknown ref)."""
        return [self.edges[p] for p in self._outgoing.get(ref, ())]

    def incoming_positions(self, ref: str) -> list[int]:
        """Positions in `edges` of the edges into `ref`."""
        return list(self._incoming.get(ref, ()))

    def outgoing_positions(self, ref: str) -> list[int]:
        """Positions in `edges` of the edges out of `ref`."""
        return list(self._outgoing.get(ref, ()))

    @property
    def roots(self) -> list[str]:
        """Steps with no incoming edge: where a run starts."""
        return [ref for ref in self.refs if not self._incoming[ref]]

    @property
    def sinks(self) -> list[str]:
        """Steps with no outgoing edge: where the graph ends."""
        return [ref for ref in self.refs if not self._outgoing[ref]]

    def topological_order(self) -> list[str]:
        """Every step after all of its predecessors; ties go to document order.

        Raises:
            DefinitionError: code `definition.cycle`, naming one cycle's path.
        """
        pending = {ref: len(self._incoming[ref]) for ref in self.refs}
        ready = [self._index[ref] for ref in self.refs if pending[ref] == 0]
        heapq.heapify(ready)
        order: list[str] = []
        while ready:
            ref = self.refs[heapq.heappop(ready)]
            order.append(ref)
            for position in self._outgoing[ref]:
                target = self.edges[position].target_ref
                pending[target] -= 1
                if pending[target] == 0:
                    heapq.heappush(ready, self._index[target])
        if len(order) != len(self.refs):
            cycle = self.cycles()[0]
            raise DefinitionError(
                f"the steps form a cycle: {self.describe_cycle(cycle)}",
                code="definition.cycle",
                details={"cycle": self.cycle_refs(cycle)},
            )
        return order

    def ancestors(self, ref: str) -> frozenset[str]:
        """Every step from which `ref` can be reached (not `ref` itself unless on a cycle)."""
        return self._walk([ref], self._incoming, source_side=True)

    def precedes(self, earlier: str, later: str) -> bool:
        """Whether a path of edges leads from `earlier` to `later` (an ancestor test).

        Answers from bitsets built once in topological order, so asking about
        every pair of a 1,000-step graph stays cheap; on a cyclic graph it
        walks instead.
        """
        if earlier not in self._index or later not in self._index:
            return False
        bits = self._ancestors_as_bits()
        if bits is None:
            return earlier in self.ancestors(later)
        return bool(bits[self._index[later]] >> self._index[earlier] & 1)

    def descendants(self, ref: str) -> frozenset[str]:
        """Every step reachable from `ref` (not `ref` itself unless on a cycle)."""
        return self._walk([ref], self._outgoing, source_side=False)

    def reachable_from_roots(self) -> frozenset[str]:
        """Every step that a root reaches, roots included."""
        roots = self.roots
        return self._walk(roots, self._outgoing, source_side=False) | frozenset(roots)

    def cycles(self) -> list[list[int]]:
        """One cycle per strongly connected group of steps, as edge positions.

        Each cycle is the list of positions in `edges` that go round it once,
        starting from its step earliest in the document; a self-loop is a
        cycle of one edge. Cycles are ordered by their earliest step.
        """
        found: list[tuple[int, list[int]]] = []
        for component in self._components():
            members = set(component)
            start = min(component, key=self._index.__getitem__)
            if len(component) == 1:
                loops = [p for p in self._outgoing[start] if self.edges[p].target_ref == start]
                if loops:
                    found.append((self._index[start], [loops[0]]))
                continue
            found.append((self._index[start], self._cycle_through(start, members)))
        found.sort(key=lambda item: item[0])
        return [cycle for _, cycle in found]

    def cycle_refs(self, cycle: Sequence[int]) -> list[str]:
        """The refs a cycle passes through, its first step repeated at the end."""
        refs = [self.edges[p].source_ref for p in cycle]
        return [*refs, refs[0]] if refs else []

    def describe_cycle(self, cycle: Sequence[int]) -> str:
        """A cycle as a readable path, e.g. `a -> b -> c -> a`."""
        return " -> ".join(self.cycle_refs(cycle))

    # --- internals -----------------------------------------------------------

    def _ancestors_as_bits(self) -> list[int] | None:
        """Per step (by document index), its ancestors as a bitset; None if cyclic."""
        if self._ancestor_bits is None:
            try:
                order = self.topological_order()
            except DefinitionError:
                return None
            bits = [0] * len(self.refs)
            for ref in order:
                mine = 0
                for position in self._incoming[ref]:
                    source = self._index[self.edges[position].source_ref]
                    mine |= bits[source] | (1 << source)
                bits[self._index[ref]] = mine
            self._ancestor_bits = bits
        return self._ancestor_bits

    def _walk(
        self, start: Iterable[str], index: dict[str, list[int]], *, source_side: bool
    ) -> frozenset[str]:
        seen: set[str] = set()
        stack = [ref for ref in start if ref in self._index]
        while stack:
            ref = stack.pop()
            for position in index[ref]:
                edge = self.edges[position]
                nxt = edge.source_ref if source_side else edge.target_ref
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return frozenset(seen)

    def _components(self) -> list[list[str]]:
        """Strongly connected components (Tarjan's algorithm, iterative)."""
        index_of: dict[str, int] = {}
        low: dict[str, int] = {}
        on_stack: set[str] = set()
        stack: list[str] = []
        components: list[list[str]] = []
        counter = 0
        for root in self.refs:
            if root in index_of:
                continue
            work: list[tuple[str, int]] = [(root, 0)]
            index_of[root] = low[root] = counter
            counter += 1
            stack.append(root)
            on_stack.add(root)
            while work:
                ref, next_edge = work[-1]
                out = self._outgoing[ref]
                if next_edge < len(out):
                    work[-1] = (ref, next_edge + 1)
                    target = self.edges[out[next_edge]].target_ref
                    if target not in index_of:
                        index_of[target] = low[target] = counter
                        counter += 1
                        stack.append(target)
                        on_stack.add(target)
                        work.append((target, 0))
                    elif target in on_stack:
                        low[ref] = min(low[ref], index_of[target])
                    continue
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[ref])
                if low[ref] == index_of[ref]:
                    component: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == ref:
                            break
                    components.append(component)
        return components

    def _cycle_through(self, start: str, members: set[str]) -> list[int]:
        """A shortest cycle from `start` back to itself inside one component."""
        # Breadth-first from start; every member of a strongly connected
        # component reaches start, so the search always closes. Self-loops are
        # left out: they are cycles of their own.
        came_by: dict[str, int] = {}
        queue = deque([start])
        while queue:
            ref = queue.popleft()
            for position in self._outgoing[ref]:
                target = self.edges[position].target_ref
                if target == ref or target not in members or target in came_by:
                    continue
                came_by[target] = position
                if target == start:
                    return self._path_back(came_by, start)
                queue.append(target)
        raise AssertionError(f"{start!r} is not on a cycle")  # pragma: no cover

    def _path_back(self, came_by: dict[str, int], start: str) -> list[int]:
        path: list[int] = []
        ref = start
        while True:
            position = came_by[ref]
            path.append(position)
            ref = self.edges[position].source_ref
            if ref == start:
                break
        path.reverse()
        return path
