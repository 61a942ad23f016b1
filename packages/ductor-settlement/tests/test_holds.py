"""Two-phase holds: reserve, post in full or in part, void, expire."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ductor_settlement.errors import (
    CurrencyMismatch,
    FloorCrossed,
    HoldAlreadyFinal,
    HoldAmountExceeded,
    HoldConflict,
    HoldExpired,
    HoldInvalid,
    HoldNotFound,
    UnknownAccount,
)
from ductor_settlement.holds import (
    Hold,
    HoldStatus,
    expire_hold,
    new_hold,
    post_hold,
    void_hold,
)
from ductor_settlement.ledger import (
    Account,
    AccountKind,
    Ledger,
    Reference,
    ReferenceKind,
    transfer,
)

T = "acme"
NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
LATER = NOW + timedelta(minutes=5)
EXPIRY = NOW + timedelta(hours=1)


def book(wallet_funds: int = 100) -> Ledger:
    ledger = Ledger(
        T,
        [
            Account(tenant_id=T, code="cash", currency="USD", kind=AccountKind.ASSET),
            Account(
                tenant_id=T, code="wallet", currency="USD", kind=AccountKind.LIABILITY, floor=0
            ),
            Account(tenant_id=T, code="escrow", currency="USD", kind=AccountKind.LIABILITY),
            Account(tenant_id=T, code="eur", currency="EUR", kind=AccountKind.LIABILITY),
            Account(tenant_id=T, code="float", currency="USD", kind=AccountKind.ASSET, floor=0),
        ],
    )
    if wallet_funds:
        ledger.post(
            transfer(
                tenant_id=T,
                idempotency_key="fund",
                debit_account="cash",
                credit_account="wallet",
                amount=wallet_funds,
                currency="USD",
                reference=Reference(kind=ReferenceKind.TOP_UP, id="fund"),
                description="fund",
            ),
            at=NOW,
        )
    return ledger


def hold(
    amount: int = 60,
    *,
    id: str = "h1",
    debit_account: str = "wallet",
    credit_account: str = "escrow",
    currency: str = "USD",
    now: datetime = NOW,
    expires_at: datetime = EXPIRY,
) -> Hold:
    return new_hold(
        id=id,
        tenant_id=T,
        debit_account=debit_account,
        credit_account=credit_account,
        amount=amount,
        currency=currency,
        now=now,
        expires_at=expires_at,
        description="reserve for lead",
    )


# --- the pure transitions -------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"amount": 0}, "zero"),
        ({"amount": -5}, "negative"),
        ({"credit_account": "wallet"}, "same account"),
        ({"currency": "dollars"}, "currency"),
        ({"expires_at": NOW}, "not after now"),
        ({"id": ""}, "id must be 1 to 256 characters"),
        ({"id": "h" * 257}, "id must be 1 to 256 characters"),
        ({"id": "orders/42"}, "may not contain '/'"),
        ({"id": "   "}, "may not be blank"),
        ({"id": "order\n42"}, "control character"),
        ({"id": "order\x7f42"}, "control character"),
    ],
)
def test_a_malformed_hold_is_invalid(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(HoldInvalid) as caught:
        hold(**kwargs)  # type: ignore[arg-type]
    assert caught.value.code == "hold.invalid"
    assert fragment in str(caught.value)


def test_an_over_long_description_is_invalid_and_the_refusal_does_not_echo_a_huge_id() -> None:
    with pytest.raises(HoldInvalid) as caught:
        new_hold(
            id="h" * 20_000,
            tenant_id=T,
            debit_account="wallet",
            credit_account="escrow",
            amount=5,
            currency="USD",
            now=NOW,
            expires_at=EXPIRY,
            description="d" * 1001,
        )
    assert "description must be at most 1000 characters" in str(caught.value)
    assert len(str(caught.value)) < 1_000
    assert len(caught.value.details["hold"]) < 300


def test_post_void_and_expire_are_final_and_exclusive() -> None:
    pending = hold(60)
    posted = post_hold(pending, now=LATER, amount=25)
    assert (posted.status, posted.posted_amount, posted.released_amount) == (
        HoldStatus.POSTED,
        25,
        35,
    )
    assert posted.finalized_at == LATER
    voided = void_hold(pending, now=LATER)
    assert (voided.status, voided.released_amount) == (HoldStatus.VOIDED, 60)
    for final in (posted, voided):
        with pytest.raises(HoldAlreadyFinal) as caught:
            post_hold(final, now=LATER)
        assert caught.value.code == "hold.already_final"
        with pytest.raises(HoldAlreadyFinal):
            void_hold(final, now=LATER)
        assert expire_hold(final, now=EXPIRY + timedelta(days=1)) is final


def test_a_hold_expires_at_its_expiry_and_then_cannot_be_posted_or_voided() -> None:
    pending = hold()
    assert expire_hold(pending, now=EXPIRY - timedelta(microseconds=1)) is pending
    expired = expire_hold(pending, now=EXPIRY + timedelta(minutes=3))
    assert expired.status is HoldStatus.EXPIRED
    assert expired.finalized_at == EXPIRY
    for candidate in (pending, expired):
        with pytest.raises(HoldExpired) as caught:
            post_hold(candidate, now=EXPIRY)
        assert caught.value.code == "hold.expired"
        with pytest.raises(HoldExpired):
            void_hold(candidate, now=EXPIRY)


def test_posting_more_than_the_hold_or_nothing_is_refused() -> None:
    with pytest.raises(HoldAmountExceeded) as caught:
        post_hold(hold(60), now=LATER, amount=61)
    assert caught.value.details == {"hold": "h1", "requested": 61, "held": 60, "currency": "USD"}
    with pytest.raises(HoldInvalid):
        post_hold(hold(60), now=LATER, amount=0)


# --- holds in the book ----------------------------------------------------------


def test_a_pending_hold_reserves_funds_so_nothing_else_can_spend_them() -> None:
    ledger = book(100)
    ledger.place_hold(hold(60))
    assert ledger.balance("wallet") == 100
    assert ledger.pending("wallet") == 60
    assert ledger.available("wallet") == 40
    # The escrow receives a pending credit: that does not lower a credit-normal account.
    assert ledger.pending("escrow") == 0
    with pytest.raises(FloorCrossed) as caught:
        ledger.place_hold(hold(41, id="h2"))
    assert caught.value.problems[0].amount == 1
    spend = transfer(
        tenant_id=T,
        idempotency_key="spend",
        debit_account="wallet",
        credit_account="escrow",
        amount=41,
        currency="USD",
        reference=Reference(kind=ReferenceKind.RUN, id="r"),
        description="spend",
    )
    with pytest.raises(FloorCrossed):
        ledger.post(spend, at=LATER)


def test_a_hold_on_a_debit_normal_account_reserves_on_its_credit_side() -> None:
    ledger = book(0)
    # Crediting an asset lowers it, so the credit account's funds are reserved.
    with pytest.raises(FloorCrossed) as caught:
        ledger.place_hold(hold(10, debit_account="escrow", credit_account="float"))
    assert caught.value.problems[0].account == "float"


def test_posting_a_hold_in_full_writes_its_entry_and_releases_the_reservation() -> None:
    ledger = book(100)
    ledger.place_hold(hold(60))
    final, entry = ledger.post_hold("h1", at=LATER)
    assert final.status is HoldStatus.POSTED
    assert final.entry_id == entry.id
    assert entry.idempotency_key == "hold:h1:post"
    assert entry.reference == Reference(kind=ReferenceKind.HOLD, id="h1")
    assert {p.account: p.amount for p in entry.postings} == {"wallet": 60, "escrow": -60}
    assert (ledger.balance("wallet"), ledger.pending("wallet")) == (40, 0)
    assert ledger.balance("escrow") == 60
    assert ledger.hold("h1") == final


def test_posting_part_of_a_hold_moves_that_part_and_releases_the_rest() -> None:
    ledger = book(100)
    ledger.place_hold(hold(60))
    final, _ = ledger.post_hold("h1", at=LATER, amount=15)
    assert final.released_amount == 45
    assert ledger.available("wallet") == 85
    assert ledger.balance("escrow") == 15


def test_double_post_or_void_in_the_book_is_refused_and_changes_nothing() -> None:
    ledger = book(100)
    ledger.place_hold(hold(60))
    ledger.post_hold("h1", at=LATER)
    before = ledger.snapshot()
    with pytest.raises(HoldAlreadyFinal):
        ledger.post_hold("h1", at=LATER)
    with pytest.raises(HoldAlreadyFinal):
        ledger.void_hold("h1", at=LATER)
    assert ledger.snapshot() == before


def test_voiding_releases_everything_and_writes_no_entry() -> None:
    ledger = book(100)
    ledger.place_hold(hold(60))
    entries = ledger.entries
    voided = ledger.void_hold("h1", at=LATER)
    assert voided.status is HoldStatus.VOIDED
    assert ledger.available("wallet") == 100
    assert ledger.entries == entries


def test_an_expired_hold_stops_reserving_and_the_sweep_records_it() -> None:
    ledger = book(100)
    ledger.place_hold(hold(60))
    ledger.place_hold(hold(10, id="h2", expires_at=EXPIRY + timedelta(hours=1)))
    assert ledger.available("wallet", at=EXPIRY) == 90
    assert ledger.available("wallet") == 30  # without a time every pending hold counts
    with pytest.raises(HoldExpired):
        ledger.post_hold("h1", at=EXPIRY)
    assert ledger.hold("h1").status is HoldStatus.PENDING  # a failed call changes nothing
    expired = ledger.expire_holds(EXPIRY)
    assert [h.id for h in expired] == ["h1"]
    assert ledger.hold("h1").status is HoldStatus.EXPIRED
    assert ledger.available("wallet") == 90
    assert ledger.expire_holds(EXPIRY) == ()


def test_an_entry_after_expiry_may_spend_what_the_expired_hold_reserved() -> None:
    ledger = book(100)
    ledger.place_hold(hold(60))
    spend = transfer(
        tenant_id=T,
        idempotency_key="spend",
        debit_account="wallet",
        credit_account="escrow",
        amount=100,
        currency="USD",
        reference=Reference(kind=ReferenceKind.RUN, id="r"),
        description="spend",
    )
    with pytest.raises(FloorCrossed):
        ledger.post(spend, at=LATER)
    ledger.post(spend, at=EXPIRY)
    assert ledger.balance("wallet") == 0


def test_placing_the_same_hold_again_is_a_no_op_and_a_different_one_conflicts() -> None:
    ledger = book(100)
    first = ledger.place_hold(hold(60))
    assert ledger.place_hold(hold(60, now=LATER)) is first
    assert ledger.pending("wallet") == 60
    with pytest.raises(HoldConflict) as caught:
        ledger.place_hold(hold(61))
    assert caught.value.code == "hold.conflict"


def test_a_hold_on_unknown_or_foreign_currency_accounts_is_refused() -> None:
    ledger = book(100)
    with pytest.raises(UnknownAccount):
        ledger.place_hold(hold(5, credit_account="nowhere"))
    with pytest.raises(CurrencyMismatch):
        ledger.place_hold(hold(5, credit_account="eur"))
    with pytest.raises(HoldNotFound) as caught:
        ledger.post_hold("ghost", at=LATER)
    assert caught.value.code == "hold.not_found"
    assert ledger.holds == ()


def test_a_hold_for_another_tenant_is_refused() -> None:
    foreign = new_hold(
        id="x",
        tenant_id="other",
        debit_account="wallet",
        credit_account="escrow",
        amount=1,
        currency="USD",
        now=NOW,
        expires_at=EXPIRY,
    )
    with pytest.raises(HoldInvalid, match="tenant"):
        book().place_hold(foreign)
