"""Pricing: second-price charges under member order and quality, the reserve on the
raw bid, weights that are all zero, and budgets checked against the bid."""

from __future__ import annotations

import datetime
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ductor_core.expressions import default_engine
from ductor_routing import (
    Budget,
    ConfigError,
    Decision,
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
)
from ductor_routing.state import CounterKey, CounterScope

NOW = datetime.datetime(2026, 11, 29, 12, tzinfo=datetime.UTC)
ENGINE = default_engine()


def router(members: list[Member], strategy: str = "auction", **options: Any) -> Router:
    pool = Pool(
        id="p",
        members=tuple(members),
        strategy=StrategySpec(name=strategy, options=options),
    )
    return Router(
        rule_set=RuleSet(default_pool="p"),
        pools=[pool],
        workers=[Worker(id=m.worker) for m in members],
        kinds={"job": KindSchema()},
        engine=ENGINE,
    )


def route(members: list[Member], strategy: str = "auction", **options: Any) -> Decision:
    return router(members, strategy, **options).route(
        Routable(id="x", kind="job"), InMemoryRoutingState(), NOW
    )


def second(members: list[Member], reserve: int = 0) -> tuple[str | None, int]:
    d = route(members, pricing="second", reserve=reserve)
    return d.worker, d.charge


# -- second price and member order ------------------------------------------------------


def test_a_winner_listed_after_the_runner_up_pays_one_micro_more() -> None:
    runner_up = Member(worker="early", bid=10_000_000)
    winner = Member(worker="late", bid=12_000_000)
    d = route([runner_up, winner], pricing="second")
    assert (d.worker, d.charge) == ("late", 10_000_001)
    assert d.explanation.note == "second price: runner-up early at 10000000 + 1 (listed earlier)"


def test_a_winner_listed_before_the_runner_up_pays_its_bid_exactly() -> None:
    winner = Member(worker="early", bid=12_000_000)
    runner_up = Member(worker="late", bid=10_000_000)
    d = route([winner, runner_up], pricing="second")
    assert (d.worker, d.charge) == ("early", 10_000_000)
    assert d.explanation.note == "second price: runner-up late at 10000000"


def test_equal_bids_go_to_the_earlier_member_at_its_own_bid() -> None:
    a = Member(worker="a", bid=10_000_000)
    b = Member(worker="b", bid=10_000_000)
    assert second([a, b]) == ("a", 10_000_000)
    assert second([b, a]) == ("b", 10_000_000)
    # first price: the same winner, same charge
    assert route([a, b]).worker == "a"


def test_the_one_micro_is_converted_at_the_winners_quality_and_rounded_up() -> None:
    runner_up = Member(worker="r", bid=10_000_000)  # effective 10_000_000
    winner = Member(worker="w", bid=6_000_000, quality=20_000)  # effective 12_000_000
    # after: effective 10_000_001 needed, 10_000_001 / 2 = 5_000_000.5 -> 5_000_001
    assert second([runner_up, winner]) == ("w", 5_000_001)
    # before: effective 10_000_000 is enough (a tie goes to it), raw 5_000_000
    assert second([winner, runner_up]) == ("w", 5_000_000)
    # the same raw 5_000_000 listed after would only tie, and lose
    tie = Member(worker="w", bid=5_000_000, quality=20_000)
    assert route([runner_up, tie]).worker == "r"


def test_alone_the_winner_pays_the_reserve() -> None:
    assert second([Member(worker="a", bid=9)], reserve=4) == ("a", 4)
    assert second([Member(worker="a", bid=9)]) == ("a", 0)
    assert route([Member(worker="a", bid=9)], pricing="second").explanation.note == (
        "second price: no runner-up"
    )


# -- the reserve applies to the raw bid -------------------------------------------------


def test_the_reserve_is_checked_on_the_raw_bid_not_the_effective_bid() -> None:
    reserve = 15_000_000
    # raw 20 >= 15 though effective is 10: accepted
    low_quality = Member(worker="lq", bid=20_000_000, quality=5_000)
    # raw 10 < 15 though effective is 20: refused
    high_quality = Member(worker="hq", bid=10_000_000, quality=20_000)
    d = route([high_quality, low_quality], reserve=reserve)
    assert (d.worker, d.charge) == ("lq", 20_000_000)
    scores = {s.worker: (s.value, s.note) for s in d.explanation.scores}
    assert scores == {"hq": (None, "below reserve"), "lq": (10_000_000, "bid 20000000")}
    assert second([high_quality, low_quality], reserve=reserve) == ("lq", reserve)
    alone = route([high_quality], reserve=reserve)
    assert alone.outcome is Outcome.UNASSIGNED
    assert alone.explanation.note == "reserve not met"


def test_the_reserve_floors_the_second_price_in_raw_micros() -> None:
    reserve = 10_000_000
    # the runner-up clears the reserve on its raw bid, but its effective bid is lower
    runner_up = Member(worker="r", bid=12_000_000, quality=5_000)  # effective 6_000_000
    winner = Member(worker="w", bid=11_000_000)  # effective 11_000_000
    # needed: 6_000_001, below the reserve, so the reserve is the price
    assert second([runner_up, winner], reserve=reserve) == ("w", reserve)
    # a runner-up at the reserve, listed earlier: one micro above it
    at_reserve = Member(worker="r", bid=reserve)
    assert second([at_reserve, winner], reserve=reserve) == ("w", reserve + 1)
    assert second([winner, at_reserve], reserve=reserve) == ("w", reserve)


members_st = st.lists(
    st.tuples(
        st.none() | st.integers(0, 60),
        st.sampled_from([0, 2_500, 5_000, 10_000, 12_000, 20_000, 30_000]),
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=200, deadline=None)
@given(members_st, st.integers(0, 40))
def test_the_second_price_is_the_least_bid_that_still_wins(
    specs: list[tuple[int | None, int]], reserve: int
) -> None:
    members = [Member(worker=f"m{i}", bid=b, quality=q) for i, (b, q) in enumerate(specs)]
    d = route(members, pricing="second", reserve=reserve)
    if d.worker is None:
        assert all(b is None or b < reserve for b, _ in specs)
        return
    winner = next(m for m in members if m.worker == d.worker)
    assert winner.bid is not None
    assert reserve <= d.charge <= winner.bid
    first = route(members, reserve=reserve)
    assert (first.worker, first.charge) == (d.worker, winner.bid)

    def with_bid(bid: int) -> list[Member]:
        return [msgspec.structs.replace(m, bid=bid) if m is winner else m for m in members]

    # bidding exactly the charge still wins; one micro less does not
    assert route(with_bid(d.charge), reserve=reserve).worker == d.worker
    if d.charge > 0:
        assert route(with_bid(d.charge - 1), reserve=reserve).worker != d.worker


def test_invalid_auction_options_are_refused() -> None:
    with pytest.raises(ConfigError):
        router([Member(worker="a", bid=1)], reserve=True)


# -- weighted random: a score for every candidate, nobody when every weight is 0 --------


def test_every_candidate_gets_a_weighted_score_and_zero_weights_are_never_picked() -> None:
    members = [
        Member(worker="a", weight=3),
        Member(worker="drained", weight=0),
        Member(worker="b", weight=1),
    ]
    r = router(members, "weighted_random")
    picks = set()
    for i in range(40):
        d = r.route(Routable(id=f"j{i}", kind="job"), InMemoryRoutingState(), NOW)
        assert [(s.worker, s.value, s.note) for s in d.explanation.scores] == [
            ("a", 0.75, "weight 3 of 4"),
            ("drained", None, "weight 0"),
            ("b", 0.25, "weight 1 of 4"),
        ]
        picks.add(d.worker)
    assert picks == {"a", "b"}


def test_when_every_weight_is_zero_nobody_is_picked_and_each_candidate_is_scored() -> None:
    members = [Member(worker="a", weight=0), Member(worker="b", weight=0)]
    d = route(members, "weighted_random")
    assert d.outcome is Outcome.UNASSIGNED
    assert d.intent is None
    assert d.explanation.candidates == ("a", "b")
    assert d.explanation.note == "every candidate has weight 0"
    assert [(s.worker, s.value, s.note) for s in d.explanation.scores] == [
        ("a", None, "weight 0"),
        ("b", None, "weight 0"),
    ]
    # the worker's own weight counts when the member sets none
    workers = [Worker(id="a", weight=0), Worker(id="b", weight=2)]
    pool = Pool(
        id="p",
        members=(Member(worker="a"), Member(worker="b")),
        strategy=StrategySpec(name="weighted_random"),
    )
    r = Router(
        rule_set=RuleSet(default_pool="p"),
        pools=[pool],
        workers=workers,
        kinds={"job": KindSchema()},
        engine=ENGINE,
    )
    d = r.route(Routable(id="x", kind="job"), InMemoryRoutingState(), NOW)
    assert d.worker == "b"
    assert [s.value for s in d.explanation.scores] == [None, 1.0]


# -- budgets are checked against the bid, the most a member can be charged --------------


def spent(state: InMemoryRoutingState, worker: str) -> int:
    key = CounterKey(
        scope=CounterScope.BUDGET, worker=worker, pool="p", window=Window.TOTAL, period="all"
    )
    return state.counter(key)


def test_a_budget_equal_to_the_bid_is_eligible_and_spends_only_the_clearing_price() -> None:
    members = [
        Member(worker="r", bid=6_000_000),
        Member(worker="w", bid=10_000_000, budget=Budget(limit=10_000_000)),
    ]
    r = router(members, pricing="second", reserve=2_000_000)
    state = InMemoryRoutingState()
    d = r.route(Routable(id="one", kind="job"), state, NOW)
    assert (d.worker, d.charge) == ("w", 6_000_001)
    assert d.intent is not None
    assert state.commit(d.intent)
    assert spent(state, "w") == 6_000_001
    # 3_999_999 left does not cover the 10_000_000 bid: excluded, and it does
    # not set the price either, so r wins alone at the reserve
    d = r.route(Routable(id="two", kind="job"), state, NOW)
    assert [(e.reason, e.workers) for e in d.explanation.excluded] == [("budget", ("w",))]
    assert (d.worker, d.charge) == ("r", 2_000_000)
    assert d.intent is not None
    assert state.commit(d.intent)
    assert spent(state, "w") == 6_000_001


def test_a_budget_below_the_bid_excludes_even_when_the_clearing_price_would_fit() -> None:
    members = [
        Member(worker="r", bid=6_000_000),
        Member(worker="w", bid=10_000_000, budget=Budget(limit=8_000_000)),
    ]
    d = route(members, pricing="second", reserve=2_000_000)
    assert d.explanation.candidates == ("r",)
    assert [(e.reason, e.detail, e.workers) for e in d.explanation.excluded] == [
        ("budget", "total", ("w",))
    ]
    assert (d.worker, d.charge) == ("r", 2_000_000)


def test_first_price_spends_the_whole_bid_then_the_member_is_out_of_budget() -> None:
    members = [
        Member(worker="w", bid=5, budget=Budget(limit=10, window=Window.DAY)),
        Member(worker="r", bid=1),
    ]
    state = InMemoryRoutingState()
    r = router(members)
    picks = []
    for i in range(3):
        d = r.route(Routable(id=f"j{i}", kind="job"), state, NOW)
        assert d.intent is not None
        assert state.commit(d.intent)
        picks.append((d.worker, d.charge))
    assert picks == [("w", 5), ("w", 5), ("r", 1)]


budget_members_st = st.lists(
    st.tuples(
        st.integers(0, 12),  # bid
        st.sampled_from([5_000, 10_000, 20_000]),  # quality
        st.none() | st.integers(0, 30),  # budget limit
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=120, deadline=None)
@given(budget_members_st, st.integers(0, 6), st.sampled_from(["first", "second"]))
def test_auction_budgets_are_checked_against_the_bid_and_never_exceeded(
    specs: list[tuple[int, int, int | None]], reserve: int, pricing: str
) -> None:
    members = [
        Member(
            worker=f"m{i}",
            bid=bid,
            quality=quality,
            budget=Budget(limit=limit) if limit is not None else None,
        )
        for i, (bid, quality, limit) in enumerate(specs)
    ]
    r = router(members, pricing=pricing, reserve=reserve)
    state = InMemoryRoutingState()
    for i in range(12):
        before = {m.worker: spent(state, m.worker) for m in members}
        d = r.route(Routable(id=f"j{i}", kind="job"), state, NOW)
        out_of_budget = {
            m.worker
            for m in members
            if m.budget is not None and before[m.worker] + (m.bid or 0) > m.budget.limit
        }
        excluded = {w for e in d.explanation.excluded if e.reason == "budget" for w in e.workers}
        assert excluded == out_of_budget
        assert set(d.explanation.candidates) == {m.worker for m in members} - out_of_budget
        if d.intent is None:
            continue
        # Only the candidates set the price: the same auction without the
        # excluded members (and without budgets) picks and charges the same.
        rest = [
            msgspec.structs.replace(m, budget=None)
            for m in members
            if m.worker not in out_of_budget
        ]
        alone = route(rest, pricing=pricing, reserve=reserve)
        assert (alone.worker, alone.charge) == (d.worker, d.charge)
        assert state.commit(d.intent)
        winner = next(m for m in members if m.worker == d.worker)
        if winner.budget is not None:  # the budget spends the charge, not the bid
            assert spent(state, winner.worker) == before[winner.worker] + d.charge
    for m in members:
        if m.budget is not None:
            assert spent(state, m.worker) <= m.budget.limit
