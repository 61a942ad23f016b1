"""The bridge signing keys: each app's own keys (table `bridge_app_keys`, migration
0600) and the server-wide key from the environment, the fallback for apps with none.

Reads and writes its table through the public storage `Session`; every call
takes the tenant; never commits. The environment is read only by the
`*_from_env` functions, at the edge.

Which keys an app's messages use (`keys_for_app`):
- an app that has ever had a key of its own (even if every one is now revoked
  or expired) is signed and verified with its active keys only, and its
  requests must carry nonces (`v2`): revoking a key never falls back to the
  server-wide key;
- any other app uses the server-wide key (`DUCTOR_BRIDGE_SIGNING_KEY`, and
  `DUCTOR_BRIDGE_SIGNING_KEY_FALLBACK` during its rotation), whose `v1`
  requests are accepted unless `DUCTOR_BRIDGE_REQUIRE_NONCE` is set.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

import msgspec

from ductor.protocol import SigningKeys, Verified, new_nonce, signature_header, verify_signed
from ductor_server.settings import parse_switch
from ductor_server.storage.protocol import Session, Tx

KEY_ENV = "DUCTOR_BRIDGE_SIGNING_KEY"
"""Environment variable holding the primary server-wide bridge signing key."""

FALLBACK_ENV = "DUCTOR_BRIDGE_SIGNING_KEY_FALLBACK"
"""Environment variable holding the previous server-wide key during a rotation."""

REQUIRE_NONCE_ENV = "DUCTOR_BRIDGE_REQUIRE_NONCE"
"""On (1/true/yes/on): requests signed with the server-wide key must carry a nonce too."""

KEY_PREFIX = "dsk_"
"""How an app signing key starts (then 43 URL-safe base64 characters, 256 bits)."""

KEY_ID_PREFIX = "bk_"
"""How an app key's id starts (then 16 hex digits)."""

DEFAULT_GRACE = timedelta(hours=24)
"""How long the keys an app had stay valid after a new key is created."""

SIGN_WITH_AT_MOST = 3
"""The server signs a call to an app with (at most) this many of its newest active keys."""


def signing_keys_from_env(env: Mapping[str, str] | None = None) -> SigningKeys | None:
    """The server-wide bridge signing keys in `env` (default: the process env), or None.

    Raises:
        ValueError: the previous key is set without the key (a rotation half done:
            nothing would be signed, and what the previous key signs would be refused),
            or either is blank (white space only: a key lost on its way, not unset).
    """
    values = os.environ if env is None else env
    for name in (KEY_ENV, FALLBACK_ENV):
        text = values.get(name, "")
        if text and not text.strip():
            raise ValueError(f"{name} is blank: set the key, or unset the variable")
    primary = values.get(KEY_ENV, "").strip()
    fallback = values.get(FALLBACK_ENV, "").strip() or None
    if not primary:
        if fallback is not None:
            raise ValueError(f"{FALLBACK_ENV} is set without {KEY_ENV}: set the new key too")
        return None
    return SigningKeys(primary, fallback)


def require_nonce_from_env(env: Mapping[str, str] | None = None) -> bool:
    """Whether `env` (default: the process env) asks for nonces on server-wide-key requests.

    Raises:
        ValueError: the variable is set but neither on nor off.
    """
    values = os.environ if env is None else env
    text = values.get(REQUIRE_NONCE_ENV, "")
    return parse_switch(REQUIRE_NONCE_ENV, text) if text.strip() else False


class Signer(Protocol):
    """What signs and verifies one app's bridge messages (`BridgeKeys`, `SigningKeys`)."""

    def header(self, body: bytes, *, now: int, nonce: str | None = None) -> str:
        """The `Ductor-Signature` value of `body` (a response, or a request with `nonce`)."""
        ...

    def request_header(self, body: bytes, *, now: int) -> str:
        """The `Ductor-Signature` value of a request, under a fresh nonce."""
        ...

    def verify(self, body: bytes, header: str | None, *, now: int) -> int:
        """Verify an answer's signature; return its timestamp."""
        ...


class BridgeKeys:
    """The keys one app's bridge messages are signed and verified with.

    Args:
        sign_with: the keys signatures are made with, newest first (a header
            carries one `v1` and one `v2` per key, so an app still on an older
            key during a rotation verifies the server's calls).
        verify_with: the keys a message may be signed with.
        app_id: the app these are the own keys of; None for the server-wide key.
        require_nonce: requests must carry `n` and `v2` (always so for own keys).
    """

    __slots__ = ("app_id", "require_nonce", "sign_with", "verify_with")

    def __init__(
        self,
        *,
        sign_with: Sequence[str],
        verify_with: Sequence[str],
        app_id: str | None,
        require_nonce: bool,
    ) -> None:
        self.sign_with = tuple(sign_with)
        self.verify_with = tuple(verify_with)
        self.app_id = app_id
        self.require_nonce = require_nonce

    @classmethod
    def server(cls, keys: SigningKeys, *, require_nonce: bool = False) -> BridgeKeys:
        """The server-wide key (signs with the primary, verifies under either)."""
        fallback = () if keys.fallback is None else (keys.fallback,)
        return cls(
            sign_with=(keys.primary,),
            verify_with=(keys.primary, *fallback),
            app_id=None,
            require_nonce=require_nonce,
        )

    @property
    def own(self) -> bool:
        """Whether these are an app's own keys (not the server-wide key)."""
        return self.app_id is not None

    def header(self, body: bytes, *, now: int, nonce: str | None = None) -> str:
        """The `Ductor-Signature` value of `body` at `now` (with `nonce` for a request).

        Raises:
            SignatureError: `signature.no_key` when no key is active.
        """
        return signature_header(body, self.sign_with or ("",), now, nonce=nonce)

    def request_header(self, body: bytes, *, now: int) -> str:
        """The `Ductor-Signature` value of a request: a fresh nonce, `v1` and `v2`."""
        return self.header(body, now=now, nonce=new_nonce())

    def verify(self, body: bytes, header: str | None, *, now: int) -> int:
        """Verify an answer (no nonce needed); return its timestamp.

        Raises:
            SignatureError: see `ductor.protocol.verify_signed`.
        """
        return verify_signed(body, header, keys=self.verify_with, now=now).timestamp

    def check(self, body: bytes, header: str | None, *, now: int) -> Verified:
        """Verify a request (a nonce when `require_nonce`); the caller records the nonce.

        Raises:
            SignatureError: see `ductor.protocol.verify_signed`.
        """
        return verify_signed(
            body, header, keys=self.verify_with, now=now, require_nonce=self.require_nonce
        )


class AppKey(msgspec.Struct, frozen=True, kw_only=True):
    """An app's signing key as listed: never the secret itself."""

    app_id: str
    key_id: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None

    def active(self, now: datetime) -> bool:
        """Whether the key signs and verifies at `now`."""
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)


class NewAppKey(msgspec.Struct, frozen=True, kw_only=True):
    """A key just created: the only time its secret `signing_key` is shown."""

    key: AppKey
    signing_key: str


_COLS = "app_id, key_id, secret, created_at, expires_at, revoked_at"


def _key(db: Session, row: tuple[Any, ...]) -> AppKey:
    return AppKey(
        app_id=row[0],
        key_id=row[1],
        created_at=db.from_timestamp(row[3]),
        expires_at=None if row[4] is None else db.from_timestamp(row[4]),
        revoked_at=None if row[5] is None else db.from_timestamp(row[5]),
    )


async def _rows(tx: Tx, tenant_id: str, app_id: str) -> list[tuple[Any, ...]]:
    """The app's key rows, newest first."""
    return [
        tuple(row)
        for row in await tx.session.fetch_all(
            f"SELECT {_COLS} FROM bridge_app_keys WHERE tenant_id = %s AND app_id = %s"
            " ORDER BY created_at DESC, key_id DESC",
            (tenant_id, app_id),
        )
    ]


async def create_app_key(
    tx: Tx, tenant_id: str, app_id: str, *, now: datetime, grace: timedelta = DEFAULT_GRACE
) -> NewAppKey:
    """Create a new signing key for the app, its primary from now on.

    The app's other active keys stay valid for `grace` (or until revoked), so
    the app can be redeployed with the new key without a gap.
    """
    db = tx.session
    until = now + grace
    for row in await _rows(tx, tenant_id, app_id):
        old = _key(db, row)
        if old.active(now) and (old.expires_at is None or old.expires_at > until):
            await db.execute(
                "UPDATE bridge_app_keys SET expires_at = %s"
                " WHERE tenant_id = %s AND app_id = %s AND key_id = %s",
                (db.to_timestamp(until), tenant_id, app_id, old.key_id),
            )
    key_id = KEY_ID_PREFIX + secrets.token_hex(8)
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    await db.execute(
        f"INSERT INTO bridge_app_keys (tenant_id, {_COLS}) VALUES (%s, %s, %s, %s, %s, NULL, NULL)",
        (tenant_id, app_id, key_id, secret, db.to_timestamp(now)),
    )
    key = AppKey(app_id=app_id, key_id=key_id, created_at=now, expires_at=None, revoked_at=None)
    return NewAppKey(key=key, signing_key=secret)


async def list_app_keys(tx: Tx, tenant_id: str, app_id: str) -> list[AppKey]:
    """The app's keys, newest first, revoked and expired ones included."""
    return [_key(tx.session, row) for row in await _rows(tx, tenant_id, app_id)]


async def revoke_app_key(
    tx: Tx, tenant_id: str, app_id: str, key_id: str, *, now: datetime
) -> AppKey | None:
    """Revoke one of the app's keys at once; None when it has no such key."""
    db = tx.session
    await db.execute(
        "UPDATE bridge_app_keys SET revoked_at = %s"
        " WHERE tenant_id = %s AND app_id = %s AND key_id = %s AND revoked_at IS NULL",
        (db.to_timestamp(now), tenant_id, app_id, key_id),
    )
    row = await db.fetch_one(
        f"SELECT {_COLS} FROM bridge_app_keys WHERE tenant_id = %s AND app_id = %s AND key_id = %s",
        (tenant_id, app_id, key_id),
    )
    return None if row is None else _key(db, tuple(row))


async def has_own_keys(tx: Tx, tenant_id: str, app_id: str) -> bool:
    """Whether the app has ever had a key of its own (then the server-wide key is
    never used for it)."""
    row = await tx.session.fetch_one(
        "SELECT 1 FROM bridge_app_keys WHERE tenant_id = %s AND app_id = %s LIMIT 1",
        (tenant_id, app_id),
    )
    return row is not None


async def keys_for_app(
    tx: Tx,
    tenant_id: str,
    app_id: str | None,
    *,
    now: datetime,
    server: BridgeKeys | None,
) -> BridgeKeys | None:
    """The keys the app's messages are signed and verified with (see the module
    docstring); `server` for an app with no keys of its own (or no app named).

    None when the app has no keys of its own and the server has no key.
    """
    if app_id is None:
        return server
    rows = await _rows(tx, tenant_id, app_id)
    if not rows:
        return server
    db = tx.session
    active = [str(row[2]) for row in rows if _key(db, row).active(now)]
    return BridgeKeys(
        sign_with=active[:SIGN_WITH_AT_MOST],
        verify_with=active,
        app_id=app_id,
        require_nonce=True,
    )


__all__ = [
    "DEFAULT_GRACE",
    "FALLBACK_ENV",
    "KEY_ENV",
    "KEY_ID_PREFIX",
    "KEY_PREFIX",
    "REQUIRE_NONCE_ENV",
    "SIGN_WITH_AT_MOST",
    "AppKey",
    "BridgeKeys",
    "NewAppKey",
    "Signer",
    "create_app_key",
    "has_own_keys",
    "keys_for_app",
    "list_app_keys",
    "require_nonce_from_env",
    "revoke_app_key",
    "signing_keys_from_env",
]
