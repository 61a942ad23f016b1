"""Claiming an idempotency key inside a transaction, on both backends: one holder at a
time, a waiting claimer gets the holder's committed answer, a rollback frees the key."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest

from ductor_server.storage import IdempotencyRecord, Store, open_store
from ductor_server.storage.errors import StoreError

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    target = (
        request.getfixturevalue("postgres_url")
        if request.param == "postgres"
        else str(tmp_path / "ductor.db")
    )
    opened = open_store(target)
    await opened.open()
    await opened.migrate()
    try:
        yield opened
    finally:
        await opened.close()


def _claim(key: str = "k1", request_hash: str = "h1") -> IdempotencyRecord:
    return IdempotencyRecord(
        tenant_id="t1",
        scope="runs.trigger",
        key=key,
        request_hash=request_hash,
        status_code=0,
        created_at=NOW,
    )


async def test_a_second_claim_waits_for_the_first_and_gets_its_answer(store: Store) -> None:
    claimed = asyncio.Event()
    order: list[str] = []

    async def first() -> None:
        async with store.transaction() as tx:
            assert await tx.claim_idempotency(_claim()) is None
            claimed.set()
            await asyncio.sleep(0.3)  # the second claimer must wait out this whole time
            await tx.complete_idempotency(
                "t1", "runs.trigger", "k1", status_code=201, response={"id": "r1"}
            )
            order.append("first committed")

    async def second() -> IdempotencyRecord | None:
        await claimed.wait()
        async with store.transaction() as tx:
            found = await tx.claim_idempotency(_claim(request_hash="h2"))
            order.append("second claimed")
            return found

    _, found = await asyncio.gather(first(), second())
    assert order == ["first committed", "second claimed"]
    assert found is not None
    assert (found.request_hash, found.status_code, found.response) == ("h1", 201, {"id": "r1"})


async def test_a_rolled_back_claim_frees_the_key(store: Store) -> None:
    async def claim_then_fail() -> None:
        async with store.transaction() as tx:
            assert await tx.claim_idempotency(_claim()) is None
            raise RuntimeError("the guarded work failed")

    with pytest.raises(RuntimeError):
        await claim_then_fail()
    async with store.transaction() as tx:
        assert await tx.get_idempotency("t1", "runs.trigger", "k1") is None
        assert await tx.claim_idempotency(_claim(request_hash="h2")) is None
        await tx.complete_idempotency("t1", "runs.trigger", "k1", status_code=202, response=None)
    async with store.transaction() as tx:
        found = await tx.get_idempotency("t1", "runs.trigger", "k1")
    assert found is not None
    assert (found.request_hash, found.status_code) == ("h2", 202)


async def test_keys_are_per_tenant_and_scope_and_completing_needs_a_claim(store: Store) -> None:
    async with store.transaction() as tx:
        assert await tx.claim_idempotency(_claim()) is None
        assert await tx.claim_idempotency(msgspec.structs.replace(_claim(), scope="x")) is None
        await tx.complete_idempotency("t1", "runs.trigger", "k1", status_code=201, response=1)
        await tx.complete_idempotency("t1", "x", "k1", status_code=201, response=2)

    async def complete_unclaimed() -> None:
        async with store.transaction() as tx:
            await tx.complete_idempotency("t2", "runs.trigger", "k1", status_code=201, response=3)

    with pytest.raises(StoreError, match="not claimed"):
        await complete_unclaimed()
