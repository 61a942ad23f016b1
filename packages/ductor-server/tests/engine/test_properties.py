"""Property: any DAG of actions and dataflow steps, with success, always and
condition edges, runs to the outcome a small reference model predicts, and
every action that runs is executed exactly once."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ductor_core.expressions import default_engine
from ductor_server.engine.actions import ActionCall

from .conftest import SUCCEEDED, TENANT, Engine

default_engine()  # built up front: it raises the recursion limit, which hypothesis notes

EDGE_KINDS = ["SUCCESS", "ALWAYS", "COND_TRUE", "COND_FALSE"]
_slugs = itertools.count()


@st.composite
def dags(draw: st.DrawFn) -> tuple[list[str], list[tuple[int, int, str]]]:
    n = draw(st.integers(min_value=1, max_value=6))
    kinds = draw(st.lists(st.sampled_from(["ACTION", "DATAFLOW"]), min_size=n, max_size=n))
    edges = []
    for target in range(1, n):
        for source in range(target):
            kind = draw(st.sampled_from([None, None, *EDGE_KINDS]))
            if kind is not None:
                edges.append((source, target, kind))
    return kinds, edges


def definition(slug: str, kinds: list[str], edges: list[tuple[int, int, str]]) -> dict[str, Any]:
    steps = []
    for i, kind in enumerate(kinds):
        if kind == "ACTION":
            args: dict[str, Any] = {"action": "counted", "params": {"i": str(i)}}
        else:
            args = {"operation": "project", "project": {"i": str(i)}}
        steps.append({"ref": f"s{i}", "type": f"STEP_TYPE_{kind}", "args": args})
    wire = []
    for source, target, kind in edges:
        edge: dict[str, Any] = {"source_ref": f"s{source}", "target_ref": f"s{target}"}
        if kind.startswith("COND"):
            edge["type"] = "EDGE_TYPE_CONDITION"
            edge["condition"] = "output.i >= 0" if kind == "COND_TRUE" else "output.i < 0"
        else:
            edge["type"] = f"EDGE_TYPE_{kind}"
        wire.append(edge)
    return {"family_slug": slug, "steps": steps, "edges": wire}


def expected(n: int, edges: list[tuple[int, int, str]]) -> dict[int, str]:
    """Every step succeeds unless no incoming edge was taken (then SKIPPED)."""
    status: dict[int, str] = {}
    for step in range(n):
        incoming = [(s, k) for s, t, k in edges if t == step]
        if not incoming:
            status[step] = "SUCCEEDED"
            continue
        taken = any(status[s] == "SUCCEEDED" and k != "COND_FALSE" for s, k in incoming)
        status[step] = "SUCCEEDED" if taken else "SKIPPED"
    return status


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(dag=dags())
async def test_any_dag_runs_to_the_predicted_outcome(
    engine: Engine, dag: tuple[list[str], list[tuple[int, int, str]]]
) -> None:
    kinds, edges = dag
    calls: dict[str, int] = {}

    async def counted(call: ActionCall) -> Any:
        calls[call.step_ref] = calls.get(call.step_ref, 0) + 1
        return call.payload["params"]

    # Hypothesis reuses the engine across examples: each example brings its own counter.
    engine.actions.register_action("counted", counted, replace=True)
    slug = f"prop-{next(_slugs)}"
    await engine.publish(definition(slug, kinds, edges))
    done = await engine.wait_run((await engine.trigger(slug, {})).id)
    want = expected(len(kinds), edges)
    assert done.status == SUCCEEDED
    got = {int(s.ref[1:]): s.status.value.removeprefix("STEP_STATUS_") for s in done.steps}
    assert got == want
    ran_actions = {f"s{i}" for i, k in enumerate(kinds) if k == "ACTION" and want[i] == "SUCCEEDED"}
    assert calls == dict.fromkeys(ran_actions, 1)
    sinks = {i for i in range(len(kinds)) if not any(s == i for s, _, _ in edges)}
    assert done.output == {f"s{i}": {"i": i} for i in sinks if want[i] == "SUCCEEDED"}
    history = await engine.services.runs.history(TENANT, done.id)
    assert history[-1].kind == "run.succeeded"
