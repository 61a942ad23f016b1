"""API keys: how they are minted, hashed and resolved to a tenant.

A key is shown once; the store keeps only its SHA-256 hash and a short prefix
for display. No route handlers here.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from ductor_server.errors import Unauthenticated
from ductor_server.storage.records import ApiKeyRecord

KEY_PREFIX = "dk_"


def new_api_key() -> str:
    """A fresh random API key (`dk_` + 43 URL-safe characters)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_api_key(key: str) -> str:
    """The SHA-256 hex digest the store keeps instead of the key."""
    return hashlib.sha256(key.encode()).hexdigest()


def display_prefix(key: str) -> str:
    """The part of a key safe to show in listings and logs."""
    return key[:10]


def bearer_token(header: str | None) -> str:
    """The key in an `Authorization: Bearer <key>` header.

    Raises:
        Unauthenticated: no header, another scheme, or an empty key.
    """
    if not header:
        raise Unauthenticated("missing Authorization header: send 'Authorization: Bearer <key>'")
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthenticated("the Authorization header must be 'Bearer <key>'")
    return token


async def authenticate(store: Any, header: str | None) -> str:
    """Resolve the tenant of the key in `header`.

    Raises:
        Unauthenticated: missing, malformed, unknown or revoked key.
    """
    key = bearer_token(header)
    async with store.transaction() as tx:
        record: ApiKeyRecord | None = await tx.find_api_key(hash_api_key(key))
    if record is None or record.revoked_at is not None:
        raise Unauthenticated("unknown or revoked API key")
    return record.tenant_id
