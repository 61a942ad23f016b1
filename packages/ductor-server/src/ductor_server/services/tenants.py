"""Tenants, the operator's business: creating one with its first admin key, listing
them, and minting a key for one (a tenant that lost its admin keys).

Only the operator key (`DUCTOR_OPERATOR_KEY`) or direct access to the database
(`ductor tenants ... --database`) reaches these; a tenant's own API key never
does, and no tenant can see another. How a transport carries the operator key
is not known here.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from datetime import datetime

import msgspec

from ductor_server.engine.clock import Clock, SystemClock
from ductor_server.errors import (
    RequestInvalid,
    TenantConflict,
    TenantInvalid,
    TenantNotFound,
    Unauthenticated,
)
from ductor_server.services.idempotency import Answer, Claim, Outcome
from ductor_server.services.keys import (
    CreatedKey,
    CreateKeyBody,
    NewKey,
    Scope,
    check_new_key,
    create_once,
    created_view,
    has_control,
    insert_key,
)
from ductor_server.storage.protocol import Store, Tx
from ductor_server.storage.records import TenantRecord

OPERATOR = "~operator"
"""The owner of the operator's idempotency keys (no tenant id can look like it)."""
TENANT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_TENANT_NAME = 200
FIRST_KEY_NAME = "admin"


class TenantBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/tenants`: the new tenant's id (1 to 64 letters, digits, `.`, `_`,
    `-`, starting with a letter or digit) and an optional display name."""

    id: str
    name: str | None = None


class TenantView(msgspec.Struct, frozen=True, kw_only=True):
    """A tenant."""

    id: str
    name: str
    created_at: datetime


class TenantCreated(msgspec.Struct, frozen=True, kw_only=True):
    """A new tenant and its first admin key (the secret shown this once)."""

    tenant: TenantView
    key: CreatedKey


class TenantPage(msgspec.Struct, frozen=True, kw_only=True):
    """A page of tenants by id; `next_cursor` continues it (None at the end)."""

    items: list[TenantView]
    next_cursor: str | None


def _view(record: TenantRecord) -> TenantView:
    return TenantView(id=record.id, name=record.name, created_at=record.created_at)


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def _cursor(tenant_id: str) -> str:
    return base64.urlsafe_b64encode(tenant_id.encode()).decode().rstrip("=")


def _after(cursor: str) -> str:
    try:
        after = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        after = ""
    if not TENANT_ID.fullmatch(after):
        raise RequestInvalid("cursor is not one this API gave", details={"pointer": "cursor"})
    return after


def tenant_id_problem(tenant_id: str) -> str | None:
    """Why `tenant_id` cannot name a tenant, or None when it can."""
    if TENANT_ID.fullmatch(tenant_id):
        return None
    return (
        "a tenant id is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
    )


def check_tenant(body: TenantBody) -> tuple[str, str]:
    """The new tenant's id and name, checked whole.

    Raises:
        TenantInvalid: `tenant.invalid`, every problem with its pointer.
    """
    problems: list[dict[str, str]] = []
    if (wrong := tenant_id_problem(body.id)) is not None:
        problems.append({"pointer": "/id", "message": wrong})
    # Without a name the id is the name: only a name given can be wrong on its own.
    name = body.id if body.name is None else body.name
    if body.name is not None and (
        not name.strip() or len(name) > MAX_TENANT_NAME or has_control(name)
    ):
        problems.append(
            {
                "pointer": "/name",
                "message": f"name must be 1 to {MAX_TENANT_NAME} characters, not blank,"
                " without control characters",
            }
        )
    if problems:
        raise TenantInvalid(problems)
    return body.id, name


class TenantsService:
    """The operator's view of tenants.

    Args:
        store: the opened, migrated store.
        clock: when tenants and keys are created; the system clock if None.
        operator_key: the key that authenticates the operator (None: no operator
            calls over the API).
    """

    def __init__(
        self, store: Store, *, clock: Clock | None = None, operator_key: str | None = None
    ) -> None:
        self._store = store
        self._clock = clock or SystemClock()
        self._operator = None if operator_key is None else _digest(operator_key)

    def authenticate_operator(self, key: str) -> None:
        """Accept `key` only if it is the operator key (compared in constant time).

        Raises:
            Unauthenticated: no operator key is configured, or this is not it.
        """
        if self._operator is None:
            raise Unauthenticated(
                "this server has no operator key: set DUCTOR_OPERATOR_KEY to manage tenants"
                " over the API"
            )
        if not hmac.compare_digest(_digest(key), self._operator):
            raise Unauthenticated("this call needs the operator key (DUCTOR_OPERATOR_KEY)")

    async def create(
        self, body: TenantBody, *, idempotency_key: str | None = None
    ) -> Answer[TenantCreated]:
        """Create a tenant and its first admin key (named `admin`, no expiry).

        Raises:
            TenantInvalid: a bad id or name.
            TenantConflict: the tenant exists already.
            IdempotencyConflict: the key was used before with another body.
        """
        tenant_id, name = check_tenant(body)
        now = self._clock.now()
        claim = Claim.of(OPERATOR, "tenants.create", idempotency_key, body, now=now)
        new = NewKey(name=FIRST_KEY_NAME, scopes=(Scope.ADMIN.value,), expires_at=None)
        async with self._store.transaction() as tx:
            if claim is not None:
                replay = await claim.take(tx, TenantCreated)
                if replay is not None:
                    return replay
            if not await tx.insert_tenant(tenant_id, name=name, now=now):
                raise TenantConflict(tenant_id)
            tenant = await tx.get_tenant(tenant_id)
            assert tenant is not None
            record, key = await insert_key(tx, tenant_id, new, now)
            if claim is not None:
                remembered = TenantCreated(
                    tenant=_view(tenant), key=created_view(record, now, None)
                )
                await claim.settle(tx, Answer(remembered, Outcome.CREATED))
        created = TenantCreated(tenant=_view(tenant), key=created_view(record, now, key))
        return Answer(created, Outcome.CREATED)

    async def list(self, *, cursor: str | None = None, limit: int = 100) -> TenantPage:
        """Every tenant by id, `limit` at a time; an empty `cursor` is the first page."""
        after = _after(cursor) if cursor else None
        async with self._store.transaction() as tx:
            records = await tx.page_tenants(after=after, limit=limit + 1)
        page = records[:limit]
        more = len(records) > limit
        return TenantPage(
            items=[_view(r) for r in page],
            next_cursor=_cursor(page[-1].id) if more else None,
        )

    async def create_key(
        self, tenant_id: str, body: CreateKeyBody, *, idempotency_key: str | None = None
    ) -> Answer[CreatedKey]:
        """Create a key of any scopes for an existing tenant.

        Raises:
            TenantNotFound: no such tenant.
            KeyInvalid: a bad name, scope or expiry.
        """
        now = self._clock.now()
        new = check_new_key(body, now)
        claim = Claim.of(
            OPERATOR, "tenants.keys.create", idempotency_key, body, now=now, target=tenant_id
        )

        async def exists(tx: Tx) -> None:
            if await tx.get_tenant(tenant_id) is None:
                raise TenantNotFound(tenant_id)

        return await create_once(self._store, claim, tenant_id, new, now, before=exists)


__all__ = [
    "OPERATOR",
    "TenantBody",
    "TenantCreated",
    "TenantPage",
    "TenantView",
    "TenantsService",
    "check_tenant",
    "tenant_id_problem",
]
