"""Connections: a tenant's configured instances of providers, their secrets encrypted
at rest under the server's key ring, and the calls made through them.

`secret_keys` holds the ring (AES-GCM, key ids, rotation), `store` the SQL of the
`connections` table, `shapes` the checks against a provider's Structs, masks and
redaction, and `calls` the ACTION step handler and connection tests. The service
(`services.connections`) and the REST resources sit above.
"""

from __future__ import annotations

from pathlib import Path

from ductor_server.connections.calls import HANDLER, ConnectionCalls
from ductor_server.connections.errors import (
    ConnectionConflict,
    ConnectionInvalid,
    ConnectionNotFound,
    SecretKeysInvalid,
    SecretsUnconfigured,
    SecretsUndecryptable,
)
from ductor_server.connections.secret_keys import SecretKeys, ensure_key_file, new_secret_key


def load_secret_keys(text: str | None, path: Path | None) -> SecretKeys | None:
    """The ring from `DUCTOR_SECRET_KEYS` text, else from the key file, else None.

    Raises:
        SecretKeysInvalid: the text or file does not parse, or the file cannot be read.
    """
    if text:
        try:
            return SecretKeys.parse(text)
        except SecretKeysInvalid as exc:
            raise SecretKeysInvalid(f"DUCTOR_SECRET_KEYS: {exc}") from None
    if path is None:
        return None
    try:
        content = path.read_text()
    except OSError as exc:
        raise SecretKeysInvalid(f"cannot read the secret key file {path}: {exc.strerror}") from None
    try:
        return SecretKeys.parse(content)
    except SecretKeysInvalid as exc:
        raise SecretKeysInvalid(f"{path}: {exc}") from None


__all__ = [
    "HANDLER",
    "ConnectionCalls",
    "ConnectionConflict",
    "ConnectionInvalid",
    "ConnectionNotFound",
    "SecretKeys",
    "SecretKeysInvalid",
    "SecretsUnconfigured",
    "SecretsUndecryptable",
    "ensure_key_file",
    "load_secret_keys",
    "new_secret_key",
]
