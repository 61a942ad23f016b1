"""The connections table on both backends: every statement scoped to its tenant,
names unique per tenant, and re-sealing only what has not changed meanwhile."""

from __future__ import annotations

from datetime import UTC, datetime

from ductor_server.connections.store import ConnectionRecord, ConnectionsTx
from ductor_server.storage import Store

NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


def record(tenant: str, name: str, *, sealed: str | None = "c1") -> ConnectionRecord:
    return ConnectionRecord(
        tenant_id=tenant,
        id=f"con_{tenant}_{name}",
        name=name,
        provider="http",
        description="d",
        config={"base_url": "https://example.com", "nested": {"a": [1, 2]}},
        secrets_ciphertext=sealed,
        secrets_key_id=None if sealed is None else "k1",
        secrets_mask={} if sealed is None else {"token": "••••wxyz"},
        secrets_updated_at=None if sealed is None else NOW,
        created_at=NOW,
        updated_at=NOW,
    )


async def test_rows_are_per_tenant(store: Store) -> None:
    async with store.transaction() as tx:
        rows = ConnectionsTx(tx)
        assert await rows.insert(record("t1", "crm"))
        assert not await rows.insert(record("t1", "crm"))  # the name is taken
        assert await rows.insert(record("t2", "crm"))
        assert await rows.insert(record("t1", "open", sealed=None))
    async with store.transaction() as tx:
        rows = ConnectionsTx(tx)
        got = await rows.get("t1", "crm")
        assert got == record("t1", "crm")
        assert await rows.get("t3", "crm") is None
        assert [r.name for r in await rows.all("t1")] == ["crm", "open"]
        assert await rows.names("t1", ["crm", "open", "x"]) == {"crm": "http", "open": "http"}
        assert await rows.names("t3", ["crm"]) == {}
        assert await rows.count("t1") == 2
        assert await rows.tenants_with_secrets() == ["t1", "t2"]
        assert [r.name for r in await rows.sealed_rows("t1")] == ["crm"]
        assert not await rows.delete("t3", "crm")
        assert await rows.delete("t2", "crm")
    async with store.transaction() as tx:
        assert await ConnectionsTx(tx).get("t1", "crm") is not None
        assert await ConnectionsTx(tx).get("t2", "crm") is None


async def test_reseal_only_replaces_what_it_read(store: Store) -> None:
    async with store.transaction() as tx:
        await ConnectionsTx(tx).insert(record("t1", "crm"))
    row_id = record("t1", "crm").id
    async with store.transaction() as tx:
        rows = ConnectionsTx(tx)
        assert not await rows.reseal("t1", row_id, was="other", kid="k2", ciphertext="c2")
        assert not await rows.reseal("t2", row_id, was="c1", kid="k2", ciphertext="c2")
        assert await rows.reseal("t1", row_id, was="c1", kid="k2", ciphertext="c2")
    async with store.transaction() as tx:
        got = await ConnectionsTx(tx).get("t1", "crm")
    assert got is not None
    assert (got.secrets_key_id, got.secrets_ciphertext) == ("k2", "c2")
    assert got.secrets_updated_at == NOW  # the secrets did not change, only their key
