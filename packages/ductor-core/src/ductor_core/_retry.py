"""Retry decisions for the tick: exponential backoff with deterministic jitter.

Pure arithmetic over a `RetryPolicy` and an `ErrorInfo`; never reads the clock
or a random source (jitter is a hash of the attempt's identity).
"""

from __future__ import annotations

import hashlib
from datetime import timedelta

from ductor_core.definitions import RetryPolicy
from ductor_core.durations import MAX_DURATION, parse_duration
from ductor_core.runs import ErrorInfo

DEFAULT_RETRY = RetryPolicy()
"""Used when a step sets no `retry`: 3 attempts, 1s initial, coefficient 2, at most 5m."""

JITTER_FRACTION = 0.1
"""Backoff delays are spread by up to +-10% so that retries of many runs do not align."""


def jitter_factor(run_id: str, step_ref: str, item_index: int, attempt: int) -> float:
    """A factor in [1 - JITTER_FRACTION, 1 + JITTER_FRACTION), fixed by the attempt's identity."""
    digest = hashlib.sha256(
        f"{run_id}\x1f{step_ref}\x1f{item_index}\x1f{attempt}".encode()
    ).digest()
    unit = int.from_bytes(digest[:8], "big") / 2.0**64
    return 1.0 + JITTER_FRACTION * (2.0 * unit - 1.0)


def may_retry(policy: RetryPolicy, error: ErrorInfo, attempt: int) -> bool:
    """Whether attempt `attempt` (1-based), which ended in `error`, gets another try."""
    if not error.retryable or error.code in policy.non_retryable_codes:
        return False
    return attempt < policy.max_attempts


def backoff_delay(
    policy: RetryPolicy,
    error: ErrorInfo,
    *,
    run_id: str,
    step_ref: str,
    item_index: int,
    attempt: int,
) -> timedelta:
    """How long to wait before the attempt after `attempt`.

    `error.retry_after_seconds` wins when set (used as is, no jitter, but never
    below zero nor above `MAX_DURATION`, which keeps the timer on the clock). Otherwise
    `initial * coefficient ** (attempt - 1)`, capped at `max_interval`, then
    spread by the deterministic jitter (so a capped delay may exceed the cap by
    up to 10%).

    Raises:
        DurationError: the policy holds an interval that does not parse.
    """
    if error.retry_after_seconds is not None:
        asked = min(max(0.0, error.retry_after_seconds), MAX_DURATION.total_seconds())
        return timedelta(seconds=asked)
    initial = parse_duration(policy.initial_interval).total_seconds()
    cap = parse_duration(policy.max_interval).total_seconds()
    exponent = max(0, attempt - 1)
    try:
        base = initial * policy.backoff_coefficient**exponent
    except OverflowError:
        base = cap
    base = min(base, cap)
    return timedelta(seconds=base * jitter_factor(run_id, step_ref, item_index, attempt))
