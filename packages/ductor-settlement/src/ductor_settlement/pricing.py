"""Pricing one assignment: what the buyer pays, the seller earns and the platform keeps.

Pure arithmetic in integer micros; nothing here posts to a ledger or reads a clock.

**Rules.** A `PriceRule` per pool prices from a fixed `price` or from the
routing charge (e.g. an auction's clearing price, passed in), keeps a take
rate in basis points (1 bp = 0.01 %, 10 000 bp = 100 %), and may set a
`minimum_charge` (the buyer pays at least this) and a `minimum_payout` (the
seller receives at least this; the platform's fee yields to it). A rule must
have ``minimum_charge >= minimum_payout`` so both minimums can always hold.

**Rounding.** The fee is ``charge * take_rate_bps / 10_000`` rounded to a whole
micro by the rule's `Rounding`: half-even by default (ties go to the even micro,
so rounding has no bias over many charges), or floor (in the seller's favour),
or ceiling (in the platform's). The payout is then ``charge - fee``, so
``charge == payout + fee`` holds exactly and no micro is ever lost or created.

**Postings.** For one assignment the buyer's wallet is debited the charge, the
seller's payable credited the payout and the platform's revenue credited the
fee (legs of zero are left out; a zero charge has no postings at all).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import msgspec

from ductor_settlement.errors import InvalidCharge, InvalidPriceRule, NoPriceRule
from ductor_settlement.ledger import EntryDraft, Posting, Reference, credit, debit
from ductor_settlement.money import currency_problem, micros_problem

__all__ = [
    "BPS_PER_WHOLE",
    "AssignmentAccounts",
    "PriceBook",
    "PriceRule",
    "PriceSource",
    "Quote",
    "Rounding",
    "apply_rate",
    "assignment_postings",
    "charge_entry",
    "quote",
]

BPS_PER_WHOLE = 10_000
"""Basis points in 100 %."""


class PriceSource(enum.StrEnum):
    """Where a rule's charge comes from."""

    FIXED = "fixed"
    """The rule's own `price`."""
    ROUTING = "routing"
    """The charge routing decided (a bid, the auction's clearing price), passed in."""


class Rounding(enum.StrEnum):
    """How a fee that falls between two micros is rounded."""

    HALF_EVEN = "half_even"
    """To the nearest micro; exact halves to the even one (banker's rounding)."""
    FLOOR = "floor"
    """Down: the fee never exceeds the exact rate (the seller keeps the fraction)."""
    CEILING = "ceiling"
    """Up: the fee never falls short of the exact rate (the platform keeps it)."""


def apply_rate(amount: int, bps: int, rounding: Rounding) -> int:
    """`amount * bps / 10_000`, rounded to a whole micro as `rounding` says (amount >= 0)."""
    quotient, remainder = divmod(amount * bps, BPS_PER_WHOLE)
    if remainder == 0 or rounding is Rounding.FLOOR:
        return quotient
    if rounding is Rounding.CEILING:
        return quotient + 1
    twice = 2 * remainder
    if twice > BPS_PER_WHOLE or (twice == BPS_PER_WHOLE and quotient % 2 == 1):
        return quotient + 1
    return quotient


class PriceRule(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How assignments from one pool are priced and split.

    Attributes:
        pool: the pool the rule prices.
        currency: the currency of every amount.
        source: a fixed price or the routing charge.
        price: the fixed price in micros (only with `source` fixed).
        take_rate_bps: the platform's share, 0 to 10 000 basis points.
        rounding: how the fee is rounded to a micro.
        minimum_charge: the buyer pays at least this many micros.
        minimum_payout: the seller receives at least this many micros.
    """

    pool: str
    currency: str
    source: PriceSource = PriceSource.FIXED
    price: int | None = None
    take_rate_bps: int = 0
    rounding: Rounding = Rounding.HALF_EVEN
    minimum_charge: int = 0
    minimum_payout: int = 0

    def problems(self) -> list[str]:
        """Every reason the rule is unusable (empty when it is fine)."""
        reasons: list[str] = []
        if not self.pool:
            reasons.append("the pool is empty")
        currency_reason = currency_problem(self.currency)
        if currency_reason is not None:
            reasons.append(currency_reason)
        if self.source is PriceSource.FIXED:
            if self.price is None:
                reasons.append("a fixed-price rule needs a price")
            else:
                reason = micros_problem(self.price, allow_zero=True)
                if reason is not None:
                    reasons.append(f"price: {reason}")
        elif self.price is not None:
            reasons.append("a routing-priced rule takes its charge from routing, not a price")
        if (
            isinstance(self.take_rate_bps, bool)
            or not isinstance(self.take_rate_bps, int)
            or not 0 <= self.take_rate_bps <= BPS_PER_WHOLE
        ):
            reasons.append(f"take_rate_bps {self.take_rate_bps!r} is not between 0 and 10000")
        for name in ("minimum_charge", "minimum_payout"):
            reason = micros_problem(getattr(self, name), allow_zero=True)
            if reason is not None:
                reasons.append(f"{name}: {reason}")
        if not reasons and self.minimum_payout > self.minimum_charge:
            reasons.append(
                f"minimum_payout {self.minimum_payout} exceeds minimum_charge "
                f"{self.minimum_charge}: a charge at the minimum could not pay it"
            )
        return reasons

    def validate(self) -> PriceRule:
        """The rule itself, once checked.

        Raises:
            InvalidPriceRule: listing every problem.
        """
        reasons = self.problems()
        if reasons:
            raise InvalidPriceRule(
                f"price rule for pool {self.pool!r} is invalid: " + "; ".join(reasons),
                details={"pool": self.pool, "reasons": reasons},
            )
        return self


class Quote(msgspec.Struct, frozen=True, kw_only=True):
    """The price of one assignment, split. Always ``charge == payout + fee``.

    Attributes:
        pool: the pool whose rule priced it.
        currency: the currency of every amount.
        charge: micros the buyer pays.
        payout: micros the seller receives.
        fee: micros the platform keeps.
        base: the price or routing charge before the minimum charge was applied.
        take_rate_bps: the rule's take rate.
        rounding: the rule's rounding.
        minimum_charge_applied: the charge was raised to the rule's minimum.
        minimum_payout_applied: the fee was lowered so the payout meets the minimum.
    """

    pool: str
    currency: str
    charge: int
    payout: int
    fee: int
    base: int
    take_rate_bps: int
    rounding: Rounding
    minimum_charge_applied: bool = False
    minimum_payout_applied: bool = False


def quote(rule: PriceRule, *, routing_charge: int | None = None) -> Quote:
    """Price one assignment under `rule`.

    Args:
        rule: the pool's price rule.
        routing_charge: the charge routing decided, in micros; needed when the
            rule's source is routing, ignored otherwise.

    Raises:
        InvalidPriceRule: the rule is inconsistent.
        InvalidCharge: a routing-priced rule got no routing charge, or a bad one.
    """
    rule.validate()
    if rule.source is PriceSource.FIXED:
        assert rule.price is not None  # validate() guarantees it
        base = rule.price
    else:
        if routing_charge is None:
            raise InvalidCharge(
                f"pool {rule.pool!r} is priced by routing but no routing charge was given",
                details={"pool": rule.pool},
            )
        reason = micros_problem(routing_charge, allow_zero=True)
        if reason is not None:
            raise InvalidCharge(
                f"routing charge for pool {rule.pool!r}: {reason}",
                details={"pool": rule.pool, "routing_charge": repr(routing_charge)},
            )
        base = routing_charge
    charge = max(base, rule.minimum_charge)
    fee = apply_rate(charge, rule.take_rate_bps, rule.rounding)
    payout = charge - fee
    minimum_payout_applied = payout < rule.minimum_payout
    if minimum_payout_applied:
        # charge >= minimum_charge >= minimum_payout, so the fee stays >= 0.
        payout = rule.minimum_payout
        fee = charge - payout
    return Quote(
        pool=rule.pool,
        currency=rule.currency,
        charge=charge,
        payout=payout,
        fee=fee,
        base=base,
        take_rate_bps=rule.take_rate_bps,
        rounding=rule.rounding,
        minimum_charge_applied=charge > base,
        minimum_payout_applied=minimum_payout_applied,
    )


class AssignmentAccounts(msgspec.Struct, frozen=True, kw_only=True):
    """The three accounts one assignment's money moves between.

    Attributes:
        buyer_wallet: debited the charge (a liability: the buyer's prepaid funds).
        seller_payable: credited the payout (a liability: what the platform owes the seller).
        platform_revenue: credited the fee (revenue).
    """

    buyer_wallet: str
    seller_payable: str
    platform_revenue: str


def assignment_postings(quote: Quote, accounts: AssignmentAccounts) -> tuple[Posting, ...]:
    """The postings that settle `quote`: they always net to zero; zero legs are left out."""
    if quote.charge == 0:
        return ()
    postings = [debit(accounts.buyer_wallet, quote.charge, quote.currency)]
    if quote.payout:
        postings.append(credit(accounts.seller_payable, quote.payout, quote.currency))
    if quote.fee:
        postings.append(credit(accounts.platform_revenue, quote.fee, quote.currency))
    return tuple(postings)


def charge_entry(
    quote: Quote,
    accounts: AssignmentAccounts,
    *,
    tenant_id: str,
    idempotency_key: str,
    reference: Reference,
    description: str | None = None,
) -> EntryDraft | None:
    """The ledger entry charging one assignment, or None when the charge is zero."""
    postings = assignment_postings(quote, accounts)
    if not postings:
        return None
    return EntryDraft(
        tenant_id=tenant_id,
        idempotency_key=idempotency_key,
        description=description
        if description is not None
        else f"charge for {reference.kind.value} {reference.id} in pool {quote.pool}",
        reference=reference,
        postings=postings,
    )


class PriceBook(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The price rules of a tenant, one per pool."""

    rules: tuple[PriceRule, ...] = ()

    def validate(self) -> PriceBook:
        """The book itself, once every rule is checked and no pool has two rules.

        Raises:
            InvalidPriceRule: a bad rule, or a pool with two rules.
        """
        seen: set[str] = set()
        for rule in self.rules:
            rule.validate()
            if rule.pool in seen:
                raise InvalidPriceRule(
                    f"pool {rule.pool!r} has more than one price rule",
                    details={"pool": rule.pool, "reasons": ["duplicate pool"]},
                )
            seen.add(rule.pool)
        return self

    def rule_for(self, pool: str) -> PriceRule:
        """The rule pricing `pool`.

        Raises:
            NoPriceRule: no rule names the pool.
        """
        for rule in self.rules:
            if rule.pool == pool:
                return rule
        raise NoPriceRule(f"no price rule for pool {pool!r}", details={"pool": pool})

    @classmethod
    def of(cls, rules: Iterable[PriceRule]) -> PriceBook:
        """A checked book of `rules`."""
        return cls(rules=tuple(rules)).validate()
