"""The inbox email outbox on both backends: a repeated insert writes nothing, two
claimers racing for one row give one winner, a claimer whose lease ran out cannot
settle the row another took, and every read is scoped to its tenant."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from ductor_server.engine.notify import email_id, outbox_email
from ductor_server.storage import Store
from ductor_server.storage.emails import Email, EmailStatus, EmailsTx
from ductor_server.storage.notifications import InboxTx

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def _row(tenant: str, subscriber: str) -> Email:
    return outbox_email(
        tenant_id=tenant,
        id=email_id(tenant, "run_1:tell", subscriber),
        subscriber_id=subscriber,
        address=f"{subscriber}@example.com",
        connection="mail",
        subject="",
        title="Order shipped",
        body="",
        ctas=[
            {"label": "Track", "url": "https://shop.example/t/1"},
            {"label": "Ok", "action": "ok"},
        ],
        now=NOW,
        run_id="run_1",
        step_ref="tell",
    )


async def test_claims_race_once_and_a_stale_claim_cannot_settle(store: Store) -> None:
    row = _row("acme", "ann")
    assert row.subject == "Order shipped"  # the title when no subject is given
    assert row.text_body == "Order shipped\n\nTrack: https://shop.example/t/1"
    async with store.transaction() as tx:
        assert await EmailsTx(tx).insert([row]) == [row.id]
    async with store.transaction() as tx:
        assert await EmailsTx(tx).insert([row]) == []  # a repeated command
        assert await EmailsTx(tx).due(NOW, limit=10) == [("acme", row.id)]

    async def claim() -> Email | None:
        async with store.transaction() as tx:
            return await EmailsTx(tx).claim(
                "acme", row.id, now=NOW, lease_until=NOW + timedelta(seconds=120)
            )

    won = [c for c in await asyncio.gather(claim(), claim()) if c is not None]
    assert len(won) == 1
    first = won[0]
    assert first.attempts == 1
    async with store.transaction() as tx:
        assert await EmailsTx(tx).due(NOW + timedelta(seconds=60), limit=10) == []
        assert await EmailsTx(tx).next_due_at() == NOW + timedelta(seconds=120)
    later = NOW + timedelta(seconds=121)  # the lease ran out: another process takes it
    async with store.transaction() as tx:
        second = await EmailsTx(tx).claim(
            "acme", row.id, now=later, lease_until=later + timedelta(seconds=120)
        )
    assert second is not None
    assert second.attempts == 2
    async with store.transaction() as tx:
        outbox = EmailsTx(tx)
        assert not await outbox.settle(first, status=EmailStatus.SENT, now=later, message_id="x")
        assert await outbox.settle(
            second, status=EmailStatus.SENT, now=later, message_id=f"<{row.id}@ductor>"
        )
    async with store.transaction() as tx:
        stored = await EmailsTx(tx).get("acme", row.id)
        assert await EmailsTx(tx).get("other", row.id) is None
        assert await EmailsTx(tx).next_due_at() is None
    assert stored is not None
    assert (stored.status, stored.attempts, stored.sent_at) == (EmailStatus.SENT, 2, later)
    assert stored.message_id == f"<{row.id}@ductor>"


async def test_lists_and_addresses_are_per_tenant(store: Store) -> None:
    async with store.transaction() as tx:
        await EmailsTx(tx).insert([_row("acme", "ann"), _row("acme", "bob"), _row("other", "ann")])
        inbox = InboxTx(tx)
        await inbox.set_email("acme", "ann", "ann@example.com")
        await inbox.set_email("other", "bob", "bob@other.example")
        await inbox.set_email("acme", "cat", "cat@example.com")
        await inbox.set_email("acme", "cat", None)
    async with store.transaction() as tx:
        outbox = EmailsTx(tx)
        mine = await outbox.list_emails(
            "acme", run_id="run_1", subscriber_id=None, status="pending", after=None, limit=10
        )
        assert sorted(e.subscriber_id for e in mine) == ["ann", "bob"]
        theirs = await outbox.list_emails(
            "other", run_id=None, subscriber_id="bob", status=None, after=None, limit=10
        )
        assert theirs == []
        found = await InboxTx(tx).emails("acme", ["ann", "bob", "cat"])
        assert found == {"ann": "ann@example.com"}
        assert await InboxTx(tx).emails("other", ["ann", "bob"]) == {"bob": "bob@other.example"}
