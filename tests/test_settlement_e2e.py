"""A settled lead marketplace end to end, through the HTTP API of a real server process.

Two auction pools with settlement on (different take rates and roundings), ten
buyers with prepaid wallets (floor 0; some small enough to run dry), 1,000 leads
routed by 8 concurrent clients. Every 20th lead is returned at once, inside its
pool's window, and rerouted without its buyer; later, leads of the pool with a
short window are refused as too late. Then the books are checked from the
outside, to the micro: what buyers spent is what sellers and the platform got,
less what returns credited back, and no wallet is below its floor.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import time
from typing import Any

import httpx

from ductor_settlement import decode_envelope, load_public_keys, verify_receipt
from tests.conftest import ServerProcess

LEADS = 1_000
CLIENTS = 8
USD = 1_000_000
RETURN_EVERY = 20
# pool -> (take rate bps, rounding, return window seconds, seller payable)
POOLS: dict[str, tuple[int, str, int, str]] = {
    "solar": (1_000, "floor", 3_600, "payable:solar-co"),
    "roof": (1_250, "ceiling", 6, "payable:roof-co"),
}
PLATFORM = "revenue:platform"


def buyers() -> dict[str, dict[str, Any]]:
    """Ten buyers: bids per pool, and a wallet; b0-b2 are small and run dry."""
    rng = random.Random(20261201)
    out: dict[str, dict[str, Any]] = {}
    for i in range(10):
        pools = ["solar", "roof"] if i % 3 == 0 else [("solar", "roof")[i % 2]]
        out[f"b{i}"] = {
            "funds": (25 if i < 3 else 10_000) * USD + rng.randint(0, 999_999),
            "bids": {p: rng.randint(4 * USD, 12 * USD) for p in pools},
        }
    return out


def _fee(charge: int, bps: int, rounding: str) -> int:
    exact, rest = divmod(charge * bps, 10_000)
    return exact + 1 if rounding == "ceiling" and rest else exact


def configure(http: httpx.Client, people: dict[str, dict[str, Any]]) -> None:
    def ok(response: httpx.Response) -> None:
        assert response.status_code in (200, 201), response.text

    ok(http.post("/v1/accounts", json={"code": "cash", "currency": "USD", "kind": "asset"}))
    ok(http.post("/v1/accounts", json={"code": PLATFORM, "currency": "USD", "kind": "revenue"}))
    for _, _, _, payable in POOLS.values():
        ok(
            http.post(
                "/v1/accounts", json={"code": payable, "currency": "USD", "kind": "liability"}
            )
        )
    for buyer, b in people.items():
        ok(http.post("/v1/workers", json={"id": buyer}))
        wallet = {"code": f"wallet:{buyer}", "currency": "USD", "kind": "liability", "floor": 0}
        ok(http.post("/v1/accounts", json=wallet))
        top_up = {
            "postings": [
                {"account": "cash", "amount": b["funds"], "currency": "USD"},
                {"account": f"wallet:{buyer}", "amount": -b["funds"], "currency": "USD"},
            ],
            "reference": {"kind": "top_up", "id": buyer},
        }
        ok(http.post("/v1/ledger/entries", json=top_up))
    for pool, (bps, rounding, window, payable) in POOLS.items():
        members = [
            {"worker": buyer, "bid": b["bids"][pool]}
            for buyer, b in people.items()
            if pool in b["bids"]
        ]
        body = {
            "id": pool,
            "channel": "leads",
            "strategy": {"name": "auction", "options": {"pricing": "second"}},
            "members": members,
        }
        ok(http.post("/v1/pools", json=body))
        setting = {
            "currency": "USD",
            "take_rate_bps": bps,
            "rounding": rounding,
            "seller_account": payable,
            "platform_account": PLATFORM,
            "returns": {"window_seconds": window},
        }
        ok(http.put(f"/v1/pools/{pool}/settlement", json=setting))
    rules = {
        "kinds": {"lead": {"attributes": {"vertical": {"type": "string", "required": True}}}},
        "rules": [
            {"id": pool, "pool": pool, "match": [{"attribute": "vertical", "value": pool}]}
            for pool in POOLS
        ],
    }
    ok(http.post("/v1/rules", json=rules))


async def market(server: ServerProcess) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Route every lead with 8 clients; return every 20th at once (with reroute).
    Returns (decisions, returns)."""
    rng = random.Random(11)
    leads = [
        {"id": f"lead-{n:04d}", "kind": "lead", "attributes": {"vertical": rng.choice(list(POOLS))}}
        for n in range(LEADS)
    ]
    queue: asyncio.Queue[tuple[int, dict[str, Any]]] = asyncio.Queue()
    for item in enumerate(leads):
        queue.put_nowait(item)
    decisions: list[dict[str, Any]] = []
    returns: list[dict[str, Any]] = []
    headers = {"Authorization": f"Bearer {server.api_key}"}

    async def client() -> None:
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=60) as http:
            while not queue.empty():
                n, lead = queue.get_nowait()
                r = await http.post(
                    "/v1/route", json=lead, headers={"Idempotency-Key": f"route-{lead['id']}"}
                )
                assert r.status_code == 201, r.text
                decision = r.json()
                decisions.append(decision)
                if n % RETURN_EVERY or decision["outcome"] != "assigned":
                    continue
                r = await http.post(
                    f"/v1/assignments/{decision['assignment_id']}/return",
                    json={"reason": "bad_phone", "reroute": True},
                    headers={"Idempotency-Key": f"return-{lead['id']}"},
                )
                assert r.status_code == 201, r.text
                returned = r.json()
                returns.append(returned)
                if returned["decision"] is not None:
                    decisions.append(returned["decision"])

    await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return decisions, returns


def _receipts(http: httpx.Client) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"kind": "assignment", "limit": 500}
        if cursor:
            params["cursor"] = cursor
        page = http.get("/v1/receipts", params=params).json()
        found += page["items"]
        cursor = page["next_cursor"]
        if not cursor:
            return found


def test_a_settled_marketplace_balances_to_the_micro(server: ServerProcess) -> None:
    server.extra_env["DUCTOR_RECEIPT_KEY"] = "market-1 " + base64.b64encode(bytes(32)).decode()
    server.start()
    people = buyers()
    with server.client() as http:
        configure(http, people)
    started = time.monotonic()
    decisions, returns = asyncio.run(market(server))
    finished = time.monotonic()
    routed_in = finished - started

    assigned = [d for d in decisions if d["outcome"] == "assigned"]
    returned_ids = {r["assignment_id"] for r in returns}
    reroutes = {r["decision"]["id"] for r in returns if r["decision"] is not None}
    assert len(decisions) == LEADS + len(reroutes)
    # About 5 % of the leads were returned inside the window, and rerouted.
    assert LEADS // RETURN_EVERY - 10 <= len(returns) <= LEADS // RETURN_EVERY
    assert len(reroutes) >= len(returns) // 2
    by_assignment = {d["assignment_id"]: d for d in assigned}
    for r in returns:
        original = by_assignment[r["assignment_id"]]
        assert r["amount"] == original["charge"]
        assert r["full"] is True
        if r["decision"] is not None:
            again = r["decision"]
            assert again["routable_id"] == original["routable_id"]
            assert again["pool"] == original["pool"]
            if again["outcome"] == "assigned":
                assert again["worker"] != original["worker"]
            excluded = {e["reason"]: e["workers"] for e in again["explanation"]["excluded"]}
            assert original["worker"] in excluded["excluded"]
    # The small wallets ran dry: the explanation says so.
    funds_excluded = {
        w
        for d in decisions
        for e in d["explanation"]["excluded"]
        if e["reason"] == "funds"
        for w in e["workers"]
    }
    assert funds_excluded, "no buyer ran out of funds"
    assert funds_excluded <= {"b0", "b1", "b2"}

    # Late returns in the short-window pool are refused; nothing moves.
    window = POOLS["roof"][2]
    time.sleep(max(0.0, window + 0.5 - (time.monotonic() - finished)))
    with server.client() as http:
        before = {a["code"]: a["balance"] for a in http.get("/v1/accounts").json()}
        late = [
            d for d in assigned if d["pool"] == "roof" and d["assignment_id"] not in returned_ids
        ][-10:]
        assert late
        for d in late:
            r = http.post(
                f"/v1/assignments/{d['assignment_id']}/return", json={"reason": "bad_phone"}
            )
            assert r.status_code == 422, r.text
            assert r.json()["code"] == "return.window_closed"
        accounts = {a["code"]: a for a in http.get("/v1/accounts").json()}
    assert {code: a["balance"] for code, a in accounts.items()} == before

    # The books, from the outside, to the micro.
    charged = sum(d["charge"] for d in assigned)
    payouts = fees = 0
    for d in assigned:
        bps, rounding, _, _ = POOLS[d["pool"]]
        fee = _fee(d["charge"], bps, rounding)
        fees += fee
        payouts += d["charge"] - fee
    assert charged == payouts + fees
    credits = sum(r["amount"] for r in returns)
    spent = sum(b["funds"] - accounts[f"wallet:{buyer}"]["balance"] for buyer, b in people.items())
    seller = sum(accounts[payable]["balance"] for _, _, _, payable in POOLS.values())
    platform = accounts[PLATFORM]["balance"]
    # Buyers' net spend is what they were charged less what returns credited back,
    # and exactly what sellers and the platform hold.
    assert spent == charged - credits
    assert spent == seller + platform
    # A full return takes back each leg of its charge: payouts and fees, exactly.
    returned_fees = sum(
        _fee(
            by_assignment[r["assignment_id"]]["charge"],
            *POOLS[by_assignment[r["assignment_id"]]["pool"]][:2],
        )
        for r in returns
    )
    assert platform == fees - returned_fees
    assert seller == payouts - (credits - returned_fees)
    for buyer in people:
        wallet = accounts[f"wallet:{buyer}"]
        assert wallet["balance"] >= 0, wallet
        assert wallet["available"] >= 0, wallet
    assert accounts["cash"]["balance"] == sum(b["funds"] for b in people.values())
    # Every settled assignment has exactly one receipt, for what its buyer paid, and
    # each verifies with the published keys alone.
    everything = [*assigned, *(r["decision"] for r in returns if r["decision"] is not None)]
    paid = {d["assignment_id"]: d["charge"] for d in everything if d["outcome"] == "assigned"}
    with server.client() as http:
        receipts = _receipts(http)
        keys = load_public_keys(http.get("/.well-known/ductor-keys").content)
    by_subject = {r["receipt"]["subject"]["id"]: r for r in receipts}
    assert len(by_subject) == len(receipts) == len(paid)
    assert {a: r["receipt"]["cost"]["micros"] for a, r in by_subject.items()} == paid
    for r in receipts:
        verify_receipt(decode_envelope(json.dumps(r["envelope"])), keys)
    print(
        f"{server.backend}: {len(decisions)} decisions, {len(returns)} returns in {routed_in:.1f}s"
    )
