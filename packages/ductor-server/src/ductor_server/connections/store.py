"""SQL for the `connections` table (migration 0860), over an open storage transaction.

`ConnectionsTx(tx)` writes and reads connection rows through `tx.session` of
either backend. It encrypts and validates nothing: it stores the ciphertext and
key id it is given. Every statement takes the tenant, except
`tenants_with_secrets`, the operator's listing that `rotate` starts from.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from ductor_server.storage.protocol import Row, Session, Tx

_COLS = (
    "id, name, provider, description, config, secrets_ciphertext, secrets_key_id,"
    " secrets_mask, secrets_updated_at, created_at, updated_at"
)


class ConnectionRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One row of `connections`.

    Attributes:
        config: the non-secret settings, as JSON values.
        secrets_ciphertext: the sealed secrets; None when the connection has none.
        secrets_key_id: the id of the key that sealed them (None with them).
        secrets_mask: what may be shown of each secret field, by field.
    """

    tenant_id: str
    id: str
    name: str
    provider: str
    description: str = ""
    config: dict[str, Any]
    secrets_ciphertext: str | None = None
    secrets_key_id: str | None = None
    secrets_mask: dict[str, str] = {}
    secrets_updated_at: datetime | None = None
    created_at: datetime
    updated_at: datetime


class ConnectionsTx:
    """The connections table, read and written through one storage transaction."""

    def __init__(self, tx: Tx) -> None:
        self._db: Session = tx.session

    def _params(self, record: ConnectionRecord) -> tuple[object, ...]:
        db = self._db
        return (
            record.name,
            record.provider,
            record.description,
            db.to_json(record.config),
            record.secrets_ciphertext,
            record.secrets_key_id,
            db.to_json(record.secrets_mask),
            None
            if record.secrets_updated_at is None
            else db.to_timestamp(record.secrets_updated_at),
            db.to_timestamp(record.created_at),
            db.to_timestamp(record.updated_at),
        )

    async def insert(self, record: ConnectionRecord) -> bool:
        """Store a new connection; False (nothing written) when the name is taken."""
        count = await self._db.execute(
            f"INSERT INTO connections (tenant_id, {_COLS})"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT DO NOTHING",
            (record.tenant_id, record.id, *self._params(record)),
        )
        return count > 0

    async def update(self, record: ConnectionRecord) -> bool:
        """Write every field of an existing connection (by tenant and id)."""
        count = await self._db.execute(
            "UPDATE connections SET name = %s, provider = %s, description = %s, config = %s,"
            " secrets_ciphertext = %s, secrets_key_id = %s, secrets_mask = %s,"
            " secrets_updated_at = %s, created_at = %s, updated_at = %s"
            " WHERE tenant_id = %s AND id = %s",
            (*self._params(record), record.tenant_id, record.id),
        )
        return count > 0

    async def get(self, tenant_id: str, name: str) -> ConnectionRecord | None:
        """The tenant's connection called `name`, or None."""
        row = await self._db.fetch_one(
            f"SELECT {_COLS} FROM connections WHERE tenant_id = %s AND name = %s",
            (tenant_id, name),
        )
        return None if row is None else self._record(tenant_id, row)

    async def get_for_update(self, tenant_id: str, name: str) -> ConnectionRecord | None:
        """As `get`, holding the row until the transaction ends (Postgres; SQLite
        transactions hold the whole database already)."""
        lock = " FOR UPDATE" if self._db.backend == "postgres" else ""
        row = await self._db.fetch_one(
            f"SELECT {_COLS} FROM connections WHERE tenant_id = %s AND name = %s{lock}",
            (tenant_id, name),
        )
        return None if row is None else self._record(tenant_id, row)

    async def all(self, tenant_id: str) -> list[ConnectionRecord]:
        """Every connection of the tenant, by name."""
        rows = await self._db.fetch_all(
            f"SELECT {_COLS} FROM connections WHERE tenant_id = %s ORDER BY name",
            (tenant_id,),
        )
        return [self._record(tenant_id, row) for row in rows]

    async def names(self, tenant_id: str, names: list[str]) -> dict[str, str]:
        """The provider of each of `names` the tenant has a connection for."""
        if not names:
            return {}
        marks = ", ".join(["%s"] * len(names))
        rows = await self._db.fetch_all(
            f"SELECT name, provider FROM connections WHERE tenant_id = %s AND name IN ({marks})",
            (tenant_id, *names),
        )
        return {str(row[0]): str(row[1]) for row in rows}

    async def count(self, tenant_id: str) -> int:
        """How many connections the tenant has."""
        row = await self._db.fetch_one(
            "SELECT COUNT(*) FROM connections WHERE tenant_id = %s", (tenant_id,)
        )
        return int(row[0]) if row is not None else 0

    async def delete(self, tenant_id: str, name: str) -> bool:
        """Delete the tenant's connection called `name`; False if there was none."""
        count = await self._db.execute(
            "DELETE FROM connections WHERE tenant_id = %s AND name = %s", (tenant_id, name)
        )
        return count > 0

    async def tenants_with_secrets(self) -> list[str]:
        """Every tenant that has a connection with secrets (for `rotate`, an operator's
        command over all tenants)."""
        rows = await self._db.fetch_all(
            "SELECT DISTINCT tenant_id FROM connections"
            " WHERE secrets_key_id IS NOT NULL ORDER BY tenant_id",
        )
        return [str(row[0]) for row in rows]

    async def sealed_rows(self, tenant_id: str) -> list[ConnectionRecord]:
        """The tenant's connections that have secrets, by name."""
        rows = await self._db.fetch_all(
            f"SELECT {_COLS} FROM connections"
            " WHERE tenant_id = %s AND secrets_key_id IS NOT NULL ORDER BY name",
            (tenant_id,),
        )
        return [self._record(tenant_id, row) for row in rows]

    async def reseal(
        self, tenant_id: str, connection_id: str, *, was: str, kid: str, ciphertext: str
    ) -> bool:
        """Replace the sealed secrets `was` with the same secrets sealed under `kid`;
        False when they changed meanwhile (then nothing is written)."""
        count = await self._db.execute(
            "UPDATE connections SET secrets_ciphertext = %s, secrets_key_id = %s"
            " WHERE tenant_id = %s AND id = %s AND secrets_ciphertext = %s",
            (ciphertext, kid, tenant_id, connection_id, was),
        )
        return count > 0

    def _record(self, tenant_id: str, row: Row) -> ConnectionRecord:
        db = self._db
        return ConnectionRecord(
            tenant_id=tenant_id,
            id=row[0],
            name=row[1],
            provider=row[2],
            description=row[3],
            config=db.from_json(row[4]) or {},
            secrets_ciphertext=row[5],
            secrets_key_id=row[6],
            secrets_mask=db.from_json(row[7]) or {},
            secrets_updated_at=None if row[8] is None else db.from_timestamp(row[8]),
            created_at=db.from_timestamp(row[9]),
            updated_at=db.from_timestamp(row[10]),
        )


__all__ = ["ConnectionRecord", "ConnectionsTx"]
