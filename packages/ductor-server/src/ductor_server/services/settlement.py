"""Pool settlement: what a settled pool charges per assignment, and who can pay it.

A pool's `PoolSettlement` (opt-in, stored beside the routing configuration)
names its price rule (`ductor_settlement.pricing`), the buyer wallets (one per
member: ``<wallet_prefix><worker id>``), the seller's payable and the
platform's revenue account, and its return policy. Routing reads the wallets'
available funds into its snapshot (`funds_for`), so a member that cannot pay
is excluded with reason ``funds``; the assignment's commit posts the charge in
the same transaction as its reservations (`settle_assignment`), and a wallet
that was emptied in between makes the commit lose like a lost cap race.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta

import msgspec

from ductor_core.errors import DuctorError
from ductor_routing import AssignConflict
from ductor_server.ledger.store import AccountRecord, LedgerTx
from ductor_server.storage.protocol import Tx
from ductor_settlement import (
    Entry,
    EntryDraft,
    Hold,
    HoldStatus,
    Ledger,
    LedgerError,
    LedgerSnapshot,
    NormalBalance,
    Posting,
    Reference,
    ReferenceKind,
    new_hold,
)
from ductor_settlement.pricing import (
    AssignmentAccounts,
    PriceRule,
    PriceSource,
    Rounding,
    charge_entry,
    quote,
)
from ductor_settlement.returns import ReturnPolicy

MAX_SECONDS = 366 * 24 * 3600
"""The longest window a return policy may name (a year and a day)."""

UNLIMITED = 10**18
"""A cover no charge can exceed (a fixed price the wallet can pay)."""


class SettlementInvalid(DuctorError):
    """A pool settlement setting that cannot be used; `details` lists every problem
    as ``{"pointer", "message"}``."""

    code = "settlement.invalid"


class ReturnPolicyBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A settled pool's return policy (see `ductor_settlement.returns.ReturnPolicy`).

    Attributes:
        window_seconds: how long after the assignment a return is accepted.
        allowed_reasons: the accepted reasons; absent accepts any.
        max_return_rate_bps: the highest share of a buyer's recent assignments
            in the pool it may return, in basis points; absent sets no limit.
        rate_window_seconds: how far back "recent" reaches.
        min_sample: the rate is enforced once the buyer has this many recent assignments.
        credit_bps: the share of the charge credited back (10 000 = all).
        reroute: whether a return may ask for the lead to be routed again.
    """

    window_seconds: int
    allowed_reasons: tuple[str, ...] | None = None
    max_return_rate_bps: int | None = None
    rate_window_seconds: int = 30 * 24 * 3600
    min_sample: int = 20
    credit_bps: int = 10_000
    reroute: bool = True

    def policy(self) -> ReturnPolicy:
        """The pure policy this body describes."""
        return ReturnPolicy(
            window=timedelta(seconds=self.window_seconds),
            allowed_reasons=self.allowed_reasons,
            max_return_rate_bps=self.max_return_rate_bps,
            rate_window=timedelta(seconds=self.rate_window_seconds),
            min_sample=self.min_sample,
            credit_bps=self.credit_bps,
            reroute=self.reroute,
        )


class SettlementMode(enum.StrEnum):
    """How an assignment's charge reaches the ledger."""

    POST = "post"
    """One balanced entry: the buyer's wallet pays, seller and platform are credited."""
    HOLD = "hold"
    """A hold reserves the charge on the buyer's wallet; completing the assignment
    releases it and posts the entry, rejecting or expiring it voids the hold."""


class PoolSettlement(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`PUT /v1/pools/{id}/settlement`: how assignments from the pool are charged.

    Attributes:
        enabled: off keeps the setting but charges nothing.
        currency: the currency of every amount and account.
        source: "routing" charges the decision's charge (e.g. the auction's
            clearing price); "fixed" charges `price`.
        price: the fixed price in micros (with `source` fixed).
        take_rate_bps: the platform's share of the charge, in basis points.
        rounding: how the platform's share is rounded to a micro.
        minimum_charge: the buyer pays at least this.
        minimum_payout: the seller receives at least this.
        wallet_prefix: a member's wallet is ``<wallet_prefix><worker id>``.
        seller_account: credited each payout (e.g. the lead seller's payable).
        platform_account: credited each platform fee (a revenue account).
        mode: how the charge is written: "post" at once, or "hold" until the
            assignment completes.
        hold_seconds: how long a hold reserves the charge (mode hold).
        returns: the pool's return policy; absent: its assignments cannot be returned.
    """

    enabled: bool = True
    currency: str
    source: PriceSource = PriceSource.ROUTING
    price: int | None = None
    take_rate_bps: int = 0
    rounding: Rounding = Rounding.HALF_EVEN
    minimum_charge: int = 0
    minimum_payout: int = 0
    wallet_prefix: str = "wallet:"
    seller_account: str
    platform_account: str
    mode: SettlementMode = SettlementMode.POST
    hold_seconds: int = 24 * 3600
    returns: ReturnPolicyBody | None = None

    def rule(self, pool: str) -> PriceRule:
        """The price rule of `pool` under this setting."""
        return PriceRule(
            pool=pool,
            currency=self.currency,
            source=self.source,
            price=self.price,
            take_rate_bps=self.take_rate_bps,
            rounding=self.rounding,
            minimum_charge=self.minimum_charge,
            minimum_payout=self.minimum_payout,
        )

    def wallet(self, worker: str) -> str:
        """The wallet account of `worker`."""
        return self.wallet_prefix + worker


class PoolSettlementView(msgspec.Struct, frozen=True, kw_only=True):
    """A pool's settlement setting."""

    pool: str
    settlement: PoolSettlement


_RULE_FIELDS = (
    "currency",
    "price",
    "take_rate_bps",
    "minimum_charge",
    "minimum_payout",
)
_POLICY_FIELDS = {
    "window": "window_seconds",
    "rate_window": "rate_window_seconds",
    "allowed_reasons": "allowed_reasons",
    "max_return_rate_bps": "max_return_rate_bps",
    "min_sample": "min_sample",
    "credit_bps": "credit_bps",
}


def _pointer_of(message: str, fields: Iterable[str], default: str) -> str:
    """The field a problem message is about: the one it starts with, else the first
    it names before any colon, else `default`."""
    names = list(fields)
    for name in names:
        if message.startswith(name):
            return "/" + name
    head = message.split(":")[0]
    for name in names:
        if f" {name}" in head:
            return "/" + name
    return default


async def check_settlement(
    tx: Tx, tenant_id: str, pool_id: str, body: PoolSettlement
) -> list[dict[str, str]]:
    """Every problem of `body` for `pool_id`, as ``{"pointer", "message"}`` (empty: fine)."""
    problems: list[dict[str, str]] = []

    def add(pointer: str, message: str) -> None:
        problems.append({"pointer": pointer, "message": message})

    for reason in body.rule(pool_id).problems():
        if reason.startswith(("a fixed-price rule", "a routing-priced")):
            add("/price", reason)
        else:
            add(_pointer_of(reason, _RULE_FIELDS, "/currency"), reason)
    prefix = body.wallet_prefix
    # The prefix starts every wallet's account code, which holds no control character.
    if not prefix or len(prefix) > 64 or any(c.isspace() or c < " " or c == "\x7f" for c in prefix):
        add("/wallet_prefix", "must be 1 to 64 characters without spaces or control characters")
    if body.returns is not None:
        returns = body.returns
        windows: dict[str, int] = {}
        for name in ("window_seconds", "rate_window_seconds"):
            seconds = getattr(returns, name)
            if isinstance(seconds, bool) or not 1 <= seconds <= MAX_SECONDS:
                add(f"/returns/{name}", f"must be between 1 and {MAX_SECONDS}")
                windows[name] = 1  # reported; a stand-in so the other fields are checked too
        checked = msgspec.structs.replace(returns, **windows) if windows else returns
        for reason in checked.policy().problems():
            field = _pointer_of(reason, _POLICY_FIELDS, "/window").removeprefix("/")
            add(f"/returns/{_POLICY_FIELDS.get(field, field)}", reason)
    store = LedgerTx(tx)
    for field in ("seller_account", "platform_account"):
        code = getattr(body, field)
        record = await store.get_account(tenant_id, code)
        if record is None:
            add(f"/{field}", f"no account {code!r}; open it first (POST /v1/accounts)")
        elif record.account.currency != body.currency:
            add(
                f"/{field}",
                f"account {code!r} is in {record.account.currency}, not {body.currency}",
            )
    hold_seconds = body.hold_seconds
    if isinstance(hold_seconds, bool) or not 1 <= hold_seconds <= MAX_SECONDS:
        add("/hold_seconds", f"must be between 1 and {MAX_SECONDS}")
    if body.seller_account == body.platform_account:
        add("/platform_account", "must differ from seller_account")
    return problems


def raise_problems(problems: Sequence[dict[str, str]]) -> None:
    """Raise `SettlementInvalid` listing `problems`, if there are any."""
    if problems:
        summary = "; ".join(f"{p['pointer']}: {p['message']}" for p in problems[:5])
        raise SettlementInvalid(f"invalid pool settlement: {summary}", details=list(problems))


def _book(tenant_id: str, records: Sequence[AccountRecord], holds: Iterable[Hold] = ()) -> Ledger:
    return Ledger.from_snapshot(
        LedgerSnapshot(
            tenant_id=tenant_id,
            accounts=tuple(r.account for r in records),
            balances={r.account.code: r.balance for r in records},
            holds=tuple(holds),
        )
    )


def cover(setting: PoolSettlement, record: AccountRecord | None, available: int) -> int | None:
    """The most routing may charge a member whose wallet is `record` with `available`
    funds (None: not limited; -1: it can pay nothing).

    A wallet in another currency pays nothing, nor does a debit-normal one: a charge
    debits the wallet, which would raise such an account however often it is charged.
    """
    if record is None or record.account.currency != setting.currency:
        return -1
    if record.account.normal_balance is NormalBalance.DEBIT:
        return -1
    floor = record.account.floor
    if floor is None:
        return None
    room = available - floor
    if setting.source is PriceSource.FIXED:
        fixed = max(setting.price or 0, setting.minimum_charge)
        return UNLIMITED if room >= fixed else -1
    return room if room >= setting.minimum_charge else -1


async def funds_for(
    tx: Tx,
    tenant_id: str,
    members: Mapping[str, tuple[PoolSettlement, Sequence[str]]],
    now: datetime,
) -> dict[str, dict[str, int]]:
    """Per settled pool, the most each member's wallet can cover at `now` (see `cover`)."""
    codes = sorted({s.wallet(w) for s, workers in members.values() for w in workers})
    if not codes:
        return {}
    store = LedgerTx(tx)
    records = await store.get_accounts(tenant_id, codes)
    holds = await store.live_holds(tenant_id, [r.account.code for r in records], now)
    book = _book(tenant_id, records, holds)
    by_code = {r.account.code: r for r in records}
    funds: dict[str, dict[str, int]] = {}
    for pool_id, (setting, workers) in members.items():
        covers: dict[str, int] = {}
        for worker in workers:
            code = setting.wallet(worker)
            record = by_code.get(code)
            available = book.available(code, at=now) if record is not None else 0
            found = cover(setting, record, available)
            if found is not None:
                covers[worker] = found
        funds[pool_id] = covers
    return funds


def charge_key(assignment_id: str) -> str:
    """The idempotency key of the entry charging an assignment."""
    return f"assign:{assignment_id}"


ASSIGNMENT_HOLD_PREFIX = "hold_asg_"
"""How the ids of holds reserving an assignment's charge start: the ledger's own, so
a caller may neither place a hold under such an id nor post or void one."""


def hold_id_for(assignment_id: str) -> str:
    """The id of the hold reserving an assignment's charge (mode hold)."""
    return "hold_" + assignment_id


def assignment_of_hold(hold_id: str) -> str | None:
    """The assignment whose charge the hold `hold_id` reserves, if it is such a hold."""
    if hold_id.startswith(ASSIGNMENT_HOLD_PREFIX):
        return hold_id.removeprefix("hold_")
    return None


async def settle_assignment(
    tx: Tx,
    tenant_id: str,
    setting: PoolSettlement,
    *,
    pool: str,
    worker: str,
    routing_charge: int,
    decision_id: str,
    assignment_id: str,
    now: datetime,
    on_entry: Callable[[Entry], None] | None = None,
) -> tuple[tuple[str, ...], tuple[Posting, ...] | None]:
    """Write the assignment's charge in `tx`: (the ids of the entries written, the
    postings a hold reserves for later, in mode hold).

    The accounts are locked in code order and the floors checked on what the
    lock sees, so concurrent decisions never overdraw a wallet.

    Raises:
        AssignConflict: the wallet can no longer pay (spent since the snapshot):
            the decision is routed again on fresh state.
        LedgerError: any other reason the ledger refuses the entry.
    """
    priced = quote(setting.rule(pool), routing_charge=routing_charge)
    accounts = AssignmentAccounts(
        buyer_wallet=setting.wallet(worker),
        seller_payable=setting.seller_account,
        platform_revenue=setting.platform_account,
    )
    draft = charge_entry(
        priced,
        accounts,
        tenant_id=tenant_id,
        idempotency_key=charge_key(assignment_id),
        reference=Reference(kind=ReferenceKind.DECISION, id=decision_id),
        description=_description(assignment_id, pool),
    )
    if draft is None:
        return (), None
    store = LedgerTx(tx)
    records, holds = await store.lock_with_holds(
        tenant_id, [p.account for p in draft.postings], now
    )
    book = _book(tenant_id, records, holds)
    try:
        if setting.mode is SettlementMode.HOLD:
            hold = new_hold(
                id=hold_id_for(assignment_id),
                tenant_id=tenant_id,
                debit_account=accounts.buyer_wallet,
                credit_account=accounts.seller_payable,
                amount=priced.charge,
                currency=priced.currency,
                now=now,
                expires_at=now + timedelta(seconds=setting.hold_seconds),
                description=f"charge for assignment {assignment_id}, until it completes",
            )
            await store.insert_hold(book.place_hold(hold))
            return (), draft.postings
        entry: Entry = book.post(draft, at=now)
    except LedgerError as exc:
        if any(p.code == "ledger.floor_crossed" for p in exc.problems):
            raise AssignConflict(
                f"the wallet of {worker!r} can no longer pay {priced.charge} micros",
                details={"decision_id": decision_id, "account": accounts.buyer_wallet},
            ) from exc
        raise
    if await store.write_entry(entry, now) and on_entry is not None:
        on_entry(entry)
    return (entry.id,), None


def _description(assignment_id: str, pool: str) -> str:
    return f"charge for assignment {assignment_id} in pool {pool}"


async def finish_held_charge(
    tx: Tx,
    tenant_id: str,
    *,
    assignment_id: str,
    pool: str,
    decision_id: str,
    postings: tuple[Posting, ...],
    complete: bool,
    now: datetime,
    on_entry: Callable[[Entry], None] | None = None,
) -> tuple[str, ...]:
    """End the hold of a held charge: on completion release it and post the charge
    (in one transaction, so the reserved funds pay it); otherwise void it. The ids
    of the entries written.

    Raises:
        LedgerError: the charge no longer fits (the hold had expired and the
            wallet was spent since): ``ledger.floor_crossed``.
    """
    store = LedgerTx(tx)
    hold_id = hold_id_for(assignment_id)
    await store.expire_holds(tenant_id, now, hold_id=hold_id)
    found = await store.get_hold(tenant_id, hold_id, lock=True)
    pending = found is not None and found.status is HoldStatus.PENDING
    if not complete and not pending:
        return ()
    accounts = {p.account for p in postings}
    if found is not None:
        accounts |= {found.debit_account, found.credit_account}
    records, holds = await store.lock_with_holds(tenant_id, accounts, now)
    book = _book(tenant_id, records, holds)
    if pending:
        assert found is not None
        await store.finish_hold(book.void_hold(found.id, at=now))
    if not complete:
        return ()
    draft = EntryDraft(
        tenant_id=tenant_id,
        idempotency_key=charge_key(assignment_id),
        description=_description(assignment_id, pool),
        reference=Reference(kind=ReferenceKind.DECISION, id=decision_id),
        postings=postings,
    )
    entry = book.post(draft, at=now)
    if await store.write_entry(entry, now) and on_entry is not None:
        on_entry(entry)
    return (entry.id,)


__all__ = [
    "ASSIGNMENT_HOLD_PREFIX",
    "PoolSettlement",
    "PoolSettlementView",
    "ReturnPolicyBody",
    "SettlementInvalid",
    "SettlementMode",
    "assignment_of_hold",
    "charge_key",
    "check_settlement",
    "cover",
    "finish_held_charge",
    "funds_for",
    "hold_id_for",
    "raise_problems",
    "settle_assignment",
]
