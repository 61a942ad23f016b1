"""The task queue against a plain in-memory model, over random operation sequences."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ductor_server.storage import Store, TaskRef, TaskStatus

from .builders import at, new_task


@dataclass
class Model:
    key: str
    tier: int
    available_at: datetime
    status: str = "queued"
    lease_until: datetime | None = None
    owner: str | None = None
    deliveries: int = 0
    id: str | None = None  # learned from the first lease


# (operation, a, b, c): enqueue tier=a available_at=b; lease limit=a now=b lease_for=c;
# complete/release the a-th task seen leased so far (release: available again at b).
enqueue = st.tuples(st.just("enqueue"), st.integers(0, 2), st.integers(-5, 20), st.just(0))
lease = st.tuples(
    st.just("lease"), st.integers(1, 4), st.integers(0, 40), st.sampled_from([0, 5, 15])
)
complete = st.tuples(st.just("complete"), st.integers(0, 30), st.just(0), st.just(0))
release = st.tuples(st.just("release"), st.integers(0, 30), st.integers(0, 20), st.just(0))
operations = st.lists(st.one_of(enqueue, lease, complete, release), min_size=1, max_size=25)

_RUNS = itertools.count()


def model_lease(
    tasks: list[Model], owner: str, limit: int, now: datetime, lease_for: int
) -> list[Model]:
    expired = sorted(
        (t for t in tasks if t.status == "leased" and t.lease_until and t.lease_until <= now),
        key=lambda t: (t.lease_until, t.id and int(t.id)),
    )[:limit]
    queued = sorted(
        (t for t in tasks if t.status == "queued" and t.available_at <= now),
        key=lambda t: (-t.tier, t.available_at, tasks.index(t)),
    )[: limit - len(expired)]
    for t in expired + queued:
        t.status, t.owner, t.deliveries = "leased", owner, t.deliveries + 1
        t.lease_until = now + timedelta(seconds=lease_for)
    return expired + queued


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=operations)
async def test_queue_matches_the_model(store: Store, ops: list[tuple[str, int, int, int]]) -> None:
    run_id = f"run{next(_RUNS)}"
    handler = f"action:{run_id}"  # examples share the database: lease only our own tasks
    tasks: list[Model] = []
    for step, (op, a, b, c) in enumerate(ops):
        async with store.transaction() as tx:
            if op == "enqueue":
                key = f"{run_id}:s{len(tasks)}:-1:1"
                task = new_task(
                    "t1", run_id, f"s{len(tasks)}", tier=a, available_at=at(b), handler=handler
                )
                assert task.idempotency_key == key
                assert await tx.enqueue_tasks([task]) == [True]
                tasks.append(Model(key=key, tier=a, available_at=at(b)))
            elif op == "lease":
                owner = f"w{step}"
                got = await tx.lease_tasks(
                    owner=owner,
                    limit=a,
                    lease_for=timedelta(seconds=c),
                    now=at(b),
                    handlers=[handler],
                )
                expected = model_lease(tasks, owner, a, at(b), c)
                assert sorted(t.idempotency_key for t in got) == sorted(t.key for t in expected)
                for record in got:
                    model = next(t for t in tasks if t.key == record.idempotency_key)
                    model.id = record.id
                    assert record.deliveries == model.deliveries
                    assert record.lease_owner == owner
            else:
                known = [t for t in tasks if t.id is not None]
                if not known:
                    continue
                target = known[a % len(known)]
                ref = TaskRef(tenant_id="t1", task_id=target.id or "")
                if op == "complete":
                    changed = await tx.complete_tasks([ref])
                    assert changed == [target.status != "done"]
                    target.status, target.owner, target.lease_until = "done", None, None
                else:
                    released = await tx.release_tasks([ref], available_at=at(b))
                    assert released == (1 if target.status == "leased" else 0)
                    if target.status == "leased":
                        target.status, target.owner, target.lease_until = "queued", None, None
                        target.available_at = at(b)
    async with store.transaction() as tx:
        for model in tasks:
            if model.id is None:
                continue
            stored = await tx.get_task("t1", model.id)
            assert stored is not None
            assert stored.status is TaskStatus(model.status)
            assert stored.deliveries == model.deliveries
            assert stored.lease_owner == model.owner
