"""SQL for settled assignments and their returns (migration 0800), over an open
storage transaction. It decides nothing; every statement takes the tenant."""

from __future__ import annotations

from datetime import datetime

import msgspec

from ductor_server.storage.protocol import Session, Tx
from ductor_settlement import Posting

_postings = msgspec.json.Decoder(tuple[Posting, ...])


class ChargeRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A settled assignment: the entry that charged it (None for a zero charge, or
    until a held charge is posted), the postings a held charge will write, and the
    routable it assigned, as routed (JSON)."""

    assignment_id: str
    entry_id: str | None
    postings: tuple[Posting, ...] | None
    routable: bytes
    created_at: datetime
    config_hash: str | None = None


class ReturnRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One accepted return and the credit entry it wrote."""

    tenant_id: str
    id: str
    assignment_id: str
    pool: str
    buyer: str
    reason: str
    amount: int
    currency: str
    entry_id: str
    created_at: datetime


class SettlementTx:
    """The settlement tables, read and written through one storage transaction."""

    def __init__(self, tx: Tx) -> None:
        self._db: Session = tx.session

    async def insert_charge(
        self,
        tenant_id: str,
        assignment_id: str,
        entry_id: str | None,
        routable: bytes,
        now: datetime,
        postings: tuple[Posting, ...] | None = None,
        config_hash: str | None = None,
    ) -> None:
        """Record that `assignment_id` was settled by `entry_id` (or will be, with
        `postings`, when its hold is posted), and the hash of the routing
        configuration it was decided under (for its receipt)."""
        await self._db.execute(
            "INSERT INTO settlement_charges (tenant_id, assignment_id, entry_id, postings,"
            " routable, created_at, config_hash) VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (
                tenant_id,
                assignment_id,
                entry_id,
                None if postings is None else msgspec.json.encode(postings).decode(),
                routable.decode(),
                self._db.to_timestamp(now),
                config_hash,
            ),
        )

    async def set_charge_entry(self, tenant_id: str, assignment_id: str, entry_id: str) -> None:
        """Record the entry that posted a held charge."""
        await self._db.execute(
            "UPDATE settlement_charges SET entry_id = %s"
            " WHERE tenant_id = %s AND assignment_id = %s",
            (entry_id, tenant_id, assignment_id),
        )

    async def get_charge(self, tenant_id: str, assignment_id: str) -> ChargeRecord | None:
        """The settlement of an assignment, or None when its pool was not settled."""
        row = await self._db.fetch_one(
            "SELECT assignment_id, entry_id, routable, created_at, postings, config_hash"
            " FROM settlement_charges"
            " WHERE tenant_id = %s AND assignment_id = %s",
            (tenant_id, assignment_id),
        )
        if row is None:
            return None
        raw = row[2]  # bytes on Postgres, text on SQLite
        routable = raw if isinstance(raw, bytes) else str(raw).encode()
        held = row[4]
        postings = (
            None
            if held is None
            else _postings.decode(held if isinstance(held, bytes) else str(held).encode())
        )
        return ChargeRecord(
            assignment_id=row[0],
            entry_id=row[1],
            postings=postings,
            routable=routable,
            created_at=self._db.from_timestamp(row[3]),
            config_hash=row[5],
        )

    async def insert_return(self, record: ReturnRecord) -> None:
        """Record an accepted return."""
        await self._db.execute(
            "INSERT INTO settlement_returns (tenant_id, id, assignment_id, pool, buyer, reason,"
            " amount, currency, entry_id, created_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (
                record.tenant_id,
                record.id,
                record.assignment_id,
                record.pool,
                record.buyer,
                record.reason,
                record.amount,
                record.currency,
                record.entry_id,
                self._db.to_timestamp(record.created_at),
            ),
        )

    async def get_return(self, tenant_id: str, return_id: str) -> ReturnRecord | None:
        """One return, or None."""
        row = await self._db.fetch_one(
            "SELECT id, assignment_id, pool, buyer, reason, amount, currency, entry_id,"
            " created_at FROM settlement_returns WHERE tenant_id = %s AND id = %s",
            (tenant_id, return_id),
        )
        if row is None:
            return None
        return ReturnRecord(
            tenant_id=tenant_id,
            id=row[0],
            assignment_id=row[1],
            pool=row[2],
            buyer=row[3],
            reason=row[4],
            amount=int(row[5]),
            currency=row[6],
            entry_id=row[7],
            created_at=self._db.from_timestamp(row[8]),
        )

    async def last_return_id(self, tenant_id: str, assignment_id: str) -> str | None:
        """The id of the assignment's latest return, or None when it has none."""
        row = await self._db.fetch_one(
            "SELECT id FROM settlement_returns WHERE tenant_id = %s AND assignment_id = %s"
            " ORDER BY created_at DESC, id DESC LIMIT 1",
            (tenant_id, assignment_id),
        )
        return None if row is None else str(row[0])

    async def buyer_stats(
        self, tenant_id: str, pool: str, buyer: str, since: datetime, *, excluding: str
    ) -> tuple[int, int]:
        """(assignments, returned assignments) of `buyer` in `pool` since `since`: an
        assignment returned in parts counts once, and assignment `excluding` (the
        one being returned now) not at all."""
        stamp = self._db.to_timestamp(since)
        assigned = await self._db.fetch_one(
            "SELECT COUNT(*) FROM routing_assignments"
            " WHERE tenant_id = %s AND pool = %s AND worker = %s AND created_at >= %s",
            (tenant_id, pool, buyer, stamp),
        )
        returned = await self._db.fetch_one(
            "SELECT COUNT(DISTINCT assignment_id) FROM settlement_returns"
            " WHERE tenant_id = %s AND pool = %s AND buyer = %s AND created_at >= %s"
            " AND assignment_id <> %s",
            (tenant_id, pool, buyer, stamp, excluding),
        )
        return (
            int(assigned[0]) if assigned is not None else 0,
            int(returned[0]) if returned is not None else 0,
        )


__all__ = ["ChargeRecord", "ReturnRecord", "SettlementTx"]
