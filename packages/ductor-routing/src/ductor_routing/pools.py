"""Pools and their members: filters, caps, budgets and bids, as plain data.

Structured filters are compiled to Python predicates in `filters.py`; nothing
here evaluates anything.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec

MAX_MICROS = 10**15
"""The largest amount of money routing takes, in micros (a billion units): a
routable's price, a member's bid and budget, an auction's reserve. Sums of many
such amounts stay far inside 64 bits and exact in any JSON reader."""


class FilterOp(enum.StrEnum):
    """The operators a structured filter can apply to one attribute."""

    EQ = "eq"
    NE = "ne"
    IN = "in"
    NOT_IN = "not_in"
    GT = "gt"
    GTE = "gte"
    LT = "lt"
    LTE = "lte"
    EXISTS = "exists"


class Filter(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A condition on one routable attribute, evaluated in Python without CEL.

    `attribute` is a dotted path into the routable's attributes ("address.state").
    `eq` and `in` filters are indexed, so large pools are narrowed without a scan.

    Attributes:
        attribute: dotted path into `routable.attributes`.
        op: the operator.
        value: the operand of eq, ne, gt, gte, lt, lte.
        values: the operand of in and not_in.
    """

    attribute: str
    op: FilterOp = FilterOp.EQ
    value: Any = None
    values: tuple[Any, ...] = ()


class Window(enum.StrEnum):
    """A counting window for caps and budgets, aligned to UTC calendar units."""

    HOUR = "hour"
    DAY = "day"
    MONTH = "month"
    TOTAL = "total"


class Cap(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """At most `limit` assignments to a member per window."""

    window: Window
    limit: int


class Budget(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """At most `limit` micros charged to a member per window.

    Checked before selection against the most the member can be charged (its
    bid, else the routable's price), so a later, lower clearing price never
    overspends it.
    """

    limit: int
    window: Window = Window.TOTAL


class Member(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A worker's membership in a pool, with its own filters, caps and budget.

    Attributes:
        worker: the worker id.
        filters: structured filters on the routable, all must hold.
        when: an optional CEL condition over `routable`, `worker` and `member`,
            evaluated only for members the structured filters kept.
        caps: count caps per window.
        budget: a spend limit in micros; the member is eligible only while
            what is left of it covers its bid (the most it can be charged).
        bid: the member's bid in micros (auction) or fixed price per item.
        quality: multiplier in basis points applied to the bid to rank it
            (10_000 = 1.0); the reserve and the charge are in raw bid micros.
        priority: rank for the waterfall strategy, lower first.
        weight: overrides the worker's weight in this pool.
    """

    worker: str
    filters: tuple[Filter, ...] = ()
    when: str | None = None
    caps: tuple[Cap, ...] = ()
    budget: Budget | None = None
    bid: int | None = None
    quality: int = 10_000
    priority: int = 0
    weight: int | None = None


class StrategySpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A strategy by registry name, with its options.

    Attributes:
        name: the registry name.
        options: the strategy's options.
        label: how decisions and reports name it (default: `name`); shadows of
            one pool need distinct labels, e.g. two auctions with other options.
    """

    name: str
    options: dict[str, Any] = {}
    label: str | None = None

    @property
    def display(self) -> str:
        """The label, or the name when there is none."""
        return self.label or self.name


class Pool(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A named destination holding members, a live strategy and shadow strategies.

    Attributes:
        id: unique pool id.
        members: the pool's members; their order breaks ties.
        strategy: the live strategy.
        shadows: candidate strategies evaluated on every decision, never committed.
        channel: the capacity channel an assignment from this pool takes.
    """

    id: str
    members: tuple[Member, ...] = ()
    # A factory, not a shared instance: OpenAPI generators hash a field's default,
    # and a struct holding a dict cannot be hashed.
    strategy: StrategySpec = msgspec.field(default_factory=lambda: StrategySpec(name="round_robin"))
    shadows: tuple[StrategySpec, ...] = ()
    channel: str = "default"
