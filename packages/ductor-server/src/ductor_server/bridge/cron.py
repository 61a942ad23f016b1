"""A workflow's cron trigger: which expressions are accepted and when they fall due.

Syntax: the five standard fields (minute, hour, day of month, month, day of
week) with `*`, lists, ranges, steps and the names `JAN`-`DEC` and
`SUN`-`SAT` (also the extensions `L`, `W` and `#`), evaluated in UTC, or in
the IANA zone an optional `TZ=Area/City ` prefix names. The expressions are
read by `cronsim` (Debian cron's rules, DST included); nothing here touches a
store or a clock: times are passed in and come back UTC.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

FIELDS = 5
"""A cron expression has exactly this many fields (no seconds field)."""
MAX_LENGTH = 256
"""The longest cron expression accepted, zone prefix included, in characters."""


class CronError(ValueError):
    """A cron expression that cannot be used; the message says why."""


@dataclass(frozen=True)
class Cron:
    """A parsed cron expression: its five fields and its time zone."""

    text: str
    fields: str
    zone: tzinfo

    @classmethod
    def parse(cls, text: str) -> Cron:
        """Read `text` ("*/5 * * * *", "TZ=Europe/Paris 0 9 * * MON-FRI").

        Raises:
            CronError: longer than `MAX_LENGTH`, not five fields, a field out of
                range, an unknown zone, or a day that never comes ("0 0 30 2 *").
        """
        if len(text) > MAX_LENGTH:
            raise CronError(f"a cron expression is at most {MAX_LENGTH} characters")
        fields = text.strip()
        zone: tzinfo = UTC
        if fields.startswith(("TZ=", "CRON_TZ=")):
            name, _, fields = fields.partition("=")[2].partition(" ")
            try:
                zone = ZoneInfo(name)
            except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
                raise CronError(f"unknown time zone {name[:64]!r}") from exc
        parts = fields.split()
        if len(parts) != FIELDS:
            raise CronError(
                f"a cron expression has {FIELDS} fields (minute hour day-of-month month"
                f" day-of-week), this one has {len(parts)}"
            )
        cron = cls(text=text, fields=" ".join(parts), zone=zone)
        try:
            cron.next_after(datetime(2000, 1, 1, tzinfo=UTC))
        except (CronSimError, StopIteration) as exc:
            raise CronError(f"not a valid cron expression: {exc or 'it never falls due'}") from exc
        return cron

    def next_after(self, moment: datetime) -> datetime:
        """The first time strictly after `moment` that the expression names (UTC)."""
        start = moment.astimezone(self.zone).replace(microsecond=0)
        return next(CronSim(self.fields, start)).astimezone(UTC)

    def latest_until(self, moment: datetime) -> datetime:
        """The last time at or before `moment` that the expression names (UTC)."""
        # Reverse iteration steps back one second before it looks: start one
        # second after `moment` (whole seconds) so `moment` itself can match.
        start = moment.astimezone(self.zone).replace(microsecond=0) + timedelta(seconds=1)
        return next(CronSim(self.fields, start, reverse=True)).astimezone(UTC)


def cron_problem(text: str) -> str | None:
    """Why `text` is not an accepted cron expression, or None when it is."""
    try:
        Cron.parse(text)
    except CronError as exc:
        return str(exc)
    return None


__all__ = ["FIELDS", "Cron", "CronError", "cron_problem"]
