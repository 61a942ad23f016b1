"""Cron triggers of SDK workflows, fired by the timer loop (`engine.timers.Schedule`).

At each time its cron names, a workflow gets one run with the input
`{"scheduled_at": "<time, RFC 3339 UTC>"}` and the idempotency key
`cron:<app>:<workflow>:<time>` (`cron_run_key`): two timer processes, or one
restarted after a crash, never start a time twice. A time missed while no
timer process ran is not made up one by one: the first turn after it starts
only the latest missed time, then waits for the next one.

Each due trigger is started in a transaction of its own, after the timer
loop's turn has committed: one tenant's trigger that cannot start (a blocking
budget) delays no timer and no other trigger; its time is skipped.
"""

from __future__ import annotations

import logging
from datetime import datetime

from ductor_core.errors import DuctorError
from ductor_core.timestamps import utc_text
from ductor_server.bridge.cron import Cron, CronError
from ductor_server.bridge.registry import (
    BridgeSchedule,
    due_schedules,
    get_workflow,
    lock_due_schedule,
    move_schedule,
    next_schedule_at,
)
from ductor_server.bridge.runs import create_bridge_run
from ductor_server.engine.effects import Effects, EngineParts
from ductor_server.storage.protocol import Store, Tx

log = logging.getLogger("ductor.bridge")


def cron_run_key(app_id: str, workflow_id: str, at: datetime) -> str:
    """The idempotency key of the run a cron trigger starts for the time `at`
    (the tenant is implied: run keys are unique per tenant)."""
    return f"cron:{app_id}:{workflow_id}:{utc_text(at)}"


class _NotStarted(Exception):
    """A scheduled run that cannot start (its tenant's budget refuses it)."""


class BridgeSchedules:
    """The cron triggers of every tenant's registered SDK workflows."""

    def __init__(self, parts: EngineParts) -> None:
        self.parts = parts

    async def due(
        self, tx: Tx, *, now: datetime, limit: int
    ) -> tuple[list[BridgeSchedule], datetime | None]:
        """The cron triggers due at `now` (at most `limit`), and when the next falls due."""
        due = await due_schedules(tx, now=now, limit=limit)
        next_at = await next_schedule_at(tx, after=now) if len(due) < limit else None
        return due, next_at

    async def start(self, store: Store, entry: object, *, now: datetime) -> Effects | None:
        """Start the run of a due cron trigger for its latest time and move the
        trigger to its next time, in one transaction. A run its tenant's blocking
        budget or a refusal of the engine stops is not started: that time is
        skipped (logged) and the trigger moved on, so it is not tried again and
        again; any other failure leaves it due, for the loop's next turn."""
        assert isinstance(entry, BridgeSchedule)
        schedule = entry
        try:
            cron = Cron.parse(schedule.cron)
        except CronError:  # stored by an unchecked sync: it can never fire
            log.warning("dropping the unreadable cron schedule %r", schedule)
            async with store.transaction() as tx:
                await move_schedule(tx, schedule, None)
            return None
        effects = Effects()
        try:
            async with store.transaction() as tx:
                if not await lock_due_schedule(tx, schedule, now=now):
                    return None
                workflow = await get_workflow(
                    tx, schedule.tenant_id, schedule.app_id, schedule.workflow_id
                )
                if workflow is None:  # the sync that dropped it dropped its schedules too
                    await move_schedule(tx, schedule, None)
                    return None
                at = cron.latest_until(now)
                await create_bridge_run(
                    tx,
                    self.parts,
                    effects,
                    tenant_id=schedule.tenant_id,
                    workflow=workflow,
                    input={"scheduled_at": utc_text(at)},
                    now=now,
                    idempotency_key=cron_run_key(schedule.app_id, schedule.workflow_id, at),
                )
                await effects.flush(tx)
                over = next((c for c in effects.budgeted if c.over), None)
                if over is not None:  # rolls the run back
                    raise _NotStarted(f"meter {over.meter!r} is at its blocking budget")
                await move_schedule(tx, schedule, cron.next_after(now))
        except (_NotStarted, DuctorError) as refused:
            next_at = cron.next_after(now)
            log.warning(
                "tenant %s, app %s, workflow %s: the cron run due at %s did not start (%s);"
                " the next is due at %s",
                schedule.tenant_id,
                schedule.app_id,
                schedule.workflow_id,
                utc_text(cron.latest_until(now)),
                refused,
                utc_text(next_at),
            )
            async with store.transaction() as tx:
                if await lock_due_schedule(tx, schedule, now=now):
                    await move_schedule(tx, schedule, next_at)
            return None
        return effects


__all__ = ["BridgeSchedules", "cron_run_key"]
