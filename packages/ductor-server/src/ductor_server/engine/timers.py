"""The timer loop: moves due timers into their runs' inboxes as `TimerFired`,
brings snoozed inbox notifications back, unseen, when their snooze ends, and
starts the runs that schedules plugged in (`Schedule`: the bridge's cron
triggers) say are due.

Each batch enqueues and deletes its timers (and ends its snoozes, and starts
its scheduled runs) in one transaction, so a timer fires once even if the
process dies between two batches, and a snooze survives a restart: its end is
a column of the store. An idle turn is one commit; the loop sleeps until the
earliest of the next timer, snooze end and scheduled start (at most the poll
interval), or until `Topic.TIMERS` wakes it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

import msgspec

from ductor_core.runs import TimerFired
from ductor_server.engine.clock import Clock
from ductor_server.engine.effects import Effects
from ductor_server.engine.inboxfeed import InboxFeed
from ductor_server.engine.queue import Topic, WakeUp
from ductor_server.storage.notifications import InboxTx
from ductor_server.storage.protocol import Store, Tx
from ductor_server.storage.records import NewInboxItem, TimerRef

log = logging.getLogger("ductor.timers")


class Schedule(Protocol):
    """Runs that start at times of their own (a run kind's cron triggers).

    The timer loop asks what is `due` in its turn's transaction (a read, so an
    idle turn stays one commit), then, once that has committed, `start`s each
    entry in a transaction of the schedule's own: an entry that cannot start
    holds up no timer and no other tenant's entry. A start repeated (another
    timer process, a restart) must be harmless: an idempotency key per time.
    """

    async def due(
        self, tx: Tx, *, now: datetime, limit: int
    ) -> tuple[Sequence[object], datetime | None]:
        """Up to `limit` entries due at `now`, and when the first entry not yet
        due falls due (None: none is scheduled; only read when fewer than
        `limit` are due)."""
        ...

    async def start(self, store: Store, entry: object, *, now: datetime) -> Effects | None:
        """Start `entry` in a transaction of its own and move it to its next time;
        the effects to announce once committed, or None when nothing started
        (another process did, or the entry could not start and was moved on).

        Raises:
            Exception: a failure that may pass (the store is unreachable): the
                entry stays due and the loop tries it again at its next turn.
        """
        ...


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
        feed: InboxFeed | None = None,
    ) -> None:
        self.store = store
        self.feed = feed
        self.unsnoozed = 0  # notifications brought back from a snooze since start
        self.clock = clock
        self.wake = wake
        self.batch = batch
        self.poll_interval = poll_interval
        self.stopped = False  # set by the Runtime on stop; loops exit at their next turn
        self.fired = 0  # timers fired since start
        self.scheduled = 0  # scheduled starts fired since start
        self.schedules: list[Schedule] = []  # plugged in before the loop starts

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
            woken, next_snooze = await self._unsnooze(tx, now)
            pending: list[tuple[Schedule, object]] = []
            for schedule in self.schedules:
                entries, next_start = await schedule.due(tx, now=now, limit=self.batch)
                pending.extend((schedule, entry) for entry in entries)
                if len(entries) >= self.batch:
                    next_start = now
                if next_start is not None and (next_at is None or next_start < next_at):
                    next_at = next_start
        await self._start_scheduled(pending, now)
        if due:
            self.fired += len(due)
            self.wake.notify(Topic.INBOX)
        if woken:
            self.unsnoozed += len(woken)
            if self.feed is not None:
                self.feed.announce(woken)
        if len(woken) >= self.batch or len(pending) >= self.batch:
            return self.batch, now
        if next_snooze is not None and (next_at is None or next_snooze < next_at):
            next_at = next_snooze
        return len(due), next_at

    async def _start_scheduled(self, pending: list[tuple[Schedule, object]], now: datetime) -> None:
        for schedule, entry in pending:
            try:
                effects = await schedule.start(self.store, entry, now=now)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("a scheduled start failed; it is tried again: %r", entry)
                continue
            if effects is not None:
                self.scheduled += 1
                effects.notify(self.wake, self.feed)

    async def _unsnooze(
        self, tx: Tx, now: datetime
    ) -> tuple[list[tuple[str, str]], datetime | None]:
        inbox = InboxTx(tx)
        woken: list[tuple[str, str]] = []
        for tenant_id, notification_id in await inbox.due_snoozes(now, limit=self.batch):
            item = await inbox.get(tenant_id, notification_id)
            if item is None:
                continue
            # Take the subscriber's lock, then read again: a change committed
            # meanwhile (a click, an archive, a new snooze) is kept, not overwritten.
            await inbox.take_seqs(tenant_id, item.subscriber_id, 0)
            item = await inbox.get(tenant_id, notification_id)
            if item is None or item.snoozed_until is None or item.snoozed_until > now:
                continue
            await inbox.update(
                msgspec.structs.replace(item, snoozed_until=None, seen_at=None), now=now
            )
            woken.append((tenant_id, item.subscriber_id))
        next_at = await inbox.next_snooze_at() if len(woken) < self.batch else None
        return woken, next_at
