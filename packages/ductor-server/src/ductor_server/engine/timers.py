"""The timer loop: moves due timers into their runs' inboxes as `TimerFired`.

Each batch enqueues and deletes its timers in one transaction, so a timer
fires once even if the process dies between two batches.
"""

from __future__ import annotations

import asyncio
import logging

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
                fired = await self.fire_due()
                failures = 0
                if fired >= self.batch:
                    continue
                sleep = await self._sleep_for()
            except asyncio.CancelledError:
                raise
            except Exception:
                failures += 1
                log.exception("firing timers failed (%d in a row)", failures)
                await asyncio.sleep(min(0.05 * 2**failures, 5.0))
                continue
            await self.wake.wait(Topic.TIMERS, sleep)

    async def fire_due(self) -> int:
        """Move up to `batch` due timers into inboxes; return how many fired."""
        now = self.clock.now()
        async with self.store.transaction() as tx:
            due = await tx.due_timers(now=now, limit=self.batch)
            if not due:
                return 0
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
                [TimerRef(tenant_id=t.tenant_id, run_id=t.run_id, timer_id=t.timer_id) for t in due]
            )
        self.fired += len(due)
        self.wake.notify(Topic.INBOX)
        return len(due)

    async def _sleep_for(self) -> float:
        async with self.store.transaction() as tx:
            next_at = await tx.next_timer_at()
        if next_at is None:
            return self.poll_interval
        seconds = (next_at - self.clock.now()).total_seconds()
        return min(max(seconds, 0.0), self.poll_interval)
