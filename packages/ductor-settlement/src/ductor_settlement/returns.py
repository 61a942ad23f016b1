"""Returns: whether a delivered assignment may be sent back, and the credit it earns.

Pure: `decide_return` gets the policy, the facts of the assignment, the
buyer's recent statistics and `now`, and answers with data; it posts nothing.

**Policy.** A `ReturnPolicy` (per pool or per member, see `ReturnPolicies`) has
a warranty `window` after delivery, optional `allowed_reasons`, an optional
maximum return rate in basis points over the buyer's recent assignments (only
enforced once the buyer has `min_sample` of them), the share of the charge to
credit back (`credit_bps`) and whether to ask for a reroute.

**Decision.** Checks run in this order and the first that fails refuses:
no policy (``return.not_returnable``), nothing left to credit
(``return.already_returned``), window closed (``return.window_closed``; the
window is half-open, so a return exactly at ``delivered_at + window`` is
late), reason not allowed (``return.reason_not_allowed``), rate over threshold
(``return.rate_exceeded``, counting this return), bad partial amount
(``return.invalid_amount``).
Otherwise the answer is a `ReturnCredit`: a new entry reversing the charge
entry for the credited amount (the charge entry is never changed) and, if the
policy asks, a `RerouteRequest` that excludes the returning buyer.

**Amounts.** By default the credit is ``credit_bps`` of what the buyer was
charged, rounded up (in the buyer's favour) and capped at what earlier returns
left. The reversal takes the credit back from the seller's payable and the
platform's revenue in proportion (largest remainder, exact). A payable with a
floor that was already paid out cannot be clawed below it: the ledger then
refuses the entry with ``ledger.floor_crossed``; give payables a negative floor
(a clawback allowance) where sellers may owe returns back.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import msgspec

from ductor_settlement._time import aware
from ductor_settlement.errors import (
    AlreadyReturned,
    InvalidReturnAmount,
    InvalidReturnPolicy,
    NotReturnable,
    ReturnError,
    ReturnRateExceeded,
    ReturnReasonNotAllowed,
    ReturnWindowClosed,
)
from ductor_settlement.ledger import Entry, EntryDraft, Reference, ReferenceKind, reverse
from ductor_settlement.money import format_micros, micros_problem
from ductor_settlement.pricing import BPS_PER_WHOLE, Rounding, apply_rate

__all__ = [
    "AssignmentFacts",
    "RerouteRequest",
    "ReturnCredit",
    "ReturnDecision",
    "ReturnPolicies",
    "ReturnPolicy",
    "ReturnRefusal",
    "ReturnStats",
    "decide_return",
]


def _bps_problem(name: str, value: object, *, minimum: int = 0) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{name} {value!r} is not an integer"
    if not minimum <= value <= BPS_PER_WHOLE:
        return f"{name} {value} is not between {minimum} and {BPS_PER_WHOLE}"
    return None


class ReturnPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """When a delivered assignment may be returned, and for how much.

    Attributes:
        window: how long after delivery a return is accepted.
        allowed_reasons: the reasons accepted; None accepts any reason.
        max_return_rate_bps: the highest share of the buyer's recent assignments
            that may be returned, in basis points; None sets no limit.
        rate_window: how far back "recent" reaches (what the caller counts in
            `ReturnStats`).
        min_sample: the rate is enforced only once the buyer has this many
            assignments in the rate window.
        credit_bps: the share of the charge credited back (10 000 = all of it).
        reroute: whether a return asks for the work to be routed again, without
            the returning buyer.
    """

    window: timedelta
    allowed_reasons: tuple[str, ...] | None = None
    max_return_rate_bps: int | None = None
    rate_window: timedelta = timedelta(days=30)
    min_sample: int = 20
    credit_bps: int = BPS_PER_WHOLE
    reroute: bool = True

    def problems(self) -> list[str]:
        """Every reason the policy is unusable (empty when it is fine)."""
        reasons: list[str] = []
        if self.window <= timedelta(0):
            reasons.append("window must be positive")
        if self.rate_window <= timedelta(0):
            reasons.append("rate_window must be positive")
        if self.allowed_reasons is not None and not all(self.allowed_reasons):
            reasons.append("allowed_reasons may not contain an empty reason")
        if self.max_return_rate_bps is not None:
            reason = _bps_problem("max_return_rate_bps", self.max_return_rate_bps)
            if reason is not None:
                reasons.append(reason)
        if isinstance(self.min_sample, bool) or self.min_sample < 1:
            reasons.append(f"min_sample {self.min_sample!r} must be at least 1")
        reason = _bps_problem("credit_bps", self.credit_bps, minimum=1)
        if reason is not None:
            reasons.append(reason)
        return reasons

    def validate(self) -> ReturnPolicy:
        """The policy itself, once checked.

        Raises:
            InvalidReturnPolicy: listing every problem.
        """
        reasons = self.problems()
        if reasons:
            raise InvalidReturnPolicy(
                "return policy is invalid: " + "; ".join(reasons), details={"reasons": reasons}
            )
        return self


class ReturnPolicies(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Return policies of a tenant: a default, per pool, and per member (most specific wins).

    Attributes:
        default: applies where no pool or member policy does; None means
            assignments without a more specific policy cannot be returned.
        pools: policy per pool id.
        members: policy per member (buyer) id, over any pool policy.
    """

    default: ReturnPolicy | None = None
    pools: dict[str, ReturnPolicy] = {}
    members: dict[str, ReturnPolicy] = {}

    def policy_for(self, *, pool: str, member: str) -> ReturnPolicy | None:
        """The member's policy, else the pool's, else the default (None: not returnable)."""
        for found in (self.members.get(member), self.pools.get(pool)):
            if found is not None:
                return found
        return self.default


class AssignmentFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What `decide_return` needs to know about the assignment being returned.

    Attributes:
        assignment_id: the assignment.
        routable_id: the work item, for a reroute.
        pool: the pool it was assigned from.
        buyer: the member that received and now returns it.
        buyer_account: the buyer's wallet, which the charge entry debited.
        delivered_at: when it was delivered; the warranty window starts here.
        charge_entry: the entry that charged the buyer (it debits only the buyer).
        already_reversed: `Ledger.reversed_amounts(charge_entry.id)`: what earlier
            returns of it took back, per account.
        excluded: members already excluded from rerouting it (earlier returns).
    """

    assignment_id: str
    routable_id: str
    pool: str
    buyer: str
    buyer_account: str
    delivered_at: datetime
    charge_entry: Entry
    already_reversed: dict[str, int] = {}
    excluded: tuple[str, ...] = ()


class ReturnStats(msgspec.Struct, frozen=True, kw_only=True):
    """The buyer's recent record over the policy's `rate_window`, not counting this return.

    Attributes:
        assignments: assignments delivered to the buyer in the window.
        returns: the buyer's assignments returned in the window, other than the
            one returned now (an assignment returned in parts counts once).
    """

    assignments: int
    returns: int


class RerouteRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Ask routing to place the work again, excluding the members in `exclude`."""

    routable_id: str
    pool: str
    exclude: tuple[str, ...]
    return_id: str


class ReturnCredit(msgspec.Struct, frozen=True, kw_only=True, tag="credit"):
    """An accepted return: the entry to post and, maybe, a reroute to request.

    Attributes:
        return_id: the return.
        amount: micros credited back to the buyer.
        currency: the charge's currency.
        full: True when nothing of the charge is left after this credit.
        entry: a reversal of the charge entry for `amount`; post it to the ledger.
        reroute: the reroute to request, when the policy asks for one.
    """

    return_id: str
    amount: int
    currency: str
    full: bool
    entry: EntryDraft
    reroute: RerouteRequest | None = None


class ReturnRefusal(msgspec.Struct, frozen=True, kw_only=True, tag="refusal"):
    """A refused return, with the stable code of the rule that refused it.

    Attributes:
        code: ``return.not_returnable``, ``return.window_closed``, ``return.reason_not_allowed``,
            ``return.rate_exceeded``, ``return.already_returned`` or
            ``return.invalid_amount``.
        message: a sentence for people.
        details: JSON details (deadline, rate, threshold, ...).
    """

    code: str
    message: str
    details: dict[str, Any] = {}

    def error(self) -> ReturnError:
        """The refusal as an exception to raise, of the class its code names."""
        cls = _REFUSALS.get(self.code, ReturnError)
        return cls(self.message, details=self.details)


ReturnDecision = ReturnCredit | ReturnRefusal
"""What `decide_return` answers: a credit or a refusal (msgspec-tagged "credit"/"refusal")."""

_REFUSALS: dict[str, type[ReturnError]] = {
    cls.code: cls
    for cls in (
        ReturnWindowClosed,
        ReturnReasonNotAllowed,
        ReturnRateExceeded,
        AlreadyReturned,
        InvalidReturnAmount,
        NotReturnable,
    )
}


def decide_return(
    policy: ReturnPolicy | None,
    facts: AssignmentFacts,
    *,
    now: datetime,
    stats: ReturnStats,
    reason: str,
    return_id: str,
    amount: int | None = None,
) -> ReturnDecision:
    """Accept or refuse returning `facts`' assignment at `now` for `reason`.

    Args:
        policy: the policy that applies (see `ReturnPolicies.policy_for`); None
            refuses with ``return.not_returnable``.
        facts: the assignment and its charge.
        now: the time of the return request.
        stats: the buyer's recent assignments and returns.
        reason: why the buyer returns it.
        return_id: the return's id; the credit entry's key is ``return:<return_id>``.
        amount: credit exactly this many micros instead of the policy's share.

    Raises:
        InvalidReturnPolicy: the policy itself is inconsistent.
    """
    now = aware(now, "now")
    base: dict[str, Any] = {"assignment": facts.assignment_id, "return": return_id}
    if policy is None:
        return ReturnRefusal(
            code=NotReturnable.code,
            message=f"no return policy covers assignment {facts.assignment_id}",
            details={**base, "pool": facts.pool, "buyer": facts.buyer},
        )
    policy.validate()
    delivered_at = aware(facts.delivered_at, "delivered_at")
    charged = sum(p.amount for p in facts.charge_entry.postings if p.account == facts.buyer_account)
    currency = next(
        (p.currency for p in facts.charge_entry.postings if p.account == facts.buyer_account),
        "",
    )
    remaining = max(0, charged + facts.already_reversed.get(facts.buyer_account, 0))

    if remaining == 0:
        return ReturnRefusal(
            code=AlreadyReturned.code,
            message=f"assignment {facts.assignment_id} has nothing left to credit back",
            details={**base, "charged": max(0, charged)},
        )
    deadline = delivered_at + policy.window
    if now >= deadline:
        return ReturnRefusal(
            code=ReturnWindowClosed.code,
            message=(
                f"the return window of assignment {facts.assignment_id} closed at "
                f"{deadline.isoformat()}"
            ),
            details={
                **base,
                "delivered_at": delivered_at.isoformat(),
                "closed_at": deadline.isoformat(),
            },
        )
    if policy.allowed_reasons is not None and reason not in policy.allowed_reasons:
        return ReturnRefusal(
            code=ReturnReasonNotAllowed.code,
            message=(
                f"return reason {reason!r} is not accepted; accepted: "
                + ", ".join(policy.allowed_reasons)
            ),
            details={**base, "reason": reason, "allowed": list(policy.allowed_reasons)},
        )
    limit = policy.max_return_rate_bps
    if limit is not None and stats.assignments >= policy.min_sample:
        after = stats.returns + 1
        if after * BPS_PER_WHOLE > limit * stats.assignments:
            rate_bps = after * BPS_PER_WHOLE // stats.assignments
            return ReturnRefusal(
                code=ReturnRateExceeded.code,
                message=(
                    f"buyer {facts.buyer} would have returned {after} of {stats.assignments} "
                    f"recent assignments ({rate_bps} bp), above the {limit} bp limit"
                ),
                details={
                    **base,
                    "buyer": facts.buyer,
                    "returns": after,
                    "assignments": stats.assignments,
                    "rate_bps": rate_bps,
                    "max_rate_bps": limit,
                },
            )
    if amount is None:
        credit = min(remaining, apply_rate(charged, policy.credit_bps, Rounding.CEILING))
    else:
        problem = micros_problem(amount)
        if problem is None and amount > remaining:
            problem = (
                f"{format_micros(amount, currency)} is more than the "
                f"{format_micros(remaining, currency)} left to credit"
            )
        if problem is not None:
            return ReturnRefusal(
                code=InvalidReturnAmount.code,
                message=f"cannot credit assignment {facts.assignment_id}: {problem}",
                details={
                    **base,
                    # integer micros; anything else (a bool, a float) as written
                    "requested": amount
                    if isinstance(amount, int) and not isinstance(amount, bool)
                    else repr(amount),
                    "remaining": remaining,
                },
            )
        credit = amount
    entry = reverse(
        facts.charge_entry,
        idempotency_key=f"return:{return_id}",
        amount=credit,
        already_reversed=facts.already_reversed,
        description=f"return {return_id} of assignment {facts.assignment_id}: {reason}",
        reference=Reference(kind=ReferenceKind.RETURN, id=return_id),
    )
    reroute = None
    if policy.reroute:
        reroute = RerouteRequest(
            routable_id=facts.routable_id,
            pool=facts.pool,
            exclude=tuple(dict.fromkeys((*facts.excluded, facts.buyer))),
            return_id=return_id,
        )
    return ReturnCredit(
        return_id=return_id,
        amount=credit,
        currency=currency,
        full=credit == remaining,
        entry=entry,
        reroute=reroute,
    )
