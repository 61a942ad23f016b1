"""Small builders for storage test data (fixed times, no clock reads)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from ductor_core.runs import RunState, RunStatus
from ductor_server.storage import NewRun, NewTask

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    """NOW shifted by `seconds`."""
    return NOW + timedelta(seconds=seconds)


def new_run(
    tenant_id: str,
    run_id: str,
    *,
    created_at: datetime = NOW,
    status: RunStatus = RunStatus.RUNNING,
    family_slug: str = "fam",
    **extra: Any,
) -> NewRun:
    """A run to insert, with a minimal state."""
    state = RunState(run_id=run_id, status=status, created_at=created_at, input={"n": run_id})
    return NewRun(tenant_id=tenant_id, family_slug=family_slug, version=1, state=state, **extra)


def new_task(
    tenant_id: str,
    run_id: str,
    step_ref: str,
    *,
    attempt: int = 1,
    available_at: datetime = NOW,
    tier: int = 0,
    handler: str = "action:noop",
) -> NewTask:
    """A task with the conventional idempotency key."""
    return NewTask(
        tenant_id=tenant_id,
        run_id=run_id,
        step_ref=step_ref,
        attempt=attempt,
        step_type="STEP_TYPE_ACTION",
        handler=handler,
        payload={"step": step_ref},
        idempotency_key=f"{run_id}:{step_ref}:-1:{attempt}",
        tier=tier,
        available_at=available_at,
    )
