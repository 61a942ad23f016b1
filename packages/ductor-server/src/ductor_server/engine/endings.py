"""Waiting for runs to end: what `GET /v1/runs/{run_id}?wait=` long-polls on.

The coordinator of this process hands the runs it ended to `ended` once their
transaction commits, which answers their waiters at once, without a statement.
Runs ended by other processes are learned from the store: while requests
wait, one loop reads the status of every run they wait for, in one statement,
when another process wakes `Topic.ENDED` (a wake-up shared through Redis), and
every `poll` seconds in any case. Nothing is kept but the waiting requests
themselves: a stopping process answers them at once with their runs as they
stand (`stop_waiting`), so that their clients ask again, and nothing is lost.

A tenant may have `per_tenant` requests waiting in a process at once; one
more is refused (`RunWaitLimit`) rather than left to hold a connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Iterator

from ductor_server.engine.queue import InProcessWakeUp, Topic, WakeUp
from ductor_server.errors import RunWaitLimit
from ductor_server.storage import Store
from ductor_server.storage.records import RunRef

log = logging.getLogger("ductor.endings")

POLL_SECONDS = 0.5
"""How often the waiters' runs are read without a wake-up."""

PER_TENANT = 1000
"""Requests one tenant may have waiting in one process at once."""

CHUNK = 500
"""Runs read per statement."""


class RunEndings:
    """The runs requests of this process wait for, and the loop that wakes them."""

    def __init__(
        self,
        store: Store,
        wake: WakeUp,
        *,
        poll: float = POLL_SECONDS,
        per_tenant: int = PER_TENANT,
    ) -> None:
        self.store = store
        self.wake = wake
        self.poll = poll
        self.per_tenant = per_tenant
        self.looks = 0  # statements that read the waited-for runs
        self._waiters: dict[tuple[str, str], set[asyncio.Future[None]]] = {}
        self._by_tenant: dict[str, int] = {}
        self._loop: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def waiting(self) -> int:
        """Requests waiting now."""
        return sum(self._by_tenant.values())

    @contextlib.contextmanager
    def watch(self, tenant_id: str, run_id: str) -> Iterator[asyncio.Future[None]]:
        """A future done once the run is seen ended, for as long as the block
        lasts. Enter it before reading the run: an end that commits after the
        read still wakes it.

        Raises:
            RunWaitLimit: the tenant already has `per_tenant` requests waiting.
        """
        if self._by_tenant.get(tenant_id, 0) >= self.per_tenant:
            raise RunWaitLimit(self.per_tenant)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._stopping:
            future.set_result(None)
        key = (tenant_id, run_id)
        self._waiters.setdefault(key, set()).add(future)
        self._by_tenant[tenant_id] = self._by_tenant.get(tenant_id, 0) + 1
        if self._loop is None or self._loop.done():
            self._loop = asyncio.get_running_loop().create_task(
                self._look_forever(), name="ductor-run-endings"
            )
        try:
            yield future
        finally:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(future)
                if not waiters:
                    del self._waiters[key]
            left = self._by_tenant[tenant_id] - 1
            if left:
                self._by_tenant[tenant_id] = left
            else:
                del self._by_tenant[tenant_id]
            if not future.done():
                future.cancel()

    def ended(self, refs: Iterable[RunRef]) -> None:
        """Runs of this process ended (their transaction committed): answer their
        waiters."""
        for ref in refs:
            self._answer((ref.tenant_id, ref.run_id))

    def _answer(self, key: tuple[str, str]) -> None:
        for future in self._waiters.get(key, ()):
            if not future.done():
                future.set_result(None)

    def stop_waiting(self) -> None:
        """The process is stopping: answer every waiting request now, and every
        later one at once, rather than hold connections the stop would cut."""
        self._stopping = True
        for key in list(self._waiters):
            self._answer(key)

    async def close(self) -> None:
        """Stop the loop (the waiting requests time out on their own)."""
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._loop
            self._loop = None

    async def _look_forever(self) -> None:
        failures = 0
        # An in-process wake-up carries only this process's ends, which `ended`
        # answered already: then only the slow look reads the store.
        shared = not isinstance(self.wake, InProcessWakeUp)
        while self._waiters:
            if shared:
                await self.wake.wait(Topic.ENDED, self.poll)
            else:
                await asyncio.sleep(self.poll)
            if not self._waiters:
                break
            try:
                await self.look()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception:
                failures += 1
                log.exception("reading the runs requests wait for failed (%d in a row)", failures)
                await asyncio.sleep(min(self.poll * failures, 5.0))

    async def look(self) -> int:
        """Read every waited-for run once and wake the waiters of those that ended;
        returns how many runs ended."""
        keys = list(self._waiters)
        ended = 0
        for start in range(0, len(keys), CHUNK):
            chunk = keys[start : start + CHUNK]
            async with self.store.read() as tx:
                statuses = await tx.run_statuses(
                    [RunRef(tenant_id=tenant, run_id=run) for tenant, run in chunk]
                )
            self.looks += 1
            for key, status in zip(chunk, statuses, strict=True):
                # A run that is gone (None) is answered too: the request reads it again.
                if status is not None and not status.terminal:
                    continue
                ended += 1
                self._answer(key)
        return ended


__all__ = ["PER_TENANT", "POLL_SECONDS", "RunEndings"]
