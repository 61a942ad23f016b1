"""Times as the API writes them: RFC 3339 in UTC, ending in `Z`."""

from __future__ import annotations

from datetime import UTC, datetime


def utc_text(moment: datetime) -> str:
    """`moment` as RFC 3339 text in UTC with a `Z` suffix (a naive time is taken as UTC),
    as msgspec writes an aware datetime, so that times put in text fields read like the
    API's other times."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
