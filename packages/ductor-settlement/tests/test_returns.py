"""Returns: warranty window, reasons, return rate, credits and reroutes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from ductor_settlement.errors import (
    AlreadyReturned,
    InvalidReturnAmount,
    InvalidReturnPolicy,
    NotReturnable,
    ReturnRateExceeded,
    ReturnReasonNotAllowed,
    ReturnWindowClosed,
)
from ductor_settlement.ledger import (
    Account,
    AccountKind,
    Entry,
    Ledger,
    Reference,
    ReferenceKind,
    transfer,
)
from ductor_settlement.pricing import AssignmentAccounts, PriceRule, charge_entry, quote
from ductor_settlement.returns import (
    AssignmentFacts,
    ReturnCredit,
    ReturnDecision,
    ReturnPolicies,
    ReturnPolicy,
    ReturnRefusal,
    ReturnStats,
    decide_return,
)

T = "acme"
DELIVERED = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
SOON = DELIVERED + timedelta(hours=2)
POLICY = ReturnPolicy(
    window=timedelta(days=3),
    allowed_reasons=("wrong_number", "duplicate"),
    max_return_rate_bps=2_000,
    min_sample=10,
)
QUIET = ReturnStats(assignments=3, returns=0)
ACCOUNTS = AssignmentAccounts(
    buyer_wallet="wallet:b1", seller_payable="payable:s1", platform_revenue="revenue"
)


def book_with_charge(price: int = 10_000_000, bps: int = 2_500) -> tuple[Ledger, Entry]:
    ledger = Ledger(
        T,
        [
            Account(tenant_id=T, code="cash", currency="USD", kind=AccountKind.ASSET),
            Account(
                tenant_id=T, code="wallet:b1", currency="USD", kind=AccountKind.LIABILITY, floor=0
            ),
            Account(
                tenant_id=T, code="payable:s1", currency="USD", kind=AccountKind.LIABILITY, floor=0
            ),
            Account(tenant_id=T, code="revenue", currency="USD", kind=AccountKind.REVENUE),
        ],
    )
    ledger.post(
        transfer(
            tenant_id=T,
            idempotency_key="fund",
            debit_account="cash",
            credit_account="wallet:b1",
            amount=50_000_000,
            currency="USD",
            reference=Reference(kind=ReferenceKind.TOP_UP, id="fund"),
            description="fund",
        ),
        at=DELIVERED,
    )
    draft = charge_entry(
        quote(PriceRule(pool="leads", currency="USD", price=price, take_rate_bps=bps)),
        ACCOUNTS,
        tenant_id=T,
        idempotency_key="charge:asg-1",
        reference=Reference(kind=ReferenceKind.DECISION, id="dec-1"),
    )
    assert draft is not None
    return ledger, ledger.post(draft, at=DELIVERED)


def facts(ledger: Ledger, entry: Entry, **extra: object) -> AssignmentFacts:
    fields: dict[str, object] = {
        "assignment_id": "asg-1",
        "routable_id": "lead-1",
        "pool": "leads",
        "buyer": "b1",
        "buyer_account": "wallet:b1",
        "delivered_at": DELIVERED,
        "charge_entry": entry,
        "already_reversed": ledger.reversed_amounts(entry.id),
    }
    fields.update(extra)
    return AssignmentFacts(**fields)  # type: ignore[arg-type]


def decide(
    ledger: Ledger,
    entry: Entry,
    *,
    policy: ReturnPolicy | None = POLICY,
    now: datetime = SOON,
    stats: ReturnStats = QUIET,
    reason: str = "wrong_number",
    return_id: str = "ret-1",
    amount: int | None = None,
) -> ReturnDecision:
    return decide_return(
        policy,
        facts(ledger, entry),
        now=now,
        stats=stats,
        reason=reason,
        return_id=return_id,
        amount=amount,
    )


def refusal(decision: ReturnDecision) -> ReturnRefusal:
    assert isinstance(decision, ReturnRefusal), decision
    return decision


def test_a_return_inside_the_window_credits_the_buyer_in_full_and_asks_for_a_reroute() -> None:
    ledger, entry = book_with_charge()
    decision = decide(ledger, entry)
    assert isinstance(decision, ReturnCredit)
    assert (decision.amount, decision.currency, decision.full) == (10_000_000, "USD", True)
    assert decision.entry.reverses == entry.id
    assert decision.entry.idempotency_key == "return:ret-1"
    assert decision.entry.reference == Reference(kind=ReferenceKind.RETURN, id="ret-1")
    assert decision.reroute is not None
    assert decision.reroute.exclude == ("b1",)
    assert decision.reroute.routable_id == "lead-1"
    ledger.post(decision.entry, at=SOON)
    assert ledger.balance("wallet:b1") == 50_000_000
    assert (ledger.balance("payable:s1"), ledger.balance("revenue")) == (0, 0)
    assert entry in ledger.entries  # the charge is never changed
    again = decide(ledger, entry, return_id="ret-2")
    assert refusal(again).code == "return.already_returned"


def test_a_partial_credit_policy_credits_its_share_rounded_up_for_the_buyer() -> None:
    ledger, entry = book_with_charge(price=7, bps=2_500)  # payout 5, fee 2
    half = msgspec.structs.replace(POLICY, credit_bps=5_000, reroute=False)
    decision = decide(ledger, entry, policy=half)
    assert isinstance(decision, ReturnCredit)
    assert decision.amount == 4  # 3.5 rounded up
    assert not decision.full
    assert decision.reroute is None
    assert sum(p.amount for p in decision.entry.postings) == 0
    ledger.post(decision.entry, at=SOON)
    rest = decide(ledger, entry, policy=half, return_id="ret-2")
    assert isinstance(rest, ReturnCredit)
    assert rest.amount == 3  # capped at what is left
    assert rest.full
    ledger.post(rest.entry, at=SOON)
    assert ledger.reversed_amounts(entry.id) == {"wallet:b1": -7, "payable:s1": 5, "revenue": 2}


def test_an_explicit_partial_amount_is_credited_and_earlier_exclusions_are_kept() -> None:
    ledger, entry = book_with_charge()
    decision = decide_return(
        POLICY,
        facts(ledger, entry, excluded=("b0",)),
        now=SOON,
        stats=QUIET,
        reason="duplicate",
        return_id="ret-1",
        amount=2_500_000,
    )
    assert isinstance(decision, ReturnCredit)
    assert decision.amount == 2_500_000
    assert decision.reroute is not None
    assert decision.reroute.exclude == ("b0", "b1")


def test_the_window_is_half_open() -> None:
    ledger, entry = book_with_charge()
    deadline = DELIVERED + POLICY.window
    just_in = decide(ledger, entry, now=deadline - timedelta(microseconds=1))
    assert isinstance(just_in, ReturnCredit)
    late = refusal(decide(ledger, entry, now=deadline))
    assert late.code == "return.window_closed"
    assert late.details["closed_at"] == deadline.isoformat()
    assert isinstance(late.error(), ReturnWindowClosed)


def test_a_reason_the_policy_does_not_accept_is_refused() -> None:
    ledger, entry = book_with_charge()
    refused = refusal(decide(ledger, entry, reason="changed_mind"))
    assert refused.code == "return.reason_not_allowed"
    assert refused.details["allowed"] == ["wrong_number", "duplicate"]
    assert isinstance(refused.error(), ReturnReasonNotAllowed)
    anything = msgspec.structs.replace(POLICY, allowed_reasons=None)
    assert isinstance(decide(ledger, entry, policy=anything, reason="changed_mind"), ReturnCredit)


def test_the_return_rate_counts_this_return_and_waits_for_the_minimum_sample() -> None:
    ledger, entry = book_with_charge()
    # 1 earlier + this one = 2 of 10 = 20 %: at the limit, accepted.
    at_limit = decide(ledger, entry, stats=ReturnStats(assignments=10, returns=1))
    assert isinstance(at_limit, ReturnCredit)
    # 2 earlier + this one = 3 of 10 = 30 %: over the 20 % limit.
    over = refusal(decide(ledger, entry, stats=ReturnStats(assignments=10, returns=2)))
    assert over.code == "return.rate_exceeded"
    assert (over.details["rate_bps"], over.details["max_rate_bps"]) == (3_000, 2_000)
    assert isinstance(over.error(), ReturnRateExceeded)
    # The same rate on a sample below the minimum is not enforced.
    small = decide(ledger, entry, stats=ReturnStats(assignments=9, returns=8))
    assert isinstance(small, ReturnCredit)


def test_a_bad_partial_amount_is_refused() -> None:
    ledger, entry = book_with_charge()
    for amount in (0, 10_000_001):
        refused = refusal(decide(ledger, entry, amount=amount))
        assert refused.code == "return.invalid_amount"
        assert isinstance(refused.error(), InvalidReturnAmount)
        # Money in details is integer micros, like `remaining`.
        assert (refused.details["requested"], refused.details["remaining"]) == (
            amount,
            10_000_000,
        )


def test_nothing_left_is_refused_before_anything_else() -> None:
    ledger, entry = book_with_charge()
    decision = decide(ledger, entry)
    assert isinstance(decision, ReturnCredit)
    ledger.post(decision.entry, at=SOON)
    late = refusal(decide(ledger, entry, now=DELIVERED + timedelta(days=30), return_id="r2"))
    assert late.code == "return.already_returned"
    assert isinstance(late.error(), AlreadyReturned)


def test_without_a_policy_an_assignment_is_not_returnable() -> None:
    ledger, entry = book_with_charge()
    refused = refusal(decide(ledger, entry, policy=None))
    assert refused.code == "return.not_returnable"
    assert isinstance(refused.error(), NotReturnable)


def test_an_inconsistent_policy_is_refused() -> None:
    ledger, entry = book_with_charge()
    bad = ReturnPolicy(window=timedelta(0), credit_bps=0, min_sample=0, max_return_rate_bps=-1)
    with pytest.raises(InvalidReturnPolicy) as caught:
        decide(ledger, entry, policy=bad)
    assert caught.value.code == "return.invalid_policy"
    assert len(caught.value.details["reasons"]) == 4


def test_policies_resolve_member_over_pool_over_default() -> None:
    member = ReturnPolicy(window=timedelta(days=1))
    pool = ReturnPolicy(window=timedelta(days=2))
    default = ReturnPolicy(window=timedelta(days=3))
    policies = ReturnPolicies(default=default, pools={"leads": pool}, members={"b1": member})
    assert policies.policy_for(pool="leads", member="b1") is member
    assert policies.policy_for(pool="leads", member="b2") is pool
    assert policies.policy_for(pool="other", member="b2") is default
    assert ReturnPolicies().policy_for(pool="leads", member="b1") is None


def test_decisions_encode_as_tagged_json() -> None:
    ledger, entry = book_with_charge()
    refused = msgspec.json.decode(msgspec.json.encode(decide(ledger, entry, reason="x")))
    assert refused["type"] == "refusal"
    credited = msgspec.json.decode(msgspec.json.encode(decide(ledger, entry)))
    assert credited["type"] == "credit"
