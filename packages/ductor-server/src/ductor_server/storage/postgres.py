"""The PostgreSQL backend: psycopg 3 async pool, batched writes, SKIP LOCKED claims.

A batch of one of the engine's hot statements runs as one statement over arrays
(`BATCHES_PG`); other batches go through `executemany`, which psycopg runs in
pipeline mode (one round trip for the whole batch). In a transaction, what no
caller waits on (its BEGIN and every `executemany`) is queued and sent in one
pipeline with the next statement whose answer is awaited, or with COMMIT: a
transaction costs one round trip per awaited statement, plus its COMMIT, and the
statements of a round trip leave in one send (`_corked`).
jsonb columns are read as raw bytes and decoded with msgspec straight into
typed records.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import zlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.abc import Buffer
from psycopg.adapt import Loader
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ductor_server.storage._migrator import migration_files, refuse_unknown
from ductor_server.storage._sql_tx import (
    BATCHES_PG,
    CLAIM_RUNS_PG,
    CLAIM_RUNS_WITH_INBOX_PG,
    PG_SKIP_LOCKED,
    PG_SKIP_LOCKED_RUNS,
    Batch,
    SqlTx,
    answered,
    utc,
)
from ductor_server.storage.errors import StoreError, StoreUnavailable
from ductor_server.storage.protocol import Params, Row, Tx

_log = logging.getLogger("ductor.storage")

_BEGIN = "BEGIN"
_COMMIT = "COMMIT"
_CONTROL = frozenset({_BEGIN, _COMMIT})

# pg_advisory_lock key that serializes `migrate()` across processes.
_MIGRATE_LOCK = zlib.crc32(b"ductor.migrate")


# A JSON `\u0000` escape that is not itself an escaped backslash followed by "u0000".
_NUL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


_TCP_CORK: int | None = getattr(socket, "TCP_CORK", None)  # Linux only


@contextmanager
def _corked(conn: psycopg.AsyncConnection[Any]) -> Iterator[None]:
    """Hold the connection's outgoing bytes in the kernel until the block ends.

    In pipeline mode psycopg flushes the socket after each statement it queues,
    so a transaction's pipeline of eight statements was eight `send()` calls on
    the server's side and eight wake-ups of the database's backend, each with a
    few bytes. Corked, they leave together when the pipeline is about to wait
    for its answers (full segments still leave at once, so a big pipeline never
    waits on its own buffer). A socket that cannot be corked (a Unix socket,
    another system) is sent as it is.
    """
    fd = conn.pgconn.socket if _TCP_CORK is not None else -1
    if fd < 0 or not _cork(fd, 1):
        yield
        return
    try:
        yield
    finally:
        _cork(fd, 0)


def _cork(fd: int, on: int) -> bool:
    """Set TCP_CORK on the socket `fd` (owned by libpq: borrowed, never closed)."""
    assert _TCP_CORK is not None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0, fileno=fd)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _TCP_CORK, on)
    except OSError:
        return False
    finally:
        sock.detach()
    return True


class _RawJsonLoader(Loader):
    """Hands jsonb/json columns over as bytes; the store decodes them with msgspec."""

    def load(self, data: Buffer) -> bytes:
        return bytes(data)


BATCH_ROWS = 100
"""The most params rows one batch statement carries; a larger batch is sent as
several. libpq keeps each connection's buffers as large as the largest message
it has sent or received, for the connection's life, so one 500-run request
would otherwise leave every pooled connection holding megabytes. A transaction
also queues no more rows than this (see `PostgresTx`): a step's few writes go
with its next answer, and a large batch's are sent as they come, not held."""


BATCH_BYTES = 1024 * 1024
"""The most text (str and bytes params) one batch statement carries, unless one
row alone has more: for the same reason as `BATCH_ROWS`. A claim that stored 64
step outputs of 1 MB sent them as one 64 MB statement, and the pool's
connections kept such buffers: the server went past 1.3 GB."""


def _chunks(rows: Sequence[Params]) -> Iterator[tuple[int, Sequence[Params]]]:
    """`rows` as the (start, rows) of batch statements of at most `BATCH_ROWS`
    rows and, but for a row that has more alone, `BATCH_BYTES` of text."""
    start, size = 0, 0
    for at, row in enumerate(rows):
        length = sum(len(value) for value in row if isinstance(value, str | bytes))
        if at > start and (at - start >= BATCH_ROWS or size + length > BATCH_BYTES):
            yield start, rows[start:at]
            start, size = at, 0
        size += length
    if start < len(rows):
        yield start, rows[start:]


def _columns(rows: Sequence[Params]) -> list[Any]:
    """A batch's params rows as one list per column, then the batch's size."""
    columns: list[Any] = [list(column) for column in zip(*rows, strict=True)]
    columns.append(len(rows))
    return columns


def store_error(exc: psycopg.Error) -> StoreError:
    """The store error for a psycopg error: unavailable, conflict, or other.

    Its message is the database's primary message only: the DETAIL and CONTEXT
    that follow may quote rows (a duplicate key names the row holding it, a
    deadlock the other processes), and a store error can reach a caller. The
    psycopg error stays its cause, for the log."""
    state = exc.sqlstate or ""
    text = str(exc).strip()
    primary = exc.diag.message_primary if exc.sqlstate else None
    message = f"postgres: {primary or (text.splitlines()[0] if text else type(exc).__name__)}"
    if isinstance(exc, psycopg.OperationalError) and (not state or state[:2] in {"08", "57"}):
        return StoreUnavailable(message)
    if isinstance(exc, psycopg.IntegrityError):
        return StoreError(message, code="storage.conflict", retryable=False)
    if isinstance(exc, psycopg.DataError):
        return StoreError(message, code="storage.invalid_value", retryable=False)
    return StoreError(message, retryable=isinstance(exc, psycopg.OperationalError))


_Queued = tuple[str, Params, "psycopg.AsyncCursor[Row] | None"]
"""A statement waiting to go out with the transaction's next round trip."""


class PostgresTx(SqlTx):
    """A transaction on one pooled connection (only valid inside `transaction()`)."""

    _skip_locked = PG_SKIP_LOCKED
    _skip_locked_runs = PG_SKIP_LOCKED_RUNS
    _lease_key = "(tenant_id, id)"
    _lease_cols = "tenant_id, id"
    _claim_runs_sql = CLAIM_RUNS_WITH_INBOX_PG
    _claim_full_sql = CLAIM_RUNS_PG
    backend = "postgres"

    def __init__(self, conn: psycopg.AsyncConnection[Row], *, transaction: bool = False) -> None:
        super().__init__()
        self._conn = conn
        # One cursor for the statements whose rows are read before the next is
        # sent (a cursor per statement is what `conn.execute` would make).
        self._cur = conn.cursor()
        # In a transaction, the statements no caller waits on (BEGIN, then every
        # `executemany`) wait here, in order, and go out in one pipeline with
        # the next statement whose answer is awaited, or with COMMIT.
        self._writes = conn.cursor() if transaction else None
        # Each queued statement with the cursor that keeps its rows (None: a write,
        # on `_writes`; a cursor: a read whose rows are taken later, see
        # `executemany_returning_later`).
        self._queued: list[_Queued] = [(_BEGIN, (), None)] if transaction else []
        self._queued_rows = 0  # the params rows the queued statements carry
        self._begun = False  # BEGIN has been sent

    async def _send(self, sql: str, params: Params) -> psycopg.AsyncCursor[Row]:
        """Send `sql` (after whatever is queued, in one round trip) and wait for it.

        An error of a queued statement is raised here: the transaction is
        aborted either way, and the caller's work with it.
        """
        if not self._queued:
            return await self._cur.execute(sql, params)
        await self._send_queued(last=(sql, params))
        return self._cur

    async def _send_queued(self, last: tuple[str, Params] | None = None) -> None:
        queued, self._queued, self._queued_rows = self._queued, [], 0
        writes = self._writes
        assert writes is not None  # only a transaction queues
        self._begun = True
        async with self._conn.pipeline():
            with _corked(self._conn):
                for sql, params, cursor in queued:
                    # BEGIN and COMMIT go as text, never as prepared statements: cheap
                    # either way, and what a reader of the wire (`CommitCounter`) sees.
                    await (cursor or writes).execute(
                        sql, params, prepare=False if sql in _CONTROL else None
                    )
                if last is not None:
                    await self._cur.execute(*last)

    async def _commit(self) -> None:
        """COMMIT, in one round trip with the statements still queued (none at all
        when the transaction sent nothing and has nothing to write)."""
        if not self._begun and len(self._queued) <= 1:
            self._queued = []  # only its BEGIN: nothing to commit
            return
        if self._conn.info.transaction_status == TransactionStatus.INERROR:
            # A statement failed and the caller went on: COMMIT would roll back
            # without a word, so say it.
            raise StoreError("postgres: the transaction failed earlier and cannot commit")
        self._queued.append((_COMMIT, (), None))
        await self._send_queued()

    async def _rollback(self) -> None:
        """Forget what is queued and roll back what was sent (a failed pipeline
        leaves the transaction aborted; a failed COMMIT has ended it)."""
        self._queued = []
        if not self._begun or self._conn.info.transaction_status == TransactionStatus.IDLE:
            return
        try:
            await self._conn.rollback()
        except psycopg.Error as exc:
            # The error that ended the transaction is the one to raise; the pool
            # rolls back or drops a connection handed back mid-transaction.
            _log.warning("rolling back failed: %s", exc)

    def to_timestamp(self, value: datetime) -> Any:
        return utc(value)

    def to_json(self, value: Any) -> str | None:
        text = super().to_json(value)
        if text is not None and "\\u0000" in text:
            # jsonb cannot hold U+0000; store U+FFFD rather than fail the whole
            # transaction (a worker would otherwise redeliver the task forever).
            text = _NUL_ESCAPE.sub(r"\1\\ufffd", text)
        return text

    def from_timestamp(self, value: Any) -> datetime:
        moment: datetime = value
        return moment.astimezone(UTC)

    async def fetch_all(self, sql: str, params: Params = ()) -> list[Row]:
        cur = await self._send(sql, params)
        return await cur.fetchall()

    async def execute(self, sql: str, params: Params = ()) -> int:
        cur = await self._send(sql, params)
        return max(cur.rowcount, 0)

    async def executemany(self, sql: str, rows: Sequence[Params]) -> None:
        """In a transaction, queue the statements (see `_send`), sending them once
        `BATCH_ROWS` rows wait; else run them now."""
        if not rows:
            return
        batch = self._batch(sql, rows)
        if self._writes is not None:
            if batch is None:
                self._queued.extend((sql, row, None) for row in rows)
            else:
                for _, chunk in _chunks(rows):
                    self._queued.append((batch.sql, _columns(chunk), None))
            self._queued_rows += len(rows)
            if self._queued_rows >= BATCH_ROWS:
                await self._send_queued()
            return
        if batch is not None:
            for _, chunk in _chunks(rows):
                await self._cur.execute(batch.sql, _columns(chunk))
            return
        if len(rows) == 1:
            await self._cur.execute(sql, rows[0])
            return
        async with self._conn.cursor() as cur:
            await cur.executemany(sql, rows)

    async def executemany_returning(self, sql: str, rows: Sequence[Params]) -> list[Row | None]:
        if not rows:
            return []
        batch = self._batch(sql, rows)
        if batch is not None:
            out: list[Row | None] = [None] * len(rows)
            for at, row in await self._run_batch(batch, rows):
                out[at] = row
            return out
        if len(rows) == 1:
            cur = await self._send(sql, rows[0])
            return [await cur.fetchone()]
        if self._queued:
            await self._send_queued()
        out = []
        async with self._conn.cursor() as cur:
            await cur.executemany(sql, rows, returning=True)
            while True:
                out.append(await cur.fetchone())
                if not cur.nextset():
                    break
        return out

    async def executemany_returning_later(
        self, sql: str, rows: Sequence[Params]
    ) -> Callable[[], Awaitable[list[Row | None]]]:
        """In a transaction, queue the statements (one batch statement per
        `BATCH_ROWS` rows) with cursors of their own: they go out with the next
        statement that answers, or with COMMIT, and the rows are taken from
        their cursors when asked for (sending the queue first if it has not
        gone yet). Elsewhere, and for a batch that has no one-statement form,
        they run now. The rows may be asked for more than once."""
        batch = self._batch(sql, rows)
        if self._writes is None or not rows or (batch is None and len(rows) > 1):
            return answered(await self.executemany_returning(sql, rows))
        cursors: list[tuple[int, Sequence[Params], psycopg.AsyncCursor[Row]]] = []
        if batch is None:
            cursors.append((0, rows, self._conn.cursor()))
            self._queued.append((sql, rows[0], cursors[0][2]))
        else:
            for start, chunk in _chunks(rows):
                cursor = self._conn.cursor()
                cursors.append((start, chunk, cursor))
                self._queued.append((batch.sql, _columns(chunk), cursor))
        self._queued_rows += len(rows)
        out: list[Row | None] = []

        async def taken() -> list[Row | None]:
            if out:  # asked before: the cursors are read already
                return out
            mine = {id(cursor) for _, _, cursor in cursors}
            if any(cursor is not None and id(cursor) in mine for _, _, cursor in self._queued):
                await self._send_queued()
            read: list[Row | None] = [None] * len(rows)
            for start, chunk, cursor in cursors:
                found = await cursor.fetchall()
                if batch is None:
                    read[start] = found[0] if found else None
                    continue
                for at, row in self._placed(batch, start, chunk, found):
                    read[at] = row
            out.extend(read)
            return out

        return taken

    async def executemany_fetch_all(self, sql: str, rows: Sequence[Params]) -> list[list[Row]]:
        if not rows:
            return []
        batch = self._batch(sql, rows)
        if batch is not None:
            found: list[list[Row]] = [[] for _ in rows]
            for at, row in await self._run_batch(batch, rows):
                found[at].append(row)
            return found
        if len(rows) == 1:
            cur = await self._send(sql, rows[0])
            return [await cur.fetchall()]
        if self._queued:
            await self._send_queued()
        out: list[list[Row]] = []
        async with self._conn.cursor() as cur:
            await cur.executemany(sql, rows, returning=True)
            while True:
                out.append(await cur.fetchall())
                if not cur.nextset():
                    break
        return out

    @staticmethod
    def _batch(sql: str, rows: Sequence[Params]) -> Batch | None:
        """The one statement for this batch of `sql`, or None to run it row by row."""
        batch = BATCHES_PG.get(sql)
        if batch is None or len(rows) < 2:
            return None
        if batch.ordinal and batch.key:
            keys = {tuple(row[i] for i in batch.key) for row in rows}
            if len(keys) < len(rows):
                return None
        return batch

    async def _run_batch(self, batch: Batch, rows: Sequence[Params]) -> list[tuple[int, Row]]:
        """Each result row of `batch` with the position of the params row it answers
        (`_chunks`: `BATCH_ROWS` params rows per statement, `BATCH_BYTES` of text)."""
        out: list[tuple[int, Row]] = []
        for start, chunk in _chunks(rows):
            cur = await self._send(batch.sql, _columns(chunk))
            out.extend(self._placed(batch, start, chunk, await cur.fetchall()))
        return out

    @staticmethod
    def _placed(
        batch: Batch, start: int, chunk: Sequence[Params], found: Sequence[Row]
    ) -> list[tuple[int, Row]]:
        """Each result row of one batch statement (`chunk`, the params rows from
        `start`) with the position of the params row it answers."""
        if batch.ordinal:
            return [(start + int(r[0]) - 1, r[1:]) for r in found]
        width = len(batch.key)
        waiting: dict[tuple[Any, ...], deque[int]] = {}
        for at, row in enumerate(chunk, start):
            waiting.setdefault(tuple(row[i] for i in batch.key), deque()).append(at)
        return [(waiting[r[:width]].popleft(), r[width:]) for r in found]

    async def advisory_lock(self, name: str, *, shared: bool = False) -> None:
        """`pg_advisory_xact_lock` (`_shared`) on a 64-bit hash of `name`,
        released at commit."""
        call = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
        await self._send(f"SELECT {call}(hashtextextended(%s, 0))", (name,))


@contextmanager
def _store_errors() -> Iterator[None]:
    """psycopg's and the pool's errors as store errors."""
    try:
        yield
    except PoolTimeout as exc:
        raise StoreUnavailable(f"postgres: {exc}") from exc
    except psycopg.Error as exc:
        # A task cancelled mid-query can see psycopg fail the rollback that
        # follows; it must stay cancelled, not become a store error that a
        # loop's `except Exception` would swallow (and then sleep through stop).
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError() from exc
        raise store_error(exc) from exc


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    conn.adapters.register_loader("jsonb", _RawJsonLoader)
    conn.adapters.register_loader("json", _RawJsonLoader)
    await conn.execute("SET TIME ZONE 'UTC'")


class PostgresStore:
    """The `Store` on PostgreSQL, through a psycopg async connection pool."""

    def __init__(
        self, url: str, *, min_size: int = 1, max_size: int = 10, connect_timeout: float = 10.0
    ) -> None:
        self.url = url
        self._connect_timeout = connect_timeout
        self._min_size = min_size
        self._max_size = max_size
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Row]] | None = None

    @property
    def backend(self) -> str:
        """Always "postgres"."""
        return "postgres"

    def _require_pool(self) -> AsyncConnectionPool[psycopg.AsyncConnection[Row]]:
        if self._pool is None:
            raise StoreUnavailable("the Postgres store is not open")
        return self._pool

    async def open(self) -> None:
        """Open the pool and wait (up to `connect_timeout` seconds) for `min_size`
        connections."""
        if self._pool is not None:
            return
        pool: AsyncConnectionPool[psycopg.AsyncConnection[Row]] = AsyncConnectionPool(
            self.url,
            min_size=self._min_size,
            max_size=self._max_size,
            kwargs={"autocommit": True},
            configure=_configure,
            open=False,
        )
        try:
            await pool.open(wait=True, timeout=self._connect_timeout)
        except PoolTimeout as exc:
            await pool.close()
            reason = await self._connect_error() or str(exc)
            raise StoreUnavailable(f"cannot connect to postgres: {reason}") from exc
        self._pool = pool

    async def _connect_error(self) -> str | None:
        """Why one direct connection fails (the pool only says it timed out); None if
        it succeeds now."""
        try:
            conn = await psycopg.AsyncConnection.connect(self.url, connect_timeout=5)
        except psycopg.Error as exc:
            return " ".join(str(exc).split())
        await conn.close()
        return None

    async def close(self) -> None:
        """Close the pool. Safe to call twice."""
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def ping(self) -> None:
        """Raise `StoreUnavailable` unless `SELECT 1` answers within 5 seconds."""
        try:
            async with self._require_pool().connection(timeout=5.0) as conn:
                await conn.execute("SELECT 1")
        except PoolTimeout as exc:
            raise StoreUnavailable(f"postgres: {exc}") from exc
        except psycopg.Error as exc:
            raise StoreUnavailable(f"postgres: {exc}") from exc

    async def migrate(self) -> list[str]:
        """Apply pending migrations, each in its own transaction, under a session
        advisory lock so that processes starting together apply each file once."""
        files = migration_files("postgres")
        applied: list[str] = []
        try:
            async with self._require_pool().connection() as conn:
                await conn.execute("SELECT pg_advisory_lock(%s)", (_MIGRATE_LOCK,))
                try:
                    await conn.execute(
                        "CREATE TABLE IF NOT EXISTS schema_migrations"
                        " (name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
                    )
                    cur = await conn.execute("SELECT name FROM schema_migrations")
                    done = {r[0] for r in await cur.fetchall()}
                    refuse_unknown("postgres", done)
                    for name, statements in files:
                        if name in done:
                            continue
                        async with conn.transaction():
                            for statement in statements:
                                await conn.execute(statement)
                            await conn.execute(
                                "INSERT INTO schema_migrations (name) VALUES (%s)", (name,)
                            )
                        applied.append(name)
                finally:
                    await conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATE_LOCK,))
        except PoolTimeout as exc:
            raise StoreUnavailable(f"postgres: {exc}") from exc
        except psycopg.Error as exc:
            raise store_error(exc) from exc
        return applied

    async def pending_migrations(self) -> list[str]:
        """The migrations not yet recorded in `schema_migrations`, in order."""
        names = [name for name, _ in migration_files("postgres")]
        try:
            async with self._require_pool().connection() as conn:
                cur = await conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL")
                row = await cur.fetchone()
                if row is None or not row[0]:
                    return names
                cur = await conn.execute("SELECT name FROM schema_migrations")
                done = {r[0] for r in await cur.fetchall()}
        except PoolTimeout as exc:
            raise StoreUnavailable(f"postgres: {exc}") from exc
        except psycopg.Error as exc:
            raise store_error(exc) from exc
        refuse_unknown("postgres", done)
        return [name for name in names if name not in done]

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Tx]:
        pool = self._require_pool()
        with _store_errors():
            async with pool.connection() as conn:
                tx = PostgresTx(conn, transaction=True)
                try:
                    yield tx
                    await tx._run_before_commit()
                    await tx._commit()
                except BaseException:
                    await tx._rollback()
                    raise
            tx._run_after_commit()

    def transaction(self) -> AbstractAsyncContextManager[Tx]:
        """One transaction on a pooled connection; commits on normal exit, rolls
        back on error."""
        return self._transaction()

    @asynccontextmanager
    async def _read(self) -> AsyncIterator[Tx]:
        pool = self._require_pool()
        with _store_errors():
            async with pool.connection() as conn:
                yield PostgresTx(conn)

    def read(self) -> AbstractAsyncContextManager[Tx]:
        """Statements on a pooled connection in autocommit, each on its own (see
        `Store.read`)."""
        return self._read()
