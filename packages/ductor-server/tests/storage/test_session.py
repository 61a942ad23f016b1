"""The public `Session` seam of a transaction: plain SQL, conversions, the named
lock and the before-commit hook, on both backends (the lock's blocking on Postgres)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable
from datetime import timedelta
from urllib.parse import urlsplit

import pytest

from ductor_server.storage import Store, StoreError, open_store
from ductor_server.storage._sql_tx import SqlTx
from ductor_server.storage.postgres import BATCH_BYTES, BATCH_ROWS, _chunks
from ductor_server.storage.protocol import Tx
from ductor_server.testing import CommitCounter

from .builders import NOW

_TABLE = (
    "CREATE TABLE session_probe (tenant_id TEXT NOT NULL, k TEXT NOT NULL, n INTEGER NOT NULL,"
    " doc TEXT, PRIMARY KEY (tenant_id, k))"
)


class Unbalanced(Exception):
    """Raised by a before-commit check that refuses the transaction."""


async def _probe_table(store: Store) -> None:
    async with store.transaction() as tx:
        await tx.session.execute(_TABLE)


async def _count(store: Store, k: str) -> int | None:
    async with store.transaction() as tx:
        row = await tx.session.fetch_one(
            "SELECT n FROM session_probe WHERE tenant_id = %s AND k = %s", ("t1", k)
        )
    return None if row is None else int(row[0])


async def test_the_session_runs_plain_sql_and_converts_values(store: Store) -> None:
    await _probe_table(store)
    async with store.transaction() as tx:
        db = tx.session
        assert db.backend == store.backend
        doc = db.to_json({"a": [1, 2], "b": None})
        assert db.to_json(None) is None
        changed = await db.execute(
            "INSERT INTO session_probe (tenant_id, k, n, doc) VALUES (%s, %s, %s, %s)",
            ("t1", "x", 1, doc),
        )
        assert changed == 1
        await db.executemany(
            "INSERT INTO session_probe (tenant_id, k, n) VALUES (%s, %s, %s)",
            [("t1", "y", 2), ("t1", "z", 3)],
        )
        returned = await db.executemany_returning(
            "UPDATE session_probe SET n = n + 10 WHERE tenant_id = %s AND k = %s RETURNING n",
            [("t1", "y"), ("t1", "missing"), ("t1", "z")],
        )
        assert returned == [(12,), None, (13,)]
        rows = await db.fetch_all(
            "SELECT k, n FROM session_probe WHERE tenant_id = %s ORDER BY k", ("t1",)
        )
        assert rows == [("x", 1), ("y", 12), ("z", 13)]
        row = await db.fetch_one("SELECT doc FROM session_probe WHERE k = %s", ("x",))
        assert row is not None
        assert db.from_json(row[0]) == {"a": [1, 2], "b": None}
        assert db.from_json(None) is None
        assert await db.fetch_one("SELECT n FROM session_probe WHERE k = %s", ("none",)) is None
        # Timestamps round-trip through the backend's own column type.
        stamp = await db.fetch_one("SELECT created_at FROM tenants WHERE id = %s", ("nobody",))
        assert stamp is None
        moment = NOW + timedelta(microseconds=7)
        await db.execute(
            "INSERT INTO tenants (id, name, created_at) VALUES (%s, %s, %s)",
            ("t1", "One", db.to_timestamp(moment)),
        )
        [(created,)] = await db.fetch_all("SELECT created_at FROM tenants WHERE id = %s", ("t1",))
        assert db.from_timestamp(created) == moment


async def test_before_commit_runs_last_inside_the_transaction(store: Store) -> None:
    await _probe_table(store)
    seen: list[str] = []
    async with store.transaction() as tx:
        db = tx.session

        async def first() -> None:
            seen.append("first")
            # A callback writes through the session; its write commits with the rest.
            await db.execute(
                "UPDATE session_probe SET n = n + 1 WHERE tenant_id = %s AND k = %s", ("t1", "a")
            )
            db.before_commit(late)

        async def second() -> None:
            seen.append("second")

        async def late() -> None:
            seen.append("late")

        db.before_commit(first)
        db.before_commit(second)
        await db.execute(
            "INSERT INTO session_probe (tenant_id, k, n) VALUES (%s, %s, %s)", ("t1", "a", 1)
        )
        assert seen == []  # nothing runs before the block ends
    assert seen == ["first", "second", "late"]
    assert await _count(store, "a") == 2


async def _post_checked(store: Store, entries: list[tuple[str, int]]) -> None:
    """Write entries and a tenant, with a before-commit check that they sum to zero."""
    async with store.transaction() as tx:
        db = tx.session
        await tx.ensure_tenant("t1", name="One", now=NOW)
        await db.executemany(
            "INSERT INTO session_probe (tenant_id, k, n) VALUES (%s, %s, %s)",
            [("t1", k, n) for k, n in entries],
        )

        async def balanced() -> None:
            row = await db.fetch_one(
                "SELECT SUM(n) FROM session_probe WHERE tenant_id = %s", ("t1",)
            )
            total = 0 if row is None else int(row[0])
            if total != 0:
                raise Unbalanced(f"entries sum to {total}")

        db.before_commit(balanced)


async def test_a_before_commit_check_that_raises_rolls_everything_back(store: Store) -> None:
    await _probe_table(store)
    with pytest.raises(Unbalanced):
        await _post_checked(store, [("debit", -5), ("credit", 4)])
    assert await _count(store, "debit") is None
    assert await _count(store, "credit") is None
    async with store.transaction() as tx:
        assert await tx.get_tenant("t1") is None
    # The store is usable afterwards, and a balanced transaction commits.
    await _post_checked(store, [("debit", -5), ("credit", 5)])
    assert await _count(store, "credit") == 5
    async with store.transaction() as tx:
        assert await tx.get_tenant("t1") is not None


async def _raise_inside(store: Store, callback: Callable[[], Awaitable[None]]) -> None:
    async with store.transaction() as tx:
        tx.session.before_commit(callback)
        raise RuntimeError("boom")


async def test_a_block_that_raises_runs_no_before_commit_callback(store: Store) -> None:
    ran: list[str] = []

    async def callback() -> None:
        ran.append("ran")

    with pytest.raises(RuntimeError, match="boom"):
        await _raise_inside(store, callback)
    assert ran == []


async def test_increments_under_one_lock_name_lose_nothing(store: Store) -> None:
    await _probe_table(store)
    async with store.transaction() as tx:
        await tx.session.execute(
            "INSERT INTO session_probe (tenant_id, k, n) VALUES (%s, %s, %s)", ("t1", "c", 0)
        )

    async def increment() -> None:
        async with store.transaction() as tx:
            db = tx.session
            await db.advisory_lock("probe:t1:c")
            row = await db.fetch_one(
                "SELECT n FROM session_probe WHERE tenant_id = %s AND k = %s", ("t1", "c")
            )
            assert row is not None
            await asyncio.sleep(0.01)  # let the others read: without the lock they would
            await db.execute(
                "UPDATE session_probe SET n = %s WHERE tenant_id = %s AND k = %s",
                (int(row[0]) + 1, "t1", "c"),
            )

    await asyncio.gather(*(increment() for _ in range(6)))
    assert await _count(store, "c") == 6


async def _advisory_waiters(store: Store) -> int:
    async with store.transaction() as tx:
        row = await tx.session.fetch_one(
            "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        )
    return 0 if row is None else int(row[0])


async def test_advisory_lock_makes_a_second_transaction_wait_on_postgres(pg_store: Store) -> None:
    order: list[str] = []
    holding = asyncio.Event()
    release = asyncio.Event()

    async def first() -> None:
        async with pg_store.transaction() as tx:
            await tx.session.advisory_lock("ledger:acct-1")
            order.append("first locked")
            holding.set()
            await release.wait()
            order.append("first done")

    async def second() -> None:
        await holding.wait()
        async with pg_store.transaction() as tx:
            await tx.session.advisory_lock("ledger:acct-1")
            order.append("second locked")

    async def other_name() -> None:
        await holding.wait()
        async with pg_store.transaction() as tx:
            await tx.session.advisory_lock("ledger:acct-2")
            order.append("other name locked")

    tasks = [asyncio.create_task(f()) for f in (first, second, other_name)]
    await holding.wait()
    # Wait (bounded) until Postgres reports the second transaction queued on the lock.
    deadline = asyncio.get_running_loop().time() + 10.0
    while await _advisory_waiters(pg_store) < 1:
        assert asyncio.get_running_loop().time() < deadline, "nobody waited for the lock"
        await asyncio.sleep(0.01)
    await tasks[2]  # a different name is not held up
    assert "second locked" not in order
    release.set()
    await asyncio.gather(*tasks)
    assert order.index("first done") < order.index("second locked")
    assert "other name locked" in order


async def test_after_commit_runs_once_the_commit_is_durable(store: Store) -> None:
    await _probe_table(store)
    seen: list[int | None] = []
    counted: list[int | None] = []

    async with store.transaction() as tx:
        await tx.session.execute(
            "INSERT INTO session_probe (tenant_id, k, n) VALUES (%s, %s, %s)", ("t1", "a", 7)
        )
        tx.session.after_commit(lambda: seen.append(7))
        tx.session.after_commit(lambda: (_ for _ in ()).throw(RuntimeError("a bad notice")))
        tx.session.after_commit(lambda: seen.append(8))
        assert seen == []  # nothing before the commit
    # In order; the raising one is logged and skipped, the commit stands.
    assert seen == [7, 8]
    counted.append(await _count(store, "a"))
    assert counted == [7]


async def _rolled_back(store: Store, seen: list[str]) -> None:
    async with store.transaction() as tx:
        tx.session.after_commit(lambda: seen.append("told"))
        raise RuntimeError("boom")


async def _refused(store: Store, seen: list[str]) -> None:
    async def refuse() -> None:
        raise Unbalanced("no")

    async with store.transaction() as tx:
        tx.session.after_commit(lambda: seen.append("told"))
        tx.session.before_commit(refuse)


async def test_after_commit_never_runs_when_the_transaction_rolls_back(store: Store) -> None:
    await _probe_table(store)
    seen: list[str] = []
    with pytest.raises(RuntimeError, match="boom"):
        await _rolled_back(store, seen)
    with pytest.raises(Unbalanced):
        await _refused(store, seen)
    assert seen == []


# --- writes that nobody waits on -------------------------------------------------------


_INSERT = "INSERT INTO session_probe (tenant_id, k, n) VALUES (%s, %s, %s)"


async def test_writes_nobody_waits_on_are_seen_by_the_next_statement_and_committed(
    store: Store,
) -> None:
    await _probe_table(store)
    async with store.transaction() as tx:
        db = tx.session
        await db.executemany(_INSERT, [("t1", "a", 1), ("t1", "b", 2)])
        await db.executemany(_INSERT, [("t1", "c", 3)])
        rows = await db.fetch_all(
            "SELECT k, n FROM session_probe WHERE tenant_id = %s ORDER BY k", ("t1",)
        )
        assert rows == [("a", 1), ("b", 2), ("c", 3)]
        await db.executemany("UPDATE session_probe SET n = n * 10 WHERE k = %s", [("a",)])
    assert await _count(store, "a") == 10  # the last write went out with the commit
    assert await _count(store, "c") == 3


async def test_a_failing_write_nobody_waited_on_rolls_the_whole_transaction_back(
    store: Store,
) -> None:
    await _probe_table(store)

    async def answered_then_duplicate() -> None:
        async with store.transaction() as tx:
            await tx.session.execute(_INSERT, ("t1", "first", 1))
            await tx.session.executemany(_INSERT, [("t1", "dup", 1), ("t1", "dup", 2)])
            await tx.session.executemany(_INSERT, [("t1", "after", 3)])

    async def only_a_duplicate() -> None:
        async with store.transaction() as tx:
            await tx.session.executemany(_INSERT, [("t1", "last", 1), ("t1", "last", 2)])

    with pytest.raises(StoreError):
        await answered_then_duplicate()
    with pytest.raises(StoreError):
        await only_a_duplicate()
    for k in ("first", "dup", "after", "last"):
        assert await _count(store, k) is None
    # The store is usable afterwards.
    async with store.transaction() as tx:
        await tx.session.executemany(_INSERT, [("t1", "ok", 1)])
    assert await _count(store, "ok") == 1


async def test_a_postgres_transaction_waits_once_per_answer_and_once_to_commit(
    postgres_url: str,
) -> None:
    """BEGIN and the writes nobody waits on go with the next statement that
    answers, or with COMMIT (or on their own once 100 rows wait); a transaction
    that sends nothing costs nothing."""
    parts = urlsplit(postgres_url)
    counter = CommitCounter((parts.hostname or "127.0.0.1", parts.port or 5432))
    store = open_store(counter.url(postgres_url) + "?sslmode=disable")
    await store.open()
    try:
        await _probe_table(store)

        async def counted(body: Callable[[Tx], Awaitable[None]]) -> tuple[int, int, int]:
            before = (counter.commits, counter.statements, counter.round_trips)
            async with store.transaction() as tx:
                await body(tx)
            return await _settled(counter, before)

        async def answers_once(tx: Tx) -> None:
            await tx.session.executemany(_INSERT, [("t1", "a", 1), ("t1", "b", 2)])
            await tx.session.fetch_all("SELECT k FROM session_probe WHERE tenant_id = %s", ("t1",))
            await tx.session.executemany(_INSERT, [("t1", "c", 3)])

        async def writes_only(tx: Tx) -> None:
            await tx.session.executemany(_INSERT, [("t1", "d", 4)])

        async def nothing(tx: Tx) -> None:
            return None

        async def many(tx: Tx) -> None:
            rows = [("t1", f"m{i}", i) for i in range(150)]
            await tx.session.executemany(_INSERT, rows)  # sent once 100 rows wait

        # BEGIN, two inserts, the select; then the third insert and COMMIT
        assert await counted(answers_once) == (1, 6, 2)
        assert await counted(writes_only) == (1, 3, 1)  # BEGIN, insert, COMMIT at once
        assert await counted(nothing) == (0, 0, 0)
        assert await counted(many) == (1, 152, 2)  # not all 150 held until COMMIT
        assert await _count(store, "c") == 3
        assert await _count(store, "d") == 4
    finally:
        await store.close()
        counter.close()


async def test_a_postgres_round_trip_leaves_in_one_send_and_never_stays_corked(
    postgres_url: str,
) -> None:
    """psycopg flushes its socket after each statement it pipelines; the store
    corks the socket until the pipeline waits for its answers, so the statements
    of a round trip reach the database together, and uncorks it every time (a
    socket left corked holds what follows for 200 ms)."""
    parts = urlsplit(postgres_url)
    counter = CommitCounter((parts.hostname or "127.0.0.1", parts.port or 5432))
    store = open_store(counter.url(postgres_url) + "?sslmode=disable")
    await store.open()
    try:
        await _probe_table(store)
        before = (counter.commits, counter.statements, counter.round_trips)
        reads = counter.reads
        async with store.transaction() as tx:
            for i in range(8):  # one statement each, queued behind BEGIN
                await tx.session.executemany(_INSERT, [("t1", f"w{i}", i)])
            rows = await tx.session.fetch_all(
                "SELECT count(*) FROM session_probe WHERE tenant_id = %s", ("t1",)
            )
            assert rows == [(8,)]
        # BEGIN, eight inserts and the select, then COMMIT: two round trips
        assert await _settled(counter, before) == (1, 11, 2)
        # each round trip's statements in one send, and its Sync in another at most
        assert counter.reads - reads <= 4
        pool = store._require_pool()  # type: ignore[attr-defined]
        async with pool.connection() as conn:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0, fileno=conn.pgconn.socket)
            try:
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK) == 0
            finally:
                sock.detach()
    finally:
        await store.close()
        counter.close()


async def test_a_postgres_read_asked_for_later_goes_with_the_next_round_trip(
    postgres_url: str,
) -> None:
    """`executemany_returning_later` queues its statement (one per batch) with a
    cursor of its own: it goes with the next statement that answers, or with
    COMMIT, and its rows are read from that cursor."""
    parts = urlsplit(postgres_url)
    counter = CommitCounter((parts.hostname or "127.0.0.1", parts.port or 5432))
    store = open_store(counter.url(postgres_url) + "?sslmode=disable")
    await store.open()
    returning = _INSERT + " ON CONFLICT DO NOTHING RETURNING n"
    try:
        await _probe_table(store)
        before = (counter.commits, counter.statements, counter.round_trips)
        async with store.transaction() as tx:
            assert isinstance(tx, SqlTx)
            one = await tx.executemany_returning_later(returning, [("t1", "x", 1)])
            rows = await tx.session.fetch_all("SELECT k FROM session_probe WHERE k = %s", ("x",))
            assert rows == [("x",)]  # the insert went first, in the same round trip
            assert await one() == [(1,)]
            last = await tx.executemany_returning_later(returning, [("t1", "y", 2)])
        assert await last() == [(2,)]  # read from its cursor after COMMIT
        # BEGIN, insert, select; then insert and COMMIT: two round trips
        assert await _settled(counter, before) == (1, 5, 2)
    finally:
        await store.close()
        counter.close()


async def _settled(counter: CommitCounter, before: tuple[int, int, int]) -> tuple[int, int, int]:
    """What the counter saw since `before`, once the proxy stopped seeing more."""
    seen = None
    for _ in range(100):
        await asyncio.sleep(0.02)
        now = (counter.commits, counter.statements, counter.round_trips)
        if now == seen:
            break
        seen = now
    assert seen is not None
    return (seen[0] - before[0], seen[1] - before[1], seen[2] - before[2])


async def test_a_postgres_transaction_that_failed_does_not_pretend_to_commit(
    pg_store: Store,
) -> None:
    # Postgres answers COMMIT of a failed transaction by rolling it back without
    # an error: a body that swallowed the failure must still hear of it.
    await _probe_table(pg_store)

    async def swallowing() -> None:
        async with pg_store.transaction() as tx:
            await tx.session.executemany(_INSERT, [("t1", "kept?", 1)])
            await tx.session.executemany(_INSERT, [("t1", "twice", 1), ("t1", "twice", 2)])
            with contextlib.suppress(Exception):  # the careless caller under test
                await tx.session.fetch_all("SELECT 1")

    with pytest.raises(StoreError, match="failed earlier"):
        await swallowing()
    assert await _count(pg_store, "kept?") is None


async def test_a_store_error_says_what_failed_without_the_rows_it_failed_on(
    store: Store,
) -> None:
    # A database's error may quote the values of other rows (a duplicate key's
    # DETAIL names the row that holds it); a store error, which may reach a
    # caller, keeps only what failed.
    async with store.transaction() as tx:
        await tx.session.execute(
            "CREATE TABLE probe_keys (tenant_id text, id text, PRIMARY KEY (id))"
        )
        await tx.session.execute("INSERT INTO probe_keys VALUES ('t_other', 'secret-of-other')")
    with pytest.raises(StoreError) as raised:
        async with store.transaction() as tx:
            await tx.session.execute("INSERT INTO probe_keys VALUES ('t_me', 'secret-of-other')")
    assert raised.value.code == "storage.conflict"
    assert "t_other" not in raised.value.message
    assert "secret-of-other" not in raised.value.message
    assert "probe_keys" in raised.value.message  # what failed is still said


def test_a_batch_statement_carries_at_most_a_mebibyte_of_text_but_for_a_row_alone() -> None:
    # libpq keeps a connection's buffers as large as its largest message: a batch
    # of 64 step outputs of 1 MB went out as one 64 MB statement.
    kib = "x" * 1024
    rows = [("t", kib * 400, n) for n in range(6)] + [("t", kib * 1500, 6), ("t", "s", 7)]
    chunks = list(_chunks(rows))
    assert [(start, [row[2] for row in chunk]) for start, chunk in chunks] == [
        (0, [0, 1]),
        (2, [2, 3]),
        (4, [4, 5]),
        (6, [6]),  # over the limit alone: a statement of its own
        (7, [7]),
    ]
    small = [("t", "s", n) for n in range(BATCH_ROWS * 2 + 1)]
    assert [len(chunk) for _, chunk in _chunks(small)] == [BATCH_ROWS, BATCH_ROWS, 1]
    assert list(_chunks([])) == []
    assert BATCH_BYTES == 1024 * 1024
