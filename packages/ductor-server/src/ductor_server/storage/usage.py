"""Usage counters (migration 0820): add usage, and see what it did to the budgets.

`add_usage` writes a batch of increments through an open transaction: per
tenant and meter one upsert of its hour, day and month windows, all in one
statement, in a fixed row order (so two batches never deadlock). It returns the
new value of every counter that has a budget on its window, with the budget;
it records each alert threshold the batch crossed (once per window) and decides
nothing else: refusing work over a blocking budget is the caller's business.
The engine calls it once per flush of its writes; the services call it in the
transaction of the work they meter.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from ductor_server.storage.protocol import Row, Session
from ductor_settlement import MAX_USAGE, UsageWindow, window_start

WINDOWS: tuple[UsageWindow, ...] = (UsageWindow.HOUR, UsageWindow.DAY, UsageWindow.MONTH)
"""Every window a usage counter is kept for."""


class Fold(enum.Enum):
    """How an increment folds into a counter."""

    ADD = "add"
    """value + amount (sum and count meters)."""
    MAX = "max"
    """the greater of value and amount (max meters)."""


@dataclass(frozen=True, slots=True)
class UsageIncrement:
    """Usage to add to one tenant's meter in the windows that contain `at`."""

    tenant_id: str
    meter: str
    amount: int
    fold: Fold = Fold.ADD


@dataclass(frozen=True, slots=True)
class BudgetedCounter:
    """A counter the batch changed that a budget watches, after the batch.

    Attributes:
        tenant_id, meter, window, window_start: the counter.
        value: its value after the batch.
        added: what the batch added (for a max meter, the amount it offered).
        limit, block, alert_percents: the budget.
    """

    tenant_id: str
    meter: str
    window: UsageWindow
    window_start: datetime
    value: int
    added: int
    fold: Fold
    limit: int
    block: bool
    alert_percents: tuple[int, ...]

    @property
    def before(self) -> int:
        """The value before the batch (for a max meter: at most this)."""
        return self.value - self.added if self.fold is Fold.ADD else self.value

    @property
    def over(self) -> bool:
        """The counter is past a blocking limit."""
        return self.block and self.value > self.limit

    def crossed(self) -> tuple[int, ...]:
        """The alert percents at or below the value, which this batch may have crossed."""
        return tuple(
            p
            for p in self.alert_percents
            if p * self.limit <= self.value * 100
            and (self.fold is Fold.MAX or self.before * 100 < p * self.limit)
        )


def _merged(increments: Iterable[UsageIncrement]) -> list[UsageIncrement]:
    adds: dict[tuple[str, str, Fold], int] = {}
    for inc in increments:
        if inc.amount < 0:
            raise ValueError(f"usage of {inc.meter!r} must not be negative: {inc.amount}")
        key = (inc.tenant_id, inc.meter, inc.fold)
        if inc.fold is Fold.ADD:
            adds[key] = adds.get(key, 0) + inc.amount
        else:
            adds[key] = max(adds.get(key, 0), inc.amount)
    return [
        UsageIncrement(tenant, meter, min(amount, MAX_USAGE), fold)
        for (tenant, meter, fold), amount in sorted(adds.items(), key=lambda kv: kv[0][:2])
    ]


def _folded(fold: Fold) -> str:
    """A counter's new value in the upsert (`c` the stored row). A sum stops at
    `MAX_USAGE` (exact in any JSON reader) rather than overflowing the column."""
    if fold is Fold.ADD:
        return (
            f"CASE WHEN c.value > {MAX_USAGE} - excluded.value THEN {MAX_USAGE}"
            " ELSE c.value + excluded.value END"
        )
    return "CASE WHEN excluded.value > c.value THEN excluded.value ELSE c.value END"


def _upsert_sqlite(fold: Fold, rows: int) -> str:
    """SQLite: the upsert of `rows` counters, answering their new values."""
    return (
        "INSERT INTO usage_counters AS c (tenant_id, meter, win, window_start, value, updated_at)"
        " VALUES " + ", ".join(["(%s, %s, %s, %s, %s, %s)"] * rows) + ""
        " ON CONFLICT (tenant_id, meter, win, window_start)"
        f" DO UPDATE SET value = {_folded(fold)}, updated_at = excluded.updated_at"
        " RETURNING tenant_id, meter, win, value"
    )


def _budgeted_pg(fold: Fold, rows: int) -> str:
    """Postgres: the upsert of `rows` counters, the alerts it crossed recorded,
    and the budget-watched counters it changed answered, in one statement (its
    params: the rows', then the alerts' `created_at`)."""
    new = _folded(fold)
    # A threshold is crossed when the value reaches it; for a sum or count, only
    # if the value before this batch (value - added) had not.
    crossed = "true"
    if fold is Fold.ADD:
        crossed = "(w.value - w.added)::numeric * 100 < p.percent * w.lim"
    values = ", ".join(["(%s, %s, %s, %s::timestamptz, %s::bigint, %s::timestamptz)"] * rows)
    return (
        f"WITH v (tenant_id, meter, win, window_start, value, updated_at) AS (VALUES {values}),"
        " u AS (INSERT INTO usage_counters AS c"
        " (tenant_id, meter, win, window_start, value, updated_at)"
        " SELECT tenant_id, meter, win, window_start, value, updated_at FROM v"
        " ON CONFLICT (tenant_id, meter, win, window_start)"
        f" DO UPDATE SET value = {new}, updated_at = excluded.updated_at"
        " RETURNING c.tenant_id, c.meter, c.win, c.window_start, c.value),"
        " w AS (SELECT u.tenant_id, u.meter, u.win, u.window_start, u.value, v.value AS added,"
        " b.lim, b.block, b.alert_percents FROM u"
        " JOIN v ON v.tenant_id = u.tenant_id AND v.meter = u.meter AND v.win = u.win"
        " JOIN budgets b ON b.tenant_id = u.tenant_id AND b.meter = u.meter AND b.win = u.win),"
        " a AS (INSERT INTO budget_alerts"
        " (tenant_id, meter, win, window_start, percent, lim, value, created_at)"
        " SELECT DISTINCT w.tenant_id, w.meter, w.win, w.window_start, p.percent, w.lim,"
        " w.value, %s::timestamptz FROM w CROSS JOIN LATERAL (SELECT x::integer AS percent"
        " FROM jsonb_array_elements_text(w.alert_percents::jsonb) x) p"
        f" WHERE p.percent * w.lim::numeric <= w.value::numeric * 100 AND {crossed}"
        " ON CONFLICT (tenant_id, meter, win, window_start, percent) DO NOTHING)"
        " SELECT w.tenant_id, w.meter, w.win, w.value, w.lim, w.block, w.alert_percents FROM w"
    )


async def add_usage(
    db: Session, increments: Iterable[UsageIncrement], now: datetime, *, watch: bool = True
) -> list[BudgetedCounter]:
    """Add `increments` to the counters of the windows containing `now`.

    Increments of the same tenant, meter and fold are merged first (summed, or
    the greatest kept). Returns the counters that a budget watches, after the
    batch; alert thresholds the batch crossed are recorded in `budget_alerts`.

    Without `watch` (a caller that refuses nothing over a budget), the same is
    written but nothing is returned, and on Postgres nobody waits for it: the
    statement goes with the transaction's next one.
    """
    merged = [inc for inc in _merged(increments) if inc.amount > 0 or inc.fold is Fold.MAX]
    if not merged:
        return []
    stamp = db.to_timestamp(now)
    starts = {w: window_start(w, now) for w in WINDOWS}
    added = {(inc.tenant_id, inc.meter): (inc.amount, inc.fold) for inc in merged}
    found: list[BudgetedCounter] = []
    for fold in Fold:
        batch = [inc for inc in merged if inc.fold is fold]
        if not batch:
            continue
        params: list[object] = []
        for inc in batch:
            for w in WINDOWS:
                params += [inc.tenant_id, inc.meter, w.value, db.to_timestamp(starts[w])]
                params += [inc.amount, stamp]
        rows: Sequence[Row]
        if db.backend == "postgres":
            sql = _budgeted_pg(fold, len(batch) * 3)
            if not watch:
                await db.executemany(sql, [(*params, stamp)])
                continue
            rows = await db.fetch_all(sql, (*params, stamp))
        else:
            rows = await _sqlite_budgeted(db, fold, batch, params)
        for tenant_id, meter, win, value, limit, block, percents in rows:
            amount, fold_of = added[(str(tenant_id), str(meter))]
            window = UsageWindow(win)
            found.append(
                BudgetedCounter(
                    tenant_id=str(tenant_id),
                    meter=str(meter),
                    window=window,
                    window_start=starts[window],
                    value=int(value),
                    added=amount,
                    fold=fold_of,
                    limit=int(limit),
                    block=bool(block),
                    alert_percents=tuple(int(p) for p in db.from_json(percents) or ()),
                )
            )
    if db.backend == "postgres":
        return found  # the statement recorded the alerts
    alerts = [(c, p) for c in found for p in c.crossed()]
    if alerts:
        await db.executemany(
            "INSERT INTO budget_alerts (tenant_id, meter, win, window_start, percent, lim,"
            " value, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (tenant_id, meter, win, window_start, percent) DO NOTHING",
            [
                (
                    c.tenant_id,
                    c.meter,
                    c.window.value,
                    db.to_timestamp(c.window_start),
                    p,
                    c.limit,
                    c.value,
                    stamp,
                )
                for c, p in alerts
            ],
        )
    return found if watch else []


async def _sqlite_budgeted(
    db: Session, fold: Fold, batch: list[UsageIncrement], params: list[object]
) -> list[Row]:
    """SQLite has no INSERT in a WITH: upsert, then read the budgets of what changed."""
    changed = await db.fetch_all(_upsert_sqlite(fold, len(batch) * 3), params)
    tenants = sorted({inc.tenant_id for inc in batch})
    budgets: dict[tuple[str, str], Row] = {}
    for tenant_id in tenants:
        meters = sorted({inc.meter for inc in batch if inc.tenant_id == tenant_id})
        for row in await db.fetch_all(
            "SELECT meter, win, lim, block, alert_percents FROM budgets WHERE tenant_id = %s"
            " AND meter IN (" + ", ".join(["%s"] * len(meters)) + ")",
            (tenant_id, *meters),
        ):
            budgets[(tenant_id, str(row[0]))] = row
    out: list[Row] = []
    for tenant_id, meter, win, value in changed:
        budget = budgets.get((str(tenant_id), str(meter)))
        if budget is not None and budget[1] == win:
            out.append((tenant_id, meter, win, value, budget[2], budget[3], budget[4]))
    return out


__all__ = ["WINDOWS", "BudgetedCounter", "Fold", "UsageIncrement", "add_usage"]
