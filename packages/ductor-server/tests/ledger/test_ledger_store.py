"""The ledger's tables hold their own rules: Postgres refuses an unbalanced entry at
commit whoever writes it, SQLite's store refuses one before commit, entries are
immutable, and every account's kept balance is the sum of its postings."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import psycopg
import pytest

from ductor_server.ledger import LedgerTx
from ductor_server.services.ledger import AccountBody, EntryBody, HoldBody, LedgerService
from ductor_server.storage import Store, StoreError, open_store
from ductor_settlement import (
    Account,
    AccountKind,
    Entry,
    LedgerError,
    Posting,
    Reference,
    ReferenceKind,
    Unbalanced,
)

TENANT = "t-ledger"
AT = datetime(2030, 1, 1, tzinfo=UTC)


def _entry(entry_id: str, *legs: tuple[str, int]) -> Entry:
    return Entry(
        tenant_id=TENANT,
        id=entry_id,
        idempotency_key=entry_id,
        description="direct",
        reference=Reference(kind=ReferenceKind.ADJUSTMENT, id=""),
        postings=tuple(Posting(account=a, amount=n, currency="USD") for a, n in legs),
        posted_at=AT,
    )


async def _accounts(store: Store) -> None:
    async with store.transaction() as tx:
        ledger = LedgerTx(tx)
        for code in ("a", "b"):
            account = Account(
                tenant_id=TENANT, code=code, currency="USD", kind=AccountKind.LIABILITY
            )
            assert await ledger.insert_account(account, now=AT)


async def _entry_rows(store: Store) -> int:
    async with store.transaction() as tx:
        row = await tx.session.fetch_one(
            "SELECT COUNT(*) FROM ledger_entries WHERE tenant_id = %s", (TENANT,)
        )
    assert row is not None
    return int(row[0])


async def test_the_store_refuses_an_unbalanced_entry_at_commit(store: Store) -> None:
    await _accounts(store)
    seen: list[int] = []

    async def write() -> None:
        async with store.transaction() as tx:
            await LedgerTx(tx).insert_entry(_entry("e1", ("a", 10), ("b", -9)))
            # Written, not yet checked: the check runs when the transaction commits.
            row = await tx.session.fetch_one(
                "SELECT SUM(amount) FROM ledger_postings WHERE tenant_id = %s", (TENANT,)
            )
            assert row is not None
            seen.append(int(row[0]))

    with pytest.raises((Unbalanced, StoreError)) as refused:
        await write()
    assert seen == [1]
    if store.backend == "sqlite":
        assert isinstance(refused.value, Unbalanced)
        [problem] = refused.value.problems
        assert (problem.currency, problem.amount) == ("USD", 1)
    else:
        assert "does not balance" in str(refused.value)
    assert await _entry_rows(store) == 0
    async with store.transaction() as tx:
        await LedgerTx(tx).insert_entry(_entry("e2", ("a", 10), ("b", -10)))
    assert await _entry_rows(store) == 1


async def test_the_store_refuses_an_entry_of_one_posting(store: Store) -> None:
    await _accounts(store)

    async def write() -> None:
        async with store.transaction() as tx:
            ledger = LedgerTx(tx)
            await ledger.insert_entry(_entry("e1", ("a", 5), ("b", -5)))
            await ledger.insert_entry(_entry("e2", ("a", 5)))

    with pytest.raises((LedgerError, StoreError)) as refused:
        await write()
    if isinstance(refused.value, LedgerError):
        assert {p.code for p in refused.value.problems} == {
            "ledger.invalid_entry",
            "ledger.unbalanced",
        }
    assert await _entry_rows(store) == 0


async def test_entries_and_postings_are_immutable(store: Store) -> None:
    await _accounts(store)
    async with store.transaction() as tx:
        await LedgerTx(tx).insert_entry(_entry("e1", ("a", 10), ("b", -10)))
    for sql in (
        "UPDATE ledger_postings SET amount = 11 WHERE tenant_id = %s",
        "DELETE FROM ledger_postings WHERE tenant_id = %s",
        "UPDATE ledger_entries SET description = 'x' WHERE tenant_id = %s",
        "DELETE FROM ledger_entries WHERE tenant_id = %s",
    ):
        with pytest.raises(StoreError):
            async with store.transaction() as tx:
                await tx.session.execute(sql, (TENANT,))
    async with store.transaction() as tx:
        assert await LedgerTx(tx).posting_sums(TENANT) == {"a": 10, "b": -10}


async def test_postgres_refuses_an_unbalanced_entry_written_with_plain_sql(
    postgres_url: str,
) -> None:
    store = open_store(postgres_url)
    await store.open()
    try:
        await store.migrate()
        await _accounts(store)
    finally:
        await store.close()
    with psycopg.connect(postgres_url) as conn:
        conn.execute(
            "INSERT INTO ledger_entries (tenant_id, id, idempotency_key, reference_kind,"
            " created_at) VALUES (%s, 'e1', 'e1', 'adjustment', now())",
            (TENANT,),
        )
        conn.execute(
            "INSERT INTO ledger_postings (tenant_id, entry_id, seq, account, currency, amount)"
            " VALUES (%s, 'e1', 0, 'a', 'USD', 500), (%s, 'e1', 1, 'b', 'USD', -499)",
            (TENANT, TENANT),
        )
        with pytest.raises(psycopg.errors.CheckViolation, match="does not balance in USD"):
            conn.commit()
        # Balanced, the same statements commit.
        conn.execute(
            "INSERT INTO ledger_entries (tenant_id, id, idempotency_key, reference_kind,"
            " created_at) VALUES (%s, 'e1', 'e1', 'adjustment', now())",
            (TENANT,),
        )
        conn.execute(
            "INSERT INTO ledger_postings (tenant_id, entry_id, seq, account, currency, amount)"
            " VALUES (%s, 'e1', 0, 'a', 'USD', 500), (%s, 'e1', 1, 'b', 'USD', -500)",
            (TENANT, TENANT),
        )
        conn.commit()
        # SET CONSTRAINTS IMMEDIATE checks at the statement that asks, too.
        conn.execute(
            "INSERT INTO ledger_entries (tenant_id, id, idempotency_key, reference_kind,"
            " created_at) VALUES (%s, 'e2', 'e2', 'adjustment', now())",
            (TENANT,),
        )
        conn.execute(
            "INSERT INTO ledger_postings (tenant_id, entry_id, seq, account, currency, amount)"
            " VALUES (%s, 'e2', 0, 'a', 'USD', 1), (%s, 'e2', 1, 'b', 'USD', -2)",
            (TENANT, TENANT),
        )
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("SET CONSTRAINTS ALL IMMEDIATE")
        conn.rollback()
        count = conn.execute("SELECT COUNT(*) FROM ledger_entries").fetchone()
    assert count == (1,)


async def test_postgres_refuses_to_truncate_entries_or_postings(postgres_url: str) -> None:
    store = open_store(postgres_url)
    await store.open()
    try:
        await store.migrate()
        await _accounts(store)
        async with store.transaction() as tx:
            await LedgerTx(tx).insert_entry(_entry("e1", ("a", 10), ("b", -10)))
    finally:
        await store.close()
    with psycopg.connect(postgres_url) as conn:
        for sql in (
            "TRUNCATE ledger_postings",
            "TRUNCATE ledger_entries CASCADE",
            "TRUNCATE ledger_entries, ledger_postings",
        ):
            with pytest.raises(psycopg.errors.RestrictViolation, match="immutable"):
                conn.execute(sql)
            conn.rollback()
        counts = conn.execute(
            "SELECT (SELECT COUNT(*) FROM ledger_entries), (SELECT COUNT(*) FROM ledger_postings)"
        ).fetchone()
    assert counts == (1, 2)


async def test_kept_balances_are_the_sums_of_postings_after_random_traffic(store: Store) -> None:
    ledger = LedgerService(store)
    draw = random.Random(7)
    codes = ["cash", "w1", "w2", "w3", "fees"]
    for code in codes:
        kind = AccountKind.ASSET if code == "cash" else AccountKind.LIABILITY
        floor = 0 if code.startswith("w") else None
        await ledger.open_account(
            TENANT, AccountBody(code=code, currency="USD", kind=kind, floor=floor)
        )
    accepted = refused = 0
    holds: list[str] = []
    for n in range(60):
        choice = draw.random()
        try:
            if choice < 0.5:
                debit, credit = draw.sample(codes, 2)
                amount = draw.randint(1, 5_000_000)
                await ledger.post_entry(
                    TENANT,
                    EntryBody(
                        postings=(
                            Posting(account=debit, amount=amount, currency="USD"),
                            Posting(account=credit, amount=-amount, currency="USD"),
                        )
                    ),
                    idempotency_key=f"e{n}",
                )
            elif choice < 0.75:
                debit, credit = draw.sample(codes, 2)
                answer = await ledger.place_hold(
                    TENANT,
                    HoldBody(
                        debit_account=debit,
                        credit_account=credit,
                        amount=draw.randint(1, 3_000_000),
                        currency="USD",
                        timeout_seconds=600,
                    ),
                )
                holds.append(answer.value.id)
            elif holds:
                hold = holds.pop(draw.randrange(len(holds)))
                if choice < 0.9:
                    await ledger.post_hold(TENANT, hold, draw.choice([None, 1]))
                else:
                    await ledger.void_hold(TENANT, hold)
            accepted += 1
        except LedgerError:
            refused += 1
    assert accepted > 20
    assert refused > 0
    async with store.transaction() as tx:
        sums = await LedgerTx(tx).posting_sums(TENANT)
    views = {code: await ledger.get_account(TENANT, code) for code in codes}
    kept = {
        code: (view.balance if code == "cash" else -view.balance) for code, view in views.items()
    }
    assert kept == {code: sums.get(code, 0) for code in codes}
    assert sum(sums.values()) == 0
    for code in codes[1:4]:
        assert views[code].available >= 0, views[code]
