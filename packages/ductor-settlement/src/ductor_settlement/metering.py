"""Metering and budgets: meters, usage windows, and whether new usage is allowed.

Pure: the caller keeps the counters (one per `UsageKey`) and passes the current
values and the time in; nothing here stores anything or reads a clock.

**Meters.** A `Meter` has a name, a unit and an aggregation: ``sum`` adds each
usage amount, ``count`` adds one per usage whatever its amount, ``max`` keeps
the largest amount seen. Usage is counted per tenant, meter and window; a
window (hour, day, month) starts at the UTC calendar boundary at or before the
usage time (`window_start`).

**Budgets.** A `BudgetPolicy` sets a `limit` on one meter per window, alert
thresholds as percentages of the limit, and whether reaching past the limit
blocks. Usage that brings the value up to the limit exactly is allowed; usage
that would take it above a blocking limit is refused (``budget.exceeded``,
naming the meter, window, limit, current value and request) and nothing is
recorded. A threshold alerts once, on the usage that takes the value from below
``limit * percent / 100`` to at or above it. Alerts are reported only for usage
that is recorded.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

import msgspec

from ductor_settlement._time import aware
from ductor_settlement.errors import BudgetExceeded, InvalidUsage
from ductor_settlement.money import MAX_MICROS

__all__ = [
    "MAX_USAGE",
    "Aggregation",
    "BudgetCheck",
    "BudgetPolicy",
    "Meter",
    "UsageDecision",
    "UsageKey",
    "UsageWindow",
    "aggregate",
    "check_budget",
    "check_usage",
    "usage_key",
    "window_end",
    "window_start",
]

MAX_USAGE = MAX_MICROS
"""The largest usage value a counter may reach (2**53 - 1, exact in any JSON reader)."""


class Aggregation(enum.StrEnum):
    """How a meter folds usage into its value for a window."""

    SUM = "sum"
    """Add every usage amount (tokens, micros, seconds)."""
    COUNT = "count"
    """Add one per usage, whatever its amount (requests, runs)."""
    MAX = "max"
    """Keep the largest amount seen (peak concurrency, seats)."""


class UsageWindow(enum.StrEnum):
    """A counting window aligned to UTC calendar boundaries."""

    HOUR = "hour"
    DAY = "day"
    MONTH = "month"


def window_start(window: UsageWindow, at: datetime) -> datetime:
    """The UTC start of the `window` that contains `at`."""
    at = aware(at, "at")
    if window is UsageWindow.HOUR:
        return at.replace(minute=0, second=0, microsecond=0)
    day = at.replace(hour=0, minute=0, second=0, microsecond=0)
    if window is UsageWindow.DAY:
        return day
    return day.replace(day=1)


def window_end(window: UsageWindow, at: datetime) -> datetime:
    """The UTC end (exclusive) of the `window` that contains `at`."""
    start = window_start(window, at)
    if window is UsageWindow.HOUR:
        return start + timedelta(hours=1)
    if window is UsageWindow.DAY:
        return start + timedelta(days=1)
    if start.month == 12:
        return start.replace(year=start.year + 1, month=1)
    return start.replace(month=start.month + 1)


class Meter(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Something a tenant uses and is measured on.

    Attributes:
        name: stable id, e.g. ``"runs"``, ``"llm.tokens"``.
        unit: what one unit is, e.g. ``"run"``, ``"token"``, ``"micros"``.
        aggregation: how usage is folded into a window's value.
        description: for people.
    """

    name: str
    unit: str
    aggregation: Aggregation = Aggregation.SUM
    description: str = ""


class UsageKey(msgspec.Struct, frozen=True, kw_only=True):
    """Identifies one usage counter: a tenant's meter in one window."""

    tenant_id: str
    meter: str
    window: UsageWindow
    window_start: datetime


def usage_key(tenant_id: str, meter: str, window: UsageWindow, at: datetime) -> UsageKey:
    """The counter that usage by `tenant_id` on `meter` at `at` goes to."""
    return UsageKey(
        tenant_id=tenant_id, meter=meter, window=window, window_start=window_start(window, at)
    )


def _count_problem(name: str, value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{name} {value!r} is not an integer"
    if not 0 <= value <= MAX_USAGE:
        return f"{name} {value} is not between 0 and {MAX_USAGE}"
    return None


def _require(problems: Iterable[str | None], meter: str) -> None:
    reasons = [problem for problem in problems if problem is not None]
    if reasons:
        raise InvalidUsage(
            f"usage of meter {meter!r} is invalid: " + "; ".join(reasons),
            details={"meter": meter, "reasons": reasons},
        )


def aggregate(meter: Meter, current: int, amount: int) -> int:
    """The meter's value after usage of `amount` on top of `current`.

    Raises:
        InvalidUsage: a negative or non-integer value, or a result beyond `MAX_USAGE`.
    """
    _require((_count_problem("current", current), _count_problem("amount", amount)), meter.name)
    if meter.aggregation is Aggregation.SUM:
        after = current + amount
    elif meter.aggregation is Aggregation.COUNT:
        after = current + 1
    else:
        after = max(current, amount)
    _require((_count_problem("the meter's value", after),), meter.name)
    return after


class BudgetPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A limit on one meter of one tenant per window, with alerts.

    Attributes:
        tenant_id: the tenant it applies to.
        meter: the meter's name.
        window: the window the limit is per.
        limit: the most the meter may reach in one window.
        alert_percents: percentages of the limit that alert when crossed.
        block: refuse usage that would pass the limit (else only alert).
    """

    tenant_id: str
    meter: str
    window: UsageWindow
    limit: int
    alert_percents: tuple[int, ...] = (50, 80, 100)
    block: bool = True

    def problems(self) -> list[str]:
        """Every reason the policy is unusable (empty when it is fine)."""
        reasons: list[str] = []
        reason = _count_problem("limit", self.limit)
        if reason is not None:
            reasons.append(reason)
        for percent in self.alert_percents:
            if (
                isinstance(percent, bool)
                or not isinstance(percent, int)
                or not 1 <= percent <= 1000
            ):
                reasons.append(f"alert percent {percent!r} is not between 1 and 1000")
        return reasons


class BudgetCheck(msgspec.Struct, frozen=True, kw_only=True):
    """What one budget policy says about one usage.

    Attributes:
        meter: the meter.
        window: the policy's window.
        limit: the policy's limit.
        before: the meter's value in the window before the usage.
        after: the value the usage would bring it to.
        alerts: the alert percentages this usage crosses, ascending.
        blocked: the usage would pass a blocking limit.
    """

    meter: str
    window: UsageWindow
    limit: int
    before: int
    after: int
    alerts: tuple[int, ...] = ()
    blocked: bool = False


class UsageDecision(msgspec.Struct, frozen=True, kw_only=True):
    """The answer for one usage against every budget of its meter.

    Attributes:
        meter: the meter.
        amount: the usage amount asked for.
        allowed: False when any blocking budget would be passed.
        checks: one per policy, in the order given.
    """

    meter: str
    amount: int
    allowed: bool
    checks: tuple[BudgetCheck, ...] = ()

    @property
    def alerts(self) -> tuple[BudgetCheck, ...]:
        """The checks whose thresholds this usage crosses."""
        return tuple(check for check in self.checks if check.alerts)

    def error(self) -> BudgetExceeded | None:
        """The ``budget.exceeded`` error naming the first blocking budget, or None."""
        for check in self.checks:
            if check.blocked:
                return BudgetExceeded(
                    f"usage of {self.amount} on meter {self.meter!r} would take it to "
                    f"{check.after}, past its {check.window.value} limit of {check.limit} "
                    f"(now {check.before})",
                    details={
                        "meter": self.meter,
                        "window": check.window.value,
                        "limit": check.limit,
                        "current": check.before,
                        "requested": self.amount,
                    },
                )
        return None

    def raise_if_blocked(self) -> None:
        """Raise `BudgetExceeded` when the usage is not allowed."""
        error = self.error()
        if error is not None:
            raise error


def check_budget(meter: Meter, policy: BudgetPolicy, *, current: int, amount: int) -> BudgetCheck:
    """What `policy` says about `amount` more usage on a window value of `current`.

    Raises:
        InvalidUsage: the policy is for another meter or is malformed, or the
            values are negative or out of range.
    """
    mismatch = f"the policy is for meter {policy.meter!r}" if policy.meter != meter.name else None
    _require((mismatch, *policy.problems()), meter.name)
    after = aggregate(meter, current, amount)
    blocked = policy.block and after > policy.limit
    alerts = tuple(
        sorted(
            {
                percent
                for percent in policy.alert_percents
                if current * 100 < percent * policy.limit <= after * 100
            }
        )
    )
    return BudgetCheck(
        meter=meter.name,
        window=policy.window,
        limit=policy.limit,
        before=current,
        after=after,
        alerts=() if blocked else alerts,
        blocked=blocked,
    )


def check_usage(
    meter: Meter,
    policies: Iterable[BudgetPolicy],
    *,
    usage: Mapping[UsageWindow, int],
    amount: int,
) -> UsageDecision:
    """Whether `amount` more usage of `meter` is allowed by every one of `policies`.

    Args:
        meter: the meter used.
        policies: the tenant's budgets on this meter (any windows).
        usage: the meter's current value per window (missing windows count as 0).
        amount: the new usage.

    Raises:
        InvalidUsage: a policy for another meter, a malformed policy or value.
    """
    checks = [
        check_budget(meter, policy, current=usage.get(policy.window, 0), amount=amount)
        for policy in policies
    ]
    if not checks:
        aggregate(meter, 0, amount)  # the amount is still checked
    allowed = not any(check.blocked for check in checks)
    if not allowed:
        # Nothing is recorded, so nothing is crossed.
        checks = [msgspec.structs.replace(check, alerts=()) for check in checks]
    return UsageDecision(meter=meter.name, amount=amount, allowed=allowed, checks=tuple(checks))
