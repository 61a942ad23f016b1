"""The ledger against a hostile tenant, on both backends: another tenant's account,
entry, hold, assignment and receipt ids are 404 and move nothing; huge and
malformed entries, holds and accounts are a 4xx that says what is wrong and where,
and write nothing; twenty concurrent duplicates under one Idempotency-Key make one
entry and one hold."""

from __future__ import annotations

import asyncio
from typing import Any

from .conftest import Api
from .test_pool_settlement import _market

USD = 1_000_000


def _legs(*pairs: tuple[str, int]) -> list[dict[str, Any]]:
    return [{"account": a, "amount": n, "currency": "USD"} for a, n in pairs]


async def _counts(api: Api) -> tuple[int, int, int]:
    return (
        await api.count("SELECT COUNT(*) FROM ledger_entries"),
        await api.count("SELECT COUNT(*) FROM ledger_holds"),
        await api.count("SELECT COUNT(*) FROM ledger_accounts"),
    )


async def test_another_tenants_ids_are_not_found_and_move_nothing(api: Api) -> None:
    await _market(api, {"b0": 20 * USD, "b1": 20 * USD}, returns={"window_seconds": 3600})
    decision = await api.ok("POST", "/v1/route", json={"id": "l1", "kind": "lead"})
    assert (decision["worker"], decision["charge"]) == ("b1", 5 * USD + 1)
    assignment = decision["assignment_id"]
    (receipt,) = (
        await api.ok("GET", "/v1/receipts", params={"subject": f"assignment:{assignment}"})
    )["items"]
    hold = await api.ok(
        "POST",
        "/v1/holds",
        json={
            "debit_account": "wallet:b1",
            "credit_account": "payable:seller",
            "amount": USD,
            "currency": "USD",
            "timeout_seconds": 600,
        },
    )
    top_up = await api.ok(
        "POST",
        "/v1/ledger/entries",
        json={"postings": _legs(("cash", USD), ("wallet:b1", -USD))},
        key="shared-key",
    )
    before = await api.ok("GET", "/v1/accounts")

    # Tenant B opens accounts under the same codes: codes are per tenant.
    await api.ok(
        "POST",
        "/v1/accounts",
        json={"code": "wallet:b1", "currency": "USD", "kind": "liability", "floor": 0},
        as_b=True,
    )
    await api.ok(
        "POST", "/v1/accounts", json={"code": "cash", "currency": "USD", "kind": "asset"}, as_b=True
    )
    for method, path, code in (
        ("GET", f"/v1/ledger/entries/{top_up['id']}", "entry.not_found"),
        ("GET", f"/v1/holds/{hold['id']}", "hold.not_found"),
        ("POST", f"/v1/holds/{hold['id']}/post", "hold.not_found"),
        ("POST", f"/v1/holds/{hold['id']}/void", "hold.not_found"),
        ("GET", f"/v1/receipts/{receipt['id']}", "receipt.not_found"),
        ("GET", "/v1/accounts/payable:seller", "account.not_found"),
        ("GET", "/v1/pools/leads/settlement", "pool.not_found"),
    ):
        await api.fails(method, path, 404, code, as_b=True)
    await api.fails(
        "POST",
        f"/v1/assignments/{assignment}/return",
        404,
        "assignment.not_found",
        json={"reason": "bad_phone"},
        as_b=True,
    )
    # B's view of its own wallet shows nothing of A's; A's entries are not listed.
    assert (await api.ok("GET", "/v1/accounts/wallet:b1", as_b=True))["balance"] == 0
    listed = await api.ok("GET", "/v1/ledger/entries", params={"account": "wallet:b1"}, as_b=True)
    assert listed["items"] == []
    assert (await api.ok("GET", "/v1/receipts", as_b=True))["items"] == []
    # B cannot reverse A's entry, nor take A's entry by reusing its key.
    reversal = {"reverses": top_up["id"], "postings": _legs(("wallet:b1", 1), ("cash", -1))}
    await api.fails(
        "POST", "/v1/ledger/entries", 422, "ledger.unknown_entry", json=reversal, as_b=True
    )
    own = await api.ok(
        "POST",
        "/v1/ledger/entries",
        json={"postings": _legs(("cash", 5), ("wallet:b1", -5))},
        key="shared-key",
        as_b=True,
    )
    assert own["id"] != top_up["id"]

    # A's books are as they were, its hold still pending, its assignment returnable.
    assert await api.ok("GET", "/v1/accounts") == before
    assert (await api.ok("GET", f"/v1/holds/{hold['id']}"))["status"] == "pending"
    returned = await api.ok(
        "POST", f"/v1/assignments/{assignment}/return", json={"reason": "bad_phone"}
    )
    assert returned["amount"] == decision["charge"]


async def test_huge_and_malformed_input_is_a_4xx_that_says_where_and_writes_nothing(
    api: Api,
) -> None:
    for code, kind, floor in (("cash", "asset", None), ("wallet", "liability", 0)):
        body = {"code": code, "currency": "USD", "kind": kind, "floor": floor}
        await api.ok("POST", "/v1/accounts", json=body)
    await api.ok(
        "POST", "/v1/ledger/entries", json={"postings": _legs(("cash", 9), ("wallet", -9))}
    )
    before = await _counts(api)

    huge = {"postings": _legs(*[("cash", 1)] * 100, ("wallet", -100))}
    refused = await api.fails("POST", "/v1/ledger/entries", 422, "ledger.invalid_entry", json=huge)
    (problem,) = refused["details"]["problems"]
    assert "at most 100 postings, this one has 101" in problem["message"]
    long_text = {
        "description": "d" * 1001,
        "reference": {"kind": "run", "id": "r" * 257},
        "postings": _legs(("cash", 1), ("wallet", -1)),
    }
    refused = await api.fails(
        "POST", "/v1/ledger/entries", 422, "ledger.invalid_entry", json=long_text
    )
    assert len(refused["details"]["problems"]) == 2
    # In a batch, the problem points at its entry, and no entry of the batch is written.
    batch = {"entries": [{"postings": _legs(("cash", 1), ("wallet", -1))}, huge]}
    refused = await api.fails(
        "POST", "/v1/ledger/entries/batch", 422, "ledger.invalid_entry", json=batch
    )
    assert [p["pointer"] for p in refused["details"]["problems"]] == ["/entries/1"]
    for body, path in (
        (
            {"postings": [{"account": "cash", "amount": "1", "currency": "USD"}]},
            "$.postings[0].amount",
        ),
        ({"postings": _legs(("cash", 10**30), ("wallet", -(10**30)))}, "$.postings[1].amount"),
        ({"postings": _legs(("cash", 1), ("wallet", -1)), "extra": 1}, "$.extra"),
        (
            {"postings": _legs(("cash", 1), ("wallet", -1)), "reference": {"kind": "x"}},
            "$.reference.kind",
        ),
        ([1, 2], "$"),
    ):
        refused = await api.fails("POST", "/v1/ledger/entries", 422, "request.invalid", json=body)
        assert refused["details"]["path"] == path, refused
    malformed = await api.client.post(
        "/v1/ledger/entries",
        content=b'{"postings": [',
        headers={**api.a, "Content-Type": "application/json"},
    )
    assert malformed.status_code == 400, malformed.text
    assert malformed.json()["code"] == "request.malformed_json"
    assert malformed.json()["details"]["byte"] > 0
    flood = b'{"postings": [' + b'{"account": "cash", "amount": 1, "currency": "USD"},' * 30_000
    too_large = await api.client.post(
        "/v1/ledger/entries",
        content=flood + b'{"account": "wallet", "amount": -30000, "currency": "USD"}]}',
        headers={**api.a, "Content-Type": "application/json"},
    )
    assert too_large.status_code == 413, too_large.text
    assert too_large.json()["code"] == "request.too_large"
    too_long_key = await api.call(
        "POST",
        "/v1/ledger/entries",
        json={"postings": _legs(("cash", 1), ("wallet", -1))},
        key="k" * 256,
    )
    assert too_long_key.status_code == 422
    assert too_long_key.json()["details"] == {"header": "Idempotency-Key"}

    hold = {
        "debit_account": "wallet",
        "credit_account": "cash",
        "amount": 1,
        "currency": "USD",
        "timeout_seconds": 60,
    }
    for extra, fragment in (
        ({"id": "h" * 257}, "id must be 1 to 256 characters"),
        ({"description": "d" * 1001}, "description must be at most 1000 characters"),
        ({"amount": -1}, "negative"),
    ):
        refused = await api.fails("POST", "/v1/holds", 422, "hold.invalid", json={**hold, **extra})
        assert any(fragment in reason for reason in refused["details"]["reasons"]), refused
        assert len(refused["message"]) < 600
    refused = await api.fails(
        "POST", "/v1/holds", 422, "hold.invalid", json={**hold, "timeout_seconds": 10**12}
    )
    assert refused["details"]["fields"] == ["timeout_seconds"]
    assert str(10**12) in refused["details"]["reasons"][0]
    # An expiry at the edge of what a time can hold, whose UTC form is not a datetime.
    timed = {k: v for k, v in hold.items() if k != "timeout_seconds"}
    for at in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"):
        refused = await api.fails(
            "POST", "/v1/holds", 422, "hold.invalid", json={**timed, "expires_at": at}
        )
        assert refused["details"]["fields"] == ["expires_at"], refused
    refused = await api.fails(
        "POST",
        "/v1/accounts",
        422,
        "ledger.invalid_account",
        json={"code": "a" * 257, "currency": "USD", "kind": "asset", "name": "n" * 257},
    )
    assert len(refused["details"]["problems"]) == 2
    assert await _counts(api) == before


async def test_twenty_concurrent_duplicates_under_one_key_make_one_entry_and_one_hold(
    api: Api,
) -> None:
    for code, kind, floor in (("cash", "asset", None), ("wallet", "liability", 0)):
        body = {"code": code, "currency": "USD", "kind": kind, "floor": floor}
        await api.ok("POST", "/v1/accounts", json=body)
    top_up = {"postings": _legs(("cash", 10 * USD), ("wallet", -10 * USD))}
    answers = await asyncio.gather(
        *(api.call("POST", "/v1/ledger/entries", json=top_up, key="top-up-1") for _ in range(20))
    )
    assert {a.status_code for a in answers} == {201}, [a.text for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    assert sum(a.headers.get("Idempotency-Replayed") == "true" for a in answers) == 19
    assert await api.count("SELECT COUNT(*) FROM ledger_entries") == 1
    assert (await api.balance("wallet"))["balance"] == 10 * USD

    hold = {
        "debit_account": "wallet",
        "credit_account": "cash",
        "amount": 6 * USD,
        "currency": "USD",
        "timeout_seconds": 60,
    }
    answers = await asyncio.gather(
        *(api.call("POST", "/v1/holds", json=hold, key="reserve-1") for _ in range(20))
    )
    assert {a.status_code for a in answers} == {201}, [a.text for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    assert await api.count("SELECT COUNT(*) FROM ledger_holds") == 1
    assert (await api.balance("wallet"))["available"] == 4 * USD
