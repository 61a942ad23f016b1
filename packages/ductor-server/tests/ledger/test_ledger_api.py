"""The ledger through the REST API on both backends: balanced entries accepted,
refusals with every problem and nothing written, floors, idempotent replays,
two-phase holds, tenancy, and concurrent debits that never overdraw."""

from __future__ import annotations

import asyncio
from typing import Any

from ductor_server.transports.rest.errors import STATUS_BY_CODE
from ductor_settlement import ERRORS

from .conftest import Api

USD = 1_000_000


async def _wallet(api: Api, funds: int = 10 * USD) -> None:
    """cash (asset), wallet (liability, floor 0) funded with `funds`, revenue."""
    await api.open("cash", kind="asset")
    await api.open("wallet", floor=0, name="buyer wallet")
    await api.open("revenue", kind="revenue")
    if funds:
        await _post(api, ("cash", funds), ("wallet", -funds), key="top-up")


async def _post(api: Api, *legs: tuple[str, int], key: str | None = None, **extra: Any) -> Any:
    body = {"postings": [_leg(a, n) for a, n in legs], "description": "test", **extra}
    return await api.ok("POST", "/v1/ledger/entries", json=body, key=key)


def _leg(account: str, amount: int, currency: str = "USD") -> dict[str, Any]:
    return {"account": account, "amount": amount, "currency": currency}


async def _rows(api: Api) -> tuple[int, int]:
    entries = await api.count("SELECT COUNT(*) FROM ledger_entries")
    postings = await api.count("SELECT COUNT(*) FROM ledger_postings")
    return entries, postings


async def _assert_balances_are_posting_sums(api: Api) -> None:
    async with api.store.transaction() as tx:
        kept = await tx.session.fetch_all(
            "SELECT tenant_id, code, balance FROM ledger_accounts ORDER BY tenant_id, code"
        )
        summed = await tx.session.fetch_all(
            "SELECT tenant_id, account, SUM(amount) FROM ledger_postings"
            " GROUP BY tenant_id, account"
        )
        totals = await tx.session.fetch_all(
            "SELECT tenant_id, currency, SUM(amount) FROM ledger_postings"
            " GROUP BY tenant_id, currency"
        )
    sums = {(t, a): int(s) for t, a, s in summed}
    assert {(t, c): int(b) for t, c, b in kept} == {(t, c): sums.get((t, c), 0) for t, c, _ in kept}
    assert all(int(total) == 0 for _, _, total in totals)


async def test_a_balanced_entry_is_recorded_and_moves_balances(api: Api) -> None:
    await _wallet(api, funds=0)
    entry = await _post(
        api, ("cash", 10 * USD), ("wallet", -10 * USD), reference={"kind": "top_up", "id": "tx-1"}
    )
    assert entry["id"].startswith("ent_")
    assert entry["reference"] == {"kind": "top_up", "id": "tx-1"}
    assert [p["amount"] for p in entry["postings"]] == [10 * USD, -10 * USD]
    wallet = await api.balance("wallet")
    assert (wallet["balance"], wallet["pending"], wallet["available"]) == (10 * USD, 0, 10 * USD)
    assert wallet["normal_balance"] == "credit"
    cash = await api.balance("cash")
    assert cash["balance"] == 10 * USD  # an asset grows with debits
    charge = await _post(api, ("wallet", 3 * USD), ("revenue", -3 * USD))
    assert (await api.balance("wallet"))["balance"] == 7 * USD
    assert (await api.balance("revenue"))["balance"] == 3 * USD

    page = await api.ok("GET", "/v1/ledger/entries", params={"account": "revenue"})
    assert [e["id"] for e in page["items"]] == [charge["id"]]
    listed = await api.ok("GET", "/v1/accounts")
    assert [a["code"] for a in listed] == ["cash", "revenue", "wallet"]
    assert (await api.ok("GET", f"/v1/ledger/entries/{entry['id']}")) == entry
    await _assert_balances_are_posting_sums(api)


async def test_entries_page_newest_first(api: Api) -> None:
    await _wallet(api)
    ids = []
    for n in range(5):
        api.clock.advance(1)
        ids.append((await _post(api, ("wallet", USD), ("revenue", -USD), key=f"c{n}"))["id"])
    first = await api.ok("GET", "/v1/ledger/entries", params={"account": "wallet", "limit": 3})
    assert [e["id"] for e in first["items"]] == ids[::-1][:3]
    rest = await api.ok(
        "GET",
        "/v1/ledger/entries",
        params={"account": "wallet", "limit": 3, "cursor": first["next_cursor"]},
    )
    assert [e["id"] for e in rest["items"]] == [*ids[::-1][3:], (await _top_up_id(api))]
    assert rest["next_cursor"] is None
    await api.fails(
        "GET", "/v1/ledger/entries", 422, "request.invalid", params={"cursor": "nonsense"}
    )


async def _top_up_id(api: Api) -> str:
    page = await api.ok("GET", "/v1/ledger/entries", params={"account": "cash"})
    return str(page["items"][0]["id"])


async def test_an_unbalanced_entry_is_refused_with_every_problem_and_nothing_written(
    api: Api,
) -> None:
    await _wallet(api)
    before = await _rows(api)
    refused = await api.fails(
        "POST",
        "/v1/ledger/entries",
        422,
        "ledger.unbalanced",
        json={"postings": [_leg("wallet", 5 * USD), _leg("revenue", -4 * USD)]},
    )
    [problem] = refused["details"]["problems"]
    assert (problem["code"], problem["currency"], problem["amount"]) == (
        "ledger.unbalanced",
        "USD",
        USD,
    )

    many = await api.fails(
        "POST",
        "/v1/ledger/entries",
        422,
        "ledger.unknown_account",
        json={
            "postings": [
                _leg("nowhere", 5 * USD),
                _leg("revenue", -5 * USD, "EUR"),
                _leg("wallet", -1),
            ]
        },
    )
    codes = sorted(p["code"] for p in many["details"]["problems"])
    assert codes == [
        "ledger.currency_mismatch",
        "ledger.unbalanced",
        "ledger.unbalanced",
        "ledger.unknown_account",
    ]
    await api.fails(
        "POST",
        "/v1/ledger/entries",
        422,
        "ledger.invalid_entry",
        json={"postings": [_leg("wallet", 0)]},
    )
    await api.fails(
        "POST",
        "/v1/ledger/entries",
        422,
        "request.invalid",
        json={"postings": [{"account": "wallet", "amount": 1.5, "currency": "USD"}]},
    )
    assert await _rows(api) == before
    assert (await api.balance("wallet"))["balance"] == 10 * USD


async def test_a_floor_is_never_crossed(api: Api) -> None:
    await _wallet(api)
    refused = await api.fails(
        "POST",
        "/v1/ledger/entries",
        422,
        "ledger.floor_crossed",
        json={"postings": [_leg("wallet", 11 * USD), _leg("revenue", -11 * USD)]},
    )
    [problem] = refused["details"]["problems"]
    assert (problem["account"], problem["amount"]) == ("wallet", USD)
    await _post(api, ("wallet", 10 * USD), ("revenue", -10 * USD))
    assert (await api.balance("wallet"))["available"] == 0
    # A credit line: floor -5 lets the account go 5 below zero, not 6.
    await api.open("agent", floor=-5 * USD)
    await _post(api, ("agent", 5 * USD), ("revenue", -5 * USD))
    await api.fails(
        "POST",
        "/v1/ledger/entries",
        422,
        "ledger.floor_crossed",
        json={"postings": [_leg("agent", 1), _leg("revenue", -1)]},
    )
    await _assert_balances_are_posting_sums(api)


async def test_an_entry_replays_under_its_key_and_conflicts_with_another_body(api: Api) -> None:
    await _wallet(api)
    body = {"postings": [_leg("wallet", USD), _leg("revenue", -USD)], "description": "lead 7"}
    first = await api.call("POST", "/v1/ledger/entries", json=body, key="charge-7")
    assert first.status_code == 201, first.text
    again = await api.call("POST", "/v1/ledger/entries", json=body, key="charge-7")
    assert again.status_code == 201
    assert again.headers.get("Idempotency-Replayed") == "true"
    assert again.json() == first.json()
    assert first.json()["idempotency_key"] == "charge-7"
    other = {**body, "description": "lead 8"}
    await api.fails(
        "POST", "/v1/ledger/entries", 422, "idempotency.conflict", json=other, key="charge-7"
    )
    await api.fails(
        "POST", "/v1/ledger/entries", 422, "request.invalid", json=body, key="hold:x:post"
    )
    assert (await api.balance("wallet"))["balance"] == 9 * USD
    assert (
        await api.count(
            "SELECT COUNT(*) FROM ledger_entries WHERE idempotency_key = %s", "charge-7"
        )
        == 1
    )


async def test_the_keys_of_routing_charges_and_returns_are_the_ledgers_own(api: Api) -> None:
    # The server posts an assignment's charge under `assign:<id>` and a return's
    # credit under `return:<id>`; a caller's entry under such a key would stand in for them.
    await _wallet(api)
    before = (*await _rows(api), await api.count("SELECT COUNT(*) FROM idempotency_keys"))
    body = {"postings": [_leg("wallet", USD), _leg("revenue", -USD)], "description": "lead 7"}
    for reserved in ("assign:x", "return:x"):
        refused = await api.fails(
            "POST", "/v1/ledger/entries", 422, "request.invalid", json=body, key=reserved
        )
        assert refused["details"] == {"key": reserved}
    after = (*await _rows(api), await api.count("SELECT COUNT(*) FROM idempotency_keys"))
    assert after == before
    assert (await api.balance("wallet"))["balance"] == 10 * USD


async def test_accounts_open_once_and_refuse_other_attributes(api: Api) -> None:
    created = await api.call(
        "POST", "/v1/accounts", json={"code": "w", "currency": "USD", "kind": "liability"}
    )
    assert created.status_code == 201
    same = await api.call(
        "POST",
        "/v1/accounts",
        json={"code": "w", "currency": "USD", "kind": "liability", "normal": "credit"},
    )
    assert same.status_code == 200
    await api.fails(
        "POST",
        "/v1/accounts",
        409,
        "ledger.account_conflict",
        json={"code": "w", "currency": "EUR", "kind": "liability"},
    )
    bad = await api.fails(
        "POST",
        "/v1/accounts",
        422,
        "ledger.invalid_account",
        json={"code": "", "currency": "usd", "kind": "asset"},
    )
    assert len(bad["details"]["problems"]) == 2
    await api.fails("GET", "/v1/accounts/nope", 404, "account.not_found")


async def test_a_tenant_sees_and_posts_only_its_own_accounts(api: Api) -> None:
    await _wallet(api)
    await api.fails("GET", "/v1/accounts/wallet", 404, "account.not_found", as_b=True)
    assert await api.ok("GET", "/v1/accounts", as_b=True) == []
    await api.fails(
        "POST",
        "/v1/ledger/entries",
        422,
        "ledger.unknown_account",
        json={"postings": [_leg("wallet", USD), _leg("revenue", -USD)]},
        as_b=True,
    )
    assert (await api.ok("GET", "/v1/ledger/entries", as_b=True))["items"] == []


async def test_a_reversal_takes_back_at_most_what_an_entry_moved(api: Api) -> None:
    await _wallet(api)
    charge = await _post(api, ("wallet", 4 * USD), ("revenue", -4 * USD))
    back = await _post(
        api,
        ("wallet", -3 * USD),
        ("revenue", 3 * USD),
        reverses=charge["id"],
        reference={"kind": "return", "id": "lead-1"},
    )
    assert back["reverses"] == charge["id"]
    refused = await api.fails(
        "POST",
        "/v1/ledger/entries",
        422,
        "ledger.over_reversal",
        json={
            "postings": [_leg("wallet", -2 * USD), _leg("revenue", 2 * USD)],
            "reverses": charge["id"],
        },
    )
    assert {p["amount"] for p in refused["details"]["problems"]} == {USD}
    await api.fails(
        "POST",
        "/v1/ledger/entries",
        422,
        "ledger.unknown_entry",
        json={"postings": [_leg("wallet", -1), _leg("revenue", 1)], "reverses": "ent_nope"},
    )
    assert (await api.balance("wallet"))["balance"] == 9 * USD


async def test_a_hold_reserves_then_posts_in_part_and_releases_the_rest(api: Api) -> None:
    await _wallet(api)
    hold = await api.ok(
        "POST",
        "/v1/holds",
        json={
            "debit_account": "wallet",
            "credit_account": "revenue",
            "amount": 6 * USD,
            "currency": "USD",
            "timeout_seconds": 600,
        },
        key="reserve-1",
    )
    assert hold["status"] == "pending"
    wallet = await api.balance("wallet")
    assert (wallet["balance"], wallet["pending"], wallet["available"]) == (
        10 * USD,
        6 * USD,
        4 * USD,
    )
    # Reserved funds cannot be spent twice: not by an entry, not by another hold.
    await api.fails(
        "POST",
        "/v1/ledger/entries",
        422,
        "ledger.floor_crossed",
        json={"postings": [_leg("wallet", 5 * USD), _leg("revenue", -5 * USD)]},
    )
    await api.fails(
        "POST",
        "/v1/holds",
        422,
        "ledger.floor_crossed",
        json={
            "debit_account": "wallet",
            "credit_account": "revenue",
            "amount": 5 * USD,
            "currency": "USD",
            "timeout_seconds": 60,
        },
    )
    posted = await api.ok("POST", f"/v1/holds/{hold['id']}/post", json={"amount": 4 * USD})
    assert posted["hold"]["status"] == "posted"
    assert posted["hold"]["posted_amount"] == 4 * USD
    assert posted["hold"]["entry_id"] == posted["entry"]["id"]
    assert posted["entry"]["reference"] == {"kind": "hold", "id": hold["id"]}
    wallet = await api.balance("wallet")
    assert (wallet["balance"], wallet["pending"], wallet["available"]) == (6 * USD, 0, 6 * USD)
    assert (await api.balance("revenue"))["balance"] == 4 * USD
    await api.fails("POST", f"/v1/holds/{hold['id']}/post", 409, "hold.already_final")
    await api.fails("POST", f"/v1/holds/{hold['id']}/void", 409, "hold.already_final")
    assert (await api.ok("GET", f"/v1/holds/{hold['id']}"))["status"] == "posted"
    await _assert_balances_are_posting_sums(api)


async def test_a_hold_posts_at_most_what_it_reserved_and_replays(api: Api) -> None:
    await _wallet(api)
    body = {
        "debit_account": "wallet",
        "credit_account": "revenue",
        "amount": 2 * USD,
        "currency": "USD",
        "timeout_seconds": 60,
        "id": "h-1",
    }
    first = await api.call("POST", "/v1/holds", json=body)
    assert first.status_code == 201
    again = await api.call("POST", "/v1/holds", json=body)
    assert again.status_code == 200  # the same hold: nothing reserved twice
    assert (await api.balance("wallet"))["pending"] == 2 * USD
    await api.fails(
        "POST", "/v1/holds/h-1/post", 422, "hold.amount_exceeded", json={"amount": 3 * USD}
    )
    posted = await api.call("POST", "/v1/holds/h-1/post", key="p1")
    assert posted.status_code == 200, posted.text
    replay = await api.call("POST", "/v1/holds/h-1/post", key="p1")
    assert replay.headers.get("Idempotency-Replayed") == "true"
    assert replay.json() == posted.json()
    assert (await api.balance("wallet"))["balance"] == 8 * USD
    await api.fails("POST", "/v1/holds/h-2/post", 404, "hold.not_found")
    await api.fails("GET", "/v1/holds/h-1", 404, "hold.not_found", as_b=True)
    both = await api.fails(
        "POST",
        "/v1/holds",
        422,
        "hold.invalid",
        json={**body, "id": "h-3", "expires_at": "2030-01-01T00:00:10Z"},
    )
    assert both["details"]["fields"] == ["expires_at", "timeout_seconds"]
    bad = await api.fails(
        "POST", "/v1/holds", 422, "hold.invalid", json={**body, "id": "h-3", "timeout_seconds": -1}
    )
    assert bad["details"]["fields"] == ["timeout_seconds"]
    naive = {**body, "id": "h-3", "timeout_seconds": None, "expires_at": "2030-01-01T00:10:00"}
    bad = await api.fails("POST", "/v1/holds", 422, "settlement.naive_time", json=naive)
    assert bad["details"]["field"] == "expires_at"
    await api.fails(
        "POST",
        "/v1/holds",
        422,
        "hold.invalid",
        json={**body, "id": "h-3", "credit_account": "wallet"},
    )


async def test_a_hold_retried_later_with_its_timeout_is_the_same_hold(api: Api) -> None:
    await _wallet(api)
    body = {
        "id": "h3",
        "debit_account": "wallet",
        "credit_account": "revenue",
        "amount": USD,
        "currency": "USD",
        "timeout_seconds": 600,
    }
    first = await api.call("POST", "/v1/holds", json=body)
    assert first.status_code == 201, first.text
    api.clock.advance(5)
    # The timeout counts from the first placement: the retry names the same expiry.
    again = await api.call("POST", "/v1/holds", json=body)
    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    assert (await api.balance("wallet"))["pending"] == USD
    await api.fails(
        "POST", "/v1/holds", 409, "hold.conflict", json={**body, "timeout_seconds": 605}
    )


async def test_a_voided_hold_releases_its_reservation(api: Api) -> None:
    await _wallet(api)
    hold = await api.ok(
        "POST",
        "/v1/holds",
        json={
            "debit_account": "wallet",
            "credit_account": "revenue",
            "amount": 10 * USD,
            "currency": "USD",
            "expires_at": "2030-01-01T01:00:00Z",
        },
    )
    assert (await api.balance("wallet"))["available"] == 0
    # Void takes no body: a field in one is refused, not ignored, and nothing moves.
    refused = await api.fails(
        "POST", f"/v1/holds/{hold['id']}/void", 422, "request.invalid", json={"amount": 1}
    )
    assert refused["details"]["path"] == "$.amount", refused
    assert (await api.ok("GET", f"/v1/holds/{hold['id']}"))["status"] == "pending"
    voided = await api.ok("POST", f"/v1/holds/{hold['id']}/void", json={})
    assert voided["status"] == "voided"
    wallet = await api.balance("wallet")
    assert (wallet["balance"], wallet["available"]) == (10 * USD, 10 * USD)
    await api.fails("POST", f"/v1/holds/{hold['id']}/post", 409, "hold.already_final")
    assert await _rows(api) == (1, 2)  # only the top-up


async def test_an_expired_hold_voids_by_itself(api: Api) -> None:
    await _wallet(api)
    hold = await api.ok(
        "POST",
        "/v1/holds",
        json={
            "debit_account": "wallet",
            "credit_account": "revenue",
            "amount": 7 * USD,
            "currency": "USD",
            "timeout_seconds": 60,
        },
    )
    assert (await api.balance("wallet"))["available"] == 3 * USD
    api.clock.advance(60)
    # Past its expiry it reserves nothing, read or not.
    assert (await api.balance("wallet"))["available"] == 10 * USD
    await _post(api, ("wallet", 9 * USD), ("revenue", -9 * USD))
    await api.fails("POST", f"/v1/holds/{hold['id']}/post", 409, "hold.expired")
    await api.fails("POST", f"/v1/holds/{hold['id']}/void", 409, "hold.expired")
    shown = await api.ok("GET", f"/v1/holds/{hold['id']}")
    assert (shown["status"], shown["posted_amount"]) == ("expired", 0)
    assert [h["id"] for h in await api.ok("GET", "/v1/holds", params={"status": "expired"})] == [
        hold["id"]
    ]
    assert await api.count("SELECT COUNT(*) FROM ledger_holds WHERE status = 'pending'") == 0
    # An empty status filters nothing, as on every list (`?status=&limit=`).
    listed = await api.ok("GET", "/v1/holds?status=&limit=5")
    assert [h["id"] for h in listed] == [hold["id"]]


async def test_twenty_concurrent_debits_never_overdraw_a_wallet(api: Api) -> None:
    # Sent at once; the in-process client may take them one by one, so
    # test_ledger_concurrency.py overlaps the transactions for real.
    await _wallet(api)  # 10 USD, floor 0

    async def debit(n: int) -> Any:
        body = {"postings": [_leg("wallet", USD), _leg("revenue", -USD)]}
        return await api.call("POST", "/v1/ledger/entries", json=body, key=f"debit-{n}")

    answers = await asyncio.gather(*(debit(n) for n in range(20)))
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [201] * 10 + [422] * 10, [a.text for a in answers]
    assert {a.json()["code"] for a in answers if a.status_code == 422} == {"ledger.floor_crossed"}
    wallet = await api.balance("wallet")
    assert (wallet["balance"], wallet["available"]) == (0, 0)
    assert (await api.balance("revenue"))["balance"] == 10 * USD
    await _assert_balances_are_posting_sums(api)


def test_every_settlement_error_has_a_client_error_status() -> None:
    for error in ERRORS:
        assert 400 <= STATUS_BY_CODE[error.code] < 500, error.code


async def test_an_entry_key_outlives_its_remembered_answer(api: Api) -> None:
    await _wallet(api, funds=USD)
    body = {"postings": [_leg("wallet", USD), _leg("revenue", -USD)]}
    first = await api.ok("POST", "/v1/ledger/entries", json=body, key="spend-all")
    async with api.store.transaction() as tx:  # the answers of old keys are swept
        await tx.session.execute("DELETE FROM idempotency_keys WHERE key = %s", ("spend-all",))
    # The entry itself still knows its key: the same body gets the same entry back,
    # although the wallet could not pay for it again.
    again = await api.call("POST", "/v1/ledger/entries", json=body, key="spend-all")
    assert again.status_code == 200, again.text
    assert again.json() == first
    async with api.store.transaction() as tx:
        await tx.session.execute("DELETE FROM idempotency_keys WHERE key = %s", ("spend-all",))
    other = {"postings": [_leg("cash", USD), _leg("wallet", -USD)]}
    await api.fails(
        "POST",
        "/v1/ledger/entries",
        409,
        "ledger.idempotency_conflict",
        json=other,
        key="spend-all",
    )
    assert (await api.balance("wallet"))["balance"] == 0
    assert await _rows(api) == (2, 4)


async def test_an_account_whose_code_holds_a_slash_is_read_with_it_encoded(api: Api) -> None:
    # A member's wallet is named after its worker id, which may hold a `/`; the
    # client sends it as `%2F` and the server receives it decoded.
    code = "wallet:team/ana"
    await api.ok(
        "POST", "/v1/accounts", json={"code": code, "currency": "USD", "kind": "liability"}
    )
    account = await api.ok("GET", "/v1/accounts/wallet:team%2Fana")
    assert account["code"] == code
    await api.fails("GET", "/v1/accounts/wallet:team%2Fnobody", 404, "account.not_found")


async def test_a_code_with_a_slash_at_an_end_names_its_own_account(api: Api) -> None:
    # `w/`, `/w` and `w` are three accounts; a read of one never answers another.
    for code, currency in (("w", "USD"), ("w/", "EUR"), ("/w", "GBP"), ("w//x", "JPY")):
        opened = {"code": code, "currency": currency, "kind": "asset"}
        await api.ok("POST", "/v1/accounts", json=opened)
    for path, code in (("w%2F", "w/"), ("%2Fw", "/w"), ("w", "w"), ("w%2F%2Fx", "w//x")):
        account = await api.ok("GET", f"/v1/accounts/{path}")
        assert account["code"] == code, (path, account)
    await api.fails("GET", "/v1/accounts/x%2F", 404, "account.not_found")


async def test_a_hold_id_with_a_slash_is_refused(api: Api) -> None:
    # Its own paths (/v1/holds/{id}/post) could not reach it.
    await api.ok("POST", "/v1/accounts", json={"code": "w", "currency": "USD", "kind": "asset"})
    await api.ok("POST", "/v1/accounts", json={"code": "p", "currency": "USD", "kind": "liability"})
    refused = await api.call(
        "POST",
        "/v1/holds",
        json={
            "id": "orders/42",
            "debit_account": "w",
            "credit_account": "p",
            "amount": 5,
            "currency": "USD",
            "timeout_seconds": 60,
        },
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["code"] == "hold.invalid"
    assert "may not contain '/'" in str(refused.json()["details"]["reasons"])
