"""Property: any sequence of book operations keeps the ledger sound.

A hypothesis state machine drives one `Ledger` through top-ups, priced charges,
arbitrary (often broken) entries, holds placed, posted in full or in part,
voided and expired, time passing, returns, reversals of any entry, and
idempotent replays and conflicts. Beside it the test keeps its own model (the
drafts it saw accepted and the holds it placed) and checks after every step:

- every recorded entry nets to zero per currency, in its accounts' currencies;
- every balance equals the sum of the postings of the accepted entries;
- no account's available balance (posted minus live reservations, computed by
  the model) is below its floor, and `Ledger.available` agrees with the model;
- reversals never take back more than an entry moved, per account;
- hold statuses match the model.

Each operation's outcome is also predicted by the model: the book must accept
exactly what the model accepts, refuse the rest with the predicted codes, and a
refused call must leave the book unchanged.

Breaking the book makes this fail, and `test_a_broken_check_is_caught` shows it
on every run: it breaks one check of `Ledger` at a time and runs the machine
with the outcome predictions and the `Ledger.available` comparison switched off
(`trusting`), so that the invariants alone must catch the break:
- per-currency balance check dropped: an arbitrary unbalanced entry is
  recorded and "every entry nets to zero" fails within a few steps;
- floor check dropped (`_floor_problem` returning None): an overdraft is
  recorded and `no_floor_is_crossed` fails;
- holds ignored (`_reserved` returning 0): a second hold reserves funds a first
  one holds, and `no_floor_is_crossed` fails (wallet:b1 available -1, floor 0);
- over-reversal check dropped: a hand-made reversal takes back 10 001 of the
  10 000 a top-up moved and `reversals_never_exceed_what_an_entry_moved` fails.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ductor_settlement import (
    Account,
    AccountKind,
    AssignmentAccounts,
    AssignmentFacts,
    Entry,
    EntryDraft,
    HoldStatus,
    Ledger,
    LedgerError,
    Posting,
    PriceRule,
    Reference,
    ReferenceKind,
    ReturnCredit,
    ReturnPolicy,
    ReturnRefusal,
    ReturnStats,
    Rounding,
    SettlementError,
    charge_entry,
    decide_return,
    new_hold,
    quote,
    transfer,
)

T = "acme"
START = datetime(2025, 1, 1, tzinfo=UTC)
ACCOUNTS = (
    Account(tenant_id=T, code="cash", currency="USD", kind=AccountKind.ASSET),
    Account(tenant_id=T, code="float", currency="USD", kind=AccountKind.ASSET, floor=0),
    Account(tenant_id=T, code="wallet:b1", currency="USD", kind=AccountKind.LIABILITY, floor=0),
    Account(
        tenant_id=T, code="wallet:b2", currency="USD", kind=AccountKind.LIABILITY, floor=-5_000
    ),
    Account(tenant_id=T, code="payable:s1", currency="USD", kind=AccountKind.LIABILITY, floor=0),
    Account(tenant_id=T, code="payable:s2", currency="USD", kind=AccountKind.LIABILITY),
    Account(tenant_id=T, code="revenue", currency="USD", kind=AccountKind.REVENUE),
    Account(tenant_id=T, code="cash-eur", currency="EUR", kind=AccountKind.ASSET),
    Account(tenant_id=T, code="wallet-eur:b1", currency="EUR", kind=AccountKind.LIABILITY, floor=0),
    Account(tenant_id=T, code="revenue-eur", currency="EUR", kind=AccountKind.REVENUE),
)
BY_CODE = {account.code: account for account in ACCOUNTS}
CODES = tuple(BY_CODE)
CODES_IN = {
    currency: tuple(a.code for a in ACCOUNTS if a.currency == currency)
    for currency in ("USD", "EUR")
}
WALLETS = ("wallet:b1", "wallet:b2")
PAYABLES = ("payable:s1", "payable:s2")
RETURN_WINDOW = timedelta(hours=2)

amounts = st.integers(min_value=1, max_value=20_000)


@dataclass
class ModelHold:
    debit: str
    credit: str
    amount: int
    expires_at: datetime
    status: HoldStatus = HoldStatus.PENDING


@dataclass
class Charge:
    entry: Entry
    buyer: str
    delivered_at: datetime


def _net(postings: Iterable[Posting]) -> dict[str, int]:
    net: dict[str, int] = {}
    for posting in postings:
        net[posting.account] = net.get(posting.account, 0) + posting.amount
    return net


class LedgerMachine(RuleBasedStateMachine):
    trusting = False
    """True: take the book's word on what it accepts (no outcome predictions), so
    that only the invariants judge it."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger = Ledger(T, ACCOUNTS)
        self.now = START
        self.counter = 0
        self.accepted: list[EntryDraft] = []  # the model's own record, in order
        self.entries: list[Entry] = []  # what the book returned for them
        self.reversed: dict[str, dict[str, int]] = {}
        self.holds: dict[str, ModelHold] = {}
        self.charges: list[Charge] = []

    # --- the model ---------------------------------------------------------------

    def key(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}-{self.counter}"

    def signed(self, code: str) -> int:
        return sum(p.amount for d in self.accepted for p in d.postings if p.account == code)

    def reserved(self, code: str, *, excluding: str | None = None) -> int:
        account = BY_CODE[code]
        debit_normal = account.kind in (AccountKind.ASSET, AccountKind.EXPENSE)
        total = 0
        for hold_id, hold in self.holds.items():
            if hold_id == excluding or hold.status is not HoldStatus.PENDING:
                continue
            if self.now >= hold.expires_at:
                continue
            if hold.debit == code and not debit_normal:
                total += hold.amount
            if hold.credit == code and debit_normal:
                total += hold.amount
        return total

    def normal(self, code: str, signed: int) -> int:
        account = BY_CODE[code]
        return signed if account.kind in (AccountKind.ASSET, AccountKind.EXPENSE) else -signed

    def available(self, code: str, *, excluding: str | None = None) -> int:
        return self.normal(code, self.signed(code)) - self.reserved(code, excluding=excluding)

    def expected_problems(self, draft: EntryDraft, *, releasing: str | None = None) -> set[str]:
        codes: set[str] = set()
        if len(draft.postings) < 2:
            codes.add("ledger.invalid_entry")
        sums: dict[str, int] = {}
        for posting in draft.postings:
            if posting.amount == 0:
                codes.add("ledger.invalid_amount")
                continue
            sums[posting.currency] = sums.get(posting.currency, 0) + posting.amount
            account = BY_CODE.get(posting.account)
            if account is None:
                codes.add("ledger.unknown_account")
            elif account.currency != posting.currency:
                codes.add("ledger.currency_mismatch")
        if any(total != 0 for total in sums.values()):
            codes.add("ledger.unbalanced")
        known = {entry.id for entry in self.entries}
        if draft.reverses is not None and draft.reverses not in known:
            codes.add("ledger.unknown_entry")
        if codes:
            return codes
        net = _net(draft.postings)
        if draft.reverses is not None:
            original = _net(next(e for e in self.entries if e.id == draft.reverses).postings)
            done = self.reversed.get(draft.reverses, {})
            for code, delta in net.items():
                moved = original.get(code, 0)
                mirrors = moved != 0 and (moved > 0) != (delta > 0)
                if delta and (not mirrors or abs(done.get(code, 0) + delta) > abs(moved)):
                    codes.add("ledger.over_reversal")
        for code, delta in net.items():
            floor = BY_CODE[code].floor
            lowered = self.normal(code, delta)
            short = floor is not None and lowered < 0
            if short and self.available(code, excluding=releasing) + lowered < (floor or 0):
                codes.add("ledger.floor_crossed")
        return codes

    def record(self, draft: EntryDraft, entry: Entry) -> None:
        self.accepted.append(draft)
        self.entries.append(entry)
        if draft.reverses is not None:
            tally = self.reversed.setdefault(draft.reverses, {})
            for code, delta in _net(draft.postings).items():
                tally[code] = tally.get(code, 0) + delta

    def post(self, draft: EntryDraft, *, releasing: str | None = None) -> Entry | None:
        """Post `draft`, asserting the book does exactly what the model predicts."""
        if self.trusting:
            try:
                entry = self.ledger.post(draft, at=self.now)
            except LedgerError:
                return None
            self.record(draft, entry)
            return entry
        expected = self.expected_problems(draft, releasing=releasing)
        if expected:
            event("entry refused: " + ", ".join(sorted(expected)))
            before = self.ledger.snapshot()
            with pytest.raises(LedgerError) as refused:
                self.ledger.post(draft, at=self.now)
            assert {p.code for p in refused.value.problems} == expected
            assert self.ledger.snapshot() == before
            return None
        entry = self.ledger.post(draft, at=self.now)
        event(
            f"entry accepted: {draft.reference.kind.value}"
            + (" reversal" if draft.reverses else "")
        )
        self.record(draft, entry)
        return entry

    def draft(self, prefix: str, postings: Iterable[Posting], **extra: object) -> EntryDraft:
        return EntryDraft(
            tenant_id=T,
            idempotency_key=self.key(prefix),
            description=prefix,
            reference=extra.pop("reference", Reference(kind=ReferenceKind.RUN, id=prefix)),  # type: ignore[arg-type]
            postings=tuple(postings),
            **extra,  # type: ignore[arg-type]
        )

    # --- rules -------------------------------------------------------------------

    @initialize()
    def fund_the_buyers(self) -> None:
        for wallet in WALLETS:
            self.top_up(wallet, 10_000)

    @rule(wallet=st.sampled_from((*WALLETS, "wallet-eur:b1", "float")), amount=amounts)
    def top_up(self, wallet: str, amount: int) -> None:
        currency = BY_CODE[wallet].currency
        cash = "cash" if currency == "USD" else "cash-eur"
        debit_account, credit_account = (cash, wallet) if wallet != "float" else (wallet, "revenue")
        self.post(
            transfer(
                tenant_id=T,
                idempotency_key=self.key("top-up"),
                debit_account=debit_account,
                credit_account=credit_account,
                amount=amount,
                currency=currency,
                reference=Reference(kind=ReferenceKind.TOP_UP, id=wallet),
                description="top-up",
            )
        )

    @rule(
        buyer=st.sampled_from(WALLETS),
        seller=st.sampled_from(PAYABLES),
        price=st.integers(min_value=0, max_value=15_000),
        bps=st.integers(min_value=0, max_value=10_000),
        rounding=st.sampled_from(Rounding),
    )
    def charge(self, buyer: str, seller: str, price: int, bps: int, rounding: Rounding) -> None:
        priced = quote(
            PriceRule(
                pool="leads", currency="USD", price=price, take_rate_bps=bps, rounding=rounding
            )
        )
        assert priced.charge == priced.payout + priced.fee
        draft = charge_entry(
            priced,
            AssignmentAccounts(
                buyer_wallet=buyer, seller_payable=seller, platform_revenue="revenue"
            ),
            tenant_id=T,
            idempotency_key=self.key("charge"),
            reference=Reference(kind=ReferenceKind.DECISION, id="d"),
        )
        if draft is None:
            assert price == 0
            return
        entry = self.post(draft)
        if entry is not None:
            self.charges.append(Charge(entry=entry, buyer=buyer, delivered_at=self.now))

    @rule(
        currency=st.sampled_from(("USD", "EUR")),
        legs=st.lists(
            st.tuples(st.integers(min_value=0), st.integers(min_value=-20_000, max_value=20_000)),
            min_size=1,
            max_size=3,
        ),
        closing=st.integers(min_value=0),
        flaw=st.sampled_from(("none", "none", "none", "unbalance", "mismatch", "zero", "unknown")),
    )
    def arbitrary_entry(
        self, currency: str, legs: list[tuple[int, int]], closing: int, flaw: str
    ) -> None:
        """Legs on accounts of one currency (by index), closed to balance, maybe broken."""
        codes = CODES_IN[currency]
        postings = [
            Posting(account=codes[index % len(codes)], amount=amount, currency=currency)
            for index, amount in legs
        ]
        total = sum(amount for _, amount in legs)
        if total:
            closing_code = codes[closing % len(codes)]
            postings.append(Posting(account=closing_code, amount=-total, currency=currency))
        if flaw == "unbalance":
            postings[0] = Posting(
                account=postings[0].account, amount=postings[0].amount + 1, currency=currency
            )
        elif flaw == "mismatch":
            other = "EUR" if currency == "USD" else "USD"
            postings += [
                Posting(account="cash", amount=7, currency=other),
                Posting(account="revenue", amount=-7, currency=other),
            ]
        elif flaw == "zero":
            postings.append(Posting(account="cash", amount=0, currency=currency))
        elif flaw == "unknown":
            postings.append(Posting(account="nowhere", amount=3, currency=currency))
            postings.append(Posting(account="cash", amount=-3, currency=currency))
        self.post(self.draft("entry", postings))

    @rule(
        pair=st.sampled_from(
            (
                ("wallet:b1", "payable:s1"),
                ("wallet:b2", "payable:s2"),
                ("wallet:b1", "revenue"),
                ("payable:s2", "float"),
                ("wallet:b1", "wallet-eur:b1"),
            )
        ),
        amount=amounts,
        ttl=st.integers(min_value=1, max_value=90),
    )
    def place_hold(self, pair: tuple[str, str], amount: int, ttl: int) -> None:
        debit_account, credit_account = pair
        hold_id = self.key("hold")
        hold = new_hold(
            id=hold_id,
            tenant_id=T,
            debit_account=debit_account,
            credit_account=credit_account,
            amount=amount,
            currency="USD",
            now=self.now,
            expires_at=self.now + timedelta(minutes=ttl),
        )
        if self.trusting:
            try:
                self.ledger.place_hold(hold)
            except SettlementError:
                return
            self.holds[hold_id] = ModelHold(
                debit=debit_account,
                credit=credit_account,
                amount=amount,
                expires_at=hold.expires_at,
            )
            return
        expected: set[str] = set()
        if BY_CODE[credit_account].currency != "USD":
            expected.add("ledger.currency_mismatch")
        else:
            for code, signed in ((debit_account, amount), (credit_account, -amount)):
                lowered = self.normal(code, signed)
                floor = BY_CODE[code].floor
                if floor is not None and lowered < 0 and self.available(code) + lowered < floor:
                    expected.add("ledger.floor_crossed")
        if expected:
            event("place hold refused: " + ", ".join(sorted(expected)))
            self.refused(expected, lambda: self.ledger.place_hold(hold))
            return
        self.ledger.place_hold(hold)
        event("place hold accepted")
        self.holds[hold_id] = ModelHold(
            debit=debit_account, credit=credit_account, amount=amount, expires_at=hold.expires_at
        )

    def refused(self, expected: set[str], call: Callable[[], object]) -> None:
        """`call` must raise exactly the `expected` codes and leave the book as it was."""
        before = self.ledger.snapshot()
        if self.trusting:
            with contextlib.suppress(SettlementError):
                call()
            return
        with pytest.raises(SettlementError) as caught:
            call()
        error = caught.value
        codes = {p.code for p in error.problems} if isinstance(error, LedgerError) else {error.code}
        assert codes == expected
        assert self.ledger.snapshot() == before

    def hold_outcome(self, hold: ModelHold) -> str | None:
        if hold.status is HoldStatus.EXPIRED or (
            hold.status is HoldStatus.PENDING and self.now >= hold.expires_at
        ):
            return "hold.expired"
        if hold.status.final:
            return "hold.already_final"
        return None

    @precondition(lambda self: bool(self.holds))
    @rule(
        data=st.data(),
        part=st.one_of(st.just(1.0), st.floats(min_value=0.0, max_value=1.2)),
    )
    def post_hold(self, data: st.DataObject, part: float) -> None:
        hold_id = data.draw(st.sampled_from(sorted(self.holds)))
        hold = self.holds[hold_id]
        amount = max(1, round(hold.amount * part))
        if self.trusting:
            try:
                _, entry = self.ledger.post_hold(hold_id, at=self.now, amount=amount)
            except SettlementError:
                return
            self.record(entry.draft(), entry)
            hold.status = HoldStatus.POSTED
            return
        expected = self.hold_outcome(hold)
        if expected is None and amount > hold.amount:
            expected = "hold.amount_exceeded"
        if expected is not None:
            event(f"post hold refused: {expected}")
            self.refused(
                {expected}, lambda: self.ledger.post_hold(hold_id, at=self.now, amount=amount)
            )
            return
        # Within its own reservation a post always fits the floors.
        final, entry = self.ledger.post_hold(hold_id, at=self.now, amount=amount)
        event("post hold: " + ("full" if amount == hold.amount else "partial"))
        draft = entry.draft()
        assert not self.expected_problems(draft, releasing=hold_id)
        assert final.posted_amount == amount
        assert final.entry_id == entry.id
        self.record(draft, entry)
        hold.status = HoldStatus.POSTED

    @precondition(lambda self: bool(self.holds))
    @rule(data=st.data())
    def void_hold(self, data: st.DataObject) -> None:
        hold_id = data.draw(st.sampled_from(sorted(self.holds)))
        hold = self.holds[hold_id]
        if self.trusting:
            try:
                self.ledger.void_hold(hold_id, at=self.now)
            except SettlementError:
                return
            hold.status = HoldStatus.VOIDED
            return
        expected = self.hold_outcome(hold)
        if expected is not None:
            event(f"void hold refused: {expected}")
            self.refused({expected}, lambda: self.ledger.void_hold(hold_id, at=self.now))
            return
        self.ledger.void_hold(hold_id, at=self.now)
        event("void hold")
        hold.status = HoldStatus.VOIDED

    @rule(minutes=st.integers(min_value=0, max_value=150))
    def advance_time(self, minutes: int) -> None:
        self.now += timedelta(minutes=minutes)

    @rule()
    def expire_holds(self) -> None:
        expired = {hold.id for hold in self.ledger.expire_holds(self.now)}
        predicted = {
            hold_id
            for hold_id, hold in self.holds.items()
            if hold.status is HoldStatus.PENDING and self.now >= hold.expires_at
        }
        assert expired == predicted
        if expired:
            event("holds expired")
        for hold_id in expired:
            self.holds[hold_id].status = HoldStatus.EXPIRED

    def left(self, entry: Entry) -> tuple[int, set[str]]:
        """Micros left to reverse on the entry's debit side, and the currencies left."""
        done = self.reversed.get(entry.id, {})
        left = {code: net + done.get(code, 0) for code, net in _net(entry.postings).items()}
        currencies = {p.currency for p in entry.postings if left.get(p.account)}
        return sum(v for v in left.values() if v > 0), currencies

    @precondition(lambda self: bool(self.entries))
    @rule(data=st.data(), share=st.one_of(st.none(), st.integers(min_value=1, max_value=30_000)))
    def reverse_an_entry(self, data: st.DataObject, share: int | None) -> None:
        entry = data.draw(st.sampled_from(self.entries))
        remaining, currencies = self.left(entry)
        key = self.key("rev")
        if self.trusting:
            try:
                reversal = self.ledger.reversal(entry.id, idempotency_key=key, amount=share)
            except SettlementError:
                return
            self.post(reversal)
            return
        expected = None
        if remaining == 0 or (share is not None and len(currencies) > 1):
            expected = "ledger.invalid_entry"
        elif share is not None and share > remaining:
            expected = "ledger.invalid_amount"
        if expected is not None:
            event(f"reversal refused: {expected}")
            self.refused(
                {expected},
                lambda: self.ledger.reversal(entry.id, idempotency_key=key, amount=share),
            )
            return
        draft = self.ledger.reversal(entry.id, idempotency_key=key, amount=share)
        if len(currencies) == 1:
            taken = -sum(p.amount for p in draft.postings if p.amount < 0)
            assert taken == (remaining if share is None else share)
        self.post(draft)

    @precondition(lambda self: bool(self.entries))
    @rule(data=st.data(), extra=st.integers(min_value=1, max_value=5))
    def greedy_reversal(self, data: st.DataObject, extra: int) -> None:
        """A hand-made reversal of what is left, `extra` micros heavier on two legs."""
        entry = data.draw(st.sampled_from(self.entries))
        done = self.reversed.get(entry.id, {})
        postings = [
            Posting(
                account=code, amount=-(net + done.get(code, 0)), currency=BY_CODE[code].currency
            )
            for code, net in _net(entry.postings).items()
            if net + done.get(code, 0)
        ]
        if len(postings) < 2 or postings[0].currency != postings[1].currency:
            return
        first, second = postings[0], postings[1]
        sign = 1 if first.amount > 0 else -1
        postings[0] = Posting(
            account=first.account, amount=first.amount + sign * extra, currency=first.currency
        )
        postings[1] = Posting(
            account=second.account, amount=second.amount - sign * extra, currency=second.currency
        )
        self.post(self.draft("greedy", postings, reverses=entry.id))

    @precondition(lambda self: bool(self.charges))
    @rule(
        data=st.data(),
        credit_bps=st.sampled_from((10_000, 5_000, 3_333)),
        amount=st.one_of(st.none(), st.integers(min_value=1, max_value=15_000)),
    )
    def return_a_charge(self, data: st.DataObject, credit_bps: int, amount: int | None) -> None:
        charge = data.draw(st.sampled_from(self.charges))
        decision = decide_return(
            ReturnPolicy(window=RETURN_WINDOW, credit_bps=credit_bps),
            AssignmentFacts(
                assignment_id=charge.entry.id,
                routable_id="lead",
                pool="leads",
                buyer=charge.buyer,
                buyer_account=charge.buyer,
                delivered_at=charge.delivered_at,
                charge_entry=charge.entry,
                already_reversed=dict(self.reversed.get(charge.entry.id, {})),
            ),
            now=self.now,
            stats=ReturnStats(assignments=0, returns=0),
            reason="bad",
            return_id=self.key("ret"),
            amount=amount,
        )
        remaining, _ = self.left(charge.entry)
        if remaining == 0:
            expected = "return.already_returned"
        elif self.now >= charge.delivered_at + RETURN_WINDOW:
            expected = "return.window_closed"
        elif amount is not None and amount > remaining:
            expected = "return.invalid_amount"
        else:
            expected = "credit"
        if isinstance(decision, ReturnRefusal):
            event(f"return refused: {decision.code}")
            assert decision.code == expected
            return
        assert isinstance(decision, ReturnCredit)
        assert expected == "credit"
        assert 0 < decision.amount <= remaining
        assert decision.reroute is not None
        assert decision.reroute.exclude == (charge.buyer,)
        self.post(decision.entry)

    @precondition(lambda self: bool(self.entries))
    @rule(data=st.data(), tamper=st.booleans())
    def replay(self, data: st.DataObject, tamper: bool) -> None:
        entry = data.draw(st.sampled_from(self.entries))
        draft = entry.draft()
        if tamper:
            changed = msgspec.structs.replace(draft, description=draft.description + " (changed)")
            self.refused(
                {"ledger.idempotency_conflict"}, lambda: self.ledger.post(changed, at=self.now)
            )
            return
        before = self.ledger.snapshot()
        assert self.ledger.post(draft, at=self.now + timedelta(days=1)) == entry
        assert self.ledger.snapshot() == before

    # --- invariants --------------------------------------------------------------

    @invariant()
    def entries_are_balanced_in_their_accounts_currencies(self) -> None:
        assert list(self.ledger.entries) == self.entries
        for entry in self.ledger.entries:
            sums: dict[str, int] = {}
            for posting in entry.postings:
                assert posting.amount != 0
                assert BY_CODE[posting.account].currency == posting.currency
                sums[posting.currency] = sums.get(posting.currency, 0) + posting.amount
            assert all(total == 0 for total in sums.values()), entry
        assert set(self.ledger.trial_balance().values()) == {0}

    @invariant()
    def balances_are_the_sums_of_their_postings(self) -> None:
        for code in CODES:
            assert self.ledger.signed_balance(code) == self.signed(code), code

    @invariant()
    def no_floor_is_crossed(self) -> None:
        for code in CODES:
            available = self.available(code)
            if not self.trusting:
                assert self.ledger.available(code, at=self.now) == available, code
            floor = BY_CODE[code].floor
            if floor is not None:
                assert available >= floor, (code, available, floor)

    @invariant()
    def reversals_never_exceed_what_an_entry_moved(self) -> None:
        for entry in self.entries:
            moved = _net(entry.postings)
            for code, taken in self.ledger.reversed_amounts(entry.id).items():
                if taken:
                    assert (moved.get(code, 0) > 0) != (taken > 0), (entry.id, code)
                    assert abs(taken) <= abs(moved.get(code, 0)), (entry.id, code)

    @invariant()
    def hold_statuses_match_the_model(self) -> None:
        assert {h.id: h.status for h in self.ledger.holds} == {
            hold_id: hold.status for hold_id, hold in self.holds.items()
        }


LedgerMachine.TestCase.settings = settings(
    max_examples=80,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_ledger_stays_sound = LedgerMachine.TestCase


class TrustingMachine(LedgerMachine):
    trusting = True


def _without_unbalanced(check: Callable[..., Any]) -> Callable[..., Any]:
    def broken(self: Ledger, draft: EntryDraft, at: datetime, releasing: str | None) -> Any:
        problems, deltas = check(self, draft, at, releasing)
        kept = [p for p in problems if p.code != "ledger.unbalanced"]
        if kept or deltas:
            return kept, deltas
        for posting in draft.postings:
            deltas[posting.account] = deltas.get(posting.account, 0) + posting.amount
        return kept, deltas

    return broken


BREAKS: dict[str, tuple[str, Callable[[], Callable[..., Any]], str]] = {
    # break -> (the Ledger method replaced, its replacement, the invariant that must fail)
    "balance check dropped": (
        "_check",
        lambda: _without_unbalanced(Ledger._check),
        "entries_are_balanced_in_their_accounts_currencies",
    ),
    "floor check dropped": ("_floor_problem", lambda: lambda *_, **__: None, "no_floor_is_crossed"),
    "holds ignored": ("_reserved", lambda: lambda *_, **__: 0, "no_floor_is_crossed"),
    "over-reversal check dropped": (
        "_reversal_problems",
        lambda: lambda *_, **__: [],
        "reversals_never_exceed_what_an_entry_moved",
    ),
}


@pytest.mark.parametrize("name", list(BREAKS))
def test_a_broken_check_is_caught(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each check of the book, broken, makes the property fail through an invariant
    (with no outcome predictions to give it away)."""
    method, replacement, invariant = BREAKS[name]
    monkeypatch.setattr(Ledger, method, replacement())
    with pytest.raises(AssertionError) as failed:
        run_state_machine_as_test(
            TrustingMachine,
            settings=settings(
                max_examples=300,
                stateful_step_count=50,
                deadline=None,
                derandomize=True,
                database=None,
                phases=(Phase.generate,),
                suppress_health_check=list(HealthCheck),
            ),
        )
    assert invariant in {entry.name for entry in failed.traceback}, failed.getrepr()


def test_the_trusting_machine_passes_on_a_sound_book() -> None:
    """Without a break, the invariants alone hold (so the failures above are the breaks')."""
    run_state_machine_as_test(
        TrustingMachine,
        settings=settings(
            max_examples=30,
            stateful_step_count=50,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
