"""The housekeeping sweep forgets expired rows and nothing else."""

from __future__ import annotations

from datetime import timedelta

from ductor_server.storage import IdempotencyRecord

from .conftest import SUCCEEDED, TENANT, Engine, step


async def test_sweep_purges_only_what_has_expired(engine: Engine) -> None:
    await engine.publish(
        {
            "family_slug": "one",
            "steps": [
                {
                    "ref": "a",
                    "type": "STEP_TYPE_ACTION",
                    "args": {"action": "noop", "params": {"x": "1"}},
                }
            ],
        }
    )
    run = await engine.trigger("one", {})
    assert (await engine.wait_run(run.id)).status == SUCCEEDED
    await engine.services.events.send(TENANT, "ping", {}, "evt-old")
    async with engine.store.transaction() as tx:
        await tx.put_idempotency(
            IdempotencyRecord(
                tenant_id=TENANT,
                scope="POST /v1/runs",
                key="k",
                request_hash="h",
                status_code=201,
                created_at=engine.clock.now(),
            )
        )
    sweeper = engine.runtime.housekeeping
    assert await sweeper.sweep() == {"tasks": 0, "events": 0, "idempotency": 0}

    engine.clock.advance(timedelta(hours=2))  # past the done-task retention only
    assert await sweeper.sweep() == {"tasks": 1, "events": 0, "idempotency": 0}
    engine.clock.advance(timedelta(days=8))
    assert await sweeper.sweep() == {"tasks": 0, "events": 1, "idempotency": 1}
    assert sweeper.purged == {"tasks": 1, "events": 1, "idempotency": 1}

    # The run, its attempt and its history are untouched.
    view = await engine.services.runs.get(TENANT, run.id)
    assert step(view, "a").output == {"x": 1}
    async with engine.store.transaction() as tx:
        assert len(await tx.list_attempts(TENANT, run.id)) == 1
        assert await tx.get_idempotency(TENANT, "POST /v1/runs", "k") is None
    assert await engine.services.runs.history(TENANT, run.id)
    # Past its window an event id is new again.
    again = (await engine.services.events.send(TENANT, "ping", {}, "evt-old")).value
    assert not again.duplicate
