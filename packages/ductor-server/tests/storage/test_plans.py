"""Every statement the engine runs per step keeps its index under a generic plan.

psycopg prepares a statement after a few executions and Postgres then settles on
a generic plan, made once, typically while the tables are still empty and
unanalyzed. These tests force that generic plan on a freshly migrated database
(and again on a full, analyzed one) and check each statement of
`HOT_STATEMENTS` reaches its table through the intended index with the whole key
in the index condition: never a sequential scan of a big table, never an index
scan on `tenant_id` alone that filters on the id.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from ductor_server.storage import open_store
from ductor_server.storage._sql_tx import HOT_STATEMENTS
from ductor_server.storage.postgres import PostgresTx

# statement -> {table: (index, key columns that must all be in its Index Cond)}.
# A table a statement only inserts into has no scan at all.
EXPECTED: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = {
    "claim_runs_with_inbox": {
        "runs": ("runs_pkey", ("tenant_id", "id")),
        "run_inbox": ("run_inbox_by_time", ("available_at",)),
    },
    "claim_runs": {
        "runs": ("runs_pkey", ("tenant_id", "id")),
        "run_inbox": ("run_inbox_by_time", ("available_at",)),
    },
    "get_run": {"runs": ("runs_pkey", ("tenant_id", "id"))},
    "run_status": {"runs": ("runs_pkey", ("tenant_id", "id"))},
    "lock_run": {
        "runs": ("runs_pkey", ("tenant_id", "id")),
        "run_inbox": ("run_inbox_by_run", ("tenant_id", "run_id")),
    },
    "update_run": {"runs": ("runs_pkey", ("tenant_id", "id"))},
    "load_run_inbox": {"run_inbox": ("run_inbox_by_run", ("tenant_id", "run_id"))},
    "delete_inbox_item": {"run_inbox": ("run_inbox_pkey", ("tenant_id", "seq"))},
    "enqueue_inbox_item": {},
    "enqueue_task": {},
    "enqueue_task_leasing": {},
    "lease_expired_tasks": {"tasks": ("tasks_leased", ("lease_until",))},
    "lease_queued_tasks": {"tasks": ("tasks_ready", ("available_at",))},
    "lease_chosen_task": {"tasks": ("tasks_pkey", ("tenant_id", "id"))},
    "new_ready_tasks": {
        "tasks": ("tasks_queued_by_id", ("id",)),
        "runs": ("runs_pkey", ("tenant_id", "id")),
    },
    "expired_ready_tasks": {
        "tasks": ("tasks_leased", ("lease_until",)),
        "runs": ("runs_pkey", ("tenant_id", "id")),
    },
    "extend_lease": {"tasks": ("tasks_pkey", ("tenant_id", "id"))},
    "complete_task": {"tasks": ("tasks_pkey", ("tenant_id", "id"))},
    "release_task": {"tasks": ("tasks_pkey", ("tenant_id", "id"))},
    "drop_run_tasks": {"tasks": ("tasks_by_run", ("tenant_id", "run_id"))},
    "record_attempt": {},
    "set_timer": {},
    "due_timers": {"timers": ("timers_by_time", ("fire_at",))},
    "delete_run_timers": {"timers": ("timers_pkey", ("tenant_id", "run_id"))},
    "clear_run_waits": {"waits": ("waits_pkey", ("tenant_id", "run_id"))},
    "append_history": {},
    "get_runs_batch": {"runs": ("runs_pkey", ("tenant_id", "id"))},
    "run_statuses_batch": {"runs": ("runs_pkey", ("tenant_id", "id"))},
    "lock_runs_batch": {
        "runs": ("runs_pkey", ("tenant_id", "id")),
        "run_inbox": ("run_inbox_by_run", ("tenant_id", "run_id")),
    },
    "update_runs_batch": {"runs": ("runs_pkey", ("tenant_id", "id"))},
    "load_runs_inbox_batch": {"run_inbox": ("run_inbox_by_run", ("tenant_id", "run_id"))},
    "delete_inbox_items_batch": {"run_inbox": ("run_inbox_pkey", ("tenant_id", "seq"))},
    "enqueue_inbox_items_batch": {},
    "enqueue_tasks_batch": {},
    "enqueue_tasks_leasing_batch": {},
    "lease_chosen_tasks_batch": {"tasks": ("tasks_pkey", ("tenant_id", "id"))},
    "complete_tasks_batch": {"tasks": ("tasks_pkey", ("tenant_id", "id"))},
    "record_attempts_batch": {},
    "append_history_batch": {},
    "find_run_by_key": {"runs": ("runs_by_idempotency_key", ("tenant_id", "idempotency_key"))},
    "insert_run": {},
    "find_runs_by_key_batch": {
        "runs": ("runs_by_idempotency_key", ("tenant_id", "idempotency_key"))
    },
    "insert_runs_batch": {},
    "delete_runs_timers_batch": {"timers": ("timers_pkey", ("tenant_id", "run_id"))},
    "clear_runs_waits_batch": {"waits": ("waits_pkey", ("tenant_id", "run_id"))},
    "drop_runs_tasks_batch": {"tasks": ("tasks_by_run", ("tenant_id", "run_id"))},
}
# The claim reads every due inbox item anyway; the inbox is a queue, kept short.
SEQ_SCAN_ALLOWED = {"claim_runs_with_inbox": {"run_inbox"}, "claim_runs": {"run_inbox"}}
# A lease also looks each claimed task up by its key, as does the drop of the
# ended runs' queued tasks once it found them by their run.
ALSO = {
    "lease_expired_tasks": ("tasks_pkey", ("tenant_id", "id")),
    "lease_queued_tasks": ("tasks_pkey", ("tenant_id", "id")),
    "drop_runs_tasks_batch": ("tasks_pkey", ("tenant_id", "id")),
}


def _dollars(sql: str) -> tuple[str, int]:
    count = 0

    def number(_: re.Match[str]) -> str:
        nonlocal count
        count += 1
        return f"${count}"

    return re.sub(r"%[sb]", number, sql), count


def _scans(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan] if "Relation Name" in plan and plan["Node Type"] != "ModifyTable" else []
    for child in plan.get("Plans", []):
        found.extend(_scans(child))
    return found


def generic_plans(url: str) -> dict[str, list[dict[str, Any]]]:
    """The scans of each hot statement's generic plan."""
    out: dict[str, list[dict[str, Any]]] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        for i, (name, template) in enumerate(sorted(HOT_STATEMENTS.items())):
            sql, count = _dollars(PostgresTx.render(template))
            conn.execute(f"PREPARE hot_{i} AS {sql}")
            args = ", ".join(["NULL"] * count)
            # EXPLAIN does not run the statement; the transaction is for form's sake.
            with conn.transaction(force_rollback=True):
                cur = conn.execute(f"EXPLAIN (FORMAT JSON) EXECUTE hot_{i}({args})")
                row = cur.fetchone()
            assert row is not None
            out[name] = _scans(row[0][0]["Plan"])
    return out


def check(plans: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Every way a plan strays from `EXPECTED`, as readable lines."""
    wrong: list[str] = []
    for name, scans in plans.items():
        wanted = dict(EXPECTED[name])
        for scan in scans:
            table = scan["Relation Name"]
            kind = scan["Node Type"]
            if kind == "Seq Scan":
                if table not in SEQ_SCAN_ALLOWED.get(name, set()):
                    wrong.append(f"{name}: Seq Scan on {table}")
                continue
            expected = [wanted[table]] if table in wanted else []
            if name in ALSO and ALSO[name][0] == scan.get("Index Name"):
                expected = [ALSO[name]]
            if not expected:
                wrong.append(f"{name}: unexpected {kind} on {table}")
                continue
            index, columns = expected[0]
            cond = scan.get("Index Cond", "")
            if scan.get("Index Name") != index:
                wrong.append(f"{name}: {kind} on {scan.get('Index Name')} ({cond}), not {index}")
                continue
            missing = [c for c in columns if not re.search(rf"\b{c} (=|<=|>)", cond)]
            if missing:
                wrong.append(f"{name}: {index} cond {cond!r} lacks {missing}")
        seen = {s["Relation Name"] for s in scans}
        wrong.extend(f"{name}: never reads {t}" for t in wanted if t not in seen)
    return wrong


@pytest.fixture
async def migrated(postgres_url: str) -> str:
    store = open_store(postgres_url)
    await store.open()
    try:
        await store.migrate()
    finally:
        await store.close()
    return postgres_url


def test_the_expectations_cover_exactly_the_hot_statements() -> None:
    assert set(EXPECTED) == set(HOT_STATEMENTS)


async def test_generic_plans_on_a_fresh_database_use_the_keys(migrated: str) -> None:
    assert check(generic_plans(migrated)) == []


def _fill(url: str) -> None:
    # One tenant (the worst case for an index that leads with tenant_id), many
    # runs and tasks, then real statistics.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO runs (id, tenant_id, family_slug, version, status, state,"
            " created_at, updated_at) SELECT 'r' || i, 't', 'f', 1, 'RUN_STATUS_RUNNING',"
            " '{}', now(), now() FROM generate_series(1, 5000) AS i"
        )
        conn.execute(
            "INSERT INTO tasks (tenant_id, run_id, step_ref, item_index, attempt, step_type,"
            " handler, idempotency_key, status, available_at, created_at)"
            " SELECT 't', 'r' || (i / 10), 's' || (i % 10), -1, 1, 'a', 'noop', 'k' || i,"
            " CASE WHEN i % 100 = 0 THEN 'queued' ELSE 'done' END, now(), now()"
            " FROM generate_series(1, 50000) AS i"
        )
        conn.execute(
            "INSERT INTO run_inbox (tenant_id, run_id, input, available_at)"
            " SELECT 't', 'r' || (i % 5000), '{}', now() FROM generate_series(1, 2000) AS i"
        )
        conn.execute(
            "INSERT INTO timers (tenant_id, run_id, timer_id, fire_at)"
            " SELECT 't', 'r' || i, 'x', now() + i * interval '1 second'"
            " FROM generate_series(1, 5000) AS i"
        )
        conn.execute(
            "INSERT INTO waits (tenant_id, run_id, step_ref, kind, name, created_at)"
            " SELECT 't', 'r' || i, 's', 'event', 'e' || (i % 7), now()"
            " FROM generate_series(1, 5000) AS i"
        )
        conn.execute("ANALYZE")


async def test_generic_plans_on_a_full_analyzed_database_use_the_keys(migrated: str) -> None:
    _fill(migrated)
    assert check(generic_plans(migrated)) == []
