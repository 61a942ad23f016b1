"""The bridge app registry in the store: apps, their workflows, trigger events
and cron schedules.

Reads and writes the `bridge_*` tables (migration 0200) through the public
storage `Session` of either backend; every call takes the tenant. Never commits.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime
from typing import Any

import msgspec

from ductor.protocol import DescribeResponse, WorkflowInfo
from ductor_server.bridge.cron import Cron, CronError
from ductor_server.storage.protocol import Session, Tx

log = logging.getLogger("ductor.bridge")


class BridgeApp(msgspec.Struct, frozen=True, kw_only=True):
    """A registered app: where to reach it and when it last synced or answered."""

    tenant_id: str
    app_id: str
    url: str | None
    describe: DescribeResponse
    synced_at: datetime
    last_seen_at: datetime


class BridgeWorkflow(msgspec.Struct, frozen=True, kw_only=True):
    """A workflow an app serves; `version` grows each time its description changes."""

    tenant_id: str
    app_id: str
    workflow_id: str
    version: int
    hash: str
    info: WorkflowInfo
    updated_at: datetime


class SyncOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What a sync changed: per workflow id, "new", "changed" or "unchanged"."""

    app_id: str
    accepted: list[str]
    changes: dict[str, str]


class BridgeSchedule(msgspec.Struct, frozen=True, kw_only=True):
    """A cron trigger of a registered workflow and the next time it falls due."""

    tenant_id: str
    app_id: str
    workflow_id: str
    cron: str
    next_at: datetime

    @property
    def key(self) -> tuple[str, str, str, str]:
        """Its primary key's values, in the order `_SCHEDULE_KEY` names them."""
        return (self.tenant_id, self.app_id, self.workflow_id, self.cron)


_SCHEDULE_KEY = "tenant_id = %s AND app_id = %s AND workflow_id = %s AND cron = %s"
_SCHEDULE_COLS = "tenant_id, app_id, workflow_id, cron, next_at"


def _hash(info: WorkflowInfo) -> str:
    return hashlib.sha256(msgspec.json.encode(info)).hexdigest()


_APP_COLS = "tenant_id, app_id, url, describe, synced_at, last_seen_at"
_WF_COLS = "tenant_id, app_id, workflow_id, version, hash, info, updated_at"


def _app(db: Session, row: tuple[Any, ...]) -> BridgeApp:
    return BridgeApp(
        tenant_id=row[0],
        app_id=row[1],
        url=row[2],
        describe=msgspec.json.decode(row[3], type=DescribeResponse),
        synced_at=db.from_timestamp(row[4]),
        last_seen_at=db.from_timestamp(row[5]),
    )


def _workflow(db: Session, row: tuple[Any, ...]) -> BridgeWorkflow:
    return BridgeWorkflow(
        tenant_id=row[0],
        app_id=row[1],
        workflow_id=row[2],
        version=int(row[3]),
        hash=row[4],
        info=msgspec.json.decode(row[5], type=WorkflowInfo),
        updated_at=db.from_timestamp(row[6]),
    )


async def sync_app(
    tx: Tx, tenant_id: str, describe: DescribeResponse, *, url: str | None, now: datetime
) -> SyncOutcome:
    """Register or refresh an app from its describe payload.

    Workflows whose description changed get a new version; workflows the app
    no longer serves are dropped from the registry (their runs keep going).
    """
    db = tx.session
    body = msgspec.json.encode(describe).decode()
    await db.execute(
        "DELETE FROM bridge_apps WHERE tenant_id = %s AND app_id = %s",
        (tenant_id, describe.app_id),
    )
    await db.execute(
        f"INSERT INTO bridge_apps ({_APP_COLS}) VALUES (%s, %s, %s, %s, %s, %s)",
        (tenant_id, describe.app_id, url, body, db.to_timestamp(now), db.to_timestamp(now)),
    )
    existing = {wf.workflow_id: wf for wf in await list_workflows(tx, tenant_id, describe.app_id)}
    changes: dict[str, str] = {}
    for info in describe.workflows:
        digest = _hash(info)
        old = existing.pop(info.id, None)
        if old is not None and old.hash == digest:
            changes[info.id] = "unchanged"
            continue
        version = 1 if old is None else old.version + 1
        changes[info.id] = "new" if old is None else "changed"
        await db.execute(
            "DELETE FROM bridge_workflows WHERE tenant_id = %s AND app_id = %s"
            " AND workflow_id = %s",
            (tenant_id, describe.app_id, info.id),
        )
        await db.execute(
            f"INSERT INTO bridge_workflows ({_WF_COLS}) VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (
                tenant_id,
                describe.app_id,
                info.id,
                version,
                digest,
                msgspec.json.encode(info).decode(),
                db.to_timestamp(now),
            ),
        )
    for gone in existing:
        await db.execute(
            "DELETE FROM bridge_workflows WHERE tenant_id = %s AND app_id = %s"
            " AND workflow_id = %s",
            (tenant_id, describe.app_id, gone),
        )
    await db.execute(
        "DELETE FROM bridge_triggers WHERE tenant_id = %s AND app_id = %s",
        (tenant_id, describe.app_id),
    )
    rows = sorted(
        {
            (trigger.event, info.id)
            for info in describe.workflows
            for trigger in info.triggers
            if trigger.event
        }
    )
    if rows:
        await db.executemany(
            "INSERT INTO bridge_triggers (tenant_id, event_name, app_id, workflow_id)"
            " VALUES (%s, %s, %s, %s)",
            [(tenant_id, event, describe.app_id, wf) for event, wf in rows],
        )
    await _sync_schedules(tx, tenant_id, describe, now=now)
    return SyncOutcome(
        app_id=describe.app_id, accepted=[wf.id for wf in describe.workflows], changes=changes
    )


async def _sync_schedules(
    tx: Tx, tenant_id: str, describe: DescribeResponse, *, now: datetime
) -> None:
    """Make the app's schedules the cron triggers it now declares: a (workflow,
    cron) pair it keeps keeps its next time (a re-sync loses no due start), a new
    one is first due at its next time after `now`, a dropped one goes."""
    db = tx.session
    wanted = {
        (info.id, trigger.cron)
        for info in describe.workflows
        for trigger in info.triggers
        if trigger.cron
    }
    rows = await db.fetch_all(
        "SELECT workflow_id, cron FROM bridge_schedules WHERE tenant_id = %s AND app_id = %s",
        (tenant_id, describe.app_id),
    )
    have = {(str(r[0]), str(r[1])) for r in rows}
    gone = sorted(have - wanted)
    if gone:
        await db.executemany(
            f"DELETE FROM bridge_schedules WHERE {_SCHEDULE_KEY}",
            [(tenant_id, describe.app_id, wf, cron) for wf, cron in gone],
        )
    new: list[tuple[Any, ...]] = []
    for wf, text in sorted(wanted - have):
        try:
            first = Cron.parse(text).next_after(now)
        except CronError:
            # The service refuses such a sync; a caller that skipped its check
            # gets a trigger that never fires rather than a failed sync.
            log.warning("app %s workflow %s: cron %r ignored", describe.app_id, wf, text)
            continue
        new.append((tenant_id, describe.app_id, wf, text, db.to_timestamp(first)))
    if new:
        await db.executemany(
            "INSERT INTO bridge_schedules (tenant_id, app_id, workflow_id, cron, next_at)"
            " VALUES (%s, %s, %s, %s, %s)",
            new,
        )


def _schedule(db: Session, row: tuple[Any, ...]) -> BridgeSchedule:
    return BridgeSchedule(
        tenant_id=row[0],
        app_id=row[1],
        workflow_id=row[2],
        cron=row[3],
        next_at=db.from_timestamp(row[4]),
    )


async def due_schedules(tx: Tx, *, now: datetime, limit: int) -> list[BridgeSchedule]:
    """Up to `limit` schedules of every tenant due at `now`, earliest first (read
    without a lock: `lock_due_schedule` takes each one before it is started)."""
    db = tx.session
    rows = await db.fetch_all(
        f"SELECT {_SCHEDULE_COLS} FROM bridge_schedules"
        " WHERE next_at <= %s ORDER BY next_at, tenant_id, app_id, workflow_id, cron"
        " LIMIT %s",
        (db.to_timestamp(now), limit),
    )
    return [_schedule(db, row) for row in rows]


async def lock_due_schedule(tx: Tx, schedule: BridgeSchedule, *, now: datetime) -> bool:
    """Whether `schedule` is still due at `now`, now locked until `tx` ends (False
    when a sync moved or dropped it, or, on Postgres, when another transaction
    holds it: another timer process is starting it)."""
    db = tx.session
    lock = " FOR UPDATE SKIP LOCKED" if db.backend == "postgres" else ""
    row = await db.fetch_one(
        f"SELECT 1 FROM bridge_schedules WHERE {_SCHEDULE_KEY} AND next_at <= %s{lock}",
        (*schedule.key, db.to_timestamp(now)),
    )
    return row is not None


async def next_schedule_at(tx: Tx, *, after: datetime) -> datetime | None:
    """When the earliest schedule of any tenant not due at `after` falls due, or None."""
    db = tx.session
    row = await db.fetch_one(
        "SELECT MIN(next_at) FROM bridge_schedules WHERE next_at > %s", (db.to_timestamp(after),)
    )
    return None if row is None or row[0] is None else db.from_timestamp(row[0])


async def move_schedule(tx: Tx, schedule: BridgeSchedule, next_at: datetime | None) -> None:
    """Set when `schedule` is next due; None drops it (it never falls due again)."""
    db = tx.session
    if next_at is None:
        await db.execute(f"DELETE FROM bridge_schedules WHERE {_SCHEDULE_KEY}", schedule.key)
        return
    await db.execute(
        f"UPDATE bridge_schedules SET next_at = %s WHERE {_SCHEDULE_KEY}",
        (db.to_timestamp(next_at), *schedule.key),
    )


async def list_schedules(tx: Tx, tenant_id: str, app_id: str) -> list[BridgeSchedule]:
    """The app's cron schedules, by workflow and expression."""
    db = tx.session
    rows = await db.fetch_all(
        f"SELECT {_SCHEDULE_COLS} FROM bridge_schedules"
        " WHERE tenant_id = %s AND app_id = %s ORDER BY workflow_id, cron",
        (tenant_id, app_id),
    )
    return [_schedule(db, row) for row in rows]


async def get_app(tx: Tx, tenant_id: str, app_id: str) -> BridgeApp | None:
    """The registered app, or None."""
    db = tx.session
    row = await db.fetch_one(
        f"SELECT {_APP_COLS} FROM bridge_apps WHERE tenant_id = %s AND app_id = %s",
        (tenant_id, app_id),
    )
    return None if row is None else _app(db, row)


async def list_apps(tx: Tx, tenant_id: str) -> list[BridgeApp]:
    """Every registered app of the tenant, by app id."""
    db = tx.session
    rows = await db.fetch_all(
        f"SELECT {_APP_COLS} FROM bridge_apps WHERE tenant_id = %s ORDER BY app_id", (tenant_id,)
    )
    return [_app(db, row) for row in rows]


async def touch_app(tx: Tx, tenant_id: str, app_id: str, *, now: datetime) -> None:
    """Record that the app answered at `now`."""
    db = tx.session
    await db.execute(
        "UPDATE bridge_apps SET last_seen_at = %s WHERE tenant_id = %s AND app_id = %s",
        (db.to_timestamp(now), tenant_id, app_id),
    )


async def list_workflows(tx: Tx, tenant_id: str, app_id: str) -> list[BridgeWorkflow]:
    """The workflows an app serves, by id."""
    db = tx.session
    rows = await db.fetch_all(
        f"SELECT {_WF_COLS} FROM bridge_workflows WHERE tenant_id = %s AND app_id = %s"
        " ORDER BY workflow_id",
        (tenant_id, app_id),
    )
    return [_workflow(db, row) for row in rows]


async def get_workflow(
    tx: Tx, tenant_id: str, app_id: str, workflow_id: str
) -> BridgeWorkflow | None:
    """One registered workflow, or None."""
    db = tx.session
    row = await db.fetch_one(
        f"SELECT {_WF_COLS} FROM bridge_workflows WHERE tenant_id = %s AND app_id = %s"
        " AND workflow_id = %s",
        (tenant_id, app_id, workflow_id),
    )
    return None if row is None else _workflow(db, row)


async def triggered_workflows(tx: Tx, tenant_id: str, event_name: str) -> list[BridgeWorkflow]:
    """The registered workflows with a trigger on `event_name` (the caller checks `match`)."""
    db = tx.session
    rows = await db.fetch_all(
        "SELECT w.tenant_id, w.app_id, w.workflow_id, w.version, w.hash, w.info, w.updated_at"
        " FROM bridge_triggers t JOIN bridge_workflows w"
        " ON w.tenant_id = t.tenant_id AND w.app_id = t.app_id AND w.workflow_id = t.workflow_id"
        " WHERE t.tenant_id = %s AND t.event_name = %s ORDER BY w.app_id, w.workflow_id",
        (tenant_id, event_name),
    )
    return [_workflow(db, row) for row in rows]


__all__ = [
    "BridgeApp",
    "BridgeSchedule",
    "BridgeWorkflow",
    "SyncOutcome",
    "due_schedules",
    "get_app",
    "get_workflow",
    "list_apps",
    "list_schedules",
    "list_workflows",
    "lock_due_schedule",
    "move_schedule",
    "next_schedule_at",
    "sync_app",
    "touch_app",
    "triggered_workflows",
]
