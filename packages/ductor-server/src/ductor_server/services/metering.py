"""Metering, budgets and plans of each tenant, and the checks other services call.

Usage is counted per tenant, meter and window (hour, day, month). The server
meters its built-in meters itself, in the transaction of the work: `runs`
(a run created, by a trigger, an event or a parent run), `steps` (a step that
succeeded or failed), `route_decisions` (a routing decision committed), and
`ai.requests`, `ai.tokens` and `ai.cost` (model calls, by `services.ai`).
Tenants may create meters of their own and record usage on them.

A budget watches one meter per window. A blocking budget refuses new work that
would take its counter past the limit (`budget.exceeded`, naming the meter):
triggering a run, an event that starts runs, a routing decision, usage
recorded on a custom meter. Work the engine does on its own (child runs, steps)
is counted and never refused. An alert threshold crossed is recorded once per
window. A tenant's plan gates features through `require_entitlement`, the one
entitlement check; a tenant without a plan is not gated.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Final

import msgspec

from ductor_server.engine.clock import Clock, SystemClock
from ductor_server.errors import RequestInvalid
from ductor_server.metering.errors import MeteringConflict, MeteringObjectNotFound
from ductor_server.metering.store import (
    AlertRecord,
    BudgetRecord,
    MeteringTx,
    PlanRecord,
    UsageRecord,
)
from ductor_server.services.idempotency import Answer, Claim, Outcome, once
from ductor_server.storage.protocol import Store, Tx
from ductor_server.storage.usage import BudgetedCounter, Fold, UsageIncrement, add_usage
from ductor_settlement import (
    MAX_USAGE,
    Aggregation,
    BudgetExceeded,
    BudgetPolicy,
    Entitlement,
    InvalidUsage,
    Meter,
    Plan,
    UsageWindow,
    check_entitlement,
    window_end,
    window_start,
)

BUILTIN_METERS: Final[dict[str, Meter]] = {
    "runs": Meter(
        name="runs",
        unit="run",
        aggregation=Aggregation.COUNT,
        description="Runs created: triggered, started by an event, or children of a run.",
    ),
    "steps": Meter(
        name="steps",
        unit="step",
        aggregation=Aggregation.COUNT,
        description="Steps that ended by running: succeeded or failed.",
    ),
    "route_decisions": Meter(
        name="route_decisions",
        unit="decision",
        aggregation=Aggregation.COUNT,
        description="Routing decisions committed (by the API or a route step).",
    ),
    "ai.requests": Meter(
        name="ai.requests",
        unit="request",
        aggregation=Aggregation.COUNT,
        description="Model calls: proxied (/v1/ai) or ACTION steps on an openai connection.",
    ),
    "ai.tokens": Meter(
        name="ai.tokens",
        unit="token",
        aggregation=Aggregation.SUM,
        description="Tokens in and out of model calls (the upstream's usage, or estimated).",
    ),
    "ai.cost": Meter(
        name="ai.cost",
        unit="micros",
        aggregation=Aggregation.SUM,
        description="The cost of model calls in micros, from the tenant's price table.",
    ),
}
"""The meters the server counts itself; every tenant has them."""

FEATURES: Final[dict[str, str]] = {
    "routing": "routing decisions (`POST /v1/route` and route steps)",
    "workflows": "workflow families; its limit is the most a tenant may publish",
}
"""The plan features the server checks, and what each gates."""

MAX_ALERTS = 20
"""The most alert thresholds one budget may have."""

MAX_ENTITLEMENTS = 100
"""The most features one plan may list."""

MAX_USAGE_ROWS = 1000
"""The most usage rows one read answers."""

MAX_METERS = 100
"""The most meters of its own one tenant may create."""

MAX_PLANS = 100
"""The most plans one tenant may create."""

_NAME = re.compile(r"[a-z][a-z0-9_.:-]{0,63}")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
# A unit is a label printed beside every value of the meter: the rule of an id.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_Text = Annotated[str, msgspec.Meta(max_length=500)]
_Short = Annotated[str, msgspec.Meta(max_length=64)]

# --- bodies and views -----------------------------------------------------------------


class MeterBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/meters`: a meter of the tenant's own.

    Attributes:
        name: lowercase, 1-64 of ``a-z 0-9 _ . : -``; not a built-in meter's.
        unit: what one unit is ("token", "micros"); not blank, no control character.
        aggregation: sum, count or max.
        description: for people.
    """

    name: _Short
    unit: _Short
    aggregation: Aggregation = Aggregation.SUM
    description: _Text = ""


class MeterView(msgspec.Struct, frozen=True, kw_only=True):
    """A meter; `builtin` ones are counted by the server and have no `created_at`."""

    name: str
    unit: str
    aggregation: Aggregation
    description: str = ""
    builtin: bool = False
    created_at: datetime | None = None


class UsageView(msgspec.Struct, frozen=True, kw_only=True):
    """A meter's value in one window [window_start, window_end)."""

    meter: str
    window: UsageWindow
    window_start: datetime
    window_end: datetime
    value: int


class UsageBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/usage`: usage of a meter the tenant created, now.

    Attributes:
        meter: the meter's name.
        amount: 0 up to 2**53 - 1 (a count meter adds one whatever the amount).
    """

    meter: _Short
    amount: int = 1


class UsageRecorded(msgspec.Struct, frozen=True, kw_only=True):
    """What recording usage did: the meter's value in each window after it."""

    meter: str
    amount: int
    usage: list[UsageView]


class AlertView(msgspec.Struct, frozen=True, kw_only=True):
    """An alert threshold crossed: once per window, at `at`, when the value reached `value`."""

    window: UsageWindow
    window_start: datetime
    percent: int
    limit: int
    value: int
    at: datetime


class BudgetBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/budgets` (with `meter`) or `PUT /v1/budgets/{meter}` (without).

    Attributes:
        meter: the meter watched (built-in or the tenant's own).
        window: the limit is per hour, day or month.
        limit: the most the meter may reach in one window (0 .. 2**53 - 1).
        alert_percents: percentages of the limit (1-1000, at most 20) recorded
            once per window when reached.
        block: refuse new work that would pass the limit (else only alert).
    """

    meter: _Short | None = None
    window: UsageWindow = UsageWindow.MONTH
    limit: int
    alert_percents: tuple[int, ...] = (50, 80, 100)
    block: bool = True


class BudgetView(msgspec.Struct, frozen=True, kw_only=True):
    """A budget, the meter's value in the current window, and recent alerts (newest first)."""

    meter: str
    window: UsageWindow
    limit: int
    alert_percents: tuple[int, ...]
    block: bool
    window_start: datetime
    usage: int
    alerts: list[AlertView]
    created_at: datetime
    updated_at: datetime


class PlanBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/plans`: a named set of entitlements.

    Attributes:
        id: 1-64 of ``A-Z a-z 0-9 _ . : -``.
        name: for people.
        entitlements: per feature, ``{"enabled": bool, "limit": int | null}``.
    """

    id: _Short
    name: _Text = ""
    entitlements: dict[_Short, Entitlement] = {}


class PlanView(msgspec.Struct, frozen=True, kw_only=True):
    """A plan."""

    id: str
    name: str
    entitlements: dict[str, Entitlement]
    created_at: datetime


class PlanAssignBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`PUT /v1/plan`: the tenant's plan by id (null: no plan, nothing gated)."""

    plan: _Short | None


class PlanAssignmentView(msgspec.Struct, frozen=True, kw_only=True):
    """The tenant's plan (null when it has none) and when it was assigned."""

    plan: PlanView | None = None
    assigned_at: datetime | None = None


# --- checks ---------------------------------------------------------------------------


def _invalid(message: str, path: str, **details: object) -> RequestInvalid:
    return RequestInvalid(message, details={"path": path, **details})


_DEFAULT_SPAN = timedelta(days=31)
"""How far before `to` a usage query starts when it gives no `from`."""


def _utc(name: str, value: datetime) -> datetime:
    """`value` in UTC; `RequestInvalid` at `name` when that falls outside the years
    1 to 9999 (0001-01-01T00:00:00+14:00, say), which no datetime holds."""
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise _invalid(
            f"{name!r} is out of range: in UTC it must fall in the years 1 to 9999", name
        ) from None


def _out_of_range(message: str, path: str, **details: object) -> InvalidUsage:
    """`metering.invalid`: a usage amount or budget value out of range, at `path`."""
    return InvalidUsage(message, details={"path": path, **details})


def _amount_problem(name: str, value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_USAGE:
        return f"{name} must be an integer from 0 to {MAX_USAGE}"
    return None


def refuse_over_budget(counters: Iterable[BudgetedCounter]) -> None:
    """Raise `budget.exceeded` for the first counter past a blocking budget.

    Call it in the transaction that added the usage: raising rolls the usage
    (and the work) back.
    """
    for c in counters:
        if c.over:
            raise BudgetExceeded(
                f"meter {c.meter!r} is at {c.before} of its {c.window.value} limit of "
                f"{c.limit}; {c.added} more would pass it",
                details={
                    "meter": c.meter,
                    "window": c.window.value,
                    "window_start": c.window_start,
                    "limit": c.limit,
                    "current": c.before,
                    "requested": c.added,
                },
            )


async def require_entitlement(
    tx: Tx, tenant_id: str, feature: str, amount: int | None = None
) -> None:
    """The one entitlement check every service calls, in the transaction of the work:
    the tenant's plan must include `feature` (and allow `amount` of it, the total
    after the action). A tenant without a plan is not gated.

    Raises:
        EntitlementMissing: `entitlement.missing`.
        EntitlementLimitExceeded: `entitlement.limit_exceeded`.
    """
    assigned = await MeteringTx(tx).assigned_plan(tenant_id)
    if assigned is not None:
        check_entitlement(assigned[0], feature, amount)


async def charge_usage(
    tx: Tx, tenant_id: str, meter: str, amount: int, now: datetime
) -> list[BudgetedCounter]:
    """Add `amount` to a count or sum meter in `tx`, refusing it past a blocking budget.

    Raises:
        BudgetExceeded: `budget.exceeded` (`tx` must roll back).
    """
    counters = await add_usage(tx.session, [UsageIncrement(tenant_id, meter, amount)], now)
    refuse_over_budget(counters)
    return counters


async def _bounded(tx: Tx, tenant_id: str, table: str, most: int) -> None:
    """Refuse a new row of `table` when the tenant has `most` (one create at a time)."""
    await tx.session.advisory_lock(f"metering.{table}:{tenant_id}")
    if await MeteringTx(tx).count(table, tenant_id) >= most:
        raise RequestInvalid(f"a tenant may have at most {most} {table}", details={"limit": most})


def _usage_view(record: UsageRecord) -> UsageView:
    return UsageView(
        meter=record.meter,
        window=record.window,
        window_start=record.window_start,
        window_end=window_end(record.window, record.window_start),
        value=record.value,
    )


def _alert_view(record: AlertRecord) -> AlertView:
    return AlertView(
        window=record.window,
        window_start=record.window_start,
        percent=record.percent,
        limit=record.limit,
        value=record.value,
        at=record.at,
    )


def _plan_view(record: PlanRecord) -> PlanView:
    plan = record.plan
    return PlanView(
        id=plan.id, name=plan.name, entitlements=plan.entitlements, created_at=record.created_at
    )


# --- the service ----------------------------------------------------------------------


class MeteringService:
    """Meters, usage, budgets and plans of every tenant; the budget and entitlement checks."""

    def __init__(self, store: Store, *, clock: Clock | None = None) -> None:
        self._store = store
        self._clock = clock or SystemClock()

    # --- meters ----------------------------------------------------------------------

    async def create_meter(
        self, tenant_id: str, body: MeterBody, *, idempotency_key: str | None = None
    ) -> Answer[MeterView]:
        """Create a meter: `CREATED`; the same meter again is `OK`.

        Raises:
            RequestInvalid: a bad name or unit.
            MeteringConflict: `meter.conflict` (a built-in name, or other attributes).
        """
        if not _NAME.fullmatch(body.name):
            raise _invalid(
                "a meter name is 1-64 of a-z 0-9 _ . : - starting with a letter",
                "$.name",
                name=body.name,
            )
        if not body.unit.strip():
            raise _invalid("a meter needs a unit", "$.unit")
        if _CONTROL.search(body.unit):
            raise _invalid(
                "a meter unit must not hold a control character (U+0000-U+001F, U+007F)",
                "$.unit",
                unit=body.unit,
            )
        if body.name in BUILTIN_METERS:
            raise MeteringConflict("meter", body.name)
        now = self._clock.now()
        meter = Meter(
            name=body.name,
            unit=body.unit,
            aggregation=body.aggregation,
            description=body.description,
        )
        claim = Claim.of(tenant_id, "meters.create", idempotency_key, body, now=now)

        async def effect(tx: Tx) -> Answer[MeterView]:
            store = MeteringTx(tx)
            if await store.get_meter(tenant_id, meter.name) is None:
                await _bounded(tx, tenant_id, "meters", MAX_METERS)
            created = await store.insert_meter(tenant_id, meter, now)
            record = await store.get_meter(tenant_id, meter.name)
            assert record is not None
            if record.meter != meter:
                raise MeteringConflict("meter", meter.name)
            view = MeterView(
                name=meter.name,
                unit=meter.unit,
                aggregation=meter.aggregation,
                description=meter.description,
                created_at=record.created_at,
            )
            return Answer(view, Outcome.CREATED if created else Outcome.OK)

        return await once(self._store, claim, MeterView, effect)

    async def list_meters(self, tenant_id: str) -> list[MeterView]:
        """The built-in meters, then the tenant's own by name."""
        async with self._store.transaction() as tx:
            records = await MeteringTx(tx).list_meters(tenant_id)
        views = [self._builtin_view(m) for m in BUILTIN_METERS.values()]
        for record in records:
            m = record.meter
            views.append(
                MeterView(
                    name=m.name,
                    unit=m.unit,
                    aggregation=m.aggregation,
                    description=m.description,
                    created_at=record.created_at,
                )
            )
        return views

    async def get_meter(self, tenant_id: str, name: str) -> MeterView:
        """One meter.

        Raises:
            MeteringObjectNotFound: `meter.not_found`.
        """
        if name in BUILTIN_METERS:
            return self._builtin_view(BUILTIN_METERS[name])
        async with self._store.transaction() as tx:
            meter = await self._meter(MeteringTx(tx), tenant_id, name)
            record = await MeteringTx(tx).get_meter(tenant_id, name)
        assert record is not None
        return MeterView(
            name=meter.name,
            unit=meter.unit,
            aggregation=meter.aggregation,
            description=meter.description,
            created_at=record.created_at,
        )

    @staticmethod
    def _builtin_view(meter: Meter) -> MeterView:
        return MeterView(
            name=meter.name,
            unit=meter.unit,
            aggregation=meter.aggregation,
            description=meter.description,
            builtin=True,
        )

    @staticmethod
    async def _meter(store: MeteringTx, tenant_id: str, name: str) -> Meter:
        if name in BUILTIN_METERS:
            return BUILTIN_METERS[name]
        record = await store.get_meter(tenant_id, name)
        if record is None:
            raise MeteringObjectNotFound("meter", name)
        return record.meter

    # --- usage -----------------------------------------------------------------------

    async def usage(
        self,
        tenant_id: str,
        *,
        meter: str | None = None,
        window: UsageWindow = UsageWindow.DAY,
        start: datetime | None = None,
        end: datetime | None = None,
        limit: int = 500,
    ) -> list[UsageView]:
        """The counters of `window` kind whose window starts in [start, end), oldest
        first; `end` defaults to the end of the current window, `start` to 31 days
        before `end`. An empty `meter` is none (every meter), as an empty filter is
        on every list.

        Raises:
            MeteringObjectNotFound: `meter` names no meter of the tenant.
            RequestInvalid: `start` not before `end`, naive times, a bad limit.
        """
        if isinstance(limit, bool) or not 1 <= limit <= MAX_USAGE_ROWS:
            raise _invalid(f"limit must be from 1 to {MAX_USAGE_ROWS}", "limit", limit=limit)
        meter = meter or None
        for name, value in (("from", start), ("to", end)):
            if value is not None and value.utcoffset() is None:
                raise _invalid(f"{name!r} needs a UTC offset (e.g. Z)", name)
        start = None if start is None else _utc("from", start)
        end = None if end is None else _utc("to", end)
        now = self._clock.now()
        end = end if end is not None else window_end(window, now)
        if start is None:
            # Clamped, so a `to` in the first month of year 1 is refused, not a crash.
            earliest = datetime.min.replace(tzinfo=UTC)
            start = max(end, earliest + _DEFAULT_SPAN) - _DEFAULT_SPAN
        if start >= end:
            raise _invalid("'from' must be before 'to'", "from")
        async with self._store.transaction() as tx:
            store = MeteringTx(tx)
            if meter is not None:
                await self._meter(store, tenant_id, meter)
            records = await store.usage(tenant_id, meter, window, start, end, limit)
        return [_usage_view(r) for r in records]

    async def record_usage(
        self, tenant_id: str, body: UsageBody, *, idempotency_key: str | None = None
    ) -> Answer[UsageRecorded]:
        """Record usage of a meter the tenant created: `CREATED`.

        Raises:
            MeteringObjectNotFound: `meter.not_found`.
            RequestInvalid: a built-in meter (the server counts those).
            InvalidUsage: `metering.invalid`, an amount out of range.
            BudgetExceeded: `budget.exceeded`; nothing is recorded.
        """
        problem = _amount_problem("amount", body.amount)
        if problem is not None:
            raise _out_of_range(problem, "$.amount", value=body.amount)
        if body.meter in BUILTIN_METERS:
            raise _invalid(f"meter {body.meter!r} is built in: the server counts it", "$.meter")
        now = self._clock.now()
        claim = Claim.of(tenant_id, "usage.record", idempotency_key, body, now=now)

        async def effect(tx: Tx) -> Answer[UsageRecorded]:
            store = MeteringTx(tx)
            meter = await self._meter(store, tenant_id, body.meter)
            fold = Fold.MAX if meter.aggregation is Aggregation.MAX else Fold.ADD
            amount = 1 if meter.aggregation is Aggregation.COUNT else body.amount
            counters = await add_usage(
                tx.session, [UsageIncrement(tenant_id, meter.name, amount, fold)], now
            )
            refuse_over_budget(counters)
            values = []
            for w in (UsageWindow.HOUR, UsageWindow.DAY, UsageWindow.MONTH):
                start = window_start(w, now)
                value = await store.counter(tenant_id, meter.name, w, start)
                values.append(
                    UsageView(
                        meter=meter.name,
                        window=w,
                        window_start=start,
                        window_end=window_end(w, now),
                        value=value,
                    )
                )
            recorded = UsageRecorded(meter=meter.name, amount=body.amount, usage=values)
            return Answer(recorded, Outcome.CREATED)

        return await once(self._store, claim, UsageRecorded, effect)

    # --- budgets ---------------------------------------------------------------------

    def _policy(self, tenant_id: str, meter: str, body: BudgetBody) -> BudgetPolicy:
        problem = _amount_problem("limit", body.limit)
        if problem is not None:
            raise _out_of_range(problem, "$.limit", value=body.limit)
        if len(body.alert_percents) > MAX_ALERTS:
            raise _out_of_range(f"at most {MAX_ALERTS} alert percents", "$.alert_percents")
        for i, percent in enumerate(body.alert_percents):
            if isinstance(percent, bool) or not 1 <= percent <= 1000:
                raise _out_of_range(
                    "an alert percent is from 1 to 1000", f"$.alert_percents[{i}]", value=percent
                )
        return BudgetPolicy(
            tenant_id=tenant_id,
            meter=meter,
            window=body.window,
            limit=body.limit,
            alert_percents=tuple(sorted(set(body.alert_percents))),
            block=body.block,
        )

    async def create_budget(
        self, tenant_id: str, body: BudgetBody, *, idempotency_key: str | None = None
    ) -> Answer[BudgetView]:
        """Set a budget on a meter that has none: `CREATED`; the same budget again is `OK`.

        Raises:
            RequestInvalid: no meter.
            InvalidUsage: `metering.invalid`, a limit or alert percent out of range.
            MeteringObjectNotFound: `meter.not_found`.
            MeteringConflict: `budget.conflict` (the meter has another budget; PUT replaces).
        """
        if body.meter is None:
            raise _invalid("a budget needs the meter it watches", "$.meter")
        meter = body.meter
        policy = self._policy(tenant_id, meter, body)
        now = self._clock.now()
        claim = Claim.of(tenant_id, "budgets.create", idempotency_key, body, now=now)

        async def effect(tx: Tx) -> Answer[BudgetView]:
            store = MeteringTx(tx)
            await self._meter(store, tenant_id, meter)
            created = await store.insert_budget(policy, now)
            record = await store.get_budget(tenant_id, meter)
            assert record is not None
            if not created and record.policy != policy:
                raise MeteringConflict("budget", meter)
            view = await self._budget_view(store, record, now)
            return Answer(view, Outcome.CREATED if created else Outcome.OK)

        return await once(self._store, claim, BudgetView, effect)

    async def put_budget(
        self,
        tenant_id: str,
        meter: str,
        body: BudgetBody,
        *,
        idempotency_key: str | None = None,
    ) -> Answer[BudgetView]:
        """Create (`CREATED`) or replace (`OK`) the budget on `meter`.

        Raises:
            RequestInvalid: a body `meter` other than the path's.
            InvalidUsage: `metering.invalid`, a limit or alert percent out of range.
            MeteringObjectNotFound: `meter.not_found`.
        """
        if body.meter is not None and body.meter != meter:
            raise _invalid("the body's meter differs from the path's", "$.meter")
        policy = self._policy(tenant_id, meter, body)
        now = self._clock.now()
        # The meter is the claim's target; whether the body names it too (as Connect's
        # request does, and REST's may) does not make it another request.
        claimed = msgspec.structs.replace(body, meter=None)
        claim = Claim.of(tenant_id, "budgets.put", idempotency_key, claimed, now=now, target=meter)

        async def effect(tx: Tx) -> Answer[BudgetView]:
            store = MeteringTx(tx)
            await self._meter(store, tenant_id, meter)
            created = await store.put_budget(policy, now)
            record = await store.get_budget(tenant_id, meter)
            assert record is not None
            view = await self._budget_view(store, record, now)
            return Answer(view, Outcome.CREATED if created else Outcome.OK)

        return await once(self._store, claim, BudgetView, effect)

    async def get_budget(self, tenant_id: str, meter: str) -> BudgetView:
        """The budget on `meter` with the current window's usage and recent alerts.

        Raises:
            MeteringObjectNotFound: `budget.not_found`.
        """
        now = self._clock.now()
        async with self._store.transaction() as tx:
            store = MeteringTx(tx)
            record = await store.get_budget(tenant_id, meter)
            if record is None:
                raise MeteringObjectNotFound("budget", meter)
            return await self._budget_view(store, record, now)

    async def list_budgets(self, tenant_id: str) -> list[BudgetView]:
        """Every budget of the tenant, by meter."""
        now = self._clock.now()
        async with self._store.transaction() as tx:
            store = MeteringTx(tx)
            return [
                await self._budget_view(store, r, now) for r in await store.list_budgets(tenant_id)
            ]

    async def delete_budget(self, tenant_id: str, meter: str) -> None:
        """Remove the budget on `meter` (its recorded alerts stay).

        Raises:
            MeteringObjectNotFound: `budget.not_found`.
        """
        async with self._store.transaction() as tx:
            if not await MeteringTx(tx).delete_budget(tenant_id, meter):
                raise MeteringObjectNotFound("budget", meter)

    @staticmethod
    async def _budget_view(store: MeteringTx, record: BudgetRecord, now: datetime) -> BudgetView:
        policy = record.policy
        start = window_start(policy.window, now)
        usage = await store.counter(policy.tenant_id, policy.meter, policy.window, start)
        alerts = await store.alerts(policy.tenant_id, policy.meter, 50)
        return BudgetView(
            meter=policy.meter,
            window=policy.window,
            limit=policy.limit,
            alert_percents=policy.alert_percents,
            block=policy.block,
            window_start=start,
            usage=usage,
            alerts=[_alert_view(a) for a in alerts],
            created_at=record.created_at,
            updated_at=record.updated_at,
        )

    # --- plans -----------------------------------------------------------------------

    async def create_plan(
        self, tenant_id: str, body: PlanBody, *, idempotency_key: str | None = None
    ) -> Answer[PlanView]:
        """Create a plan: `CREATED`; the same plan again is `OK`.

        Raises:
            RequestInvalid: a bad id or feature name, too many features.
            MeteringConflict: `plan.conflict` (the id has other entitlements).
        """
        if not _ID.fullmatch(body.id):
            raise _invalid("a plan id is 1-64 of A-Z a-z 0-9 _ . : -", "$.id", id=body.id)
        if len(body.entitlements) > MAX_ENTITLEMENTS:
            raise _invalid(f"at most {MAX_ENTITLEMENTS} entitlements", "$.entitlements")
        for feature, entitlement in body.entitlements.items():
            if not _NAME.fullmatch(feature):
                raise _invalid(
                    "a feature name is 1-64 of a-z 0-9 _ . : - starting with a letter",
                    f"$.entitlements.{feature}",
                )
            problem = (
                None if entitlement.limit is None else _amount_problem("limit", entitlement.limit)
            )
            if problem is not None:
                path = f"$.entitlements.{feature}.limit"
                raise _invalid(problem, path, value=entitlement.limit)
        plan = Plan(
            id=body.id, name=body.name, entitlements=dict(sorted(body.entitlements.items()))
        )
        now = self._clock.now()
        claim = Claim.of(tenant_id, "plans.create", idempotency_key, body, now=now)

        async def effect(tx: Tx) -> Answer[PlanView]:
            store = MeteringTx(tx)
            if await store.get_plan(tenant_id, plan.id) is None:
                await _bounded(tx, tenant_id, "plans", MAX_PLANS)
            created = await store.insert_plan(tenant_id, plan, now)
            record = await store.get_plan(tenant_id, plan.id)
            assert record is not None
            if record.plan != plan:
                raise MeteringConflict("plan", plan.id)
            return Answer(_plan_view(record), Outcome.CREATED if created else Outcome.OK)

        return await once(self._store, claim, PlanView, effect)

    async def list_plans(self, tenant_id: str) -> list[PlanView]:
        """Every plan of the tenant, by id."""
        async with self._store.transaction() as tx:
            records = await MeteringTx(tx).list_plans(tenant_id)
        return [_plan_view(r) for r in records]

    async def get_plan(self, tenant_id: str, plan_id: str) -> PlanView:
        """One plan.

        Raises:
            MeteringObjectNotFound: `plan.not_found`.
        """
        async with self._store.transaction() as tx:
            record = await MeteringTx(tx).get_plan(tenant_id, plan_id)
        if record is None:
            raise MeteringObjectNotFound("plan", plan_id)
        return _plan_view(record)

    async def assign_plan(
        self, tenant_id: str, body: PlanAssignBody, *, idempotency_key: str | None = None
    ) -> Answer[PlanAssignmentView]:
        """Make `body.plan` the tenant's plan (null: none): `OK`.

        Raises:
            MeteringObjectNotFound: `plan.not_found`.
        """
        now = self._clock.now()
        claim = Claim.of(tenant_id, "plan.assign", idempotency_key, body, now=now)

        async def effect(tx: Tx) -> Answer[PlanAssignmentView]:
            store = MeteringTx(tx)
            if body.plan is not None and await store.get_plan(tenant_id, body.plan) is None:
                raise MeteringObjectNotFound("plan", body.plan)
            await store.assign_plan(tenant_id, body.plan, now)
            return Answer(await self._assignment(store, tenant_id), Outcome.OK)

        return await once(self._store, claim, PlanAssignmentView, effect)

    async def assigned_plan(self, tenant_id: str) -> PlanAssignmentView:
        """The tenant's plan, or an empty view when it has none."""
        async with self._store.transaction() as tx:
            return await self._assignment(MeteringTx(tx), tenant_id)

    @staticmethod
    async def _assignment(store: MeteringTx, tenant_id: str) -> PlanAssignmentView:
        assigned = await store.assigned_plan(tenant_id)
        if assigned is None:
            return PlanAssignmentView()
        plan, at = assigned
        record = await store.get_plan(tenant_id, plan.id)
        assert record is not None
        return PlanAssignmentView(plan=_plan_view(record), assigned_at=at)


__all__ = [
    "BUILTIN_METERS",
    "FEATURES",
    "AlertView",
    "BudgetBody",
    "BudgetView",
    "MeterBody",
    "MeterView",
    "MeteringService",
    "PlanAssignBody",
    "PlanAssignmentView",
    "PlanBody",
    "PlanView",
    "UsageBody",
    "UsageRecorded",
    "UsageView",
    "charge_usage",
    "refuse_over_budget",
    "require_entitlement",
]
