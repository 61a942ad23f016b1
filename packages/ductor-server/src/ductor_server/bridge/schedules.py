"""Cron triggers of SDK workflows, fired by the timer loop (`engine.timers.Schedule`).

At each time its cron names, a workflow gets one run with the input
`{"scheduled_at": "<time, RFC 3339 UTC>"}` and the idempotency key
`cron:<app>:<workflow>:<time>` (`cron_run_key`): two timer processes, or one
restarted after a crash, never start a time twice. A time missed while no
timer process ran is not made up one by one: the first turn after it starts
only the latest missed time, then waits for the next one.

Writes only through the `Tx` and `Effects` the timer loop gives it.
"""

from __future__ import annotations

import logging
from datetime import datetime

from ductor_core.timestamps import utc_text
from ductor_server.bridge.cron import Cron, CronError
from ductor_server.bridge.registry import (
    due_schedules,
    get_workflow,
    move_schedule,
    next_schedule_at,
)
from ductor_server.bridge.runs import create_bridge_run
from ductor_server.engine.effects import Effects, EngineParts
from ductor_server.storage.protocol import Tx

log = logging.getLogger("ductor.bridge")


def cron_run_key(app_id: str, workflow_id: str, at: datetime) -> str:
    """The idempotency key of the run a cron trigger starts for the time `at`
    (the tenant is implied: run keys are unique per tenant)."""
    return f"cron:{app_id}:{workflow_id}:{utc_text(at)}"


class BridgeSchedules:
    """The cron triggers of every tenant's registered SDK workflows."""

    def __init__(self, parts: EngineParts) -> None:
        self.parts = parts

    async def start_due(
        self, tx: Tx, effects: Effects, *, now: datetime, limit: int
    ) -> tuple[int, datetime | None]:
        """Start a run for every cron trigger due at `now` and move each to its
        next time; return how many were due and when the next one is."""
        due = await due_schedules(tx, now=now, limit=limit)
        for schedule in due:
            try:
                cron = Cron.parse(schedule.cron)
            except CronError:  # stored by an unchecked sync: it can never fire
                log.warning("dropping the unreadable cron schedule %r", schedule)
                await move_schedule(tx, schedule, None)
                continue
            workflow = await get_workflow(
                tx, schedule.tenant_id, schedule.app_id, schedule.workflow_id
            )
            if workflow is None:  # the sync that dropped it dropped its schedules too
                await move_schedule(tx, schedule, None)
                continue
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
            await move_schedule(tx, schedule, cron.next_after(now))
        next_at = await next_schedule_at(tx) if len(due) < limit else None
        return len(due), next_at


__all__ = ["BridgeSchedules", "cron_run_key"]
