"""A workflow's own limits in the task queue: the `concurrency` option.

A DAG definition declares it as `concurrency` (and an SDK workflow, in the same
shape, as its `concurrency` option):

    {"limit": 2, "key": "input.customer_id"}
    {"rate": {"limit": 100, "period": "1m"}, "key": "input.customer_id"}

`limit` caps how many of the workflow's tasks (steps handed to workers: actions,
bridge calls, routing, notifications) run at once, `rate` how many start per
`period` (a token bucket: `burst` at once, default 1, refilled at `limit /
period`; so at most `burst + limit * T / period` starts in any `T`). Both hold
per tenant and per value of the CEL `key`, evaluated once over the run's input
when the run is created; without a key the workflow's runs share one limit. A
run that waits (a timer, an event, a signal, a child run) holds no slot: only
running steps count.

Pure: validation and key evaluation, no I/O. The server stores the evaluated key
on the run (`stored_key`) and the task queue compares those strings.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

import msgspec

from ductor_core.durations import parse_duration
from ductor_core.errors import DuctorError, DurationError
from ductor_core.expressions import ExpressionEngine

MAX_LIMIT = 100_000
"""The largest `limit`, `rate.limit` or `rate.burst` a workflow may declare."""

MAX_PERIOD = timedelta(days=30)
"""The longest `rate.period`."""

MAX_KEY_CHARS = 64
"""Keys longer than this (or holding control characters) are stored as a digest."""

MAX_KEY_SOURCE = 1_000
"""The longest CEL `key` expression."""


class RateLimit(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """At most `limit` starts per `period` ("1m", "1h"), `burst` of them at once."""

    limit: int
    period: str
    burst: int = 1


class ConcurrencyOption(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A workflow's own limits in the task queue, per value of the CEL `key`
    (over `input`; none: one limit for all its runs). At least one of `limit`
    (tasks at once) and `rate` (task starts per period)."""

    limit: int | None = None
    key: str | None = None
    rate: RateLimit | None = None

    def problems(self) -> list[tuple[str, str]]:
        """What is wrong beyond the types, as (pointer below the option, message)
        pairs; the key's CEL is the caller's to compile (with its cost limits)."""
        out: list[tuple[str, str]] = []
        if self.limit is None and self.rate is None:
            out.append(("", "needs a 'limit' (tasks at once), a 'rate', or both"))
        if self.limit is not None and not 1 <= self.limit <= MAX_LIMIT:
            out.append(("/limit", f"must be 1 to {MAX_LIMIT}, got {self.limit}"))
        if self.key is not None and not self.key.strip():
            out.append(("/key", "must be a CEL expression over 'input', got an empty string"))
        if self.key is not None and len(self.key) > MAX_KEY_SOURCE:
            out.append(("/key", f"must be at most {MAX_KEY_SOURCE} characters long"))
        rate = self.rate
        if rate is not None:
            if not 1 <= rate.limit <= MAX_LIMIT:
                out.append(("/rate/limit", f"must be 1 to {MAX_LIMIT}, got {rate.limit}"))
            if not 1 <= rate.burst <= max(1, min(rate.limit, MAX_LIMIT)):
                out.append(
                    (
                        "/rate/burst",
                        f"must be 1 to the rate's limit ({rate.limit}), got {rate.burst}",
                    )
                )
            try:
                period = parse_duration(rate.period)
            except DurationError as exc:
                out.append(("/rate/period", str(exc)))
            else:
                if not timedelta(0) < period <= MAX_PERIOD:
                    out.append(("/rate/period", "must be longer than zero and at most 30d"))
        return out

    @property
    def per_second(self) -> float | None:
        """The rate's refill in starts per second (None without a rate)."""
        if self.rate is None:
            return None
        return self.rate.limit / parse_duration(self.rate.period).total_seconds()


def key_value(engine: ExpressionEngine, source: str | None, input: Any) -> str:
    """The limit key of a run: the CEL `source` over `{input}` as text ("" with
    no key; a key that fails to evaluate also shares "")."""
    if not source:
        return ""
    try:
        value = engine.evaluate(source, {"input": input})
    except DuctorError:
        return ""
    return value if isinstance(value, str) else msgspec.json.encode(value).decode()


def stored_key(value: str) -> str:
    """What the queue compares for a key value: the value itself when short and
    printable, else `#` and a digest (so any key fits a column and a Redis key)."""
    if len(value) <= MAX_KEY_CHARS and value.isprintable() and not value.startswith("#"):
        return value
    return "#" + hashlib.sha256(value.encode()).hexdigest()[:32]


__all__ = [
    "MAX_KEY_CHARS",
    "MAX_KEY_SOURCE",
    "MAX_LIMIT",
    "MAX_PERIOD",
    "ConcurrencyOption",
    "RateLimit",
    "key_value",
    "stored_key",
]
