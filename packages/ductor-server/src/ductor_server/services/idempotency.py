"""Idempotency of mutating operations: at most one effect and one answer per key.

A mutating operation given a key claims it first thing in the transaction of
its effect (`Claim.take`). The first caller does the work and stores its
answer on the key in that same transaction (`Claim.settle`), so the effect and
the remembered answer commit together or not at all. A caller whose claim
finds the key committed gets that answer back, marked `replayed`, when it
asked the same thing, and `IdempotencyConflict` when it asked something else.
A concurrent caller with the same key waits for the first to commit or roll
back (see `Tx.claim_idempotency`); a failed operation rolls its claim back,
so a retry may run again.

Keys are scoped by tenant and operation name (`runs.trigger`,
`routing.route`, ...), plus the object the operation acts on when it acts on
one (`runs.cancel:<run id>`), never by transport, so every transport shares
them. Keys a caller gives to name a run are stored with a prefix of their own
(`user_run_key`), apart from the keys the engine gives the runs it starts
(`event:<id>:<family>`). No transport types here.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

import msgspec

from ductor_server.errors import IdempotencyConflict, RequestInvalid
from ductor_server.storage.protocol import Store, Tx
from ductor_server.storage.records import IdempotencyRecord

T = TypeVar("T")

MAX_KEY_LENGTH = 255
"""The longest idempotency key accepted (in characters)."""

KEY_RULE = f"1 to {MAX_KEY_LENGTH} characters, not all blank, without control characters"
"""What a usable idempotency key is, as error messages say it."""

# A key can name what it makes (an event or signal without an id, a batch's runs),
# and those names hold no control characters; no HTTP header value holds one either.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

USER_RUN_KEY_PREFIX = "user:"
"""Stored before a caller's run key; engine keys (`event:...`) never start with it."""

_PENDING = 0  # status of a claimed row until the claimer stores its answer


class Outcome(enum.IntEnum):
    """What a mutation did; each value is the HTTP status that says the same."""

    OK = 200
    CREATED = 201
    ACCEPTED = 202  # queued: the engine applies it on a later tick


@dataclass(frozen=True, slots=True)
class Answer(Generic[T]):
    """The answer of a mutating operation.

    Attributes:
        value: what the operation returns.
        outcome: what it did (created something, queued something, ...).
        replayed: True when this is the remembered answer of an earlier call
            with the same idempotency key; nothing was done again.
    """

    value: T
    outcome: Outcome = Outcome.OK
    replayed: bool = False


def check_key(key: str | None) -> str | None:
    """`key` if it is a usable idempotency key; None means the call has none.

    Raises:
        RequestInvalid: an empty, blank or oversized key, or one holding a
            control character.
    """
    if key is None:
        return None
    if not usable_key(key):
        raise RequestInvalid(
            f"an idempotency key must be {KEY_RULE}",
            details={"length": len(key)},
        )
    return key


def usable_key(key: str) -> bool:
    """Whether `key` is an idempotency key a call may use (see `KEY_RULE`)."""
    return bool(key.strip()) and len(key) <= MAX_KEY_LENGTH and not _CONTROL.search(key)


def user_run_key(key: str | None) -> str | None:
    """How a caller's run key is stored on the run (None stays None)."""
    return None if key is None else USER_RUN_KEY_PREFIX + key


def shown_run_key(stored: str | None) -> str | None:
    """A stored run key as its owner knows it: a caller's key without its prefix."""
    if stored is not None and stored.startswith(USER_RUN_KEY_PREFIX):
        return stored[len(USER_RUN_KEY_PREFIX) :]
    return stored


def fingerprint(scope: str, request: Any) -> str:
    """SHA-256 of the scope and the request's JSON with sorted keys (so key order
    and whitespace of the original body do not count)."""
    canonical = msgspec.json.encode(msgspec.to_builtins(request), order="sorted")
    return hashlib.sha256(scope.encode() + b"\n" + canonical).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    """One keyed call of an operation: what it claims, and how to answer from the key.

    Build it with `Claim.of`; call `take` first thing in the effect's
    transaction, and `settle` with the answer before that transaction commits.
    """

    tenant_id: str
    scope: str
    key: str
    fingerprint: str
    now: datetime

    @classmethod
    def of(
        cls,
        tenant_id: str,
        operation: str,
        key: str | None,
        request: Any,
        *,
        now: datetime,
        target: str | None = None,
    ) -> Claim | None:
        """The claim of a call of `operation` with `key` (None when there is no key).

        Args:
            tenant_id: whose key it is.
            operation: the operation's name, e.g. "runs.trigger".
            key: the caller's idempotency key, or None.
            request: the operation's arguments (fingerprinted: the same key with
                other arguments is a conflict).
            now: when the key is remembered (for expiry).
            target: the id of the object the operation acts on, if any (the same
                key may then be used once per object).

        Raises:
            RequestInvalid: an unusable key.
        """
        key = check_key(key)
        if key is None:
            return None
        scope = operation if target is None else f"{operation}:{target}"
        return cls(
            tenant_id=tenant_id,
            scope=scope,
            key=key,
            fingerprint=fingerprint(scope, request),
            now=now,
        )

    async def take(self, tx: Tx, into: type[T]) -> Answer[T] | None:
        """Claim the key in `tx`: None when this call is the one to do the work,
        else the remembered answer (decoded as `into`).

        Raises:
            IdempotencyConflict: the key was used before with another request.
        """
        found = await tx.claim_idempotency(
            IdempotencyRecord(
                tenant_id=self.tenant_id,
                scope=self.scope,
                key=self.key,
                request_hash=self.fingerprint,
                status_code=_PENDING,
                created_at=self.now,
            )
        )
        if found is None:
            return None
        if found.request_hash != self.fingerprint:
            raise IdempotencyConflict(
                "this Idempotency-Key was already used with a different request",
                details={"key": self.key, "scope": self.scope},
            )
        return Answer(
            value=msgspec.convert(found.response, into),
            outcome=Outcome(found.status_code),
            replayed=True,
        )

    async def settle(self, tx: Tx, answer: Answer[T]) -> None:
        """Remember `answer` on the key claimed in `tx`."""
        await tx.complete_idempotency(
            self.tenant_id,
            self.scope,
            self.key,
            status_code=int(answer.outcome),
            response=msgspec.to_builtins(answer.value),
        )


async def once(
    store: Store,
    claim: Claim | None,
    into: type[T],
    effect: Callable[[Tx], Awaitable[Answer[T]]],
) -> Answer[T]:
    """Run `effect` in one transaction, at most once per `claim` (always without one).

    The claim is taken before the effect and settled with its answer in the
    same transaction; if the effect raises, both roll back.

    Raises:
        IdempotencyConflict: the key was used before with another request.
    """
    async with store.transaction() as tx:
        if claim is not None:
            replay = await claim.take(tx, into)
            if replay is not None:
                return replay
        answer = await effect(tx)
        if claim is not None:
            await claim.settle(tx, answer)
    return answer


__all__ = [
    "KEY_RULE",
    "MAX_KEY_LENGTH",
    "USER_RUN_KEY_PREFIX",
    "Answer",
    "Claim",
    "Outcome",
    "check_key",
    "fingerprint",
    "once",
    "shown_run_key",
    "usable_key",
    "user_run_key",
]
