"""Receipt signing keys: read from a key file or an environment setting, never logged.

A **key file** (`DUCTOR_RECEIPT_KEYS` names it) holds one Ed25519 private key
per line, as its key id and the base64 of its 32-byte seed (RFC 8032)::

    # receipt signing keys: the last one signs, every one is published
    2026-01 3q2+7w...=
    2026-07 q83vEj...=

Blank lines and lines starting with ``#`` are skipped. The **last** key signs
new receipts; every key in the file stays in the published key set, so
rotating is appending a line (`add_key`, or ``ductor receipts add-key FILE``)
and restarting: receipts signed by older keys still verify. Remove a key only
once nobody needs to verify what it signed.

`DUCTOR_RECEIPT_KEY` holds one key inline instead: a line of the same form
(``KID SEED``), a bare base64 seed, or a PKCS#8 PEM block; without a key id,
the id is `key_id_for` its public key. Setting both is an error.

Error messages name the file and line, never the key material.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from pathlib import Path

from ductor_settlement import KeyRing, SigningKey, key_id_for

KEYS_FILE_ENV = "DUCTOR_RECEIPT_KEYS"
"""The environment setting naming the key file."""

KEY_ENV = "DUCTOR_RECEIPT_KEY"
"""The environment setting holding one key inline."""

DEV_KEYS_FILE = "receipt_keys"
"""The key file `ductor dev` writes under its data dir when no key is configured."""

_KID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


class ReceiptKeyError(ValueError):
    """A key file or setting that cannot be read; the message never holds key material."""


def _seed(text: str, where: str) -> bytes:
    try:
        raw = text.encode("ascii").replace(b"-", b"+").replace(b"_", b"/")
        seed = base64.b64decode(raw + b"=" * (-len(raw) % 4), validate=True)
    except (UnicodeEncodeError, binascii.Error, ValueError):
        raise ReceiptKeyError(f"{where}: the key is not base64") from None
    if len(seed) != 32:
        raise ReceiptKeyError(f"{where}: an Ed25519 seed is 32 bytes, not {len(seed)}")
    return seed


def _key_line(line: str, where: str) -> SigningKey:
    parts = line.split()
    if len(parts) == 1:
        return SigningKey.from_seed(_seed(parts[0], where))
    if len(parts) != 2:
        raise ReceiptKeyError(f"{where}: expected 'KEY_ID BASE64_SEED'")
    kid, seed = parts
    if not _KID.fullmatch(kid):
        raise ReceiptKeyError(
            f"{where}: key id {kid!r} must be 1-64 of letters, digits and . _ : -"
        )
    return SigningKey.from_seed(_seed(seed, where), kid)


def parse_key_file(text: str, *, source: str = "key file") -> KeyRing:
    """The ring of the keys in a key file's `text`; its last key signs.

    Raises:
        ReceiptKeyError: a malformed line, a repeated key id, or no key at all.
    """
    keys: list[SigningKey] = []
    for number, line in enumerate(text.splitlines(), start=1):
        # `#` starts a comment wherever it is: neither base64 nor a key id has one.
        stripped = line.split("#", 1)[0].strip()
        if not stripped:
            continue
        key = _key_line(stripped, f"{source}, line {number}")
        if any(k.kid == key.kid for k in keys):
            raise ReceiptKeyError(f"{source}, line {number}: key id {key.kid!r} appears twice")
        keys.append(key)
    if not keys:
        raise ReceiptKeyError(f"{source} holds no key")
    return KeyRing(keys, active=keys[-1].kid)


def parse_inline_key(text: str) -> SigningKey:
    """One key from `DUCTOR_RECEIPT_KEY`: ``KID SEED``, a bare seed, or a PKCS#8 PEM.

    Raises:
        ReceiptKeyError: none of those, or a PEM key that is not Ed25519.
    """
    stripped = text.strip()
    if stripped.startswith("-----BEGIN"):
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import load_pem_private_key

        try:
            private = load_pem_private_key(stripped.encode("ascii"), password=None)
        except (ValueError, TypeError, UnicodeEncodeError):
            raise ReceiptKeyError(f"{KEY_ENV}: not a readable unencrypted PEM key") from None
        if not isinstance(private, Ed25519PrivateKey):
            raise ReceiptKeyError(f"{KEY_ENV}: the PEM key is not an Ed25519 key")
        return SigningKey(key_id_for(private.public_key()), private)
    return _key_line(stripped, KEY_ENV)


def load_keys(keys_file: Path | None, inline: str | None) -> KeyRing | None:
    """The signing ring from a key file or an inline key; None when neither is set.

    Raises:
        ReceiptKeyError: both are set, the file cannot be read, or a key is malformed.
    """
    if keys_file is not None and inline:
        raise ReceiptKeyError(f"set one of {KEYS_FILE_ENV} and {KEY_ENV}, not both")
    if inline:
        key = parse_inline_key(inline)
        return KeyRing([key], active=key.kid)
    if keys_file is None:
        return None
    try:
        text = keys_file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ReceiptKeyError(
            f"cannot read the receipt key file {keys_file}: {exc.strerror}"
        ) from None
    except UnicodeDecodeError:
        raise ReceiptKeyError(f"the receipt key file {keys_file} is not text") from None
    return parse_key_file(text, source=str(keys_file))


def add_key(path: Path, kid: str | None = None) -> SigningKey:
    """Append a fresh key to the key file at `path` (created with mode 0600); it signs
    from the next start. Returns the new key.

    Raises:
        ReceiptKeyError: `kid` is malformed or already in the file, or the file is bad.
    """
    existing: KeyRing | None = None
    if path.exists():
        existing = load_keys(path, None)
    if kid is not None and not _KID.fullmatch(kid):
        raise ReceiptKeyError(f"key id {kid!r} must be 1-64 of letters, digits and . _ : -")
    key = SigningKey.generate(kid)
    if existing is not None and key.kid in existing.key_ids:
        raise ReceiptKeyError(f"key id {key.kid!r} is already in {path}")
    seed = base64.b64encode(key.seed()).decode("ascii")
    header = "" if existing is not None else "# receipt signing keys: the last one signs\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        if existing is not None and not path.read_text(encoding="utf-8").endswith("\n"):
            f.write("\n")
        f.write(f"{header}{key.kid} {seed}\n")
    return key


__all__ = [
    "DEV_KEYS_FILE",
    "KEYS_FILE_ENV",
    "KEY_ENV",
    "ReceiptKeyError",
    "add_key",
    "load_keys",
    "parse_inline_key",
    "parse_key_file",
]
