"""SQL for the ledger tables (migrations 0700-0799), over an open storage transaction.

`LedgerTx(tx)` reads and writes accounts, entries, postings and holds through
`tx.session` of either backend; it decides nothing (the rules are
`ductor_settlement.Ledger`'s). Balance is enforced twice: on Postgres a
deferred constraint trigger refuses, at commit, any entry whose postings do
not net to zero per currency; on SQLite, which has no deferred triggers, every
`LedgerTx` that writes an entry checks the entries it wrote in a before-commit
callback of the same transaction. Every statement takes the tenant.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

import msgspec

from ductor_server.storage.protocol import Row, Session, Tx
from ductor_settlement import (
    Account,
    AccountKind,
    Entry,
    Hold,
    HoldStatus,
    LedgerProblem,
    NormalBalance,
    Posting,
    Reference,
    ReferenceKind,
    format_micros,
    ledger_error,
)

_ACCOUNT_COLS = "code, currency, kind, normal_balance, floor, name, balance, created_at, updated_at"
_ENTRY_COLS = (
    "id, idempotency_key, description, reference_kind, reference_id, reverses, corrects, created_at"
)
_HOLD_COLS = (
    "id, debit_account, credit_account, amount, currency, description, status,"
    " posted_amount, created_at, expires_at, finalized_at, entry_id"
)


class AccountRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One row of `ledger_accounts`: the account and its signed balance (debits minus credits)."""

    account: Account
    balance: int
    created_at: datetime
    updated_at: datetime


class EntryPage(msgspec.Struct, frozen=True, kw_only=True):
    """A page of entries, newest first, and the cursor of the next page (None at the end)."""

    entries: list[Entry]
    next_cursor: str | None


class InvalidLedgerCursor(ValueError):
    """A cursor that is not one `list_entries` gave out."""


_cursor_decoder = msgspec.json.Decoder(tuple[str, str])


def _placeholders(count: int) -> str:
    return ", ".join(["%s"] * count)


class LedgerTx:
    """The ledger tables, read and written through one storage transaction.

    Create one per transaction; it remembers the entries it wrote so that, on
    SQLite, it can check before commit that each of them balances.
    """

    def __init__(self, tx: Tx) -> None:
        self._db: Session = tx.session
        self._written: list[tuple[str, str]] = []

    @property
    def backend(self) -> str:
        """The backend underneath ("sqlite" or "postgres")."""
        return self._db.backend

    # --- accounts ------------------------------------------------------------------

    async def insert_account(self, account: Account, *, now: datetime) -> bool:
        """Open `account` at zero; False (nothing written) if its code is taken."""
        count = await self._db.execute(
            "INSERT INTO ledger_accounts (tenant_id, code, currency, kind, normal_balance,"
            " floor, name, balance, created_at, updated_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, 0, %s, %s)"
            " ON CONFLICT (tenant_id, code) DO NOTHING",
            (
                account.tenant_id,
                account.code,
                account.currency,
                account.kind.value,
                account.normal_balance.value,
                account.floor,
                account.name,
                self._db.to_timestamp(now),
                self._db.to_timestamp(now),
            ),
        )
        return count > 0

    async def get_account(self, tenant_id: str, code: str) -> AccountRecord | None:
        """One account with its balance, or None."""
        row = await self._db.fetch_one(
            f"SELECT {_ACCOUNT_COLS} FROM ledger_accounts WHERE tenant_id = %s AND code = %s",
            (tenant_id, code),
        )
        return None if row is None else self._account(tenant_id, row)

    async def list_accounts(self, tenant_id: str) -> list[AccountRecord]:
        """Every account of the tenant, by code."""
        rows = await self._db.fetch_all(
            f"SELECT {_ACCOUNT_COLS} FROM ledger_accounts WHERE tenant_id = %s ORDER BY code",
            (tenant_id,),
        )
        return [self._account(tenant_id, row) for row in rows]

    async def get_accounts(self, tenant_id: str, codes: Iterable[str]) -> list[AccountRecord]:
        """The accounts among `codes` that exist, by code (not locked)."""
        wanted = sorted(set(codes))
        if not wanted:
            return []
        rows = await self._db.fetch_all(
            f"SELECT {_ACCOUNT_COLS} FROM ledger_accounts"
            f" WHERE tenant_id = %s AND code IN ({_placeholders(len(wanted))}) ORDER BY code",
            (tenant_id, *wanted),
        )
        return [self._account(tenant_id, row) for row in rows]

    async def lock_accounts(self, tenant_id: str, codes: Iterable[str]) -> list[AccountRecord]:
        """The accounts among `codes` that exist, locked until this transaction ends.

        On Postgres the rows are locked FOR UPDATE in code order, so two
        transactions touching the same accounts queue instead of deadlocking,
        and each sees the balances the one before it committed. On SQLite every
        write transaction already runs alone.
        """
        wanted = sorted(set(codes))
        if not wanted:
            return []
        lock = " FOR UPDATE" if self._db.backend == "postgres" else ""
        rows = await self._db.fetch_all(
            f"SELECT {_ACCOUNT_COLS} FROM ledger_accounts"
            f" WHERE tenant_id = %s AND code IN ({_placeholders(len(wanted))})"
            f" ORDER BY code{lock}",
            (tenant_id, *wanted),
        )
        return [self._account(tenant_id, row) for row in rows]

    async def lock_with_holds(
        self, tenant_id: str, codes: Iterable[str], now: datetime
    ) -> tuple[list[AccountRecord], list[Hold]]:
        """`lock_accounts`, and the holds live at `now` against those accounts.

        On Postgres one call of `ledger_lock_accounts` (migration 0700) locks the
        rows and then reads them with their holds, so it costs one round trip.
        """
        wanted = sorted(set(codes))
        if not wanted:
            return [], []
        if self._db.backend != "postgres":
            locked = await self.lock_accounts(tenant_id, wanted)
            live = await self.live_holds(tenant_id, [r.account.code for r in locked], now)
            return locked, live
        rows = await self._db.fetch_all(
            "SELECT * FROM ledger_lock_accounts(%s, %s, %s)",
            (tenant_id, wanted, self._db.to_timestamp(now)),
        )
        records = [self._account(tenant_id, row) for row in rows]
        holds: dict[str, Hold] = {}
        for row in rows:
            for item in self._db.from_json(row[9]) or ():
                hold = self._hold_from_json(tenant_id, item)
                holds.setdefault(hold.id, hold)
        ordered = sorted(holds.values(), key=lambda h: (h.created_at, h.id))
        return records, ordered

    async def write_entry(self, entry: Entry, now: datetime) -> bool:
        """Write `entry`, its postings and the balances they move, unless an entry with
        its idempotency key exists (then write nothing and return False).

        On Postgres it is one statement; the deferred triggers check balance at commit.
        """
        deltas: dict[str, int] = {}
        for posting in entry.postings:
            deltas[posting.account] = deltas.get(posting.account, 0) + posting.amount
        moved = [(code, delta) for code, delta in deltas.items() if delta]
        if self._db.backend != "postgres":
            if await self.entry_by_key(entry.tenant_id, entry.idempotency_key) is not None:
                return False
            await self.insert_entry(entry)
            await self.add_to_balances(entry.tenant_id, dict(moved), now)
            return True
        db = self._db
        postings = ", ".join(
            ["(%s::text, %s::text, %s::int, %s::text, %s::text, %s::bigint)"] * len(entry.postings)
        )
        params: list[object] = [
            entry.tenant_id,
            entry.id,
            entry.idempotency_key,
            entry.description,
            entry.reference.kind.value,
            entry.reference.id,
            entry.reverses,
            entry.corrects,
            db.to_timestamp(entry.posted_at),
        ]
        for seq, p in enumerate(entry.postings):
            params += [entry.tenant_id, entry.id, seq, p.account, p.currency, p.amount]
        sql = (
            "WITH e AS (INSERT INTO ledger_entries (tenant_id, id, idempotency_key, description,"
            " reference_kind, reference_id, reverses, corrects, created_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (tenant_id, idempotency_key) DO NOTHING RETURNING id),"
            " p AS (INSERT INTO ledger_postings (tenant_id, entry_id, seq, account, currency,"
            f" amount) SELECT * FROM (VALUES {postings}) AS v WHERE EXISTS (SELECT 1 FROM e))"
        )
        if moved:
            sql += (
                ", b AS (UPDATE ledger_accounts AS a SET balance = a.balance + v.delta,"
                " updated_at = %s FROM (VALUES "
                + ", ".join(["(%s::text, %s::bigint)"] * len(moved))
                + ") AS v (code, delta) WHERE a.tenant_id = %s AND a.code = v.code"
                " AND EXISTS (SELECT 1 FROM e))"
            )
            params.append(db.to_timestamp(now))
            for code, delta in moved:
                params += [code, delta]
            params.append(entry.tenant_id)
        row = await db.fetch_one(sql + " SELECT COUNT(*) FROM e", params)
        return row is not None and int(row[0]) == 1

    async def add_to_balances(
        self, tenant_id: str, deltas: Mapping[str, int], now: datetime
    ) -> None:
        """Add each signed delta (debits minus credits) to its account's balance."""
        stamp = self._db.to_timestamp(now)
        await self._db.executemany(
            "UPDATE ledger_accounts SET balance = balance + %s, updated_at = %s"
            " WHERE tenant_id = %s AND code = %s",
            [(delta, stamp, tenant_id, code) for code, delta in deltas.items() if delta],
        )

    async def posting_sums(self, tenant_id: str) -> dict[str, int]:
        """The signed sum of the postings of every account that has any (for audits)."""
        rows = await self._db.fetch_all(
            "SELECT account, SUM(amount) FROM ledger_postings WHERE tenant_id = %s"
            " GROUP BY account",
            (tenant_id,),
        )
        return {str(row[0]): int(row[1]) for row in rows}

    def _account(self, tenant_id: str, row: Row) -> AccountRecord:
        kind = AccountKind(row[2])
        normal = NormalBalance(row[3])
        account = Account(
            tenant_id=tenant_id,
            code=row[0],
            currency=row[1],
            kind=kind,
            # Stored resolved; an account whose side is its kind's own was opened without one.
            normal=None if normal is kind.normal_balance else normal,
            floor=None if row[4] is None else int(row[4]),
            name=row[5],
        )
        return AccountRecord(
            account=account,
            balance=int(row[6]),
            created_at=self._db.from_timestamp(row[7]),
            updated_at=self._db.from_timestamp(row[8]),
        )

    # --- entries -------------------------------------------------------------------

    async def insert_entry(self, entry: Entry) -> None:
        """Write `entry` and its postings (balances are `add_to_balances`' job).

        The entry must balance: Postgres checks it at commit, and on SQLite this
        transaction checks it before commit; either way an unbalanced entry
        rolls the whole transaction back.
        """
        db = self._db
        await db.execute(
            "INSERT INTO ledger_entries (tenant_id, id, idempotency_key, description,"
            " reference_kind, reference_id, reverses, corrects, created_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (
                entry.tenant_id,
                entry.id,
                entry.idempotency_key,
                entry.description,
                entry.reference.kind.value,
                entry.reference.id,
                entry.reverses,
                entry.corrects,
                db.to_timestamp(entry.posted_at),
            ),
        )
        await db.executemany(
            "INSERT INTO ledger_postings (tenant_id, entry_id, seq, account, currency, amount)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            [
                (entry.tenant_id, entry.id, seq, p.account, p.currency, p.amount)
                for seq, p in enumerate(entry.postings)
            ],
        )
        if db.backend != "postgres":
            if not self._written:
                db.before_commit(self._check_balanced)
            self._written.append((entry.tenant_id, entry.id))

    async def _check_balanced(self) -> None:
        """Refuse the commit if an entry written here does not net to zero per currency
        or has fewer than two postings (what Postgres' constraint triggers check)."""
        problems: list[LedgerProblem] = []
        for tenant_id, entry_id in self._written:
            rows = await self._db.fetch_all(
                "SELECT currency, SUM(amount), COUNT(*) FROM ledger_postings"
                " WHERE tenant_id = %s AND entry_id = %s GROUP BY currency ORDER BY currency",
                (tenant_id, entry_id),
            )
            if sum(int(row[2]) for row in rows) < 2:
                problems.append(
                    LedgerProblem(
                        code="ledger.invalid_entry",
                        message=f"entry {entry_id} has fewer than two postings",
                    )
                )
            for currency, net, _ in rows:
                if int(net) != 0:
                    problems.append(
                        LedgerProblem(
                            code="ledger.unbalanced",
                            message=f"entry {entry_id} does not balance in {currency}: debits "
                            f"minus credits = {format_micros(int(net), str(currency))}",
                            currency=str(currency),
                            amount=int(net),
                        )
                    )
        if problems:
            raise ledger_error(problems)

    async def get_entry(self, tenant_id: str, entry_id: str) -> Entry | None:
        """One entry with its postings, or None."""
        rows = await self._db.fetch_all(
            f"SELECT {_ENTRY_COLS} FROM ledger_entries WHERE tenant_id = %s AND id = %s",
            (tenant_id, entry_id),
        )
        found = await self._entries(tenant_id, rows)
        return found[0] if found else None

    async def entry_by_key(self, tenant_id: str, idempotency_key: str) -> Entry | None:
        """The entry recorded under `idempotency_key`, or None."""
        rows = await self._db.fetch_all(
            f"SELECT {_ENTRY_COLS} FROM ledger_entries"
            " WHERE tenant_id = %s AND idempotency_key = %s",
            (tenant_id, idempotency_key),
        )
        found = await self._entries(tenant_id, rows)
        return found[0] if found else None

    async def entries_by_keys(self, tenant_id: str, keys: Sequence[str]) -> list[Entry]:
        """The entries recorded under any of `keys` (one query)."""
        wanted = sorted(set(keys))
        if not wanted:
            return []
        rows = await self._db.fetch_all(
            f"SELECT {_ENTRY_COLS} FROM ledger_entries"
            f" WHERE tenant_id = %s AND idempotency_key IN ({_placeholders(len(wanted))})",
            (tenant_id, *wanted),
        )
        return await self._entries(tenant_id, rows)

    async def reversals_of(self, tenant_id: str, entry_id: str) -> list[Entry]:
        """The entries that reverse `entry_id`, oldest first."""
        rows = await self._db.fetch_all(
            f"SELECT {_ENTRY_COLS} FROM ledger_entries WHERE tenant_id = %s AND reverses = %s"
            " ORDER BY created_at, id",
            (tenant_id, entry_id),
        )
        return await self._entries(tenant_id, rows)

    async def list_entries(
        self,
        tenant_id: str,
        *,
        account: str | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> EntryPage:
        """A page of entries newest first, ordered by (created_at, id) descending;
        with `account`, only the entries that post to it.

        Raises:
            InvalidLedgerCursor: `cursor` is not one this method gave out.
        """
        where = ["tenant_id = %s"]
        params: list[object] = [tenant_id]
        if account is not None:
            where.append(
                "id IN (SELECT entry_id FROM ledger_postings WHERE tenant_id = %s AND account = %s)"
            )
            params += [tenant_id, account]
        if cursor is not None:
            at, entry_id = _decode_cursor(cursor)
            where.append("(created_at, id) < (%s, %s)")
            params += [self._db.to_timestamp(at), entry_id]
        rows = await self._db.fetch_all(
            f"SELECT {_ENTRY_COLS} FROM ledger_entries WHERE {' AND '.join(where)}"
            " ORDER BY created_at DESC, id DESC LIMIT %s",
            (*params, limit + 1),
        )
        more = len(rows) > limit
        entries = await self._entries(tenant_id, rows[:limit])
        next_cursor = _encode_cursor(entries[-1]) if more and entries else None
        return EntryPage(entries=entries, next_cursor=next_cursor)

    async def _entries(self, tenant_id: str, rows: Sequence[Row]) -> list[Entry]:
        if not rows:
            return []
        ids = [str(row[0]) for row in rows]
        posting_rows = await self._db.fetch_all(
            "SELECT entry_id, account, currency, amount FROM ledger_postings"
            f" WHERE tenant_id = %s AND entry_id IN ({_placeholders(len(ids))})"
            " ORDER BY entry_id, seq",
            (tenant_id, *ids),
        )
        postings: dict[str, list[Posting]] = {}
        for entry_id, account, currency, amount in posting_rows:
            postings.setdefault(entry_id, []).append(
                Posting(account=account, amount=int(amount), currency=currency)
            )
        return [
            Entry(
                tenant_id=tenant_id,
                id=row[0],
                idempotency_key=row[1],
                description=row[2],
                reference=Reference(kind=ReferenceKind(row[3]), id=row[4]),
                postings=tuple(postings.get(row[0], ())),
                reverses=row[5],
                corrects=row[6],
                posted_at=self._db.from_timestamp(row[7]),
            )
            for row in rows
        ]

    # --- holds -----------------------------------------------------------------------

    async def insert_hold(self, hold: Hold) -> bool:
        """Write a new hold; False (and nothing written) when its id is taken, by a
        hold committed meanwhile on other accounts, say."""
        db = self._db
        count = await db.execute(
            f"INSERT INTO ledger_holds (tenant_id, {_HOLD_COLS})"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (tenant_id, id) DO NOTHING",
            (
                hold.tenant_id,
                hold.id,
                hold.debit_account,
                hold.credit_account,
                hold.amount,
                hold.currency,
                hold.description,
                hold.status.value,
                hold.posted_amount,
                db.to_timestamp(hold.created_at),
                db.to_timestamp(hold.expires_at),
                None if hold.finalized_at is None else db.to_timestamp(hold.finalized_at),
                hold.entry_id,
            ),
        )
        return count == 1

    async def finish_hold(self, hold: Hold) -> bool:
        """Store a pending hold's final status; False if it was no longer pending."""
        db = self._db
        count = await db.execute(
            "UPDATE ledger_holds SET status = %s, posted_amount = %s, finalized_at = %s,"
            " entry_id = %s WHERE tenant_id = %s AND id = %s AND status = 'pending'",
            (
                hold.status.value,
                hold.posted_amount,
                None if hold.finalized_at is None else db.to_timestamp(hold.finalized_at),
                hold.entry_id,
                hold.tenant_id,
                hold.id,
            ),
        )
        return count > 0

    async def get_hold(self, tenant_id: str, hold_id: str, *, lock: bool = False) -> Hold | None:
        """One hold, or None; with `lock`, locked until this transaction ends (Postgres)."""
        suffix = " FOR UPDATE" if lock and self._db.backend == "postgres" else ""
        row = await self._db.fetch_one(
            f"SELECT {_HOLD_COLS} FROM ledger_holds WHERE tenant_id = %s AND id = %s{suffix}",
            (tenant_id, hold_id),
        )
        return None if row is None else self._hold(tenant_id, row)

    async def live_holds(
        self, tenant_id: str, codes: Iterable[str] | None, now: datetime
    ) -> list[Hold]:
        """Pending holds not expired at `now` that debit or credit one of `codes`
        (every account of the tenant when `codes` is None)."""
        sql = (
            f"SELECT {_HOLD_COLS} FROM ledger_holds"
            " WHERE tenant_id = %s AND status = 'pending' AND expires_at > %s"
        )
        params: list[object] = [tenant_id, self._db.to_timestamp(now)]
        if codes is not None:
            wanted = sorted(set(codes))
            if not wanted:
                return []
            marks = _placeholders(len(wanted))
            sql += f" AND (debit_account IN ({marks}) OR credit_account IN ({marks}))"
            params += [*wanted, *wanted]
        rows = await self._db.fetch_all(sql + " ORDER BY created_at, id", params)
        return [self._hold(tenant_id, row) for row in rows]

    async def list_holds(
        self, tenant_id: str, *, status: str | None = None, limit: int = 100
    ) -> list[Hold]:
        """The tenant's holds, newest first, optionally of one status."""
        sql = f"SELECT {_HOLD_COLS} FROM ledger_holds WHERE tenant_id = %s"
        params: list[object] = [tenant_id]
        if status is not None:
            sql += " AND status = %s"
            params.append(status)
        rows = await self._db.fetch_all(
            sql + " ORDER BY created_at DESC, id DESC LIMIT %s", (*params, limit)
        )
        return [self._hold(tenant_id, row) for row in rows]

    async def expire_holds(
        self, tenant_id: str, now: datetime, *, hold_id: str | None = None
    ) -> int:
        """Mark the tenant's pending holds whose expiry is at or before `now` expired
        (only `hold_id`, when given); returns how many."""
        sql = (
            "UPDATE ledger_holds SET status = 'expired', finalized_at = expires_at"
            " WHERE tenant_id = %s AND status = 'pending' AND expires_at <= %s"
        )
        params: list[object] = [tenant_id, self._db.to_timestamp(now)]
        if hold_id is not None:
            sql += " AND id = %s"
            params.append(hold_id)
        return await self._db.execute(sql, params)

    def _hold_from_json(self, tenant_id: str, item: Sequence[object]) -> Hold:
        # The JSON array has the columns of `_HOLD_COLS`; its times are ISO text.
        def moment(value: object) -> datetime | None:
            return None if value is None else datetime.fromisoformat(str(value))

        created, expires = moment(item[8]), moment(item[9])
        assert created is not None
        assert expires is not None
        return Hold(
            id=str(item[0]),
            tenant_id=tenant_id,
            debit_account=str(item[1]),
            credit_account=str(item[2]),
            amount=int(str(item[3])),
            currency=str(item[4]),
            description=str(item[5]),
            status=HoldStatus(str(item[6])),
            posted_amount=int(str(item[7])),
            created_at=created,
            expires_at=expires,
            finalized_at=moment(item[10]),
            entry_id=None if item[11] is None else str(item[11]),
        )

    def _hold(self, tenant_id: str, row: Row) -> Hold:
        db = self._db
        return Hold(
            id=row[0],
            tenant_id=tenant_id,
            debit_account=row[1],
            credit_account=row[2],
            amount=int(row[3]),
            currency=row[4],
            description=row[5],
            status=HoldStatus(row[6]),
            posted_amount=int(row[7]),
            created_at=db.from_timestamp(row[8]),
            expires_at=db.from_timestamp(row[9]),
            finalized_at=None if row[10] is None else db.from_timestamp(row[10]),
            entry_id=row[11],
        )


async def expire_due_holds(tx: Tx, now: datetime, limit: int) -> int:
    """Mark at most `limit` pending holds of any tenant whose expiry is at or before
    `now` expired (a housekeeping sweep); returns how many."""
    db = tx.session
    return await db.execute(
        "UPDATE ledger_holds SET status = 'expired', finalized_at = expires_at"
        " WHERE (tenant_id, id) IN (SELECT tenant_id, id FROM ledger_holds"
        " WHERE status = 'pending' AND expires_at <= %s LIMIT %s)",
        (db.to_timestamp(now), limit),
    )


def _encode_cursor(entry: Entry) -> str:
    raw = msgspec.json.encode([entry.posted_at.isoformat(), entry.id])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, entry_id = _cursor_decoder.decode(raw)
        moment = datetime.fromisoformat(at)
    except (ValueError, msgspec.DecodeError) as exc:
        raise InvalidLedgerCursor(f"cursor {cursor!r} is not valid") from exc
    if moment.tzinfo is None:
        raise InvalidLedgerCursor(f"cursor {cursor!r} is not valid")
    return moment, entry_id


__all__ = ["AccountRecord", "EntryPage", "InvalidLedgerCursor", "LedgerTx", "expire_due_holds"]
