"""Lanes that run CPU-heavy pure work (validating definitions, compiling and
evaluating CEL, the tick) in worker threads, a few at a time, off the event loop.

A lane only bounds and runs; it opens no transaction and keeps no state beyond
its slots, so callers decide what runs where (never inside an open transaction).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class Lane:
    """A bounded set of worker-thread slots for one kind of heavy work.

    At most `slots` calls run at once; the others wait their turn on the event
    loop, holding nothing but their arguments. Separate lanes keep a flood of
    one kind (tenants validating huge definitions) from starving another (the
    coordinator's ticks). Lanes are shared by a whole process, and work on any
    event loop (tests run several).

    Args:
        name: what the lane runs, for logs and metrics.
        slots: how many calls may run in threads at once.
    """

    def __init__(self, name: str, slots: int) -> None:
        if slots < 1:
            raise ValueError("a lane needs at least one slot")
        self.name = name
        self.slots = slots
        self.waiting = 0  # calls queued for a slot right now
        self.running = 0  # calls in a thread right now
        # asyncio primitives bind to one loop; keep one semaphore per loop.
        self._semaphores: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, asyncio.Semaphore
        ] = weakref.WeakKeyDictionary()

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        semaphore = self._semaphores.get(loop)
        if semaphore is None:
            semaphore = self._semaphores[loop] = asyncio.Semaphore(self.slots)
        return semaphore

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Call `fn(*args, **kwargs)` in a worker thread once a slot is free.

        Cancelling the caller does not stop a call already in its thread (Python
        cannot interrupt a thread); the slot is held until the call ends, so the
        bound holds even then.
        """
        semaphore = self._semaphore()
        self.waiting += 1
        try:
            await semaphore.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        released = False

        def release(done: asyncio.Future[T] | None = None) -> None:
            nonlocal released
            if done is not None and not done.cancelled():
                done.exception()  # retrieved here when the caller has gone
            if not released:
                released = True
                self.running -= 1
                semaphore.release()

        try:
            task = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
        except BaseException:
            release()
            raise
        task.add_done_callback(release)
        # Shield: a cancelled caller leaves the thread to finish and free the slot.
        return await asyncio.shield(task)


VALIDATION = Lane("validation", 2)
"""Validating definitions and compiling configuration sent by tenants."""

ENGINE = Lane("engine", 2)
"""The engine's pure work: ticks, first ticks of new runs, trigger filters."""


__all__ = ["ENGINE", "VALIDATION", "Lane"]
