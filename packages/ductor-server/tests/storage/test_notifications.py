"""The inbox tables (`storage.notifications`) on both backends: per-subscriber
sequence numbers, the change log, counts, filters, snoozes, groups, secrets."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import msgspec
import psycopg

from ductor_server.engine.clock import ManualClock
from ductor_server.engine.queue import InProcessWakeUp
from ductor_server.engine.timers import Timers
from ductor_server.storage import Store
from ductor_server.storage.notifications import ChangeKind, Group, InboxTx, Notification

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def _n(i: int, subscriber: str = "ann", feed: str = "default", tenant: str = "t1") -> Notification:
    return Notification(
        tenant_id=tenant,
        id=f"n{i}",
        subscriber_id=subscriber,
        feed=feed,
        title=f"title {i}",
        body="b",
        data={"i": i},
        ctas=[{"label": "Go", "action": "go"}],
        created_at=NOW + timedelta(seconds=i),
    )


async def test_each_subscriber_numbers_its_changes_and_a_repeat_is_skipped(store: Store) -> None:
    async with store.transaction() as tx:
        inbox = InboxTx(tx)
        seqs = await inbox.insert([_n(1), _n(2, "bob"), _n(3), _n(1)], now=NOW)
    assert seqs == [1, 1, 2, 0]
    async with store.transaction() as tx:
        inbox = InboxTx(tx)
        first = await inbox.get("t1", "n1")
        assert first is not None
        assert first.data == {"i": 1}
        assert first.seq == 1
        seen = await inbox.update(msgspec.structs.replace(first, seen_at=NOW), now=NOW)
        assert seen.seq == 3
        assert await inbox.delete(seen, now=NOW) == 4
        assert await inbox.last_seq("t1", "ann") == 4
        assert await inbox.last_seq("t1", "bob") == 1
        assert await inbox.last_seq("t2", "ann") == 0
    async with store.transaction() as tx:
        changes = await InboxTx(tx).changes_after("t1", "ann", 1, limit=10)
    assert [(c.seq, c.kind, c.notification_id) for c in changes] == [
        (2, ChangeKind.CREATED, "n3"),
        (3, ChangeKind.UPDATED, "n1"),
        (4, ChangeKind.DELETED, "n1"),
    ]
    assert changes[1].notification is not None
    assert changes[1].notification.seen_at == NOW
    async with store.transaction() as tx:
        assert await InboxTx(tx).changes_after("t2", "ann", 0, limit=10) == []
        assert await InboxTx(tx).get("t2", "n3") is None


async def test_counts_and_filters_leave_out_archived_and_snoozed(store: Store) -> None:
    async with store.transaction() as tx:
        inbox = InboxTx(tx)
        await inbox.insert([_n(i, feed="a" if i < 4 else "b") for i in range(1, 7)], now=NOW)
        one = await inbox.get("t1", "n1")
        two = await inbox.get("t1", "n2")
        five = await inbox.get("t1", "n5")
        assert one is not None
        assert two is not None
        assert five is not None
        await inbox.update(msgspec.structs.replace(one, seen_at=NOW, read_at=NOW), now=NOW)
        await inbox.update(msgspec.structs.replace(two, archived_at=NOW), now=NOW)
        later = NOW + timedelta(minutes=5)
        await inbox.update(msgspec.structs.replace(five, snoozed_until=later), now=NOW)
    async with store.transaction() as tx:
        inbox = InboxTx(tx)
        counts = await inbox.counts("t1", "ann", now=NOW)
        assert {k: (c.total, c.unseen, c.unread) for k, c in counts.items()} == {
            "a": (2, 1, 1),
            "b": (2, 2, 2),
        }
        after = await inbox.counts("t1", "ann", now=later)
        assert after["b"].total == 3

        async def ids(**kw: object) -> list[str]:
            found = await inbox.list_notifications("t1", "ann", now=NOW, limit=10, **kw)  # type: ignore[arg-type]
            return [n.id for n in found]

        assert await ids(feed=None, status="all") == ["n6", "n4", "n3", "n1"]
        assert await ids(feed=None, status="unread") == ["n6", "n4", "n3"]
        assert await ids(feed="a", status="archived") == ["n2"]
        assert await ids(feed=None, status="snoozed") == ["n5"]
        page = await inbox.list_notifications(
            "t1", "ann", feed=None, status="all", now=NOW, limit=2
        )
        rest = await inbox.list_notifications(
            "t1",
            "ann",
            feed=None,
            status="all",
            now=NOW,
            limit=10,
            before=(page[-1].created_at, page[-1].id),
        )
        assert [n.id for n in rest] == ["n3", "n1"]
        assert await inbox.ids_where("t1", "ann", feed="a", read=True, now=NOW, limit=10) == ["n1"]
        unseen = await inbox.ids_where("t1", "ann", feed=None, now=NOW, unseen=True, limit=10)
        assert unseen == ["n3", "n4", "n6"]  # n5 is snoozed
        woken = await inbox.ids_where("t1", "ann", feed="b", now=later, unseen=True, limit=10)
        assert woken == ["n4", "n5", "n6"]


async def test_snoozes_come_due_in_order_for_every_tenant(store: Store) -> None:
    async with store.transaction() as tx:
        inbox = InboxTx(tx)
        await inbox.insert([_n(1), _n(2, tenant="t2")], now=NOW)
        assert await inbox.next_snooze_at() is None
        for tenant, minutes in (("t1", 2), ("t2", 1)):
            item = await inbox.get(tenant, "n1" if tenant == "t1" else "n2")
            assert item is not None
            until = NOW + timedelta(minutes=minutes)
            await inbox.update(msgspec.structs.replace(item, snoozed_until=until), now=NOW)
    async with store.transaction() as tx:
        inbox = InboxTx(tx)
        assert await inbox.next_snooze_at() == NOW + timedelta(minutes=1)
        assert await inbox.due_snoozes(NOW, limit=10) == []
        due = await inbox.due_snoozes(NOW + timedelta(minutes=3), limit=10)
        assert due == [("t2", "n2"), ("t1", "n1")]


async def test_a_group_takes_one_answer_and_secrets_and_preferences_keep(store: Store) -> None:
    group = Group(tenant_id="t1", group_id="r:s", run_id="r", step_ref="s", await_action=True)
    async with store.transaction() as tx:
        inbox = InboxTx(tx)
        assert await inbox.insert_group(group)
        assert not await inbox.insert_group(group)
        assert await inbox.act_on_group("t1", "r:s", {"action": "yes"})
        assert not await inbox.act_on_group("t1", "r:s", {"action": "no"})
        assert not await inbox.act_on_group("t2", "r:s", {"action": "no"})
        stored = await inbox.get_group("t1", "r:s")
        assert stored is not None
        assert stored.acted == {"action": "yes"}
        assert stored.await_action
        assert await inbox.get_group("t2", "r:s") is None
        assert await inbox.secret("t1") is None
        assert await inbox.put_secret("t1", "s1", now=NOW, replace=False) == "s1"
        assert await inbox.put_secret("t1", "s2", now=NOW, replace=False) == "s1"
        assert await inbox.put_secret("t1", "s3", now=NOW, replace=True) == "s3"
        assert await inbox.secret("t2") is None
        await inbox.set_preferences("t1", "ann", [{"feed": "a", "in_app": False}])
        assert await inbox.preferences("t1", "ann") == [{"feed": "a", "in_app": False}]
        assert await inbox.preferences("t2", "ann") == []
        # Preferences set before anything was sent keep the sequence at zero.
        assert await inbox.last_seq("t1", "ann") == 0


async def _someone_waits_for_a_lock(postgres_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as db:
        for _ in range(500):
            row = await (
                await db.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).fetchone()
            if row is not None and row[0] > 0:
                return
            await asyncio.sleep(0.02)
    raise AssertionError("nobody waited for the subscriber's lock")


# Postgres only: it needs two writers at once, which SQLite never has.
async def test_a_snooze_ending_keeps_what_the_subscriber_did_meanwhile(
    pg_store: Store, postgres_url: str
) -> None:
    """The timer loop ends a snooze on the notification as it is once it holds the
    subscriber's lock, not as it was before: a click or an archive committed
    meanwhile stays, and a snooze moved later is not ended."""
    ends = NOW + timedelta(minutes=1)
    async with pg_store.transaction() as tx:
        inbox = InboxTx(tx)
        await inbox.insert([_n(1), _n(2)], now=NOW)
        for notification_id in ("n1", "n2"):
            item = await inbox.get("t1", notification_id)
            assert item is not None
            await inbox.update(msgspec.structs.replace(item, snoozed_until=ends), now=NOW)
    clock = ManualClock(ends + timedelta(seconds=1))
    timers = Timers(pg_store, clock=clock, wake=InProcessWakeUp())
    later = ends + timedelta(hours=1)
    acted = {"action": "go", "cta": 0, "subscriber_id": "ann", "at": "2026-01-02T03:05:00Z"}
    async with pg_store.transaction() as tx:
        inbox = InboxTx(tx)
        await inbox.take_seqs("t1", "ann", 0)  # the subscriber's lock, as a PATCH takes it
        one, two = await inbox.get("t1", "n1"), await inbox.get("t1", "n2")
        assert one is not None
        assert two is not None
        await inbox.update(msgspec.structs.replace(one, archived_at=NOW, acted=acted), now=NOW)
        await inbox.update(msgspec.structs.replace(two, snoozed_until=later), now=NOW)
        firing = asyncio.create_task(timers.fire_due())
        await _someone_waits_for_a_lock(postgres_url)
    await firing
    async with pg_store.transaction() as tx:
        inbox = InboxTx(tx)
        one, two = await inbox.get("t1", "n1"), await inbox.get("t1", "n2")
        changes = await inbox.changes_after("t1", "ann", 0, limit=100)
    assert one is not None
    assert two is not None
    assert (one.archived_at, one.acted, one.snoozed_until) == (NOW, acted, None)
    assert two.snoozed_until == later
    assert [c.seq for c in changes] == list(range(1, len(changes) + 1))
    assert changes[-1].notification == one
