"""Storage: the `Store` protocol, its record types, and the SQLite and Postgres backends.

Only this package writes SQL for the engine's tables; the stores of other areas
write theirs through the public `Session` seam (`tx.session`). `open_store`
picks the backend from its target.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

from ductor_server.storage.errors import (
    InvalidCursor,
    SchemaTooNew,
    StoreError,
    StoreUnavailable,
)
from ductor_server.storage.protocol import BeforeCommit, Params, Row, Session, Store, Tx
from ductor_server.storage.records import (
    ApiKeyRecord,
    AttemptRecord,
    EventRecord,
    HistoryRecord,
    IdempotencyRecord,
    InboxItem,
    InboxRef,
    NewHistoryEntry,
    NewInboxItem,
    NewRun,
    NewTask,
    ReadyTask,
    RunInsert,
    RunLimits,
    RunPage,
    RunRecord,
    RunRef,
    RunUpdate,
    TaskRecord,
    TaskRef,
    TaskStatus,
    TenantRecord,
    TimerRecord,
    TimerRef,
    WaitRecord,
    WaitRef,
    WorkflowFamilyRecord,
    WorkflowVersionRecord,
)

POSTGRES_SCHEMES: tuple[str, ...] = ("postgresql", "postgres", "postgresql+psycopg")
"""URL schemes of the Postgres backend (`postgresql+psycopg` is SQLAlchemy's spelling)."""

_SCHEME_WITHOUT_SLASHES = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:(?!//)")
"""`postgres:/db` or `mysql:x`: a URL with its `//` lost, not a file name (two
letters at least, so that a Windows drive such as `C:` stays a path)."""


def open_store(target: str | Path) -> Store:
    """A store for `target`, not yet opened: a `postgresql://`, `postgres://` or
    `postgresql+psycopg://` URL gives the Postgres backend; a `sqlite:///path` URL
    or a plain path (no `scheme:` in front) is a SQLite file.

    Call `await store.open()` (and `await store.migrate()`) before use.

    Raises:
        ValueError: a URL of any other scheme (e.g. `mysql://`), one whose `//`
            is missing (`postgres:/db`), or a Postgres URL whose host or port
            cannot be read (`:99999`, `[bad`).
    """
    text = str(target)
    scheme, sep, rest = text.partition("://")
    if not sep and (slashless := _SCHEME_WITHOUT_SLASHES.match(text)):
        # A path would make a SQLite file named after the URL in the working directory.
        raise ValueError(
            f"malformed database URL {slashless.group(0) + '...'!r} (DUCTOR_DATABASE_URL):"
            " a URL is "
            "scheme://[user@]host[:port]/database (e.g. postgresql://...)"
        )
    if not sep:
        from ductor_server.storage.sqlite import SqliteStore

        return SqliteStore(Path(text))
    if scheme.lower() in POSTGRES_SCHEMES:
        from ductor_server.storage.postgres import PostgresStore

        # psycopg (libpq) knows postgresql:// and postgres:// only.
        plain = text if scheme.lower() != "postgresql+psycopg" else f"postgresql://{rest}"
        try:
            urlsplit(plain).port  # noqa: B018 (reading it checks the host and the port)
        except ValueError as exc:  # never the URL itself: it may hold a password
            raise ValueError(
                f"malformed database URL {scheme + '://...'!r} (DUCTOR_DATABASE_URL): {exc}"
                " (a URL is "
                "scheme://[user@]host[:port]/database)"
            ) from None
        return PostgresStore(plain)
    if scheme.lower() == "sqlite":
        from ductor_server.storage.sqlite import SqliteStore

        return SqliteStore(Path(rest))
    accepted = ", ".join(f"{s}://" for s in (*POSTGRES_SCHEMES, "sqlite"))
    raise ValueError(
        f"unsupported database URL scheme {scheme + '://'!r}: use one of {accepted} "
        "(or leave DUCTOR_DATABASE_URL unset for the embedded SQLite store)"
    )


__all__ = [
    "POSTGRES_SCHEMES",
    "ApiKeyRecord",
    "AttemptRecord",
    "BeforeCommit",
    "EventRecord",
    "HistoryRecord",
    "IdempotencyRecord",
    "InboxItem",
    "InboxRef",
    "InvalidCursor",
    "NewHistoryEntry",
    "NewInboxItem",
    "NewRun",
    "NewTask",
    "Params",
    "ReadyTask",
    "Row",
    "RunInsert",
    "RunLimits",
    "RunPage",
    "RunRecord",
    "RunRef",
    "RunUpdate",
    "SchemaTooNew",
    "Session",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "TaskRecord",
    "TaskRef",
    "TaskStatus",
    "TenantRecord",
    "TimerRecord",
    "TimerRef",
    "Tx",
    "WaitRecord",
    "WaitRef",
    "WorkflowFamilyRecord",
    "WorkflowVersionRecord",
    "open_store",
]
