"""The ledger served by the server: its tables and its errors.

`ductor_server.services.ledger.LedgerService` applies the pure rules of
`ductor_settlement.Ledger` to what `ledger.store.LedgerTx` loads and stores.
This package holds the tables and the errors only: no rules, no transport.
"""

from __future__ import annotations

from ductor_server.ledger.errors import LedgerObjectNotFound
from ductor_server.ledger.store import AccountRecord, EntryPage, InvalidLedgerCursor, LedgerTx

__all__ = ["AccountRecord", "EntryPage", "InvalidLedgerCursor", "LedgerObjectNotFound", "LedgerTx"]
