"""Errors raised by the store, all `DuctorError`s with stable codes.

DuctorError
 ├── StoreError          a database error the store could not classify (retryable)
 │    └── StoreUnavailable   the database cannot be reached (retryable)
 └── InvalidCursor       a list cursor that the store did not issue
"""

from __future__ import annotations

from ductor_core.errors import DuctorError


class StoreError(DuctorError):
    """A database operation failed; retrying the whole transaction may help."""

    code = "storage.error"
    retryable = True


class StoreUnavailable(StoreError):
    """The database cannot be reached or did not answer."""

    code = "storage.unavailable"


class InvalidCursor(DuctorError):
    """A pagination cursor that is malformed or was not issued by the store."""

    code = "request.invalid"
