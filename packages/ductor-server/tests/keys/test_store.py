"""The api_keys and tenants tables on both backends: scopes and expiry kept, pages
newest first, live admin keys counted, `last_used_at` written only when stale, and
another tenant's keys out of reach."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ductor_server.storage import Store

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


async def _key(store: Store, tenant: str, key_id: str, seconds: float, **kw: object) -> None:
    async with store.transaction() as tx:
        await tx.ensure_tenant(tenant, name=tenant, now=NOW)
        await tx.create_api_key(
            tenant,
            key_id=key_id,
            name=key_id,
            prefix="dk_x",
            key_hash=f"hash-{key_id}",
            now=at(seconds),
            **kw,  # type: ignore[arg-type]
        )


async def test_scopes_and_expiry_round_trip_and_old_keys_are_admin(store: Store) -> None:
    await _key(store, "t1", "k1", 0, scopes=("write", "events:send"), expires_at=at(60))
    async with store.transaction() as tx:
        # A key stored without scopes (as every key before scopes existed) is admin.
        await tx.session.execute(
            "INSERT INTO api_keys (id, tenant_id, name, prefix, key_hash, created_at)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            ("old", "t1", "old", "dk_o", "hash-old", tx.session.to_timestamp(at(1))),
        )
    async with store.transaction() as tx:
        k1 = await tx.get_api_key("t1", "k1")
        old = await tx.find_api_key("hash-old")
    assert k1 is not None
    assert old is not None
    assert k1.scopes == ("write", "events:send")
    assert k1.expires_at == at(60)
    assert k1.last_used_at is None
    assert old.scopes == ("admin",)
    assert old.expires_at is None


async def test_pages_are_newest_first_and_per_tenant(store: Store) -> None:
    for i in range(5):
        await _key(store, "t1", f"a{i}", i)
    await _key(store, "t2", "b0", 10)
    await _key(store, "t1", "tie", 4)  # same time as a4: the id breaks the tie
    async with store.transaction() as tx:
        first = await tx.page_api_keys("t1", before=None, limit=3)
        last = first[-1]
        second = await tx.page_api_keys("t1", before=(last.created_at, last.id), limit=10)
        other = await tx.page_api_keys("t2", before=None, limit=10)
        assert await tx.get_api_key("t2", "a0") is None
    assert [k.id for k in first] == ["tie", "a4", "a3"]
    assert [k.id for k in second] == ["a2", "a1", "a0"]
    assert [k.id for k in other] == ["b0"]


async def test_live_admin_keys_are_counted(store: Store) -> None:
    await _key(store, "t1", "admin", 0)
    await _key(store, "t1", "admin-read", 1, scopes=("admin", "read"))
    await _key(store, "t1", "expiring", 2, scopes=("admin",), expires_at=at(100))
    await _key(store, "t1", "writer", 3, scopes=("write",))
    await _key(store, "t1", "revoked", 4, scopes=("admin",))
    await _key(store, "t2", "other", 5, scopes=("admin",))
    async with store.transaction() as tx:
        assert await tx.revoke_api_key("t1", "revoked", now=at(5))
        assert not await tx.revoke_api_key("t1", "revoked", now=at(6))
        assert not await tx.revoke_api_key("t2", "admin", now=at(6))
        assert await tx.count_live_api_keys("t1", now=at(50), scope="admin") == 3
        assert await tx.count_live_api_keys("t1", now=at(100), scope="admin") == 2  # expired
        assert await tx.count_live_api_keys("t1", now=at(100)) == 3  # and the writer
        assert await tx.count_live_api_keys("t1", now=at(50), scope="read") == 1
        assert await tx.count_live_api_keys("t2", now=at(50), scope="admin") == 1
        assert await tx.count_live_api_keys("t3", now=at(50)) == 0


async def test_last_use_is_written_only_when_stale(store: Store) -> None:
    await _key(store, "t1", "k", 0)
    async with store.transaction() as tx:
        assert await tx.touch_api_key("t1", "k", now=at(10), stale_before=at(-50))
        # Used again 30 s later: the stored time is not older than a minute.
        assert not await tx.touch_api_key("t1", "k", now=at(40), stale_before=at(-20))
        assert not await tx.touch_api_key("t2", "k", now=at(100), stale_before=at(40))
        assert (await tx.get_api_key("t1", "k")).last_used_at == at(10)  # type: ignore[union-attr]
        assert await tx.touch_api_key("t1", "k", now=at(71), stale_before=at(11))
        assert (await tx.get_api_key("t1", "k")).last_used_at == at(71)  # type: ignore[union-attr]


async def test_tenants_insert_once_and_page_by_id(store: Store) -> None:
    async with store.transaction() as tx:
        assert await tx.insert_tenant("b", name="Bee", now=NOW)
        assert not await tx.insert_tenant("b", name="Other", now=at(1))
        for tenant in ("c", "a", "d"):
            assert await tx.insert_tenant(tenant, name=tenant, now=NOW)
        assert (await tx.get_tenant("b")).name == "Bee"  # type: ignore[union-attr]
        first = await tx.page_tenants(after=None, limit=2)
        rest = await tx.page_tenants(after=first[-1].id, limit=10)
    assert [t.id for t in first] == ["a", "b"]
    assert [t.id for t in rest] == ["c", "d"]
