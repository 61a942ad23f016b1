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

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from ductor_core.expressions import DEFAULT_COST_LIMITS, estimate_cost

# Sandbox deadlines and the server's resident set: measured alone, after the
# parallel part of the suite.
pytestmark = pytest.mark.serial

# How much the server's resident set may grow, end to end, while refusing
# every bomb: a refused bomb allocates nothing but its error.
REFUSED_GROWTH_KIB = 64 * 1024

TOO_COSTLY = "definition.expression_too_costly"
KINDS = {"lead": {}}


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
        two("STEP_TYPE_NOTIFY", {"recipients": "'ops'", "title": bomb}),
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
    yield (
        "rule condition",
        "/v1/rules",
        {"rules": [rule], "default_pool": "p", "kinds": KINDS},
        "/rules/0/when",
    )
    enricher = {"attribute": "x", "expr": bomb}
    yield (
        "enricher",
        "/v1/rules",
        {"enrichers": [enricher], "default_pool": "p", "kinds": KINDS},
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


# --- the costliest expressions the limits accept ---------------------------------

_PAIRS = zip("bcbcbc", ("==", "<", ">", "<=", ">=", "!="), strict=True)
# Six filters over a 100-item list for each of 100 items: about 900,000 units.
HEAVIEST_CPU = (
    "input.a.map(x, "
    + " + ".join(f"input.{name}.filter(y, y {op} x).size()" for name, op in _PAIRS)
    + ")"
)
# The longest string (512 KiB) and list (65,536 items) under the size limits.
LONGEST_STRING = "size(['xxxxxxxx']" + ".map(s, s + s)" * 16 + "[0])"
LONGEST_LIST = "size([[1, 2, 3, 4]]" + ".map(l, l + l)" * 14 + "[0])"
HEAVY_INPUT = {
    "a": list(range(100)),
    "b": list(range(100)),
    "c": list(range(100)),
    "s": "y" * 1000,
}


def test_the_costliest_accepted_expressions_run_to_completion(
    capped_server: Any, process_memory: Callable[[int], dict[str, int]]
) -> None:
    run_the_costliest(capped_server, process_memory)
    # On by default: the costly ones ran in sandbox processes (the server's own, or
    # those of the engine's offload workers, which rebuild the sandbox).
    assert "ductor_server.sandbox.child" in " ".join(_descendants_of(capped_server.proc.pid))


def test_the_costliest_accepted_expressions_run_to_completion_in_process(
    make_server: Callable[..., Any],
    cap_memory_of: Callable[[int], None],
    process_memory: Callable[[int], dict[str, int]],
) -> None:
    server = make_server("in-process", env={"DUCTOR_CEL_SANDBOX": "off"})
    server.start()
    cap_memory_of(server.proc.pid)
    run_the_costliest(server, process_memory)
    assert "sandbox" not in " ".join(_descendants_of(server.proc.pid))


def _descendants_of(pid: int) -> list[str]:
    """The command lines of a process's children, their children, and so on."""
    found: list[str] = []
    parents = [pid]
    while parents:
        children = _children_pids(parents.pop())
        found.extend(line for _, line in children)
        parents.extend(child for child, _ in children)
    return found


def _children_pids(pid: int) -> list[tuple[int, str]]:
    """The pids and command lines of a process's children."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                found.append((int(entry.name), line))
        except (OSError, ValueError, IndexError):
            continue
    return found


def run_the_costliest(server: Any, process_memory: Callable[[int], dict[str, int]]) -> None:
    """Run the costliest accepted expressions in a dataflow step and a routing rule."""
    pid = server.proc.pid
    for source in (HEAVIEST_CPU, LONGEST_STRING, LONGEST_LIST):
        assert estimate_cost(source).cost <= DEFAULT_COST_LIMITS.max_cost
    assert estimate_cost(HEAVIEST_CPU).cost > 0.8 * DEFAULT_COST_LIMITS.max_cost
    project = {"cpu": HEAVIEST_CPU, "string": LONGEST_STRING, "list": LONGEST_LIST}
    definition = {
        "family_slug": "heavy",
        "title": "Heavy",
        "steps": [_dataflow("heavy", operation="project", project=project)],
        "edges": [],
    }
    rule = "size(" + HEAVIEST_CPU.replace("input.", "attributes.") + ") == 100"
    assert estimate_cost(rule).cost <= DEFAULT_COST_LIMITS.max_cost
    with server.client() as http:
        set_up_routing(http)
        response = http.post(
            "/v1/rules",
            json={
                "rules": [{"id": "heavy", "pool": "p", "when": rule}],
                "default_pool": None,
                "kinds": KINDS,
            },
        )
        assert response.status_code == 201, response.text
        assert http.post("/v1/workflows", json=definition).status_code == 201
        started = time.monotonic()
        run = http.post("/v1/runs", json={"family_slug": "heavy", "input": HEAVY_INPUT}).json()
        ended = server.wait_for_run(run["id"], timeout=120)
        run_seconds = time.monotonic() - started
        started = time.monotonic()
        routed = http.post(
            "/v1/route", json={"id": "r1", "kind": "lead", "attributes": HEAVY_INPUT}
        )
        route_seconds = time.monotonic() - started
    assert ended["status"] == "RUN_STATUS_SUCCEEDED", ended
    output = ended["steps"][0]["output"]
    assert output == {"cpu": [300] * 100, "string": 524_288, "list": 65_536}
    assert routed.status_code == 201, routed.text
    assert routed.json()["pool"] == "p"
    assert_alive(server, pid)
    memory = process_memory(pid)
    print(
        f"\n{server.backend}: heaviest run {run_seconds:.2f}s, heaviest rule {route_seconds:.2f}s,"
        f" peak rss {memory['peak_rss'] // 1024} MiB"
    )
    assert memory["peak_rss"] < 1024 * 1024  # KiB: half the cap


# --- a bomb stored before the limits existed -------------------------------------

BOMB = "size(['xxxxxxxx']" + ".map(s, s + s)" * 28 + "[0]) > 0"


def tenant_of(server: Any) -> str:
    """The tenant the server's API key belongs to (`ductor dev`'s, or the test key's)."""
    return "acme" if server.database_url else "dev"


def sql(server: Any, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run one statement on the server's database, past the API (`%s` placeholders;
    `%j` for a JSON text parameter)."""
    if server.database_url:
        with psycopg.connect(server.database_url, autocommit=True) as conn:
            cur = conn.execute(statement.replace("%j", "%s::jsonb"), params)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []
    with sqlite3.connect(server.data_dir / "ductor.db", timeout=30) as db:
        rows = db.execute(statement.replace("%s", "?").replace("%j", "?"), params).fetchall()
    return rows


def as_json(value: Any) -> Any:
    return value if isinstance(value, dict) else json.loads(value)


def store_routing_bomb(server: Any, where: str) -> None:
    """Write a bomb into the tenant's rules or pool with SQL, as an old server might have."""
    tenant = tenant_of(server)
    now = "2026-01-01T00:00:00+00:00"
    if where == "rule":
        body = {
            "rules": [{"id": "old", "pool": "p", "when": BOMB}],
            "default_pool": "p",
            "kinds": KINDS,
        }
        sql(
            server,
            "INSERT INTO routing_rule_sets (tenant_id, version, body, created_at)"
            " SELECT %s, COALESCE(MAX(version), 0) + 1, %j, %s FROM routing_rule_sets"
            " WHERE tenant_id = %s",
            (tenant, json.dumps(body), now, tenant),
        )
    else:
        (row,) = sql(
            server, "SELECT body FROM routing_pools WHERE tenant_id = %s AND id = 'p'", (tenant,)
        )
        pool = as_json(row[0])
        pool["members"][0]["when"] = BOMB
        sql(
            server,
            "UPDATE routing_pools SET body = %j WHERE tenant_id = %s AND id = 'p'",
            (json.dumps(pool), tenant),
        )
    # A new generation: the server reloads the configuration, as after an API change.
    sql(
        server,
        "UPDATE routing_generations SET generation = generation + 1 WHERE tenant_id = %s",
        (tenant,),
    )


ROUTE_WORKFLOW = {
    "family_slug": "route-old",
    "title": "Route with an old configuration",
    "steps": [{"ref": "route", "type": "STEP_TYPE_ROUTE", "args": {"kind": "'lead'"}}],
    "edges": [],
}


def test_a_stored_bomb_fails_its_decisions_and_runs_not_the_server(capped_server: Any) -> None:
    server = capped_server
    pid = server.proc.pid
    with server.client() as http:
        set_up_routing(http)
        assert http.post("/v1/workflows", json=ROUTE_WORKFLOW).status_code == 201
        for where in ("rule", "pool member"):
            store_routing_bomb(server, where)
            routed = http.post("/v1/route", json={"id": f"r-{where}", "kind": "lead"})
            assert routed.status_code == 422, routed.text
            assert routed.json()["code"] == "routing.config"
            assert "too costly" in routed.json()["message"]
            assert_alive(server, pid)
            started = time.monotonic()
            run = http.post("/v1/runs", json={"family_slug": "route-old"}).json()
            ended = server.wait_for_run(run["id"], timeout=60)
            assert time.monotonic() - started < 30
            assert ended["status"] == "RUN_STATUS_FAILED", ended
            assert ended["error"]["code"] == "run.step_failed"
            assert ended["error"]["details"]["error"] == "routing.config"
            (step,) = ended["steps"]
            assert step["error"]["code"] == "routing.config"
            assert step["error"]["retryable"] is False
            assert step["attempt"] == 1  # failed once, not re-leased
            assert_alive(server, pid)
            # Replacing what holds the bomb over the API sets the configuration right.
            if where == "rule":
                fixed = http.post("/v1/rules", json={"default_pool": "p", "kinds": KINDS})
            else:
                fixed = http.post("/v1/pools", json={"id": "p", "members": [{"worker": "w1"}]})
            assert fixed.status_code in {200, 201}, fixed.text
            routed = http.post("/v1/route", json={"id": f"ok-{where}", "kind": "lead"})
            assert routed.status_code == 201, routed.text
    assert_alive(server, pid)


def test_a_stored_workflow_bomb_fails_its_run_not_the_server(capped_server: Any) -> None:
    server = capped_server
    pid = server.proc.pid
    tenant = tenant_of(server)
    with server.client() as http:
        definition = {
            "family_slug": "stored",
            "title": "Stored",
            "steps": [
                _dataflow("s", operation="project", project={"x": "1"}),
                _dataflow("t", operation="project", project={"y": "2"}),
            ],
            "edges": [{"source_ref": "s", "target_ref": "t"}],
        }
        assert http.post("/v1/workflows", json=definition).status_code == 201
        (row,) = sql(
            server,
            "SELECT definition FROM workflow_versions"
            " WHERE tenant_id = %s AND family_slug = 'stored'",
            (tenant,),
        )
        stored = as_json(row[0])
        stored["steps"][1]["args"]["project"]["y"] = BOMB
        sql(
            server,
            "UPDATE workflow_versions SET definition = %j"
            " WHERE tenant_id = %s AND family_slug = 'stored'",
            (json.dumps(stored), tenant),
        )
        started = time.monotonic()
        run = http.post("/v1/runs", json={"family_slug": "stored"}).json()
        ended = server.wait_for_run(run["id"], timeout=60)
        assert time.monotonic() - started < 30
    assert ended["status"] == "RUN_STATUS_FAILED", ended
    assert ended["error"]["code"] == "run.step_failed"
    assert ended["error"]["details"] == {"step_ref": "t", "error": "expression.too_costly"}
    steps = {step["ref"]: step for step in ended["steps"]}
    assert steps["s"]["status"] == "STEP_STATUS_SUCCEEDED"
    assert steps["t"]["status"] == "STEP_STATUS_FAILED"
    assert steps["t"]["error"]["code"] == "expression.too_costly"
    assert_alive(server, pid)


# --- a bomb the estimate accepts: the sandbox's deadline --------------------------

# About 790,000 units by the estimate, yet seconds of cel-rust CPU: cel-rust's
# map() copies the list it builds at every step, which the estimate prices linearly.
RUNAWAY = "size([" + ",".join(str(i) for i in range(70)) + "].map(x, input.b.map(y, input.c)))"


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_runaway_the_estimate_accepts_is_cut_by_the_sandbox(
    backend: str,
    request: pytest.FixtureRequest,
    make_server: Callable[..., Any],
    cap_memory_of: Callable[[int], None],
    process_memory: Callable[[int], dict[str, int]],
) -> None:
    assert estimate_cost(RUNAWAY).cost < DEFAULT_COST_LIMITS.max_cost
    database_url = request.getfixturevalue("postgres_url") if backend == "postgres" else None
    server = make_server(
        "runaway", database_url=database_url, env={"DUCTOR_CEL_SANDBOX_TIMEOUT": "1"}
    )
    server.start()
    cap_memory_of(server.proc.pid)
    pid = server.proc.pid
    definition = {
        "family_slug": "runaway",
        "title": "Runaway",
        "steps": [_dataflow("spin", operation="project", project={"n": RUNAWAY})],
        "edges": [],
    }
    rule = RUNAWAY.replace("input.", "attributes.") + " > 0"
    with server.client() as http:
        set_up_routing(http)
        published = http.post("/v1/workflows", json=definition)
        assert published.status_code == 201, published.text
        started = time.monotonic()
        run = http.post("/v1/runs", json={"family_slug": "runaway", "input": HEAVY_INPUT}).json()
        ended = server.wait_for_run(run["id"], timeout=60)
        run_seconds = time.monotonic() - started
        assert_alive(server, pid)
        rules = {"rules": [{"id": "spin", "pool": "p", "when": rule}], "kinds": KINDS}
        assert http.post("/v1/rules", json=rules).status_code == 201
        started = time.monotonic()
        routed = http.post(
            "/v1/route", json={"id": "r1", "kind": "lead", "attributes": HEAVY_INPUT}
        )
        route_seconds = time.monotonic() - started
    assert ended["status"] == "RUN_STATUS_FAILED", ended
    assert ended["error"]["details"] == {
        "step_ref": "spin",
        "error": "expression.resource_exhausted",
    }
    (step,) = ended["steps"]
    assert step["error"]["code"] == "expression.resource_exhausted"
    assert step["error"]["retryable"] is False
    assert run_seconds < 20
    # The rule errs (recorded in the explanation) and matches nothing: no pool.
    assert routed.status_code == 201, routed.text
    decision = routed.json()
    assert decision["pool"] is None, decision
    assert "resources exhausted" in json.dumps(decision["explanation"])
    assert route_seconds < 10
    assert_alive(server, pid)
    print(
        f"\n{backend}: runaway run failed in {run_seconds:.1f}s, runaway rule cut in"
        f" {route_seconds:.1f}s, peak rss {process_memory(pid)['peak_rss'] // 1024} MiB"
    )


# --- a filter or map whose expression reads the list it walks ---------------------


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_filter_or_map_that_rereads_its_list_is_refused_not_quadratic(
    backend: str, request: pytest.FixtureRequest, make_server: Callable[..., Any]
) -> None:
    # Each item's evaluation converts the variables its expression names again:
    # 20,000 items reading a 20,000-item input is 400 million values copied,
    # minutes of CPU before the run was even answered. Refused at once instead.
    database_url = request.getfixturevalue("postgres_url") if backend == "postgres" else None
    server = make_server("quadratic", database_url=database_url)
    server.start()
    pid = server.proc.pid
    steps = {
        "map": {"operation": "map", "items": "input.a", "expression": "item + size(input.a)"},
        "filter": {"operation": "filter", "items": "input.a", "predicate": "item in input.a"},
    }
    with server.client() as http:
        for operation, args in steps.items():
            definition = {
                "family_slug": f"re-{operation}",
                "title": "Rereads",
                "steps": [_dataflow("walk", **args)],
                "edges": [],
            }
            published = http.post("/v1/workflows", json=definition)
            assert published.status_code == 201, published.text
            started = time.monotonic()
            run = http.post(
                "/v1/runs", json={"family_slug": f"re-{operation}", "input": {"a": [0] * 20_000}}
            )
            assert run.status_code == 201, run.text
            ended = server.wait_for_run(run.json()["id"], timeout=60)
            assert time.monotonic() - started < 20
            assert ended["status"] == "RUN_STATUS_FAILED", ended
            (step,) = ended["steps"]
            assert step["error"]["code"] == "expression.too_costly", step
            assert step["error"]["details"]["phase"] == "evaluate"
            assert "each of 20,000 items" in step["error"]["message"]
            # A list small enough to walk this way still is walked.
            small = http.post(
                "/v1/runs", json={"family_slug": f"re-{operation}", "input": {"a": [0] * 300}}
            )
            done = server.wait_for_run(small.json()["id"], timeout=60)
            assert done["status"] == "RUN_STATUS_SUCCEEDED", done
            assert_alive(server, pid)
