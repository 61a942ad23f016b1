"""Poison-task quarantine through the whole engine, on both backends: a task whose
lease expired `poison_after` times (its workers died with it in flight) fails as
`attempt.poisoned` instead of running again; one that died fewer times runs."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from ductor_server.engine.actions import ActionCall, default_registry
from ductor_server.engine.clock import ManualClock
from ductor_server.engine.runtime import Runtime
from ductor_server.storage import Store, TaskRef

from .conftest import FAILED, SUCCEEDED, TENANT, TEST_CONFIG, Engine, step

CONFIG = dataclasses.replace(TEST_CONFIG, poison_after=3)
PAST_LEASE = CONFIG.lease_seconds + 1


def _one_action(slug: str, action: str) -> dict[str, Any]:
    return {
        "family_slug": slug,
        "steps": [{"ref": "work", "type": "STEP_TYPE_ACTION", "args": {"action": action}}],
        "edges": [],
    }


async def test_a_task_that_keeps_killing_its_worker_is_quarantined(store: Store) -> None:
    clock = ManualClock()
    actions = default_registry()
    ran: list[str] = []

    async def work(call: ActionCall) -> Any:
        ran.append(call.handler)
        return {"ran": True}

    actions.register_action("doomed", work)
    actions.register_action("lucky", work)
    # No worker yet: the "dead" workers below are lease calls whose leases lapse.
    async with Runtime.start(
        store, roles=["coordinator", "timer"], config=CONFIG, clock=clock, actions=actions
    ) as runtime:
        engine = Engine(store=store, clock=clock, actions=actions, runtime=runtime)
        await engine.publish(_one_action("doomed", "doomed"))
        await engine.publish(_one_action("lucky", "lucky"))
        doomed = await engine.trigger("doomed", {})
        lucky = await engine.trigger("lucky", {})
        leased: list[Any] = []

        async def both_leased() -> bool:
            async with store.transaction() as tx:
                leased.extend(
                    await tx.lease_tasks(
                        owner="dead-0", limit=5, lease_for=timedelta(seconds=30), now=clock.now()
                    )
                )
            return len(leased) == 2

        await engine.until(both_leased, "both tasks to be queued")
        deaths: list[dict[str, int]] = []
        for n in (1, 2):
            clock.advance(timedelta(seconds=PAST_LEASE))
            async with store.transaction() as tx:
                got = await tx.lease_tasks(
                    owner=f"dead-{n}",
                    limit=5,
                    lease_for=timedelta(seconds=CONFIG.lease_seconds),
                    now=clock.now(),
                )
                if n == 2:  # lucky's last holder stops gracefully: no death
                    [back] = [tx_task for tx_task in got if tx_task.handler == "action:lucky"]
                    await tx.release_tasks(
                        [TaskRef(tenant_id=TENANT, task_id=back.id)], available_at=clock.now()
                    )
            deaths.append({t.handler: t.deaths for t in got})
        assert deaths == [
            {"action:doomed": 1, "action:lucky": 1},
            {"action:doomed": 2, "action:lucky": 2},
        ]
        clock.advance(timedelta(seconds=PAST_LEASE))
        async with Runtime.start(
            store, roles=["worker"], config=CONFIG, clock=clock, actions=actions
        ) as workers:
            failed = await engine.wait_run(doomed.id)
            succeeded = await engine.wait_run(lucky.id)
            assert workers.workers.poisoned == 1
        history = await engine.services.runs.history(TENANT, doomed.id)

    # The doomed task (its third lease lapsed too) was not run again; the lucky
    # one, died twice and then given back cleanly, ran.
    assert ran == ["action:lucky"]
    assert succeeded.status == SUCCEEDED
    assert failed.status == FAILED
    assert failed.error is not None
    assert failed.error.code == "run.step_failed"
    assert failed.error.details == {"step_ref": "work", "error": "attempt.poisoned"}
    work_step = step(failed, "work")
    assert work_step.status.value == "STEP_STATUS_FAILED"
    assert work_step.attempt == 1
    assert work_step.error.code == "attempt.poisoned"
    assert work_step.error.retryable is False
    assert "'work'" in work_step.error.message
    assert "died 3 times" in work_step.error.message
    assert work_step.error.details == {"deaths": 3, "handler": "action:doomed"}
    assert any(
        entry.kind == "step.failed" and "attempt.poisoned" in repr(entry.data) for entry in history
    )
