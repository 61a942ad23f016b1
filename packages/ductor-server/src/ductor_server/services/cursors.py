"""Opaque page cursors for lists ordered newest first by (created_at, id)."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime

from ductor_server.errors import RequestInvalid


def time_cursor(created_at: datetime, item_id: str) -> str:
    """The cursor that continues a list after the item created at `created_at`."""
    raw = f"{created_at.isoformat()}|{item_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def parse_time_cursor(cursor: str) -> tuple[datetime, str]:
    """The (created_at, id) a `time_cursor` holds.

    Raises:
        RequestInvalid: not a cursor this API gave (pointer `cursor`).
    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        moment, _, item_id = raw.partition("|")
        parsed = datetime.fromisoformat(moment)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise _not_ours() from None
    if parsed.tzinfo is None or not item_id:
        raise _not_ours()
    return parsed, item_id


def _not_ours() -> RequestInvalid:
    return RequestInvalid("cursor is not one this API gave", details={"pointer": "cursor"})
