"""Errors raised by the store, all `DuctorError`s with stable codes.

DuctorError
 ├── StoreError          a database error the store could not classify (retryable)
 │    ├── StoreUnavailable   the database cannot be reached (retryable)
 │    └── SchemaTooNew       a newer Ductor migrated the database (not retryable)
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


class SchemaTooNew(StoreError):
    """The database records migrations this version does not have: a newer version
    migrated it, and this one's code would run against a schema it does not know."""

    code = "storage.schema_too_new"
    retryable = False

    def __init__(self, unknown: list[str]) -> None:
        shown = ", ".join(unknown[:5]) + (
            f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        )
        super().__init__(
            f"a newer version of Ductor migrated it: {len(unknown)} migration(s) this "
            f"version does not have ({shown}); run that version, or restore the backup "
            "taken before the upgrade",
            details={"unknown_migrations": unknown},
        )


class InvalidCursor(DuctorError):
    """A pagination cursor that is malformed or was not issued by the store."""

    code = "request.invalid"
