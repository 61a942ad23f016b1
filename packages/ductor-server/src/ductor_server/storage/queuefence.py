"""SQL for the fair queue's lock, fence (migration 0940) and epoch (0941).

The lock orders the processes that lease in fair order: those that pick
through Redis hold it shared from before their pick until their lease commits;
one that counts the store's leases for Redis anew, or leases from the store on
its own (Redis out of reach), holds it alone. The fence is raised by every such
lease on its own, in its transaction. This module decides nothing about what
they mean (`engine.redisqueue` does).
"""

from __future__ import annotations

from ductor_server.storage.protocol import Tx

QUEUE_LOCK = "fair-queue:shared"
"""The name of the fair queue's lock (see `Session.advisory_lock`)."""


async def hold_queue(tx: Tx, *, alone: bool) -> int:
    """Take the queue lock in `tx` (shared unless `alone`) until it ends; return
    the fence as it stands once the lock is held."""
    db = tx.session
    await db.advisory_lock(QUEUE_LOCK, shared=not alone)
    row = await db.fetch_one("SELECT value FROM queue_fence WHERE id = 1")
    return 0 if row is None else int(row[0])


async def queue_epoch(tx: Tx) -> str:
    """This database's name for its queue in Redis: the epoch drawn when it was
    migrated, and on Postgres the database's oid too (a restore into a new
    database changes it, while the dump carries the epoch along)."""
    db = tx.session
    if db.backend == "postgres":
        sql = (
            "SELECT epoch || '.' || (SELECT oid FROM pg_database"
            " WHERE datname = current_database())::text FROM queue_fence WHERE id = 1"
        )
    else:
        sql = "SELECT epoch FROM queue_fence WHERE id = 1"
    row = await db.fetch_one(sql)
    return "" if row is None else str(row[0])


async def raise_fence(tx: Tx) -> int:
    """Raise the fence in `tx` (the queue lock held alone); return its new value."""
    db = tx.session
    row = await db.fetch_one(
        "INSERT INTO queue_fence (id, value) VALUES (1, 1)"
        " ON CONFLICT (id) DO UPDATE SET value = queue_fence.value + 1 RETURNING value"
    )
    return 1 if row is None else int(row[0])
