"""SQL for operators' per-tenant fair queue policies (migration 0931): one row
per tenant whose weight, tier or limits an operator set, in place of what
`DUCTOR_FAIRNESS` says for it.

The policy is stored as the JSON object the operator sent, already checked; this
module decides nothing about what it means (`engine.queuepolicy` does).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from ductor_server.storage.protocol import Tx


class StoredQueuePolicy(msgspec.Struct, frozen=True, kw_only=True):
    """One tenant's policy as an operator set it."""

    tenant_id: str
    policy: Any
    updated_at: datetime


_COLS = "tenant_id, policy, updated_at"


async def all_queue_policies(tx: Tx, *, limit: int = 100_000) -> list[StoredQueuePolicy]:
    """Every stored tenant policy, by tenant."""
    db = tx.session
    rows = await db.fetch_all(
        f"SELECT {_COLS} FROM queue_policies ORDER BY tenant_id LIMIT %s", (limit,)
    )
    return [
        StoredQueuePolicy(
            tenant_id=r[0], policy=db.from_json(r[1]), updated_at=db.from_timestamp(r[2])
        )
        for r in rows
    ]


async def get_queue_policy(tx: Tx, tenant_id: str) -> StoredQueuePolicy | None:
    """The policy an operator set for `tenant_id`, or None."""
    db = tx.session
    row = await db.fetch_one(
        f"SELECT {_COLS} FROM queue_policies WHERE tenant_id = %s", (tenant_id,)
    )
    if row is None:
        return None
    return StoredQueuePolicy(
        tenant_id=row[0], policy=db.from_json(row[1]), updated_at=db.from_timestamp(row[2])
    )


async def put_queue_policy(tx: Tx, tenant_id: str, policy: Any, *, now: datetime) -> bool:
    """Store `policy` for `tenant_id` in place of any earlier one; True if the
    tenant had none."""
    db = tx.session
    # Serializes two operators setting one tenant's policy at once.
    await db.advisory_lock(f"queue-policy:{tenant_id}")
    changed = await db.execute(
        "UPDATE queue_policies SET policy = %s, updated_at = %s WHERE tenant_id = %s",
        (db.to_json(policy), db.to_timestamp(now), tenant_id),
    )
    if changed:
        return False
    await db.execute(
        "INSERT INTO queue_policies (tenant_id, policy, updated_at) VALUES (%s, %s, %s)",
        (tenant_id, db.to_json(policy), db.to_timestamp(now)),
    )
    return True


async def delete_queue_policy(tx: Tx, tenant_id: str) -> bool:
    """Forget `tenant_id`'s policy; True if it had one."""
    db = tx.session
    await db.advisory_lock(f"queue-policy:{tenant_id}")
    return bool(await db.execute("DELETE FROM queue_policies WHERE tenant_id = %s", (tenant_id,)))


__all__ = [
    "StoredQueuePolicy",
    "all_queue_policies",
    "delete_queue_policy",
    "get_queue_policy",
    "put_queue_policy",
]
