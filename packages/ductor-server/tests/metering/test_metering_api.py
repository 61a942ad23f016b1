"""Meters, usage, budgets and plans over the REST API on both backends: built-in
usage from runs, events and routing decisions, blocking budgets and alerts, the
entitlement check, bad input and tenancy."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from ductor_server.transports.rest.errors import STATUS_BY_CODE

from .conftest import CHAIN, Api

ON_EVENT = {
    "family_slug": "on-order",
    "triggers": [{"event": "order.placed"}],
    "steps": [{"ref": "a", "type": "STEP_TYPE_ACTION", "args": {"action": "noop"}}],
}


async def usage_of(api: Api, meter: str, window: str = "day", **kw: Any) -> int:
    rows = await api.ok("GET", f"/v1/usage?meter={meter}&window={window}", **kw)
    return sum(row["value"] for row in rows)


async def test_meters_builtin_and_own(api: Api) -> None:
    names = [m["name"] for m in await api.ok("GET", "/v1/meters")]
    assert names == ["runs", "steps", "route_decisions", "ai.requests", "ai.tokens", "ai.cost"]
    body = {"name": "llm.tokens", "unit": "token", "aggregation": "sum"}
    created = await api.call("POST", "/v1/meters", json=body, key="m1")
    assert created.status_code == 201, created.text
    assert created.json()["builtin"] is False
    again = await api.call("POST", "/v1/meters", json=body)
    assert again.status_code == 200
    replay = await api.call("POST", "/v1/meters", json=body, key="m1")
    assert replay.status_code == 201
    assert replay.headers["Idempotency-Replayed"] == "true"
    await api.fails("POST", "/v1/meters", 409, "meter.conflict", json={**body, "unit": "char"})
    await api.fails("POST", "/v1/meters", 409, "meter.conflict", json={"name": "runs", "unit": "x"})
    got = await api.ok("GET", "/v1/meters/llm.tokens")
    assert (got["unit"], got["aggregation"]) == ("token", "sum")
    assert (await api.ok("GET", "/v1/meters/runs"))["builtin"] is True
    # Another tenant sees the built-ins only.
    await api.fails("GET", "/v1/meters/llm.tokens", 404, "meter.not_found", as_b=True)
    assert len(await api.ok("GET", "/v1/meters", as_b=True)) == 6


async def test_bad_meter_budget_and_plan_bodies_are_4xx(api: Api) -> None:
    bad = await api.fails(
        "POST", "/v1/meters", 422, "request.invalid", json={"name": "Bad Name", "unit": "x"}
    )
    assert bad["details"]["path"] == "$.name"
    await api.fails(
        "POST", "/v1/meters", 422, "request.invalid", json={"name": "a", "unit": "x", "extra": 1}
    )
    await api.fails(
        "POST", "/v1/meters", 422, "request.invalid", json={"name": "a" * 65, "unit": "x"}
    )
    # A unit is a label shown beside every value, as an id is: not blank, no control
    # character (U+0000-U+001F, U+007F).
    for unit in ("   ", "to\nken", "to\rken", "\tx", "x\x1b[2J", "x\x7f", "x\x00"):
        out = await api.fails(
            "POST", "/v1/meters", 422, "request.invalid", json={"name": "a", "unit": unit}
        )
        assert out["details"]["path"] == "$.unit", (unit, out)
    await api.fails("POST", "/v1/meters", 400, "request.malformed_json", content=b'{"name": ')
    await api.fails(
        "POST",
        "/v1/meters",
        413,
        "request.too_large",
        content=b'{"name": "' + b"a" * 2_000_000 + b'"}',
    )
    out = await api.fails(
        "POST", "/v1/budgets", 422, "metering.invalid", json={"meter": "runs", "limit": -1}
    )
    assert out["details"]["path"] == "$.limit"
    out = await api.fails(
        "POST",
        "/v1/budgets",
        422,
        "metering.invalid",
        json={"meter": "runs", "limit": 5, "alert_percents": [50, 0]},
    )
    assert out["details"]["path"] == "$.alert_percents[1]"
    await api.fails(
        "POST",
        "/v1/budgets",
        422,
        "metering.invalid",
        json={"meter": "runs", "limit": 5, "alert_percents": list(range(1, 30))},
    )
    await api.fails(
        "POST",
        "/v1/budgets",
        422,
        "request.invalid",
        json={"meter": "runs", "limit": 5, "window": "week"},
    )
    await api.fails(
        "POST", "/v1/budgets", 404, "meter.not_found", json={"meter": "nope", "limit": 5}
    )
    await api.fails("POST", "/v1/budgets", 422, "request.invalid", json={"limit": 5})
    await api.fails(
        "POST", "/v1/budgets", 422, "metering.invalid", json={"meter": "runs", "limit": 2**60}
    )
    await api.fails(
        "POST",
        "/v1/plans",
        422,
        "request.invalid",
        json={"id": "p", "entitlements": {"routing": {"limit": -1}}},
    )
    await api.fails(
        "POST",
        "/v1/plans",
        422,
        "request.invalid",
        json={"id": "p", "entitlements": {f"f{i}": {} for i in range(101)}},
    )
    await api.fails("POST", "/v1/plans", 422, "request.invalid", json={"id": "bad id"})
    await api.fails("GET", "/v1/usage?window=week", 422, "request.invalid")
    await api.fails("GET", "/v1/usage?from=yesterday", 422, "request.invalid")
    await api.fails("GET", "/v1/usage?from=2030-01-01T00:00:00", 422, "request.invalid")
    await api.fails(
        "GET", "/v1/usage?from=2030-01-02T00:00:00Z&to=2030-01-01T00:00:00Z", 422, "request.invalid"
    )
    # A time whose UTC form falls outside the years 1 to 9999 names its parameter.
    for query, name in (
        ("from=0001-01-01T00:00:00%2B14:00", "from"),
        ("to=9999-12-31T23:59:59-14:00", "to"),
        ("to=0001-01-01T00:00:00Z", "from"),  # 31 days before it, the default from
    ):
        body = await api.fails("GET", f"/v1/usage?{query}", 422, "request.invalid")
        assert body["details"]["path"] == name, body
    await api.fails("GET", "/v1/usage?meter=nope", 404, "meter.not_found")
    await api.fails("GET", "/v1/usage?limit=5000", 422, "request.invalid")
    # Nothing was half-written.
    assert await api.count("SELECT COUNT(*) FROM budgets") == 0
    assert await api.count("SELECT COUNT(*) FROM plans") == 0
    assert await api.count("SELECT COUNT(*) FROM meters") == 0


async def test_a_blocking_budget_refuses_triggers_and_alerts_once_per_window(api: Api) -> None:
    await api.ok("POST", "/v1/workflows", json=CHAIN)
    budget = {"meter": "runs", "window": "day", "limit": 4, "alert_percents": [50, 100]}
    created = await api.call("POST", "/v1/budgets", json=budget, key="b1")
    assert created.status_code == 201, created.text
    assert (await api.call("POST", "/v1/budgets", json=budget)).status_code == 200
    await api.fails("POST", "/v1/budgets", 409, "budget.conflict", json={**budget, "limit": 9})
    for _ in range(4):
        await api.ok("POST", "/v1/runs", json={"family_slug": "chain"})
    refused = await api.fails(
        "POST", "/v1/runs", 429, "budget.exceeded", json={"family_slug": "chain"}
    )
    assert STATUS_BY_CODE["budget.exceeded"] == 429
    assert refused["details"] == {
        "meter": "runs",
        "window": "day",
        "window_start": "2030-01-01T00:00:00Z",
        "limit": 4,
        "current": 4,
        "requested": 1,
    }
    assert await api.count("SELECT COUNT(*) FROM runs") == 4
    # A replay of a started run is not new work: it answers, and counts nothing.
    view = await api.ok("GET", "/v1/budgets/runs")
    assert view["usage"] == 4
    assert [(a["percent"], a["value"]) for a in view["alerts"]] == [(50, 2), (100, 4)]
    # Empty parameters are absent ones, as on every list: every meter, by day.
    rows = await api.ok("GET", "/v1/usage?meter=&window=&from=&to=&limit=50")
    assert {(r["meter"], r["window"], r["value"]) for r in rows if r["meter"] == "runs"} == {
        ("runs", "day", 4)
    }
    # The next day is a new window: the limit applies afresh and alerts again.
    api.clock.advance(timedelta(days=1))
    for _ in range(2):
        await api.ok("POST", "/v1/runs", json={"family_slug": "chain"})
    view = await api.ok("GET", "/v1/budgets/runs")
    assert view["usage"] == 2
    assert view["window_start"] == "2030-01-02T00:00:00Z"
    assert [(a["window_start"][:10], a["percent"]) for a in view["alerts"]] == [
        ("2030-01-02", 50),
        ("2030-01-01", 50),
        ("2030-01-01", 100),
    ]
    days = await api.ok("GET", "/v1/usage?meter=runs&window=day")
    assert [(d["window_start"][:10], d["value"]) for d in days] == [
        ("2030-01-01", 4),
        ("2030-01-02", 2),
    ]
    month = await api.ok("GET", "/v1/usage?meter=runs&window=month")
    assert [m["value"] for m in month] == [6]
    # PUT replaces; an alert-only budget no longer refuses.
    put = await api.call(
        "PUT", "/v1/budgets/runs", json={"window": "day", "limit": 2, "block": False}
    )
    assert put.status_code == 200, put.text
    await api.ok("POST", "/v1/runs", json={"family_slug": "chain"})
    assert (await api.ok("GET", "/v1/budgets/runs"))["usage"] == 3
    # Other tenant: not found, and its own runs are not limited by this budget.
    await api.fails("GET", "/v1/budgets/runs", 404, "budget.not_found", as_b=True)
    await api.fails("DELETE", "/v1/budgets/runs", 404, "budget.not_found", as_b=True)
    assert await api.ok("GET", "/v1/budgets", as_b=True) == []
    assert await usage_of(api, "runs", as_b=True) == 0
    deleted = await api.call("DELETE", "/v1/budgets/runs")
    assert deleted.status_code == 204
    await api.fails("GET", "/v1/budgets/runs", 404, "budget.not_found")


async def test_twenty_concurrent_triggers_never_pass_a_budget_of_ten(api: Api) -> None:
    await api.ok("POST", "/v1/workflows", json=CHAIN)
    await api.ok("POST", "/v1/budgets", json={"meter": "runs", "window": "month", "limit": 10})
    responses = await asyncio.gather(
        *(api.call("POST", "/v1/runs", json={"family_slug": "chain"}) for _ in range(20))
    )
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [201] * 10 + [429] * 10, [r.text for r in responses]
    assert await api.count("SELECT COUNT(*) FROM runs") == 10
    assert await usage_of(api, "runs", "month") == 10
    # 100% is recorded once however the race went.
    assert await api.count("SELECT COUNT(*) FROM budget_alerts WHERE percent = 100") == 1


def _budget_committed_later(url: str, meter: str, limit: int) -> threading.Timer:
    """Another writer's budget on `meter`: inserted now, committed half a second later
    (from a thread, whatever the event loop is doing)."""
    conn = psycopg.connect(url)
    conn.execute(
        "INSERT INTO budgets (tenant_id, meter, win, lim, alert_percents, block, created_at,"
        " updated_at) VALUES ('tenant-a', %s, 'month', %s, '[50, 80, 100]', true, now(), now())",
        (meter, limit),
    )

    def commit() -> None:
        conn.commit()
        conn.close()

    timer = threading.Timer(0.5, commit)
    timer.start()
    return timer


# Postgres only: it needs two writers at once, which SQLite never has.
@pytest.mark.parametrize("api", ["postgres"], indirect=True)
async def test_a_budget_created_meanwhile_is_a_conflict_not_replaced(
    api: Api, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue("postgres_url")
    await api.ok("POST", "/v1/meters", json={"name": "calls", "unit": "call"})
    # Another request's budget is written but not committed while this create looks:
    # once it commits, the create must neither overwrite it nor answer 201.
    timer = _budget_committed_later(url, "calls", 7)
    response = await api.call("POST", "/v1/budgets", json={"meter": "calls", "limit": 100})
    timer.join()
    assert response.status_code == 409, response.text
    assert response.json()["code"] == "budget.conflict"
    assert (await api.ok("GET", "/v1/budgets/calls"))["limit"] == 7
    # The same budget committed meanwhile is found: 200, not a second 201.
    await api.ok("POST", "/v1/meters", json={"name": "calls2", "unit": "call"})
    timer = _budget_committed_later(url, "calls2", 5)
    response = await api.call("POST", "/v1/budgets", json={"meter": "calls2", "limit": 5})
    timer.join()
    assert response.status_code == 200, response.text
    assert response.json()["limit"] == 5


async def test_a_batch_that_would_pass_the_budget_starts_none(api: Api) -> None:
    await api.ok("POST", "/v1/workflows", json=CHAIN)
    await api.ok("POST", "/v1/budgets", json={"meter": "runs", "window": "day", "limit": 2})
    await api.ok("POST", "/v1/runs", json={"family_slug": "chain"})
    runs = [{"family_slug": "chain"}, {"family_slug": "chain"}]
    refused = await api.fails("POST", "/v1/runs/batch", 429, "budget.exceeded", json={"runs": runs})
    assert refused["details"]["meter"] == "runs"
    assert refused["details"]["current"] == 1
    assert refused["details"]["requested"] == 2
    assert await api.count("SELECT COUNT(*) FROM runs") == 1
    assert await usage_of(api, "runs") == 1
    started = await api.ok("POST", "/v1/runs/batch", json={"runs": runs[:1]})
    assert started["created"] == 1
    await api.ok("PUT", "/v1/budgets/runs", json={"window": "day", "limit": 0})
    await api.fails("POST", "/v1/runs/batch", 429, "budget.exceeded", json={"runs": runs[:1]})
    assert await api.count("SELECT COUNT(*) FROM runs") == 2


async def test_an_event_that_would_start_runs_past_the_budget_is_refused(api: Api) -> None:
    await api.ok("POST", "/v1/workflows", json=ON_EVENT)
    await api.ok("POST", "/v1/budgets", json={"meter": "runs", "limit": 1})
    first = await api.ok("POST", "/v1/events", json={"name": "order.placed", "id": "e1"})
    assert len(first["runs_started"]) == 1
    refused = await api.fails(
        "POST", "/v1/events", 429, "budget.exceeded", json={"name": "order.placed", "id": "e2"}
    )
    assert refused["details"]["meter"] == "runs"
    assert await api.count("SELECT COUNT(*) FROM events WHERE id = 'e2'") == 0
    # An event that starts nothing is not metered and not refused.
    await api.ok("POST", "/v1/events", json={"name": "other.thing", "id": "e3"})
    await api.ok("PUT", "/v1/budgets/runs", json={"limit": 2})
    again = await api.ok("POST", "/v1/events", json={"name": "order.placed", "id": "e2"})
    assert again["duplicate"] is False
    assert len(again["runs_started"]) == 1


async def test_custom_meters_sum_count_max_and_their_budgets(api: Api) -> None:
    for name, aggregation in (("tokens", "sum"), ("calls", "count"), ("seats", "max")):
        await api.ok(
            "POST", "/v1/meters", json={"name": name, "unit": "u", "aggregation": aggregation}
        )
    for amount in (5, 7):
        for name in ("tokens", "calls", "seats"):
            await api.ok("POST", "/v1/usage", json={"meter": name, "amount": amount})
    await api.ok("POST", "/v1/usage", json={"meter": "seats", "amount": 3})
    assert await usage_of(api, "tokens") == 12
    assert await usage_of(api, "calls") == 2
    assert await usage_of(api, "seats") == 7
    await api.ok(
        "POST", "/v1/budgets", json={"meter": "tokens", "limit": 20, "alert_percents": [75]}
    )
    recorded = await api.ok("POST", "/v1/usage", json={"meter": "tokens", "amount": 8})
    assert [u["value"] for u in recorded["usage"]] == [20, 20, 20]
    await api.fails(
        "POST", "/v1/usage", 429, "budget.exceeded", json={"meter": "tokens", "amount": 1}
    )
    assert await usage_of(api, "tokens") == 20
    [alert] = (await api.ok("GET", "/v1/budgets/tokens"))["alerts"]
    assert (alert["percent"], alert["value"], alert["window"]) == (75, 20, "month")
    await api.fails(
        "POST", "/v1/usage", 422, "request.invalid", json={"meter": "runs", "amount": 1}
    )
    out = await api.fails(
        "POST", "/v1/usage", 422, "metering.invalid", json={"meter": "tokens", "amount": -1}
    )
    assert out["details"]["path"] == "$.amount"
    await api.fails(
        "POST", "/v1/usage", 404, "meter.not_found", json={"meter": "tokens"}, as_b=True
    )
    await api.fails(
        "PUT", "/v1/budgets/tokens", 404, "meter.not_found", json={"limit": 1}, as_b=True
    )
    await api.fails("GET", "/v1/budgets/tokens", 404, "budget.not_found", as_b=True)
    await api.fails("GET", "/v1/usage?meter=tokens", 404, "meter.not_found", as_b=True)


async def test_plans_gate_routing_and_workflows_through_one_check(api: Api) -> None:
    plan = {"id": "starter", "name": "Starter", "entitlements": {"workflows": {"limit": 1}}}
    created = await api.call("POST", "/v1/plans", json=plan, key="p1")
    assert created.status_code == 201, created.text
    assert (await api.call("POST", "/v1/plans", json=plan)).status_code == 200
    await api.fails("POST", "/v1/plans", 409, "plan.conflict", json={**plan, "entitlements": {}})
    assert await api.ok("GET", "/v1/plan") == {"plan": None, "assigned_at": None}
    await api.fails("PUT", "/v1/plan", 404, "plan.not_found", json={"plan": "gold"})
    assigned = await api.ok("PUT", "/v1/plan", json={"plan": "starter"})
    assert assigned["plan"]["entitlements"] == {"workflows": {"enabled": True, "limit": 1}}
    # The plan lacks routing: entitlement.missing, nothing decided or counted.
    missing = await api.fails(
        "POST", "/v1/route", 403, "entitlement.missing", json={"id": "r1", "kind": "lead"}
    )
    assert missing["details"] == {"plan": "starter", "feature": "routing"}
    assert await api.count("SELECT COUNT(*) FROM routing_decisions") == 0
    # One workflow family is allowed; a second is over the limit; new versions are fine.
    await api.ok("POST", "/v1/workflows", json=CHAIN)
    await api.ok("POST", "/v1/workflows", json={**CHAIN, "title": "v2"})
    over = await api.fails(
        "POST",
        "/v1/workflows",
        403,
        "entitlement.limit_exceeded",
        json={**CHAIN, "family_slug": "two"},
    )
    assert over["details"]["feature"] == "workflows"
    # Another tenant has no plan, so nothing is gated; it cannot see or assign ours.
    await api.fails("GET", "/v1/plans/starter", 404, "plan.not_found", as_b=True)
    await api.fails("PUT", "/v1/plan", 404, "plan.not_found", json={"plan": "starter"}, as_b=True)
    await api.ok("POST", "/v1/workflows", json={**CHAIN, "family_slug": "two"}, as_b=True)
    # A plan with routing lets decisions through, and they are metered.
    kinds = {"lead": {"attributes": {}, "require_price": False}}
    await api.ok("POST", "/v1/rules", json={"id": "main", "kinds": kinds, "rules": []})
    await api.ok(
        "POST", "/v1/plans", json={"id": "pro", "entitlements": {"routing": {}, "workflows": {}}}
    )
    await api.ok("PUT", "/v1/plan", json={"plan": "pro"})
    decision = await api.ok("POST", "/v1/route", json={"id": "r1", "kind": "lead"})
    assert decision["outcome"]
    assert await usage_of(api, "route_decisions") == 1
    await api.ok("POST", "/v1/budgets", json={"meter": "route_decisions", "limit": 1})
    await api.fails("POST", "/v1/route", 429, "budget.exceeded", json={"id": "r2", "kind": "lead"})
    assert await api.count("SELECT COUNT(*) FROM routing_decisions") == 1
    # No plan again: nothing gated.
    await api.ok("PUT", "/v1/plan", json={"plan": None})
    assert (await api.ok("GET", "/v1/plan"))["plan"] is None
    await api.ok("POST", "/v1/workflows", json={**CHAIN, "family_slug": "three"})
    listed = [p["id"] for p in await api.ok("GET", "/v1/plans")]
    assert listed == ["pro", "starter"]


async def test_a_tenant_cannot_flood_meters_or_plans(api: Api) -> None:
    for n in range(100):
        await api.ok("POST", "/v1/meters", json={"name": f"m{n}", "unit": "u"})
        await api.ok("POST", "/v1/plans", json={"id": f"p{n}"})
    over = await api.fails(
        "POST", "/v1/meters", 422, "request.invalid", json={"name": "m100", "unit": "u"}
    )
    assert over["details"] == {"limit": 100}
    await api.fails("POST", "/v1/plans", 422, "request.invalid", json={"id": "p100"})
    # The same meter again still answers; another tenant has its own allowance.
    assert (
        await api.call("POST", "/v1/meters", json={"name": "m7", "unit": "u"})
    ).status_code == 200
    await api.ok("POST", "/v1/meters", json={"name": "m100", "unit": "u"}, as_b=True)
    assert len(await api.ok("GET", "/v1/meters")) == 106  # 100 own, 6 built in


async def test_a_sum_stops_at_the_largest_usage_instead_of_overflowing(api: Api) -> None:
    """Usage of 2^53-1 again and again: the counters stay at 2^53-1 (exact in any JSON
    reader), never pass the column's 64 bits, and the meter goes on taking usage."""
    most = 2**53 - 1
    await api.ok("POST", "/v1/meters", json={"name": "bytes", "unit": "byte"})
    first = await api.ok("POST", "/v1/usage", json={"meter": "bytes", "amount": most})
    assert {row["value"] for row in first["usage"]} == {most}
    for _ in range(3):
        again = await api.ok("POST", "/v1/usage", json={"meter": "bytes", "amount": most})
        assert {row["value"] for row in again["usage"]} == {most}
    assert await usage_of(api, "bytes", "month") == most
    # A budget at the largest limit still sees the counter at it, not past it.
    await api.ok("POST", "/v1/budgets", json={"meter": "bytes", "limit": most, "block": False})
    assert (await api.ok("GET", "/v1/budgets/bytes"))["usage"] == most
    assert (await api.ok("POST", "/v1/usage", json={"meter": "bytes", "amount": 1}))["usage"][0][
        "value"
    ] == most
