"""The ledger through a real `ductor serve` process on SQLite and on Postgres: twenty
debits sent at once on their own connections never overdraw a wallet with a floor
of 0, twenty retries of one entry post it once, and twenty deliveries at once of
a Stripe webhook (from a fake Stripe API on 127.0.0.1) credit a wallet once."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from ductor_server.cli_server import create_key
from ductor_server.pytest_plugin import create_database, drop_database
from ductor_server.storage import open_store

from .fake_stripe import API_KEY, WEBHOOK_SECRET, FakeStripe, stripe_signature

USD = 1_000_000
TENANTS = ("t-debits", "t-retries", "t-stripe")


@dataclass
class Server:
    url: str
    target: str
    keys: dict[str, str]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _mint_keys(target: str) -> dict[str, str]:
    store = open_store(target)
    await store.open()
    try:
        await store.migrate()
        return {t: await create_key(store, t, name=t) for t in TENANTS}
    finally:
        await store.close()


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
) -> Iterator[Server]:
    data_dir = tmp_path_factory.mktemp(f"ledger-{request.param}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_")}
    env.update({"DUCTOR_POLL_INTERVAL": "0.05", "PYTHONUNBUFFERED": "1"})
    env.update(
        {
            "DUCTOR_STRIPE_API_KEY": API_KEY,
            "DUCTOR_STRIPE_WEBHOOK_SECRET": WEBHOOK_SECRET,
            "DUCTOR_STRIPE_API_BASE": stripe.url,
        }
    )
    database_url = None
    if request.param == "postgres":
        database_url = create_database(request.getfixturevalue("_postgres_admin"))
        env["DUCTOR_DATABASE_URL"] = database_url
    target = database_url or str(data_dir / "ductor.db")
    keys = asyncio.run(_mint_keys(target))
    port = _free_port()
    log = (data_dir / "server.log").open("wb")
    command = [sys.executable, "-m", "ductor_server.cli", "serve", "--port", str(port)]
    proc = subprocess.Popen(
        [*command, "--data-dir", str(data_dir)], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, (data_dir / "server.log").read_text()
            assert time.monotonic() < deadline, "the server did not start in 30 s"
            time.sleep(0.1)
        yield Server(url=url, target=target, keys=keys)
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log.close()
        if database_url is not None:
            drop_database(database_url)


async def _call(
    server: Server, tenant: str, method: str, path: str, body: Any = None, key: str | None = None
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {server.keys[tenant]}"}
    if key is not None:
        headers["Idempotency-Key"] = key
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        return await http.request(method, path, json=body, headers=headers)


async def _setup(server: Server, tenant: str, funds: int) -> None:
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


async def test_twenty_debits_at_once_never_overdraw(server: Server) -> None:
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


async def test_twenty_retries_of_one_entry_post_it_once(server: Server) -> None:
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
    server: Server, stripe: FakeStripe
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
