"""Property tests: caps hold, weighted shares converge, round robin is fair under churn,
shadows never change the live outcome, and the filter index agrees with the predicates."""

from __future__ import annotations

import datetime
import itertools
from collections import Counter
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from ductor_core.expressions import default_engine
from ductor_routing import (
    AssignConflict,
    Budget,
    Cap,
    Filter,
    FilterOp,
    InMemoryRoutingState,
    KindSchema,
    Member,
    Outcome,
    Pool,
    Routable,
    Router,
    RuleSet,
    StrategySpec,
    Window,
    Worker,
    period_of,
)
from ductor_routing.filters import AttributeIndex, compile_filter, index_values

START = datetime.datetime(2026, 11, 29, 22, 0, tzinfo=datetime.UTC)
ENGINE = default_engine()
STRATEGIES = [
    StrategySpec(name="round_robin"),
    StrategySpec(name="weighted_random"),
    StrategySpec(name="least_loaded"),
    StrategySpec(name="longest_idle"),
    StrategySpec(name="waterfall"),
    StrategySpec(name="skills_match"),
    StrategySpec(name="auction", options={"reserve": 2}),
    StrategySpec(name="auction", options={"pricing": "second"}),
    StrategySpec(name="auction", options={"pricing": "second", "reserve": 3}),
    StrategySpec(name="sticky", options={"key": "customer"}),
]


def router(pool: Pool, workers: list[Worker], seed: int = 0) -> Router:
    return Router(
        rule_set=RuleSet(default_pool=pool.id),
        pools=[pool],
        workers=workers,
        kinds={"job": KindSchema()},
        engine=ENGINE,
        seed=seed,
    )


member_st = st.builds(
    lambda i, caps, budget, bid, prio, weight, state: Member(
        worker=f"w{i}",
        caps=caps,
        budget=budget,
        bid=bid,
        priority=prio,
        weight=weight,
        filters=(Filter(attribute="state", op=FilterOp.IN, values=state),) if state else (),
    ),
    st.just(0),
    st.lists(
        st.builds(Cap, window=st.sampled_from([Window.HOUR, Window.DAY]), limit=st.integers(0, 4)),
        max_size=2,
    ).map(tuple),
    st.none() | st.builds(Budget, limit=st.integers(0, 30), window=st.sampled_from(list(Window))),
    st.none() | st.integers(0, 9),
    st.integers(0, 3),
    st.none() | st.integers(0, 5),
    st.none() | st.sampled_from([("A",), ("A", "B"), ("B",)]),
)


@st.composite
def pools(draw: st.DrawFn, *, shadows: bool = False) -> tuple[Pool, list[Worker]]:
    raw = draw(st.lists(member_st, min_size=1, max_size=6))
    members = tuple(msgspec.structs.replace(m, worker=f"w{i}") for i, m in enumerate(raw))
    workers = [
        Worker(
            id=m.worker,
            capacity=draw(st.sampled_from([{}, {"default": 2}, {"default": 5}])),
            skills=draw(st.sampled_from([{}, {"x": 50}, {"x": 90, "y": 10}])),
            weight=draw(st.integers(0, 4)),
        )
        for m in members
    ]
    strategy = draw(st.sampled_from(STRATEGIES))
    shadow_specs = (
        tuple(
            msgspec.structs.replace(spec, label=f"shadow{i}")
            for i, spec in enumerate(draw(st.lists(st.sampled_from(STRATEGIES), max_size=3)))
        )
        if shadows
        else ()
    )
    return Pool(id="p", members=members, strategy=strategy, shadows=shadow_specs), workers


events_st = st.lists(
    st.tuples(
        st.integers(0, 3 * 3600),  # seconds after START: crosses hour and day boundaries
        st.sampled_from(["A", "B", "C"]),
        st.sampled_from(["c1", "c2", "c3"]),
        st.none() | st.integers(0, 20),
    ),
    min_size=1,
    max_size=40,
).map(lambda evs: sorted(evs, key=lambda e: e[0]))


def routable(i: int, state: str, customer: str, price: int | None) -> Routable:
    attrs: dict[str, Any] = {"state": state, "customer": customer, "skills": ["x"]}
    return Routable(id=f"r{i}", kind="job", attributes=attrs, price=price)


@settings(max_examples=60, deadline=None)
@given(pools(), events_st, st.integers(1, 4))
def test_caps_and_budgets_are_never_exceeded(
    setup: tuple[Pool, list[Worker]], events: list[tuple[int, str, str, int | None]], batch: int
) -> None:
    pool, workers = setup
    r = router(pool, workers)
    by_worker = {m.worker: m for m in pool.members}
    state = InMemoryRoutingState()
    assigned: list[tuple[str, datetime.datetime, int]] = []
    # Route `batch` events against the same state before committing any, as
    # concurrent deciders would; commits that no longer fit must be refused.
    for start in range(0, len(events), batch):
        decisions = []
        for i, (offset, st_, customer, price) in enumerate(events[start : start + batch]):
            now = START + datetime.timedelta(seconds=offset)
            d = r.route(routable(start + i, st_, customer, price), state, now)
            if d.intent is not None:
                # Budgets were checked against the most the member can be
                # charged (its bid, else the price); no strategy charges more.
                m = by_worker[d.intent.worker]
                most = m.bid if m.bid is not None else (price if price is not None else 0)
                assert 0 <= d.intent.charge <= most
            decisions.append((now, d))
        for j, (now, d) in enumerate(decisions):
            if d.intent is None:
                continue
            try:
                state.commit(d.intent)
            except AssignConflict:
                # Only a decision routed on stale state may no longer fit: the
                # first of a batch saw the state it commits to, so the pipeline
                # itself must have kept it within every cap and budget.
                assert j > 0
                continue
            assigned.append((d.intent.worker, now, d.intent.charge))
    for m in pool.members:
        mine = [(now, charge) for w, now, charge in assigned if w == m.worker]
        for cap in m.caps:
            per_period = Counter(period_of(cap.window, now) for now, _ in mine)
            assert all(n <= cap.limit for n in per_period.values())
        if m.budget is not None:
            spent: Counter[str] = Counter()
            for now, charge in mine:
                spent[period_of(m.budget.window, now)] += charge
            assert all(v <= m.budget.limit for v in spent.values())


@settings(max_examples=8, deadline=None)
@given(st.lists(st.integers(1, 10), min_size=2, max_size=5), st.integers(0, 2**32))
def test_weighted_shares_converge_to_weights(weights: list[int], seed: int) -> None:
    workers = [Worker(id=f"w{i}", weight=w) for i, w in enumerate(weights)]
    pool = Pool(
        id="p",
        members=tuple(Member(worker=w.id) for w in workers),
        strategy=StrategySpec(name="weighted_random"),
    )
    r = router(pool, workers, seed=seed)
    state = InMemoryRoutingState()  # weighted random reads no state
    n = 4_000
    counts = Counter(
        r.route(Routable(id=f"r{i}", kind="job"), state, START).worker for i in range(n)
    )
    total = sum(weights)
    for w, weight in zip(workers, weights, strict=True):
        assert abs(counts[w.id] / n - weight / total) < 0.035, (counts, weights)


churn_st = st.lists(
    st.one_of(
        st.tuples(st.just("route"), st.integers(1, 4)),
        st.tuples(st.just("join"), st.integers(0, 7)),
        st.tuples(st.just("leave"), st.integers(0, 7)),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=80, deadline=None)
@given(st.sets(st.integers(0, 7), min_size=1), churn_st)
def test_round_robin_is_fair_under_member_churn(initial: set[int], ops: list[Any]) -> None:
    all_workers = [Worker(id=f"w{i}") for i in range(8)]
    present = set(initial)
    state = InMemoryRoutingState()
    log: list[tuple[frozenset[int], str]] = []  # (members present, pick)
    n = 0
    for op, arg in ops:
        if op == "join":
            present.add(arg)
            continue
        if op == "leave":
            if len(present) > 1:
                present.discard(arg)
            continue
        pool = Pool(
            id="p",
            members=tuple(Member(worker=f"w{i}") for i in sorted(present, reverse=True)),
            strategy=StrategySpec(name="round_robin"),
        )
        r = router(pool, all_workers)
        for _ in range(arg):
            d = r.route(Routable(id=f"r{n}", kind="job"), state, START)
            n += 1
            assert d.intent is not None
            state.commit(d.intent)
            log.append((frozenset(present), d.worker or ""))
    # While two members are both present, their picks alternate: neither is
    # picked twice before the other is picked once.
    for a, b in itertools.combinations(range(8), 2):
        wa, wb = f"w{a}", f"w{b}"
        last = None
        for members, pick in log:
            if a not in members or b not in members:
                last = None
                continue
            if pick in (wa, wb):
                assert pick != last, (wa, wb, log)
                last = pick


@settings(max_examples=60, deadline=None)
@given(pools(shadows=True), events_st, st.booleans())
def test_shadows_never_change_the_live_outcome(
    setup: tuple[Pool, list[Worker]],
    events: list[tuple[int, str, str, int | None]],
    commit_shadow_marks: bool,
) -> None:
    pool, workers = setup
    live_only = router(msgspec.structs.replace(pool, shadows=()), workers, seed=5)
    shadowed = router(pool, workers, seed=5)
    s1, s2 = InMemoryRoutingState(), InMemoryRoutingState()
    for i, (offset, st_, customer, price) in enumerate(events):
        now = START + datetime.timedelta(seconds=offset)
        item = routable(i, st_, customer, price)
        d1 = live_only.route(item, s1, now)
        d2 = shadowed.route(item, s2, now)
        assert len(d2.explanation.shadows) == len(pool.shadows)
        assert (d1.outcome, d1.worker, d1.charge) == (d2.outcome, d2.worker, d2.charge)
        assert (
            msgspec.structs.replace(
                d2.explanation, shadows=(), config_hash=d1.explanation.config_hash
            )
            == d1.explanation
        )
        if d1.intent is not None:
            assert d2.intent is not None
            assert msgspec.structs.replace(d2.intent, shadow_marks=()) == d1.intent
            s1.commit(d1.intent)
            s2.commit(d2.intent, shadow_marks=commit_shadow_marks)
        else:
            assert d1.outcome in (Outcome.UNASSIGNED, Outcome.INVALID)
    assert s1.counters == s2.counters
    live_marks = {k: v for k, v in s2.marks.items() if "#shadow:" not in k[1]}
    assert live_marks == s1.marks


scalar_st = st.one_of(st.sampled_from(["a", "b", "c"]), st.integers(0, 3), st.booleans())


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.lists(
            st.builds(
                Filter,
                attribute=st.sampled_from(["k", "j"]),
                op=st.sampled_from([FilterOp.EQ, FilterOp.IN]),
                value=scalar_st,
                values=st.lists(scalar_st, max_size=3).map(tuple),
            ),
            max_size=2,
        ),
        min_size=1,
        max_size=6,
    ),
    st.dictionaries(st.sampled_from(["k", "j"]), scalar_st),
)
def test_index_agrees_with_the_predicates(
    filters_per_item: list[list[Filter]], attrs: dict[str, Any]
) -> None:
    for attribute in ("k", "j"):
        accepts: dict[int, Any] = {}
        for p, filters in enumerate(filters_per_item):
            keys = None
            for f in filters:
                if f.attribute == attribute:
                    values = frozenset(index_values(f))
                    keys = values if keys is None else keys & values
            accepts[p] = keys
        allowed, kept, dropped, _ = AttributeIndex(attribute, accepts).lookup(attrs)
        expected = {
            p
            for p, filters in enumerate(filters_per_item)
            if all(compile_filter(f)(attrs) for f in filters if f.attribute == attribute)
        }
        assert set(kept) == expected
        assert set(dropped) == set(range(len(filters_per_item))) - expected
        assert {p for p in range(len(filters_per_item)) if p in allowed} == expected


def _valid_filter(attribute: str, op: FilterOp, value: Any, values: tuple[Any, ...]) -> Filter:
    """A filter as the configuration check accepts it: `in` with `values` only,
    the others with `value` only, an ordering against a number or a string."""
    if op is FilterOp.IN:
        return Filter(attribute=attribute, op=op, values=values)
    if op is FilterOp.GTE and (isinstance(value, bool) or not isinstance(value, int | float | str)):
        value = 0
    return Filter(attribute=attribute, op=op, value=value)


rule_filter_st = st.builds(
    _valid_filter,
    attribute=st.sampled_from(["k", "j"]),
    op=st.sampled_from([FilterOp.EQ, FilterOp.IN, FilterOp.NE, FilterOp.GTE]),
    value=scalar_st,
    values=st.lists(scalar_st, max_size=3).map(tuple),
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.lists(rule_filter_st, max_size=3)),
        min_size=1,
        max_size=8,
    ),
    st.dictionaries(st.sampled_from(["k", "j"]), scalar_st),
    st.booleans(),
)
def test_indexed_rule_matching_equals_trying_every_rule_in_order(
    specs: list[tuple[int, list[Filter]]], attrs: dict[str, Any], has_default: bool
) -> None:
    from ductor_routing import Rule
    from ductor_routing.filters import describe_filter

    rules = tuple(
        Rule(id=f"r{i}", pool="p", priority=priority, match=tuple(filters))
        for i, (priority, filters) in enumerate(specs)
    )
    r = Router(
        rule_set=RuleSet(rules=rules, default_pool="p" if has_default else None),
        pools=[Pool(id="p", members=(Member(worker="w"),))],
        workers=[Worker(id="w")],
        kinds={"job": KindSchema()},
        engine=ENGINE,
    )
    d = r.route(Routable(id="x", kind="job", attributes=attrs), InMemoryRoutingState(), START)
    ordered = sorted(enumerate(rules), key=lambda item: (item[1].priority, item[0]))
    expected_rule = None
    missed = []
    for _, rule in ordered:
        if all(compile_filter(f)(attrs) for f in rule.match):
            expected_rule = rule.id
            break
        missed.append(rule)
    if expected_rule is None and has_default:
        expected_rule = "default"
    assert d.explanation.rule == expected_rule
    traces = d.explanation.rules_not_matched
    assert [t.rule for t in traces] == [rule.id for rule in missed]
    for trace, rule in zip(traces, missed, strict=True):
        failing = {describe_filter(f) for f in rule.match if not compile_filter(f)(attrs)}
        assert trace.reason == "match"
        assert trace.detail in failing


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.lists(rule_filter_st, max_size=3), min_size=1, max_size=7),
    st.lists(st.booleans(), min_size=7, max_size=7),
    st.dictionaries(st.sampled_from(["k", "j"]), scalar_st),
)
def test_member_eligibility_equals_checking_every_member(
    member_filters: list[list[Filter]], available: list[bool], attrs: dict[str, Any]
) -> None:
    from ductor_routing import Availability

    workers = [
        Worker(
            id=f"w{i}",
            availability=Availability.AVAILABLE if available[i] else Availability.AWAY,
        )
        for i in range(len(member_filters))
    ]
    members = tuple(
        Member(worker=f"w{i}", filters=tuple(filters)) for i, filters in enumerate(member_filters)
    )
    r = router(Pool(id="p", members=members), workers)
    d = r.route(Routable(id="x", kind="job", attributes=attrs), InMemoryRoutingState(), START)
    expected = [
        f"w{i}"
        for i, filters in enumerate(member_filters)
        if available[i] and all(compile_filter(f)(attrs) for f in filters)
    ]
    assert list(d.explanation.candidates) == expected
    excluded = {w: (e.reason, e.detail) for e in d.explanation.excluded for w in e.workers}
    assert set(excluded) | set(expected) == {w.id for w in workers}
    for i, filters in enumerate(member_filters):
        wid = f"w{i}"
        if not available[i]:
            assert excluded[wid] == ("unavailable", "")
        elif wid not in expected:
            reason, attribute = excluded[wid]
            assert reason == "filter"
            assert any(f.attribute == attribute and not compile_filter(f)(attrs) for f in filters)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=5),  # per-member hourly caps
    st.lists(
        st.tuples(st.sampled_from(["k1", "k2", "k3", "k4"]), st.integers(0, 7200)), max_size=40
    ),
)
def test_sticky_keeps_each_key_with_its_worker_while_that_worker_is_eligible(
    caps: list[int], events: list[tuple[str, int]]
) -> None:
    workers = [Worker(id=f"w{i}") for i in range(len(caps))]
    pool = Pool(
        id="p",
        members=tuple(
            Member(worker=w.id, caps=(Cap(window=Window.HOUR, limit=c),))
            for w, c in zip(workers, caps, strict=True)
        ),
        strategy=StrategySpec(name="sticky", options={"key": "customer"}),
    )
    r = router(pool, workers)
    state = InMemoryRoutingState()
    bound: dict[str, str] = {}
    for i, (key, offset) in enumerate(sorted(events, key=lambda e: e[1])):
        item = Routable(id=f"r{i}", kind="job", attributes={"customer": key})
        d = r.route(item, state, START + datetime.timedelta(seconds=offset))
        previous = bound.get(key)
        if d.worker is None:
            assert d.explanation.candidates == ()
            continue
        if previous is not None and d.worker != previous:
            # only allowed when the bound worker could not take it
            assert previous not in d.explanation.candidates
        assert d.intent is not None
        state.commit(d.intent)
        bound[key] = d.worker
