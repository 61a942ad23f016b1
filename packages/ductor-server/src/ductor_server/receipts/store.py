"""SQL for the `receipts` table (migration 0810), over an open storage transaction.

`ReceiptsTx(tx)` writes and reads stored receipts through `tx.session` of
either backend; it signs nothing and decides nothing. Every statement takes
the tenant.
"""

from __future__ import annotations

import base64
from datetime import datetime

import msgspec

from ductor_server.storage.protocol import Row, Session, Tx
from ductor_settlement import Envelope, SubjectKind, decode_envelope, encode_envelope

_COLS = "id, subject_kind, subject_id, key_id, envelope, created_at"


class StoredReceipt(msgspec.Struct, frozen=True, kw_only=True):
    """One row of `receipts`: the signed envelope and what it is about."""

    tenant_id: str
    id: str
    subject_kind: SubjectKind
    subject_id: str
    key_id: str
    envelope: Envelope
    created_at: datetime


class ReceiptPage(msgspec.Struct, frozen=True, kw_only=True):
    """A page of receipts, newest first, and the cursor of the next page (None at the end)."""

    receipts: list[StoredReceipt]
    next_cursor: str | None


class InvalidReceiptCursor(ValueError):
    """A cursor that is not one `list` gave out."""


_cursor_decoder = msgspec.json.Decoder(tuple[str, str])


class ReceiptsTx:
    """The receipts table, read and written through one storage transaction."""

    def __init__(self, tx: Tx) -> None:
        self._db: Session = tx.session

    async def insert(self, receipt: StoredReceipt) -> bool:
        """Store `receipt`; False (nothing written) if its subject already has one."""
        db = self._db
        count = await db.execute(
            f"INSERT INTO receipts (tenant_id, {_COLS}) VALUES (%s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT DO NOTHING",
            (
                receipt.tenant_id,
                receipt.id,
                receipt.subject_kind.value,
                receipt.subject_id,
                receipt.key_id,
                encode_envelope(receipt.envelope).decode("utf-8"),
                db.to_timestamp(receipt.created_at),
            ),
        )
        return count > 0

    async def get(self, tenant_id: str, receipt_id: str) -> StoredReceipt | None:
        """One receipt by id, or None."""
        row = await self._db.fetch_one(
            f"SELECT {_COLS} FROM receipts WHERE tenant_id = %s AND id = %s",
            (tenant_id, receipt_id),
        )
        return None if row is None else self._receipt(tenant_id, row)

    async def for_subject(
        self, tenant_id: str, kind: SubjectKind, subject_id: str
    ) -> StoredReceipt | None:
        """The receipt of one assignment or run, or None."""
        row = await self._db.fetch_one(
            f"SELECT {_COLS} FROM receipts"
            " WHERE tenant_id = %s AND subject_kind = %s AND subject_id = %s",
            (tenant_id, kind.value, subject_id),
        )
        return None if row is None else self._receipt(tenant_id, row)

    async def list(
        self,
        tenant_id: str,
        *,
        kind: SubjectKind | None = None,
        subject_id: str | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> ReceiptPage:
        """A page of receipts newest first, by (created_at, id) descending; optionally
        only those of one subject kind, or of one subject.

        Raises:
            InvalidReceiptCursor: `cursor` is not one this method gave out.
        """
        where = ["tenant_id = %s"]
        params: list[object] = [tenant_id]
        if kind is not None:
            where.append("subject_kind = %s")
            params.append(kind.value)
        if subject_id is not None:
            where.append("subject_id = %s")
            params.append(subject_id)
        if cursor is not None:
            at, receipt_id = _decode_cursor(cursor)
            where.append("(created_at, id) < (%s, %s)")
            params += [self._db.to_timestamp(at), receipt_id]
        rows = await self._db.fetch_all(
            f"SELECT {_COLS} FROM receipts WHERE {' AND '.join(where)}"
            " ORDER BY created_at DESC, id DESC LIMIT %s",
            (*params, limit + 1),
        )
        receipts = [self._receipt(tenant_id, row) for row in rows[:limit]]
        more = len(rows) > limit
        return ReceiptPage(
            receipts=receipts,
            next_cursor=_encode_cursor(receipts[-1]) if more and receipts else None,
        )

    def _receipt(self, tenant_id: str, row: Row) -> StoredReceipt:
        return StoredReceipt(
            tenant_id=tenant_id,
            id=row[0],
            subject_kind=SubjectKind(row[1]),
            subject_id=row[2],
            key_id=row[3],
            envelope=decode_envelope(row[4]),
            created_at=self._db.from_timestamp(row[5]),
        )


def _encode_cursor(receipt: StoredReceipt) -> str:
    raw = msgspec.json.encode([receipt.created_at.isoformat(), receipt.id])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, receipt_id = _cursor_decoder.decode(raw)
        moment = datetime.fromisoformat(at)
    except (ValueError, msgspec.DecodeError) as exc:
        raise InvalidReceiptCursor(f"cursor {cursor!r} is not valid") from exc
    if moment.tzinfo is None:
        raise InvalidReceiptCursor(f"cursor {cursor!r} is not valid")
    return moment, receipt_id


__all__ = ["InvalidReceiptCursor", "ReceiptPage", "ReceiptsTx", "StoredReceipt"]
