"""The fair queue's policy as it stands now: `DUCTOR_FAIRNESS` (read at start)
with the per-tenant policies operators set at run time (the `queue_policies`
table) in place of its own for the tenants they name.

A change is announced on the `POLICY` wake-up topic (across processes when
wake-ups go through Redis); each queue reads the table again at its next lease
after hearing of one, and at least every `reload_seconds` in case a message was
lost. No I/O of its own beyond that read, inside the queue's transaction.
"""

from __future__ import annotations

import logging
import time

import msgspec

from ductor_server.engine.fairness import FairPolicy, TenantPolicy
from ductor_server.engine.queue import Topic, WakeUp
from ductor_server.storage.protocol import Tx
from ductor_server.storage.queuepolicies import all_queue_policies

log = logging.getLogger("ductor.queuepolicy")

RELOAD_SECONDS = 5.0
"""The longest a queue goes on with a policy without reading the table again."""


class QueuePolicies:
    """The current policy of one queue.

    Args:
        base: the policy of the settings (`DUCTOR_FAIRNESS`).
        wake: where changes are announced (`Topic.POLICY`); None: only the
            periodic read sees them.
        reload_seconds: how often the table is read again without an announcement.
    """

    def __init__(
        self,
        base: FairPolicy | None = None,
        *,
        wake: WakeUp | None = None,
        reload_seconds: float = RELOAD_SECONDS,
    ) -> None:
        self.base = base or FairPolicy()
        self.policy = self.base
        self.wake = wake
        self.reload_seconds = reload_seconds
        self.reloads = 0  # reads of the table
        self._loaded_at: float | None = None

    async def current(self, tx: Tx) -> FairPolicy:
        """The policy to schedule by now, reading the table again in `tx` when
        a change was announced or the last read is too old."""
        clock = time.monotonic()
        stale = self._loaded_at is None or clock - self._loaded_at >= self.reload_seconds
        if self.wake is not None and await self.wake.wait(Topic.POLICY, 0):
            stale = True
        if stale:
            await self._reload(tx)
            self._loaded_at = clock
        return self.policy

    async def _reload(self, tx: Tx) -> None:
        self.reloads += 1
        tenants: dict[str, TenantPolicy] = {}
        for row in await all_queue_policies(tx):
            try:
                tenants[row.tenant_id] = msgspec.convert(row.policy, TenantPolicy)
            except msgspec.ValidationError as exc:
                log.warning("ignoring the stored queue policy of %s: %s", row.tenant_id, exc)
        policy = self.base.with_tenants(tenants)
        if policy != self.policy:
            self.policy = policy


__all__ = ["RELOAD_SECONDS", "QueuePolicies"]
