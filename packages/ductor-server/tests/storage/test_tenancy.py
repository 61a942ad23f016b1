"""Tenancy: another tenant's rows are invisible to every read and untouched by every write."""

from __future__ import annotations

from datetime import timedelta

from ductor_core.runs import RunStatus, TimerFired
from ductor_server.storage import (
    AttemptRecord,
    EventRecord,
    IdempotencyRecord,
    InboxRef,
    NewHistoryEntry,
    NewInboxItem,
    RunRef,
    RunUpdate,
    Store,
    TaskRef,
    TimerRecord,
    TimerRef,
    Tx,
    WaitRecord,
    WaitRef,
)

from .builders import NOW, new_run, new_task


async def populate(tx: Tx, tenant_id: str) -> tuple[str, int]:
    """Give `tenant_id` one of everything; return its task id and inbox seq."""
    await tx.ensure_tenant(tenant_id, name=tenant_id, now=NOW)
    await tx.create_api_key(
        tenant_id, key_id=f"{tenant_id}-k", name="k", prefix="p", key_hash=f"{tenant_id}-h", now=NOW
    )
    await tx.insert_workflow_version(
        tenant_id, family_slug="f", hash="h", definition={}, trigger_events=["e"], now=NOW
    )
    await tx.insert_runs(
        [
            new_run(tenant_id, f"{tenant_id}-run", idempotency_key="idem"),
            new_run(
                tenant_id,
                f"{tenant_id}-child",
                parent_run_id=f"{tenant_id}-run",
                parent_step_ref="s",
                child_key="ck",
            ),
        ]
    )
    [seq] = await tx.enqueue_inbox(
        [
            NewInboxItem(
                tenant_id=tenant_id,
                run_id=f"{tenant_id}-run",
                input=TimerFired(timer_id="x"),
                available_at=NOW,
            )
        ]
    )
    await tx.enqueue_tasks([new_task(tenant_id, f"{tenant_id}-run", "a")])
    [task] = [
        t
        for t in await tx.lease_tasks(owner="w", limit=10, lease_for=timedelta(0), now=NOW)
        if t.tenant_id == tenant_id
    ]
    await tx.record_attempts(
        [
            AttemptRecord(
                tenant_id=tenant_id,
                run_id=f"{tenant_id}-run",
                step_ref="a",
                attempt=1,
                ok=True,
                started_at=NOW,
                finished_at=NOW,
            )
        ]
    )
    await tx.set_timers(
        [TimerRecord(tenant_id=tenant_id, run_id=f"{tenant_id}-run", timer_id="t", fire_at=NOW)]
    )
    await tx.add_waits(
        [
            WaitRecord(
                tenant_id=tenant_id,
                run_id=f"{tenant_id}-run",
                step_ref="w",
                kind="event",
                name="e",
                created_at=NOW,
            )
        ]
    )
    await tx.insert_events([EventRecord(tenant_id=tenant_id, id="ev", name="e", received_at=NOW)])
    await tx.append_history(
        [NewHistoryEntry(tenant_id=tenant_id, run_id=f"{tenant_id}-run", at=NOW, kind="k")]
    )
    await tx.put_idempotency(
        IdempotencyRecord(
            tenant_id=tenant_id,
            scope="s",
            key="k",
            request_hash="h",
            status_code=200,
            created_at=NOW,
        )
    )
    return task.id, seq


async def test_another_tenants_rows_are_invisible_and_untouchable(store: Store) -> None:
    async with store.transaction() as tx:
        task_id, seq = await populate(tx, "t1")
        await tx.ensure_tenant("t2", name="t2", now=NOW)
    run = "t1-run"
    async with store.transaction() as tx:
        # every read as t2 comes back empty, even with t1's ids and keys
        assert (await tx.get_tenant("t2")) is not None
        assert await tx.list_api_keys("t2") == []
        assert await tx.get_workflow_version("t2", "f", 1) is None
        assert await tx.get_latest_workflow_version("t2", "f") is None
        assert await tx.list_workflow_versions("t2", "f") == []
        assert await tx.list_workflow_families("t2") == []
        assert await tx.find_triggered_workflows("t2", "e") == []
        assert await tx.get_run("t2", run) is None
        assert await tx.get_runs([RunRef(tenant_id="t2", run_id=run)]) == []
        assert await tx.find_run_by_idempotency_key("t2", "idem") is None
        assert await tx.list_child_runs("t2", run) == []
        assert (await tx.list_runs("t2")).items == []
        assert await tx.load_inbox([RunRef(tenant_id="t2", run_id=run)], now=NOW) == []
        assert await tx.get_task("t2", task_id) is None
        assert await tx.list_attempts("t2", run) == []
        assert await tx.list_run_timers("t2", run) == []
        assert await tx.find_waits("t2", kind="event", name="e") == []
        assert await tx.list_run_waits("t2", run) == []
        assert await tx.get_event("t2", "ev") is None
        assert await tx.list_history("t2", run) == []
        assert await tx.get_idempotency("t2", "s", "k") is None

        # every write as t2 aimed at t1's rows changes nothing
        assert not await tx.revoke_api_key("t2", "t1-k", now=NOW)
        state = (await tx.get_run("t1", run)).state  # type: ignore[union-attr]
        assert await tx.update_runs(
            [
                RunUpdate(
                    tenant_id="t2", run_id=run, expected_lock_version=0, state=state, updated_at=NOW
                )
            ]
        ) == [False]
        assert await tx.delete_inbox([InboxRef(tenant_id="t2", seq=seq)]) == 0
        ref = TaskRef(tenant_id="t2", task_id=task_id)
        assert await tx.extend_leases([ref], owner="w", lease_until=NOW) == [False]
        assert await tx.complete_tasks([ref]) == [False]
        assert await tx.release_tasks([ref], available_at=NOW) == 0
        assert await tx.drop_run_tasks("t2", run) == 0
        assert await tx.delete_timers([TimerRef(tenant_id="t2", run_id=run, timer_id="t")]) == 0
        assert await tx.delete_run_timers("t2", run) == 0
        assert await tx.clear_waits([WaitRef(tenant_id="t2", run_id=run, step_ref="w")]) == 0
        assert await tx.clear_run_waits("t2", run) == 0

    async with store.transaction() as tx:
        # ...and t1 still has all of it
        assert len(await tx.list_api_keys("t1")) == 1
        assert (await tx.list_api_keys("t1"))[0].revoked_at is None
        stored = await tx.get_run("t1", run)
        assert stored is not None
        assert stored.lock_version == 0
        assert stored.status is RunStatus.RUNNING
        assert len(await tx.load_inbox([RunRef(tenant_id="t1", run_id=run)], now=NOW)) == 1
        task = await tx.get_task("t1", task_id)
        assert task is not None
        assert task.lease_owner == "w"
        assert len(await tx.list_run_timers("t1", run)) == 1
        assert len(await tx.list_run_waits("t1", run)) == 1
        assert len(await tx.list_child_runs("t1", run)) == 1
        assert len((await tx.list_runs("t1")).items) == 2


async def test_two_tenants_may_reuse_every_natural_key(store: Store) -> None:
    async with store.transaction() as tx:
        await populate(tx, "t1")
    async with store.transaction() as tx:
        # same slugs, hashes, idempotency keys, child keys, event ids, scopes (run ids differ)
        await populate(tx, "t2")
        assert (await tx.find_run_by_idempotency_key("t2", "idem")).id == "t2-run"  # type: ignore[union-attr]
        assert (await tx.get_workflow_version("t2", "f", 1)) is not None
        assert (await tx.get_event("t2", "ev")) is not None
