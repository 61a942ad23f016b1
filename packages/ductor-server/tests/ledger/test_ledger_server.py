"""The ledger through a real `ductor serve` process on SQLite and on Postgres: twenty
debits sent at once on their own connections never overdraw a wallet with a floor
of 0, twenty retries of one entry post it once, and twenty deliveries at once of
a Stripe webhook (from a fake Stripe API on 127.0.0.1) credit a wallet once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ductor_server.pytest_plugin import create_database, drop_database
from ductor_server.testing import ServedProcess, serve_process

from .fake_stripe import API_KEY, WEBHOOK_SECRET, FakeStripe, stripe_signature

USD = 1_000_000
TENANTS = ("t-debits", "t-retries", "t-stripe")


@pytest.fixture(scope="module")
def stripe() -> Iterator[FakeStripe]:
    fake = FakeStripe().start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, stripe: FakeStripe
) -> Iterator[ServedProcess]:
    data_dir = tmp_path_factory.mktemp("ledger-" + request.param)
    env = {
        "DUCTOR_POLL_INTERVAL": "0.05",
        "DUCTOR_STRIPE_API_KEY": API_KEY,
        "DUCTOR_STRIPE_WEBHOOK_SECRET": WEBHOOK_SECRET,
        "DUCTOR_STRIPE_API_BASE": stripe.url,
    }
    database_url = None
    if request.param == "postgres":
        database_url = create_database(request.getfixturevalue("_postgres_admin"))
    try:
        with serve_process(data_dir, tenants=TENANTS, database_url=database_url, env=env) as served:
            yield served
    finally:
        if database_url is not None:
            drop_database(database_url)


async def _call(
    server: ServedProcess,
    tenant: str,
    method: str,
    path: str,
    body: Any = None,
    key: str | None = None,
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {server.keys[tenant]}"}
    if key is not None:
        headers["Idempotency-Key"] = key
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        return await http.request(method, path, json=body, headers=headers)


async def _setup(server: ServedProcess, tenant: str, funds: int) -> None:
    for code, kind, floor in (
        ("cash", "asset", None),
        ("wallet", "liability", 0),
        ("revenue", "revenue", None),
    ):
        body = {"code": code, "currency": "USD", "kind": kind, "floor": floor}
        assert (await _call(server, tenant, "POST", "/v1/accounts", body)).status_code == 201
    top_up = {
        "postings": [
            {"account": "cash", "amount": funds, "currency": "USD"},
            {"account": "wallet", "amount": -funds, "currency": "USD"},
        ]
    }
    assert (await _call(server, tenant, "POST", "/v1/ledger/entries", top_up)).status_code == 201


def _charge(amount: int) -> dict[str, Any]:
    return {
        "postings": [
            {"account": "wallet", "amount": amount, "currency": "USD"},
            {"account": "revenue", "amount": -amount, "currency": "USD"},
        ]
    }


async def test_twenty_debits_at_once_never_overdraw(server: ServedProcess) -> None:
    tenant = "t-debits"
    await _setup(server, tenant, 10 * USD)
    answers = await asyncio.gather(
        *(
            _call(server, tenant, "POST", "/v1/ledger/entries", _charge(USD), key=f"d{n}")
            for n in range(20)
        )
    )
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [201] * 10 + [422] * 10, [a.text for a in answers]
    assert {a.json()["code"] for a in answers if a.status_code == 422} == {"ledger.floor_crossed"}
    wallet = (await _call(server, tenant, "GET", "/v1/accounts/wallet")).json()
    assert (wallet["balance"], wallet["available"]) == (0, 0)
    page = (await _call(server, tenant, "GET", "/v1/ledger/entries?account=revenue")).json()
    assert len(page["items"]) == 10


async def test_twenty_retries_of_one_entry_post_it_once(server: ServedProcess) -> None:
    tenant = "t-retries"
    await _setup(server, tenant, 10 * USD)
    answers = await asyncio.gather(
        *(
            _call(server, tenant, "POST", "/v1/ledger/entries", _charge(3 * USD), key="once")
            for _ in range(20)
        )
    )
    assert [a.status_code for a in answers] == [201] * 20, [a.text for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    replayed = [a.headers.get("Idempotency-Replayed") == "true" for a in answers]
    assert replayed.count(False) == 1
    wallet = (await _call(server, tenant, "GET", "/v1/accounts/wallet")).json()
    assert wallet["balance"] == 7 * USD


async def test_twenty_webhook_deliveries_at_once_credit_a_wallet_once(
    server: ServedProcess, stripe: FakeStripe
) -> None:
    tenant = "t-stripe"
    wallet = {"code": "wallet", "currency": "USD", "kind": "liability", "floor": 0}
    assert (await _call(server, tenant, "POST", "/v1/accounts", wallet)).status_code == 201
    started = await _call(
        server, tenant, "POST", "/v1/topups", {"account": "wallet", "amount": 40 * USD}, key="t1"
    )
    assert started.status_code == 201, started.text
    topup = started.json()
    payload = stripe.event(topup["payment_id"])

    async def deliver(http: httpx.AsyncClient) -> httpx.Response:
        headers = {
            "Content-Type": "application/json",
            "Stripe-Signature": stripe_signature(payload, WEBHOOK_SECRET),
        }
        return await http.post("/webhooks/stripe", content=payload, headers=headers)

    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        answers = await asyncio.gather(*(deliver(http) for _ in range(20)))
    assert [a.status_code for a in answers] == [200] * 20, [a.text for a in answers]
    balance = (await _call(server, tenant, "GET", "/v1/accounts/wallet")).json()
    assert balance["balance"] == 40 * USD
    entries = (await _call(server, tenant, "GET", "/v1/ledger/entries?account=wallet")).json()
    assert [e["reference"] for e in entries["items"]] == [{"kind": "top_up", "id": topup["id"]}]
    stored = (await _call(server, tenant, "GET", f"/v1/topups/{topup['id']}")).json()
    assert (stored["status"], stored["entry_id"]) == ("credited", entries["items"][0]["id"])
