"""Wallet top-ups through Stripe, against a fake Stripe API on 127.0.0.1, on both
backends: a top-up opens one PaymentIntent and is credited exactly once by its
signed webhook however often (and however concurrently) it is delivered; a bad
signature, a stale one or a failed payment moves nothing; tenants stay apart."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from ductor_server import Settings, create_app
from ductor_server.cli_server import create_key
from ductor_server.composition import build, payment_gateway
from ductor_server.engine.clock import ManualClock
from ductor_server.storage import open_store
from ductor_server.testing import served

from .conftest import Api
from .fake_stripe import API_KEY, WEBHOOK_SECRET, FakeStripe, stripe_signature

USD = 1_000_000
CENT = USD // 100


@pytest.fixture
def stripe() -> Iterator[FakeStripe]:
    fake = FakeStripe().start()
    try:
        yield fake
    finally:
        fake.stop()


def _stripe_settings(tmp_path: Path, database_url: str | None, base: str) -> Settings:
    return Settings(
        data_dir=tmp_path,
        database_url=database_url,
        roles=("api",),
        stripe_api_key=API_KEY,
        stripe_webhook_secret=WEBHOOK_SECRET,
        stripe_api_base=base,
    )


@pytest.fixture(params=["sqlite", "postgres"])
async def wallet_api(
    tmp_path: Path, request: pytest.FixtureRequest, stripe: FakeStripe
) -> AsyncIterator[Api]:
    database_url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    settings = _stripe_settings(tmp_path, database_url, stripe.url)
    clock = ManualClock()
    async with served(build(settings, clock=clock)) as (client, keys, store):
        api = Api(client, keys, store, clock, request.param)
        await api.open("wallet:buyer", floor=0)
        yield api


async def _deliver(api: Api, payload: bytes, signature: str | None = None) -> Any:
    headers = {"Content-Type": "application/json"}
    headers["Stripe-Signature"] = (
        stripe_signature(payload, WEBHOOK_SECRET) if signature is None else signature
    )
    return await api.client.post("/webhooks/stripe", content=payload, headers=headers)


async def _topup(api: Api, amount: int = 25 * USD, **kwargs: Any) -> dict[str, Any]:
    body = {"account": "wallet:buyer", "amount": amount, "description": "card top-up"}
    topup: dict[str, Any] = await api.ok("POST", "/v1/topups", json=body, **kwargs)
    return topup


async def test_a_paid_top_up_is_credited_once_however_often_the_webhook_comes(
    wallet_api: Api, stripe: FakeStripe
) -> None:
    api = wallet_api
    topup = await _topup(api)
    assert topup["status"] == "pending"
    assert topup["payment_id"].startswith("pi_fake")
    assert topup["client_secret"].startswith(topup["payment_id"] + "_secret_")
    intent = stripe.intents[topup["payment_id"]]
    assert (intent["amount"], intent["currency"]) == (2500, "usd")
    assert intent["metadata"]["ductor_tenant"] == "tenant-a"
    assert intent["metadata"]["ductor_topup"] == topup["id"]

    payload = stripe.event(topup["payment_id"])
    answers = await asyncio.gather(*(_deliver(api, payload) for _ in range(10)))
    assert [a.status_code for a in answers] == [200] * 10, [a.text for a in answers]
    assert all(a.json()["status"] == "credited" for a in answers)
    # The same event sent again later, and a second event about the same payment.
    assert (await _deliver(api, payload)).status_code == 200
    assert (await _deliver(api, stripe.event(topup["payment_id"]))).status_code == 200

    wallet = await api.balance("wallet:buyer")
    assert wallet["balance"] == 25 * USD
    clearing = await api.balance("stripe:clearing:USD")
    assert (clearing["kind"], clearing["balance"]) == ("asset", 25 * USD)
    assert (
        await api.count("SELECT COUNT(*) FROM ledger_entries WHERE reference_kind = 'top_up'") == 1
    )
    stored = await api.ok("GET", f"/v1/topups/{topup['id']}")
    assert (stored["status"], stored["credited_amount"]) == ("credited", 25 * USD)
    entry = await api.ok("GET", f"/v1/ledger/entries/{stored['entry_id']}")
    assert entry["reference"] == {"kind": "top_up", "id": topup["id"]}
    assert entry["idempotency_key"] == f"topup:{topup['id']}"


async def test_the_wallet_gets_what_was_received(wallet_api: Api, stripe: FakeStripe) -> None:
    api = wallet_api
    topup = await _topup(api, 10 * USD)
    answer = await _deliver(api, stripe.event(topup["payment_id"], amount_received=750))
    assert answer.status_code == 200, answer.text
    assert (await api.balance("wallet:buyer"))["balance"] == 750 * CENT
    stored = await api.ok("GET", f"/v1/topups/{topup['id']}")
    assert (stored["amount"], stored["credited_amount"]) == (10 * USD, 750 * CENT)


async def test_a_key_replays_the_same_top_up_and_payment(
    wallet_api: Api, stripe: FakeStripe
) -> None:
    api = wallet_api
    first = await _topup(api, key="topup-1")
    again = await api.call(
        "POST",
        "/v1/topups",
        key="topup-1",
        json={"account": "wallet:buyer", "amount": 25 * USD, "description": "card top-up"},
    )
    assert again.status_code == 201
    assert again.headers.get("Idempotency-Replayed") == "true"
    assert again.json()["id"] == first["id"]
    assert again.json()["payment_id"] == first["payment_id"]
    assert stripe.creates == 1
    await api.fails(
        "POST",
        "/v1/topups",
        422,
        "idempotency.conflict",
        key="topup-1",
        json={"account": "wallet:buyer", "amount": 30 * USD},
    )
    assert await api.count("SELECT COUNT(*) FROM wallet_topups") == 1


async def test_bad_signatures_move_nothing(wallet_api: Api, stripe: FakeStripe) -> None:
    api = wallet_api
    topup = await _topup(api)
    payload = stripe.event(topup["payment_id"])
    good = stripe_signature(payload, WEBHOOK_SECRET)
    tampered = payload.replace(b'"amount_received": 2500', b'"amount_received": 9900')
    assert tampered != payload
    stale = stripe_signature(payload, WEBHOOK_SECRET, timestamp=int(time.time()) - 3600)
    for body, signature in (
        (payload, ""),
        (payload, stripe_signature(payload, "whsec_someone_else")),
        (tampered, good),
        (payload, stale),
        (b"not json at all", stripe_signature(b"not json at all", WEBHOOK_SECRET)),
    ):
        answer = await _deliver(api, body, signature)
        assert answer.status_code == 400, answer.text
        assert answer.json()["code"] == "webhook.signature_invalid"
    assert (await api.balance("wallet:buyer"))["balance"] == 0
    assert (await api.ok("GET", f"/v1/topups/{topup['id']}"))["status"] == "pending"


async def test_failed_and_foreign_payments_credit_nothing(
    wallet_api: Api, stripe: FakeStripe
) -> None:
    api = wallet_api
    topup = await _topup(api)
    failed = await _deliver(api, stripe.event(topup["payment_id"], "payment_intent.payment_failed"))
    assert failed.json() == {
        "event": failed.json()["event"],
        "handled": True,
        "topup": topup["id"],
        "status": "failed",
    }
    # Metadata naming another tenant's top-up is not trusted over the payment id.
    other = await _topup(api, 5 * USD)
    forged = stripe.event(
        other["payment_id"], metadata={"ductor_tenant": "tenant-b", "ductor_topup": other["id"]}
    )
    assert (await _deliver(api, forged)).json()["handled"] is False
    # Events about nothing Ductor created, or not about a payment, are acknowledged.
    unrelated = stripe.event(other["payment_id"], "customer.created")
    assert (await _deliver(api, unrelated)).json()["handled"] is False
    assert (await api.balance("wallet:buyer"))["balance"] == 0
    assert await api.count("SELECT COUNT(*) FROM ledger_entries") == 0
    # Money that arrives after a failure still counts, once.
    paid = await _deliver(api, stripe.event(topup["payment_id"]))
    assert paid.json()["status"] == "credited"
    assert (await api.balance("wallet:buyer"))["balance"] == 25 * USD


async def test_refusals(wallet_api: Api, stripe: FakeStripe) -> None:
    api = wallet_api
    await api.open("cash", kind="asset")
    await api.ok(
        "POST", "/v1/accounts", json={"code": "points", "currency": "POINTS", "kind": "liability"}
    )
    for body, pointer in (
        ({"account": "wallet:buyer", "amount": 0}, "/amount"),
        ({"account": "wallet:buyer", "amount": -5 * USD}, "/amount"),
        ({"account": "wallet:buyer", "amount": 1}, "/amount"),  # not whole cents
        ({"account": "wallet:buyer", "amount": 10**9 * USD}, "/amount"),
        ({"account": "cash", "amount": USD}, "/account"),  # grows on debit
        ({"account": "points", "amount": USD}, "/account"),  # not an ISO currency
        ({"account": "wallet:buyer", "amount": USD, "description": "d" * 1001}, "/description"),
    ):
        refused = await api.fails("POST", "/v1/topups", 422, "request.invalid", json=body)
        assert refused["details"]["pointer"] == pointer, refused
    await api.fails(
        "POST", "/v1/topups", 404, "account.not_found", json={"account": "nope", "amount": USD}
    )
    await api.fails(
        "POST",
        "/v1/topups",
        422,
        "request.invalid",
        json={"account": "wallet:buyer", "amount": USD, "extra": 1},
    )
    stripe.decline_amounts.add(1300)
    declined = await api.fails(
        "POST",
        "/v1/topups",
        422,
        "wallet.processor_error",
        json={"account": "wallet:buyer", "amount": 13 * USD},
    )
    assert "declined" in declined["message"]
    assert declined["details"]["processor_code"] == "card_declined"
    # Stripe failing itself is retried by the client, then answered as retryable.
    stripe.broken_amounts.add(1700)
    await api.fails(
        "POST",
        "/v1/topups",
        503,
        "wallet.processor_unreachable",
        json={"account": "wallet:buyer", "amount": 17 * USD},
    )
    assert stripe.broken_calls == 3
    assert stripe.creates == 0
    assert await api.count("SELECT COUNT(*) FROM wallet_topups") == 0


async def test_tenants_see_only_their_own_top_ups(wallet_api: Api, stripe: FakeStripe) -> None:
    api = wallet_api
    topup = await _topup(api)
    await api.fails("GET", f"/v1/topups/{topup['id']}", 404, "topup.not_found", as_b=True)
    assert await api.ok("GET", "/v1/topups", as_b=True) == []
    await api.fails(
        "POST",
        "/v1/topups",
        404,
        "account.not_found",
        as_b=True,
        json={"account": "wallet:buyer", "amount": USD},
    )
    mine = await api.ok("GET", "/v1/topups?account=wallet:buyer")
    assert [t["id"] for t in mine] == [topup["id"]]


async def test_without_stripe_top_ups_are_unavailable(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, roles=("api",))
    async with AsyncTestClient(app=create_app(composition=build(settings))) as client:
        store = open_store(settings.store_target)
        await store.open()
        try:
            key = await create_key(store, "tenant-a", name="a")
        finally:
            await store.close()
        headers = {"Authorization": f"Bearer {key}"}
        answer = await client.post(
            "/v1/topups", json={"account": "w", "amount": USD}, headers=headers
        )
        assert answer.status_code == 503
        assert answer.json()["code"] == "wallet.unavailable"
        hook = await client.post(
            "/webhooks/stripe", content=b"{}", headers={"Stripe-Signature": "t=1"}
        )
        assert hook.status_code == 503


def test_stripe_needs_both_settings(tmp_path: Path) -> None:
    assert payment_gateway(Settings(data_dir=tmp_path)) is None
    with pytest.raises(ValueError, match="both"):
        payment_gateway(Settings(data_dir=tmp_path, stripe_api_key=API_KEY))
    gateway = payment_gateway(
        Settings(data_dir=tmp_path, stripe_api_key=API_KEY, stripe_webhook_secret=WEBHOOK_SECRET)
    )
    assert gateway is not None
    assert gateway.name == "stripe"
    assert API_KEY not in repr(Settings(data_dir=tmp_path, stripe_api_key=API_KEY))
