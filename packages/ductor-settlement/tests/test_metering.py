"""Meters, usage windows and budgets: allowed, alerts crossed, blocked."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from ductor_settlement.errors import BudgetExceeded, InvalidTime, InvalidUsage
from ductor_settlement.metering import (
    MAX_USAGE,
    Aggregation,
    BudgetPolicy,
    Meter,
    UsageWindow,
    aggregate,
    check_budget,
    check_usage,
    usage_key,
    window_end,
    window_start,
)

TOKENS = Meter(name="llm.tokens", unit="token")
RUNS = Meter(name="runs", unit="run", aggregation=Aggregation.COUNT)
SEATS = Meter(name="seats", unit="seat", aggregation=Aggregation.MAX)
AT = datetime(2024, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)


def budget(
    limit: int, *, meter: str = "llm.tokens", block: bool = True, **extra: object
) -> BudgetPolicy:
    return BudgetPolicy(
        tenant_id="acme",
        meter=meter,
        window=extra.pop("window", UsageWindow.MONTH),  # type: ignore[arg-type]
        limit=limit,
        block=block,
        **extra,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("window", "start", "end"),
    [
        (
            UsageWindow.HOUR,
            datetime(2024, 12, 31, 23, tzinfo=UTC),
            datetime(2025, 1, 1, tzinfo=UTC),
        ),
        (UsageWindow.DAY, datetime(2024, 12, 31, tzinfo=UTC), datetime(2025, 1, 1, tzinfo=UTC)),
        (UsageWindow.MONTH, datetime(2024, 12, 1, tzinfo=UTC), datetime(2025, 1, 1, tzinfo=UTC)),
    ],
)
def test_windows_align_to_utc_calendar_boundaries(
    window: UsageWindow, start: datetime, end: datetime
) -> None:
    assert window_start(window, AT) == start
    assert window_end(window, AT) == end
    assert window_start(window, start) == start  # a boundary starts its own window
    assert window_start(window, end) == end


def test_a_non_utc_time_is_counted_in_its_utc_window() -> None:
    # 00:30 on Jan 1 in UTC+2 is 22:30 on Dec 31 in UTC.
    local = datetime(2025, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=2)))
    assert window_start(UsageWindow.DAY, local) == datetime(2024, 12, 31, tzinfo=UTC)
    assert window_end(UsageWindow.MONTH, datetime(2025, 2, 10, tzinfo=UTC)) == datetime(
        2025, 3, 1, tzinfo=UTC
    )
    with pytest.raises(InvalidTime):
        window_start(UsageWindow.DAY, datetime(2025, 1, 1))  # naive on purpose


def test_usage_keys_name_the_counter_of_a_window() -> None:
    key = usage_key("acme", "runs", UsageWindow.HOUR, AT)
    assert key.window_start == datetime(2024, 12, 31, 23, tzinfo=UTC)
    assert key == usage_key("acme", "runs", UsageWindow.HOUR, AT - timedelta(minutes=59))
    assert key != usage_key("acme", "runs", UsageWindow.HOUR, AT + timedelta(microseconds=1))


def test_aggregations_sum_count_and_keep_the_max() -> None:
    assert aggregate(TOKENS, 10, 5) == 15
    assert aggregate(RUNS, 10, 5) == 11
    assert aggregate(SEATS, 10, 5) == 10
    assert aggregate(SEATS, 10, 12) == 12


@pytest.mark.parametrize(("current", "amount"), [(-1, 1), (0, -1), (MAX_USAGE, 1), (0, True)])
def test_negative_non_integer_or_overflowing_usage_is_invalid(current: int, amount: int) -> None:
    with pytest.raises(InvalidUsage) as caught:
        aggregate(TOKENS, current, amount)
    assert caught.value.code == "metering.invalid"
    assert caught.value.details["meter"] == "llm.tokens"


def test_usage_below_the_limit_is_allowed_and_reports_the_thresholds_it_crosses() -> None:
    decision = check_usage(TOKENS, [budget(1_000)], usage={UsageWindow.MONTH: 400}, amount=450)
    assert decision.allowed
    (check,) = decision.checks
    assert (check.before, check.after, check.alerts, check.blocked) == (400, 850, (50, 80), False)
    assert decision.alerts == (check,)
    assert decision.error() is None
    decision.raise_if_blocked()


def test_reaching_the_limit_exactly_is_allowed_and_alerts_at_100_percent() -> None:
    decision = check_usage(TOKENS, [budget(1_000)], usage={UsageWindow.MONTH: 850}, amount=150)
    assert decision.allowed
    assert decision.checks[0].alerts == (100,)


def test_a_threshold_already_crossed_does_not_alert_again() -> None:
    check = check_budget(TOKENS, budget(1_000), current=500, amount=10)
    assert check.alerts == ()


def test_usage_past_a_blocking_limit_is_refused_naming_the_meter() -> None:
    decision = check_usage(TOKENS, [budget(1_000)], usage={UsageWindow.MONTH: 990}, amount=11)
    assert not decision.allowed
    assert decision.checks[0].blocked
    assert decision.alerts == ()
    with pytest.raises(BudgetExceeded) as caught:
        decision.raise_if_blocked()
    assert caught.value.code == "budget.exceeded"
    assert caught.value.details == {
        "meter": "llm.tokens",
        "window": "month",
        "limit": 1_000,
        "current": 990,
        "requested": 11,
    }
    assert "llm.tokens" in str(caught.value)


def test_a_soft_limit_only_alerts() -> None:
    decision = check_usage(
        TOKENS,
        [budget(1_000, block=False, alert_percents=(100, 120))],
        usage={UsageWindow.MONTH: 990},
        amount=300,
    )
    assert decision.allowed
    assert decision.checks[0].alerts == (100, 120)


def test_every_window_is_checked_and_one_block_stops_all_alerts() -> None:
    daily = budget(100, window=UsageWindow.DAY)
    monthly = budget(6_000, window=UsageWindow.MONTH, alert_percents=(1,))
    usage = {UsageWindow.DAY: 90, UsageWindow.MONTH: 50}
    decision = check_usage(TOKENS, [daily, monthly], usage=usage, amount=20)
    assert not decision.allowed
    assert [c.blocked for c in decision.checks] == [True, False]
    assert [c.alerts for c in decision.checks] == [(), ()]
    allowed = check_usage(TOKENS, [daily, monthly], usage=usage, amount=10)
    assert allowed.allowed
    assert [c.alerts for c in allowed.checks] == [(100,), (1,)]
    assert decision.error() is not None
    assert decision.error().details["window"] == "day"  # type: ignore[union-attr]


def test_a_count_meter_blocks_the_request_after_the_limit() -> None:
    policy = budget(3, meter="runs", window=UsageWindow.HOUR)
    assert check_usage(RUNS, [policy], usage={UsageWindow.HOUR: 2}, amount=1).allowed
    assert not check_usage(RUNS, [policy], usage={UsageWindow.HOUR: 3}, amount=1).allowed


def test_a_policy_for_another_meter_or_with_bad_numbers_is_invalid() -> None:
    with pytest.raises(InvalidUsage, match="policy is for meter"):
        check_usage(RUNS, [budget(5)], usage={}, amount=1)
    with pytest.raises(InvalidUsage, match="alert percent"):
        check_budget(TOKENS, budget(5, alert_percents=(0,)), current=0, amount=1)
    with pytest.raises(InvalidUsage, match="limit"):
        check_budget(TOKENS, budget(-5), current=0, amount=1)
    with pytest.raises(InvalidUsage):
        check_usage(TOKENS, [], usage={}, amount=-1)
    assert check_usage(TOKENS, [], usage={}, amount=5).allowed
