"""The ledger book: balance, currencies, floors, idempotency, reversals, snapshots."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest

from ductor_settlement.errors import (
    AccountConflict,
    CurrencyMismatch,
    FloorCrossed,
    IdempotencyConflict,
    InvalidAccount,
    InvalidAmount,
    InvalidEntry,
    InvalidTime,
    OverReversal,
    Unbalanced,
    UnknownAccount,
    UnknownEntry,
)
from ductor_settlement.ledger import (
    Account,
    AccountKind,
    Entry,
    EntryDraft,
    Ledger,
    LedgerSnapshot,
    NormalBalance,
    Posting,
    Reference,
    ReferenceKind,
    credit,
    debit,
    entry_id_for,
    reverse,
    transfer,
)
from ductor_settlement.money import MAX_MICROS

T = "acme"
NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
REF = Reference(kind=ReferenceKind.DECISION, id="dec-1")


def account(
    code: str,
    kind: AccountKind = AccountKind.LIABILITY,
    *,
    currency: str = "USD",
    floor: int | None = None,
) -> Account:
    return Account(tenant_id=T, code=code, currency=currency, kind=kind, floor=floor)


def book() -> Ledger:
    return Ledger(
        T,
        [
            account("cash", AccountKind.ASSET),
            account("cash-eur", AccountKind.ASSET, currency="EUR"),
            account("wallet", floor=0),
            account("wallet-eur", currency="EUR", floor=0),
            account("credit-line", floor=-50),
            account("payable", floor=0),
            account("revenue", AccountKind.REVENUE),
        ],
    )


def draft(
    key: str,
    *postings: Posting,
    tenant_id: str = T,
    reference: Reference = REF,
    reverses: str | None = None,
    corrects: str | None = None,
) -> EntryDraft:
    return EntryDraft(
        tenant_id=tenant_id,
        idempotency_key=key,
        description=f"entry {key}",
        reference=reference,
        postings=postings,
        reverses=reverses,
        corrects=corrects,
    )


def top_up(ledger: Ledger, amount: int, *, wallet: str = "wallet", key: str = "top-up") -> Entry:
    return ledger.post(
        transfer(
            tenant_id=T,
            idempotency_key=key,
            debit_account="cash",
            credit_account=wallet,
            amount=amount,
            currency="USD",
            reference=Reference(kind=ReferenceKind.TOP_UP, id=key),
            description="top-up",
        ),
        at=NOW,
    )


def charge(ledger: Ledger, key: str, price: int, fee: int) -> Entry:
    legs = [debit("wallet", price, "USD"), credit("payable", price - fee, "USD")]
    if fee:
        legs.append(credit("revenue", fee, "USD"))
    return ledger.post(draft(key, *legs), at=NOW)


# --- accounts ------------------------------------------------------------------


def test_kinds_have_their_usual_normal_balance_and_contra_accounts_override_it() -> None:
    assert account("a", AccountKind.ASSET).normal_balance is NormalBalance.DEBIT
    assert account("e", AccountKind.EXPENSE).normal_balance is NormalBalance.DEBIT
    for kind in (AccountKind.LIABILITY, AccountKind.EQUITY, AccountKind.REVENUE):
        assert account("x", kind).normal_balance is NormalBalance.CREDIT
    contra = Account(
        tenant_id=T,
        code="returns",
        currency="USD",
        kind=AccountKind.REVENUE,
        normal=NormalBalance.DEBIT,
    )
    assert contra.normal_balance is NormalBalance.DEBIT


def test_opening_the_same_account_twice_is_a_no_op_but_different_attributes_conflict() -> None:
    ledger = book()
    assert ledger.open_account(account("wallet", floor=0)) == account("wallet", floor=0)
    with pytest.raises(AccountConflict) as caught:
        ledger.open_account(account("wallet", floor=-10))
    assert caught.value.code == "ledger.account_conflict"
    assert caught.value.problems[0].account == "wallet"


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        (Account(tenant_id="other", code="x", currency="USD", kind=AccountKind.ASSET), "tenant"),
        (Account(tenant_id=T, code="", currency="USD", kind=AccountKind.ASSET), "code"),
        # A code is an id, named in paths and logs, as a worker id (a wallet's suffix).
        (
            Account(tenant_id=T, code="   ", currency="USD", kind=AccountKind.ASSET),
            "account code must not be blank",
        ),
        *(
            (
                Account(tenant_id=T, code=f"wallet:a{c}b", currency="USD", kind=AccountKind.ASSET),
                "account code must not hold a control character",
            )
            for c in ("\n", "\r", "\t", "\x1b", "\x7f")
        ),
        (Account(tenant_id=T, code="x", currency="usd", kind=AccountKind.ASSET), "currency"),
        (
            Account(tenant_id=T, code="x", currency="USD", kind=AccountKind.ASSET, floor=2**60),
            "floor",
        ),
        (
            Account(tenant_id=T, code="x", currency="USD", kind=AccountKind.ASSET, name="n" * 257),
            "account name must be at most 256 characters",
        ),
    ],
)
def test_an_invalid_account_is_refused_with_the_reason(bad: Account, fragment: str) -> None:
    with pytest.raises(InvalidAccount) as caught:
        Ledger(T).open_account(bad)
    assert caught.value.code == "ledger.invalid_account"
    assert fragment in str(caught.value)


# --- posting -------------------------------------------------------------------


def test_a_balanced_entry_moves_balances_shown_in_each_accounts_normal_direction() -> None:
    ledger = book()
    top_up(ledger, 100_000_000)
    entry = charge(ledger, "charge-1", 30_000_000, 6_000_000)
    assert entry.id == entry_id_for(T, "charge-1")
    assert entry.posted_at == NOW
    assert ledger.balance("cash") == 100_000_000
    assert ledger.balance("wallet") == 70_000_000
    assert ledger.signed_balance("wallet") == -70_000_000
    assert ledger.balance("payable") == 24_000_000
    assert ledger.balance("revenue") == 6_000_000
    assert ledger.trial_balance() == {"USD": 0, "EUR": 0}
    assert ledger.entries == (ledger.entry_for_key("top-up"), entry)


def test_an_unbalanced_entry_names_the_currency_and_the_imbalance() -> None:
    ledger = book()
    bad = draft(
        "k",
        debit("cash", 10, "USD"),
        credit("wallet", 7, "USD"),
        debit("cash-eur", 5, "EUR"),
        credit("wallet-eur", 9, "EUR"),
    )
    with pytest.raises(Unbalanced) as caught:
        ledger.post(bad, at=NOW)
    assert caught.value.code == "ledger.unbalanced"
    found = {(p.currency, p.amount) for p in caught.value.problems}
    assert found == {("USD", 3), ("EUR", -4)}
    assert "debits exceed credits by 0.000003 USD" in str(caught.value)
    assert ledger.entries == ()


def test_an_entry_in_two_currencies_balances_per_currency() -> None:
    ledger = book()
    ledger.post(
        draft(
            "fx",
            debit("cash", 10, "USD"),
            credit("wallet", 10, "USD"),
            debit("cash-eur", 9, "EUR"),
            credit("wallet-eur", 9, "EUR"),
        ),
        at=NOW,
    )
    assert ledger.trial_balance() == {"USD": 0, "EUR": 0}
    assert ledger.balance("wallet-eur") == 9


def test_a_posting_in_the_wrong_currency_names_the_account_and_posting() -> None:
    ledger = book()
    with pytest.raises(CurrencyMismatch) as caught:
        ledger.post(draft("k", debit("cash", 5, "EUR"), credit("wallet-eur", 5, "EUR")), at=NOW)
    problem = caught.value.problems[0]
    assert (problem.account, problem.currency, problem.posting) == ("cash", "EUR", 0)


def test_every_problem_is_reported_at_once() -> None:
    ledger = book()
    with pytest.raises(UnknownAccount) as caught:
        ledger.post(
            draft("k", debit("nowhere", 5, "USD"), credit("cash-eur", 4, "USD")),
            at=NOW,
        )
    codes = [p.code for p in caught.value.problems]
    assert codes == ["ledger.unknown_account", "ledger.currency_mismatch", "ledger.unbalanced"]
    assert caught.value.details["problems"][0]["account"] == "nowhere"


@pytest.mark.parametrize(
    ("postings", "tenant", "key", "fragment"),
    [
        ((debit("cash", 5, "USD"),), T, "k", "at least two postings"),
        ((debit("cash", 5, "USD"), credit("wallet", 5, "USD")), "other", "k", "tenant"),
        ((debit("cash", 5, "USD"), credit("wallet", 5, "USD")), T, "", "idempotency key"),
    ],
)
def test_a_malformed_entry_is_invalid(
    postings: tuple[Posting, ...], tenant: str, key: str, fragment: str
) -> None:
    with pytest.raises(InvalidEntry) as caught:
        book().post(draft(key, *postings, tenant_id=tenant), at=NOW)
    assert caught.value.code == "ledger.invalid_entry"
    assert fragment in str(caught.value)


def test_a_huge_entry_is_refused_with_one_problem_per_limit() -> None:
    legs = [debit("cash", 1, "USD")] * 100 + [credit("wallet", 100, "USD")]
    with pytest.raises(InvalidEntry) as caught:
        book().post(draft("k", *legs), at=NOW)
    assert [p.message for p in caught.value.problems] == [
        "an entry has at most 100 postings, this one has 101 (post several entries, or a batch)"
    ]
    # A hundred postings are fine: the limit is the count, not the amounts.
    ledger = book()
    ledger.post(draft("ok", *legs[:99], credit("wallet", 99, "USD")), at=NOW)
    assert ledger.balance("wallet") == 99
    long = msgspec.structs.replace(
        draft("k", debit("cash", 5, "USD"), credit("wallet", 5, "USD")),
        description="d" * 1001,
        reference=Reference(kind=ReferenceKind.RUN, id="r" * 257),
    )
    with pytest.raises(InvalidEntry) as caught:
        book().post(long, at=NOW)
    assert [p.message for p in caught.value.problems] == [
        "the description must be at most 1000 characters, this one has 1001",
        "the reference id must be at most 256 characters",
    ]


@pytest.mark.parametrize("amount", [0, MAX_MICROS + 1, True])
def test_a_zero_huge_or_non_integer_amount_is_invalid(amount: int) -> None:
    ledger = book()
    bad = draft(
        "k",
        Posting(account="cash", amount=amount, currency="USD"),
        Posting(account="wallet", amount=-amount, currency="USD"),
    )
    with pytest.raises(InvalidAmount) as caught:
        ledger.post(bad, at=NOW)
    assert caught.value.problems[0].posting == 0


def test_a_balance_that_would_leave_the_micros_range_is_refused() -> None:
    ledger = book()
    top_up(ledger, MAX_MICROS)
    with pytest.raises(InvalidAmount) as caught:
        top_up(ledger, 1, key="again")
    assert {p.account for p in caught.value.problems} == {"cash", "wallet"}


def test_overspending_a_wallet_crosses_its_floor_by_the_exact_shortfall() -> None:
    ledger = book()
    top_up(ledger, 10_000_000)
    with pytest.raises(FloorCrossed) as caught:
        charge(ledger, "too-much", 12_500_000, 0)
    problem = caught.value.problems[0]
    assert (problem.account, problem.currency, problem.amount) == ("wallet", "USD", 2_500_000)
    assert "2.500000 USD below its floor of 0.000000 USD" in problem.message
    assert ledger.balance("wallet") == 10_000_000


def test_a_credit_line_lets_an_account_go_down_to_its_negative_floor() -> None:
    ledger = book()
    spend = draft("spend", debit("credit-line", 50, "USD"), credit("revenue", 50, "USD"))
    ledger.post(spend, at=NOW)
    assert ledger.balance("credit-line") == -50
    with pytest.raises(FloorCrossed) as caught:
        ledger.post(
            draft("more", debit("credit-line", 1, "USD"), credit("revenue", 1, "USD")), at=NOW
        )
    assert caught.value.problems[0].amount == 1


def test_an_entry_that_raises_an_account_already_below_its_floor_is_accepted() -> None:
    snapshot = LedgerSnapshot(
        tenant_id=T,
        accounts=(account("cash", AccountKind.ASSET), account("wallet", floor=0)),
        balances={"cash": -5, "wallet": 5},  # wallet at -5, e.g. a floor raised later
    )
    ledger = Ledger.from_snapshot(snapshot)
    top_up(ledger, 3)
    assert ledger.balance("wallet") == -2


def test_the_same_key_and_content_returns_the_recorded_entry_and_changes_nothing() -> None:
    ledger = book()
    first = top_up(ledger, 100)
    later = datetime(2025, 3, 2, tzinfo=UTC)
    again = ledger.post(first.draft(), at=later)
    assert again is first
    assert again.posted_at == NOW
    assert ledger.balance("wallet") == 100
    assert ledger.check(first.draft(), at=later) == ()


def test_the_same_key_with_other_content_is_an_idempotency_conflict() -> None:
    ledger = book()
    top_up(ledger, 100)
    before = ledger.snapshot()
    with pytest.raises(IdempotencyConflict) as caught:
        top_up(ledger, 101)
    assert caught.value.code == "ledger.idempotency_conflict"
    assert "top-up" in str(caught.value)
    assert ledger.snapshot() == before


def test_check_lists_problems_without_posting() -> None:
    ledger = book()
    problems = ledger.check(draft("k", debit("wallet", 5, "USD"), credit("cash", 5, "USD")), at=NOW)
    assert [p.code for p in problems] == ["ledger.floor_crossed"]
    assert ledger.entries == ()


def test_a_failed_post_leaves_the_book_unchanged() -> None:
    ledger = book()
    top_up(ledger, 100)
    before = ledger.snapshot()
    with pytest.raises(FloorCrossed):
        charge(ledger, "c", 150, 10)
    assert ledger.snapshot() == before


def test_naive_times_are_refused() -> None:
    with pytest.raises(InvalidTime) as caught:
        book().post(
            draft("k", debit("cash", 1, "USD"), credit("wallet", 1, "USD")),
            at=datetime(2025, 1, 1),  # naive on purpose
        )
    assert caught.value.code == "settlement.naive_time"


def test_fingerprints_tell_equal_content_from_different_content() -> None:
    a = draft("k", debit("cash", 1, "USD"), credit("wallet", 1, "USD"))
    b = draft("k", debit("cash", 1, "USD"), credit("wallet", 1, "USD"))
    c = draft("k", debit("cash", 2, "USD"), credit("wallet", 2, "USD"))
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()
    assert a.fingerprint().startswith("sha256:")


# --- reversals -------------------------------------------------------------------


def test_a_full_reversal_mirrors_the_entry_and_restores_every_balance() -> None:
    ledger = book()
    top_up(ledger, 100)
    before = {a.code: ledger.balance(a.code) for a in ledger.accounts}
    entry = charge(ledger, "c", 60, 9)
    undo = ledger.post(reverse(entry, idempotency_key="undo"), at=NOW)
    assert undo.reverses == entry.id
    assert undo.reference == Reference(kind=ReferenceKind.REVERSAL, id=entry.id)
    assert {p.account: p.amount for p in undo.postings} == {
        "wallet": -60,
        "payable": 51,
        "revenue": 9,
    }
    assert {a.code: ledger.balance(a.code) for a in ledger.accounts} == before


def test_partial_reversals_split_without_losing_a_micro_and_add_up_to_the_entry() -> None:
    ledger = book()
    top_up(ledger, 100)
    entry = charge(ledger, "c", 7, 2)  # payable 5, revenue 2
    for n in range(3):
        part = ledger.reversal(entry.id, idempotency_key=f"part-{n}", amount=2)
        assert sum(p.amount for p in part.postings) == 0
        ledger.post(part, at=NOW)
    rest = ledger.reversal(entry.id, idempotency_key="rest")
    assert [p.amount for p in rest.postings if p.account == "wallet"] == [-1]
    ledger.post(rest, at=NOW)
    assert ledger.reversed_amounts(entry.id) == {"wallet": -7, "payable": 5, "revenue": 2}
    assert ledger.balance("wallet") == 100
    with pytest.raises(InvalidEntry):
        ledger.reversal(entry.id, idempotency_key="nothing-left")


def test_a_partial_reversal_larger_than_what_is_left_is_refused() -> None:
    ledger = book()
    top_up(ledger, 100)
    entry = charge(ledger, "c", 7, 2)
    with pytest.raises(InvalidAmount):
        ledger.reversal(entry.id, idempotency_key="r", amount=8)
    with pytest.raises(InvalidAmount):
        ledger.reversal(entry.id, idempotency_key="r", amount=0)


def test_a_partial_reversal_of_a_two_currency_entry_is_refused() -> None:
    ledger = book()
    fx = ledger.post(
        draft(
            "fx",
            debit("cash", 10, "USD"),
            credit("wallet", 10, "USD"),
            debit("cash-eur", 9, "EUR"),
            credit("wallet-eur", 9, "EUR"),
        ),
        at=NOW,
    )
    with pytest.raises(InvalidEntry, match="single-currency"):
        reverse(fx, idempotency_key="r", amount=5)
    ledger.post(reverse(fx, idempotency_key="r"), at=NOW)
    assert ledger.trial_balance() == {"USD": 0, "EUR": 0}
    assert ledger.balance("wallet-eur") == 0


def test_a_hand_made_reversal_that_takes_back_more_than_moved_is_refused() -> None:
    ledger = book()
    top_up(ledger, 100)
    entry = charge(ledger, "c", 10, 2)
    greedy = draft(
        "greedy",
        credit("wallet", 12, "USD"),
        debit("payable", 10, "USD"),
        debit("revenue", 2, "USD"),
        reverses=entry.id,
    )
    with pytest.raises(OverReversal) as caught:
        ledger.post(greedy, at=NOW)
    problem = caught.value.problems[0]
    assert (problem.account, problem.amount) == ("wallet", 2)
    assert problem.code == "ledger.over_reversal"


def test_a_reversal_that_does_not_mirror_the_entry_is_refused() -> None:
    ledger = book()
    top_up(ledger, 100)
    entry = charge(ledger, "c", 10, 2)
    sideways = draft(
        "sideways", credit("wallet", 3, "USD"), debit("cash", 3, "USD"), reverses=entry.id
    )
    with pytest.raises(OverReversal) as caught:
        ledger.post(sideways, at=NOW)
    assert [p.account for p in caught.value.problems] == ["cash"]


def test_links_to_unknown_entries_are_refused() -> None:
    ledger = book()
    legs = (debit("cash", 1, "USD"), credit("wallet", 1, "USD"))
    for link, bad in (
        ("reverses", draft("k1", *legs, reverses="ent_missing")),
        ("corrects", draft("k2", *legs, corrects="ent_missing")),
    ):
        with pytest.raises(UnknownEntry) as caught:
            ledger.post(bad, at=NOW)
        assert link in str(caught.value)
    with pytest.raises(UnknownEntry):
        ledger.entry("ent_missing")


def test_a_correction_links_to_the_entry_it_adjusts() -> None:
    ledger = book()
    top_up(ledger, 100)
    entry = charge(ledger, "c", 10, 2)
    fix = ledger.post(
        draft(
            "fix",
            debit("revenue", 1, "USD"),
            credit("payable", 1, "USD"),
            corrects=entry.id,
            reference=Reference(kind=ReferenceKind.ADJUSTMENT, id="ticket-9"),
        ),
        at=NOW,
    )
    assert fix.corrects == entry.id
    assert ledger.balance("payable") == 9


# --- snapshots -----------------------------------------------------------------


def test_a_snapshot_survives_json_and_rebuilds_the_same_book() -> None:
    ledger = book()
    top_up(ledger, 100)
    entry = charge(ledger, "c", 10, 2)
    ledger.post(ledger.reversal(entry.id, idempotency_key="r", amount=4), at=NOW)
    wire = msgspec.json.encode(ledger.snapshot())
    rebuilt = Ledger.from_snapshot(msgspec.json.decode(wire, type=LedgerSnapshot))
    assert rebuilt.snapshot() == ledger.snapshot()
    assert rebuilt.reversed_amounts(entry.id) == ledger.reversed_amounts(entry.id)
    # The rebuilt book still refuses what the original would refuse.
    with pytest.raises(InvalidAmount):
        rebuilt.reversal(entry.id, idempotency_key="r2", amount=7)


def test_a_snapshot_balance_for_an_unknown_account_is_refused() -> None:
    with pytest.raises(UnknownAccount):
        Ledger.from_snapshot(LedgerSnapshot(tenant_id=T, balances={"ghost": 5}))
