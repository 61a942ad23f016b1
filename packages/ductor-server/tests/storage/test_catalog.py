"""Tenants, API keys, workflow versions, timers, waits, events and idempotency records."""

from __future__ import annotations

import asyncio
import hashlib
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ductor_core.runs import EventReceived
from ductor_server.storage import (
    EventRecord,
    IdempotencyRecord,
    InboxRef,
    NewInboxItem,
    RunRef,
    Store,
    StoreError,
    TimerRecord,
    TimerRef,
    WaitRecord,
    WaitRef,
)

from .builders import NOW, at, new_run


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


async def test_tenants_and_api_keys(store: Store) -> None:
    async with store.transaction() as tx:
        tenant = await tx.ensure_tenant("t1", name="Acme", now=NOW)
        again = await tx.ensure_tenant("t1", name="renamed", now=at(5))
        assert tenant == again
        assert tenant.name == "Acme"
        assert tenant.created_at == NOW
        key = await tx.create_api_key(
            "t1", key_id="k1", name="dev", prefix="dk_abc", key_hash=digest("dk_abcsecret"), now=NOW
        )
        await tx.create_api_key(
            "t1", key_id="k2", name="ci", prefix="dk_def", key_hash=digest("other"), now=at(1)
        )
        assert await tx.find_api_key(digest("dk_abcsecret")) == key
        assert await tx.find_api_key(digest("wrong")) is None
        assert [k.id for k in await tx.list_api_keys("t1")] == ["k1", "k2"]
        assert await tx.list_api_keys("t2") == []
        assert not await tx.revoke_api_key("t2", "k1", now=at(2))  # not theirs
        assert await tx.revoke_api_key("t1", "k1", now=at(2))
        assert not await tx.revoke_api_key("t1", "k1", now=at(3))  # already revoked
        revoked = await tx.find_api_key(digest("dk_abcsecret"))
        assert revoked is not None
        assert revoked.revoked_at == at(2)


async def test_a_key_hash_is_unique(store: Store) -> None:
    async def insert_twice() -> None:
        async with store.transaction() as tx:
            for key_id in ("k1", "k2"):
                await tx.create_api_key(
                    "t1", key_id=key_id, name="x", prefix="p", key_hash=digest("same"), now=NOW
                )

    with pytest.raises(StoreError) as info:
        await insert_twice()
    assert info.value.code == "storage.conflict"
    assert not info.value.retryable
    async with store.transaction() as tx:
        assert await tx.list_api_keys("t1") == []


DEFINITION = {"family_slug": "orders", "title": "Orders", "steps": [{"ref": "a", "args": {}}]}


async def test_publishing_numbers_versions_by_content(store: Store) -> None:
    async with store.transaction() as tx:
        v1, created1 = await tx.insert_workflow_version(
            "t1", family_slug="orders", hash="h1", definition=DEFINITION, trigger_events=[], now=NOW
        )
        same, created_again = await tx.insert_workflow_version(
            "t1",
            family_slug="orders",
            hash="h1",
            definition={"other": 1},
            trigger_events=[],
            now=at(1),
        )
        v2, created2 = await tx.insert_workflow_version(
            "t1",
            family_slug="orders",
            hash="h2",
            definition={**DEFINITION, "title": "Orders 2"},
            trigger_events=["order.created", "order.created", "order.paid"],
            now=at(2),
        )
        other_tenant, _ = await tx.insert_workflow_version(
            "t2", family_slug="orders", hash="h2", definition=DEFINITION, trigger_events=[], now=NOW
        )
        await tx.insert_workflow_version(
            "t1", family_slug="billing", hash="h1", definition={}, trigger_events=[], now=NOW
        )
    assert (v1.version, created1) == (1, True)
    assert (same.version, created_again) == (1, False)
    assert same == v1
    assert same.definition == DEFINITION
    assert (v2.version, created2) == (2, True)
    assert v2.trigger_events == ["order.created", "order.paid"]
    assert other_tenant.version == 1
    async with store.transaction() as tx:
        assert await tx.get_workflow_version("t1", "orders", 2) == v2
        assert await tx.get_workflow_version("t1", "orders", 3) is None
        assert await tx.get_latest_workflow_version("t1", "orders") == v2
        assert await tx.get_latest_workflow_version("t1", "nope") is None
        assert [v.version for v in await tx.list_workflow_versions("t1", "orders")] == [1, 2]
        families = await tx.list_workflow_families("t1")
        assert [(f.family_slug, f.latest.version, f.version_count) for f in families] == [
            ("billing", 1, 1),
            ("orders", 2, 2),
        ]
        assert families[1].latest.definition["title"] == "Orders 2"
        assert [w.version for w in await tx.find_triggered_workflows("t1", "order.paid")] == [2]
        assert await tx.find_triggered_workflows("t2", "order.paid") == []


async def test_only_the_latest_version_triggers(store: Store) -> None:
    async with store.transaction() as tx:
        await tx.insert_workflow_version(
            "t1", family_slug="f", hash="h1", definition={}, trigger_events=["e"], now=NOW
        )
        assert len(await tx.find_triggered_workflows("t1", "e")) == 1
        await tx.insert_workflow_version(
            "t1", family_slug="f", hash="h2", definition={}, trigger_events=["other"], now=NOW
        )
        assert await tx.find_triggered_workflows("t1", "e") == []
        [found] = await tx.find_triggered_workflows("t1", "other")
        assert found.version == 2


async def test_concurrent_publishers_get_distinct_versions(store: Store) -> None:
    async def publish(i: int) -> tuple[int, bool]:
        async with store.transaction() as tx:
            record, created = await tx.insert_workflow_version(
                "t1",
                family_slug="f",
                hash=f"h{i % 4}",
                definition={"i": i},
                trigger_events=[],
                now=NOW,
            )
            await asyncio.sleep(0)
            return record.version, created

    results = await asyncio.gather(*(publish(i) for i in range(8)))
    assert sorted(v for v, created in results if created) == [1, 2, 3, 4]
    async with store.transaction() as tx:
        versions = await tx.list_workflow_versions("t1", "f")
    assert [v.version for v in versions] == [1, 2, 3, 4]
    assert sorted(v.hash for v in versions) == ["h0", "h1", "h2", "h3"]


async def test_timers_upsert_come_due_in_order_and_delete(store: Store) -> None:
    def timer(run_id: str, timer_id: str, seconds: float, tenant_id: str = "t1") -> TimerRecord:
        return TimerRecord(
            tenant_id=tenant_id, run_id=run_id, timer_id=timer_id, fire_at=at(seconds)
        )

    async with store.transaction() as tx:
        assert await tx.next_timer_at() is None
        await tx.set_timers(
            [
                timer("r1", "a", 10),
                timer("r1", "b", 5),
                timer("r2", "a", 7, tenant_id="t2"),
                timer("r3", "c", 100),
            ]
        )
        await tx.set_timers([timer("r1", "a", 1)])  # replaced, not duplicated
        assert await tx.next_timer_at() == at(1)
        due = await tx.due_timers(now=at(7), limit=10)
        assert [(t.run_id, t.timer_id) for t in due] == [("r1", "a"), ("r1", "b"), ("r2", "a")]
        assert [t.fire_at for t in due] == [at(1), at(5), at(7)]
        assert len(await tx.due_timers(now=at(7), limit=2)) == 2
        assert [t.timer_id for t in await tx.list_run_timers("t1", "r1")] == ["a", "b"]
        assert await tx.list_run_timers("t2", "r1") == []
        assert (
            await tx.delete_timers(
                [
                    TimerRef(tenant_id="t1", run_id="r1", timer_id="a"),
                    TimerRef(tenant_id="t1", run_id="r2", timer_id="a"),
                ]
            )
            == 1
        )
        assert await tx.delete_run_timers("t2", "r3") == 0
        assert await tx.delete_run_timers("t1", "r3") == 1
        remaining = await tx.due_timers(now=at(1000), limit=10)
        assert [(t.tenant_id, t.run_id, t.timer_id) for t in remaining] == [
            ("t1", "r1", "b"),
            ("t2", "r2", "a"),
        ]


async def test_due_timers_are_claimed_once_by_concurrent_timer_loops(pg_store: Store) -> None:
    # Postgres only: due timers are locked SKIP LOCKED until the claiming transaction ends.
    async with pg_store.transaction() as tx:
        await tx.set_timers(
            [
                TimerRecord(tenant_id="t1", run_id=f"r{i}", timer_id="x", fire_at=at(i))
                for i in range(10)
            ]
        )
    hold = asyncio.Event()
    taken = asyncio.Event()
    seen: dict[str, list[str]] = {}

    async def first() -> None:
        async with pg_store.transaction() as tx:
            seen["first"] = [t.run_id for t in await tx.due_timers(now=at(100), limit=4)]
            taken.set()
            await hold.wait()

    async def second() -> None:
        await taken.wait()
        async with pg_store.transaction() as tx:
            seen["second"] = [t.run_id for t in await tx.due_timers(now=at(100), limit=100)]
        hold.set()

    await asyncio.wait_for(asyncio.gather(first(), second()), timeout=20)
    assert seen["first"] == ["r0", "r1", "r2", "r3"]
    assert seen["second"] == [f"r{i}" for i in range(4, 10)]


async def test_waits_register_find_and_clear(store: Store) -> None:
    def wait(run_id: str, step_ref: str, kind: str, name: str, tenant_id: str = "t1") -> WaitRecord:
        return WaitRecord(
            tenant_id=tenant_id,
            run_id=run_id,
            step_ref=step_ref,
            kind=kind,
            name=name,
            created_at=NOW,
        )

    async with store.transaction() as tx:
        await tx.add_waits(
            [
                wait("r1", "ship", "event", "order.shipped"),
                wait("r1", "ship", "event", "order.shipped"),  # twice is harmless
                wait("r2", "ship", "event", "order.shipped"),
                wait("r2", "ok", "signal", "order.shipped"),
                wait("r3", "ship", "event", "order.shipped", tenant_id="t2"),
            ]
        )
        await tx.add_waits([wait("r1", "ship", "event", "order.shipped")])
        found = await tx.find_waits("t1", kind="event", name="order.shipped")
        assert sorted(w.run_id for w in found) == ["r1", "r2"]
        assert [
            w.run_id for w in await tx.find_waits("t1", kind="signal", name="order.shipped")
        ] == ["r2"]
        assert len(await tx.list_run_waits("t1", "r2")) == 2
        assert await tx.clear_waits([WaitRef(tenant_id="t1", run_id="r2", step_ref="ship")]) == 1
        assert [
            w.run_id for w in await tx.find_waits("t1", kind="event", name="order.shipped")
        ] == ["r1"]
        assert await tx.clear_run_waits("t2", "r1") == 0
        assert await tx.clear_run_waits("t1", "r1") == 1
        assert await tx.find_waits("t1", kind="event", name="order.shipped") == []
        assert len(await tx.find_waits("t2", kind="event", name="order.shipped")) == 1


async def test_an_event_id_is_accepted_once_per_tenant(store: Store) -> None:
    first = EventRecord(
        tenant_id="t1", id="e1", name="order.created", data={"id": 1}, received_at=NOW
    )
    resend = EventRecord(
        tenant_id="t1", id="e1", name="order.created", data={"id": 2}, received_at=at(1)
    )
    async with store.transaction() as tx:
        assert await tx.insert_events([first]) == [True]
        assert await tx.insert_events([resend, resend]) == [False, False]
        assert await tx.insert_events(
            [EventRecord(tenant_id="t2", id="e1", name="x", received_at=NOW)]
        ) == [True]
        assert await tx.get_event("t1", "e1") == first
        assert await tx.get_event("t1", "e2") is None


async def test_idempotency_records_remember_the_first_response(store: Store) -> None:
    record = IdempotencyRecord(
        tenant_id="t1",
        scope="POST /v1/runs",
        key="abc",
        request_hash="h1",
        status_code=201,
        response={"id": "r1"},
        created_at=NOW,
    )
    async with store.transaction() as tx:
        assert await tx.put_idempotency(record)
        assert not await tx.put_idempotency(
            IdempotencyRecord(
                tenant_id="t1",
                scope="POST /v1/runs",
                key="abc",
                request_hash="h2",
                status_code=500,
                created_at=at(1),
            )
        )
        assert await tx.get_idempotency("t1", "POST /v1/runs", "abc") == record
        assert await tx.get_idempotency("t1", "POST /v1/events", "abc") is None
        assert await tx.get_idempotency("t2", "POST /v1/runs", "abc") is None
        old = IdempotencyRecord(
            tenant_id="t2",
            scope="s",
            key="k",
            request_hash="h",
            status_code=200,
            created_at=at(-100),
        )
        assert await tx.put_idempotency(old)
        assert await tx.delete_idempotency_before(at(-1)) == 1
        assert await tx.get_idempotency("t2", "s", "k") is None
        assert await tx.get_idempotency("t1", "POST /v1/runs", "abc") == record


_FAMILIES = itertools.count()


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(hashes=st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), min_size=1, max_size=12))
async def test_versions_number_distinct_contents_in_order_of_first_publish(
    store: Store, hashes: list[str]
) -> None:
    family = f"f{next(_FAMILIES)}"
    got: list[tuple[int, bool]] = []
    for h in hashes:
        async with store.transaction() as tx:
            record, created = await tx.insert_workflow_version(
                "t1", family_slug=family, hash=h, definition={"h": h}, trigger_events=[], now=NOW
            )
            got.append((record.version, created))
    first_seen = list(dict.fromkeys(hashes))
    assert got == [(first_seen.index(h) + 1, hashes.index(h) == i) for i, h in enumerate(hashes)]
    async with store.transaction() as tx:
        versions = await tx.list_workflow_versions("t1", family)
        latest = await tx.get_latest_workflow_version("t1", family)
    assert [(v.version, v.hash, v.definition) for v in versions] == [
        (i + 1, h, {"h": h}) for i, h in enumerate(first_seen)
    ]
    assert latest == versions[-1]


async def test_purging_old_events_reopens_their_ids(store: Store) -> None:
    async with store.transaction() as tx:
        await tx.insert_events(
            [
                EventRecord(tenant_id="t1", id="old", name="x", received_at=at(0)),
                EventRecord(tenant_id="t2", id="old", name="x", received_at=at(1)),
                EventRecord(tenant_id="t1", id="new", name="x", received_at=at(100)),
            ]
        )
        assert await tx.purge_events(received_before=at(50)) == 2
        assert await tx.get_event("t1", "old") is None
        assert await tx.get_event("t1", "new") is not None
        again = EventRecord(tenant_id="t1", id="old", name="x", received_at=at(200))
        assert await tx.insert_events([again]) == [True]


async def test_an_event_a_runs_inbox_names_is_delivered_with_its_data_and_kept(
    store: Store,
) -> None:
    data = {"order": {"id": 7, "lines": [1, 2]}, "note": "ü" * 2000}
    async with store.transaction() as tx:
        await tx.insert_runs([new_run("t1", "r1"), new_run("t1", "r2"), new_run("t2", "r3")])
        await tx.insert_events(
            [
                EventRecord(tenant_id="t1", id="e1", name="paid", data=data, received_at=at(0)),
                EventRecord(tenant_id="t2", id="e1", name="paid", data="t2's", received_at=at(0)),
                EventRecord(tenant_id="t1", id="e2", name="x", received_at=at(0)),
            ]
        )
        named = EventReceived(event_id="e1", name="paid")
        await tx.enqueue_inbox(
            [
                NewInboxItem(tenant_id=t, run_id=r, input=named, available_at=at(0))
                for t, r in (("t1", "r1"), ("t1", "r2"), ("t2", "r3"))
            ]
        )
        refs = [
            RunRef(tenant_id="t1", run_id="r1"),
            RunRef(tenant_id="t1", run_id="r2"),
            RunRef(tenant_id="t2", run_id="r3"),
        ]
        items = await tx.load_inbox(refs, now=at(1))
    got = [(i.tenant_id, i.input) for i in items]
    assert got == [
        ("t1", EventReceived(event_id="e1", name="paid", data=data)),
        ("t1", EventReceived(event_id="e1", name="paid", data=data)),
        ("t2", EventReceived(event_id="e1", name="paid", data="t2's")),
    ]
    first, second = items[0].input, items[1].input
    assert isinstance(first, EventReceived)
    assert isinstance(second, EventReceived)
    assert first.data is second.data  # read once for both runs
    # Past its retention, an event an inbox still names is kept; the other goes.
    async with store.transaction() as tx:
        assert await tx.purge_events(received_before=at(50)) == 1
        assert await tx.get_event("t1", "e1") is not None
        assert await tx.get_event("t1", "e2") is None
        await tx.delete_inbox([InboxRef(tenant_id=i.tenant_id, seq=i.seq) for i in items])
        assert await tx.purge_events(received_before=at(50)) == 2
