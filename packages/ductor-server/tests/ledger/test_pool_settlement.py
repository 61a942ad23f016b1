"""Pool settlement through the API on both backends: the setting and its checks,
charges written with the assignment, the `funds` exclusion, concurrent decisions
that never overdraw, returns with reroute, and expired holds swept."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import pytest

from ductor_core.expressions import default_engine
from ductor_server.engine.housekeeping import Housekeeping
from ductor_server.ledger.store import LedgerTx, expire_due_holds
from ductor_server.services.ledger import EntryBody, LedgerService
from ductor_server.services.routing import ReturnBody, RouteBody, RoutingService
from ductor_settlement import (
    OverReversal,
    Posting,
    canonical_hash,
    decode_envelope,
    load_public_keys,
    parse_json,
    verify_receipt,
)
from ductor_settlement.errors import AlreadyReturned, SettlementError

from .conftest import Api

USD = 1_000_000


async def _market(
    api: Api,
    funds: dict[str, int],
    *,
    bids: dict[str, int] | None = None,
    returns: dict[str, Any] | None = None,
    pricing: str = "second",
    **setting: Any,
) -> None:
    """Buyers with wallets (floor 0) funded from cash, one auction pool "leads" settled
    with a 10 % take, and a lead kind routed there."""
    await api.open("cash", kind="asset")
    await api.open("payable:seller", floor=None)
    await api.open("revenue:platform", kind="revenue")
    bids = bids or {b: (5 + i) * USD for i, b in enumerate(funds)}
    for buyer, amount in funds.items():
        await api.ok("POST", "/v1/workers", json={"id": buyer})
        await api.open(f"wallet:{buyer}", floor=0)
        if amount:
            await api.ok(
                "POST",
                "/v1/ledger/entries",
                json={
                    "postings": [
                        {"account": "cash", "amount": amount, "currency": "USD"},
                        {"account": f"wallet:{buyer}", "amount": -amount, "currency": "USD"},
                    ]
                },
            )
    pool = {
        "id": "leads",
        "strategy": {"name": "auction", "options": {"pricing": pricing}},
        "members": [{"worker": b, "bid": bid} for b, bid in bids.items()],
    }
    await api.ok("POST", "/v1/pools", json=pool)
    await api.ok("POST", "/v1/rules", json={"kinds": {"lead": {}}, "default_pool": "leads"})
    body = {
        "currency": "USD",
        "take_rate_bps": 1000,
        "seller_account": "payable:seller",
        "platform_account": "revenue:platform",
        **setting,
    }
    if returns is not None:
        body["returns"] = returns
    await api.ok("PUT", "/v1/pools/leads/settlement", json=body)


async def _route(api: Api, lead: str, **extra: Any) -> Any:
    return await api.ok("POST", "/v1/route", json={"id": lead, "kind": "lead", **extra})


async def _available(api: Api, code: str) -> int:
    return int((await api.balance(code))["available"])


async def test_a_settled_pool_charges_the_winner_in_the_assignment_commit(api: Api) -> None:
    await _market(api, {"low": 20 * USD, "high": 20 * USD}, bids={"low": 5 * USD, "high": 7 * USD})
    decision = await _route(api, "l1")
    assert (decision["worker"], decision["charge"]) == ("high", 5 * USD + 1)
    # The buyer pays the clearing price; seller and platform split it 90 / 10.
    assert await _available(api, "wallet:high") == 15 * USD - 1
    assert (await api.balance("payable:seller"))["balance"] == 4_500_001
    assert (await api.balance("revenue:platform"))["balance"] == 500_000
    entries = await api.ok("GET", "/v1/ledger/entries", params={"account": "wallet:high"})
    # The manual clock stands still: the top-up and the charge share a time.
    (charge,) = [e for e in entries["items"] if e["reference"]["kind"] == "decision"]
    assert charge["idempotency_key"] == f"assign:{decision['assignment_id']}"
    assert charge["reference"] == {"kind": "decision", "id": decision["id"]}


CONSENT = {
    "granted": True,
    "scopes": ["phone"],
    "evidence": "https://forms.example/opt-in/77",
    "captured_at": "2029-12-31T23:00:00Z",
}


async def test_a_settled_assignment_has_a_signed_receipt(api: Api) -> None:
    await _market(api, {"low": 20 * USD, "high": 20 * USD}, bids={"low": 5 * USD, "high": 7 * USD})
    decision = await _route(api, "l1", consent=CONSENT)
    assignment = decision["assignment_id"]
    found = await api.ok("GET", "/v1/receipts", params={"subject": f"assignment:{assignment}"})
    (receipt,) = found["items"]
    body = receipt["receipt"]
    assert body["subject"] == {"kind": "assignment", "id": assignment}
    assert body["cost"] == {"micros": 5 * USD + 1, "currency": "USD"}
    entries = await api.ok("GET", "/v1/ledger/entries", params={"account": "wallet:high"})
    charge = next(e for e in entries["items"] if e["reference"]["kind"] == "decision")
    assert body["ledger_entries"] == [charge["id"]]
    assert body["consent"] == [CONSENT]
    stored = await api.ok("GET", f"/v1/decisions/{decision['id']}")
    assert body["decision"] == {
        "id": decision["id"],
        "explanation_hash": canonical_hash(stored["explanation"]),
    }
    assert body["configuration_hash"].startswith("sha256:")
    # It verifies with the published keys alone, and not once a byte is changed.
    keys = load_public_keys((await api.client.get("/.well-known/ductor-keys")).content)
    envelope = decode_envelope(json.dumps(receipt["envelope"]))
    assert verify_receipt(envelope, keys).subject.id == assignment
    payload = receipt["envelope"]["payload"]
    flipped = {**receipt["envelope"], "payload": ("B" if payload[0] != "B" else "C") + payload[1:]}
    with pytest.raises(SettlementError):
        verify_receipt(decode_envelope(json.dumps(flipped)), keys)
    # An unsettled decision gets none; another tenant sees none.
    other = await api.ok("GET", "/v1/receipts", as_b=True)
    assert other["items"] == []


async def test_an_explanation_holding_a_64_bit_integer_still_gets_its_receipt(api: Api) -> None:
    await _market(api, {"a": 20 * USD}, pricing="first")
    # The lead's 64-bit id is copied into the explanation by an enricher.
    await api.ok(
        "POST",
        "/v1/rules",
        json={
            "kinds": {"lead": {}},
            "default_pool": "leads",
            "enrichers": [{"attribute": "lead_uid", "expr": "attributes.uid"}],
        },
    )
    decision = await _route(api, "l1", attributes={"uid": 2**62 + 1})
    assert decision["outcome"] == "assigned", decision
    assert decision["explanation"]["enriched"] == {"lead_uid": 2**62 + 1}
    found = await api.ok(
        "GET", "/v1/receipts", params={"subject": f"assignment:{decision['assignment_id']}"}
    )
    (receipt,) = found["items"]
    # As any RFC 8785 library hashes the explanation it reads from the API.
    stored = await api.call("GET", f"/v1/decisions/{decision['id']}")
    explanation = parse_json(stored.content)["explanation"]
    assert receipt["receipt"]["decision"]["explanation_hash"] == canonical_hash(explanation)


async def test_an_unsettled_pool_charges_nothing(api: Api) -> None:
    await _market(api, {"a": 10 * USD}, enabled=False)
    decision = await _route(api, "l1")
    assert decision["worker"] == "a"
    assert await _available(api, "wallet:a") == 10 * USD
    page = await api.ok("GET", "/v1/ledger/entries", params={"account": "payable:seller"})
    assert page["items"] == []


async def test_a_buyer_who_cannot_pay_is_excluded_for_funds(api: Api) -> None:
    # "rich" bids less but can pay; "poor" bids more than its wallet holds.
    await _market(api, {"rich": 20 * USD, "poor": 3 * USD}, bids={"rich": 5 * USD, "poor": 9 * USD})
    decision = await _route(api, "l1")
    assert decision["worker"] == "rich"
    excluded = {e["reason"]: e["workers"] for e in decision["explanation"]["excluded"]}
    assert excluded == {"funds": ["poor"]}
    assert await _available(api, "wallet:poor") == 3 * USD
    # A buyer without a wallet cannot pay either.
    await api.ok("POST", "/v1/workers", json={"id": "nowallet"})
    pool = await api.ok("GET", "/v1/pools/leads")
    pool["members"].append({"worker": "nowallet", "bid": 10 * USD})
    await api.ok("POST", "/v1/pools", json=pool)
    decision = await _route(api, "l2")
    excluded = {e["reason"]: e["workers"] for e in decision["explanation"]["excluded"]}
    assert excluded == {"funds": ["poor", "nowallet"]}


async def test_concurrent_decisions_never_overdraw_a_wallet(api: Api) -> None:
    # One buyer that can pay for exactly three leads at the fixed price.
    await _market(api, {"only": 3 * USD}, bids={"only": 1 * USD}, source="fixed", price=USD)
    decisions = await asyncio.gather(*(_route(api, f"l{n}") for n in range(12)))
    assigned = [d for d in decisions if d["outcome"] == "assigned"]
    assert len(assigned) == 3
    for d in decisions:
        if d["outcome"] != "assigned":
            reasons = {e["reason"] for e in d["explanation"]["excluded"]}
            assert reasons == {"funds"}, d
    wallet = await api.balance("wallet:only")
    assert (wallet["balance"], wallet["available"]) == (0, 0)
    assert (await api.balance("payable:seller"))["balance"] == 2_700_000


async def test_the_setting_is_checked_with_pointers(api: Api) -> None:
    await _market(api, {"a": USD})
    bad = {
        "currency": "USD",
        "take_rate_bps": 12_000,
        "seller_account": "nope",
        "platform_account": "revenue:platform",
        "returns": {"window_seconds": 0},
    }
    body = await api.fails("PUT", "/v1/pools/leads/settlement", 422, "settlement.invalid", json=bad)
    pointers = {p["pointer"] for p in body["details"]}
    assert pointers == {"/take_rate_bps", "/seller_account", "/returns/window_seconds"}
    await api.open("eur-payable", currency="EUR")
    body = await api.fails(
        "PUT",
        "/v1/pools/leads/settlement",
        422,
        "settlement.invalid",
        json={**bad, "take_rate_bps": 0, "seller_account": "eur-payable", "returns": None},
    )
    assert [p["pointer"] for p in body["details"]] == ["/seller_account"]
    fixed = {**bad, "take_rate_bps": 0, "seller_account": "payable:seller", "returns": None}
    body = await api.fails(
        "PUT",
        "/v1/pools/leads/settlement",
        422,
        "settlement.invalid",
        json={**fixed, "source": "fixed"},
    )
    assert [p["pointer"] for p in body["details"]] == ["/price"]
    body = await api.fails(
        "PUT",
        "/v1/pools/leads/settlement",
        422,
        "settlement.invalid",
        json={
            **fixed,
            "minimum_charge": 3,
            "minimum_payout": 5,
            "returns": {"window_seconds": 60, "min_sample": 0},
        },
    )
    assert [p["pointer"] for p in body["details"]] == ["/minimum_payout", "/returns/min_sample"]
    # A bad window does not hide the policy's other problems.
    body = await api.fails(
        "PUT",
        "/v1/pools/leads/settlement",
        422,
        "settlement.invalid",
        json={
            **fixed,
            "returns": {
                "window_seconds": 0,
                "rate_window_seconds": 10**12,
                "credit_bps": 20_000,
                "max_return_rate_bps": 20_000,
                "min_sample": 0,
            },
        },
    )
    assert [p["pointer"] for p in body["details"]] == [
        "/returns/window_seconds",
        "/returns/rate_window_seconds",
        "/returns/max_return_rate_bps",
        "/returns/min_sample",
        "/returns/credit_bps",
    ]
    # A wallet prefix is part of an account code: no space or control character.
    for prefix in ("", "w" * 65, "w ", "w\x1b", "w\x7f"):
        body = await api.fails(
            "PUT",
            "/v1/pools/leads/settlement",
            422,
            "settlement.invalid",
            json={**fixed, "wallet_prefix": prefix},
        )
        assert [p["pointer"] for p in body["details"]] == ["/wallet_prefix"], prefix
    await api.fails("PUT", "/v1/pools/nope/settlement", 404, "pool.not_found", json=fixed)
    # Another tenant sees neither the pool nor its setting.
    await api.fails("GET", "/v1/pools/leads/settlement", 404, "pool.not_found", as_b=True)
    shown = await api.ok("GET", "/v1/pools/leads/settlement")
    assert shown["settlement"]["take_rate_bps"] == 1000
    # A pool deleted and made again starts unsettled.
    await api.ok("POST", "/v1/rules", json={"kinds": {"lead": {}}})
    assert (await api.call("DELETE", "/v1/pools/leads")).status_code == 204
    await api.ok("POST", "/v1/pools", json={"id": "leads", "members": [{"worker": "a"}]})
    await api.fails("GET", "/v1/pools/leads/settlement", 404, "settlement.not_found")


async def test_returns_credit_the_buyer_and_reroute_without_it(api: Api) -> None:
    policy = {"window_seconds": 3600, "allowed_reasons": ["bad_phone", "duplicate"]}
    await _market(
        api,
        {"a": 20 * USD, "b": 20 * USD, "c": 20 * USD},
        bids={"a": 5 * USD, "b": 6 * USD, "c": 7 * USD},
        returns=policy,
        pricing="first",
    )
    first = await _route(api, "l1", attributes={"zip": "94110"})
    assert first["worker"] == "c"
    asg = first["assignment_id"]
    path = f"/v1/assignments/{asg}/return"
    await api.fails("POST", path, 422, "return.reason_not_allowed", json={"reason": "changed_mind"})
    answer = await api.call("POST", path, key="r1", json={"reason": "bad_phone", "reroute": True})
    assert answer.status_code == 201, answer.text
    returned = answer.json()
    assert (returned["amount"], returned["full"]) == (7 * USD, True)
    again = returned["decision"]
    assert again["worker"] == "b"
    assert {e["reason"]: e["workers"] for e in again["explanation"]["excluded"]} == {
        "excluded": ["c"]
    }
    # c got its money back; b paid for the rerouted lead.
    assert await _available(api, "wallet:c") == 20 * USD
    assert await _available(api, "wallet:b") == 14 * USD
    credit = await api.ok("GET", f"/v1/ledger/entries/{returned['entry_id']}")
    assert credit["reverses"] == returned["reverses"]
    assert credit["reference"] == {"kind": "return", "id": returned["id"]}
    # The same key answers the same return and decision; nothing moves again.
    replay = await api.call("POST", path, key="r1", json={"reason": "bad_phone", "reroute": True})
    assert replay.status_code == 201
    assert replay.json() == returned
    assert replay.headers["Idempotency-Replayed"] == "true"
    await api.fails(
        "POST", path, 422, "idempotency.conflict", key="r1", json={"reason": "duplicate"}
    )
    assert await _available(api, "wallet:c") == 20 * USD
    refused = await api.fails(
        "POST", path, 409, "return.already_returned", json={"reason": "duplicate"}
    )
    assert refused["details"]["return"] == returned["id"]
    # The rerouted lead, returned too, goes to the last buyer left.
    second = await api.ok(
        "POST",
        f"/v1/assignments/{again['assignment_id']}/return",
        json={"reason": "duplicate", "reroute": True, "amount": USD},
    )
    assert (second["amount"], second["full"]) == (USD, False)
    assert second["decision"]["worker"] == "a"
    assert await _available(api, "wallet:b") == 15 * USD
    # Past the window: refused, nothing written.
    late = await _route(api, "l2")
    api.clock.advance(timedelta(seconds=3600))
    body = await api.fails(
        "POST",
        f"/v1/assignments/{late['assignment_id']}/return",
        422,
        "return.window_closed",
        json={"reason": "bad_phone"},
    )
    assert "closed_at" in body["details"]
    await api.fails(
        "POST",
        f"/v1/assignments/{late['assignment_id']}/return",
        404,
        "assignment.not_found",
        json={"reason": "bad_phone"},
        as_b=True,
    )


async def test_an_unsettled_assignment_is_not_returnable(api: Api) -> None:
    await _market(api, {"a": 10 * USD}, enabled=False)
    decision = await _route(api, "l1")
    await api.fails(
        "POST",
        f"/v1/assignments/{decision['assignment_id']}/return",
        422,
        "return.not_returnable",
        json={"reason": "x"},
    )


async def test_the_return_rate_threshold_refuses(api: Api) -> None:
    policy = {"window_seconds": 3600, "max_return_rate_bps": 2500, "min_sample": 4}
    await _market(api, {"a": 50 * USD}, returns=policy, pricing="first")
    decisions = [await _route(api, f"l{n}") for n in range(4)]
    first = decisions[0]["assignment_id"]
    await api.ok("POST", f"/v1/assignments/{first}/return", json={"reason": "bad"})
    body = await api.fails(
        "POST",
        f"/v1/assignments/{decisions[1]['assignment_id']}/return",
        422,
        "return.rate_exceeded",
        json={"reason": "bad"},
    )
    assert body["details"]["max_rate_bps"] == 2500


async def test_concurrent_returns_of_one_buyer_never_pass_the_return_rate(api: Api) -> None:
    policy = {"window_seconds": 3600, "max_return_rate_bps": 2500, "min_sample": 8}
    await _market(api, {"a": 50 * USD}, returns=policy, pricing="first")
    decisions = [await _route(api, f"l{n}") for n in range(8)]
    routing = RoutingService(api.store, engine=default_engine(), clock=api.clock)
    # Called straight from one loop, so on Postgres the transactions really overlap.
    results = await asyncio.gather(
        *(
            routing.return_assignment(
                "tenant-a", d["assignment_id"], ReturnBody(reason="bad"), idempotency_key=f"r{n}"
            )
            for n, d in enumerate(decisions)
        ),
        return_exceptions=True,
    )
    refused = [r for r in results if isinstance(r, BaseException)]
    assert all(isinstance(e, SettlementError) for e in refused), refused
    assert {e.code for e in refused} == {"return.rate_exceeded"}
    assert len(results) - len(refused) == 2  # 2 of 8 is the 25 % allowed
    assert await _available(api, "wallet:a") == 50 * USD - 6 * 5 * USD


async def test_an_assignment_returned_in_parts_counts_once_toward_the_rate(api: Api) -> None:
    policy = {"window_seconds": 3600, "max_return_rate_bps": 5000, "min_sample": 4}
    await _market(api, {"a": 50 * USD}, returns=policy, pricing="first")
    decisions = [await _route(api, f"l{n}") for n in range(4)]
    first, second, third = (d["assignment_id"] for d in decisions[:3])
    for _ in range(3):  # one assignment, returned in three parts
        await api.ok(
            "POST", f"/v1/assignments/{first}/return", json={"reason": "bad", "amount": USD}
        )
    # Two of four assignments returned: 50 %, the limit.
    await api.ok("POST", f"/v1/assignments/{second}/return", json={"reason": "bad"})
    body = await api.fails(
        "POST",
        f"/v1/assignments/{third}/return",
        422,
        "return.rate_exceeded",
        json={"reason": "bad"},
    )
    assert "returned 3 of 4" in body["message"]


async def test_housekeeping_marks_expired_holds(api: Api) -> None:
    await _market(api, {"a": 10 * USD})
    hold = {
        "debit_account": "wallet:a",
        "credit_account": "payable:seller",
        "amount": USD,
        "currency": "USD",
        "timeout_seconds": 60,
    }
    first = await api.ok("POST", "/v1/holds", json=hold)
    await api.ok("POST", "/v1/holds", json={**hold, "timeout_seconds": 3600})
    sql = "SELECT COUNT(*) FROM ledger_holds WHERE status = %s"
    api.clock.advance(timedelta(seconds=61))
    keeper = Housekeeping(api.store, clock=api.clock, batch=1)
    keeper.add_sweep("holds", expire_due_holds)
    done = await keeper.sweep()
    assert done["holds"] == 1
    assert await api.count(sql, "expired") == 1
    assert await api.count(sql, "pending") == 1
    async with api.store.transaction() as tx:
        row = await tx.session.fetch_one("SELECT id FROM ledger_holds WHERE status = 'expired'", ())
    assert row is not None
    assert row[0] == first["id"]
    assert (await keeper.sweep())["holds"] == 0


async def test_concurrent_returns_of_one_assignment_credit_it_once(api: Api) -> None:
    await _market(api, {"a": 20 * USD}, returns={"window_seconds": 60}, pricing="first")
    decision = await _route(api, "l1")
    # Called straight from one loop, so on Postgres the transactions really overlap.
    routing = RoutingService(api.store, engine=default_engine(), clock=api.clock)
    results = await asyncio.gather(
        *(
            routing.return_assignment(
                "tenant-a",
                decision["assignment_id"],
                ReturnBody(reason="bad"),
                idempotency_key=f"r{n}",
            )
            for n in range(6)
        ),
        return_exceptions=True,
    )
    done = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, BaseException)]
    assert len(done) == 1, results
    assert all(isinstance(e, AlreadyReturned) for e in refused), refused
    assert await _available(api, "wallet:a") == 20 * USD
    assert (await api.balance("payable:seller"))["balance"] == 0


async def test_concurrent_route_calls_lose_the_race_for_funds_and_route_again(api: Api) -> None:
    # Two buyers; "small" can pay for two leads at its bid, "big" for all of them.
    await _market(
        api,
        {"small": 2 * USD, "big": 100 * USD},
        bids={"small": USD, "big": USD // 2},
        pricing="first",
    )
    # Called straight from one loop, so on Postgres the transactions really overlap:
    # every snapshot sees "small" funded, and the commits after its second find it empty.
    routing = RoutingService(api.store, engine=default_engine(), clock=api.clock)
    answers = await asyncio.gather(
        *(routing.route("tenant-a", RouteBody(id=f"l{n}", kind="lead")) for n in range(12))
    )
    winners = [a.value.worker for a in answers]
    assert winners.count("small") == 2
    assert winners.count("big") == 10
    wallet = await api.balance("wallet:small")
    assert (wallet["balance"], wallet["available"]) == (0, 0)
    assert await _available(api, "wallet:big") == 95 * USD
    # The lost races were routed again on fresh state, where "small" is out of funds.
    late = [a.value for a in answers if a.value.worker == "big"]
    assert any(
        e.reason == "funds" and e.workers == ("small",)
        for d in late
        for e in d.explanation.excluded
    )
    assert routing.conflicts > 0


async def test_hold_mode_reserves_at_assignment_and_charges_on_completion(api: Api) -> None:
    await _market(
        api,
        {"a": 10 * USD},
        bids={"a": 4 * USD},
        pricing="first",
        mode="hold",
        hold_seconds=600,
        returns={"window_seconds": 3600},
    )
    first, second, third = [await _route(api, f"l{n}", consent=CONSENT) for n in range(3)]
    wallet = await api.balance("wallet:a")
    # Two leads reserved 8 USD; the third could not be covered by what is left.
    assert (wallet["balance"], wallet["pending"], wallet["available"]) == (
        10 * USD,
        8 * USD,
        2 * USD,
    )
    assert third["outcome"] == "unassigned"
    assert third["explanation"]["excluded"] == [{"reason": "funds", "detail": "", "workers": ["a"]}]
    # Not charged yet: nothing to return.
    path = f"/v1/assignments/{first['assignment_id']}/return"
    await api.fails("POST", path, 422, "return.not_returnable", json={"reason": "bad"})
    # No receipt until the charge is posted.
    receipts = await api.ok("GET", "/v1/receipts", params={"kind": "assignment"})
    assert receipts["items"] == []
    # Completing releases the hold and posts the charge; rejecting voids it.
    await api.ok("POST", f"/v1/assignments/{first['assignment_id']}/complete", json={})
    await api.ok("POST", f"/v1/assignments/{second['assignment_id']}/reject", json={})
    receipts = await api.ok("GET", "/v1/receipts", params={"kind": "assignment"})
    (receipt,) = receipts["items"]
    assert receipt["receipt"]["subject"]["id"] == first["assignment_id"]
    assert receipt["receipt"]["cost"] == {"micros": 4 * USD, "currency": "USD"}
    assert receipt["receipt"]["configuration_hash"].startswith("sha256:")
    assert receipt["receipt"]["consent"] == [CONSENT]
    wallet = await api.balance("wallet:a")
    assert (wallet["balance"], wallet["pending"], wallet["available"]) == (6 * USD, 0, 6 * USD)
    assert (await api.balance("payable:seller"))["balance"] == 3_600_000
    assert (await api.balance("revenue:platform"))["balance"] == 400_000
    holds = {h["id"]: h for h in await api.ok("GET", "/v1/holds")}
    assert holds[f"hold_{first['assignment_id']}"]["status"] == "voided"
    assert holds[f"hold_{second['assignment_id']}"]["status"] == "voided"
    # The posted charge is returned like any other.
    returned = await api.ok("POST", path, json={"reason": "bad"})
    assert returned["amount"] == 4 * USD
    assert await _available(api, "wallet:a") == 10 * USD
    # A hold that expires before completion stops reserving; completing later still
    # charges, from what the wallet has then.
    late = await _route(api, "l9")
    api.clock.advance(timedelta(seconds=601))
    assert await _available(api, "wallet:a") == 10 * USD
    await api.ok("POST", f"/v1/assignments/{late['assignment_id']}/complete", json={})
    assert await _available(api, "wallet:a") == 6 * USD


async def test_an_assignments_hold_is_ended_by_the_assignment_only(api: Api) -> None:
    await _market(api, {"a": 10 * USD}, bids={"a": 4 * USD}, pricing="first", mode="hold")
    assignment = (await _route(api, "l1"))["assignment_id"]
    hold = f"hold_{assignment}"
    # Posting or voiding the hold by hand would leave the assignment to charge again
    # (or from an unreserved wallet) when it completes: refused, nothing moves.
    for action in ("post", "void"):
        body = await api.fails("POST", f"/v1/holds/{hold}/{action}", 409, "hold.conflict")
        assert body["details"] == {"hold": hold, "assignment": assignment}
    assert (await api.ok("GET", f"/v1/holds/{hold}"))["status"] == "pending"
    # Another tenant does not learn the hold exists.
    await api.fails("POST", f"/v1/holds/{hold}/post", 404, "hold.not_found", as_b=True)
    # Nor can a hold be placed under an assignment's hold id.
    body = {
        "debit_account": "wallet:a",
        "credit_account": "payable:seller",
        "amount": USD,
        "currency": "USD",
        "timeout_seconds": 60,
    }
    for taken in (hold, "hold_asg_0123"):
        await api.fails("POST", "/v1/holds", 422, "hold.invalid", json={**body, "id": taken})
    # Completing charges the buyer once.
    await api.ok("POST", f"/v1/assignments/{assignment}/complete", json={})
    wallet = await api.balance("wallet:a")
    assert (wallet["balance"], wallet["pending"]) == (6 * USD, 0)
    assert (await api.ok("GET", f"/v1/holds/{hold}"))["status"] == "voided"


async def test_a_wallet_in_another_currency_or_debit_normal_cannot_pay(api: Api) -> None:
    # A charge debits the wallet: it lowers a credit-normal wallet (what the platform
    # owes the buyer) but would raise a debit-normal one however often it is charged.
    await api.ok("POST", "/v1/workers", json={"id": "eur"})
    await api.ok("POST", "/v1/workers", json={"id": "asset"})
    await api.open("wallet:eur", currency="EUR", floor=0)
    await api.open("wallet:asset", kind="asset", floor=0)
    await api.open("funding", kind="liability")
    await api.ok(
        "POST",
        "/v1/ledger/entries",
        json={
            "postings": [
                {"account": "wallet:asset", "amount": 50 * USD, "currency": "USD"},
                {"account": "funding", "amount": -50 * USD, "currency": "USD"},
            ]
        },
    )
    await _market(api, {"usd": 20 * USD}, bids={"usd": 5 * USD, "eur": 9 * USD, "asset": 8 * USD})
    decision = await _route(api, "l1")
    assert decision["worker"] == "usd"
    assert decision["explanation"]["excluded"] == [
        {"reason": "funds", "detail": "", "workers": ["eur", "asset"]}
    ]
    assert (await api.balance("wallet:asset"))["balance"] == 50 * USD


async def test_an_assignment_charged_nothing_has_no_entry_receipt_or_return(api: Api) -> None:
    await _market(api, {"a": 10 * USD}, bids={"a": 0}, returns={"window_seconds": 60})
    decision = await _route(api, "l1")
    assert (decision["worker"], decision["charge"]) == ("a", 0)
    assignment = decision["assignment_id"]
    found = await api.ok("GET", "/v1/receipts", params={"subject": f"assignment:{assignment}"})
    assert found["items"] == []
    assert await api.count("SELECT COUNT(*) FROM ledger_entries") == 1  # the top-up
    path = f"/v1/assignments/{assignment}/return"
    await api.fails("POST", path, 422, "return.not_returnable", json={"reason": "bad"})


async def test_a_return_racing_reversals_of_its_charge_never_credits_more_than_it(
    api: Api,
) -> None:
    await _market(api, {"a": 20 * USD}, returns={"window_seconds": 60}, pricing="first")
    routing = RoutingService(api.store, engine=default_engine(), clock=api.clock)
    ledger = LedgerService(api.store, clock=api.clock)
    for lead in range(4):
        assignment = (await _route(api, f"l{lead}"))["assignment_id"]
        async with api.store.transaction() as tx:
            charge = await LedgerTx(tx).entry_by_key("tenant-a", f"assign:{assignment}")
        assert charge is not None
        back = EntryBody(
            postings=(
                Posting(account="payable:seller", amount=USD, currency="USD"),
                Posting(account="wallet:a", amount=-USD, currency="USD"),
            ),
            reverses=charge.id,
        )
        # Called straight from one loop, so on Postgres the transactions really overlap.
        results = await asyncio.gather(
            routing.return_assignment(
                "tenant-a", assignment, ReturnBody(reason="bad"), idempotency_key=f"r{lead}"
            ),
            *(
                ledger.post_entry("tenant-a", back, idempotency_key=f"m{lead}-{n}")
                for n in range(4)
            ),
            return_exceptions=True,
        )
        refused = [r for r in results if isinstance(r, BaseException)]
        assert all(isinstance(r, OverReversal) for r in refused), refused
        # However the race went, the wallet got back at most the 5 USD the lead cost.
        async with api.store.transaction() as tx:
            reversals = await LedgerTx(tx).reversals_of("tenant-a", charge.id)
        given_back = sum(p.amount for e in reversals for p in e.postings if p.account == "wallet:a")
        assert -5 * USD <= given_back < 0, (lead, given_back, results)
