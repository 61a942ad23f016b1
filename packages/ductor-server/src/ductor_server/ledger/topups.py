"""SQL for wallet top-ups (migration 0830), over an open storage transaction.

`TopUpTx(tx)` reads and writes `wallet_topups` rows through `tx.session`; it
decides nothing. Every statement but the processor lookup takes the tenant: a
webhook knows only the processor's payment id, which is unique across tenants.
"""

from __future__ import annotations

import enum
from datetime import datetime

import msgspec

from ductor_server.storage.protocol import Row, Session, Tx

_COLS = (
    "tenant_id, id, account, currency, amount, description, processor, payment_id,"
    " client_secret, status, credited_amount, entry_id, created_at, updated_at"
)


class TopUpStatus(enum.StrEnum):
    """Where a top-up is: waiting for its payment, credited to the wallet, or failed."""

    PENDING = "pending"
    CREDITED = "credited"
    FAILED = "failed"


class TopUp(msgspec.Struct, frozen=True, kw_only=True):
    """One top-up row; `amount` and `credited_amount` are ledger micros."""

    tenant_id: str
    id: str
    account: str
    currency: str
    amount: int
    description: str
    processor: str
    payment_id: str
    client_secret: str | None
    status: TopUpStatus
    credited_amount: int
    entry_id: str | None
    created_at: datetime
    updated_at: datetime


class TopUpTx:
    """The top-ups table, read and written through one storage transaction."""

    def __init__(self, tx: Tx) -> None:
        self._db: Session = tx.session

    async def insert(self, topup: TopUp) -> bool:
        """Write a new top-up; False (nothing written) if its id or payment is taken."""
        db = self._db
        count = await db.execute(
            f"INSERT INTO wallet_topups ({_COLS})"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT DO NOTHING",
            (
                topup.tenant_id,
                topup.id,
                topup.account,
                topup.currency,
                topup.amount,
                topup.description,
                topup.processor,
                topup.payment_id,
                topup.client_secret,
                topup.status.value,
                topup.credited_amount,
                topup.entry_id,
                db.to_timestamp(topup.created_at),
                db.to_timestamp(topup.updated_at),
            ),
        )
        return count > 0

    async def get(self, tenant_id: str, topup_id: str) -> TopUp | None:
        """One of the tenant's top-ups, or None."""
        row = await self._db.fetch_one(
            f"SELECT {_COLS} FROM wallet_topups WHERE tenant_id = %s AND id = %s",
            (tenant_id, topup_id),
        )
        return None if row is None else self._topup(row)

    async def by_payment(self, processor: str, payment_id: str) -> TopUp | None:
        """The top-up a processor's payment funds, or None."""
        row = await self._db.fetch_one(
            f"SELECT {_COLS} FROM wallet_topups WHERE processor = %s AND payment_id = %s",
            (processor, payment_id),
        )
        return None if row is None else self._topup(row)

    async def list(self, tenant_id: str, *, account: str | None, limit: int) -> list[TopUp]:
        """The tenant's top-ups, newest first, optionally of one wallet."""
        where = "tenant_id = %s" + (" AND account = %s" if account is not None else "")
        params: tuple[object, ...] = (tenant_id,) if account is None else (tenant_id, account)
        rows = await self._db.fetch_all(
            f"SELECT {_COLS} FROM wallet_topups WHERE {where}"
            " ORDER BY created_at DESC, id DESC LIMIT %s",
            (*params, limit),
        )
        return [self._topup(row) for row in rows]

    async def credit(
        self, tenant_id: str, topup_id: str, *, amount: int, entry_id: str, now: datetime
    ) -> None:
        """Mark the top-up credited by `entry_id` (from pending or failed: money that
        arrived after a failure still counts)."""
        await self._db.execute(
            "UPDATE wallet_topups SET status = 'credited', credited_amount = %s, entry_id = %s,"
            " updated_at = %s WHERE tenant_id = %s AND id = %s AND status <> 'credited'",
            (amount, entry_id, self._db.to_timestamp(now), tenant_id, topup_id),
        )

    async def fail(self, tenant_id: str, topup_id: str, *, now: datetime) -> None:
        """Mark a pending top-up failed (a credited one stays credited)."""
        await self._db.execute(
            "UPDATE wallet_topups SET status = 'failed', updated_at = %s"
            " WHERE tenant_id = %s AND id = %s AND status = 'pending'",
            (self._db.to_timestamp(now), tenant_id, topup_id),
        )

    def _topup(self, row: Row) -> TopUp:
        db = self._db
        return TopUp(
            tenant_id=row[0],
            id=row[1],
            account=row[2],
            currency=row[3],
            amount=int(row[4]),
            description=row[5],
            processor=row[6],
            payment_id=row[7],
            client_secret=row[8],
            status=TopUpStatus(row[9]),
            credited_amount=int(row[10]),
            entry_id=row[11],
            created_at=db.from_timestamp(row[12]),
            updated_at=db.from_timestamp(row[13]),
        )


__all__ = ["TopUp", "TopUpStatus", "TopUpTx"]
