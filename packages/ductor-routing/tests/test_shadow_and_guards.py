from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

import pytest

from ductor_core.expressions import default_engine
from ductor_routing import (
    Budget,
    Cap,
    ConfigError,
    InMemoryRoutingState,
    KindSchema,
    Member,
    Outcome,
    Pool,
    Routable,
    Router,
    RoutingError,
    Rule,
    RuleSet,
    Selection,
    SelectionContext,
    StrategyRegistry,
    StrategySpec,
    Worker,
    shadow_report,
)

NOW = datetime.datetime(2026, 11, 29, 9, 15, tzinfo=datetime.UTC)


def build(pool: Pool, workers: list[Worker], **kwargs: Any) -> Router:
    return Router(
        rule_set=kwargs.pop("rule_set", RuleSet(default_pool=pool.id)),
        pools=[pool],
        workers=workers,
        kinds={"job": KindSchema()},
        engine=default_engine(),
        **kwargs,
    )


def test_shadow_report_counts_agreement_distribution_and_differences() -> None:
    workers = [Worker(id="a"), Worker(id="b"), Worker(id="c")]
    pool = Pool(
        id="p",
        members=tuple(Member(worker=w.id, priority=i) for i, w in enumerate(workers)),
        strategy=StrategySpec(name="round_robin"),
        shadows=(StrategySpec(name="waterfall"),),
    )
    r = build(pool, workers)
    state = InMemoryRoutingState()
    decisions = []
    for i in range(6):
        d = r.route(Routable(id=f"j{i}", kind="job"), state, NOW)
        assert d.intent is not None
        state.commit(d.intent)
        decisions.append(d)
    (report,) = shadow_report(decisions, max_differences=3)
    assert (report.pool, report.strategy, report.live_strategy) == ("p", "waterfall", "round_robin")
    assert report.decisions == 6
    # round robin goes a, b, c, a, b, c; waterfall always says a
    assert report.agreements == 2
    assert report.agreement_rate == pytest.approx(2 / 6)
    assert report.live_distribution == {"a": 2, "b": 2, "c": 2}
    assert report.shadow_distribution == {"a": 6}
    assert [(x.routable_id, x.live, x.shadow) for x in report.differences] == [
        ("j1", "b", "a"),
        ("j2", "c", "a"),
        ("j4", "b", "a"),
    ]
    assert shadow_report([]) == ()


def test_negative_money_and_limits_are_config_errors() -> None:
    pool = Pool(
        id="p",
        members=(
            Member(worker="a", bid=-1, caps=(Cap(window="day", limit=-2),)),  # type: ignore[arg-type]
            Member(worker="b", budget=Budget(limit=-5), quality=-1, weight=-3),
        ),
    )
    with pytest.raises(ConfigError) as err:
        build(pool, [Worker(id="a"), Worker(id="b")])
    assert sorted(p.pointer for p in err.value.details) == [
        "/pools/0/members/0/bid",
        "/pools/0/members/0/caps/0/limit",
        "/pools/0/members/1/budget/limit",
        "/pools/0/members/1/quality",
        "/pools/0/members/1/weight",
    ]


def test_worker_skills_weight_and_capacity_out_of_range_are_config_errors() -> None:
    pool = Pool(id="p", members=(Member(worker="a"), Member(worker="b")))
    workers = [
        Worker(id="a", skills={"python": 101, "sql": 100, "go": 0}, weight=-1),
        Worker(id="b", skills={"ops": -1}, capacity={"leads": -1, "calls": 0}),
    ]
    with pytest.raises(ConfigError) as err:
        build(pool, workers)
    assert [(p.pointer, p.message) for p in err.value.details] == [
        ("/workers/0/skills/python", "must be from 0 to 100"),
        ("/workers/0/weight", "must be >= 0"),
        ("/workers/1/skills/ops", "must be from 0 to 100"),
        ("/workers/1/capacity/leads", "must be >= 0"),
    ]


def test_bad_skills_match_options_are_config_errors() -> None:
    for options in (
        {"required": {"python": "high"}},
        {"required": {"python": 101}},
        {"required": {"python": True}},
        {"attribute": 3},
    ):
        pool = Pool(
            id="p",
            members=(Member(worker="a"),),
            strategy=StrategySpec(name="skills_match", options=options),
        )
        with pytest.raises(ConfigError) as err:
            build(pool, [Worker(id="a")])
        assert [p.pointer for p in err.value.details] == ["/pools/0/strategy"]


@pytest.mark.parametrize(
    ("name", "options", "unknown"),
    [
        ("auction", {"reservee": 5_000_000}, "'reservee'"),
        ("round_robin", {"start": "b"}, "'start'"),
        ("weighted_random", {"seed": 3}, "'seed'"),
        ("least_loaded", {"channel": "x"}, "'channel'"),
        ("longest_idle", {"x": 1}, "'x'"),
        ("waterfall", {"x": 1}, "'x'"),
        ("skills_match", {"requried": {"a": 1}}, "'requried'"),
        ("sticky", {"key": "customer", "fallbak": {"name": "waterfall"}}, "'fallbak'"),
    ],
)
def test_an_unknown_strategy_option_is_a_config_error(
    name: str, options: dict[str, Any], unknown: str
) -> None:
    pool = Pool(
        id="p",
        members=(Member(worker="a"),),
        strategy=StrategySpec(name=name, options=options),
    )
    with pytest.raises(ConfigError) as err:
        build(pool, [Worker(id="a")])
    [problem] = err.value.details
    assert problem.pointer == "/pools/0/strategy"
    assert f"unknown option {unknown}" in problem.message


def test_now_is_a_timestamp_in_rules() -> None:
    workers = [Worker(id="day"), Worker(id="night")]
    pools = [
        Pool(id="day", members=(Member(worker="day"),)),
        Pool(id="night", members=(Member(worker="night"),)),
    ]
    r = Router(
        rule_set=RuleSet(
            rules=(
                Rule(
                    id="office-hours", pool="day", when="now.getHours() >= 9 && now.getHours() < 17"
                ),
            ),
            default_pool="night",
        ),
        pools=pools,
        workers=workers,
        kinds={"job": KindSchema()},
        engine=default_engine(),
    )
    assert r.route(Routable(id="x", kind="job"), InMemoryRoutingState(), NOW).pool == "day"
    late = NOW.replace(hour=20)
    assert r.route(Routable(id="x", kind="job"), InMemoryRoutingState(), late).pool == "night"


class _Greedy:
    name = "greedy"

    def __init__(self, price: int | None, pick: str | None = None) -> None:
        self.price = price
        self.pick = pick

    def select(self, ctx: SelectionContext) -> Selection:
        pick = self.pick if self.pick is not None else ctx.candidates[0].worker.id
        return Selection(pick=pick, price=self.price)


def greedy_registry(price: int | None, pick: str | None = None) -> StrategyRegistry:
    registry = StrategyRegistry()

    def factory(options: Mapping[str, Any], registry: StrategyRegistry) -> _Greedy:
        return _Greedy(price, pick)

    registry.register("greedy", factory)
    return registry


def test_a_strategy_cannot_charge_past_the_budget_check_or_pick_a_stranger() -> None:
    workers = [Worker(id="a"), Worker(id="b")]
    pool = Pool(
        id="p",
        members=(Member(worker="a", bid=10, budget=Budget(limit=100)), Member(worker="b")),
        strategy=StrategySpec(name="greedy"),
    )
    over = build(pool, workers, registry=greedy_registry(price=500))
    d = over.route(Routable(id="x", kind="job"), InMemoryRoutingState(), NOW)
    assert d.outcome is Outcome.UNASSIGNED
    assert d.intent is None
    assert "outside what the budget check allowed" in d.explanation.note
    lower = build(pool, workers, registry=greedy_registry(price=4))
    d = lower.route(Routable(id="x", kind="job"), InMemoryRoutingState(), NOW)
    assert (d.worker, d.charge) == ("a", 4)
    stranger = build(pool, workers, registry=greedy_registry(price=None, pick="zed"))
    with pytest.raises(RoutingError) as err:
        stranger.route(Routable(id="x", kind="job"), InMemoryRoutingState(), NOW)
    assert err.value.code == "routing.strategy_failed"
    assert "'zed', not a candidate" in str(err.value)


def test_shadows_of_a_pool_need_distinct_labels() -> None:
    workers = [Worker(id="a")]
    twins = Pool(
        id="p",
        members=(Member(worker="a", bid=5),),
        shadows=(
            StrategySpec(name="auction"),
            StrategySpec(name="auction", options={"pricing": "second"}),
        ),
    )
    with pytest.raises(ConfigError) as err:
        build(twins, workers)
    assert [p.pointer for p in err.value.details] == ["/pools/0/shadows/1/label"]
    labelled = Pool(
        id="p",
        members=twins.members,
        strategy=StrategySpec(name="auction", label="first-price"),
        shadows=(
            StrategySpec(name="auction"),
            StrategySpec(name="auction", label="second", options={"pricing": "second"}),
        ),
    )
    d = build(labelled, workers).route(Routable(id="x", kind="job"), InMemoryRoutingState(), NOW)
    assert d.explanation.strategy == "first-price"
    assert [s.strategy for s in d.explanation.shadows] == ["auction", "second"]


def test_reroute_excludes_the_given_workers() -> None:
    from ductor_routing import Filter, FilterOp

    workers = [Worker(id="b1"), Worker(id="b2"), Worker(id="b3")]
    members = tuple(
        Member(
            worker=w.id,
            bid=(i + 1) * 1_000_000,
            filters=(Filter(attribute="state", op=FilterOp.IN, values=("CA",)),),
        )
        for i, w in enumerate(workers)
    )
    pool = Pool(id="p", members=members, strategy=StrategySpec(name="auction"))
    r = build(pool, workers)
    lead = Routable(id="l", kind="job", attributes={"state": "CA"})
    assert r.route(lead, InMemoryRoutingState(), NOW).worker == "b3"
    again = r.route(lead, InMemoryRoutingState(), NOW, exclude={"b3"})
    assert again.worker == "b2"
    assert again.explanation.excluded[0].reason == "excluded"
    assert again.explanation.excluded[0].workers == ("b3",)
    elsewhere = Routable(id="l", kind="job", attributes={"state": "TX"})
    d = r.route(elsewhere, InMemoryRoutingState(), NOW, exclude={"b1"})
    assert {(e.reason, e.workers) for e in d.explanation.excluded} == {
        ("excluded", ("b1",)),
        ("filter", ("b2", "b3")),
    }


def test_a_huge_non_boolean_condition_value_is_quoted_cut_short() -> None:
    # Each rule and member whose condition gives the routable's own value quoted it
    # whole: a 100,000-character attribute made every such line 100,000 characters.
    pool = Pool(id="p", members=(Member(worker="ana", when="attributes.s"),))
    rules = tuple(Rule(id=f"r{i}", pool="p", when="attributes.s") for i in range(3))
    r = build(pool, [Worker(id="ana")], rule_set=RuleSet(default_pool="p", rules=rules))
    d = r.route(
        Routable(id="x", kind="job", attributes={"s": "a" * 100_000}), InMemoryRoutingState(), NOW
    )
    assert d.outcome == Outcome.UNASSIGNED
    details = [t.detail for t in d.explanation.rules_not_matched]
    assert details == ["condition gave '" + "a" * 79 + "... (100,002 characters), not a bool"] * 3
    [excluded] = d.explanation.excluded
    assert excluded.reason == "when"
    assert excluded.detail == "gave '" + "a" * 79 + "... (100,002 characters)"
    small = r.route(
        Routable(id="y", kind="job", attributes={"s": "ok"}), InMemoryRoutingState(), NOW
    )
    assert small.explanation.excluded[0].detail == "gave 'ok'"


def test_shadow_marks_are_scoped_by_the_shadows_label() -> None:
    pool = Pool(
        id="desk",
        members=(Member(worker="ana"), Member(worker="ben")),
        strategy=StrategySpec(name="least_loaded"),
        shadows=(StrategySpec(name="round_robin"), StrategySpec(name="round_robin", label="rr2")),
    )
    r = build(pool, [Worker(id="ana"), Worker(id="ben")])
    d = r.route(Routable(id="x", kind="job"), InMemoryRoutingState(), NOW)
    assert {m.scope for m in d.intent.shadow_marks} == {
        "desk#shadow:round_robin",
        "desk#shadow:rr2",
    }
    assert all(not m.scope.startswith("desk#") for m in d.intent.marks)


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class _Exiting:
    name = "exiting"

    def __init__(self, fault: BaseException) -> None:
        self.fault = fault

    def select(self, ctx: SelectionContext) -> Selection:
        raise self.fault


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        (SystemExit("a strategy's exit"), "SystemExit: a strategy's exit"),
        (_Unprintable(), "_Unprintable: (its text could not be read)"),
    ],
)
def test_a_strategy_that_exits_or_raises_unreadably_fails_only_its_decision(
    fault: BaseException, said: str
) -> None:
    # A plugin's select() calling sys.exit(), or raising an exception whose text
    # raises, fails the decision with routing.strategy_failed; the process goes on.
    registry = StrategyRegistry()
    registry.register("exiting", lambda options, registry: _Exiting(fault))
    pool = Pool(id="p", members=(Member(worker="a"),), strategy=StrategySpec(name="exiting"))
    router = build(pool, [Worker(id="a")], registry=registry)
    with pytest.raises(RoutingError) as err:
        router.route(Routable(id="x", kind="job"), InMemoryRoutingState(), NOW)
    assert err.value.code == "routing.strategy_failed"
    assert said in str(err.value)
    # Its factory exiting is a refused configuration, as a raising factory is.
    exits_when_built = StrategyRegistry()

    def factory(options: Mapping[str, Any], registry: StrategyRegistry) -> Any:
        raise fault

    exits_when_built.register("exiting", factory)
    with pytest.raises(ConfigError) as refused:
        build(pool, [Worker(id="a")], registry=exits_when_built)
    assert said in str(refused.value)
