"""CEL bombs against a real server process capped at 2 GiB of address space.

Every bomb of the core corpus (packages/ductor-core/tests/test_expressions_bombs.py)
is written in every place a tenant can put CEL: routing rules, enrichers, pool
member conditions, and a workflow's trigger filters, output, edge conditions and
each CEL argument of each step type (scatter items and templates included). Each
is refused where it is written (a 422 naming its pointer, or a validation problem
at it), nothing is stored, and the same process answers /healthz after each with
its memory flat. The costliest expressions the limits accept run to completion.

A bomb stored before the limits existed (written with SQL, past the API) fails
the routing decision and the run that routes with a clear code; the process
lives on, with the same pid.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

# How much the server's resident set may grow, end to end, while refusing
# every bomb: a refused bomb allocates nothing but its error.
REFUSED_GROWTH_KIB = 64 * 1024

TOO_COSTLY = "definition.expression_too_costly"


def _dataflow(ref: str, **args: Any) -> dict[str, Any]:
    return {"ref": ref, "type": "STEP_TYPE_DATAFLOW", "args": args}


FIRST = _dataflow("a", operation="project", project={"v": "1"})


def workflow_placements(bomb: str) -> Iterator[tuple[str, dict[str, Any], str]]:
    """(where, definition, pointer of the bomb) for every CEL field of a definition."""

    def two(step_type: str, args: dict[str, Any], **extra: Any) -> dict[str, Any]:
        second = {"ref": "b", "type": step_type, "args": args}
        return {
            "family_slug": "bomb",
            "title": "Bomb",
            "steps": [FIRST, second],
            "edges": [{"source_ref": "a", "target_ref": "b"}],
            **extra,
        }

    one = {"family_slug": "bomb", "title": "Bomb", "steps": [FIRST], "edges": []}
    df = "STEP_TYPE_DATAFLOW"
    template = {"type": df, "args": {"operation": "project", "project": {"v": "item"}}}
    yield (
        "trigger filter",
        {**one, "triggers": [{"event": "e", "filter": bomb}]},
        "/triggers/0/filter",
    )
    yield "output", {**one, "output": bomb}, "/output"
    yield "output projection", {**one, "output": {"k": bomb}}, "/output/k"
    condition = {"source_ref": "a", "target_ref": "b", "type": "EDGE_TYPE_CONDITION"}
    yield (
        "edge condition",
        two(
            df,
            {"operation": "project", "project": {"v": "2"}},
            edges=[{**condition, "condition": bomb}],
        ),
        "/edges/0/condition",
    )
    yield (
        "dataflow project",
        two(df, {"operation": "project", "project": {"x": bomb}}),
        "/steps/1/args/project/x",
    )
    yield (
        "dataflow map items",
        two(df, {"operation": "map", "items": bomb, "expression": "item"}),
        "/steps/1/args/items",
    )
    yield (
        "dataflow map expression",
        two(df, {"operation": "map", "items": "[1]", "expression": bomb}),
        "/steps/1/args/expression",
    )
    yield (
        "dataflow filter predicate",
        two(df, {"operation": "filter", "items": "[1]", "predicate": bomb}),
        "/steps/1/args/predicate",
    )
    yield (
        "dataflow merge",
        two(df, {"operation": "merge", "sources": [bomb]}),
        "/steps/1/args/sources/0",
    )
    yield (
        "dataflow pick",
        two(df, {"operation": "pick", "source": bomb, "keys": ["a"]}),
        "/steps/1/args/source",
    )
    yield "wait until", two("STEP_TYPE_WAIT", {"until": bomb}), "/steps/1/args/until"
    yield (
        "wait-for-event match",
        two("STEP_TYPE_WAIT_FOR_EVENT", {"event": "go", "match": bomb, "timeout": "1h"}),
        "/steps/1/args/match",
    )
    yield (
        "scatter items",
        two("STEP_TYPE_SCATTER", {"items": bomb, "step": template}),
        "/steps/1/args/items",
    )
    bomb_template = {"type": df, "args": {"operation": "project", "project": {"v": bomb}}}
    yield (
        "scatter step template",
        two("STEP_TYPE_SCATTER", {"items": "[1, 2]", "step": bomb_template}),
        "/steps/1/args/step/args/project/v",
    )
    yield (
        "scatter workflow input",
        two(
            "STEP_TYPE_SCATTER",
            {"items": "[1]", "workflow": {"family_slug": "child"}, "input": bomb},
        ),
        "/steps/1/args/input",
    )
    yield (
        "subworkflow input",
        two("STEP_TYPE_SUBWORKFLOW", {"family_slug": "child", "input": bomb}),
        "/steps/1/args/input",
    )
    yield (
        "route attributes",
        two("STEP_TYPE_ROUTE", {"kind": "lead", "attributes": {"x": bomb}}),
        "/steps/1/args/attributes/x",
    )
    yield (
        "route price",
        two("STEP_TYPE_ROUTE", {"kind": "lead", "price": bomb}),
        "/steps/1/args/price",
    )
    yield (
        "notify title",
        two("STEP_TYPE_NOTIFY", {"recipient": "'ops'", "title": bomb}),
        "/steps/1/args/title",
    )
    yield (
        "bridge input",
        two("STEP_TYPE_BRIDGE", {"app_id": "app", "workflow": "w", "input": bomb}),
        "/steps/1/args/input",
    )


def routing_placements(bomb: str) -> Iterator[tuple[str, str, dict[str, Any], str]]:
    """(where, path, body, the end of the bomb's pointer) for every CEL field of routing."""
    rule = {"id": "r", "pool": "p", "when": bomb}
    yield "rule condition", "/v1/rules", {"rules": [rule], "default_pool": "p"}, "/rules/0/when"
    enricher = {"attribute": "x", "expr": bomb}
    yield (
        "enricher",
        "/v1/rules",
        {"enrichers": [enricher], "default_pool": "p"},
        "/enrichers/0/expr",
    )
    member = {"worker": "w1", "when": bomb}
    yield "pool member condition", "/v1/pools", {"id": "p2", "members": [member]}, "/members/0/when"


def set_up_routing(http: httpx.Client) -> None:
    """A worker, a pool and a valid rule set, for the bombs to be refused next to."""
    for path, body in (
        ("/v1/workers", {"id": "w1"}),
        ("/v1/pools", {"id": "p", "members": [{"worker": "w1"}]}),
        (
            "/v1/rules",
            {
                "rules": [{"id": "ok", "pool": "p", "when": "attributes.x == 1"}],
                "default_pool": "p",
            },
        ),
    ):
        response = http.post(path, json=body)
        assert response.status_code == 201, response.text


def assert_alive(server: Any, pid: int) -> None:
    assert server.proc.poll() is None, (
        f"server died ({server.proc.returncode}):\n{server.log()[-3000:]}"
    )
    assert server.proc.pid == pid
    assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200


def test_every_bomb_is_refused_where_it_is_written(
    capped_server: Any,
    row_counts: Callable[[Any], dict[str, int]],
    bomb_corpus: dict[str, tuple[str, str]],
    process_memory: Callable[[int], dict[str, int]],
) -> None:
    server = capped_server
    pid = server.proc.pid
    with server.client() as http:
        set_up_routing(http)
        before = row_counts(server)
        memory_before = process_memory(pid)
        wrong: list[str] = []
        refused = 0
        started = time.monotonic()
        for bomb_id, (_, bomb) in bomb_corpus.items():
            for where, path, body, suffix in routing_placements(bomb):
                response = http.post(path, json=body)
                answer = response.json()
                pointers = [
                    d["pointer"]
                    for d in answer.get("details") or []
                    if "too costly" in d["message"]
                ]
                if (
                    response.status_code != 422
                    or answer["code"] != "routing.config"
                    or not any(p.endswith(suffix) for p in pointers)
                ):
                    wrong.append(
                        f"{bomb_id} in {where}: {response.status_code} {response.text[:300]}"
                    )
                refused += 1
                assert_alive(server, pid)
            for where, definition, pointer in workflow_placements(bomb):
                validated = http.post("/v1/workflows/validate", json=definition)
                assert validated.status_code == 200, validated.text
                problems = validated.json()["problems"]
                if {"code": TOO_COSTLY, "pointer": pointer} not in [
                    {"code": p["code"], "pointer": p["pointer"]} for p in problems
                ]:
                    wrong.append(f"{bomb_id} in {where} (validate): {problems}"[:400])
                published = http.post("/v1/workflows", json=definition)
                details = published.json().get("details") or []
                if published.status_code != 422 or {"code": TOO_COSTLY, "pointer": pointer} not in [
                    {"code": d.get("code"), "pointer": d.get("pointer")} for d in details
                ]:
                    wrong.append(
                        f"{bomb_id} in {where} (publish): {published.status_code}"
                        f" {published.text[:300]}"
                    )
                refused += 2
                assert_alive(server, pid)
        elapsed = time.monotonic() - started
    assert not wrong, f"{len(wrong)} bomb(s) not refused where written:\n" + "\n".join(wrong[:40])
    assert row_counts(server) == before
    memory_after = process_memory(pid)
    print(
        f"\n{server.backend}: {refused} bombs refused in {elapsed:.1f}s;"
        f" rss {memory_before['rss'] // 1024} -> {memory_after['rss'] // 1024} MiB,"
        f" peak {memory_after['peak_rss'] // 1024} MiB,"
        f" address space {memory_after['vm'] // 1024} MiB"
    )
    assert refused >= len(bomb_corpus) * 40
    assert memory_after["peak_rss"] - memory_before["peak_rss"] < REFUSED_GROWTH_KIB
