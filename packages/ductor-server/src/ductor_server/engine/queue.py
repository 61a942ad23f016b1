"""The queue seam: wake-ups between the engine's loops ("inbox has input",
"tasks available", "timers changed").

The durable queue is the store's tasks/run_inbox/timers tables; this module
only shortens the time a loop sleeps before it looks again. Losing a wake-up
costs latency (the loops also poll), never work.
"""

from __future__ import annotations

import asyncio
import enum
from typing import Protocol, runtime_checkable


class Topic(enum.StrEnum):
    """What a loop can be woken about."""

    INBOX = "inbox"  # some run has pending input: the coordinator should look
    TASKS = "tasks"  # tasks were enqueued: workers should lease
    TIMERS = "timers"  # timers were set or changed: the timer loop should re-plan
    EMAIL = "email"  # inbox emails were queued: the email loop should look
    POLICY = "policy"  # an operator changed a tenant's queue policy: queues read it again
    ENDED = "ended"  # runs ended: requests waiting for a run to end should look


@runtime_checkable
class WakeUp(Protocol):
    """Notify and wait on topics. A notify wakes every waiter of its topic in the
    process (the coordinator loops all wait on `INBOX`); one of them is enough."""

    def notify(self, topic: Topic) -> None:
        """Tell the waiter of `topic` there may be something to do."""
        ...

    async def wait(self, topic: Topic, within: float) -> bool:
        """Sleep until `topic` is notified or `within` seconds pass.

        Returns:
            True if woken by a notify, False on timeout. A notify that came
            while nobody waited is kept and ends the next wait at once.
        """
        ...


class InProcessWakeUp:
    """Wake-ups through asyncio events, for loops sharing one event loop."""

    def __init__(self) -> None:
        self._events: dict[Topic, asyncio.Event] = {topic: asyncio.Event() for topic in Topic}

    def notify(self, topic: Topic) -> None:
        """Set the topic's flag; the next (or current) wait returns at once."""
        self._events[topic].set()

    async def wait(self, topic: Topic, within: float) -> bool:
        """Wait for the topic's flag, then clear it."""
        event = self._events[topic]
        if not event.is_set():
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a
            # cancellation that lands as the event fires, and the loop never stops.
            try:
                async with asyncio.timeout(max(within, 0.0)):
                    await event.wait()
            except TimeoutError:
                return False
        event.clear()
        return True


class NullWakeUp:
    """Wakes nobody: loops in other processes find work by polling."""

    def notify(self, topic: Topic) -> None:
        """Do nothing."""

    async def wait(self, topic: Topic, within: float) -> bool:
        """Sleep for `within` seconds."""
        await asyncio.sleep(max(within, 0.0))
        return False
