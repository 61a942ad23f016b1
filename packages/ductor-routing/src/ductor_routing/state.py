"""Routing state: the read-only view the pipeline consults and the Assign intent it proposes.

The pipeline never writes state. It reads counters (caps, budgets, loads) and
marks (round-robin cursors, sticky bindings, last-assigned times) through
`RoutingState`, and returns an `AssignIntent` that the caller commits
atomically: every `Reservation` is "add `amount` to counter `key` if the
result stays within `limit`", and every `Mark` is an upsert. If any
reservation does not fit, the whole intent is rejected and the routable is
routed again against fresh state. `InMemoryRoutingState` is the in-memory
implementation used by simulation and tests; it does no I/O and reads no clock.
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

import msgspec

from ductor_routing.errors import AssignConflict
from ductor_routing.pools import Window


class CounterScope(enum.StrEnum):
    """What a counter counts."""

    CAP = "cap"
    """Assignments to a member of a pool in one window period."""
    BUDGET = "budget"
    """Micros charged to a member of a pool in one window period."""
    LOAD = "load"
    """Work items a worker holds on a channel now (released on completion)."""


class CounterKey(msgspec.Struct, frozen=True, kw_only=True):
    """Identifies one counter. The server adds the tenant.

    Attributes:
        scope: cap, budget or load.
        worker: the worker counted.
        pool: the pool (cap and budget; empty for load).
        channel: the channel (load; empty otherwise).
        window: the window kind (cap and budget).
        period: the window instance, e.g. "2026-11-29" for a day (empty for load).
    """

    scope: CounterScope
    worker: str
    pool: str = ""
    channel: str = ""
    window: Window | None = None
    period: str = ""


class MarkKind(enum.StrEnum):
    """What a mark remembers."""

    CURSOR = "cursor"
    """Round-robin position of a scope: the last worker picked (key is empty)."""
    STICKY = "sticky"
    """Which worker a sticky key is bound to in a scope."""
    LAST_ASSIGNED = "last_assigned"
    """When a worker was last assigned anything (scope empty, key = worker id)."""


class Mark(msgspec.Struct, frozen=True, kw_only=True):
    """A small piece of remembered state, set (upserted) when an intent is committed.

    Attributes:
        kind: what it remembers.
        scope: a pool id, or "<pool>#shadow:<strategy>" for a shadow strategy's own marks.
        key: the sticky key or the worker id; empty for a cursor.
        value: a worker id, or an ISO-8601 UTC time for LAST_ASSIGNED.
    """

    kind: MarkKind
    scope: str
    key: str
    value: str


class Reservation(msgspec.Struct, frozen=True, kw_only=True):
    """Add `amount` to counter `key`, only if the new value stays <= `limit` (none = no limit)."""

    key: CounterKey
    amount: int
    limit: int | None = None


class AssignIntent(msgspec.Struct, frozen=True, kw_only=True):
    """What the caller commits to make a decision real, all or nothing.

    Attributes:
        decision_id: the decision this intent belongs to (an idempotency key).
        routable_id: the routable assigned.
        tenant: the routable's tenant.
        pool: the pool the recipient was picked from.
        worker: the recipient.
        channel: the capacity channel taken.
        at: the decision time, ISO-8601 UTC.
        charge: micros charged to the member's budget (the clearing price).
        reservations: counters to increase within their limits (caps, budget, load).
        marks: live marks to set (cursor, sticky binding, last-assigned time).
        shadow_marks: marks of shadow strategies, in their own scopes; committing
            them never changes a live outcome, skipping them only freezes the shadows.
    """

    decision_id: str
    routable_id: str
    tenant: str
    pool: str
    worker: str
    channel: str
    at: str
    charge: int
    reservations: tuple[Reservation, ...]
    marks: tuple[Mark, ...]
    shadow_marks: tuple[Mark, ...] = ()


@runtime_checkable
class RoutingState(Protocol):
    """The read-only view of routing state the pipeline consults."""

    def counter(self, key: CounterKey) -> int:
        """The counter's current value (0 if it was never reserved)."""
        ...

    def mark(self, kind: MarkKind, scope: str, key: str) -> str | None:
        """The mark's value, or None if it was never set."""
        ...


def period_of(window: Window, now: datetime.datetime) -> str:
    """The window instance `now` falls in, as a stable string (UTC calendar units)."""
    utc = now if now.tzinfo is datetime.UTC else now.astimezone(datetime.UTC)
    if window is Window.HOUR:
        return f"{utc.year:04d}-{utc.month:02d}-{utc.day:02d}T{utc.hour:02d}"
    if window is Window.DAY:
        return f"{utc.year:04d}-{utc.month:02d}-{utc.day:02d}"
    if window is Window.MONTH:
        return f"{utc.year:04d}-{utc.month:02d}"
    return "all"


def format_time(now: datetime.datetime) -> str:
    """`now` as fixed-width ISO-8601 UTC with microseconds (sorts as it compares)."""
    utc = now if now.tzinfo is datetime.UTC else now.astimezone(datetime.UTC)
    return utc.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


class InMemoryRoutingState:
    """Routing state held in dicts, for simulation and tests.

    `commit` applies an intent all or nothing and at most once, exactly as the
    server does in one transaction; `release` gives back load when an assignee
    finishes.
    """

    def __init__(self) -> None:
        self.counters: dict[CounterKey, int] = {}
        self.marks: dict[tuple[MarkKind, str, str], str] = {}
        self.committed: set[str] = set()

    def counter(self, key: CounterKey) -> int:
        """The counter's current value (0 if it was never reserved)."""
        return self.counters.get(key, 0)

    def mark(self, kind: MarkKind, scope: str, key: str) -> str | None:
        """The mark's value, or None if it was never set."""
        return self.marks.get((kind, scope, key))

    def commit(self, intent: AssignIntent, *, shadow_marks: bool = True) -> bool:
        """Apply every reservation and mark of `intent`, or none of them.

        Committing the same decision twice changes nothing the second time
        (the decision id is the idempotency key); returns whether it applied.

        Raises:
            AssignConflict: a reservation would exceed its limit; nothing changed.
        """
        if intent.decision_id in self.committed:
            return False
        counters = self.counters
        for res in intent.reservations:
            if res.limit is not None and counters.get(res.key, 0) + res.amount > res.limit:
                raise AssignConflict(
                    f"{res.key.scope.value} counter of {res.key.worker!r} would exceed {res.limit}",
                    details={"decision_id": intent.decision_id},
                )
        for res in intent.reservations:
            counters[res.key] = counters.get(res.key, 0) + res.amount
        self._set_marks(intent.marks)
        if shadow_marks:
            self._set_marks(intent.shadow_marks)
        self.committed.add(intent.decision_id)
        return True

    def release(self, worker: str, channel: str, amount: int = 1) -> None:
        """Give back `amount` of the worker's load on `channel` (never below zero)."""
        key = CounterKey(scope=CounterScope.LOAD, worker=worker, channel=channel)
        value = self.counters.get(key, 0) - amount
        self.counters[key] = max(value, 0)

    def _set_marks(self, marks: Iterable[Mark]) -> None:
        for mark in marks:
            self.marks[(mark.kind, mark.scope, mark.key)] = mark.value
