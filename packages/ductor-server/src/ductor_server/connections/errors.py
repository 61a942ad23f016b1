"""The errors of connections and their secrets, each a `ServerError` with a stable code.

    ServerError
     ├── NotFoundError
     │    └── ConnectionNotFound          connection.not_found
     ├── ConnectionInvalid               connection.invalid (details: problems, each with a pointer)
     ├── ConnectionConflict              connection.conflict
     ├── SecretsUnconfigured             secrets.unconfigured
     └── SecretsUndecryptable            secrets.undecryptable

`SecretKeysInvalid` is a `ValueError`: a `DUCTOR_SECRET_KEYS` that does not
parse stops the server at start. No message here ever holds a secret.
"""

from __future__ import annotations

from typing import Any

from ductor_server.errors import NotFoundError, ServerError


class ConnectionNotFound(NotFoundError):
    """No connection of this name for this tenant (another tenant's is not found too)."""

    code = "connection.not_found"

    def __init__(self, name: str) -> None:
        super().__init__(f"connection {name!r} not found", details={"name": name})


class ConnectionInvalid(ServerError):
    """A connection's name, provider, config or secrets are wrong; `details` lists every
    problem as `{"pointer", "message"}` (pointers into the request body)."""

    code = "connection.invalid"

    def __init__(self, problems: list[dict[str, Any]]) -> None:
        first = problems[0]["message"] if problems else "invalid connection"
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(f"{first}{more}", details=problems)


class ConnectionConflict(ServerError):
    """The name is taken by another connection of the tenant."""

    code = "connection.conflict"

    def __init__(self, name: str) -> None:
        super().__init__(
            f"the tenant already has a connection named {name!r}", details={"name": name}
        )


class SecretsUnconfigured(ServerError):
    """The server has no secret key, so it cannot store (or read) a connection's secrets."""

    code = "secrets.unconfigured"

    def __init__(self) -> None:
        super().__init__(
            "this server has no secret key, so it cannot keep a connection's secrets:"
            " the operator sets DUCTOR_SECRET_KEYS (see `ductor connections new-key`)"
        )


class SecretsUndecryptable(ServerError):
    """The stored secrets do not decrypt under the server's keys (their key was removed,
    or the row was altered)."""

    code = "secrets.undecryptable"

    def __init__(self, name: str, key_id: str, reason: str) -> None:
        super().__init__(
            f"the secrets of connection {name!r} cannot be decrypted: {reason}",
            details={"name": name, "key_id": key_id},
        )


class SecretKeysInvalid(ValueError):
    """`DUCTOR_SECRET_KEYS` (or a key file) does not parse."""


__all__ = [
    "ConnectionConflict",
    "ConnectionInvalid",
    "ConnectionNotFound",
    "SecretKeysInvalid",
    "SecretsUnconfigured",
    "SecretsUndecryptable",
]
