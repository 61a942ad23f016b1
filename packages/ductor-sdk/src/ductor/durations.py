"""Duration strings ("250ms", "2s", "1h30m", "7d") to and from `timedelta`; no I/O."""

from __future__ import annotations

import re
from datetime import timedelta

from ductor.errors import DurationError

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

MAX_DURATION = timedelta(days=36_500)
"""The longest duration accepted (100 years): anything longer would overflow the clock."""
_MAX_TEXT_LENGTH = 64


def parse_duration(text: str) -> timedelta:
    """Parse a duration such as "2s", "1h30m", "500ms" or "7d" into a timedelta.

    Raises:
        DurationError: the text is empty or uses an unknown unit.
    """
    if not isinstance(text, str) or not text:
        raise DurationError(f"duration must be a non-empty string like '2s', got {text!r}")
    if len(text) > _MAX_TEXT_LENGTH:
        raise DurationError(f"duration is longer than {_MAX_TEXT_LENGTH} characters")
    pos = 0
    seconds = 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if pos != len(text):
        raise DurationError(
            f"invalid duration {text!r}: use numbers with units ms, s, m, h, d (e.g. '1h30m')"
        )
    if seconds > MAX_DURATION.total_seconds():
        raise DurationError(f"duration {text!r} is longer than the limit of 36500d (100 years)")
    return timedelta(seconds=seconds)


def format_duration(value: timedelta) -> str:
    """Format a timedelta as the canonical duration string ("1h30m", "250ms").

    Raises:
        DurationError: the value is negative or longer than `MAX_DURATION`.
    """
    millis = round(value.total_seconds() * 1000)
    if millis < 0:
        raise DurationError(f"duration must not be negative, got {value!r}")
    if value > MAX_DURATION:  # the server would not parse it back
        raise DurationError(f"duration {value!r} is longer than the limit of 36500d (100 years)")
    if millis == 0:
        return "0s"
    parts: list[str] = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        count, millis = divmod(millis, size)
        if count:
            parts.append(f"{count}{unit}")
    if millis:
        parts.append(f"{millis}ms")
    return "".join(parts)


def canonical_duration(value: str | timedelta) -> str:
    """Normalize a duration given as text or timedelta to its canonical string."""
    if isinstance(value, timedelta):
        return format_duration(value)
    return format_duration(parse_duration(value))
