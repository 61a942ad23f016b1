"""An SDK workflow's `concurrency` option: what it means in the task queue, its
check at sync, and the durable slot table that earlier releases enforced it with.

The option is enforced by the fair task queue, as a DAG definition's is: a run
of a limited workflow stores its limit key and limits (`run_limits`), and the
queue never leases more of its steps at once, nor starts them faster, than the
option allows per key. A run that sleeps or waits holds nothing.

Earlier releases counted whole runs in table `bridge_concurrency` (migration
0210) and created runs beyond the limit waiting (PENDING) for a slot. No new
run waits there; `release_slot` still hands the slots of runs stored then to
the runs that wait for them, so those runs start once the runs before them end.

Writes only the `bridge_concurrency` table and (through `Effects`) the run
inbox, never run state.
"""

from __future__ import annotations

import logging
from datetime import datetime

from ductor.protocol import ConcurrencyInfo
from ductor_core.concurrency import ConcurrencyOption, RateLimit
from ductor_core.errors import ExpressionError
from ductor_core.expressions import ExpressionEngine
from ductor_core.runs import TimerFired
from ductor_core.validation import unseen_variables
from ductor_server.bridge.registry import get_workflow
from ductor_server.bridge.tick import SLOT_TIMER, parse_bridge_slug
from ductor_server.engine.effects import Effects
from ductor_server.storage.protocol import Session, Tx
from ductor_server.storage.records import NewInboxItem, RunRecord

log = logging.getLogger("ductor.bridge")


def option_of(info: ConcurrencyInfo | None) -> ConcurrencyOption | None:
    """The queue's reading of a workflow's `concurrency` option."""
    if info is None:
        return None
    rate = None
    if info.rate is not None:
        rate = RateLimit(limit=info.rate.limit, period=info.rate.period, burst=info.rate.burst)
    return ConcurrencyOption(limit=info.limit, key=info.key, rate=rate)


def option_problems(
    info: ConcurrencyInfo, engine: ExpressionEngine, pointer: str
) -> list[tuple[str, str]]:
    """What is wrong with a workflow's `concurrency` option, as (JSON pointer,
    message) pairs: its limits, and its key's CEL (which must compile within
    the engine's cost limits and read only `input`)."""
    option = option_of(info)
    assert option is not None
    out = [(pointer + where, message) for where, message in option.problems()]
    if option.key and option.key.strip() and not any(w == pointer + "/key" for w, _ in out):
        try:
            engine.compile(option.key)
        except ExpressionError as exc:
            out.append((pointer + "/key", exc.message.split("\n", 1)[0]))
        else:
            # Evaluated over the run's input alone (`key_value`).
            unseen = unseen_variables(option.key, ("input",), engine.functions.names())
            if unseen is not None:
                out.append((pointer + "/key", f"the key {unseen}: {option.key!r:.80}"))
    return out


async def _lock(db: Session, tenant_id: str, family_slug: str, key: str) -> None:
    # Serializes releases of one (workflow, key) until commit (an advisory lock
    # on Postgres; SQLite's BEGIN IMMEDIATE already does it). The name is the one
    # earlier releases used, so old and new processes agree.
    await db.advisory_lock(f"workflow:{tenant_id}:concurrency:{family_slug}:{key}")


async def _active(db: Session, tenant_id: str, family_slug: str, key: str) -> int:
    row = await db.fetch_one(
        "SELECT COUNT(*) FROM bridge_concurrency WHERE tenant_id = %s AND family_slug = %s"
        " AND conc_key = %s AND active = %s",
        (tenant_id, family_slug, key, True),
    )
    return int(row[0]) if row is not None else 0


async def release_slot(tx: Tx, effects: Effects, *, run: RunRecord, now: datetime) -> None:
    """Forget an ended run stored by an earlier release; if it held a slot, give
    the freed slots to the oldest waiting runs of the same (workflow, key) and
    wake them through their inbox (the queue limits their steps from then on).

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
    if info is not None and info.limit is not None:
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


__all__ = ["SLOT_TIMER", "option_of", "option_problems", "release_slot"]
