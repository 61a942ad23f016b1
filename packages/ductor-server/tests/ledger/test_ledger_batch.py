"""Batches of entries through the REST API on both backends: all or none, floors
checked across the batch, per-entry keys replayed, every problem pointed at its
entry, and concurrent batches that never overdraw."""

from __future__ import annotations

import asyncio
from typing import Any

from .conftest import Api

USD = 1_000_000


def _charge(amount: int, key: str | None = None, account: str = "wallet") -> dict[str, Any]:
    entry: dict[str, Any] = {
        "postings": [
            {"account": account, "amount": amount, "currency": "USD"},
            {"account": "revenue", "amount": -amount, "currency": "USD"},
        ],
        "description": "charge",
    }
    if key is not None:
        entry["key"] = key
    return entry


async def _funded(api: Api, funds: int) -> None:
    await api.open("cash", kind="asset")
    await api.open("wallet", floor=0)
    await api.open("revenue", kind="revenue")
    top_up = {
        "postings": [
            {"account": "cash", "amount": funds, "currency": "USD"},
            {"account": "wallet", "amount": -funds, "currency": "USD"},
        ]
    }
    await api.ok("POST", "/v1/ledger/entries", json=top_up)


async def _batch(api: Api, *entries: dict[str, Any], **kwargs: Any) -> Any:
    return await api.call(
        "POST", "/v1/ledger/entries/batch", json={"entries": list(entries)}, **kwargs
    )


async def test_a_batch_posts_every_entry_in_one_go(api: Api) -> None:
    await _funded(api, 10 * USD)
    answer = await _batch(api, _charge(USD), _charge(2 * USD), _charge(3 * USD, key="third"))
    assert answer.status_code == 201, answer.text
    body = answer.json()
    assert (body["created"], body["replayed"]) == (3, 0)
    assert [e["postings"][0]["amount"] for e in body["entries"]] == [USD, 2 * USD, 3 * USD]
    assert body["entries"][2]["idempotency_key"] == "third"
    assert (await api.balance("wallet"))["balance"] == 4 * USD
    assert (await api.balance("revenue"))["balance"] == 6 * USD


async def test_a_floor_holds_across_the_batch_and_nothing_is_written(api: Api) -> None:
    await _funded(api, 10 * USD)
    before = await api.count("SELECT COUNT(*) FROM ledger_entries")
    answer = await _batch(api, _charge(4 * USD), _charge(4 * USD), _charge(4 * USD), _charge(0))
    assert answer.status_code == 422, answer.text
    body = answer.json()
    assert body["code"] == "ledger.floor_crossed"
    pointers = [(p["pointer"], p["code"]) for p in body["details"]["problems"]]
    assert ("/entries/2", "ledger.floor_crossed") in pointers
    assert ("/entries/3", "ledger.invalid_amount") in pointers
    assert not any(p.startswith(("/entries/0", "/entries/1")) for p, _ in pointers)
    assert await api.count("SELECT COUNT(*) FROM ledger_entries") == before
    assert (await api.balance("wallet"))["balance"] == 10 * USD


async def test_keys_replay_entries_and_batches(api: Api) -> None:
    await _funded(api, 10 * USD)
    first = await _batch(api, _charge(USD, key="a"), _charge(USD, key="b"))
    assert first.status_code == 201
    second = await _batch(api, _charge(USD, key="b"), _charge(USD, key="c"))
    assert second.status_code == 201, second.text
    assert (second.json()["created"], second.json()["replayed"]) == (1, 1)
    assert second.json()["entries"][0]["id"] == first.json()["entries"][1]["id"]
    assert (await api.balance("wallet"))["balance"] == 7 * USD
    # The batch's own key: the same batch again is answered from memory.
    keyed = await _batch(api, _charge(USD), _charge(USD), key="batch-1")
    again = await _batch(api, _charge(USD), _charge(USD), key="batch-1")
    assert again.status_code == 201
    assert again.headers.get("Idempotency-Replayed") == "true"
    assert again.json() == keyed.json()
    assert [e["idempotency_key"] for e in keyed.json()["entries"]] == ["batch-1#0", "batch-1#1"]
    assert (await api.balance("wallet"))["balance"] == 5 * USD
    # A key recorded with other content refuses the whole batch.
    conflict = await _batch(api, _charge(USD, key="d"), _charge(2 * USD, key="a"))
    assert conflict.status_code == 409, conflict.text
    assert conflict.json()["code"] == "ledger.idempotency_conflict"
    assert conflict.json()["details"]["problems"][0]["pointer"] == "/entries/1"
    assert (await api.balance("wallet"))["balance"] == 5 * USD


async def test_a_key_recorded_by_a_batch_entry_answers_a_single_post_from_the_entry(
    api: Api,
) -> None:
    await _funded(api, 10 * USD)
    first = await _batch(api, _charge(USD, key="lead-9"))
    entry = first.json()["entries"][0]
    single = {k: v for k, v in _charge(USD).items() if k != "key"}
    # No remembered answer of POST /v1/ledger/entries: the entry itself answers.
    await api.fails(
        "POST",
        "/v1/ledger/entries",
        409,
        "ledger.idempotency_conflict",
        json=_charge(2 * USD),
        key="lead-9",
    )
    again = await api.call("POST", "/v1/ledger/entries", json=single, key="lead-9")
    assert again.status_code == 200, again.text
    assert again.headers.get("Idempotency-Replayed") is None
    assert again.json()["id"] == entry["id"]
    # That answer is remembered now: another body is the API's conflict.
    await api.fails(
        "POST",
        "/v1/ledger/entries",
        422,
        "idempotency.conflict",
        json=_charge(2 * USD),
        key="lead-9",
    )
    assert (await api.balance("wallet"))["balance"] == 9 * USD


async def test_malformed_batches_are_refused_with_a_pointer(api: Api) -> None:
    await _funded(api, 10 * USD)
    for entries, pointer in (
        ([], "/entries"),
        ([_charge(1) for _ in range(1001)], "/entries"),
        ([_charge(USD, key="x"), _charge(USD, key="x")], "/entries/1/key"),
        ([_charge(USD, key="hold:1")], "/entries/0/key"),
        ([_charge(USD, key="topup:1")], "/entries/0/key"),
        ([_charge(USD, key="")], "/entries/0/key"),
    ):
        answer = await api.call("POST", "/v1/ledger/entries/batch", json={"entries": entries})
        assert answer.status_code == 422, answer.text
        assert answer.json()["code"] == "request.invalid"
        assert answer.json()["details"]["pointer"] == pointer
    # The batch's key names its entries (`<key>#<index>`), so it may not take the
    # ledger's own prefixes either.
    for reserved in ("hold:h1", "topup:t1"):
        answer = await _batch(api, _charge(USD), key=reserved)
        assert answer.status_code == 422, answer.text
        assert answer.json()["code"] == "request.invalid"
        assert answer.json()["details"] == {"key": reserved}
    other = await _batch(api, _charge(USD), as_b=True)
    assert other.status_code == 422
    assert other.json()["code"] == "ledger.unknown_account"
    assert await api.count("SELECT COUNT(*) FROM ledger_entries") == 1


async def test_a_batch_refuses_the_keys_of_routing_charges_and_returns(api: Api) -> None:
    # `assign:<id>` and `return:<id>` are the keys of the server's own charge and
    # credit entries, for an entry of a batch and for the batch's key alike.
    await _funded(api, 10 * USD)
    count = "SELECT COUNT(*) FROM ledger_entries"
    before = (await api.count(count), await api.count("SELECT COUNT(*) FROM idempotency_keys"))
    for reserved in ("assign:x", "return:x"):
        entry = await _batch(api, _charge(USD), _charge(USD, key=reserved))
        assert entry.status_code == 422, entry.text
        assert entry.json()["code"] == "request.invalid"
        assert entry.json()["details"] == {"pointer": "/entries/1/key"}
        batch = await _batch(api, _charge(USD), key=reserved)
        assert batch.status_code == 422, batch.text
        assert batch.json()["code"] == "request.invalid"
        assert batch.json()["details"] == {"key": reserved}
    after = (await api.count(count), await api.count("SELECT COUNT(*) FROM idempotency_keys"))
    assert after == before
    assert (await api.balance("wallet"))["balance"] == 10 * USD


async def test_concurrent_batches_never_overdraw(api: Api) -> None:
    await _funded(api, 20 * USD)
    answers = await asyncio.gather(
        *(_batch(api, *[_charge(USD) for _ in range(5)]) for _ in range(10))
    )
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [201] * 4 + [422] * 6, [a.text for a in answers]
    wallet = await api.balance("wallet")
    assert (wallet["balance"], wallet["available"]) == (0, 0)
    assert await api.count("SELECT COUNT(*) FROM ledger_entries") == 1 + 20
