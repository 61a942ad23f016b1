"""Store lifecycle: migrations, ping, closed stores, rollback writes nothing."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from pathlib import Path

import msgspec
import pytest

from ductor_core.runs import RunState, RunStatus, StepState, StepStatus
from ductor_server.storage import (
    AttemptRecord,
    EventRecord,
    NewHistoryEntry,
    RunRef,
    RunUpdate,
    Store,
    StoreError,
    StoreUnavailable,
    TimerRecord,
    open_store,
)
from ductor_server.storage._migrator import migration_files, split_statements
from ductor_server.storage.postgres import PostgresStore
from ductor_server.storage.sqlite import SqliteStore

from .builders import NOW, new_run, new_task

_SECOND = timedelta(seconds=1)


async def test_migrate_again_applies_nothing(store: Store) -> None:
    assert await store.migrate() == []
    await store.ping()


async def test_pending_migrations_lists_what_migrate_would_apply(store_target: str) -> None:
    store = open_store(store_target)
    await store.open()
    try:
        every = [name for name, _ in migration_files(store.backend)]
        assert await store.pending_migrations() == every
        assert await store.migrate() == every
        assert await store.pending_migrations() == []
        async with store.transaction() as tx:
            await tx.session.execute("DELETE FROM schema_migrations WHERE name = %s", (every[-1],))
        assert await store.pending_migrations() == [every[-1]]
    finally:
        await store.close()


async def test_a_database_a_newer_version_migrated_is_refused_and_left_alone(
    store_target: str,
) -> None:
    store = open_store(store_target)
    await store.open()
    try:
        every = [name for name, _ in migration_files(store.backend)]
        assert await store.migrate() == every
        async with store.transaction() as tx:
            await tx.session.execute("DELETE FROM schema_migrations WHERE name = %s", (every[-1],))
            await tx.session.execute(
                "INSERT INTO schema_migrations (name, applied_at) VALUES (%s, %s)",
                ("9999_from_the_future", NOW.isoformat()),
            )
        for read in (store.pending_migrations, store.migrate):
            with pytest.raises(StoreError) as refused:
                await read()
            assert refused.value.code == "storage.schema_too_new"
            assert refused.value.retryable is False
            assert "9999_from_the_future" in refused.value.message
            assert refused.value.details == {"unknown_migrations": ["9999_from_the_future"]}
        # Nothing was applied: the missing file is still missing.
        async with store.transaction() as tx:
            rows = await tx.session.fetch_all(
                "SELECT name FROM schema_migrations WHERE name = %s", (every[-1],)
            )
        assert rows == []
    finally:
        await store.close()


async def test_concurrent_migrations_apply_each_file_once(store_target: str) -> None:
    stores = [open_store(store_target) for _ in range(3)]
    for s in stores:
        await s.open()
    try:
        results = await asyncio.gather(*(s.migrate() for s in stores))
        applied = [name for result in results for name in result]
        assert sorted(applied) == [name for name, _ in migration_files(stores[0].backend)]
        async with stores[0].transaction() as tx:
            await tx.ensure_tenant("t1", name="one", now=NOW)
    finally:
        for s in stores:
            await s.close()


async def test_the_run_kind_migration_gives_stored_bridge_runs_their_kind(store: Store) -> None:
    # Undo 0300 on a migrated store, write runs as earlier releases did, migrate again.
    async with store.transaction() as tx:
        db = tx.session
        for column in ("kind", "kind_state"):
            await db.execute(f"ALTER TABLE runs DROP COLUMN {column}")
        await db.execute("DELETE FROM schema_migrations WHERE name = %s", ("0300_run_kind",))
        for run_id, slug in [("r1", "orders"), ("r2", "bridge:shop:order")]:
            state = new_run("t1", run_id).state
            await db.execute(
                "INSERT INTO runs (tenant_id, id, family_slug, version, status, state,"
                " created_at, updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    "t1",
                    run_id,
                    slug,
                    1,
                    str(state.status),
                    db.to_json(state),
                    db.to_timestamp(NOW),
                    db.to_timestamp(NOW),
                ),
            )
    assert await store.migrate() == ["0300_run_kind"]
    async with store.transaction() as tx:
        dag = await tx.get_run("t1", "r1")
        bridge = await tx.get_run("t1", "r2")
    assert dag is not None
    assert bridge is not None
    assert (dag.kind, dag.kind_state) == ("dag", None)
    assert (bridge.kind, bridge.kind_state) == ("bridge", None)


async def test_closed_store_is_unavailable(store_target: str) -> None:
    s = open_store(store_target)
    with pytest.raises(StoreUnavailable):
        await s.ping()
    await s.open()
    await s.ping()
    await s.close()
    await s.close()  # twice is fine
    with pytest.raises(StoreUnavailable):
        async with s.transaction():
            pass


async def test_unreachable_postgres_is_unavailable() -> None:
    assert open_store("postgresql://postgres@127.0.0.1:1/nothing").backend == "postgres"
    s = PostgresStore("postgresql://postgres@127.0.0.1:1/nothing", connect_timeout=0.5)
    with pytest.raises(StoreUnavailable):
        await s.open()


class Boom(Exception):
    pass


async def test_a_rolled_back_transaction_writes_nothing(store: Store) -> None:
    async def write_then_fail() -> None:
        async with store.transaction() as tx:
            await tx.ensure_tenant("t1", name="one", now=NOW)
            await tx.insert_runs([new_run("t1", "r1")])
            await tx.enqueue_tasks([new_task("t1", "r1", "a")])
            await tx.record_attempts(
                [
                    AttemptRecord(
                        tenant_id="t1",
                        run_id="r1",
                        step_ref="a",
                        attempt=1,
                        ok=True,
                        started_at=NOW,
                        finished_at=NOW,
                    )
                ]
            )
            await tx.set_timers(
                [TimerRecord(tenant_id="t1", run_id="r1", timer_id="x", fire_at=NOW)]
            )
            await tx.insert_events(
                [EventRecord(tenant_id="t1", id="e1", name="n", received_at=NOW)]
            )
            await tx.append_history(
                [NewHistoryEntry(tenant_id="t1", run_id="r1", at=NOW, kind="run.started")]
            )
            raise Boom

    with pytest.raises(Boom):
        await write_then_fail()
    async with store.transaction() as tx:
        assert await tx.get_tenant("t1") is None
        assert await tx.get_run("t1", "r1") is None
        assert await tx.get_runs([RunRef(tenant_id="t1", run_id="r1")]) == []
        assert await tx.lease_tasks(owner="w", limit=10, lease_for=_SECOND, now=NOW) == []
        assert await tx.list_attempts("t1", "r1") == []
        assert await tx.due_timers(now=NOW, limit=10) == []
        assert await tx.get_event("t1", "e1") is None
        assert await tx.list_history("t1", "r1") == []
    # ...and the store still works afterwards.
    async with store.transaction() as tx:
        assert (await tx.insert_runs([new_run("t1", "r1")]))[0].created


async def test_a_cancelled_transaction_writes_nothing(store: Store) -> None:
    entered = asyncio.Event()

    async def writer() -> None:
        async with store.transaction() as tx:
            await tx.insert_runs([new_run("t1", "r1")])
            entered.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(writer())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with store.transaction() as tx:
        assert await tx.get_run("t1", "r1") is None


def test_split_statements_drops_comments_and_keeps_multiline_statements() -> None:
    script = "-- note\nCREATE TABLE a (\n  x int\n);\n\nCREATE INDEX i ON a (x);\n"
    assert split_statements(script) == ["CREATE TABLE a (\n  x int\n)", "CREATE INDEX i ON a (x)"]


async def test_a_new_sqlite_database_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "data" / "ductor.db"
    store = open_store(path)
    await store.open()
    try:
        await store.migrate()  # writes, so the -wal and -shm files exist
        made = [p for p in path.parent.iterdir() if p.name.startswith("ductor.db")]
        assert {p.name for p in made} >= {"ductor.db", "ductor.db-wal", "ductor.db-shm"}
        assert {p.name: p.stat().st_mode & 0o777 for p in made} == {p.name: 0o600 for p in made}
    finally:
        await store.close()
    # An existing file keeps the mode its owner gave it.
    path.chmod(0o640)
    again = open_store(path)
    await again.open()
    await again.close()
    assert path.stat().st_mode & 0o777 == 0o640


def test_both_backends_have_the_same_migrations() -> None:
    sqlite = [name for name, _ in migration_files("sqlite")]
    postgres = [name for name, _ in migration_files("postgres")]
    assert sqlite == postgres
    assert sqlite[0] == "0001_init"


@pytest.mark.parametrize("inner", ["transaction", "read"])
async def test_a_nested_sqlite_transaction_fails_instead_of_deadlocking(
    tmp_path: Path, inner: str
) -> None:
    store = open_store(tmp_path / "nested.db")
    await store.open()
    await store.migrate()
    try:

        async def nested() -> None:
            async with store.transaction() as tx:
                await tx.ensure_tenant("t1", name="one", now=NOW)
                async with getattr(store, inner)():
                    pass

        with pytest.raises(StoreError) as info:
            await asyncio.wait_for(nested(), timeout=10)
        assert info.value.code == "storage.nested_transaction"
        async with store.transaction() as tx:
            assert await tx.get_tenant("t1") is None  # the outer one rolled back
    finally:
        await store.close()


async def test_the_store_survives_transactions_cancelled_at_any_point(store: Store) -> None:
    async def writer(i: int) -> None:
        async with store.transaction() as tx:
            await tx.insert_runs([new_run("t1", f"r{i}")])
            await tx.enqueue_tasks([new_task("t1", f"r{i}", "a")])

    for delay in range(12):
        # cancel after a different number of loop turns each time: before BEGIN,
        # during a statement, between statements, during COMMIT
        task = asyncio.create_task(writer(delay))
        for _ in range(delay):
            await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    async with store.transaction() as tx:
        await tx.insert_runs([new_run("t1", "after")])
    async with store.transaction() as tx:
        assert await tx.get_run("t1", "after") is not None
        # every run that committed has its task too: no half-written transaction
        page = await tx.list_runs("t1", limit=100)
        tasks = await tx.lease_tasks(owner="w", limit=100, lease_for=_SECOND, now=NOW)
    assert {r.id for r in page.items} - {"after"} == {t.run_id for t in tasks}


async def test_two_stores_on_one_sqlite_file_both_write(tmp_path: Path) -> None:
    # e.g. `ductor migrate` or a second process while `ductor dev` runs
    path = tmp_path / "shared.db"
    first, second = open_store(path), open_store(path)
    for s in (first, second):
        await s.open()
        await s.migrate()
    try:

        async def write(s: Store, prefix: str) -> None:
            for i in range(20):
                async with s.transaction() as tx:
                    await tx.insert_runs([new_run("t1", f"{prefix}{i}")])

        await asyncio.wait_for(asyncio.gather(write(first, "a"), write(second, "b")), timeout=60)
        async with first.transaction() as tx:
            assert len((await tx.list_runs("t1", limit=100)).items) == 40
    finally:
        await first.close()
        await second.close()


def test_open_store_picks_the_backend_from_the_target(tmp_path: Path) -> None:
    assert open_store("postgresql://u@127.0.0.1/db").backend == "postgres"
    assert open_store("postgres://u@127.0.0.1/db").backend == "postgres"
    plain = open_store(tmp_path / "a.db")
    url = open_store(f"sqlite://{tmp_path}/b.db")
    assert plain.backend == url.backend == "sqlite"
    assert getattr(url, "path", None) == tmp_path / "b.db"
    sqlalchemy_style = open_store("postgresql+psycopg://u@127.0.0.1/db")
    assert sqlalchemy_style.backend == "postgres"
    assert getattr(sqlalchemy_style, "url", None) == "postgresql://u@127.0.0.1/db"


@pytest.mark.parametrize("target", ["mysql://x", "sqlite3://x.db", "postgresql+asyncpg://u@h/d"])
def test_open_store_refuses_unknown_schemes(target: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unsupported database URL scheme"):
        open_store(target)


@pytest.mark.parametrize("target", ["postgres:/x", "postgresql+psycopg:/u@h/d", "mysql:x"])
def test_open_store_refuses_urls_without_their_slashes(
    target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="malformed database URL"):
        open_store(target)
    assert list(tmp_path.iterdir()) == []


async def test_every_table_but_tenants_carries_tenant_id(store: Store) -> None:
    # Reads the live schema, so a future migration that forgets tenant_id fails here.
    async with store.transaction() as tx:
        db = tx.session
        if db.backend == "postgres":
            rows = await db.fetch_all(
                "SELECT table_name, column_name FROM information_schema.columns"
                " WHERE table_schema = 'public'"
            )
        else:
            tables = await db.fetch_all(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
            rows = []
            for (table,) in tables:
                for column in await db.fetch_all(f"PRAGMA table_info({table})"):
                    rows.append((table, column[1]))
    columns: dict[str, set[str]] = {}
    for table, column in rows:
        columns.setdefault(table, set()).add(column)
    assert {"runs", "tasks", "attempts", "timers", "waits", "events"} <= set(columns)
    missing = sorted(
        t for t, cols in columns.items() if "tenant_id" not in cols and t not in _GLOBAL_TABLES
    )
    assert missing == []


# The queue's fence is one number about every tenant's leases at once (no
# tenant's data: it only tells the Redis queue when to count leases again).
_GLOBAL_TABLES = {"tenants", "schema_migrations", "queue_fence"}


async def test_run_state_is_compressed_with_lz4_where_postgres_has_it(pg_store: Store) -> None:
    async with pg_store.transaction() as tx:
        has_lz4 = await tx.session.fetch_one(
            "SELECT 'lz4' = ANY (enumvals) FROM pg_settings"
            " WHERE name = 'default_toast_compression'"
        )
        method = await tx.session.fetch_one(
            "SELECT attcompression FROM pg_attribute"
            " WHERE attrelid = 'runs'::regclass AND attname = 'state'"
        )
    assert has_lz4 is not None
    assert method is not None
    assert method[0] == ("l" if has_lz4[0] else "")


async def test_a_runs_tick_updates_its_row_in_place_on_postgres(pg_store: Store) -> None:
    """Runs started together fill their pages only halfway, so a tick's new row
    version fits beside the old one: a heap-only update, no new index entries.
    (Each run is updated once: later updates also need the old versions pruned,
    which other sessions' snapshots can put off, so they would measure those.)"""
    ids = [f"r{i:03}" for i in range(200)]
    pending = {f"s{n}": StepState(ref=f"s{n}") for n in range(10)}
    async with pg_store.transaction() as tx:
        await tx.insert_runs(
            [
                msgspec.structs.replace(
                    new_run("t1", run_id),
                    state=RunState(
                        run_id=run_id, status=RunStatus.RUNNING, created_at=NOW, steps=pending
                    ),
                )
                for run_id in ids
            ]
        )

    async def updates() -> tuple[int, int]:
        async with pg_store.transaction() as tx:
            await tx.session.execute("SELECT pg_stat_force_next_flush()")
        async with pg_store.transaction() as tx:
            row = await tx.session.fetch_one(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'runs'"
            )
        assert row is not None
        return int(row[0]), int(row[1])

    before = await updates()
    first_done = StepState(ref="s0", status=StepStatus.SUCCEEDED, attempt=1, output={"n": 1})
    async with pg_store.transaction() as tx:
        applied = await tx.update_runs(
            [
                RunUpdate(
                    tenant_id="t1",
                    run_id=run_id,
                    expected_lock_version=0,
                    state=RunState(
                        run_id=run_id,
                        status=RunStatus.RUNNING,
                        created_at=NOW,
                        steps={**pending, "s0": first_done},
                    ),
                    updated_at=NOW + _SECOND,
                )
                for run_id in ids
            ]
        )
    assert all(applied)
    after = await updates()
    updated, in_place = after[0] - before[0], after[1] - before[1]
    assert updated == 200
    # With full pages (fillfactor 100) next to none would be. A page holds whole
    # rows, so the room left beside them varies with their size: here ten rows
    # of about 400 bytes leave room for nine of their grown versions (a run's
    # first tick adds a step's status and output to its state).
    assert in_place >= 0.85 * updated, (updated, in_place)


async def test_a_read_sees_committed_rows_and_runs_each_statement_on_its_own(
    store: Store,
) -> None:
    async with store.transaction() as tx:
        await tx.ensure_tenant("t1", name="one", now=NOW)
        await tx.create_api_key("t1", key_id="k1", name="k", prefix="p", key_hash="h1", now=NOW)
    async with store.read() as tx:
        found = await tx.find_api_key("h1")
        assert found is not None
        assert found.tenant_id == "t1"
        assert await tx.find_api_key("h2") is None
    if isinstance(store, PostgresStore):
        # Each statement of a read is its own transaction; a transaction's share one.
        sql = "SELECT pg_current_xact_id()::text"
        async with store.read() as tx:
            ids = {(await tx.fetch_all(sql))[0][0] for _ in range(2)}
        assert len(ids) == 2
        async with store.transaction() as tx:
            ids = {(await tx.fetch_all(sql))[0][0] for _ in range(2)}
        assert len(ids) == 1
    else:
        assert isinstance(store, SqliteStore)
        async with store.read():
            assert not await store._call(lambda conn: conn.in_transaction)
        async with store.transaction():
            assert await store._call(lambda conn: conn.in_transaction)
