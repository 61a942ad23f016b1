"""API keys: minting one for a tenant, and resolving a presented key to its tenant.

A key is shown once; the store keeps only its SHA-256 hash and a short prefix
for display. How a transport carries the key (a header) is not known here.
"""

from __future__ import annotations

import hashlib
import secrets

from ductor_server.engine.clock import Clock, SystemClock
from ductor_server.errors import Unauthenticated
from ductor_server.storage.protocol import Store

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


class KeysService:
    """API keys of every tenant.

    Args:
        store: the opened, migrated store.
        clock: when keys and tenants are created; the system clock if None.
    """

    def __init__(self, store: Store, *, clock: Clock | None = None) -> None:
        self._store = store
        self._clock = clock or SystemClock()

    async def create(self, tenant_id: str, *, name: str, key: str | None = None) -> str:
        """Ensure `tenant_id` exists and store an API key for it (a new one unless `key`);
        returns the key. Storing a key that is already stored changes nothing."""
        key = key or new_api_key()
        key_hash = hash_api_key(key)
        now = self._clock.now()
        async with self._store.transaction() as tx:
            await tx.ensure_tenant(tenant_id, name=tenant_id, now=now)
            if await tx.find_api_key(key_hash) is None:
                await tx.create_api_key(
                    tenant_id,
                    key_id="key_" + key_hash[:16],
                    name=name,
                    prefix=display_prefix(key),
                    key_hash=key_hash,
                    now=now,
                )
        return key

    async def tenant_of(self, key: str) -> str:
        """The tenant whose key this is.

        Raises:
            Unauthenticated: an unknown or revoked key.
        """
        async with self._store.transaction() as tx:
            record = await tx.find_api_key(hash_api_key(key))
        if record is None or record.revoked_at is not None:
            raise Unauthenticated("unknown or revoked API key")
        return record.tenant_id


__all__ = ["KEY_PREFIX", "KeysService", "display_prefix", "hash_api_key", "new_api_key"]
