"""The server's key ring for connection secrets: AES-256-GCM under keys with ids.

`DUCTOR_SECRET_KEYS` is a comma-separated list of `KID:KEY`, newest first; KEY
is the URL-safe base64 of 32 random bytes (`new_secret_key()` makes one). New
writes use the newest key; any key of the ring decrypts what it wrote, so a
ring `k2:...,k1:...` reads rows of both while `ductor connections rotate`
moves them to k2.

A sealed value is `base64url(nonce || ciphertext || tag)` with a fresh 96-bit
nonce, stored beside its key id. The associated data binds it to its tenant
and connection id (`ductor.connection.v1`, tenant, id), so a ciphertext copied
into another row, or another tenant's, does not decrypt. Keys never appear in
a repr, a message or a log line. No I/O here except the dev key file.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ductor_server.connections.errors import SecretKeysInvalid

KEY_BYTES = 32
_NONCE_BYTES = 12
_KID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_URLSAFE_B64 = re.compile(r"[A-Za-z0-9_-]*={0,2}")
_AAD_PREFIX = b"ductor.connection.v1"


@dataclass(frozen=True, slots=True)
class SecretKey:
    """One AES-256 key and its id (the key is never shown)."""

    kid: str
    key: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class Sealed:
    """Secrets encrypted under key `kid`: the text stored in the row."""

    kid: str
    ciphertext: str


class KeyNotInRing(Exception):
    """The key a value was sealed with is not in the ring."""


class Tampered(Exception):
    """The value does not decrypt under its key with this tenant and connection."""


def _aad(tenant_id: str, connection_id: str) -> bytes:
    return b"\x00".join((_AAD_PREFIX, tenant_id.encode(), connection_id.encode()))


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class SecretKeys:
    """A ring of secret keys, newest first; the newest seals, any of them opens."""

    __slots__ = ("_by_kid", "_keys")

    def __init__(self, keys: Sequence[SecretKey]) -> None:
        if not keys:
            raise SecretKeysInvalid("a secret key ring needs at least one key")
        by_kid: dict[str, SecretKey] = {}
        for key in keys:
            if key.kid in by_kid:
                raise SecretKeysInvalid(f"secret key id {key.kid!r} is listed twice")
            if len(key.key) != KEY_BYTES:
                raise SecretKeysInvalid(f"secret key {key.kid!r} is not {KEY_BYTES} bytes")
            by_kid[key.kid] = key
        self._keys = tuple(keys)
        self._by_kid = by_kid

    @classmethod
    def parse(cls, text: str) -> SecretKeys:
        """Parse `KID:KEY[,KID:KEY...]` (newest first; blanks and newlines between
        entries are ignored, and `#` starts a comment line in a key file).

        Raises:
            SecretKeysInvalid: naming the entry at fault (never the key itself).
        """
        keys: list[SecretKey] = []
        lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
        for n, entry in enumerate(
            (e.strip() for e in ",".join(lines).split(",") if e.strip()), start=1
        ):
            kid, sep, material = entry.partition(":")
            kid, material = kid.strip(), material.strip()
            if not sep or not _KID.fullmatch(kid):
                raise SecretKeysInvalid(
                    f"secret key {n} must be KID:KEY with a KID of 1-64 of A-Z a-z 0-9 _ . -"
                )
            try:
                # The decoder drops characters outside the alphabet: refuse them first.
                if not _URLSAFE_B64.fullmatch(material):
                    raise ValueError("not URL-safe base64")
                raw = _b64decode(material)
            except (binascii.Error, ValueError):
                raise SecretKeysInvalid(f"secret key {kid!r} is not URL-safe base64") from None
            if len(raw) != KEY_BYTES:
                raise SecretKeysInvalid(
                    f"secret key {kid!r} must be {KEY_BYTES} bytes, got {len(raw)}"
                )
            keys.append(SecretKey(kid, raw))
        return cls(keys)

    @property
    def newest(self) -> SecretKey:
        """The key new writes use."""
        return self._keys[0]

    @property
    def kids(self) -> tuple[str, ...]:
        """Every key id, newest first."""
        return tuple(k.kid for k in self._keys)

    def __repr__(self) -> str:
        return f"SecretKeys({', '.join(self.kids)})"

    def seal(self, plaintext: bytes, *, tenant_id: str, connection_id: str) -> Sealed:
        """Encrypt `plaintext` for one connection under the newest key."""
        # cryptography loads with the first secret sealed or opened, not at start.
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        key = self.newest
        nonce = os.urandom(_NONCE_BYTES)
        box = AESGCM(key.key).encrypt(nonce, plaintext, _aad(tenant_id, connection_id))
        text = base64.urlsafe_b64encode(nonce + box).decode("ascii").rstrip("=")
        return Sealed(kid=key.kid, ciphertext=text)

    def open(self, sealed: Sealed, *, tenant_id: str, connection_id: str) -> bytes:
        """Decrypt what `seal` gave for this tenant and connection.

        Raises:
            KeyNotInRing: `sealed.kid` is not in the ring.
            Tampered: it does not decrypt (another row's, altered, or a wrong key).
        """
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        key = self._by_kid.get(sealed.kid)
        if key is None:
            raise KeyNotInRing(f"key {sealed.kid!r} is not among the server's secret keys")
        try:
            raw = _b64decode(sealed.ciphertext)
            if len(raw) < _NONCE_BYTES + 16:
                raise Tampered("the stored value is too short")
            return AESGCM(key.key).decrypt(
                raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], _aad(tenant_id, connection_id)
            )
        except (binascii.Error, ValueError, InvalidTag):
            raise Tampered(
                f"the stored value does not decrypt under key {sealed.kid!r}"
                " for this tenant and connection"
            ) from None


def new_secret_key(kid: str | None = None) -> str:
    """A fresh `KID:KEY` entry for `DUCTOR_SECRET_KEYS` (KID: `k` + 8 hex digits).

    Raises:
        SecretKeysInvalid: a `kid` that is not 1-64 of A-Z a-z 0-9 _ . -
    """
    kid = kid or "k" + secrets.token_hex(4)
    if not _KID.fullmatch(kid):
        raise SecretKeysInvalid("a key id is 1-64 of A-Z a-z 0-9 _ . -")
    material = base64.urlsafe_b64encode(secrets.token_bytes(KEY_BYTES)).decode().rstrip("=")
    return f"{kid}:{material}"


def ensure_key_file(path: Path) -> tuple[str, bool]:
    """The ring text in the key file at `path`, made with one fresh key (mode 0600)
    when it does not exist yet; and whether it was made now."""
    if path.exists():
        return path.read_text(), False
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    text = (
        "# Connection secret keys of `ductor dev`, newest first (KID:KEY, one per line).\n"
        + new_secret_key()
        + "\n"
    )
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return text, True


__all__ = [
    "KEY_BYTES",
    "KeyNotInRing",
    "Sealed",
    "SecretKey",
    "SecretKeys",
    "Tampered",
    "ensure_key_file",
    "new_secret_key",
]
