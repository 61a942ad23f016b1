"""The nonces of accepted signed bridge requests (table `bridge_nonces`, migration
0600): each is accepted once while its signature could still verify.

Reads and writes its table through the public storage `Session`; never commits.
Old rows are purged opportunistically by `first_use` (at most once a minute per
process), so no housekeeping loop is needed.
"""

from __future__ import annotations

import time

from ductor.protocol import REPLAY_WINDOW_SECONDS
from ductor_server.storage.protocol import Tx

CLOCK_SKEW_SECONDS = 60
"""Kept this much longer than the window, for server processes whose clocks differ."""

PURGE_EVERY_SECONDS = 60.0
"""How often (at most, per process) `first_use` deletes expired rows."""

_last_purge = -PURGE_EVERY_SECONDS


def expiry_of(timestamp: int) -> int:
    """Until when (unix seconds) a nonce signed at `timestamp` must be remembered."""
    return timestamp + REPLAY_WINDOW_SECONDS + CLOCK_SKEW_SECONDS


async def first_use(
    tx: Tx, tenant_id: str, app_id: str, nonce: str, *, timestamp: int, now: int
) -> bool:
    """Record `nonce` of a request signed at `timestamp`; False if it was used before.

    The unique key makes this safe under concurrency: of two transactions
    recording the same nonce, one inserts and the other sees it taken.
    """
    global _last_purge
    db = tx.session
    moment = time.monotonic()
    if moment - _last_purge >= PURGE_EVERY_SECONDS:
        _last_purge = moment
        await db.execute("DELETE FROM bridge_nonces WHERE expires_at < %s", (now,))
    inserted = await db.execute(
        "INSERT INTO bridge_nonces (nonce, tenant_id, app_id, expires_at)"
        " VALUES (%s, %s, %s, %s) ON CONFLICT (nonce) DO NOTHING",
        (nonce, tenant_id, app_id, expiry_of(timestamp)),
    )
    return inserted == 1


__all__ = ["CLOCK_SKEW_SECONDS", "PURGE_EVERY_SECONDS", "expiry_of", "first_use"]
