"""SQL for the inbox's email outbox (migration 0890): one row per email, written in
the transaction that writes its notifications, then claimed, sent and settled by
the engine's email loop.

`EmailsTx(tx)` reads and writes `inbox_emails` through `tx.session`. A claim moves
a row's `next_at` a lease ahead and bumps `attempts` (only if the row is still
pending and due, so two claimers cannot both win); settling a row names the
attempt it claimed, so a claimer whose lease ran out cannot overwrite the row.
It decides nothing (who gets an email, when to retry): the engine does.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec

from ductor_server.storage.protocol import Row, Session, Tx

_COLS = (
    "tenant_id, id, subscriber_id, to_address, connection, subject, text_body,"
    " notification_id, workflow, run_id, step_ref, status, attempts, next_at, message_id,"
    " error, created_at, updated_at, sent_at"
)


class EmailStatus(enum.StrEnum):
    """Where an outbox email is: waiting (or between retries), sent, or given up."""

    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed"


class Email(msgspec.Struct, frozen=True, kw_only=True):
    """One outbox row: the email as it will be sent, and how far it got."""

    tenant_id: str
    id: str
    subscriber_id: str
    to_address: str
    connection: str
    subject: str
    text_body: str
    notification_id: str | None = None
    workflow: str | None = None
    run_id: str | None = None
    step_ref: str | None = None
    status: EmailStatus = EmailStatus.PENDING
    attempts: int = 0
    next_at: datetime
    message_id: str | None = None
    error: dict[str, Any] | None = None
    created_at: datetime
    updated_at: datetime
    sent_at: datetime | None = None


class EmailsTx:
    """The email outbox, read and written through one storage transaction."""

    def __init__(self, tx: Tx) -> None:
        self._db: Session = tx.session

    def _email(self, row: Row) -> Email:
        db = self._db
        return Email(
            tenant_id=row[0],
            id=row[1],
            subscriber_id=row[2],
            to_address=row[3],
            connection=row[4],
            subject=row[5],
            text_body=row[6],
            notification_id=row[7],
            workflow=row[8],
            run_id=row[9],
            step_ref=row[10],
            status=EmailStatus(row[11]),
            attempts=int(row[12]),
            next_at=db.from_timestamp(row[13]),
            message_id=row[14],
            error=db.from_json(row[15]),
            created_at=db.from_timestamp(row[16]),
            updated_at=db.from_timestamp(row[17]),
            sent_at=None if row[18] is None else db.from_timestamp(row[18]),
        )

    async def insert(self, emails: Sequence[Email]) -> list[str]:
        """Write new outbox rows; an id already taken is skipped (a repeated
        command). Return the ids written."""
        db = self._db
        written: list[str] = []
        for e in emails:
            count = await db.execute(
                f"INSERT INTO inbox_emails ({_COLS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s,"
                " %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                (
                    e.tenant_id,
                    e.id,
                    e.subscriber_id,
                    e.to_address,
                    e.connection,
                    e.subject,
                    e.text_body,
                    e.notification_id,
                    e.workflow,
                    e.run_id,
                    e.step_ref,
                    e.status.value,
                    e.attempts,
                    db.to_timestamp(e.next_at),
                    e.message_id,
                    db.to_json(e.error),
                    db.to_timestamp(e.created_at),
                    db.to_timestamp(e.updated_at),
                    None if e.sent_at is None else db.to_timestamp(e.sent_at),
                ),
            )
            if count > 0:
                written.append(e.id)
        return written

    async def get(self, tenant_id: str, email_id: str) -> Email | None:
        """The tenant's outbox row `email_id`, or None."""
        row = await self._db.fetch_one(
            f"SELECT {_COLS} FROM inbox_emails WHERE tenant_id = %s AND id = %s",
            (tenant_id, email_id),
        )
        return None if row is None else self._email(row)

    async def list_emails(
        self,
        tenant_id: str,
        *,
        run_id: str | None,
        subscriber_id: str | None,
        status: str | None,
        after: tuple[datetime, str] | None,
        limit: int,
    ) -> list[Email]:
        """The tenant's outbox rows, oldest first, after the cursor `after`."""
        db = self._db
        where = ["tenant_id = %s"]
        params: list[Any] = [tenant_id]
        for column, value in (
            ("run_id", run_id),
            ("subscriber_id", subscriber_id),
            ("status", status),
        ):
            if value is not None:
                where.append(f"{column} = %s")
                params.append(value)
        if after is not None:
            moment = db.to_timestamp(after[0])
            where.append("(created_at > %s OR (created_at = %s AND id > %s))")
            params.extend([moment, moment, after[1]])
        params.append(limit)
        rows = await db.fetch_all(
            f"SELECT {_COLS} FROM inbox_emails WHERE {' AND '.join(where)}"
            " ORDER BY created_at, id LIMIT %s",
            params,
        )
        return [self._email(row) for row in rows]

    async def due(self, now: datetime, *, limit: int) -> list[tuple[str, str]]:
        """(tenant, id) of pending rows due by `now`, every tenant's, oldest due first."""
        rows = await self._db.fetch_all(
            "SELECT tenant_id, id FROM inbox_emails WHERE status = 'pending' AND next_at <= %s"
            " ORDER BY next_at LIMIT %s",
            (self._db.to_timestamp(now), limit),
        )
        return [(row[0], row[1]) for row in rows]

    async def next_due_at(self) -> datetime | None:
        """When the next pending row is due, every tenant's; None if none is pending."""
        row = await self._db.fetch_one(
            "SELECT MIN(next_at) FROM inbox_emails WHERE status = 'pending'"
        )
        return None if row is None or row[0] is None else self._db.from_timestamp(row[0])

    async def claim(
        self, tenant_id: str, email_id: str, *, now: datetime, lease_until: datetime
    ) -> Email | None:
        """Take a due pending row for one send until `lease_until`; None if another
        claimer took it first (or it is no longer due)."""
        db = self._db
        count = await db.execute(
            "UPDATE inbox_emails SET attempts = attempts + 1, next_at = %s, updated_at = %s"
            " WHERE tenant_id = %s AND id = %s AND status = 'pending' AND next_at <= %s",
            (
                db.to_timestamp(lease_until),
                db.to_timestamp(now),
                tenant_id,
                email_id,
                db.to_timestamp(now),
            ),
        )
        if count == 0:
            return None
        return await self.get(tenant_id, email_id)

    async def settle(
        self,
        claimed: Email,
        *,
        status: EmailStatus,
        now: datetime,
        next_at: datetime | None = None,
        message_id: str | None = None,
        error: dict[str, Any] | None = None,
    ) -> bool:
        """Record the outcome of the claimed attempt: sent, failed, or pending again
        at `next_at`. False (nothing written) if the claim is no longer ours."""
        db = self._db
        count = await db.execute(
            "UPDATE inbox_emails SET status = %s, next_at = %s, message_id = %s, error = %s,"
            " updated_at = %s, sent_at = %s"
            " WHERE tenant_id = %s AND id = %s AND status = 'pending' AND attempts = %s",
            (
                status.value,
                db.to_timestamp(next_at or now),
                message_id,
                db.to_json(error),
                db.to_timestamp(now),
                db.to_timestamp(now) if status is EmailStatus.SENT else None,
                claimed.tenant_id,
                claimed.id,
                claimed.attempts,
            ),
        )
        return count > 0


__all__ = ["Email", "EmailStatus", "EmailsTx"]
