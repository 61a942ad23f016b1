"""Concurrent debits through the ledger service on both backends: many transactions
race for one wallet with a floor of 0, and it is never overdrawn.

The service is called straight from one event loop, so on Postgres the transactions
really overlap (each on its own pooled connection); only the account row locks keep
the floor."""

from __future__ import annotations

import asyncio

import msgspec

from ductor_server.ledger import LedgerTx
from ductor_server.services.ledger import (
    AccountBody,
    BatchEntryBody,
    EntryBatchBody,
    EntryBody,
    HoldBody,
    LedgerService,
)
from ductor_server.storage import Store
from ductor_settlement import (
    AccountKind,
    FloorCrossed,
    HoldConflict,
    LedgerError,
    OverReversal,
    Posting,
)

USD = 1_000_000
TENANT = "t-ledger"


async def _funded_wallet(ledger: LedgerService, funds: int) -> None:
    for code, kind, floor in (
        ("cash", AccountKind.ASSET, None),
        ("wallet", AccountKind.LIABILITY, 0),
        ("revenue", AccountKind.REVENUE, None),
    ):
        await ledger.open_account(
            TENANT, AccountBody(code=code, currency="USD", kind=kind, floor=floor)
        )
    await ledger.post_entry(TENANT, _move("cash", "wallet", funds))


def _move(debit: str, credit: str, amount: int) -> EntryBody:
    return EntryBody(
        postings=(
            Posting(account=debit, amount=amount, currency="USD"),
            Posting(account=credit, amount=-amount, currency="USD"),
        )
    )


async def _settle(calls: list[asyncio.Future[object]]) -> tuple[int, list[BaseException]]:
    results = await asyncio.gather(*calls, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    return len(results) - len(errors), errors


async def test_twenty_concurrent_debits_never_overdraw(store: Store) -> None:
    ledger = LedgerService(store)
    await _funded_wallet(ledger, 10 * USD)
    calls = [
        asyncio.ensure_future(
            ledger.post_entry(TENANT, _move("wallet", "revenue", USD), idempotency_key=f"d{n}")
        )
        for n in range(20)
    ]
    done, errors = await _settle(calls)
    assert done == 10
    assert len(errors) == 10
    assert all(isinstance(e, FloorCrossed) for e in errors), errors
    wallet = await ledger.get_account(TENANT, "wallet")
    assert (wallet.balance, wallet.available) == (0, 0)
    async with store.transaction() as tx:
        sums = await LedgerTx(tx).posting_sums(TENANT)
    assert sums == {"cash": 10 * USD, "wallet": 0, "revenue": -10 * USD}


async def test_concurrent_holds_and_debits_never_overdraw(store: Store) -> None:
    ledger = LedgerService(store)
    await _funded_wallet(ledger, 9 * USD)
    calls: list[asyncio.Future[object]] = []
    for n in range(10):
        calls.append(
            asyncio.ensure_future(
                ledger.place_hold(
                    TENANT,
                    HoldBody(
                        debit_account="wallet",
                        credit_account="revenue",
                        amount=2 * USD,
                        currency="USD",
                        timeout_seconds=60,
                    ),
                    idempotency_key=f"h{n}",
                )
            )
        )
        calls.append(
            asyncio.ensure_future(
                ledger.post_entry(
                    TENANT, _move("wallet", "revenue", 2 * USD), idempotency_key=f"d{n}"
                )
            )
        )
    done, errors = await _settle(calls)
    assert done == 4  # 9 USD holds four lots of 2, whichever way they are taken
    assert all(isinstance(e, LedgerError) for e in errors), errors
    wallet = await ledger.get_account(TENANT, "wallet")
    assert wallet.available == 1 * USD
    assert wallet.balance - wallet.pending == wallet.available


async def test_concurrent_reversals_never_take_back_more_than_the_entry_moved(
    store: Store,
) -> None:
    ledger = LedgerService(store)
    await _funded_wallet(ledger, 50 * USD)
    charge = await ledger.post_entry(TENANT, _move("wallet", "revenue", 10 * USD))
    back = msgspec.structs.replace(_move("revenue", "wallet", USD), reverses=charge.value.id)
    calls: list[asyncio.Future[object]] = [
        asyncio.ensure_future(ledger.post_entry(TENANT, back, idempotency_key=f"r{n}"))
        for n in range(30)
    ]
    batch = EntryBatchBody(
        entries=(BatchEntryBody(postings=back.postings, reverses=charge.value.id),) * 2
    )
    calls += [
        asyncio.ensure_future(ledger.post_entries(TENANT, batch, idempotency_key=f"b{n}"))
        for n in range(5)
    ]
    results = await asyncio.gather(*calls, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert all(isinstance(e, OverReversal) for e in errors), errors
    wallet = await ledger.get_account(TENANT, "wallet")
    assert wallet.balance == 50 * USD  # 10 taken, 10 given back, not a micro more
    async with store.transaction() as tx:
        sums = await LedgerTx(tx).posting_sums(TENANT)
    assert sums == {"cash": 50 * USD, "wallet": -50 * USD, "revenue": 0}


async def test_concurrent_holds_under_one_id_on_other_accounts_place_one(store: Store) -> None:
    ledger = LedgerService(store)
    for n in range(8):
        for code, kind in ((f"cash{n}", AccountKind.ASSET), (f"wallet{n}", AccountKind.LIABILITY)):
            await ledger.open_account(TENANT, AccountBody(code=code, currency="USD", kind=kind))
    for hold_id in ("h1", "h2", "h3"):
        # No account in common, so no lock orders them: only the id does.
        calls = [
            ledger.place_hold(
                TENANT,
                HoldBody(
                    id=hold_id,
                    debit_account=f"wallet{n}",
                    credit_account=f"cash{n}",
                    amount=USD,
                    currency="USD",
                    timeout_seconds=60,
                ),
            )
            for n in range(8)
        ]
        results = await asyncio.gather(*calls, return_exceptions=True)
        placed = [r for r in results if not isinstance(r, BaseException)]
        assert len(placed) == 1, results
        assert all(isinstance(r, HoldConflict) for r in results if r not in placed), results
        stored = await ledger.get_hold(TENANT, hold_id)
        assert stored.debit_account == placed[0].value.debit_account
