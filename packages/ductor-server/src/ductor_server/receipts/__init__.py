"""Signed receipts served by the server: their table, their signing keys and their errors.

`ductor_server.services.receipts.ReceiptService` builds receipts as
`ductor_settlement.receipts` defines them, signs them with the ring
`receipts.keys` loads, and stores them with `receipts.store.ReceiptsTx`.
This package holds no rules and no transport.
"""

from __future__ import annotations

from ductor_server.receipts.errors import ReceiptNotFound
from ductor_server.receipts.keys import (
    DEV_KEYS_FILE,
    KEY_ENV,
    KEYS_FILE_ENV,
    ReceiptKeyError,
    add_key,
    load_keys,
    parse_inline_key,
    parse_key_file,
)
from ductor_server.receipts.store import (
    InvalidReceiptCursor,
    ReceiptPage,
    ReceiptsTx,
    StoredReceipt,
)

__all__ = [
    "DEV_KEYS_FILE",
    "KEYS_FILE_ENV",
    "KEY_ENV",
    "InvalidReceiptCursor",
    "ReceiptKeyError",
    "ReceiptNotFound",
    "ReceiptPage",
    "ReceiptsTx",
    "StoredReceipt",
    "add_key",
    "load_keys",
    "parse_inline_key",
    "parse_key_file",
]
