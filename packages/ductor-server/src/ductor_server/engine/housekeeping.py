"""The housekeeping loop: forgets what no longer serves a purpose (done tasks,
old idempotency records, events past their dedupe window), and runs the sweeps
other parts register (the ledger's: expired holds are marked expired).

It only deletes rows whose outcome is kept elsewhere (attempts, runs, history)
or whose window has passed; it never touches live work.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from ductor_server.engine.clock import Clock
from ductor_server.storage.protocol import Store, Tx

log = logging.getLogger("ductor.housekeeping")

Sweep = Callable[[Tx, datetime, int], Awaitable[int]]
"""A registered sweep: `(tx, now, batch)`, returns how many rows it changed (at most
`batch`; it is called again while it returns a full batch)."""


@dataclass(frozen=True, kw_only=True)
class Retention:
    """How long finished rows are kept.

    Attributes:
        done_tasks: a done task is dead weight once its attempt is recorded.
        idempotency: how long a repeated `Idempotency-Key` gets the first answer.
        events: how long a resent event id counts as a duplicate.
    """

    done_tasks: timedelta = timedelta(hours=1)
    idempotency: timedelta = timedelta(hours=24)
    events: timedelta = timedelta(days=7)


async def _run(sweep: Sweep, now: datetime, batch: int, tx: Tx) -> int:
    return await sweep(tx, now, batch)


class Housekeeping:
    """Deletes expired rows in bounded batches, every `interval` seconds."""

    def __init__(
        self,
        store: Store,
        *,
        clock: Clock,
        retention: Retention | None = None,
        interval: float = 300.0,
        batch: int = 1000,
    ) -> None:
        self.store = store
        self.clock = clock
        self.retention = retention or Retention()
        self.interval = interval
        self.batch = batch
        self.stopped = False  # set by the Runtime on stop
        self.purged = {"tasks": 0, "idempotency": 0, "events": 0}
        self.sweeps: dict[str, Sweep] = {}

    def add_sweep(self, name: str, sweep: Sweep) -> None:
        """Run `sweep` on every pass, its count reported under `name`."""
        self.sweeps[name] = sweep
        self.purged.setdefault(name, 0)

    async def run_forever(self) -> None:
        """Sweep, then sleep `interval`, until stopped or cancelled."""
        while not self.stopped:
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("housekeeping sweep failed")
            await asyncio.sleep(self.interval)

    async def sweep(self) -> dict[str, int]:
        """Delete every expired row now (in batches); return how many of each kind."""
        now = self.clock.now()
        done: dict[str, int] = {}
        done["tasks"] = await self._drain(
            lambda tx: tx.purge_done_tasks(
                created_before=now - self.retention.done_tasks, limit=self.batch
            )
        )
        done["events"] = await self._drain(
            lambda tx: tx.purge_events(
                received_before=now - self.retention.events, limit=self.batch
            )
        )
        async with self.store.transaction() as tx:
            done["idempotency"] = await tx.delete_idempotency_before(
                now - self.retention.idempotency
            )
        for name, sweep in self.sweeps.items():
            done[name] = await self._drain(functools.partial(_run, sweep, now, self.batch))
        for kind, count in done.items():
            self.purged[kind] += count
        return done

    async def _drain(self, purge: Callable[[Tx], Awaitable[int]]) -> int:
        total = 0
        while True:
            async with self.store.transaction() as tx:
                count = await purge(tx)
            total += count
            if count < self.batch:
                return total
