"""Pricing: the split is exact, rounding is as documented, minimums hold."""

from __future__ import annotations

from datetime import UTC, datetime
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ductor_settlement.errors import InvalidCharge, InvalidPriceRule, NoPriceRule
from ductor_settlement.ledger import (
    Account,
    AccountKind,
    Ledger,
    Reference,
    ReferenceKind,
    transfer,
)
from ductor_settlement.money import MAX_MICROS
from ductor_settlement.pricing import (
    AssignmentAccounts,
    PriceBook,
    PriceRule,
    PriceSource,
    Rounding,
    apply_rate,
    assignment_postings,
    charge_entry,
    quote,
)

ACCOUNTS = AssignmentAccounts(
    buyer_wallet="wallet:b1", seller_payable="payable:s1", platform_revenue="revenue"
)


def fixed(price: int, bps: int = 2_000, **extra: object) -> PriceRule:
    return PriceRule(
        pool="leads",
        currency="USD",
        price=price,
        take_rate_bps=bps,
        **extra,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("amount", "bps", "rounding", "expected"),
    [
        (25, 2_000, Rounding.HALF_EVEN, 5),  # exact
        (25, 1_000, Rounding.HALF_EVEN, 2),  # 2.5 -> 2 (even)
        (35, 1_000, Rounding.HALF_EVEN, 4),  # 3.5 -> 4 (even)
        (26, 1_000, Rounding.HALF_EVEN, 3),  # 2.6 -> 3
        (24, 1_000, Rounding.HALF_EVEN, 2),  # 2.4 -> 2
        (26, 1_000, Rounding.FLOOR, 2),
        (21, 1_000, Rounding.CEILING, 3),
        (20, 1_000, Rounding.CEILING, 2),
        (1, 10_000, Rounding.FLOOR, 1),
        (7, 0, Rounding.CEILING, 0),
    ],
)
def test_fee_rounding_is_the_documented_one(
    amount: int, bps: int, rounding: Rounding, expected: int
) -> None:
    assert apply_rate(amount, bps, rounding) == expected


def test_a_fixed_price_is_split_into_payout_and_fee() -> None:
    q = quote(fixed(10_000_000, 2_500))
    assert (q.charge, q.payout, q.fee) == (10_000_000, 7_500_000, 2_500_000)
    assert not q.minimum_charge_applied
    assert not q.minimum_payout_applied


def test_the_routing_charge_is_used_and_the_minimum_charge_raises_it() -> None:
    rule = PriceRule(
        pool="auction",
        currency="USD",
        source=PriceSource.ROUTING,
        take_rate_bps=1_000,
        minimum_charge=5_000_000,
    )
    high = quote(rule, routing_charge=8_000_000)
    assert (high.charge, high.payout, high.fee) == (8_000_000, 7_200_000, 800_000)
    low = quote(rule, routing_charge=1_000_000)
    assert (low.base, low.charge, low.fee) == (1_000_000, 5_000_000, 500_000)
    assert low.minimum_charge_applied


def test_the_fee_yields_to_the_minimum_payout() -> None:
    q = quote(fixed(1_000_000, 5_000, minimum_charge=900_000, minimum_payout=900_000))
    assert (q.charge, q.payout, q.fee) == (1_000_000, 900_000, 100_000)
    assert q.minimum_payout_applied


def test_postings_debit_the_buyer_and_credit_seller_and_platform() -> None:
    q = quote(fixed(10_000_000, 2_500))
    postings = assignment_postings(q, ACCOUNTS)
    assert {p.account: p.amount for p in postings} == {
        "wallet:b1": 10_000_000,
        "payable:s1": -7_500_000,
        "revenue": -2_500_000,
    }
    assert [p.amount for p in assignment_postings(quote(fixed(10, 0)), ACCOUNTS)] == [10, -10]
    assert assignment_postings(quote(fixed(0)), ACCOUNTS) == ()


def test_a_charge_entry_posts_to_a_book() -> None:
    tenant, now = "acme", datetime(2025, 1, 1, tzinfo=UTC)
    ledger = Ledger(
        tenant,
        [
            Account(tenant_id=tenant, code="cash", currency="USD", kind=AccountKind.ASSET),
            Account(
                tenant_id=tenant,
                code="wallet:b1",
                currency="USD",
                kind=AccountKind.LIABILITY,
                floor=0,
            ),
            Account(
                tenant_id=tenant, code="payable:s1", currency="USD", kind=AccountKind.LIABILITY
            ),
            Account(tenant_id=tenant, code="revenue", currency="USD", kind=AccountKind.REVENUE),
        ],
    )
    ledger.post(
        transfer(
            tenant_id=tenant,
            idempotency_key="fund",
            debit_account="cash",
            credit_account="wallet:b1",
            amount=20_000_000,
            currency="USD",
            reference=Reference(kind=ReferenceKind.TOP_UP, id="fund"),
            description="fund",
        ),
        at=now,
    )
    reference = Reference(kind=ReferenceKind.DECISION, id="dec-7")
    entry = charge_entry(
        quote(fixed(10_000_000, 2_500)),
        ACCOUNTS,
        tenant_id=tenant,
        idempotency_key="charge:dec-7",
        reference=reference,
    )
    assert entry is not None
    assert entry.description == "charge for decision dec-7 in pool leads"
    ledger.post(entry, at=now)
    assert ledger.balance("wallet:b1") == 10_000_000
    assert ledger.balance("revenue") == 2_500_000
    zero = charge_entry(
        quote(fixed(0)), ACCOUNTS, tenant_id=tenant, idempotency_key="z", reference=reference
    )
    assert zero is None


@pytest.mark.parametrize(
    ("rule", "fragment"),
    [
        (PriceRule(pool="p", currency="USD"), "needs a price"),
        (PriceRule(pool="p", currency="USD", price=-1), "negative"),
        (PriceRule(pool="p", currency="usd", price=1), "currency"),
        (PriceRule(pool="p", currency="USD", price=1, take_rate_bps=10_001), "take_rate_bps"),
        (
            PriceRule(pool="p", currency="USD", source=PriceSource.ROUTING, price=5),
            "not a price",
        ),
        (PriceRule(pool="p", currency="USD", price=1, minimum_payout=10), "exceeds"),
        (PriceRule(pool="", currency="USD", price=1), "pool is empty"),
    ],
)
def test_an_inconsistent_rule_is_refused_with_the_reason(rule: PriceRule, fragment: str) -> None:
    with pytest.raises(InvalidPriceRule) as caught:
        quote(rule)
    assert caught.value.code == "pricing.invalid_rule"
    assert fragment in str(caught.value)


def test_a_routing_priced_rule_needs_a_sane_routing_charge() -> None:
    rule = PriceRule(pool="auction", currency="USD", source=PriceSource.ROUTING)
    with pytest.raises(InvalidCharge) as caught:
        quote(rule)
    assert caught.value.code == "pricing.invalid_charge"
    assert caught.value.details == {"pool": "auction"}
    with pytest.raises(InvalidCharge):
        quote(rule, routing_charge=-5)


def test_the_price_book_finds_a_pools_rule_and_refuses_unknown_or_duplicate_pools() -> None:
    book = PriceBook.of([fixed(5), PriceRule(pool="other", currency="EUR", price=3)])
    assert book.rule_for("other").currency == "EUR"
    with pytest.raises(NoPriceRule) as caught:
        book.rule_for("missing")
    assert caught.value.code == "pricing.no_rule"
    with pytest.raises(InvalidPriceRule, match="more than one"):
        PriceBook.of([fixed(5), fixed(6)])


# --- the property -------------------------------------------------------------------

# Small amounts and round rates make exact half-micro ties common enough to test.
amounts = st.one_of(
    st.integers(min_value=0, max_value=1_000), st.integers(min_value=0, max_value=MAX_MICROS)
)
rates = st.one_of(
    st.sampled_from([0, 1, 500, 1_000, 2_500, 5_000, 9_999, 10_000]),
    st.integers(min_value=0, max_value=10_000),
)


@st.composite
def rules_and_charges(draw: st.DrawFn) -> tuple[PriceRule, int | None]:
    minimum_charge = draw(st.one_of(st.just(0), amounts))
    minimum_payout = draw(st.integers(min_value=0, max_value=minimum_charge))
    source = draw(st.sampled_from(PriceSource))
    rule = PriceRule(
        pool="p",
        currency="USD",
        source=source,
        price=draw(amounts) if source is PriceSource.FIXED else None,
        take_rate_bps=draw(rates),
        rounding=draw(st.sampled_from(Rounding)),
        minimum_charge=minimum_charge,
        minimum_payout=minimum_payout,
    )
    routing = draw(amounts) if source is PriceSource.ROUTING else None
    return rule, routing


@settings(max_examples=400, deadline=None)
@given(rules_and_charges())
def test_charge_is_payout_plus_fee_exactly_and_minimums_hold(
    case: tuple[PriceRule, int | None],
) -> None:
    rule, routing = case
    q = quote(rule, routing_charge=routing)
    assert q.charge == q.payout + q.fee
    assert min(q.charge, q.payout, q.fee) >= 0
    assert q.charge >= rule.minimum_charge
    assert q.payout >= rule.minimum_payout
    assert q.charge == max(q.base, rule.minimum_charge)
    exact = Fraction(q.charge * rule.take_rate_bps, 10_000)
    if q.minimum_payout_applied:
        assert q.fee < exact
        assert q.payout == rule.minimum_payout
    else:
        assert abs(q.fee - exact) < 1
        if rule.rounding is Rounding.FLOOR:
            assert q.fee <= exact
        elif rule.rounding is Rounding.CEILING:
            assert q.fee >= exact
        else:
            assert abs(q.fee - exact) <= Fraction(1, 2)
            if abs(q.fee - exact) == Fraction(1, 2):
                assert q.fee % 2 == 0  # ties go to the even micro
    postings = assignment_postings(q, ACCOUNTS)
    assert sum(p.amount for p in postings) == 0
    assert all(p.amount != 0 for p in postings)
    assert sum(p.amount for p in postings if p.amount > 0) == q.charge
