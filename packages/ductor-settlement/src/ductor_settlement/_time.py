"""The one check every module applies to the times it is given: they must be aware.

Reads no clock; the caller passes every time in.
"""

from __future__ import annotations

from datetime import UTC, datetime

from ductor_settlement.errors import InvalidTime


def aware(moment: datetime, what: str) -> datetime:
    """`moment` converted to UTC; a naive datetime raises `InvalidTime` naming `what`."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise InvalidTime(
            f"{what} must be a timezone-aware datetime (UTC), got naive {moment.isoformat()}",
            details={"field": what, "value": moment.isoformat()},
        )
    return moment.astimezone(UTC)
