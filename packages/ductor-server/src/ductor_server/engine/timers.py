"""The timer loop: moves due timers into their runs' inboxes as `TimerFired`.

Each batch enqueues and deletes its timers in one transaction, so a timer
fires once even if the process dies between two batches.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

from ductor_core.runs import TimerFired
from ductor_server.engine.clock import Clock
from ductor_server.engine.queue import Topic, WakeUp
from ductor_server.storage.protocol import Store
from ductor_server.storage.records import NewInboxItem, TimerRef

log = logging.getLogger("ductor.timers")


class Timers:
    """Fires due timers; sleeps until the next one is due or a wake-up comes."""

    def __init__(
        self,
        store: Store,
        *,
        clock: Clock,
        wake: WakeUp,
        batch: int = 256,
        poll_interval: float = 0.5,
    ) -> None:
        self.store = store
        self.clock = clock
        self.wake = wake
        self.batch = batch
        self.poll_interval = poll_interval
        self.stopped = False  # set by the Runtime on stop; loops exit at their next turn
        self.fired = 0  # timers fired since start

    async def run_forever(self) -> None:
        """Fire due timers until cancelled."""
        failures = 0
        while not self.stopped:
            try:
                fired, next_at = await self._fire(self.clock.now())
                failures = 0
                if fired >= self.batch:
                    continue
            except asyncio.CancelledError:
                raise
            except Exception:
                failures += 1
                log.exception("firing timers failed (%d in a row)", failures)
                await asyncio.sleep(min(0.05 * 2**failures, 5.0))
                continue
            sleep = self.poll_interval
            if next_at is not None:
                sleep = min(max((next_at - self.clock.now()).total_seconds(), 0.0), sleep)
            await self.wake.wait(Topic.TIMERS, sleep)

    async def fire_due(self) -> int:
        """Move up to `batch` due timers into inboxes; return how many fired."""
        fired, _ = await self._fire(self.clock.now())
        return fired

    async def _fire(self, now: datetime) -> tuple[int, datetime | None]:
        # One transaction per turn: fire what is due and, when that was not a
        # full batch, learn when the next timer is due (an idle turn is one commit).
        async with self.store.transaction() as tx:
            due = await tx.due_timers(now=now, limit=self.batch)
            if due:
                await tx.enqueue_inbox(
                    [
                        NewInboxItem(
                            tenant_id=t.tenant_id,
                            run_id=t.run_id,
                            input=TimerFired(timer_id=t.timer_id),
                            available_at=now,
                        )
                        for t in due
                    ]
                )
                await tx.delete_timers(
                    [
                        TimerRef(tenant_id=t.tenant_id, run_id=t.run_id, timer_id=t.timer_id)
                        for t in due
                    ]
                )
            next_at = await tx.next_timer_at() if len(due) < self.batch else None
        if due:
            self.fired += len(due)
            self.wake.notify(Topic.INBOX)
        return len(due), next_at
