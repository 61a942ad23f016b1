"""Enforcing an SDK workflow's `concurrency` option: the durable slot table.

Runs inside the caller's transaction; writes only the `bridge_concurrency`
table and (through `Effects`) the run inbox, never run state.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import msgspec

from ductor_core.errors import DuctorError
from ductor_core.expressions import ExpressionEngine
from ductor_core.runs import TimerFired
from ductor_server.bridge.registry import BridgeWorkflow, get_workflow
from ductor_server.bridge.tick import SLOT_TIMER, parse_bridge_slug
from ductor_server.engine.effects import Effects
from ductor_server.storage.protocol import Session, Tx
from ductor_server.storage.records import NewInboxItem, RunRecord

log = logging.getLogger("ductor.bridge")


def concurrency_key(engine: ExpressionEngine, source: str | None, input: Any) -> str:
    """The slot key of a run: its workflow's CEL `key` over `{input}` as text
    ("" with no key; a key that fails to evaluate also shares "")."""
    if not source:
        return ""
    try:
        value = engine.evaluate(source, {"input": input})
    except DuctorError as exc:
        log.info("concurrency key %r did not evaluate: %s", source, exc)
        return ""
    return value if isinstance(value, str) else msgspec.json.encode(value).decode()


async def _lock(db: Session, tenant_id: str, family_slug: str, key: str) -> None:
    # Serializes admissions and releases of one (workflow, key) until commit
    # (an advisory lock on Postgres; SQLite's BEGIN IMMEDIATE already does it).
    # The name is the one earlier releases used, so old and new processes agree.
    await db.advisory_lock(f"workflow:{tenant_id}:concurrency:{family_slug}:{key}")


async def _active(db: Session, tenant_id: str, family_slug: str, key: str) -> int:
    row = await db.fetch_one(
        "SELECT COUNT(*) FROM bridge_concurrency WHERE tenant_id = %s AND family_slug = %s"
        " AND conc_key = %s AND active = %s",
        (tenant_id, family_slug, key, True),
    )
    return int(row[0]) if row is not None else 0


async def take_slot(
    tx: Tx,
    engine: ExpressionEngine,
    *,
    tenant_id: str,
    family_slug: str,
    workflow: BridgeWorkflow,
    input: Any,
    force: bool = False,
) -> tuple[str, bool]:
    """Lock the run's (workflow, key) and say whether a new run may start now:
    (key, True) when fewer than `limit` runs of it hold a slot (or `force`).

    Call `record_slot` once the run is inserted (under the same lock).
    """
    info = workflow.info.concurrency
    assert info is not None
    key = concurrency_key(engine, info.key, input)
    db = tx.session
    await _lock(db, tenant_id, family_slug, key)
    return key, force or await _active(db, tenant_id, family_slug, key) < info.limit


async def record_slot(
    tx: Tx,
    *,
    tenant_id: str,
    run_id: str,
    family_slug: str,
    key: str,
    active: bool,
    now: datetime,
) -> None:
    """Record a new run of a limited workflow: holding a slot, or waiting for one."""
    db = tx.session
    await db.execute(
        "INSERT INTO bridge_concurrency (tenant_id, run_id, family_slug, conc_key, active,"
        " created_at) VALUES (%s, %s, %s, %s, %s, %s)",
        (tenant_id, run_id, family_slug, key, active, db.to_timestamp(now)),
    )


async def release_slot(tx: Tx, effects: Effects, *, run: RunRecord, now: datetime) -> None:
    """Forget an ended run; if it held a slot, give the freed slots to the oldest
    waiting runs of the same (workflow, key) and wake them through their inbox.

    A run that ended while waiting (cancelled, timed out) frees nothing.
    """
    db = tx.session
    row = await db.fetch_one(
        "SELECT conc_key FROM bridge_concurrency WHERE tenant_id = %s AND run_id = %s",
        (run.tenant_id, run.id),
    )
    if row is None:
        return  # not a run of a limited workflow
    key = str(row[0])
    await _lock(db, run.tenant_id, run.family_slug, key)
    row = await db.fetch_one(
        "SELECT active FROM bridge_concurrency WHERE tenant_id = %s AND run_id = %s",
        (run.tenant_id, run.id),
    )
    if row is None:
        return
    await db.execute(
        "DELETE FROM bridge_concurrency WHERE tenant_id = %s AND run_id = %s",
        (run.tenant_id, run.id),
    )
    if not row[0]:
        return
    # The limit in force now (a re-sync may have changed it; a dropped workflow
    # or option lets every waiting run go).
    app_id, workflow_id = parse_bridge_slug(run.family_slug)
    workflow = await get_workflow(tx, run.tenant_id, app_id, workflow_id)
    info = workflow.info.concurrency if workflow is not None else None
    limit = ""
    if info is not None:
        free = info.limit - await _active(db, run.tenant_id, run.family_slug, key)
        if free <= 0:
            return
        limit = f" LIMIT {int(free)}"
    rows = await db.fetch_all(
        "SELECT run_id FROM bridge_concurrency WHERE tenant_id = %s AND family_slug = %s"
        " AND conc_key = %s AND active = %s ORDER BY seq" + limit,
        (run.tenant_id, run.family_slug, key, False),
    )
    for (run_id,) in rows:
        await db.execute(
            "UPDATE bridge_concurrency SET active = %s WHERE tenant_id = %s AND run_id = %s",
            (True, run.tenant_id, run_id),
        )
        effects.inbox.append(
            NewInboxItem(
                tenant_id=run.tenant_id,
                run_id=run_id,
                input=TimerFired(timer_id=SLOT_TIMER),
                available_at=now,
            )
        )


__all__ = ["SLOT_TIMER", "concurrency_key", "record_slot", "release_slot", "take_slot"]
