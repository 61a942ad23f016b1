"""The balanced-entry ledger: accounts, immutable entries of postings, and the `Ledger` book.

Pure: the book lives in memory, reads no clock (every call takes `at`) and does
no I/O. The server loads what a transaction touches into a book (see
`LedgerSnapshot`), applies entries and holds, and stores what changed.

**Sign convention.** A `Posting` carries one signed `amount` in integer micros:
positive is a **debit**, negative is a **credit** (build them with `debit()` and
`credit()` to avoid sign slips). An entry is balanced when its postings sum to
zero in every currency. The book keeps each account's *signed* balance (debits
minus credits, the plain sum of its postings); `Ledger.balance` shows it in the
account's normal direction: as is for debit-normal accounts (assets, expenses),
negated for credit-normal ones (liabilities, revenue, equity). So a buyer wallet,
a liability of the platform, has a positive balance when it holds funds, and a
charge debits it.

**Floors and holds.** An account may have a `floor` on its *available* balance:
``0`` means never below zero, ``-N`` a credit line of N. Available is the normal
balance minus what live holds reserve against it: a pending hold reserves on the
debit account when that account is credit-normal (a debit would lower it) and on
the credit account when that one is debit-normal. An entry or hold that would
lower an account's available balance below its floor is refused with
``ledger.floor_crossed``, naming the account, the currency and the shortfall.
An entry that raises an account already below its floor is accepted.

**Idempotency and immutability.** Each entry has an idempotency key; its id is
derived from tenant and key (`entry_id_for`). Posting the same key with the same
content returns the recorded entry and changes nothing; the same key with other
content fails with ``ledger.idempotency_conflict``. Entries are never changed: a
mistake is undone by a new entry that `reverses` it (`reverse`, in full or in
part, never more than the entry moved per account) or adjusted by one that
`corrects` it. A call that raises leaves the book exactly as it was.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

import msgspec

from ductor_settlement import holds as _holds
from ductor_settlement._time import aware
from ductor_settlement.canonical import canonical_hash
from ductor_settlement.errors import (
    AccountConflict,
    HoldConflict,
    HoldInvalid,
    HoldNotFound,
    IdempotencyConflict,
    LedgerProblem,
    ledger_error,
)
from ductor_settlement.holds import Hold, HoldStatus
from ductor_settlement.money import MAX_MICROS, currency_problem, format_micros, micros_problem

__all__ = [
    "Account",
    "AccountKind",
    "Entry",
    "EntryDraft",
    "Ledger",
    "LedgerSnapshot",
    "NormalBalance",
    "Posting",
    "Reference",
    "ReferenceKind",
    "credit",
    "debit",
    "entry_id_for",
    "reverse",
    "transfer",
]

_MAX_TEXT = 256  # account codes, keys and ids are stored in indexed columns
_MAX_POSTINGS = 100  # Postgres checks each posting's entry at commit: cost grows as n * n
_MAX_DESCRIPTION = 1000  # descriptions are for people
# An account code is an id, named in paths, logs and messages: the rule of a worker
# id, whose wallet code it may be (`wallet:<worker id>`).
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class NormalBalance(enum.StrEnum):
    """The side on which an account's balance grows."""

    DEBIT = "debit"
    CREDIT = "credit"


class AccountKind(enum.StrEnum):
    """The five classes of account; each has a usual normal balance."""

    ASSET = "asset"
    """What the platform holds or is owed (cash at the processor). Debit-normal."""
    LIABILITY = "liability"
    """What the platform owes (buyer wallets, seller payables). Credit-normal."""
    EQUITY = "equity"
    """Owners' stake (opening balances). Credit-normal."""
    REVENUE = "revenue"
    """What the platform earns (take-rate fees). Credit-normal."""
    EXPENSE = "expense"
    """What the platform spends (refunds it absorbs, processor fees). Debit-normal."""

    @property
    def normal_balance(self) -> NormalBalance:
        """Debit for assets and expenses, credit for the rest."""
        if self in (AccountKind.ASSET, AccountKind.EXPENSE):
            return NormalBalance.DEBIT
        return NormalBalance.CREDIT


class Account(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One account of a tenant's book, in one currency.

    Attributes:
        tenant_id: the tenant that owns it.
        code: unique within the tenant, e.g. ``"wallet:buyer-42"``.
        currency: every posting to it must be in this currency.
        kind: asset, liability, equity, revenue or expense.
        normal: overrides the kind's normal balance (for contra accounts).
        floor: the lowest *available* normal balance allowed, in micros; ``0`` is
            "never below zero", ``-N`` a credit line of N, None no floor.
        name: a label for people.
    """

    tenant_id: str
    code: str
    currency: str
    kind: AccountKind
    normal: NormalBalance | None = None
    floor: int | None = None
    name: str = ""

    @property
    def normal_balance(self) -> NormalBalance:
        """The side on which this account's balance grows."""
        return self.normal if self.normal is not None else self.kind.normal_balance

    def to_normal(self, signed: int) -> int:
        """A debit-positive amount seen in this account's normal direction."""
        return signed if self.normal_balance is NormalBalance.DEBIT else -signed


class ReferenceKind(enum.StrEnum):
    """What an entry is about."""

    DECISION = "decision"
    """A routing decision's assignment was charged."""
    RUN = "run"
    """A workflow run was charged."""
    RETURN = "return"
    """A returned assignment was credited back."""
    TOP_UP = "top_up"
    """A wallet was funded."""
    HOLD = "hold"
    """A two-phase hold was posted."""
    REVERSAL = "reversal"
    """An entry was reversed for another reason."""
    ADJUSTMENT = "adjustment"
    """A manual correction."""
    PAYOUT = "payout"
    """A payable was paid out."""


class Reference(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The thing an entry is about: a kind and that thing's id."""

    kind: ReferenceKind
    id: str


class Posting(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One leg of an entry: `amount` micros on `account`; positive debits, negative credits."""

    account: str
    amount: int
    currency: str

    @property
    def is_debit(self) -> bool:
        """True for a debit (positive amount)."""
        return self.amount > 0


def debit(account: str, amount: int, currency: str) -> Posting:
    """A posting that debits `account` by `amount` (> 0) micros."""
    return Posting(account=account, amount=amount, currency=currency)


def credit(account: str, amount: int, currency: str) -> Posting:
    """A posting that credits `account` by `amount` (> 0) micros."""
    return Posting(account=account, amount=-amount, currency=currency)


class EntryDraft(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a caller asks the ledger to record; `Ledger.post` checks and records it.

    Attributes:
        tenant_id: the tenant whose book it goes to.
        idempotency_key: the entry's identity; the same key never records twice.
        description: a sentence for people.
        reference: what the entry is about.
        postings: two or more postings that sum to zero per currency.
        reverses: the id of the entry this one reverses (in full or in part).
        corrects: the id of an entry this one adjusts.
    """

    tenant_id: str
    idempotency_key: str
    description: str
    reference: Reference
    postings: tuple[Posting, ...]
    reverses: str | None = None
    corrects: str | None = None

    def fingerprint(self) -> str:
        """SHA-256 of the draft's canonical JSON (RFC 8785), as ``sha256:<hex>``.

        Equal content, equal print: a store can keep it beside the idempotency
        key to tell a retry from a conflict without loading the entry.
        """
        return canonical_hash(_draft_of(self))


class Entry(EntryDraft, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A recorded entry: its draft plus the id and time the book gave it. Never changes.

    Attributes:
        id: derived from tenant and idempotency key (`entry_id_for`).
        posted_at: the `at` it was posted with.
    """

    id: str
    posted_at: datetime

    def draft(self) -> EntryDraft:
        """The content the entry was posted from, without id and time."""
        return _draft_of(self)


def _draft_of(draft: EntryDraft) -> EntryDraft:
    return EntryDraft(
        tenant_id=draft.tenant_id,
        idempotency_key=draft.idempotency_key,
        description=draft.description,
        reference=draft.reference,
        postings=draft.postings,
        reverses=draft.reverses,
        corrects=draft.corrects,
    )


def entry_id_for(tenant_id: str, idempotency_key: str) -> str:
    """The id of the entry a tenant posts under a key: ``ent_`` and 32 hex digits.

    Derived, not drawn, so a retried post computes the same id before it reaches a store.
    """
    digest = hashlib.sha256(f"{tenant_id}\x1f{idempotency_key}".encode()).hexdigest()
    return "ent_" + digest[:32]


def transfer(
    *,
    tenant_id: str,
    idempotency_key: str,
    debit_account: str,
    credit_account: str,
    amount: int,
    currency: str,
    reference: Reference,
    description: str,
) -> EntryDraft:
    """A two-posting draft that moves `amount` from `credit_account` to `debit_account`.

    A wallet top-up, for example, debits the processor's cash (asset) and credits
    the buyer's wallet (liability).
    """
    return EntryDraft(
        tenant_id=tenant_id,
        idempotency_key=idempotency_key,
        description=description,
        reference=reference,
        postings=(debit(debit_account, amount, currency), credit(credit_account, amount, currency)),
    )


def _net_by_account(postings: Iterable[Posting]) -> dict[str, tuple[int, str]]:
    """Signed net per account (first-seen order) with its currency."""
    net: dict[str, tuple[int, str]] = {}
    for posting in postings:
        before, _ = net.get(posting.account, (0, posting.currency))
        net[posting.account] = (before + posting.amount, posting.currency)
    return net


def _apportion(parts: Sequence[int], target: int) -> list[int]:
    """Split `target` over positive `parts` in proportion, summing to exactly `target`.

    Largest remainder: every part gets the floor of its exact share, then the
    micros left over go one each to the parts with the largest remainders (the
    earlier part on a tie), so no micro is lost and the result is deterministic.
    """
    total = sum(parts)
    shares = [part * target // total for part in parts]
    remainders = [part * target % total for part in parts]
    left = target - sum(shares)
    for index in sorted(range(len(parts)), key=lambda i: (-remainders[i], i))[:left]:
        shares[index] += 1
    return shares


def reverse(
    entry: Entry,
    *,
    idempotency_key: str,
    amount: int | None = None,
    already_reversed: Mapping[str, int] | None = None,
    description: str | None = None,
    reference: Reference | None = None,
) -> EntryDraft:
    """A draft that takes back `entry`, in full or in part; post it to record it.

    Each account's net movement in `entry` is mirrored with the opposite sign.
    For a partial reversal, `amount` is how many micros of the entry's debit side
    to take back; it is split over the debit accounts and, separately, over the
    credit accounts in proportion to what is left of each (`_apportion`: largest
    remainder, exact), so the draft is balanced and no micro is lost.

    Args:
        entry: the entry to reverse.
        idempotency_key: the reversal's own key.
        amount: micros to take back; None takes back everything that is left.
        already_reversed: signed micros per account earlier reversals took back
            (`Ledger.reversed_amounts`), so repeated partial reversals add up to
            exactly the entry and never over-reverse one account.
        description: defaults to "reversal of <entry id>".
        reference: defaults to ``Reference(kind=REVERSAL, id=entry.id)``.

    Raises:
        InvalidEntry: a partial reversal of a multi-currency entry, or nothing left.
        InvalidAmount: `amount` is not positive or more than is left.
    """
    done = already_reversed or {}
    # What is left of each account's movement, still in the entry's direction.
    left = {
        account: (net + done.get(account, 0), currency)
        for account, (net, currency) in _net_by_account(entry.postings).items()
    }
    left = {account: value for account, value in left.items() if value[0] != 0}
    debit_side = [(account, net, cur) for account, (net, cur) in left.items() if net > 0]
    credit_side = [(account, -net, cur) for account, (net, cur) in left.items() if net < 0]
    remaining = sum(net for _, net, _ in debit_side)
    currencies = {cur for _, (_, cur) in left.items()}
    if remaining == 0:
        raise ledger_error(
            [_problem("ledger.invalid_entry", f"entry {entry.id} has nothing left to reverse")]
        )
    if amount is None:
        postings = [
            Posting(account=account, amount=-net, currency=cur)
            for account, (net, cur) in left.items()
        ]
    else:
        if len(currencies) != 1:
            raise ledger_error(
                [
                    _problem(
                        "ledger.invalid_entry",
                        f"a partial reversal needs a single-currency entry; {entry.id} moves "
                        + ", ".join(sorted(currencies)),
                    )
                ]
            )
        (currency,) = currencies
        reason = micros_problem(amount)
        if reason is None and amount > remaining:
            reason = f"amount {amount} is more than the {remaining} micros left to reverse"
        if reason is not None:
            raise ledger_error(
                [_problem("ledger.invalid_amount", reason, currency=currency, amount=amount)]
            )
        order = {account: index for index, account in enumerate(left)}
        debit_shares = _apportion([net for _, net, _ in debit_side], amount)
        credit_shares = _apportion([net for _, net, _ in credit_side], amount)
        legs = [(leg[0], -share) for leg, share in zip(debit_side, debit_shares, strict=True)]
        legs += [(leg[0], share) for leg, share in zip(credit_side, credit_shares, strict=True)]
        legs.sort(key=lambda leg: order[leg[0]])
        postings = [
            Posting(account=account, amount=signed, currency=currency)
            for account, signed in legs
            if signed != 0
        ]
    return EntryDraft(
        tenant_id=entry.tenant_id,
        idempotency_key=idempotency_key,
        description=description if description is not None else f"reversal of {entry.id}",
        reference=reference
        if reference is not None
        else Reference(kind=ReferenceKind.REVERSAL, id=entry.id),
        postings=tuple(postings),
        reverses=entry.id,
    )


def _problem(
    code: str,
    message: str,
    *,
    account: str | None = None,
    currency: str | None = None,
    amount: int | None = None,
    posting: int | None = None,
) -> LedgerProblem:
    return LedgerProblem(
        code=code,
        message=message,
        account=account,
        currency=currency,
        amount=amount,
        posting=posting,
    )


class LedgerSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A book's state as plain data, to store or to rebuild a `Ledger` from.

    A store need not load a whole book: a snapshot holding the accounts an
    operation touches (with their balances), the holds reserving against them,
    and, for a reversal, the entry reversed and the entries that already reverse
    it, checks that operation exactly as the whole book would. Idempotent
    replays are recognised only for entries the snapshot holds.

    Attributes:
        tenant_id: the book's tenant.
        accounts: open accounts.
        balances: signed balance (debits minus credits) per account code;
            accounts not listed are at zero.
        holds: holds in any status (pending ones reserve funds).
        entries: recorded entries, in the order they were posted.
    """

    tenant_id: str
    accounts: tuple[Account, ...] = ()
    balances: dict[str, int] = {}
    holds: tuple[Hold, ...] = ()
    entries: tuple[Entry, ...] = ()


class Ledger:
    """One tenant's book: accounts, balances, entries and holds, checked on every change.

    Every mutating method either applies in full or raises and changes nothing.
    """

    def __init__(self, tenant_id: str, accounts: Iterable[Account] = ()) -> None:
        """An empty book for `tenant_id`, with `accounts` opened at zero."""
        self._tenant_id = tenant_id
        self._accounts: dict[str, Account] = {}
        self._signed: dict[str, int] = {}
        self._entries: list[Entry] = []
        self._by_id: dict[str, Entry] = {}
        self._by_key: dict[str, Entry] = {}
        self._reversed: dict[str, dict[str, int]] = {}
        self._holds: dict[str, Hold] = {}
        for account in accounts:
            self.open_account(account)

    # --- reading ---------------------------------------------------------------

    @property
    def tenant_id(self) -> str:
        """The tenant whose book this is."""
        return self._tenant_id

    @property
    def accounts(self) -> tuple[Account, ...]:
        """Open accounts, in the order they were opened."""
        return tuple(self._accounts.values())

    @property
    def entries(self) -> tuple[Entry, ...]:
        """Recorded entries, in the order they were posted."""
        return tuple(self._entries)

    @property
    def holds(self) -> tuple[Hold, ...]:
        """Every hold the book knows, in any status, in the order they were placed."""
        return tuple(self._holds.values())

    def account(self, code: str) -> Account:
        """The open account `code`.

        Raises:
            UnknownAccount: no such account.
        """
        found = self._accounts.get(code)
        if found is None:
            raise ledger_error([self._unknown_account(code)])
        return found

    def entry(self, entry_id: str) -> Entry:
        """The entry with id `entry_id`.

        Raises:
            UnknownEntry: no such entry in this book.
        """
        found = self._by_id.get(entry_id)
        if found is None:
            raise ledger_error(
                [_problem("ledger.unknown_entry", f"no entry {entry_id!r} in this book")]
            )
        return found

    def entry_for_key(self, idempotency_key: str) -> Entry | None:
        """The entry recorded under `idempotency_key`, if any."""
        return self._by_key.get(idempotency_key)

    def hold(self, hold_id: str) -> Hold:
        """The hold `hold_id`, in whatever status.

        Raises:
            HoldNotFound: no such hold.
        """
        found = self._holds.get(hold_id)
        if found is None:
            raise HoldNotFound(f"no hold {hold_id!r} in this book", details={"hold": hold_id})
        return found

    def signed_balance(self, code: str) -> int:
        """Debits minus credits posted to `code`: the plain sum of its postings."""
        self.account(code)
        return self._signed.get(code, 0)

    def balance(self, code: str) -> int:
        """The posted balance of `code` in its normal direction (holds not deducted)."""
        return self.account(code).to_normal(self.signed_balance(code))

    def pending(self, code: str, *, at: datetime | None = None) -> int:
        """Micros live holds reserve against `code`'s normal balance (>= 0).

        With `at`, holds expired by then reserve nothing; without it every
        pending hold counts.
        """
        account = self.account(code)
        moment = aware(at, "at") if at is not None else None
        return self._reserved(account, moment, excluding=None)

    def available(self, code: str, *, at: datetime | None = None) -> int:
        """`balance` minus `pending`: what the account can still spend, in micros."""
        return self.balance(code) - self.pending(code, at=at)

    def reversed_amounts(self, entry_id: str) -> dict[str, int]:
        """Signed micros per account that reversals of `entry_id` have taken back."""
        return dict(self._reversed.get(entry_id, {}))

    def trial_balance(self) -> dict[str, int]:
        """The sum of all signed balances per currency of the open accounts; always zero.

        A non-zero value means a snapshot was loaded with balances that do not
        add up; entries posted through the book can never cause one.
        """
        totals: dict[str, int] = {}
        for code, account in self._accounts.items():
            totals[account.currency] = totals.get(account.currency, 0) + self._signed.get(code, 0)
        return totals

    # --- accounts ----------------------------------------------------------------

    def open_account(self, account: Account) -> Account:
        """Open `account` at zero; opening an identical account again is a no-op.

        Raises:
            InvalidAccount: another tenant, an empty or over-long code, a bad
                currency or floor.
            AccountConflict: the code is open with other attributes.
        """
        problems: list[LedgerProblem] = []
        if account.tenant_id != self._tenant_id:
            problems.append(
                _problem(
                    "ledger.invalid_account",
                    f"account {account.code!r} belongs to tenant {account.tenant_id!r}, "
                    f"not {self._tenant_id!r}",
                    account=account.code,
                )
            )
        if not account.code or len(account.code) > _MAX_TEXT:
            problems.append(
                _problem(
                    "ledger.invalid_account",
                    f"account code must be 1 to {_MAX_TEXT} characters",
                    account=account.code,
                )
            )
        elif not account.code.strip():
            problems.append(
                _problem(
                    "ledger.invalid_account", "account code must not be blank", account=account.code
                )
            )
        elif _CONTROL.search(account.code):
            problems.append(
                _problem(
                    "ledger.invalid_account",
                    "account code must not hold a control character (U+0000-U+001F, U+007F)",
                    account=account.code,
                )
            )
        if len(account.name) > _MAX_TEXT:
            problems.append(
                _problem(
                    "ledger.invalid_account",
                    f"account name must be at most {_MAX_TEXT} characters",
                    account=account.code,
                )
            )
        reason = currency_problem(account.currency)
        if reason is not None:
            problems.append(_problem("ledger.invalid_account", reason, account=account.code))
        if account.floor is not None:
            reason = micros_problem(account.floor, allow_zero=True, signed=True)
            if reason is not None:
                problems.append(
                    _problem("ledger.invalid_account", f"floor: {reason}", account=account.code)
                )
        if problems:
            raise ledger_error(problems)
        existing = self._accounts.get(account.code)
        if existing is not None:
            if existing == account:
                return existing
            raise AccountConflict(
                f"account {account.code!r} is already open with other attributes",
                problems=[
                    _problem(
                        "ledger.account_conflict",
                        f"account {account.code!r} is already open with other attributes",
                        account=account.code,
                    )
                ],
            )
        self._accounts[account.code] = account
        return account

    # --- entries -----------------------------------------------------------------

    def check(self, draft: EntryDraft, *, at: datetime) -> tuple[LedgerProblem, ...]:
        """Every problem posting `draft` at `at` would raise, without posting it.

        An idempotent replay (same key, same content) has no problems.
        """
        at = aware(at, "at")
        existing = self._by_key.get(draft.idempotency_key)
        if existing is not None:
            conflict = self._idempotency_problem(existing, draft)
            return () if conflict is None else (conflict,)
        problems, _ = self._check(draft, at, releasing=None)
        return tuple(problems)

    def post(self, draft: EntryDraft, *, at: datetime) -> Entry:
        """Record `draft` at `at` and return the entry (the recorded one on a replay).

        Raises:
            LedgerError: the subclass of the first problem found (``ledger.unbalanced``,
                ``ledger.floor_crossed`` ...), carrying every problem in `problems`.
        """
        at = aware(at, "at")
        existing = self._by_key.get(draft.idempotency_key)
        if existing is not None:
            conflict = self._idempotency_problem(existing, draft)
            if conflict is not None:
                raise IdempotencyConflict(conflict.message, problems=[conflict])
            return existing
        problems, deltas = self._check(draft, at, releasing=None)
        if problems:
            raise ledger_error(problems)
        return self._record(draft, at, deltas)

    def reversal(
        self,
        entry_id: str,
        *,
        idempotency_key: str,
        amount: int | None = None,
        description: str | None = None,
        reference: Reference | None = None,
    ) -> EntryDraft:
        """A draft reversing what is left of entry `entry_id` (see `reverse`); post it to apply."""
        return reverse(
            self.entry(entry_id),
            idempotency_key=idempotency_key,
            amount=amount,
            already_reversed=self._reversed.get(entry_id),
            description=description,
            reference=reference,
        )

    # --- holds -------------------------------------------------------------------

    def place_hold(self, hold: Hold) -> Hold:
        """Reserve `hold.amount` from `hold.created_at` on; placing the same hold twice is a no-op.

        Build `hold` with `new_hold`.

        Raises:
            HoldInvalid: the hold is not pending, is for another tenant, or is malformed.
            HoldConflict: the id is taken by a hold with other content.
            UnknownAccount, CurrencyMismatch: an account is missing or in another currency.
            FloorCrossed: the reservation would take an account's available
                balance below its floor (not enough funds).
        """
        existing = self._holds.get(hold.id)
        if existing is not None:
            if _hold_request(existing) == _hold_request(hold):
                return existing
            raise HoldConflict(
                f"hold id {hold.id!r} is already used for a different hold",
                details={"hold": hold.id},
            )
        if hold.tenant_id != self._tenant_id or hold.status is not HoldStatus.PENDING:
            raise HoldInvalid(
                f"hold {hold.id!r} must be pending and for tenant {self._tenant_id!r}",
                details={"hold": hold.id, "tenant": hold.tenant_id, "status": hold.status.value},
            )
        # Re-derive through new_hold so a decoded Hold gets the same shape checks.
        _holds.new_hold(
            id=hold.id,
            tenant_id=hold.tenant_id,
            debit_account=hold.debit_account,
            credit_account=hold.credit_account,
            amount=hold.amount,
            currency=hold.currency,
            now=hold.created_at,
            expires_at=hold.expires_at,
            description=hold.description,
        )
        at = aware(hold.created_at, "created_at")
        problems: list[LedgerProblem] = []
        for code in (hold.debit_account, hold.credit_account):
            account = self._accounts.get(code)
            if account is None:
                problems.append(self._unknown_account(code))
            elif account.currency != hold.currency:
                problems.append(self._currency_mismatch(account, hold.currency, None))
        if not problems:
            reservation = {hold.debit_account: hold.amount, hold.credit_account: -hold.amount}
            for code, signed in reservation.items():
                account = self._accounts[code]
                lowered = -account.to_normal(signed)
                if lowered > 0:
                    problem = self._floor_problem(account, -lowered, at, excluding=None)
                    if problem is not None:
                        problems.append(problem)
        if problems:
            raise ledger_error(problems)
        self._holds[hold.id] = hold
        return hold

    def post_hold(
        self, hold_id: str, *, at: datetime, amount: int | None = None
    ) -> tuple[Hold, Entry]:
        """Post hold `hold_id` for `amount` (all by default) and write its entry.

        The entry debits the hold's debit account and credits its credit account,
        with idempotency key ``hold:<id>:post`` and a ``hold`` reference; the
        unposted remainder is released.

        Raises:
            HoldNotFound, HoldExpired, HoldAlreadyFinal, HoldInvalid, HoldAmountExceeded:
                see `ductor_settlement.holds.post_hold`.
            LedgerError: the entry does not fit the book (an account was closed
                under it in a snapshot, a floor changed).
        """
        at = aware(at, "at")
        hold = self.hold(hold_id)
        posted = _holds.post_hold(hold, now=at, amount=amount)
        draft = EntryDraft(
            tenant_id=self._tenant_id,
            idempotency_key=f"hold:{hold.id}:post",
            description=hold.description or f"post of hold {hold.id}",
            reference=Reference(kind=ReferenceKind.HOLD, id=hold.id),
            postings=(
                debit(hold.debit_account, posted.posted_amount, hold.currency),
                credit(hold.credit_account, posted.posted_amount, hold.currency),
            ),
        )
        problems, deltas = self._check(draft, at, releasing=hold.id)
        if problems:
            raise ledger_error(problems)
        entry = self._record(draft, at, deltas)
        final = msgspec.structs.replace(posted, entry_id=entry.id)
        self._holds[hold.id] = final
        return final, entry

    def void_hold(self, hold_id: str, *, at: datetime) -> Hold:
        """Void hold `hold_id`: nothing moves and the reservation is released.

        Raises:
            HoldNotFound, HoldExpired, HoldAlreadyFinal: see `ductor_settlement.holds.void_hold`.
        """
        voided = _holds.void_hold(self.hold(hold_id), now=at)
        self._holds[hold_id] = voided
        return voided

    def expire_holds(self, at: datetime) -> tuple[Hold, ...]:
        """Mark every pending hold whose expiry is at or before `at` expired; return them.

        Expired holds stop reserving at their expiry whether or not this is
        called; calling it records the fact so a store can persist it.
        """
        at = aware(at, "at")
        expired: list[Hold] = []
        for hold in list(self._holds.values()):
            after = _holds.expire_hold(hold, now=at)
            if after is not hold:
                self._holds[hold.id] = after
                expired.append(after)
        return tuple(expired)

    # --- snapshots ---------------------------------------------------------------

    def snapshot(self) -> LedgerSnapshot:
        """The book as plain data (balances listed for every account, zero included)."""
        return LedgerSnapshot(
            tenant_id=self._tenant_id,
            accounts=self.accounts,
            balances={code: self._signed.get(code, 0) for code in self._accounts},
            holds=self.holds,
            entries=self.entries,
        )

    @classmethod
    def from_snapshot(cls, snapshot: LedgerSnapshot) -> Ledger:
        """A book holding `snapshot`'s state; balances are taken as given, not re-derived.

        Raises:
            InvalidAccount, AccountConflict: an account in the snapshot is invalid.
            UnknownAccount: a balance is given for an account not in the snapshot.
        """
        book = cls(snapshot.tenant_id, snapshot.accounts)
        unknown = [code for code in snapshot.balances if code not in book._accounts]
        if unknown:
            raise ledger_error([book._unknown_account(code) for code in unknown])
        book._signed = {code: signed for code, signed in snapshot.balances.items() if signed}
        for hold in snapshot.holds:
            book._holds[hold.id] = hold
        for entry in snapshot.entries:
            book._entries.append(entry)
            book._index(entry)
        return book

    # --- internals ---------------------------------------------------------------

    def _idempotency_problem(self, existing: Entry, draft: EntryDraft) -> LedgerProblem | None:
        if existing.draft() == draft:
            return None
        return _problem(
            "ledger.idempotency_conflict",
            f"idempotency key {draft.idempotency_key!r} was already used for entry "
            f"{existing.id} with different content",
        )

    def _unknown_account(self, code: str, posting: int | None = None) -> LedgerProblem:
        return _problem(
            "ledger.unknown_account",
            f"no account {code!r} in the book of tenant {self._tenant_id!r}",
            account=code,
            posting=posting,
        )

    @staticmethod
    def _currency_mismatch(account: Account, currency: str, posting: int | None) -> LedgerProblem:
        return _problem(
            "ledger.currency_mismatch",
            f"account {account.code!r} is in {account.currency}, not {currency}",
            account=account.code,
            currency=currency,
            posting=posting,
        )

    def _reserved(self, account: Account, at: datetime | None, excluding: str | None) -> int:
        """Micros live holds reserve against `account`'s normal balance."""
        reserved = 0
        for hold in self._holds.values():
            if hold.id == excluding or hold.status is not HoldStatus.PENDING:
                continue
            if at is not None and not hold.is_live(at):
                continue
            if hold.debit_account == account.code:
                reserved += max(0, -account.to_normal(hold.amount))
            elif hold.credit_account == account.code:
                reserved += max(0, -account.to_normal(-hold.amount))
        return reserved

    def _floor_problem(
        self, account: Account, normal_delta: int, at: datetime, excluding: str | None
    ) -> LedgerProblem | None:
        if account.floor is None:
            return None
        after = (
            account.to_normal(self._signed.get(account.code, 0))
            + normal_delta
            - self._reserved(account, at, excluding)
        )
        if after >= account.floor:
            return None
        short = account.floor - after
        return _problem(
            "ledger.floor_crossed",
            f"account {account.code!r} would have {format_micros(after, account.currency)} "
            f"available, {format_micros(short, account.currency)} below its floor of "
            f"{format_micros(account.floor, account.currency)}",
            account=account.code,
            currency=account.currency,
            amount=short,
        )

    def _check(
        self, draft: EntryDraft, at: datetime, releasing: str | None
    ) -> tuple[list[LedgerProblem], dict[str, int]]:
        problems: list[LedgerProblem] = []
        if draft.tenant_id != self._tenant_id:
            problems.append(
                _problem(
                    "ledger.invalid_entry",
                    f"entry is for tenant {draft.tenant_id!r}, this book is {self._tenant_id!r}",
                )
            )
        if not draft.idempotency_key or len(draft.idempotency_key) > _MAX_TEXT:
            problems.append(
                _problem(
                    "ledger.invalid_entry",
                    f"the idempotency key must be 1 to {_MAX_TEXT} characters",
                )
            )
        if len(draft.postings) < 2:
            problems.append(
                _problem(
                    "ledger.invalid_entry",
                    f"an entry needs at least two postings, this one has {len(draft.postings)}",
                )
            )
        if len(draft.description) > _MAX_DESCRIPTION:
            problems.append(
                _problem(
                    "ledger.invalid_entry",
                    f"the description must be at most {_MAX_DESCRIPTION} characters, "
                    f"this one has {len(draft.description)}",
                )
            )
        if len(draft.reference.id) > _MAX_TEXT:
            problems.append(
                _problem(
                    "ledger.invalid_entry",
                    f"the reference id must be at most {_MAX_TEXT} characters",
                )
            )
        if len(draft.postings) > _MAX_POSTINGS:
            # Checked before the postings, so a huge entry costs one problem, not one each.
            problems.append(
                _problem(
                    "ledger.invalid_entry",
                    f"an entry has at most {_MAX_POSTINGS} postings, this one has "
                    f"{len(draft.postings)} (post several entries, or a batch)",
                )
            )
            return problems, {}
        sums: dict[str, int] = {}
        for index, posting in enumerate(draft.postings):
            reason = micros_problem(posting.amount, signed=True)
            if reason is not None:
                problems.append(
                    _problem(
                        "ledger.invalid_amount",
                        f"posting {index} to {posting.account!r}: {reason}",
                        account=posting.account,
                        currency=posting.currency,
                        posting=index,
                    )
                )
                continue
            sums[posting.currency] = sums.get(posting.currency, 0) + posting.amount
            account = self._accounts.get(posting.account)
            if account is None:
                problems.append(self._unknown_account(posting.account, index))
            elif account.currency != posting.currency:
                problems.append(self._currency_mismatch(account, posting.currency, index))
        for currency, imbalance in sums.items():
            if imbalance != 0:
                side = "debits exceed credits" if imbalance > 0 else "credits exceed debits"
                problems.append(
                    _problem(
                        "ledger.unbalanced",
                        f"entry does not balance in {currency}: {side} by "
                        f"{format_micros(abs(imbalance), currency)}",
                        currency=currency,
                        amount=imbalance,
                    )
                )
        for link, target in (("reverses", draft.reverses), ("corrects", draft.corrects)):
            if target is not None and target not in self._by_id:
                problems.append(
                    _problem(
                        "ledger.unknown_entry",
                        f"the entry {link} {target!r}, which is not in this book",
                    )
                )
        if problems:
            return problems, {}
        deltas: dict[str, int] = {}
        for posting in draft.postings:
            deltas[posting.account] = deltas.get(posting.account, 0) + posting.amount
        if draft.reverses is not None:
            problems.extend(self._reversal_problems(draft, deltas))
        for code, delta in deltas.items():
            account = self._accounts[code]
            signed_after = self._signed.get(code, 0) + delta
            if abs(signed_after) > MAX_MICROS:
                problems.append(
                    _problem(
                        "ledger.invalid_amount",
                        f"account {code!r} would hold {signed_after} micros, beyond the "
                        f"{MAX_MICROS} limit",
                        account=code,
                        currency=account.currency,
                        amount=signed_after,
                    )
                )
                continue
            normal_delta = account.to_normal(delta)
            if normal_delta < 0:
                problem = self._floor_problem(account, normal_delta, at, releasing)
                if problem is not None:
                    problems.append(problem)
        return problems, deltas

    def _reversal_problems(
        self, draft: EntryDraft, deltas: Mapping[str, int]
    ) -> list[LedgerProblem]:
        assert draft.reverses is not None
        original = self._by_id[draft.reverses]
        moved = {account: net for account, (net, _) in _net_by_account(original.postings).items()}
        done = self._reversed.get(original.id, {})
        problems: list[LedgerProblem] = []
        for code, delta in deltas.items():
            if delta == 0:
                continue
            net = moved.get(code, 0)
            currency = self._accounts[code].currency
            if net == 0 or (net > 0) == (delta > 0):
                problems.append(
                    _problem(
                        "ledger.over_reversal",
                        f"posting to {code!r} does not take back a movement of entry {original.id}",
                        account=code,
                        currency=currency,
                        amount=abs(delta),
                    )
                )
                continue
            excess = abs(done.get(code, 0) + delta) - abs(net)
            if excess > 0:
                problems.append(
                    _problem(
                        "ledger.over_reversal",
                        f"reversing entry {original.id} would take back "
                        f"{format_micros(excess, currency)} more from {code!r} than it moved",
                        account=code,
                        currency=currency,
                        amount=excess,
                    )
                )
        return problems

    def _record(self, draft: EntryDraft, at: datetime, deltas: Mapping[str, int]) -> Entry:
        entry = Entry(
            tenant_id=draft.tenant_id,
            idempotency_key=draft.idempotency_key,
            description=draft.description,
            reference=draft.reference,
            postings=draft.postings,
            reverses=draft.reverses,
            corrects=draft.corrects,
            id=entry_id_for(draft.tenant_id, draft.idempotency_key),
            posted_at=at,
        )
        for code, delta in deltas.items():
            signed = self._signed.get(code, 0) + delta
            if signed:
                self._signed[code] = signed
            else:
                self._signed.pop(code, None)
        self._entries.append(entry)
        self._index(entry)
        return entry

    def _index(self, entry: Entry) -> None:
        self._by_id[entry.id] = entry
        self._by_key[entry.idempotency_key] = entry
        if entry.reverses is not None:
            tally = self._reversed.setdefault(entry.reverses, {})
            for posting in entry.postings:
                tally[posting.account] = tally.get(posting.account, 0) + posting.amount


def _hold_request(hold: Hold) -> tuple[object, ...]:
    """What identifies a hold request, so a replay can be told from a conflict."""
    return (
        hold.tenant_id,
        hold.debit_account,
        hold.credit_account,
        hold.amount,
        hold.currency,
        hold.expires_at,
        hold.description,
    )
