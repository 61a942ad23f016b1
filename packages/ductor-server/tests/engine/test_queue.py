"""The in-process wake-ups and the manual clock."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

from ductor_server.engine.clock import ManualClock
from ductor_server.engine.queue import InProcessWakeUp, Topic


async def test_notify_before_wait_is_kept() -> None:
    wake = InProcessWakeUp()
    wake.notify(Topic.INBOX)
    assert await wake.wait(Topic.INBOX, 5.0) is True
    # consumed: the next wait times out
    assert await wake.wait(Topic.INBOX, 0.01) is False


async def test_notify_wakes_a_sleeping_waiter_and_topics_are_separate() -> None:
    wake = InProcessWakeUp()
    started = time.monotonic()
    waiter = asyncio.create_task(wake.wait(Topic.TASKS, 5.0))
    await asyncio.sleep(0.01)
    wake.notify(Topic.TIMERS)
    await asyncio.sleep(0.01)
    assert not waiter.done()
    wake.notify(Topic.TASKS)
    assert await waiter is True
    assert time.monotonic() - started < 2.0


def test_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    assert clock.now() == clock.now()
    clock.advance(2)
    assert clock.now() == datetime(2030, 1, 1, 0, 0, 2, tzinfo=UTC)
    clock.advance(timedelta(minutes=1))
    assert clock.now().minute == 1
