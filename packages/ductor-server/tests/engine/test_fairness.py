"""Properties of the fair scheduler: shares converge to weights, nobody with
startable work starves (no tenant, and no limit key behind another key at its
limit), a higher tier always goes first, and no limit (a tenant's, a
workflow's, a limit key's, the slot headroom) is ever exceeded, whatever the
interleaving of pushes, picks, finishes and time.

`test_redisqueue.py` runs the same scripts against the Redis queue's Lua
script and holds it to the same answers."""

from __future__ import annotations

import itertools
import re
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ductor_core.concurrency import ConcurrencyOption
from ductor_server.engine.fairness import FairPolicy, FairScheduler, TenantPolicy, Ticket

TENANTS = ["a", "b", "c", "d"]
WORKFLOWS = ["w1", "w2"]
KEYS = [None, "k1", "k2", "k3"]

weights = st.integers(min_value=1, max_value=8)


@st.composite
def tenant_policies(draw: st.DrawFn) -> TenantPolicy:
    return TenantPolicy(
        weight=draw(weights),
        max_running=draw(st.none() | st.integers(min_value=1, max_value=6)),
        rate=draw(st.none() | st.floats(min_value=0.5, max_value=20)),
        burst=draw(st.integers(min_value=1, max_value=5)),
        workflows=draw(
            st.dictionaries(st.sampled_from(WORKFLOWS), st.integers(min_value=1, max_value=3))
        ),
    )


@st.composite
def policies(draw: st.DrawFn) -> FairPolicy:
    tenants = draw(st.dictionaries(st.sampled_from(TENANTS), tenant_policies()))
    return FairPolicy(default=draw(tenant_policies()), tenants=tenants)


def _backlog(scheduler: FairScheduler, tenant: str, count: int, tier: int = 0) -> None:
    for i in range(count):
        scheduler.push(Ticket(key=f"{tenant}-{tier}-{i}", tenant=tenant, workflow="w", tier=tier))


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.sampled_from(TENANTS), weights, min_size=1),
    st.integers(min_value=1, max_value=5),
)
def test_backlogged_tenants_get_exactly_their_weight_per_round(
    shares: dict[str, int], rounds: int
) -> None:
    policy = FairPolicy(tenants={t: TenantPolicy(weight=w) for t, w in shares.items()})
    scheduler = FairScheduler(policy)
    total = sum(shares.values())
    for tenant in shares:
        _backlog(scheduler, tenant, total * rounds + 10)
    picked = Counter(t.tenant for t in scheduler.pick(total * rounds, now=0.0))
    assert picked == Counter({t: w * rounds for t, w in shares.items()})


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.sampled_from(TENANTS), weights, min_size=2),
    st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=40),
)
def test_shares_converge_whatever_the_batch_sizes(
    shares: dict[str, int], batches: list[int]
) -> None:
    # Picked in batches of any size, with each task finished at once: after n
    # picks each tenant's count is within one round of n * weight / total.
    policy = FairPolicy(tenants={t: TenantPolicy(weight=w) for t, w in shares.items()})
    scheduler = FairScheduler(policy)
    for tenant in shares:
        _backlog(scheduler, tenant, 400)
    counts: Counter[str] = Counter()
    for size in batches:
        for ticket in scheduler.pick(size, now=0.0):
            counts[ticket.tenant] += 1
            scheduler.finish(ticket.key)
    n, total = sum(counts.values()), sum(shares.values())
    for tenant, weight in shares.items():
        assert abs(counts[tenant] - n * weight / total) <= max(shares.values())


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(TENANTS), weights, min_size=2), st.data())
def test_no_tenant_with_startable_work_waits_longer_than_a_round(
    shares: dict[str, int], data: st.DataObject
) -> None:
    # A tenant arriving late behind a huge backlog is served within one round
    # (the sum of the other tenants' weights) of picks.
    policy = FairPolicy(tenants={t: TenantPolicy(weight=w) for t, w in shares.items()})
    scheduler = FairScheduler(policy)
    late, *early = list(shares)
    for tenant in early:
        _backlog(scheduler, tenant, 500)
    scheduler.pick(data.draw(st.integers(min_value=0, max_value=50)), now=0.0)
    scheduler.push(Ticket(key="late", tenant=late, workflow="w"))
    bound = sum(shares[t] for t in early) + 1
    keys = [t.key for t in scheduler.pick(bound, now=0.0)]
    assert "late" in keys


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=30), st.data())
def test_a_higher_tier_always_goes_first(tiers: list[int], data: st.DataObject) -> None:
    scheduler = FairScheduler()
    for i, tier in enumerate(tiers):
        tenant = data.draw(st.sampled_from(TENANTS))
        scheduler.push(Ticket(key=str(i), tenant=tenant, workflow="w", tier=tier, seq=i))
    order = [t.tier for t in scheduler.pick(len(tiers), now=0.0)]
    assert order == sorted(tiers, reverse=True)


Op = tuple[str, int]
ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(min_value=0, max_value=63)),
        st.tuples(st.just("pick"), st.integers(min_value=1, max_value=6)),
        st.tuples(st.just("finish"), st.integers(min_value=0, max_value=50)),
        st.tuples(st.just("requeue"), st.integers(min_value=0, max_value=50)),
        st.tuples(st.just("tick"), st.integers(min_value=1, max_value=2000)),
        st.tuples(st.just("at_once"), st.integers(min_value=0, max_value=63)),
    ),
    max_size=120,
)


KeyLimits = dict[tuple[str, str, str], tuple[int | None, float | None, int]]

key_limit_maps = st.dictionaries(
    st.tuples(st.just(""), st.sampled_from(WORKFLOWS), st.sampled_from(KEYS[1:])),
    st.tuples(
        st.none() | st.integers(min_value=1, max_value=3),
        st.none() | st.floats(min_value=0.5, max_value=10),
        st.integers(min_value=1, max_value=3),
    ),
)


def _ticket(n: int, arg: int, key_limits: KeyLimits) -> Ticket:
    """The ticket a pushed `arg` stands for: tenant, workflow, tier and limit key
    from its digits; the key's limits from `key_limits` (the same for every tenant)."""
    tenant, workflow, tier = TENANTS[arg % 4], WORKFLOWS[arg // 4 % 2], arg // 8 % 2
    limit_key = KEYS[arg // 16 % 4]
    limits = key_limits.get(("", workflow, limit_key or ""))
    if limit_key is None or limits is None:
        return Ticket(key=f"k{n}", tenant=tenant, workflow=workflow, tier=tier, seq=n)
    concurrency, rate, burst = limits
    return Ticket(
        key=f"k{n}",
        tenant=tenant,
        workflow=workflow,
        tier=tier,
        seq=n,
        limit_key=limit_key,
        key_concurrency=concurrency,
        key_rate=rate,
        key_burst=burst,
    )


@settings(max_examples=300, deadline=None)
@given(policies(), key_limit_maps, ops)
def test_limits_are_never_exceeded_and_the_queue_never_idles_needlessly(
    policy: FairPolicy, key_limits: KeyLimits, script: list[Op]
) -> None:
    scheduler = FairScheduler(policy)
    now = 0.0
    seq = itertools.count()
    starts: dict[str, list[float]] = {}
    key_starts: dict[tuple[str, str, str], list[float]] = {}
    for op, arg in script:
        if op == "push":
            scheduler.push(_ticket(next(seq), arg, key_limits))
        elif op == "at_once":
            # A run's next task, offered to start without its turn: only when
            # nothing waits, and within every limit (checked below).
            ticket = _ticket(next(seq), arg, key_limits)
            waiting = scheduler.ready_count
            if scheduler.start_at_once(ticket, now):
                assert waiting == 0
                starts.setdefault(ticket.tenant, []).append(now)
                if ticket.group is not None:
                    key_starts.setdefault(ticket.group, []).append(now)
                assert ticket in list(scheduler.running())
            else:
                assert ticket.key not in scheduler
        elif op == "pick":
            picked = scheduler.pick(arg, now=now)
            for ticket in picked:
                starts.setdefault(ticket.tenant, []).append(now)
                if ticket.group is not None:
                    key_starts.setdefault(ticket.group, []).append(now)
            if len(picked) < arg:
                # Work-conserving: whatever is still ready is held back by a limit.
                assert not any(scheduler.could_start(t, now) for t in scheduler.ready())
        elif op in ("finish", "requeue"):
            running = sorted(t.key for t in scheduler.running())
            if running:
                key = running[arg % len(running)]
                assert (scheduler.finish if op == "finish" else scheduler.requeue)(key)
        else:
            now += arg / 1000
        for tenant in TENANTS:
            tp = policy.of(tenant)
            if tp.max_running is not None:
                assert scheduler.running_of(tenant) <= tp.max_running
            for workflow, cap in tp.workflows.items():
                assert scheduler.running_of(tenant, workflow) <= cap
        for (_, workflow, limit_key), (concurrency, _, _) in key_limits.items():
            if concurrency is None:
                continue
            for tenant in TENANTS:
                assert scheduler.running_of_key(tenant, workflow, limit_key) <= concurrency
    for tenant, times in starts.items():
        tp = policy.of(tenant)
        if tp.rate is None:
            continue
        _assert_rate(times, tp.rate, tp.burst)
    for (_, workflow, limit_key), times in key_starts.items():
        _, rate, burst = key_limits[("", workflow, limit_key)]
        if rate is not None:
            _assert_rate(times, rate, burst)


key_ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(min_value=0, max_value=5)),
        st.tuples(st.just("pick"), st.integers(min_value=1, max_value=6)),
        st.tuples(st.just("finish"), st.integers(min_value=0, max_value=50)),
        st.tuples(st.just("requeue"), st.integers(min_value=0, max_value=50)),
        st.tuples(st.just("tick"), st.integers(min_value=1, max_value=2000)),
    ),
    min_size=10,
    max_size=150,
)
key_limit_pairs = st.tuples(
    st.none() | st.integers(min_value=1, max_value=3),
    st.none() | st.floats(min_value=0.5, max_value=10),
    st.integers(min_value=1, max_value=3),
)


def _key_ticket(
    n: int, arg: int, limits: dict[str, tuple[int | None, float | None, int]]
) -> Ticket:
    """Two tenants, one workflow, tasks with no limit key or with key k1 or k2."""
    tenant, limit_key = "ab"[arg % 2], [None, "k1", "k2"][arg // 2]
    if limit_key is None:
        return Ticket(key=f"t{n}", tenant=tenant, workflow="w", seq=n)
    concurrency, rate, burst = limits[limit_key]
    return Ticket(
        key=f"t{n}",
        tenant=tenant,
        workflow="w",
        seq=n,
        limit_key=limit_key,
        key_concurrency=concurrency,
        key_rate=rate,
        key_burst=burst,
    )


@settings(max_examples=300, deadline=None)
@given(key_limit_pairs, key_limit_pairs, key_ops)
def test_key_limits_are_never_exceeded_and_other_keys_never_wait_for_them(
    k1: tuple[int | None, float | None, int],
    k2: tuple[int | None, float | None, int],
    script: list[Op],
) -> None:
    limits = {"k1": k1, "k2": k2}
    scheduler = FairScheduler()
    now = 0.0
    seq = itertools.count()
    starts: dict[tuple[str, str, str], list[float]] = {}
    for op, arg in script:
        if op == "push":
            scheduler.push(_key_ticket(next(seq), arg, limits))
        elif op == "pick":
            picked = scheduler.pick(arg, now=now)
            for ticket in picked:
                if ticket.group is not None:
                    starts.setdefault(ticket.group, []).append(now)
            if len(picked) < arg:
                # Whatever is still ready is held back by its own key's limits.
                assert not any(scheduler.could_start(t, now) for t in scheduler.ready())
        elif op in ("finish", "requeue"):
            running = sorted(t.key for t in scheduler.running())
            if running:
                key = running[arg % len(running)]
                assert (scheduler.finish if op == "finish" else scheduler.requeue)(key)
        else:
            now += arg / 1000
        for tenant in "ab":
            for limit_key, (concurrency, _, _) in limits.items():
                if concurrency is not None:
                    assert scheduler.running_of_key(tenant, "w", limit_key) <= concurrency
    for (_, _, limit_key), times in starts.items():
        _, rate, burst = limits[limit_key]
        if rate is not None:
            _assert_rate(times, rate, burst)


def _assert_rate(times: list[float], rate: float, burst: int) -> None:
    for window in (0.5, 1.0, 3.0):
        for i, start in enumerate(times):
            inside = [t for t in times[i:] if t - start <= window]
            assert len(inside) <= burst + rate * window + 1e-9


def test_a_tenant_at_its_limit_leaves_the_slots_to_others() -> None:
    policy = FairPolicy(tenants={"a": TenantPolicy(weight=8, max_running=2)})
    scheduler = FairScheduler(policy)
    _backlog(scheduler, "a", 100)
    _backlog(scheduler, "b", 100)
    picked = Counter(t.tenant for t in scheduler.pick(10, now=0.0))
    assert picked == Counter({"a": 2, "b": 8})
    assert scheduler.pick(5, now=0.0)
    assert scheduler.running_of("a") == 2


def test_a_workflow_limit_lets_the_tenants_other_workflows_run() -> None:
    policy = FairPolicy(default=TenantPolicy(workflows={"slow": 1}))
    scheduler = FairScheduler(policy)
    for i in range(5):
        scheduler.push(Ticket(key=f"s{i}", tenant="a", workflow="slow", seq=i))
    for i in range(5):
        scheduler.push(Ticket(key=f"f{i}", tenant="a", workflow="fast", seq=10 + i))
    keys = [t.key for t in scheduler.pick(10, now=0.0)]
    assert keys == ["s0", "f0", "f1", "f2", "f3", "f4"]


def test_the_rate_limit_refills_with_time() -> None:
    policy = FairPolicy(default=TenantPolicy(rate=2.0, burst=3))
    scheduler = FairScheduler(policy)
    _backlog(scheduler, "a", 20)
    assert len(scheduler.pick(10, now=0.0)) == 3
    assert scheduler.pick(10, now=0.4) == []
    assert len(scheduler.pick(10, now=0.5)) == 1
    assert len(scheduler.pick(10, now=10.0)) == 3


def test_requeued_and_rebuilt_tasks_keep_their_place_and_count() -> None:
    scheduler = FairScheduler(FairPolicy(default=TenantPolicy(max_running=1)))
    for i in range(3):
        scheduler.push(Ticket(key=str(i), tenant="a", workflow="w", seq=i))
    [first] = scheduler.pick(5, now=0.0)
    assert first.key == "0"
    assert scheduler.requeue("0")
    assert [t.key for t in scheduler.pick(5, now=0.0)] == ["0"]
    assert not scheduler.push(Ticket(key="0", tenant="a", workflow="w"))
    other = FairScheduler(FairPolicy(default=TenantPolicy(max_running=1)))
    other.push(Ticket(key="1", tenant="a", workflow="w", seq=1))
    assert other.mark_running(Ticket(key="0", tenant="a", workflow="w"))
    assert other.pick(5, now=0.0) == []


@settings(max_examples=200, deadline=None)
@given(st.permutations(range(40)), st.lists(st.integers(min_value=1, max_value=7), max_size=12))
def test_one_flows_tasks_start_oldest_first_whatever_order_they_arrive_in(
    order: list[int], picks: list[int]
) -> None:
    # Tasks reach the scheduler out of order (a released task; inserts that
    # commit in another order than their ids): it starts them by seq all the
    # same, and each lands in its place however long the queue already is.
    scheduler = FairScheduler(FairPolicy())
    for seq in order:
        assert scheduler.push(Ticket(key=f"t{seq}", tenant="a", workflow="w", seq=seq))
    started: list[int] = []
    for count in [*picks, 40]:
        started.extend(t.seq for t in scheduler.pick(count, now=0.0))
    assert started == list(range(40))


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"default": {"weight": 0}}', "/default/weight"),
        ('{"tenants": {"t1": {"max_running": 0}}}', "/tenants/t1/max_running"),
        ('{"tenants": {"t1": {"rate": -1}}}', "/tenants/t1/rate"),
        ('{"tenants": {"t1": {"workflows": {"x": 0}}}}', "/tenants/t1/workflows/x"),
        ('{"tenants": {"t1": {"wieght": 2}}}', "wieght"),
        ("{", "not JSON"),
    ],
)
def test_a_bad_policy_is_refused_saying_where(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        FairPolicy.from_json(text)


def test_a_policy_decodes() -> None:
    policy = FairPolicy.from_json(
        '{"default": {"max_running": 32}, "tenants": {"big": {"weight": 4, "rate": 100,'
        ' "burst": 200, "workflows": {"export": 2}}}}'
    )
    assert policy.of("big").weight == 4
    assert policy.of("big").workflows == {"export": 2}
    assert policy.of("other").max_running == 32


def test_slow_tasks_of_one_tenant_leave_the_freed_slots_to_a_waiting_tenant() -> None:
    scheduler = FairScheduler()
    _backlog(scheduler, "a", 500)
    first = scheduler.pick(64, now=0.0, capacity=64)
    # Alone, a tenant may use every slot but the headroom (an eighth, 8 of 64)...
    assert len(first) == 56 == scheduler.tenant_cap(64)
    _backlog(scheduler, "b", 100)
    # ...which a tenant arriving while those tasks still run gets at once.
    assert Counter(t.tenant for t in scheduler.pick(8, now=0.0, capacity=64)) == {"b": 8}
    for ticket in first[:40]:
        scheduler.finish(ticket.key)
    # Forty slots free up: both are below their share (32) and take turns until
    # each has it; b needs 24 more, a 16.
    picked = Counter(t.tenant for t in scheduler.pick(40, now=0.0, capacity=64))
    assert picked == Counter({"b": 24, "a": 16})
    assert scheduler.running_of("b") == 32
    assert scheduler.running_of("a") == 32


def test_no_headroom_lets_one_tenant_take_every_slot() -> None:
    scheduler = FairScheduler(FairPolicy(headroom=0))
    _backlog(scheduler, "a", 100)
    assert len(scheduler.pick(64, now=0.0, capacity=64)) == 64


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(TENANTS), weights, min_size=2), ops)
def test_a_tenant_at_its_share_of_slots_never_takes_one_another_tenant_could_use(
    shares: dict[str, int], script: list[Op]
) -> None:
    capacity = 8
    policy = FairPolicy(tenants={t: TenantPolicy(weight=w) for t, w in shares.items()})
    scheduler = FairScheduler(policy)
    seq = itertools.count()
    names = sorted(shares)
    for op, arg in script:
        if op == "push":
            n = next(seq)
            tenant = names[arg % len(names)]
            scheduler.push(Ticket(key=f"k{n}", tenant=tenant, workflow="w", seq=n))
        elif op == "pick":
            for _ in range(arg):
                if len(list(scheduler.running())) >= capacity:
                    break
                under = {
                    t
                    for t in names
                    if scheduler.has_ready(t) and not scheduler.over_share(t, capacity)
                }
                over = {t: scheduler.over_share(t, capacity) for t in names}
                got = scheduler.pick(1, now=0.0, capacity=capacity)
                if not got:
                    # Nothing left, or only tenants at the headroom's cap.
                    cap = scheduler.tenant_cap(capacity)
                    assert all(scheduler.running_of(t.tenant) >= cap for t in scheduler.ready())
                    break
                assert scheduler.running_of(got[0].tenant) <= scheduler.tenant_cap(capacity)
                if over[got[0].tenant]:
                    assert not under, f"{got[0].tenant} over its share while {under} waited"
        elif op in ("finish", "requeue"):
            running = sorted(t.key for t in scheduler.running())
            if running:
                scheduler.finish(running[arg % len(running)])


def test_the_policy_and_the_option_in_the_architecture_doc_decode() -> None:
    doc = (Path(__file__).resolve().parents[4] / "docs" / "architecture.md").read_text()
    section = doc.split("## The task queue", 1)[1].split("\n## ", 1)[0]
    option, policy_text = re.findall(r"```json\n(.*?)\n *```", section, re.DOTALL)
    policy = FairPolicy.from_json(policy_text)
    assert policy.of("t_big").workflows == {"nightly-export": 2}
    assert policy.of("anyone").max_running == 48
    assert policy.headroom == 0.125
    concurrency = msgspec.json.decode(option, type=ConcurrencyOption)
    assert concurrency.problems() == []
    assert concurrency.per_second == 100 / 60


def _keyed(key: str, tenant: str, limit_key: str, seq: int, **limits: Any) -> Ticket:
    return Ticket(key=key, tenant=tenant, workflow="w", seq=seq, limit_key=limit_key, **limits)


def test_a_key_at_its_limit_never_holds_back_another_key() -> None:
    scheduler = FairScheduler()
    for i in range(500):
        scheduler.push(_keyed(f"hot{i}", "a", "hot", i, key_concurrency=2))
    scheduler.push(_keyed("cold", "a", "cold", 1000, key_concurrency=2))
    keys = [t.key for t in scheduler.pick(10, now=0.0)]
    # The hot key's two slots, then the cold key (behind 498 older hot tasks).
    assert keys == ["hot0", "hot1", "cold"]
    assert scheduler.running_of_key("a", "w", "hot") == 2
    scheduler.finish("hot0")
    assert [t.key for t in scheduler.pick(10, now=0.0)] == ["hot2"]


def test_a_key_rate_spaces_its_starts_and_wakes_when_one_can_start() -> None:
    scheduler = FairScheduler()
    for i in range(10):
        scheduler.push(_keyed(f"r{i}", "a", "k", i, key_rate=2.0, key_burst=2))
    scheduler.push(_keyed("other", "a", "other", 99))
    assert [t.key for t in scheduler.pick(10, now=0.0)] == ["r0", "r1", "other"]
    assert scheduler.next_start_at(0.0) == 0.5
    assert scheduler.pick(10, now=0.4) == []
    assert [t.key for t in scheduler.pick(10, now=0.5)] == ["r2"]


def test_limit_keys_are_counted_per_tenant_and_workflow() -> None:
    scheduler = FairScheduler()
    for tenant in ("a", "b"):
        for i in range(3):
            scheduler.push(_keyed(f"{tenant}{i}", tenant, "same", i, key_concurrency=1))
    picked = Counter(t.tenant for t in scheduler.pick(10, now=0.0))
    assert picked == Counter({"a": 1, "b": 1})


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(st.sampled_from(TENANTS), weights, min_size=2),
    st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=30),
)
def test_shares_converge_when_tasks_spread_over_limited_keys(
    shares: dict[str, int], batches: list[int]
) -> None:
    # Every tenant's tasks spread over ten keys limited to one task at a time:
    # finishing each at once, the keys never hold a tenant back, and the shares
    # are those of the weights.
    policy = FairPolicy(tenants={t: TenantPolicy(weight=w) for t, w in shares.items()})
    scheduler = FairScheduler(policy)
    for tenant in shares:
        for i in range(300):
            scheduler.push(_keyed(f"{tenant}{i}", tenant, f"key{i % 10}", i, key_concurrency=1))
    counts: Counter[str] = Counter()
    for size in batches:
        for ticket in scheduler.pick(size, now=0.0):
            counts[ticket.tenant] += 1
            scheduler.finish(ticket.key)
    n, total = sum(counts.values()), sum(shares.values())
    for tenant, weight in shares.items():
        assert abs(counts[tenant] - n * weight / total) <= max(shares.values())


def test_a_tenant_policy_tier_moves_its_ready_tasks_at_once() -> None:
    scheduler = FairScheduler()
    _backlog(scheduler, "a", 5)
    _backlog(scheduler, "b", 5)
    scheduler.set_policy(FairPolicy(tenants={"b": TenantPolicy(tier=3)}))
    assert [t.tenant for t in scheduler.pick(5, now=0.0)] == ["b"] * 5
    # Back to the task's own tier: a and b take turns again.
    _backlog(scheduler, "b", 4, tier=1)
    scheduler.set_policy(FairPolicy())
    assert [t.tenant for t in scheduler.pick(4, now=0.0)] == ["b"] * 4  # tier 1 first
    assert Counter(t.tenant for t in scheduler.pick(2, now=0.0)) == {"a": 2}


@pytest.mark.parametrize(
    ("policy", "pointer"),
    [
        (FairPolicy(default=TenantPolicy(tier=10)), "/default/tier"),
        (FairPolicy(tenants={"a/b": TenantPolicy(weight=1001)}), "/tenants/a~1b/weight"),
        (FairPolicy(default=TenantPolicy(rate=float("inf"))), "/default/rate"),
        (FairPolicy(default=TenantPolicy(workflows={"x": 0})), "/default/workflows/x"),
        (FairPolicy(headroom=0.9), "/headroom"),
    ],
)
def test_policy_problems_name_their_place(policy: FairPolicy, pointer: str) -> None:
    assert [where for where, _ in policy.problems()] == [pointer]


def test_a_task_starts_at_once_only_when_nothing_waits_and_within_its_limits() -> None:
    policy = FairPolicy(default=TenantPolicy(max_running=2, rate=10.0, burst=2), headroom=0.25)
    scheduler = FairScheduler(policy)
    assert scheduler.start_at_once(Ticket(key="n1", tenant="a", workflow="w"), 0.0, capacity=8)
    assert scheduler.running_of("a") == 1
    # Another tenant's task waits: the next one of "a" waits its turn too.
    scheduler.push(Ticket(key="b1", tenant="b", workflow="w"))
    assert not scheduler.start_at_once(Ticket(key="n2", tenant="a", workflow="w"), 0.0)
    assert [t.key for t in scheduler.pick(1, now=0.0)] == ["b1"]
    assert scheduler.start_at_once(Ticket(key="n2", tenant="a", workflow="w"), 0.0, capacity=8)
    # max_running 2: a third would pass the tenant's limit.
    assert not scheduler.start_at_once(Ticket(key="n3", tenant="a", workflow="w"), 0.0)
    scheduler.finish("n1")
    scheduler.finish("n2")
    # The rate's burst of 2 is spent; at 10/s one more token comes after 0.1 s.
    assert not scheduler.start_at_once(Ticket(key="n3", tenant="a", workflow="w"), 0.05)
    assert scheduler.start_at_once(Ticket(key="n3", tenant="a", workflow="w"), 0.1)
    # The slot shares: with "b" running, "a" holds its half of 2 slots already.
    assert not scheduler.start_at_once(Ticket(key="n4", tenant="a", workflow="w"), 5.0, capacity=2)
