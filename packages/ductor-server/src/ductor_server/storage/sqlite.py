"""The embedded SQLite backend: one file, WAL mode, one writer at a time.

The stdlib `sqlite3` connection lives on one dedicated worker thread, so the
event loop never blocks on disk; transactions are serialized by an asyncio lock.
"""

from __future__ import annotations

import asyncio
import errno
import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

from ductor_server.storage._migrator import migration_files, refuse_unknown
from ductor_server.storage._sql_tx import SqlTx, utc
from ductor_server.storage.errors import StoreError, StoreUnavailable
from ductor_server.storage.protocol import Params, Row, Tx

T = TypeVar("T")

_BUSY_TIMEOUT_MS = 10_000


@lru_cache(maxsize=512)
def _qmark(sql: str) -> str:
    return sql.replace("%s", "?")


def _timestamp(value: datetime) -> str:
    # Fixed width, always UTC: text order is time order.
    return utc(value).isoformat(timespec="microseconds")


class SqliteTx(SqlTx):
    """A transaction on the SQLite connection (only valid inside `transaction()`)."""

    backend = "sqlite"

    def __init__(self, store: SqliteStore) -> None:
        super().__init__()
        self._store = store

    def to_timestamp(self, value: datetime) -> Any:
        return _timestamp(value)

    def from_timestamp(self, value: Any) -> datetime:
        return datetime.fromisoformat(value)

    async def fetch_all(self, sql: str, params: Params = ()) -> list[Row]:
        def run(conn: sqlite3.Connection) -> list[Row]:
            return conn.execute(_qmark(sql), tuple(params)).fetchall()

        return await self._store._call(run)

    async def execute(self, sql: str, params: Params = ()) -> int:
        def run(conn: sqlite3.Connection) -> int:
            return conn.execute(_qmark(sql), tuple(params)).rowcount

        return await self._store._call(run)

    async def executemany(self, sql: str, rows: Sequence[Params]) -> None:
        def run(conn: sqlite3.Connection) -> None:
            conn.executemany(_qmark(sql), [tuple(r) for r in rows])

        await self._store._call(run)

    async def executemany_fetch_all(self, sql: str, rows: Sequence[Params]) -> list[list[Row]]:
        def run(conn: sqlite3.Connection) -> list[list[Row]]:
            query = _qmark(sql)
            return [conn.execute(query, tuple(params)).fetchall() for params in rows]

        return await self._store._call(run)

    async def executemany_returning(self, sql: str, rows: Sequence[Params]) -> list[Row | None]:
        def run(conn: sqlite3.Connection) -> list[Row | None]:
            query = _qmark(sql)
            out: list[Row | None] = []
            for params in rows:
                found = conn.execute(query, tuple(params)).fetchall()
                out.append(found[0] if found else None)
            return out

        return await self._store._call(run)

    async def advisory_lock(self, name: str, *, shared: bool = False) -> None:
        """Nothing to do: BEGIN IMMEDIATE already made this transaction the only
        writer until it ends, which serializes every lock name at once."""


class SqliteStore:
    """The `Store` on a SQLite file (created on open, with its directory)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._lock = asyncio.Lock()
        self._holder: asyncio.Task[Any] | None = None

    @property
    def backend(self) -> str:
        """Always "sqlite"."""
        return "sqlite"

    def _connect(self) -> sqlite3.Connection:
        if str(self.path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # A new database is readable by its owner only (it holds every tenant's
            # data); SQLite gives its -wal and -shm files the database's mode.
            with suppress(FileExistsError):
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            # SQLite opens a file it cannot write read-only, and only the first write
            # would fail: a server on it would answer ready and fail every request.
            if not os.access(self.path, os.R_OK | os.W_OK):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self.path))
        conn = sqlite3.connect(
            str(self.path),
            isolation_level=None,  # we issue BEGIN/COMMIT ourselves
            check_same_thread=False,  # only ever used from the one worker thread
            timeout=_BUSY_TIMEOUT_MS / 1000,
        )
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode = WAL")
        # NORMAL in WAL mode survives a killed process; only an OS crash may
        # drop the last commits.
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn, executor = self._conn, self._executor
        if conn is None or executor is None:
            raise StoreUnavailable("the SQLite store is not open")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(executor, fn, conn)
        except sqlite3.IntegrityError as exc:
            raise StoreError(f"sqlite: {exc}", code="storage.conflict", retryable=False) from exc
        except sqlite3.OperationalError as exc:
            raise StoreError(f"sqlite: {exc}") from exc
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite: {exc}", retryable=False) from exc

    async def open(self) -> None:
        """Open (and create if needed) the database file."""
        if self._conn is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ductor-sqlite")
        loop = asyncio.get_running_loop()
        try:
            self._conn = await loop.run_in_executor(self._executor, self._connect)
        except (sqlite3.Error, OSError) as exc:
            # OSError: the file or its directory cannot be made (no permission).
            self._executor.shutdown(wait=False)
            self._executor = None
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise StoreUnavailable(f"cannot open {self.path}: {why}") from exc

    async def close(self) -> None:
        """Close the connection and its thread. Safe to call twice."""
        conn, executor = self._conn, self._executor
        self._conn, self._executor = None, None
        if conn is not None and executor is not None:
            async with self._lock:
                await asyncio.get_running_loop().run_in_executor(executor, conn.close)
        if executor is not None:
            executor.shutdown(wait=True)

    async def ping(self) -> None:
        """Raise `StoreUnavailable` unless a trivial query answers."""
        try:
            await self._call(lambda conn: conn.execute("SELECT 1").fetchall())
        except StoreError as exc:
            raise StoreUnavailable(str(exc)) from exc

    async def migrate(self) -> list[str]:
        """Apply pending migrations inside one IMMEDIATE transaction (other
        processes wait on the file lock, then see them applied)."""
        files = migration_files("sqlite")

        def run(conn: sqlite3.Connection) -> list[str]:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migrations"
                    " (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)"
                )
                done = {r[0] for r in conn.execute("SELECT name FROM schema_migrations")}
                refuse_unknown("sqlite", done)
                applied: list[str] = []
                for name, statements in files:
                    if name in done:
                        continue
                    for statement in statements:
                        conn.execute(statement)
                    conn.execute(
                        "INSERT INTO schema_migrations (name, applied_at)"
                        " VALUES (?, strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'))",
                        (name,),
                    )
                    applied.append(name)
                conn.execute("COMMIT")
                return applied
            except BaseException:
                conn.execute("ROLLBACK")
                raise

        async with self._lock:
            return await self._call(run)

    async def pending_migrations(self) -> list[str]:
        """The migrations not yet recorded in `schema_migrations`, in order."""
        names = [name for name, _ in migration_files("sqlite")]

        def read(conn: sqlite3.Connection) -> set[str]:
            exists = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
            ).fetchone()
            if exists is None:
                return set()
            return {r[0] for r in conn.execute("SELECT name FROM schema_migrations")}

        async with self._lock:
            done = await self._call(read)
        refuse_unknown("sqlite", done)
        return [name for name in names if name not in done]

    def _refuse_nested(self, what: str) -> asyncio.Task[Any] | None:
        """The current task, once sure it holds no transaction (the one
        connection's lock would deadlock it)."""
        task = asyncio.current_task()
        if task is not None and self._holder is task:
            raise StoreError(
                f"{what} was opened inside a transaction on the same task (it would deadlock)",
                code="storage.nested_transaction",
                retryable=False,
            )
        return task

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Tx]:
        task = self._refuse_nested("a transaction")
        async with self._lock:
            self._holder = task
            try:
                # BEGIN sits inside the try: if we are cancelled while it runs on
                # the worker thread, the queued ROLLBACK still closes it.
                await self._call(lambda conn: conn.execute("BEGIN IMMEDIATE"))
                tx = SqliteTx(self)
                yield tx
                await tx._run_before_commit()
                await self._call(lambda conn: conn.execute("COMMIT"))
            except BaseException:
                await asyncio.shield(self._call(_rollback))
                raise
            finally:
                self._holder = None
        tx._run_after_commit()

    def transaction(self) -> AbstractAsyncContextManager[Tx]:
        """One IMMEDIATE transaction; commits on normal exit, rolls back on error."""
        return self._transaction()

    @asynccontextmanager
    async def _read(self) -> AsyncIterator[Tx]:
        task = self._refuse_nested("a read")
        async with self._lock:
            self._holder = task
            try:
                yield SqliteTx(self)
            finally:
                self._holder = None

    def read(self) -> AbstractAsyncContextManager[Tx]:
        """Statements each on its own, in autocommit (see `Store.read`)."""
        return self._read()


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")
