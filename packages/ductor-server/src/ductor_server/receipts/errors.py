"""Errors of receipts in the server, each a `DuctorError` with a stable code; no HTTP here.

DuctorError (ductor_core)
 ├── ServerError
 │    └── NotFoundError
 │         └── ReceiptNotFound          receipt.not_found
 └── SettlementError (ductor_settlement)  receipt.* (signing and verifying)
"""

from __future__ import annotations

from ductor_server.errors import NotFoundError


class ReceiptNotFound(NotFoundError):
    """A receipt the tenant does not have (another tenant's is not found too)."""

    def __init__(self, receipt_id: str) -> None:
        super().__init__(
            f"receipt {receipt_id!r} not found",
            code="receipt.not_found",
            details={"receipt": receipt_id},
        )


__all__ = ["ReceiptNotFound"]
