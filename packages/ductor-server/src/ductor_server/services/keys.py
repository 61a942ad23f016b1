"""API keys: minting, listing and revoking a tenant's keys, and resolving a presented
key to its caller (tenant, key id, scopes).

A key is shown once; the store keeps only its SHA-256 hash and a short prefix
for display. Its scopes say what it may do, each implying the ones below it:

    admin ──► write ──► read
                  └───► events:send

`admin` is everything, key management included; `write` is everything a tenant
does but key management; `read` reads; `events:send` only sends events and
signals (a producer's key). Which scope each call of a transport needs is the
transport's table (`transports/rest/scopes.py`); this module only answers
whether a caller holds it. How a transport carries the key is not known here.

Authentication reads the key on every call (no cache, so a revoked or expired
key fails on its very next request) and writes `last_used_at` at most once a
`touch_every` per key and process.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated

import msgspec

from ductor_core.durations import MAX_DURATION, parse_duration
from ductor_core.errors import DuctorError
from ductor_server.engine.clock import Clock, SystemClock
from ductor_server.errors import (
    Forbidden,
    KeyExpired,
    KeyInvalid,
    KeyNotFound,
    LastAdminKey,
    RequestInvalid,
    Unauthenticated,
)
from ductor_server.services.cursors import parse_time_cursor, time_cursor
from ductor_server.services.idempotency import Answer, Claim, Outcome
from ductor_server.storage.protocol import Store, Tx
from ductor_server.storage.records import ApiKeyRecord

KEY_PREFIX = "dk_"
MAX_NAME_LENGTH = 100
"""The longest key name accepted (in characters)."""
MAX_LIVE_KEYS = 1000
"""The most API keys a tenant may have that are neither revoked nor expired."""
MAX_SCOPES = 8
"""The most entries a new key's `scopes` may list (there are four scopes)."""
TOUCH_EVERY = timedelta(minutes=1)
"""How stale `last_used_at` may get before a use writes it again."""
_MAX_TOUCHED = 10_000  # keys remembered as recently touched, per process


class Scope(enum.StrEnum):
    """What an API key may do (see the module docstring for what each implies)."""

    ADMIN = "admin"
    WRITE = "write"
    READ = "read"
    EVENTS_SEND = "events:send"


_IMPLIES: dict[Scope, frozenset[Scope]] = {
    Scope.ADMIN: frozenset(Scope),
    Scope.WRITE: frozenset({Scope.WRITE, Scope.READ, Scope.EVENTS_SEND}),
    Scope.READ: frozenset({Scope.READ}),
    Scope.EVENTS_SEND: frozenset({Scope.EVENTS_SEND}),
}
_ORDER = {scope: i for i, scope in enumerate(Scope)}


def granted(scopes: Iterable[str]) -> frozenset[Scope]:
    """Every scope that `scopes` hold, implied ones included (unknown names hold none)."""
    held: set[Scope] = set()
    for name in scopes:
        if name in _ORDER:
            held |= _IMPLIES[Scope(name)]
    return frozenset(held)


def new_api_key() -> str:
    """A fresh random API key (`dk_` + 43 URL-safe characters)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_api_key(key: str) -> str:
    """The SHA-256 hex digest the store keeps instead of the key."""
    return hashlib.sha256(key.encode()).hexdigest()


def display_prefix(key: str) -> str:
    """The part of a key safe to show in listings and logs."""
    return key[:10]


def key_id_of(key_hash: str) -> str:
    """The id of the key with this hash (the same key always has the same id)."""
    return "key_" + key_hash[:16]


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling: the tenant and the key it presented, with the key's scopes."""

    tenant_id: str
    key_id: str
    scopes: tuple[str, ...]

    def may(self, needed: Scope) -> bool:
        """True when the key holds `needed` (itself or through a wider scope)."""
        return needed in granted(self.scopes)

    def require(self, needed: Scope) -> None:
        """Refuse the call unless the key holds `needed`.

        Raises:
            Forbidden: `auth.forbidden`, naming the scope needed and those held.
        """
        if not self.may(needed):
            held = ", ".join(self.scopes) or "none"
            raise Forbidden(
                f"this call needs the {needed.value!r} scope; the API key has {held}",
                details={"needed": needed.value, "scopes": list(self.scopes)},
            )


KeyName = Annotated[str, msgspec.Meta(description="A name to recognise the key by.")]


class CreateKeyBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/keys`: a new key's name, scopes and optional expiry.

    Attributes:
        name: 1 to 100 characters without control characters.
        scopes: one or more of `admin`, `write`, `read`, `events:send` (at most 8
            entries; repeats count once).
        expires_at: when the key stops working (RFC 3339 with an offset).
        expires_in: or how long from now it works ("30d", "12h", "90m").
    """

    name: KeyName
    scopes: list[str]
    expires_at: str | None = None
    expires_in: str | None = None


class KeyView(msgspec.Struct, frozen=True, kw_only=True):
    """An API key as listings show it (never its secret).

    `status` is `active`, `expired` or `revoked`; `last_used_at` is kept to
    about a minute.
    """

    id: str
    name: str
    prefix: str
    scopes: list[str]
    status: str
    created_at: datetime
    expires_at: datetime | None
    last_used_at: datetime | None
    revoked_at: datetime | None


class CreatedKey(KeyView, frozen=True, kw_only=True):
    """A key just created: its view and, this once, the secret `key`.

    A replay of the create (the same `Idempotency-Key`) answers the same key
    with `key` null: the secret is never stored, so it is shown only once.
    """

    key: str | None


class KeyPage(msgspec.Struct, frozen=True, kw_only=True):
    """A page of keys, newest first; `next_cursor` continues it (None at the end)."""

    items: list[KeyView]
    next_cursor: str | None


def _status(record: ApiKeyRecord, now: datetime) -> str:
    if record.revoked_at is not None:
        return "revoked"
    if record.expires_at is not None and record.expires_at <= now:
        return "expired"
    return "active"


def key_view(record: ApiKeyRecord, now: datetime) -> KeyView:
    """How `record` is shown at `now`."""
    return KeyView(
        id=record.id,
        name=record.name,
        prefix=record.prefix,
        scopes=list(record.scopes),
        status=_status(record, now),
        created_at=record.created_at,
        expires_at=record.expires_at,
        last_used_at=record.last_used_at,
        revoked_at=record.revoked_at,
    )


def created_view(record: ApiKeyRecord, now: datetime, key: str | None) -> CreatedKey:
    """The answer of a create: the key's view and its secret (None on a replay)."""
    return CreatedKey(**msgspec.structs.asdict(key_view(record, now)), key=key)


@dataclass(frozen=True, slots=True)
class NewKey:
    """A checked request for a key: its name, scopes (canonical order) and expiry."""

    name: str
    scopes: tuple[str, ...]
    expires_at: datetime | None


def has_control(text: str) -> bool:
    """Whether `text` holds a control character (C0, DEL or C1: Unicode's Cc)."""
    return any(ord(c) < 32 or 127 <= ord(c) < 160 for c in text)


def check_new_key(body: CreateKeyBody, now: datetime) -> NewKey:
    """`body` checked whole: every problem with its JSON pointer.

    Raises:
        KeyInvalid: `key.invalid`, `details` listing every problem.
    """
    problems: list[dict[str, str]] = []

    def problem(pointer: str, message: str) -> None:
        problems.append({"pointer": pointer, "message": message})

    name = body.name
    if not name.strip() or len(name) > MAX_NAME_LENGTH or has_control(name):
        problem(
            "/name",
            f"name must be 1 to {MAX_NAME_LENGTH} characters, not blank, without control"
            " characters",
        )
    if not body.scopes:
        problem("/scopes", "give at least one scope: admin, write, read or events:send")
    elif len(body.scopes) > MAX_SCOPES:
        problem("/scopes", f"give at most {MAX_SCOPES} scopes")
    scopes: set[Scope] = set()
    for i, scope in enumerate(body.scopes[:MAX_SCOPES]):
        if scope in _ORDER:
            scopes.add(Scope(scope))
        else:
            problem(
                f"/scopes/{i}",
                f"unknown scope {scope[:50]!r}: use admin, write, read or events:send",
            )
    expires_at: datetime | None = None
    if body.expires_at is not None and body.expires_in is not None:
        problem("/expires_in", "give expires_at or expires_in, not both")
    elif body.expires_at is not None:
        try:
            expires_at = datetime.fromisoformat(body.expires_at)
        except ValueError:
            expires_at = None
        if expires_at is None or expires_at.utcoffset() is None:
            problem(
                "/expires_at",
                "expires_at must be an RFC 3339 time with an offset, e.g. 2030-01-01T00:00:00Z",
            )
            expires_at = None
        elif expires_at <= now:
            problem("/expires_at", "expires_at must be in the future")
        elif expires_at - now > MAX_DURATION:
            problem("/expires_at", "expires_at must be within 100 years")
    elif body.expires_in is not None:
        try:
            lifetime = parse_duration(body.expires_in)
        except DuctorError as error:
            problem("/expires_in", error.message)
        else:
            if lifetime < timedelta(seconds=1):
                problem("/expires_in", "expires_in must be at least 1s")
            else:
                expires_at = now + lifetime
    if problems:
        raise KeyInvalid(problems)
    ordered = tuple(s.value for s in sorted(scopes, key=_ORDER.__getitem__))
    return NewKey(name=name, scopes=ordered, expires_at=expires_at)


def refuse_wider(caller_scopes: Sequence[str], wanted: Sequence[str]) -> None:
    """Refuse a key with a scope its creator does not hold.

    Raises:
        Forbidden: `auth.forbidden`, naming the scopes the creator lacks.
    """
    held = granted(caller_scopes)
    beyond = [s for s in wanted if not granted([s]) <= held]
    if beyond:
        raise Forbidden(
            f"an API key cannot create a key with more scopes than its own: it lacks"
            f" {', '.join(beyond)}",
            details={"scopes": beyond, "held": list(caller_scopes)},
        )


async def insert_key(
    tx: Tx,
    tenant_id: str,
    new: NewKey,
    now: datetime,
    *,
    key: str | None = None,
) -> tuple[ApiKeyRecord, str]:
    """Store a new key (a fresh secret unless `key`) in `tx`; the record and the secret."""
    key = key or new_api_key()
    digest = hash_api_key(key)
    record = await tx.create_api_key(
        tenant_id,
        key_id=key_id_of(digest),
        name=new.name,
        prefix=display_prefix(key),
        key_hash=digest,
        now=now,
        scopes=new.scopes,
        expires_at=new.expires_at,
    )
    return record, key


def lock_keys(tenant_id: str) -> str:
    """The lock that serializes changes to a tenant's set of keys."""
    return f"api_keys:{tenant_id}"


async def _bounded(tx: Tx, tenant_id: str, now: datetime) -> None:
    await tx.session.advisory_lock(lock_keys(tenant_id))
    if await tx.count_live_api_keys(tenant_id, now=now) >= MAX_LIVE_KEYS:
        raise RequestInvalid(
            f"a tenant may have at most {MAX_LIVE_KEYS} live API keys: revoke some first",
            details={"limit": MAX_LIVE_KEYS},
        )


async def create_once(
    store: Store,
    claim: Claim | None,
    tenant_id: str,
    new: NewKey,
    now: datetime,
    *,
    before: Callable[[Tx], Awaitable[None]] | None = None,
) -> Answer[CreatedKey]:
    """Create a key in one transaction, at most once per `claim`, while the tenant has
    fewer than `MAX_LIVE_KEYS` live keys.

    The remembered answer has no secret (`key` null): the store never keeps one.
    `before(tx)`, if given, runs first in the transaction (a check of its own).

    Raises:
        RequestInvalid: the tenant has `MAX_LIVE_KEYS` live keys already.
    """
    async with store.transaction() as tx:
        if claim is not None:
            replay = await claim.take(tx, CreatedKey)
            if replay is not None:
                return replay
        if before is not None:
            await before(tx)
        await _bounded(tx, tenant_id, now)
        record, key = await insert_key(tx, tenant_id, new, now)
        if claim is not None:
            await claim.settle(tx, Answer(created_view(record, now, None), Outcome.CREATED))
    return Answer(created_view(record, now, key), Outcome.CREATED)


class KeysService:
    """API keys of every tenant.

    Args:
        store: the opened, migrated store.
        clock: when keys and tenants are created; the system clock if None.
        touch_every: how stale `last_used_at` may get before a use writes it.
    """

    def __init__(
        self,
        store: Store,
        *,
        clock: Clock | None = None,
        touch_every: timedelta = TOUCH_EVERY,
    ) -> None:
        self._store = store
        self._clock = clock or SystemClock()
        self._touch_every = touch_every
        self._touched: dict[str, datetime] = {}

    async def provision(
        self,
        tenant_id: str,
        *,
        name: str,
        key: str | None = None,
        scopes: Sequence[str] = (Scope.ADMIN,),
    ) -> str:
        """Ensure `tenant_id` exists and store an API key for it (a new one unless
        `key`); returns the key. Storing a key that is already stored changes nothing.
        For the operator's tools (`ductor dev`, tests), not for tenants."""
        key = key or new_api_key()
        now = self._clock.now()
        new = NewKey(name=name, scopes=tuple(Scope(s).value for s in scopes), expires_at=None)
        async with self._store.transaction() as tx:
            await tx.ensure_tenant(tenant_id, name=tenant_id, now=now)
            if await tx.find_api_key(hash_api_key(key)) is None:
                await insert_key(tx, tenant_id, new, now, key=key)
        return key

    async def authenticate(self, key: str) -> Caller:
        """The caller presenting `key`.

        Raises:
            Unauthenticated: an unknown or revoked key (`auth.unauthenticated`).
            KeyExpired: a key past its expiry (`auth.key_expired`).
        """
        digest = hash_api_key(key)
        async with self._store.read() as tx:  # one statement: no transaction needed
            record = await tx.find_api_key(digest)
        # The lookup is by hash; the comparison after it does not leak timing either.
        if (
            record is None
            or not hmac.compare_digest(record.key_hash, digest)
            or record.revoked_at is not None
        ):
            raise Unauthenticated("unknown or revoked API key")
        now = self._clock.now()
        if record.expires_at is not None and record.expires_at <= now:
            raise KeyExpired(record.expires_at)
        await self._touch(record, now)
        return Caller(tenant_id=record.tenant_id, key_id=record.id, scopes=record.scopes)

    async def _touch(self, record: ApiKeyRecord, now: datetime) -> None:
        stale_before = now - self._touch_every
        if record.last_used_at is not None and record.last_used_at > stale_before:
            return
        last = self._touched.get(record.id)
        if last is not None and last > stale_before:
            return
        if len(self._touched) >= _MAX_TOUCHED:
            self._touched = {k: at for k, at in self._touched.items() if at > stale_before}
        self._touched[record.id] = now
        async with self._store.transaction() as tx:
            await tx.touch_api_key(record.tenant_id, record.id, now=now, stale_before=stale_before)

    async def create(
        self, caller: Caller, body: CreateKeyBody, *, idempotency_key: str | None = None
    ) -> Answer[CreatedKey]:
        """Create a key for the caller's tenant, with no scope the caller lacks.

        Raises:
            KeyInvalid: a bad name, scope or expiry (every problem, with pointers).
            Forbidden: a scope the caller's key does not hold.
            RequestInvalid: the tenant has `MAX_LIVE_KEYS` live keys already.
            IdempotencyConflict: the key was used before with another body.
        """
        now = self._clock.now()
        new = check_new_key(body, now)
        refuse_wider(caller.scopes, new.scopes)
        claim = Claim.of(caller.tenant_id, "keys.create", idempotency_key, body, now=now)
        return await create_once(self._store, claim, caller.tenant_id, new, now)

    async def list(self, tenant_id: str, *, cursor: str | None = None, limit: int = 50) -> KeyPage:
        """The tenant's keys, newest first, `limit` at a time (revoked and expired too);
        an empty `cursor` is the first page."""
        before = parse_time_cursor(cursor) if cursor else None
        async with self._store.transaction() as tx:
            records = await tx.page_api_keys(tenant_id, before=before, limit=limit + 1)
        now = self._clock.now()
        page = records[:limit]
        more = len(records) > limit
        return KeyPage(
            items=[key_view(r, now) for r in page],
            next_cursor=time_cursor(page[-1].created_at, page[-1].id) if more else None,
        )

    async def get(self, tenant_id: str, key_id: str) -> KeyView:
        """One of the tenant's keys.

        Raises:
            KeyNotFound: no such key for this tenant.
        """
        async with self._store.transaction() as tx:
            record = await tx.get_api_key(tenant_id, key_id)
        if record is None:
            raise KeyNotFound(key_id)
        return key_view(record, self._clock.now())

    async def revoke(self, tenant_id: str, key_id: str) -> KeyView:
        """Revoke one of the tenant's keys: it fails from its next request on.
        Revoking a revoked key changes nothing.

        Raises:
            KeyNotFound: no such key for this tenant.
            LastAdminKey: it is the tenant's last live admin key.
        """
        now = self._clock.now()
        async with self._store.transaction() as tx:
            # Two revokes of the tenant's last two admin keys must not both pass.
            await tx.session.advisory_lock(lock_keys(tenant_id))
            record = await tx.get_api_key(tenant_id, key_id)
            if record is None:
                raise KeyNotFound(key_id)
            if record.revoked_at is not None:
                return key_view(record, now)
            if (
                _status(record, now) == "active"
                and Scope.ADMIN in record.scopes
                and await tx.count_live_api_keys(tenant_id, now=now, scope=Scope.ADMIN) <= 1
            ):
                raise LastAdminKey(key_id)
            await tx.revoke_api_key(tenant_id, key_id, now=now)
            revoked = await tx.get_api_key(tenant_id, key_id)
        assert revoked is not None
        return key_view(revoked, now)


__all__ = [
    "KEY_PREFIX",
    "Caller",
    "CreateKeyBody",
    "CreatedKey",
    "KeyPage",
    "KeyView",
    "KeysService",
    "NewKey",
    "Scope",
    "check_new_key",
    "create_once",
    "display_prefix",
    "granted",
    "has_control",
    "hash_api_key",
    "key_view",
    "new_api_key",
    "refuse_wider",
]
