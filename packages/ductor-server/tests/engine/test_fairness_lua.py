"""The Redis queue's Lua script against the pure scheduler: the same scripts of
pushes, picks, finishes, requeues and time, with random policies, limit keys
and slot capacities, give the same picks in the same order (so every property
`test_fairness.py` proves of `engine.fairness` holds of the script too).

A redis-server of this module's own; each example uses keys of its own."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis import Redis

from ductor_server.engine.fairness import FairPolicy, FairScheduler, TenantPolicy, Ticket
from ductor_server.engine.redisqueue import (
    _END,
    _PICK,
    _PUSH,
    HEAD_SCAN,
    policy_fields,
    policy_version,
    task_meta,
)
from ductor_server.storage import ReadyTask, RunLimits

from .conftest import OwnRedis
from .test_fairness import (
    KeyLimits,
    Op,
    _key_ticket,
    _ticket,
    key_limit_maps,
    key_limit_pairs,
    key_ops,
    ops,
    policies,
    tenant_policies,
)

_examples = itertools.count()


@pytest.fixture(scope="module")
def lua(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Redis]:
    server = OwnRedis(Path(tmp_path_factory.mktemp("redis")))
    server.start()
    client = Redis(port=server.port, socket_connect_timeout=1)
    try:
        yield client
    finally:
        client.close()
        server.stop()


def _row(ticket: Ticket) -> ReadyTask:
    limits = None
    if ticket.limit_key is not None:
        limits = RunLimits(
            key=ticket.limit_key,
            concurrency=ticket.key_concurrency,
            rate=ticket.key_rate,
            burst=ticket.key_burst,
        )
    return ReadyTask(
        id=ticket.key,
        tenant_id=ticket.tenant,
        workflow=ticket.workflow,
        tier=ticket.tier,
        limits=limits,
    )


@settings(max_examples=100, deadline=None)
@given(
    policies(),
    key_limit_maps,
    ops,
    st.none() | st.integers(min_value=2, max_value=10),
)
def test_the_lua_script_picks_what_the_scheduler_picks(
    lua: Redis,
    policy: FairPolicy,
    key_limits: KeyLimits,
    script: list[Op],
    capacity: int | None,
) -> None:
    _compare(lua, policy, script, capacity, lambda n, arg: _ticket(n, arg, key_limits))


@settings(max_examples=150, deadline=None)
@given(
    tenant_policies(),
    key_limit_pairs,
    key_limit_pairs,
    key_ops,
    st.none() | st.integers(min_value=2, max_value=10),
)
def test_the_lua_script_holds_limit_keys_as_the_scheduler_does(
    lua: Redis,
    tenant_a: TenantPolicy,
    k1: tuple[int | None, float | None, int],
    k2: tuple[int | None, float | None, int],
    script: list[Op],
    capacity: int | None,
) -> None:
    # Two tenants, one with a policy of its own, tasks over two limited keys.
    policy = FairPolicy(tenants={"a": tenant_a})
    limits = {"k1": k1, "k2": k2}
    _compare(lua, policy, script, capacity, lambda n, arg: _key_ticket(n, arg, limits))


def _compare(
    lua: Redis,
    policy: FairPolicy,
    script: list[Op],
    capacity: int | None,
    make: Callable[[int, int], Ticket],
) -> None:
    prefix = f"ex{next(_examples)}:"
    push, end, pick = (lua.register_script(s) for s in (_PUSH, _END, _PICK))
    version = policy_version(policy)
    lua.hset(f"{prefix}policy:{version}", mapping=policy_fields(policy))  # type: ignore[arg-type]
    scheduler = FairScheduler(policy)
    now = 0.0
    ids = itertools.count(1)  # task ids are positive integers, as in the store
    lua.set(prefix + "built", 0)  # as if the store's leases (none) were counted
    for op, arg in script:
        if op == "push":
            n = next(ids)
            ticket = dataclasses.replace(make(n, arg), key=str(n), seq=n)
            scheduler.push(ticket)
            push(args=[prefix, ticket.key, task_meta(_row(ticket), policy)])
        elif op == "pick":
            expected = [t.key for t in scheduler.pick(arg, now=now, capacity=capacity)]
            flat = pick(
                args=[prefix, arg, repr(now), capacity or 0, version, HEAD_SCAN, "owner", 0]
            )
            assert [flat[i].decode() for i in range(0, len(flat), 2)] == expected
        elif op in ("finish", "requeue"):
            running = sorted(t.key for t in scheduler.running())
            if running:
                key = running[arg % len(running)]
                (scheduler.finish if op == "finish" else scheduler.requeue)(key)
                assert end(args=[prefix, op, repr(now), key]) == 1
        else:
            now += arg / 1000
    lua.delete(*lua.keys(prefix + "*") or [prefix])
