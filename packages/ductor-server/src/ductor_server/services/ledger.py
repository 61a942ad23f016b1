"""The ledger: accounts, balanced entries and two-phase holds of each tenant.

Each operation loads what it touches into a `ductor_settlement.Ledger` book
(the accounts locked in code order, their balances, the live holds against
them, the entries a reversal or replay needs), lets the book apply the rules
(balance per currency, currencies, floors on available balance, idempotency,
reversals, hold transitions), and stores what changed in the same
transaction, with the call's idempotency key. It speaks in tenants, structs
and `DuctorError`s (the book's own `ledger.*` and `hold.*` errors, with every
problem at once); it never mentions a transport.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta

import msgspec

from ductor_server.engine.clock import Clock, SystemClock
from ductor_server.errors import RequestInvalid, ServerError
from ductor_server.extensions.hooks import ENTRY_POSTED, HookDispatcher, to_data
from ductor_server.ledger.errors import LedgerObjectNotFound
from ductor_server.ledger.store import AccountRecord, InvalidLedgerCursor, LedgerTx
from ductor_server.services.idempotency import Answer, Claim, Outcome, once
from ductor_server.services.settlement import ASSIGNMENT_HOLD_PREFIX, assignment_of_hold
from ductor_server.storage.protocol import Store, Tx
from ductor_settlement import (
    Account,
    AccountKind,
    Entry,
    EntryDraft,
    Hold,
    HoldAlreadyFinal,
    HoldConflict,
    HoldInvalid,
    HoldNotFound,
    HoldStatus,
    InvalidTime,
    Ledger,
    LedgerError,
    LedgerSnapshot,
    NormalBalance,
    Posting,
    Reference,
    ReferenceKind,
    ledger_error,
    new_hold,
)

MAX_PAGE = 500
"""The most entries or holds one page lists."""

MAX_BATCH = 1000
"""The most entries one `POST /v1/ledger/entries/batch` may post."""

MAX_HOLD_SECONDS = 366 * 24 * 3600
"""The longest a hold may reserve funds (a year and a day)."""

# Keys the server gives the entries it writes itself (`hold:<id>:post`, a wallet
# top-up's `topup:<id>`, an assignment's charge `assign:<id>`, a return's credit
# `return:<id>`); a caller's key may not take them, or it would stand in for them.
_RESERVED_KEY_PREFIXES = ("hold:", "topup:", "assign:", "return:")


def _refuse_reserved_key(idempotency_key: str | None) -> None:
    """Raise `RequestInvalid` when a caller's key starts with one of the ledger's prefixes."""
    if idempotency_key is None:
        return
    for prefix in _RESERVED_KEY_PREFIXES:
        if idempotency_key.startswith(prefix):
            raise RequestInvalid(
                f"idempotency keys starting with {prefix!r} are the ledger's own",
                details={"key": idempotency_key},
            )


# --- bodies and views ---------------------------------------------------------------


class AccountBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/accounts`: open an account.

    Attributes:
        code: unique within the tenant, e.g. ``"wallet:buyer-42"``.
        currency: every posting to it is in this currency ("USD", "CREDITS").
        kind: asset, liability, equity, revenue or expense.
        normal: the side its balance grows on, when not its kind's usual one.
        floor: the lowest available balance allowed, in micros (0: never below
            zero; -N: a credit line of N); absent for no floor.
        name: a label for people.
    """

    code: str
    currency: str
    kind: AccountKind
    normal: NormalBalance | None = None
    floor: int | None = None
    name: str = ""


class AccountView(msgspec.Struct, frozen=True, kw_only=True):
    """An account with its balances, all in micros and in its normal direction.

    `balance` is what is posted; `pending` what live holds reserve against it;
    `available` is `balance - pending`, the amount the floor applies to.
    """

    code: str
    currency: str
    kind: AccountKind
    normal_balance: NormalBalance
    floor: int | None = None
    name: str = ""
    balance: int
    pending: int
    available: int
    created_at: datetime
    updated_at: datetime


class EntryBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/ledger/entries`: two or more postings that net to zero per currency.

    Attributes:
        postings: each ``{"account", "amount", "currency"}``; a positive amount
            debits the account, a negative one credits it.
        description: a sentence for people.
        reference: what the entry is about (default: an adjustment).
        reverses: the id of an entry this one takes back, in full or in part.
        corrects: the id of an entry this one adjusts.
    """

    postings: tuple[Posting, ...]
    description: str = ""
    reference: Reference | None = None
    reverses: str | None = None
    corrects: str | None = None


class BatchEntryBody(EntryBody, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One entry of a batch: an `EntryBody` with its own idempotency `key`.

    Attributes:
        key: the entry's idempotency key; without one it is the batch's
            Idempotency-Key and the entry's index (``<key>#3``), or random.
    """

    key: str | None = None


class EntryBatchBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/ledger/entries/batch`: entries posted together, all or none."""

    entries: tuple[BatchEntryBody, ...]


class EntryView(msgspec.Struct, frozen=True, kw_only=True):
    """A recorded entry; it never changes."""

    id: str
    idempotency_key: str
    description: str
    reference: Reference
    postings: tuple[Posting, ...]
    reverses: str | None = None
    corrects: str | None = None
    created_at: datetime


class EntryPageView(msgspec.Struct, frozen=True, kw_only=True):
    """One page of entries, newest first; pass `next_cursor` back for the next page."""

    items: list[EntryView]
    next_cursor: str | None = None


class EntryBatchView(msgspec.Struct, frozen=True, kw_only=True):
    """The entries of a batch, in its order; `replayed` of them were recorded before
    under their keys (and posted nothing now)."""

    entries: tuple[EntryView, ...]
    created: int
    replayed: int


class HoldBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/holds`: reserve `amount` to move from `debit_account` to `credit_account`.

    Attributes:
        debit_account: debited when the hold is posted (e.g. a buyer wallet).
        credit_account: credited when the hold is posted.
        amount: micros to reserve, > 0.
        currency: the currency of both accounts.
        expires_at: when the hold voids by itself; or give `timeout_seconds`.
        timeout_seconds: how long from now the hold lives; or give `expires_at`.
        id: the hold's id (default: derived from the Idempotency-Key, else random).
        description: what the reservation is for.
    """

    debit_account: str
    credit_account: str
    amount: int
    currency: str
    expires_at: datetime | None = None
    timeout_seconds: int | None = None
    id: str | None = None
    description: str = ""


class HoldPostBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/holds/{id}/post`: how much to move (all of it when absent)."""

    amount: int | None = None


class HoldView(msgspec.Struct, frozen=True, kw_only=True):
    """A hold and where it is in its life (a pending hold past its expiry shows `expired`)."""

    id: str
    debit_account: str
    credit_account: str
    amount: int
    currency: str
    description: str = ""
    status: HoldStatus
    posted_amount: int = 0
    created_at: datetime
    expires_at: datetime
    finalized_at: datetime | None = None
    entry_id: str | None = None


class HoldPosted(msgspec.Struct, frozen=True, kw_only=True):
    """A posted hold and the entry its post wrote."""

    hold: HoldView
    entry: EntryView


def entry_view(entry: Entry) -> EntryView:
    """The view of a recorded entry."""
    return EntryView(
        id=entry.id,
        idempotency_key=entry.idempotency_key,
        description=entry.description,
        reference=entry.reference,
        postings=entry.postings,
        reverses=entry.reverses,
        corrects=entry.corrects,
        created_at=entry.posted_at,
    )


def hold_view(hold: Hold) -> HoldView:
    """The view of a stored hold."""
    return HoldView(
        id=hold.id,
        debit_account=hold.debit_account,
        credit_account=hold.credit_account,
        amount=hold.amount,
        currency=hold.currency,
        description=hold.description,
        status=hold.status,
        posted_amount=hold.posted_amount,
        created_at=hold.created_at,
        expires_at=hold.expires_at,
        finalized_at=hold.finalized_at,
        entry_id=hold.entry_id,
    )


def _account_views(
    tenant_id: str, records: Sequence[AccountRecord], holds: Sequence[Hold], now: datetime
) -> list[AccountView]:
    book = _book(tenant_id, records, holds)
    return [
        AccountView(
            code=record.account.code,
            currency=record.account.currency,
            kind=record.account.kind,
            normal_balance=record.account.normal_balance,
            floor=record.account.floor,
            name=record.account.name,
            balance=book.balance(record.account.code),
            pending=book.pending(record.account.code, at=now),
            available=book.available(record.account.code, at=now),
            created_at=record.created_at,
            updated_at=record.updated_at,
        )
        for record in records
    ]


def _book(
    tenant_id: str,
    records: Iterable[AccountRecord],
    holds: Iterable[Hold] = (),
    entries: Iterable[Entry] = (),
) -> Ledger:
    records = list(records)
    return Ledger.from_snapshot(
        LedgerSnapshot(
            tenant_id=tenant_id,
            accounts=tuple(r.account for r in records),
            balances={r.account.code: r.balance for r in records},
            holds=tuple(holds),
            entries=tuple(entries),
        )
    )


def _hold_id(tenant_id: str, key: str | None) -> str:
    if key is None:
        return "hold_" + uuid.uuid4().hex
    # Derived from the key, so a retry without the first answer names the same hold.
    return "hold_" + hashlib.sha256(f"{tenant_id}\x1f{key}".encode()).hexdigest()[:32]


def _check_limit(limit: int) -> None:
    if isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE:
        raise RequestInvalid(f"limit must be between 1 and {MAX_PAGE}", details={"limit": limit})


# --- the service ----------------------------------------------------------------------


def tell_entry_posted(hooks: HookDispatcher, tx: Tx, entry: Entry, now: datetime) -> None:
    """Give the hooks `ledger.entry_posted` (the entry's view) once `tx` commits."""
    hooks.after_commit(
        tx, ENTRY_POSTED, at=now, tenant_id=entry.tenant_id, data=to_data(entry_view(entry))
    )


class LedgerService:
    """Accounts, entries and holds of every tenant, checked by `ductor_settlement.Ledger`.

    Args:
        store: the opened store.
        clock: the time source.
        hooks: told of each entry posted, after its commit (none if None).
    """

    def __init__(
        self, store: Store, *, clock: Clock | None = None, hooks: HookDispatcher | None = None
    ) -> None:
        self._store = store
        self._clock = clock or SystemClock()
        self._hooks = hooks if hooks is not None else HookDispatcher()

    # --- accounts ------------------------------------------------------------------

    async def open_account(
        self, tenant_id: str, body: AccountBody, *, idempotency_key: str | None = None
    ) -> Answer[AccountView]:
        """Open an account at zero: `CREATED`; opening the same account again is `OK`.

        Raises:
            InvalidAccount: a bad code, currency or floor (every problem).
            AccountConflict: the code is open with other attributes.
            IdempotencyConflict: the key was used with another body.
        """
        now = self._clock.now()
        # An explicit side equal to the kind's own is the same account as none.
        normal = None if body.normal is body.kind.normal_balance else body.normal
        account = Account(
            tenant_id=tenant_id,
            code=body.code,
            currency=body.currency,
            kind=body.kind,
            normal=normal,
            floor=body.floor,
            name=body.name,
        )
        claim = Claim.of(tenant_id, "ledger.accounts.open", idempotency_key, body, now=now)

        async def effect(tx: Tx) -> Answer[AccountView]:
            store = LedgerTx(tx)
            record = await store.get_account(tenant_id, account.code)
            created = False
            if record is None:
                Ledger(tenant_id).open_account(account)  # every problem of the account
                created = await store.insert_account(account, now=now)
                # Not created: a concurrent call opened the code first; compare with it.
                record = await store.get_account(tenant_id, account.code)
                assert record is not None
            if not created:
                _book(tenant_id, [record]).open_account(account)  # other attributes: conflict
            holds = await store.live_holds(tenant_id, [account.code], now)
            [view] = _account_views(tenant_id, [record], holds, now)
            return Answer(view, Outcome.CREATED if created else Outcome.OK)

        return await once(self._store, claim, AccountView, effect)

    async def get_account(self, tenant_id: str, code: str) -> AccountView:
        """One account with its balance, pending and available amounts.

        Raises:
            LedgerObjectNotFound: `account.not_found`.
        """
        now = self._clock.now()
        async with self._store.transaction() as tx:
            store = LedgerTx(tx)
            record = await store.get_account(tenant_id, code)
            if record is None:
                raise LedgerObjectNotFound("account", code)
            holds = await store.live_holds(tenant_id, [code], now)
        [view] = _account_views(tenant_id, [record], holds, now)
        return view

    async def list_accounts(self, tenant_id: str) -> list[AccountView]:
        """Every account of the tenant, by code, with balances."""
        now = self._clock.now()
        async with self._store.transaction() as tx:
            store = LedgerTx(tx)
            records = await store.list_accounts(tenant_id)
            holds = await store.live_holds(tenant_id, None, now) if records else []
        return _account_views(tenant_id, records, holds, now)

    # --- entries -----------------------------------------------------------------------

    async def post_entry(
        self, tenant_id: str, body: EntryBody, *, idempotency_key: str | None = None
    ) -> Answer[EntryView]:
        """Record a balanced entry: `CREATED`.

        The Idempotency-Key is the entry's key: the same key and body answers
        the recorded entry again and posts nothing.

        Raises:
            LedgerError: the subclass of the first problem (``ledger.unbalanced``,
                ``ledger.floor_crossed``, ``ledger.unknown_account`` ...), with
                every problem in its details; nothing is written.
            IdempotencyConflict: the key was used with another body.
        """
        _refuse_reserved_key(idempotency_key)
        return await self.record_entry(tenant_id, body, idempotency_key=idempotency_key)

    async def record_entry(
        self, tenant_id: str, body: EntryBody, *, idempotency_key: str | None = None
    ) -> Answer[EntryView]:
        """`post_entry` for the server's own entries, whose keys may be reserved ones
        (a wallet top-up's `topup:<id>`); callers' requests go through `post_entry`."""
        now = self._clock.now()
        claim = Claim.of(tenant_id, "ledger.entries.post", idempotency_key, body, now=now)
        key = claim.key if claim is not None else "auto:" + uuid.uuid4().hex
        draft = EntryDraft(
            tenant_id=tenant_id,
            idempotency_key=key,
            description=body.description,
            reference=body.reference or Reference(kind=ReferenceKind.ADJUSTMENT, id=""),
            postings=body.postings,
            reverses=body.reverses,
            corrects=body.corrects,
        )

        async def effect(tx: Tx) -> Answer[EntryView]:
            store = LedgerTx(tx)
            codes = [p.account for p in body.postings]
            records, holds = await store.lock_with_holds(tenant_id, codes, now)
            # The earlier reversals are read once the accounts are locked: a
            # reversal of the same entry posts to them, so one that committed
            # meanwhile is seen and the two never take back more than it moved.
            linked: list[Entry] = []
            for target in (body.reverses, body.corrects):
                found = None if target is None else await store.get_entry(tenant_id, target)
                if found is not None:
                    linked.append(found)
                    if target == body.reverses:
                        linked += await store.reversals_of(tenant_id, found.id)
            book = _book(tenant_id, records, holds, _unique(linked))
            try:
                entry = book.post(draft, at=now)
            except LedgerError:
                # A replay whose claim has been forgotten answers from the entry itself,
                # even where the book would refuse it as new (its funds are spent).
                if claim is None:
                    raise  # a fresh random key: nothing to replay
                replayed = await self._replay(store, tenant_id, key, draft, records, holds)
                if replayed is None:
                    raise
                return replayed
            if await store.write_entry(entry, now):
                tell_entry_posted(self._hooks, tx, entry, now)
                return Answer(entry_view(entry), Outcome.CREATED)
            replayed = await self._replay(store, tenant_id, key, draft, records, holds)
            assert replayed is not None  # write_entry found the key taken
            return replayed

        return await once(self._store, claim, EntryView, effect)

    @staticmethod
    async def _replay(
        store: LedgerTx,
        tenant_id: str,
        key: str,
        draft: EntryDraft,
        records: Sequence[AccountRecord],
        holds: Sequence[Hold],
    ) -> Answer[EntryView] | None:
        """The recorded entry under `key` if `draft` repeats it; None if there is none.

        Raises:
            IdempotencyConflict: (``ledger.idempotency_conflict``) the key holds
                an entry with other content.
        """
        recorded = await store.entry_by_key(tenant_id, key)
        if recorded is None:
            return None
        entry = _book(tenant_id, records, holds, [recorded]).post(draft, at=recorded.posted_at)
        return Answer(entry_view(entry), Outcome.OK)

    async def post_entries(
        self, tenant_id: str, body: EntryBatchBody, *, idempotency_key: str | None = None
    ) -> Answer[EntryBatchView]:
        """Record up to `MAX_BATCH` entries in one transaction, all or none: `CREATED`.

        The entries are checked in order against the balances the ones before
        them leave, so floors hold across the batch. An entry whose key was
        recorded before with the same content is a replay (counted in
        `replayed`, posted nothing); with other content the batch is refused.

        Raises:
            RequestInvalid: no entries, too many, a reserved or repeated key.
            LedgerError: the class of the first problem of any entry; every problem
                is in details, each with the `pointer` of its entry (``/entries/3``).
            IdempotencyConflict: the batch's key was used with another body.
        """
        _refuse_reserved_key(idempotency_key)  # its entries' keys are `<key>#<index>`
        count = len(body.entries)
        if not 1 <= count <= MAX_BATCH:
            raise RequestInvalid(
                f"a batch holds 1 to {MAX_BATCH} entries, not {count}",
                details={"pointer": "/entries", "count": count},
            )
        now = self._clock.now()
        claim = Claim.of(tenant_id, "ledger.entries.batch", idempotency_key, body, now=now)
        drafts: list[EntryDraft] = []
        seen: set[str] = set()
        for index, item in enumerate(body.entries):
            if item.key is not None:
                key = item.key
                if not key or len(key) > 255 or key.startswith(_RESERVED_KEY_PREFIXES):
                    raise RequestInvalid(
                        "an entry key is 1 to 255 characters and does not start with"
                        f" {' or '.join(map(repr, _RESERVED_KEY_PREFIXES))}",
                        details={"pointer": f"/entries/{index}/key"},
                    )
            elif claim is not None:
                key = f"{claim.key}#{index}"
            else:
                key = "auto:" + uuid.uuid4().hex
            if key in seen:
                raise RequestInvalid(
                    f"the key {key!r} is used twice in the batch",
                    details={"pointer": f"/entries/{index}/key"},
                )
            seen.add(key)
            drafts.append(
                EntryDraft(
                    tenant_id=tenant_id,
                    idempotency_key=key,
                    description=item.description,
                    reference=item.reference or Reference(kind=ReferenceKind.ADJUSTMENT, id=""),
                    postings=item.postings,
                    reverses=item.reverses,
                    corrects=item.corrects,
                )
            )

        async def effect(tx: Tx) -> Answer[EntryBatchView]:
            store = LedgerTx(tx)
            codes = [p.account for d in drafts for p in d.postings]
            records, holds = await store.lock_with_holds(tenant_id, codes, now)
            # Read after the accounts are locked: a batch or a reversal on the same
            # accounts that committed meanwhile is seen.
            linked: list[Entry] = []
            for target in sorted({t for d in drafts for t in (d.reverses, d.corrects) if t}):
                found = await store.get_entry(tenant_id, target)
                if found is not None:
                    linked += [found, *await store.reversals_of(tenant_id, found.id)]
            recorded = await store.entries_by_keys(tenant_id, [d.idempotency_key for d in drafts])
            book = _book(tenant_id, records, holds, _unique([*linked, *recorded]))
            posted: list[Entry] = []
            problems: list[tuple[int, LedgerError]] = []
            for index, draft in enumerate(drafts):
                try:
                    posted.append(book.post(draft, at=now))
                except LedgerError as error:
                    problems.append((index, error))
            if problems:
                raise _batch_error(problems)
            old = {e.idempotency_key for e in recorded}
            created = 0
            for entry in posted:
                if entry.idempotency_key in old:
                    continue
                if not await store.write_entry(entry, now):
                    raise ServerError(
                        f"another call recorded the key {entry.idempotency_key!r} meanwhile;"
                        " send the batch again",
                        code="ledger.batch_conflict",
                        retryable=True,
                    )
                tell_entry_posted(self._hooks, tx, entry, now)
                created += 1
            view = EntryBatchView(
                entries=tuple(entry_view(e) for e in posted),
                created=created,
                replayed=len(posted) - created,
            )
            return Answer(view, Outcome.CREATED)

        return await once(self._store, claim, EntryBatchView, effect)

    async def get_entry(self, tenant_id: str, entry_id: str) -> EntryView:
        """One entry with its postings.

        Raises:
            LedgerObjectNotFound: `entry.not_found`.
        """
        async with self._store.transaction() as tx:
            entry = await LedgerTx(tx).get_entry(tenant_id, entry_id)
        if entry is None:
            raise LedgerObjectNotFound("entry", entry_id)
        return entry_view(entry)

    async def list_entries(
        self,
        tenant_id: str,
        *,
        account: str | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> EntryPageView:
        """Entries newest first, optionally only those posting to `account`.

        Raises:
            RequestInvalid: a bad cursor or limit.
        """
        _check_limit(limit)
        try:
            async with self._store.transaction() as tx:
                page = await LedgerTx(tx).list_entries(
                    tenant_id, account=account or None, cursor=cursor or None, limit=limit
                )
        except InvalidLedgerCursor as exc:
            raise RequestInvalid(str(exc), details={"cursor": cursor}) from exc
        return EntryPageView(
            items=[entry_view(e) for e in page.entries], next_cursor=page.next_cursor
        )

    # --- holds -------------------------------------------------------------------------

    async def place_hold(
        self, tenant_id: str, body: HoldBody, *, idempotency_key: str | None = None
    ) -> Answer[HoldView]:
        """Reserve funds: `CREATED`; placing the same hold (id and content) again is `OK`.

        A retry with `timeout_seconds` asks for the expiry that many seconds after
        the hold was first placed, so it is the same hold when that is its expiry.

        Raises:
            HoldInvalid: a bad amount, currency, account pair or expiry; neither or
                both of `expires_at` and `timeout_seconds`, or one out of range.
            InvalidTime: `settlement.naive_time`, an `expires_at` without a time zone.
            HoldConflict: the id is taken by another hold.
            LedgerError: an unknown account, a currency mismatch, or
                ``ledger.floor_crossed`` (not enough available funds).
            IdempotencyConflict: the key was used with another body.
        """
        now = self._clock.now()
        claim = Claim.of(tenant_id, "ledger.holds.place", idempotency_key, body, now=now)
        hold_id = body.id if body.id is not None else _hold_id(tenant_id, idempotency_key)
        if assignment_of_hold(hold_id) is not None:
            reason = f"hold ids starting with {ASSIGNMENT_HOLD_PREFIX!r} are the ledger's own"
            raise HoldInvalid(
                f"hold {hold_id[:256]!r} is invalid: {reason}",
                details={"hold": hold_id[:256], "reasons": [reason]},
            )
        expires_at = _expiry(body, hold_id, now)
        hold = new_hold(
            id=hold_id,
            tenant_id=tenant_id,
            debit_account=body.debit_account,
            credit_account=body.credit_account,
            amount=body.amount,
            currency=body.currency,
            now=now,
            expires_at=expires_at,
            description=body.description,
        )

        async def effect(tx: Tx) -> Answer[HoldView]:
            store = LedgerTx(tx)
            records, holds = await store.lock_with_holds(
                tenant_id, (hold.debit_account, hold.credit_account), now
            )
            existing = await store.get_hold(tenant_id, hold.id)
            if existing is not None and all(h.id != existing.id for h in holds):
                holds.append(existing)
            book = _book(tenant_id, records, holds)
            asked = hold
            if existing is not None and body.timeout_seconds is not None:
                # A timeout counts from when the hold was first placed, so a retry of
                # the same request names the same expiry however late it comes.
                expires_at = existing.created_at + timedelta(seconds=body.timeout_seconds)
                asked = msgspec.structs.replace(hold, expires_at=expires_at)
            placed = book.place_hold(asked)
            if existing is not None:
                return Answer(hold_view(existing), Outcome.OK)
            if await store.insert_hold(placed):
                return Answer(hold_view(placed), Outcome.CREATED)
            # Placed meanwhile by a call that locked other accounts: the same hold
            # answers it again, another is a conflict.
            existing = await store.get_hold(tenant_id, hold.id)
            assert existing is not None  # the insert found the id taken
            if body.timeout_seconds is not None:
                expires_at = existing.created_at + timedelta(seconds=body.timeout_seconds)
                asked = msgspec.structs.replace(hold, expires_at=expires_at)
            _book(tenant_id, records, [*holds, existing]).place_hold(asked)
            return Answer(hold_view(existing), Outcome.OK)

        return await once(self._store, claim, HoldView, effect)

    async def get_hold(self, tenant_id: str, hold_id: str) -> HoldView:
        """One hold; a pending hold whose expiry has passed is marked expired first.

        Raises:
            HoldNotFound: `hold.not_found`.
        """
        now = self._clock.now()
        async with self._store.transaction() as tx:
            store = LedgerTx(tx)
            await store.expire_holds(tenant_id, now, hold_id=hold_id)
            hold = await store.get_hold(tenant_id, hold_id)
        if hold is None:
            raise _hold_not_found(hold_id)
        return hold_view(hold)

    async def list_holds(
        self, tenant_id: str, *, status: str | None = None, limit: int = 50
    ) -> list[HoldView]:
        """The tenant's holds newest first, optionally of one status (expired ones marked);
        an empty status is none, as an empty filter is on every list.

        Raises:
            RequestInvalid: an unknown status or a bad limit.
        """
        _check_limit(limit)
        status = status or None
        if status is not None and status not in {s.value for s in HoldStatus}:
            raise RequestInvalid(
                f"unknown hold status {status!r}",
                details={"allowed": [s.value for s in HoldStatus]},
            )
        now = self._clock.now()
        async with self._store.transaction() as tx:
            store = LedgerTx(tx)
            await store.expire_holds(tenant_id, now)
            holds = await store.list_holds(tenant_id, status=status, limit=limit)
        return [hold_view(h) for h in holds]

    async def post_hold(
        self,
        tenant_id: str,
        hold_id: str,
        amount: int | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> Answer[HoldPosted]:
        """Post a pending hold for `amount` (all of it when None) and write its entry;
        the rest is released. `OK`.

        Raises:
            HoldNotFound, HoldExpired, HoldAlreadyFinal, HoldInvalid, HoldAmountExceeded
            LedgerError: the entry does not fit the book any more (a floor).
            IdempotencyConflict: the key was used with another amount.
        """
        now = self._clock.now()
        await self._expire(tenant_id, hold_id, now)
        claim = Claim.of(
            tenant_id, "ledger.holds.post", idempotency_key, [amount], now=now, target=hold_id
        )

        async def effect(tx: Tx) -> Answer[HoldPosted]:
            store = LedgerTx(tx)
            hold = await store.get_hold(tenant_id, hold_id, lock=True)
            if hold is None:
                raise _hold_not_found(hold_id)
            _refuse_assignment_hold(hold, "post")
            records, live = await store.lock_with_holds(
                tenant_id, (hold.debit_account, hold.credit_account), now
            )
            holds = [h for h in live if h.id != hold.id]
            book = _book(tenant_id, records, [*holds, hold])
            final, entry = book.post_hold(hold.id, at=now, amount=amount)
            if not await store.write_entry(entry, now):
                raise HoldAlreadyFinal(
                    f"hold {hold.id!r} was already posted", details={"hold": hold.id}
                )
            tell_entry_posted(self._hooks, tx, entry, now)
            await store.finish_hold(final)
            return Answer(HoldPosted(hold=hold_view(final), entry=entry_view(entry)))

        return await once(self._store, claim, HoldPosted, effect)

    async def void_hold(
        self, tenant_id: str, hold_id: str, *, idempotency_key: str | None = None
    ) -> Answer[HoldView]:
        """Void a pending hold: nothing moves and the reservation is released. `OK`.

        Raises:
            HoldNotFound, HoldExpired, HoldAlreadyFinal
        """
        now = self._clock.now()
        await self._expire(tenant_id, hold_id, now)
        claim = Claim.of(
            tenant_id, "ledger.holds.void", idempotency_key, [], now=now, target=hold_id
        )

        async def effect(tx: Tx) -> Answer[HoldView]:
            store = LedgerTx(tx)
            hold = await store.get_hold(tenant_id, hold_id, lock=True)
            if hold is None:
                raise _hold_not_found(hold_id)
            _refuse_assignment_hold(hold, "void")
            book = _book(tenant_id, [], [hold])
            voided = book.void_hold(hold.id, at=now)
            await store.finish_hold(voided)
            return Answer(hold_view(voided))

        return await once(self._store, claim, HoldView, effect)

    async def expire_holds(self, tenant_id: str) -> int:
        """Mark the tenant's pending holds whose expiry has passed expired; returns how many.

        Expired holds reserve nothing whether or not this runs; it records the fact.
        """
        now = self._clock.now()
        async with self._store.transaction() as tx:
            return await LedgerTx(tx).expire_holds(tenant_id, now)

    async def _expire(self, tenant_id: str, hold_id: str, now: datetime) -> None:
        # Committed on its own, so a post or void refused with hold.expired still
        # leaves the hold marked expired.
        async with self._store.transaction() as tx:
            await LedgerTx(tx).expire_holds(tenant_id, now, hold_id=hold_id)


def _expiry(body: HoldBody, hold_id: str, now: datetime) -> datetime:
    shown = hold_id if len(hold_id) <= 256 else hold_id[:256] + "..."

    def invalid(reason: str, *fields: str) -> HoldInvalid:
        return HoldInvalid(
            f"hold {shown!r} is invalid: {reason}",
            details={"hold": shown, "reasons": [reason], "fields": list(fields)},
        )

    if (body.expires_at is None) == (body.timeout_seconds is None):
        raise invalid(
            "give exactly one of expires_at and timeout_seconds", "expires_at", "timeout_seconds"
        )
    if body.timeout_seconds is not None:
        seconds = body.timeout_seconds
        if isinstance(seconds, bool) or not 1 <= seconds <= MAX_HOLD_SECONDS:
            raise invalid(
                f"timeout_seconds must be between 1 and {MAX_HOLD_SECONDS}, not {seconds}",
                "timeout_seconds",
            )
        return now + timedelta(seconds=seconds)
    assert body.expires_at is not None
    if body.expires_at.tzinfo is None:
        raise InvalidTime(
            "expires_at needs a time zone (e.g. a trailing Z)",
            details={"field": "expires_at", "value": body.expires_at.isoformat()},
        )
    try:
        expires_at = body.expires_at.astimezone(UTC)
    except OverflowError:
        # 0001-01-01T00:00:00+14:00 decodes, but its UTC form is no datetime.
        raise invalid(
            f"expires_at {body.expires_at.isoformat()} is out of range: "
            "in UTC it must fall in the years 1 to 9999",
            "expires_at",
        ) from None
    if expires_at - now > timedelta(seconds=MAX_HOLD_SECONDS):
        raise invalid(f"expires_at is more than {MAX_HOLD_SECONDS} seconds away", "expires_at")
    return expires_at


def _batch_error(problems: Sequence[tuple[int, LedgerError]]) -> LedgerError:
    """One error for a refused batch: the first problem's class, every problem with
    the pointer of its entry."""
    flat = [p for _, error in problems for p in error.problems]
    error = ledger_error(flat) if flat else problems[0][1]
    error.details = {
        "problems": [
            {**msgspec.to_builtins(p), "pointer": f"/entries/{index}"}
            for index, refused in problems
            for p in refused.problems
        ]
    }
    return error


def _refuse_assignment_hold(hold: Hold, action: str) -> None:
    # The assignment ends its hold in the transaction that charges it (or not): a
    # post by hand would leave completion to charge the buyer a second time.
    assignment = assignment_of_hold(hold.id)
    if assignment is not None:
        raise HoldConflict(
            f"cannot {action} hold {hold.id!r}: it reserves the charge of assignment "
            f"{assignment!r}, which ends it (complete or reject the assignment)",
            details={"hold": hold.id, "assignment": assignment},
        )


def _hold_not_found(hold_id: str) -> HoldNotFound:
    return HoldNotFound(f"hold {hold_id!r} not found", details={"hold": hold_id})


def _unique(entries: Iterable[Entry]) -> list[Entry]:
    seen: set[str] = set()
    out: list[Entry] = []
    for entry in entries:
        if entry.id not in seen:
            seen.add(entry.id)
            out.append(entry)
    return out


__all__ = [
    "MAX_BATCH",
    "AccountBody",
    "AccountView",
    "BatchEntryBody",
    "EntryBatchBody",
    "EntryBatchView",
    "EntryBody",
    "EntryPageView",
    "EntryView",
    "HoldBody",
    "HoldPostBody",
    "HoldPosted",
    "HoldView",
    "LedgerService",
    "entry_view",
    "hold_view",
]
