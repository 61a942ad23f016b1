"""The queue-depth sampler: counts ready tasks per tier and tenant in the store
every `interval` seconds, for the `ductor.queue.depth` gauge.

It runs only while a meter provider is set (an SDK is configured), so a server
without one makes no extra query. Collecting the gauge reads the last count
from memory: a metric reader never queries the store. The count covers every
process's tasks (the store is the truth), with the `tenants` largest (tier,
tenant) pairs named and the rest of each tier as tenant `_other`, so the
number of series stays bounded whatever the number of tenants.
"""

from __future__ import annotations

import asyncio
import logging

from ductor_server.engine.clock import Clock
from ductor_server.storage.protocol import Store
from ductor_server.storage.records import QueueDepth
from ductor_server.telemetry import QUEUE_DEPTH

log = logging.getLogger("ductor.queuedepth")

OTHER_TENANTS = "_other"
"""The `ductor.tenant` of the ready tasks of tenants beyond the largest ones."""


def readings(depth: QueueDepth) -> dict[tuple[int, str], int]:
    """The gauge's readings for one count: the named pairs, and per tier the rest."""
    found: dict[tuple[int, str], int] = {}
    named: dict[int, int] = {}
    for tier, tenant, count in depth.tenants:
        found[(tier, tenant)] = count
        named[tier] = named.get(tier, 0) + count
    for tier, total in depth.tiers.items():
        rest = total - named.get(tier, 0)
        if rest > 0:
            found[(tier, OTHER_TENANTS)] = rest
    return found


class QueueDepthSampler:
    """Publishes the store's ready-task counts to `ductor.queue.depth`."""

    def __init__(
        self, store: Store, *, clock: Clock, interval: float = 15.0, tenants: int = 100
    ) -> None:
        self.store = store
        self.clock = clock
        self.interval = interval
        self.tenants = tenants
        self.stopped = False  # set by the Runtime on stop
        self.samples = 0  # counts published since start

    async def sample(self) -> dict[tuple[int, str], int]:
        """Count now and publish; return the readings."""
        async with self.store.transaction() as tx:
            depth = await tx.queue_depth(now=self.clock.now(), tenants=self.tenants)
        found = readings(depth)
        QUEUE_DEPTH.publish(found)
        self.samples += 1
        return found

    async def run_forever(self) -> None:
        """Sample, then sleep `interval`, until stopped or cancelled."""
        try:
            while not self.stopped:
                try:
                    await self.sample()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("counting the queue depth failed")
                await asyncio.sleep(self.interval)
        finally:
            QUEUE_DEPTH.clear()


__all__ = ["OTHER_TENANTS", "QueueDepthSampler", "readings"]
