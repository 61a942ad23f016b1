from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ductor_core import DefinitionError, Edge, Graph


def _graph(refs: str, *pairs: str) -> Graph:
    return Graph(list(refs), [Edge(source_ref=p[0], target_ref=p[1]) for p in pairs])


def test_indexes_roots_and_sinks() -> None:
    graph = _graph("abcd", "ab", "ac", "bd", "cd")
    assert graph.roots == ["a"]
    assert graph.sinks == ["d"]
    assert [e.source_ref for e in graph.incoming("d")] == ["b", "c"]
    assert [e.target_ref for e in graph.outgoing("a")] == ["b", "c"]
    assert graph.incoming("a") == []
    assert graph.incoming("nope") == []
    assert graph.topological_order() == ["a", "b", "c", "d"]
    assert graph.ancestors("d") == {"a", "b", "c"}
    assert graph.descendants("b") == {"d"}
    assert graph.cycles() == []


def test_topological_order_breaks_ties_by_document_order() -> None:
    graph = _graph("zyxw", "wz", "xz")
    assert graph.topological_order() == ["y", "x", "w", "z"]


def test_dangling_edges_are_kept_but_not_indexed() -> None:
    graph = _graph("ab", "ab", "aq", "qb")
    assert len(graph.edges) == 3
    assert graph.outgoing_positions("a") == [0]
    assert graph.incoming_positions("b") == [0]
    assert graph.roots == ["a"]


def test_repeated_ref_counts_once() -> None:
    graph = Graph(["a", "b", "a"], [Edge(source_ref="a", target_ref="b")])
    assert graph.refs == ("a", "b")


def test_cycle_is_reported_with_its_path() -> None:
    graph = _graph("abcd", "ab", "bc", "cd", "db")
    with pytest.raises(DefinitionError) as info:
        graph.topological_order()
    assert info.value.code == "definition.cycle"
    assert "b -> c -> d -> b" in info.value.message
    (cycle,) = graph.cycles()
    assert graph.cycle_refs(cycle) == ["b", "c", "d", "b"]
    assert cycle == [1, 2, 3]
    assert graph.reachable_from_roots() == {"a", "b", "c", "d"}


def test_one_cycle_per_component_and_self_loops() -> None:
    graph = _graph("abcde", "ab", "ba", "cc", "de", "ed", "dd")
    cycles = graph.cycles()
    assert [graph.cycle_refs(c) for c in cycles] == [["a", "b", "a"], ["c", "c"], ["d", "e", "d"]]
    assert graph.roots == []
    assert graph.reachable_from_roots() == frozenset()


def test_large_chain_is_fast_enough_to_walk() -> None:
    refs = [f"s{i}" for i in range(5000)]
    edges = [Edge(source_ref=a, target_ref=b) for a, b in itertools.pairwise(refs)]
    graph = Graph(refs, edges)
    assert graph.topological_order() == refs
    assert len(graph.ancestors(refs[-1])) == 4999
    assert graph.cycles() == []


_edges = st.lists(st.tuples(st.integers(0, 11), st.integers(0, 11)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 12), pairs=_edges)
def test_order_exists_exactly_when_there_is_no_cycle(n: int, pairs: list[tuple[int, int]]) -> None:
    refs = [f"s{i}" for i in range(n)]
    edges = [Edge(source_ref=f"s{a}", target_ref=f"s{b}") for a, b in pairs]
    graph = Graph(refs, edges)
    cycles = graph.cycles()
    for cycle in cycles:
        # every reported cycle is a closed walk along real edges
        for here, there in zip(cycle, cycle[1:] + cycle[:1], strict=True):
            assert graph.edges[here].target_ref == graph.edges[there].source_ref
    if cycles:
        with pytest.raises(DefinitionError):
            graph.topological_order()
        return
    order = graph.topological_order()
    assert sorted(order) == sorted(refs)
    position = {ref: i for i, ref in enumerate(order)}
    for edge in graph.edges:
        if edge.source_ref in graph and edge.target_ref in graph:
            assert position[edge.source_ref] < position[edge.target_ref]
            assert edge.source_ref in graph.ancestors(edge.target_ref)


def test_precedes_agrees_with_ancestors_and_handles_cycles() -> None:
    graph = _graph("abcde", "ab", "bc", "ad", "de")
    assert graph.precedes("a", "c")
    assert graph.precedes("a", "e")
    assert not graph.precedes("c", "a")
    assert not graph.precedes("b", "e")
    assert not graph.precedes("a", "a")
    assert not graph.precedes("a", "nope")
    cyclic = _graph("abc", "ab", "bc", "cb")
    assert cyclic.precedes("a", "c")
    assert cyclic.precedes("c", "c")
    assert not cyclic.precedes("c", "a")


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 12), pairs=_edges)
def test_precedes_is_the_ancestor_relation(n: int, pairs: list[tuple[int, int]]) -> None:
    refs = [f"s{i}" for i in range(n)]
    graph = Graph(refs, [Edge(source_ref=f"s{a}", target_ref=f"s{b}") for a, b in pairs])
    for later in refs:
        ancestors = graph.ancestors(later)
        assert {r for r in refs if graph.precedes(r, later)} == ancestors
