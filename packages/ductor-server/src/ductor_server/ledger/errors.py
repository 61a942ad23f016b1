"""Errors of the ledger in the server, each a `DuctorError` with a stable code; no HTTP here.

DuctorError (ductor_core)
 ├── ServerError
 │    └── NotFoundError
 │         └── LedgerObjectNotFound     account.not_found, entry.not_found
 └── SettlementError (ductor_settlement)  ledger.*, hold.*, ... (the rules' own errors)
"""

from __future__ import annotations

from ductor_server.errors import NotFoundError


class LedgerObjectNotFound(NotFoundError):
    """An account or entry the tenant does not have (another tenant's is not found too)."""

    def __init__(self, what: str, object_id: str) -> None:
        super().__init__(
            f"{what} {object_id!r} not found",
            code=f"{what}.not_found",
            details={what: object_id},
        )


__all__ = ["LedgerObjectNotFound"]
