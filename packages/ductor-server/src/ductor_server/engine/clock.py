"""The `Clock` port and its two implementations: the system clock and a manual one.

The engine reads time only through a `Clock`, so tests can move time by hand.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Where the engine gets `now` from (always timezone-aware UTC)."""

    def now(self) -> datetime:
        """The current time, UTC."""
        ...


class SystemClock:
    """The real wall clock."""

    def now(self) -> datetime:
        """The current time, UTC."""
        return datetime.now(UTC)


class ManualClock:
    """A clock that only moves when told to; for tests of timers and retries."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2030, 1, 1, tzinfo=UTC)

    def now(self) -> datetime:
        """The current (frozen) time."""
        return self._now

    def advance(self, delta: timedelta | float) -> datetime:
        """Move time forward by `delta` (seconds if a number); return the new now."""
        step = delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        self._now = self._now + step
        return self._now

    def set(self, when: datetime) -> None:
        """Jump to `when` (must be timezone-aware)."""
        self._now = when
