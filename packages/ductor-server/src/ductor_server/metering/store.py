"""SQL for meters, usage reads, budgets, alerts and plans (migration 0820), over an
open storage transaction.

`MeteringTx(tx)` reads and writes through `tx.session` of either backend; it
decides nothing (the rules are `ductor_settlement`'s, the usage upserts are
`storage.usage`'s). Every statement takes the tenant.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from ductor_server.storage.protocol import Row, Session, Tx
from ductor_settlement import Aggregation, BudgetPolicy, Meter, Plan, UsageWindow

_plan_entitlements = msgspec.json.Decoder(Plan)


class BudgetRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One row of `budgets`: the policy and when it was set."""

    policy: BudgetPolicy
    created_at: datetime
    updated_at: datetime


class AlertRecord(msgspec.Struct, frozen=True, kw_only=True):
    """An alert threshold crossed in one window (recorded once)."""

    window: UsageWindow
    window_start: datetime
    percent: int
    limit: int
    value: int
    at: datetime


class UsageRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A counter's value in one window."""

    meter: str
    window: UsageWindow
    window_start: datetime
    value: int
    updated_at: datetime


class MeterRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A meter the tenant created."""

    meter: Meter
    created_at: datetime


class PlanRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A plan the tenant created."""

    plan: Plan
    created_at: datetime


class MeteringTx:
    """The metering tables, read and written through one storage transaction."""

    def __init__(self, tx: Tx) -> None:
        self._db: Session = tx.session

    async def count(self, table: str, tenant_id: str) -> int:
        """How many rows of `table` ("meters" or "plans") the tenant has."""
        if table not in ("meters", "plans"):
            raise ValueError(f"not a metering table: {table!r}")
        row = await self._db.fetch_one(
            f"SELECT COUNT(*) FROM {table} WHERE tenant_id = %s", (tenant_id,)
        )
        return 0 if row is None else int(row[0])

    # --- meters --------------------------------------------------------------------

    async def insert_meter(self, tenant_id: str, meter: Meter, now: datetime) -> bool:
        """Store `meter`; False (nothing written) when its name is taken."""
        count = await self._db.execute(
            "INSERT INTO meters (tenant_id, name, unit, aggregation, description, created_at)"
            " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (tenant_id, name) DO NOTHING",
            (
                tenant_id,
                meter.name,
                meter.unit,
                meter.aggregation.value,
                meter.description,
                self._db.to_timestamp(now),
            ),
        )
        return count > 0

    async def get_meter(self, tenant_id: str, name: str) -> MeterRecord | None:
        """One meter the tenant created, or None."""
        row = await self._db.fetch_one(
            "SELECT name, unit, aggregation, description, created_at FROM meters"
            " WHERE tenant_id = %s AND name = %s",
            (tenant_id, name),
        )
        return None if row is None else self._meter(row)

    async def list_meters(self, tenant_id: str) -> list[MeterRecord]:
        """Every meter the tenant created, by name."""
        rows = await self._db.fetch_all(
            "SELECT name, unit, aggregation, description, created_at FROM meters"
            " WHERE tenant_id = %s ORDER BY name",
            (tenant_id,),
        )
        return [self._meter(row) for row in rows]

    def _meter(self, row: Row) -> MeterRecord:
        return MeterRecord(
            meter=Meter(
                name=row[0], unit=row[1], aggregation=Aggregation(row[2]), description=row[3]
            ),
            created_at=self._db.from_timestamp(row[4]),
        )

    # --- usage ---------------------------------------------------------------------

    async def usage(
        self,
        tenant_id: str,
        meter: str | None,
        window: UsageWindow,
        start: datetime,
        end: datetime,
        limit: int,
    ) -> list[UsageRecord]:
        """Counters of `window` kind starting in [start, end), oldest first, then by meter."""
        sql = (
            "SELECT meter, win, window_start, value, updated_at FROM usage_counters"
            " WHERE tenant_id = %s AND win = %s AND window_start >= %s AND window_start < %s"
        )
        params: list[object] = [
            tenant_id,
            window.value,
            self._db.to_timestamp(start),
            self._db.to_timestamp(end),
        ]
        if meter is not None:
            sql += " AND meter = %s"
            params.append(meter)
        rows = await self._db.fetch_all(
            sql + " ORDER BY window_start, meter LIMIT %s", (*params, limit)
        )
        return [
            UsageRecord(
                meter=row[0],
                window=UsageWindow(row[1]),
                window_start=self._db.from_timestamp(row[2]),
                value=int(row[3]),
                updated_at=self._db.from_timestamp(row[4]),
            )
            for row in rows
        ]

    async def counter(
        self, tenant_id: str, meter: str, window: UsageWindow, start: datetime
    ) -> int:
        """The value of one counter (0 when it has none)."""
        row = await self._db.fetch_one(
            "SELECT value FROM usage_counters WHERE tenant_id = %s AND meter = %s"
            " AND win = %s AND window_start = %s",
            (tenant_id, meter, window.value, self._db.to_timestamp(start)),
        )
        return 0 if row is None else int(row[0])

    # --- budgets -------------------------------------------------------------------

    async def insert_budget(self, policy: BudgetPolicy, now: datetime) -> bool:
        """Store the budget of `policy.meter`; False (nothing written) when the meter
        has one already, however recently another transaction committed it."""
        stamp = self._db.to_timestamp(now)
        count = await self._db.execute(
            "INSERT INTO budgets (tenant_id, meter, win, lim, alert_percents, block, created_at,"
            " updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (tenant_id, meter) DO NOTHING",
            (
                policy.tenant_id,
                policy.meter,
                policy.window.value,
                policy.limit,
                self._db.to_json(list(policy.alert_percents)),
                policy.block,
                stamp,
                stamp,
            ),
        )
        return count > 0

    async def put_budget(self, policy: BudgetPolicy, now: datetime) -> bool:
        """Create or replace the budget of `policy.meter`; True when created."""
        if await self.insert_budget(policy, now):
            return True
        await self._db.execute(
            "UPDATE budgets SET win = %s, lim = %s, alert_percents = %s, block = %s,"
            " updated_at = %s WHERE tenant_id = %s AND meter = %s",
            (
                policy.window.value,
                policy.limit,
                self._db.to_json(list(policy.alert_percents)),
                policy.block,
                self._db.to_timestamp(now),
                policy.tenant_id,
                policy.meter,
            ),
        )
        return False

    async def get_budget(self, tenant_id: str, meter: str) -> BudgetRecord | None:
        """The budget on `meter`, or None."""
        row = await self._db.fetch_one(
            "SELECT meter, win, lim, alert_percents, block, created_at, updated_at FROM budgets"
            " WHERE tenant_id = %s AND meter = %s",
            (tenant_id, meter),
        )
        return None if row is None else self._budget(tenant_id, row)

    async def list_budgets(self, tenant_id: str) -> list[BudgetRecord]:
        """Every budget of the tenant, by meter."""
        rows = await self._db.fetch_all(
            "SELECT meter, win, lim, alert_percents, block, created_at, updated_at FROM budgets"
            " WHERE tenant_id = %s ORDER BY meter",
            (tenant_id,),
        )
        return [self._budget(tenant_id, row) for row in rows]

    async def delete_budget(self, tenant_id: str, meter: str) -> bool:
        """Remove the budget on `meter` (its recorded alerts stay); False if there was none."""
        count = await self._db.execute(
            "DELETE FROM budgets WHERE tenant_id = %s AND meter = %s", (tenant_id, meter)
        )
        return count > 0

    def _budget(self, tenant_id: str, row: Row) -> BudgetRecord:
        return BudgetRecord(
            policy=BudgetPolicy(
                tenant_id=tenant_id,
                meter=row[0],
                window=UsageWindow(row[1]),
                limit=int(row[2]),
                alert_percents=tuple(int(p) for p in self._db.from_json(row[3]) or ()),
                block=bool(row[4]),
            ),
            created_at=self._db.from_timestamp(row[5]),
            updated_at=self._db.from_timestamp(row[6]),
        )

    async def alerts(self, tenant_id: str, meter: str, limit: int) -> list[AlertRecord]:
        """The alerts recorded on `meter`, newest window first, then by percent."""
        rows = await self._db.fetch_all(
            "SELECT win, window_start, percent, lim, value, created_at FROM budget_alerts"
            " WHERE tenant_id = %s AND meter = %s"
            " ORDER BY window_start DESC, win, percent LIMIT %s",
            (tenant_id, meter, limit),
        )
        return [
            AlertRecord(
                window=UsageWindow(row[0]),
                window_start=self._db.from_timestamp(row[1]),
                percent=int(row[2]),
                limit=int(row[3]),
                value=int(row[4]),
                at=self._db.from_timestamp(row[5]),
            )
            for row in rows
        ]

    # --- plans ---------------------------------------------------------------------

    async def insert_plan(self, tenant_id: str, plan: Plan, now: datetime) -> bool:
        """Store `plan`; False (nothing written) when its id is taken."""
        count = await self._db.execute(
            "INSERT INTO plans (tenant_id, id, name, entitlements, created_at)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (tenant_id, id) DO NOTHING",
            (
                tenant_id,
                plan.id,
                plan.name,
                msgspec.json.encode(plan).decode(),
                self._db.to_timestamp(now),
            ),
        )
        return count > 0

    async def get_plan(self, tenant_id: str, plan_id: str) -> PlanRecord | None:
        """One plan, or None."""
        row = await self._db.fetch_one(
            "SELECT entitlements, created_at FROM plans WHERE tenant_id = %s AND id = %s",
            (tenant_id, plan_id),
        )
        return None if row is None else self._plan(row)

    async def list_plans(self, tenant_id: str) -> list[PlanRecord]:
        """Every plan of the tenant, by id."""
        rows = await self._db.fetch_all(
            "SELECT entitlements, created_at FROM plans WHERE tenant_id = %s ORDER BY id",
            (tenant_id,),
        )
        return [self._plan(row) for row in rows]

    async def assign_plan(self, tenant_id: str, plan_id: str | None, now: datetime) -> None:
        """Make `plan_id` the tenant's plan (None: no plan)."""
        if plan_id is None:
            await self._db.execute("DELETE FROM tenant_plans WHERE tenant_id = %s", (tenant_id,))
            return
        await self._db.execute(
            "INSERT INTO tenant_plans (tenant_id, plan_id, assigned_at) VALUES (%s, %s, %s)"
            " ON CONFLICT (tenant_id) DO UPDATE SET plan_id = excluded.plan_id,"
            " assigned_at = excluded.assigned_at",
            (tenant_id, plan_id, self._db.to_timestamp(now)),
        )

    async def assigned_plan(self, tenant_id: str) -> tuple[Plan, datetime] | None:
        """The tenant's plan and when it was assigned, or None (one statement)."""
        row = await self._db.fetch_one(
            "SELECT p.entitlements, t.assigned_at FROM tenant_plans t JOIN plans p"
            " ON p.tenant_id = t.tenant_id AND p.id = t.plan_id WHERE t.tenant_id = %s",
            (tenant_id,),
        )
        if row is None:
            return None
        return _plan_entitlements.decode(_text(row[0])), self._db.from_timestamp(row[1])

    def _plan(self, row: Row) -> PlanRecord:
        return PlanRecord(
            plan=_plan_entitlements.decode(_text(row[0])),
            created_at=self._db.from_timestamp(row[1]),
        )


def _text(raw: object) -> bytes:
    return raw.encode() if isinstance(raw, str) else bytes(raw)  # type: ignore[call-overload]


__all__ = [
    "AlertRecord",
    "BudgetRecord",
    "MeterRecord",
    "MeteringTx",
    "PlanRecord",
    "UsageRecord",
]
