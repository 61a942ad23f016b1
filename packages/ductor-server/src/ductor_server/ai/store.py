"""SQL for the inference proxy's tables (migration 0900): a tenant's AI settings, its
price table, and the record of every model call, over an open storage transaction.

`AiTx(tx)` reads and writes through `tx.session` of either backend and decides
nothing (the proxy's rules are `services.ai`'s). Every statement takes the tenant.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from ductor_server.storage.protocol import Row, Session, Tx


class AiSettingsRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A tenant's proxy settings."""

    default_connection: str | None
    timeout_seconds: float
    updated_at: datetime


class PriceRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A tenant's price of one model, in micros per million tokens."""

    model: str
    input_per_million: int
    output_per_million: int
    updated_at: datetime


class AiRequestRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One model call: what was asked, what it used, how it ended and what it cost.

    Attributes:
        source: `proxy` (the /v1/ai endpoints), `action` (an ACTION step) or
            `agent` (a model call of the chat agent).
        source_key: the attempt key of an action (dedupes a second delivery).
        kind: `chat` or `embeddings`.
        status: `ok`, `upstream_error`, `upstream_timeout`, `refused`,
            `client_closed` or `failed`.
        http_status: the status Ductor answered (200 for a stream that started).
        usage_source: `upstream` (the answer's usage) or `estimated`.
    """

    tenant_id: str
    id: str
    source: str
    source_key: str | None = None
    kind: str
    connection: str
    model: str
    stream: bool
    status: str
    http_status: int
    upstream_status: int | None = None
    error_code: str | None = None
    tokens_in: int
    tokens_out: int
    usage_source: str
    latency_ms: float
    cost_micros: int
    priced: bool
    run_id: str | None = None
    step_ref: str | None = None
    created_at: datetime


_REQUEST_COLS = (
    "id, source, source_key, kind, connection, model, stream, status, http_status,"
    " upstream_status, error_code, tokens_in, tokens_out, usage_source, latency_ms,"
    " cost_micros, priced, run_id, step_ref, created_at"
)


async def newest_first(
    db: Session, select: str, tenant_id: str, *, before: tuple[datetime, str] | None, limit: int
) -> list[Row]:
    """A page of `select` (a `SELECT ... WHERE tenant_id = %s` over a table with
    `created_at` and `id`), newest first, strictly before `before` (time, id)."""
    sql, params = select, [tenant_id]
    if before is not None:
        stamp = db.to_timestamp(before[0])
        sql += " AND (created_at < %s OR (created_at = %s AND id < %s))"
        params += [stamp, stamp, before[1]]
    return await db.fetch_all(sql + " ORDER BY created_at DESC, id DESC LIMIT %s", (*params, limit))


class AiTx:
    """The proxy's tables, read and written through one storage transaction."""

    def __init__(self, tx: Tx) -> None:
        self._db: Session = tx.session

    # --- settings --------------------------------------------------------------------

    async def get_settings(self, tenant_id: str) -> AiSettingsRecord | None:
        """The tenant's settings, or None when it never set them."""
        row = await self._db.fetch_one(
            "SELECT default_connection, timeout_seconds, updated_at FROM ai_settings"
            " WHERE tenant_id = %s",
            (tenant_id,),
        )
        if row is None:
            return None
        return AiSettingsRecord(
            default_connection=row[0],
            timeout_seconds=float(row[1]),
            updated_at=self._db.from_timestamp(row[2]),
        )

    async def put_settings(
        self, tenant_id: str, default_connection: str | None, timeout_seconds: float, now: datetime
    ) -> None:
        """Create or replace the tenant's settings."""
        await self._db.execute(
            "INSERT INTO ai_settings (tenant_id, default_connection, timeout_seconds, updated_at)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT (tenant_id) DO UPDATE SET"
            " default_connection = excluded.default_connection,"
            " timeout_seconds = excluded.timeout_seconds, updated_at = excluded.updated_at",
            (tenant_id, default_connection, timeout_seconds, self._db.to_timestamp(now)),
        )

    # --- prices ----------------------------------------------------------------------

    async def put_price(self, tenant_id: str, price: PriceRecord) -> bool:
        """Create or replace the price of `price.model`; True when created."""
        existed = await self.get_price(tenant_id, price.model) is not None
        await self._db.execute(
            "INSERT INTO ai_prices (tenant_id, model, input_per_million, output_per_million,"
            " updated_at) VALUES (%s, %s, %s, %s, %s) ON CONFLICT (tenant_id, model) DO UPDATE"
            " SET input_per_million = excluded.input_per_million,"
            " output_per_million = excluded.output_per_million, updated_at = excluded.updated_at",
            (
                tenant_id,
                price.model,
                price.input_per_million,
                price.output_per_million,
                self._db.to_timestamp(price.updated_at),
            ),
        )
        return not existed

    async def get_price(self, tenant_id: str, model: str) -> PriceRecord | None:
        """The price of `model`, or None."""
        row = await self._db.fetch_one(
            "SELECT model, input_per_million, output_per_million, updated_at FROM ai_prices"
            " WHERE tenant_id = %s AND model = %s",
            (tenant_id, model),
        )
        return None if row is None else self._price(row)

    async def list_prices(self, tenant_id: str) -> list[PriceRecord]:
        """Every price of the tenant, by model."""
        rows = await self._db.fetch_all(
            "SELECT model, input_per_million, output_per_million, updated_at FROM ai_prices"
            " WHERE tenant_id = %s ORDER BY model",
            (tenant_id,),
        )
        return [self._price(row) for row in rows]

    async def count_prices(self, tenant_id: str) -> int:
        """How many prices the tenant has."""
        row = await self._db.fetch_one(
            "SELECT COUNT(*) FROM ai_prices WHERE tenant_id = %s", (tenant_id,)
        )
        return 0 if row is None else int(row[0])

    async def delete_price(self, tenant_id: str, model: str) -> bool:
        """Remove the price of `model`; False when there was none."""
        count = await self._db.execute(
            "DELETE FROM ai_prices WHERE tenant_id = %s AND model = %s", (tenant_id, model)
        )
        return count > 0

    def _price(self, row: Row) -> PriceRecord:
        return PriceRecord(
            model=row[0],
            input_per_million=int(row[1]),
            output_per_million=int(row[2]),
            updated_at=self._db.from_timestamp(row[3]),
        )

    # --- requests --------------------------------------------------------------------

    async def insert_request(self, record: AiRequestRecord) -> bool:
        """Store one model call; False (nothing written) when its `source_key` is taken."""
        db = self._db
        count = await db.execute(
            f"INSERT INTO ai_requests (tenant_id, {_REQUEST_COLS}) VALUES ("
            + ", ".join(["%s"] * 21)
            + ") ON CONFLICT DO NOTHING",
            (
                record.tenant_id,
                record.id,
                record.source,
                record.source_key,
                record.kind,
                record.connection,
                record.model,
                record.stream,
                record.status,
                record.http_status,
                record.upstream_status,
                record.error_code,
                record.tokens_in,
                record.tokens_out,
                record.usage_source,
                record.latency_ms,
                record.cost_micros,
                record.priced,
                record.run_id,
                record.step_ref,
                db.to_timestamp(record.created_at),
            ),
        )
        return count > 0

    async def get_request(self, tenant_id: str, request_id: str) -> AiRequestRecord | None:
        """One model call of the tenant, or None."""
        row = await self._db.fetch_one(
            f"SELECT {_REQUEST_COLS} FROM ai_requests WHERE tenant_id = %s AND id = %s",
            (tenant_id, request_id),
        )
        return None if row is None else self._request(tenant_id, row)

    async def list_requests(
        self, tenant_id: str, *, before: tuple[datetime, str] | None, limit: int
    ) -> list[AiRequestRecord]:
        """The tenant's model calls, newest first, strictly before `before` (time, id)."""
        rows = await newest_first(
            self._db,
            f"SELECT {_REQUEST_COLS} FROM ai_requests WHERE tenant_id = %s",
            tenant_id,
            before=before,
            limit=limit,
        )
        return [self._request(tenant_id, row) for row in rows]

    def _request(self, tenant_id: str, row: Row) -> AiRequestRecord:
        return AiRequestRecord(
            tenant_id=tenant_id,
            id=row[0],
            source=row[1],
            source_key=row[2],
            kind=row[3],
            connection=row[4],
            model=row[5],
            stream=bool(row[6]),
            status=row[7],
            http_status=int(row[8]),
            upstream_status=None if row[9] is None else int(row[9]),
            error_code=row[10],
            tokens_in=int(row[11]),
            tokens_out=int(row[12]),
            usage_source=row[13],
            latency_ms=float(row[14]),
            cost_micros=int(row[15]),
            priced=bool(row[16]),
            run_id=row[17],
            step_ref=row[18],
            created_at=self._db.from_timestamp(row[19]),
        )


__all__ = ["AiRequestRecord", "AiSettingsRecord", "AiTx", "PriceRecord"]
