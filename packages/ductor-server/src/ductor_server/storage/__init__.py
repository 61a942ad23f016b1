"""Storage: the `Store` protocol, its record types, and the SQLite and Postgres backends.

Only this package writes SQL for the engine's tables; the stores of other areas
write theirs through the public `Session` seam (`tx.session`). `open_store`
picks the backend from its target.
"""

from __future__ import annotations

from pathlib import Path

from ductor_server.storage.errors import InvalidCursor, StoreError, StoreUnavailable
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


def open_store(target: str | Path) -> Store:
    """A store for `target`, not yet opened: a `postgresql://` (or `postgres://`)
    URL gives the Postgres backend; a `sqlite:///path` URL or anything else is a
    SQLite file path.

    Call `await store.open()` (and `await store.migrate()`) before use.
    """
    text = str(target)
    if text.startswith(("postgresql://", "postgres://")):
        from ductor_server.storage.postgres import PostgresStore

        return PostgresStore(text)
    from ductor_server.storage.sqlite import SqliteStore

    if text.startswith("sqlite://"):
        text = text.removeprefix("sqlite://")
    return SqliteStore(Path(text))


__all__ = [
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
    "RunPage",
    "RunRecord",
    "RunRef",
    "RunUpdate",
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
