from __future__ import annotations

import datetime
import sys
from collections.abc import Mapping
from typing import Any

import msgspec
import pytest

from ductor_core.expressions import default_engine
from ductor_routing import (
    AssignConflict,
    AttributeSpec,
    AttributeType,
    Availability,
    Budget,
    Cap,
    ConfigError,
    CounterKey,
    CounterScope,
    EnricherSpec,
    Filter,
    FilterOp,
    InMemoryRoutingState,
    KindSchema,
    MarkKind,
    Member,
    Outcome,
    Pool,
    Routable,
    Router,
    Rule,
    RuleSet,
    StrategySpec,
    Window,
    Worker,
    encode_decision,
)

NOW = datetime.datetime(2026, 11, 29, 9, 30, tzinfo=datetime.UTC)
KINDS = {"lead": KindSchema(attributes={"state": AttributeSpec(type=AttributeType.STRING)})}


def lead(rid: str = "l1", **attributes: Any) -> Routable:
    return Routable(id=rid, kind="lead", attributes=attributes)


def router(
    pools: list[Pool],
    workers: list[Worker],
    rules: tuple[Rule, ...] = (),
    default_pool: str | None = None,
    **kwargs: Any,
) -> Router:
    return Router(
        rule_set=RuleSet(id="main", version=7, rules=rules, default_pool=default_pool),
        pools=pools,
        workers=workers,
        kinds=KINDS,
        engine=default_engine(),
        **kwargs,
    )


def test_first_matching_rule_wins_and_explains_every_higher_rule() -> None:
    workers = [Worker(id="a"), Worker(id="b")]
    pools = [
        Pool(id="p1", members=(Member(worker="a"),)),
        Pool(id="p2", members=(Member(worker="b"),)),
    ]
    rules = (
        Rule(id="late", pool="p1", priority=50),
        Rule(id="cel-false", pool="p1", priority=10, when="attributes.score > 90"),
        Rule(id="prefilter", pool="p1", priority=5, match=(Filter(attribute="state", value="NY"),)),
        Rule(id="broken", pool="p1", priority=20, when="attributes.missing_thing > 1"),
        Rule(id="hit", pool="p2", priority=30, when="attributes.score > 10"),
    )
    r = router(pools, workers, rules)
    d = r.route(lead(state="CA", score=50), InMemoryRoutingState(), NOW)
    assert d.outcome is Outcome.ASSIGNED
    assert (d.pool, d.worker) == ("p2", "b")
    ex = d.explanation
    assert ex.rule == "hit"
    assert (ex.rule_set, ex.rule_set_version) == ("main", 7)
    assert [(t.rule, t.reason) for t in ex.rules_not_matched] == [
        ("prefilter", "match"),
        ("cel-false", "when"),
        ("broken", "error"),
    ]
    assert ex.rules_not_matched[0].detail == "state == 'NY'"
    assert "missing_thing" in ex.rules_not_matched[2].detail


def test_default_pool_and_no_route() -> None:
    workers = [Worker(id="a")]
    pools = [Pool(id="p", members=(Member(worker="a"),))]
    rules = (Rule(id="never", pool="p", when="false"),)
    with_default = router(pools, workers, rules, default_pool="p").route(
        lead(), InMemoryRoutingState(), NOW
    )
    assert with_default.explanation.rule == "default"
    assert with_default.worker == "a"
    without = router(pools, workers, rules).route(lead(), InMemoryRoutingState(), NOW)
    assert without.outcome is Outcome.UNASSIGNED
    assert without.intent is None
    assert without.explanation.pool is None
    assert [t.rule for t in without.explanation.rules_not_matched] == ["never"]


def test_invalid_routable_lists_every_problem_and_routes_nothing() -> None:
    kinds = {
        "lead": KindSchema(
            attributes={
                "state": AttributeSpec(type=AttributeType.STRING, required=True),
                "age": AttributeSpec(type=AttributeType.INTEGER, minimum=18),
            },
            require_consent=True,
        )
    }
    r = Router(
        rule_set=RuleSet(default_pool="p"),
        pools=[Pool(id="p", members=(Member(worker="a"),))],
        workers=[Worker(id="a")],
        kinds=kinds,
        engine=default_engine(),
    )
    d = r.route(lead(age=12), InMemoryRoutingState(), NOW)
    assert d.outcome is Outcome.INVALID
    assert [p.pointer for p in d.problems] == ["/attributes/state", "/attributes/age", "/consent"]
    unknown = r.route(Routable(id="t", kind="ticket"), InMemoryRoutingState(), NOW)
    assert unknown.outcome is Outcome.INVALID
    assert unknown.problems[0].pointer == "/kind"


def test_exclusion_reasons_name_each_filtered_member() -> None:
    workers = [
        Worker(id="away", availability=Availability.AWAY),
        Worker(id="texas"),
        Worker(id="full", capacity={"calls": 1}),
        Worker(id="capped"),
        Worker(id="broke"),
        Worker(id="picky", attributes={"min_score": 80}),
        Worker(id="ok"),
    ]
    members = (
        Member(worker="away"),
        Member(worker="texas", filters=(Filter(attribute="state", value="TX"),)),
        Member(worker="full"),
        Member(worker="capped", caps=(Cap(window=Window.HOUR, limit=1),)),
        Member(worker="broke", bid=5, budget=Budget(limit=4, window=Window.DAY)),
        Member(worker="picky", when="attributes.score >= worker.attributes.min_score"),
        Member(worker="ok", filters=(Filter(attribute="score", op=FilterOp.GTE, value=10),)),
    )
    pool = Pool(id="p", members=members, channel="calls")
    r = router([pool], workers, default_pool="p")
    state = InMemoryRoutingState()
    # "full" is busy and "capped" has used its hour
    state.counters[CounterKey(scope=CounterScope.LOAD, worker="full", channel="calls")] = 1
    state.counters[
        CounterKey(
            scope=CounterScope.CAP,
            worker="capped",
            pool="p",
            window=Window.HOUR,
            period="2026-11-29T09",
        )
    ] = 1
    d = r.route(lead(state="CA", score=50), state, NOW)
    reasons = {(e.reason, e.detail): e.workers for e in d.explanation.excluded}
    assert reasons == {
        ("unavailable", ""): ("away",),
        ("filter", "state"): ("texas",),
        ("capacity", "calls"): ("full",),
        ("cap", "hour"): ("capped",),
        ("budget", "day"): ("broke",),
        ("when", "false"): ("picky",),
    }
    assert d.explanation.candidates == ("ok",)
    assert d.worker == "ok"
    # next hour the cap resets
    later = r.route(lead(state="CA", score=50), state, NOW + datetime.timedelta(hours=1))
    assert "capped" in later.explanation.candidates


def test_members_filtered_for_one_reason_and_detail_are_one_group() -> None:
    # f4 fails an indexed filter on m, f5 and f6 a residual one: one group, in that order.
    workers = [Worker(id=w) for w in ("f4", "f5", "f6", "ok")]
    members = (
        Member(worker="f4", filters=(Filter(attribute="m", value="x"),)),
        Member(worker="f5", filters=(Filter(attribute="m", op=FilterOp.NE, value="y"),)),
        Member(worker="f6", filters=(Filter(attribute="m", op=FilterOp.NE, value="y"),)),
        Member(worker="ok"),
    )
    r = router([Pool(id="p", members=members)], workers, default_pool="p")
    d = r.route(lead(m="y"), InMemoryRoutingState(), NOW)
    assert [(e.reason, e.detail, e.workers) for e in d.explanation.excluded] == [
        ("filter", "m", ("f4", "f5", "f6"))
    ]
    assert d.explanation.candidates == ("ok",)


def test_funds_exclude_members_whose_wallet_cannot_cover_their_bid() -> None:
    workers = [Worker(id=w) for w in ("rich", "poor", "exact", "free")]
    members = (
        Member(worker="rich", bid=9_000_000),
        Member(worker="poor", bid=8_000_000),
        Member(worker="exact", bid=7_000_000),
        Member(worker="free", bid=6_000_000),
    )
    pool = Pool(
        id="p", members=members, strategy=StrategySpec(name="auction", options={"pricing": "first"})
    )
    r = router([pool], workers, default_pool="p")
    state = InMemoryRoutingState()
    # "free" is not named: its funds are not limited.
    funds = {"rich": 9_000_000, "poor": 7_999_999, "exact": 7_000_000}
    d = r.route(lead(), state, NOW, funds={"p": funds})
    assert [(e.reason, e.workers) for e in d.explanation.excluded] == [("funds", ("poor",))]
    assert d.explanation.candidates == ("rich", "exact", "free")
    assert (d.worker, d.charge) == ("rich", 9_000_000)
    broke = r.route(lead(), state, NOW, funds={"p": {"rich": 0, "poor": -1, "exact": 6_999_999}})
    excluded = {e.reason: e.workers for e in broke.explanation.excluded}
    assert excluded == {"funds": ("rich", "poor", "exact")}
    assert broke.worker == "free"
    # Without funds for the pool nothing is excluded for them: the check is opt-in.
    assert r.route(lead(), state, NOW).explanation.excluded == ()
    assert r.route(lead(), state, NOW, funds={"other": {"rich": 0}}).explanation.excluded == ()


def test_intent_reserves_caps_budget_load_and_commit_is_all_or_nothing() -> None:
    workers = [Worker(id="a", capacity={"default": 2})]
    member = Member(
        worker="a",
        bid=3_000_000,
        caps=(Cap(window=Window.DAY, limit=1),),
        budget=Budget(limit=10_000_000),
    )
    r = router([Pool(id="p", members=(member,))], workers, default_pool="p")
    state = InMemoryRoutingState()
    first = r.route(lead("one"), state, NOW)
    second = r.route(lead("two"), state, NOW)  # routed on the same, stale state
    assert first.intent is not None
    assert second.intent is not None
    scopes = {(res.key.scope, res.amount, res.limit) for res in first.intent.reservations}
    assert scopes == {
        (CounterScope.LOAD, 1, 2),
        (CounterScope.CAP, 1, 1),
        (CounterScope.BUDGET, 3_000_000, 10_000_000),
    }
    assert first.charge == 3_000_000
    assert state.commit(first.intent) is True
    before = dict(state.counters)
    assert state.commit(first.intent) is False  # the same decision again: no double count
    assert state.counters == before
    with pytest.raises(AssignConflict) as err:
        state.commit(second.intent)
    assert err.value.retryable
    assert state.counters == before  # nothing of the rejected intent was applied
    again = r.route(lead("two"), state, NOW)
    assert again.outcome is Outcome.UNASSIGNED
    assert again.explanation.excluded[0].reason == "cap"
    assert state.mark(MarkKind.LAST_ASSIGNED, "", "a") == "2026-11-29T09:30:00.000000Z"


def test_same_inputs_and_state_give_the_same_decision_bytes() -> None:
    workers = [Worker(id=f"w{i}", weight=i + 1) for i in range(6)]
    pool = Pool(
        id="p",
        members=tuple(Member(worker=w.id) for w in workers),
        strategy=StrategySpec(name="weighted_random"),
        shadows=(StrategySpec(name="round_robin"), StrategySpec(name="least_loaded")),
    )
    state = InMemoryRoutingState()
    a = router([pool], workers, default_pool="p", seed=3)
    b = router([pool], workers, default_pool="p", seed=3)
    for i in range(20):
        da = a.route(lead(f"r{i}", state="CA"), state, NOW)
        db = b.route(lead(f"r{i}", state="CA"), state, NOW)
        assert encode_decision(da) == encode_decision(db)
        assert da.intent is not None
        state.commit(da.intent)
    other_seed = router([pool], workers, default_pool="p", seed=4)
    picks = {a.route(lead(f"q{i}"), state, NOW).worker for i in range(30)}
    other = {other_seed.route(lead(f"q{i}"), state, NOW).worker for i in range(30)}
    assert len(picks) > 1
    assert len(other) > 1


def test_enrichers_cel_and_plugin_feed_rules() -> None:
    class Tier:
        name = "tier"

        def enrich(self, routable: Routable, now: datetime.datetime) -> Mapping[str, Any]:
            return {"tier": "gold" if routable.attributes.get("hot") else "basic"}

    class Broken:
        name = "broken"

        def enrich(self, routable: Routable, now: datetime.datetime) -> Mapping[str, Any]:
            raise ValueError("boom")

    workers = [Worker(id="a"), Worker(id="b")]
    pools = [
        Pool(id="gold", members=(Member(worker="a"),)),
        Pool(id="rest", members=(Member(worker="b"),)),
    ]
    rules = (Rule(id="gold", pool="gold", match=(Filter(attribute="tier", value="gold"),)),)
    enrichers = [EnricherSpec(attribute="hot", expr="attributes.score > 70"), Tier()]
    r = router(pools, workers, rules, default_pool="rest", enrichers=enrichers)
    d = r.route(lead(score=80), InMemoryRoutingState(), NOW)
    assert d.pool == "gold"
    assert d.explanation.enriched == {"hot": True, "tier": "gold"}
    assert r.route(lead(score=10), InMemoryRoutingState(), NOW).pool == "rest"
    bad = router(pools, workers, rules, default_pool="rest", enrichers=[Broken()])
    d = bad.route(lead(), InMemoryRoutingState(), NOW)
    assert d.outcome is Outcome.INVALID
    assert d.problems[0].pointer == "/enrich/broken"
    assert "boom" in d.problems[0].message


def test_config_errors_are_all_reported_at_once() -> None:
    with pytest.raises(ConfigError) as err:
        Router(
            rule_set=RuleSet(
                rules=(Rule(id="r", pool="nope", when="attributes.x >"),), default_pool="gone"
            ),
            pools=[
                Pool(
                    id="p",
                    members=(Member(worker="ghost"), Member(worker="a", when="(((")),
                    strategy=StrategySpec(name="telepathy"),
                )
            ],
            workers=[Worker(id="a"), Worker(id="a")],
            kinds=KINDS,
            engine=default_engine(),
        )
    pointers = sorted(p.pointer for p in err.value.details)
    assert pointers == [
        "/pools/0/members/0/worker",
        "/pools/0/members/1/when",
        "/pools/0/strategy",
        "/rule_set/default_pool",
        "/rule_set/rules/0/pool",
        "/rule_set/rules/0/when",
        "/workers/1/id",
    ]
    assert err.value.code == "routing.config"


def test_a_pool_with_problems_still_counts_and_hides_none_of_the_others() -> None:
    with pytest.raises(ConfigError) as err:
        Router(
            rule_set=RuleSet(rules=(Rule(id="r", pool="p"),), default_pool="p"),
            pools=[
                Pool(
                    id="p",
                    members=(
                        Member(worker="ghost", when="((("),
                        Member(worker="a"),
                        Member(worker="a", when="1 +"),
                    ),
                    strategy=StrategySpec(name="telepathy"),
                ),
                Pool(id="p", members=(Member(worker="b", weight=-1),)),
            ],
            workers=[Worker(id="a")],
            kinds=KINDS,
            engine=default_engine(),
        )
    found = [(p.pointer, p.message.split(":")[0][:22]) for p in err.value.details]
    assert found == [
        ("/pools/0/members/0/worker", "unknown worker 'ghost'"),
        ("/pools/0/members/0/when", found[1][1]),
        ("/pools/0/members/2/worker", "worker is a member twi"),
        ("/pools/0/members/2/when", found[3][1]),
        ("/pools/0/strategy", "unknown strategy 'tele"),
        ("/pools/1/id", "duplicate pool"),
        ("/pools/1/members/0/worker", "unknown worker 'b'"),
        ("/pools/1/members/0/weight", "must be >= 0"),
    ]


def test_naive_now_is_utc_and_counter_keys_cover_the_pool() -> None:
    workers = [Worker(id="a")]
    member = Member(worker="a", caps=(Cap(window=Window.MONTH, limit=9),), budget=Budget(limit=5))
    r = router([Pool(id="p", members=(member,))], workers, default_pool="p")
    naive = r.route(lead(), InMemoryRoutingState(), NOW.replace(tzinfo=None))
    aware = r.route(lead(), InMemoryRoutingState(), NOW)
    assert encode_decision(naive) == encode_decision(aware)
    keys = r.counter_keys("p", NOW)
    assert {k.scope for k in keys} == {CounterScope.LOAD, CounterScope.CAP, CounterScope.BUDGET}
    assert aware.intent is not None
    assert {res.key for res in aware.intent.reservations} == set(keys)


def test_times_are_utc_whatever_the_zone() -> None:
    from zoneinfo import ZoneInfo

    from ductor_routing import format_time, period_of

    new_york = datetime.datetime(2026, 11, 29, 23, 30, 0, 5, tzinfo=ZoneInfo("America/New_York"))
    assert format_time(new_york) == "2026-11-30T04:30:00.000005Z"
    assert period_of(Window.HOUR, new_york) == "2026-11-30T04"
    assert period_of(Window.DAY, new_york) == "2026-11-30"
    assert period_of(Window.MONTH, new_york) == "2026-11"
    assert period_of(Window.TOTAL, new_york) == "all"
    assert format_time(NOW) < format_time(NOW + datetime.timedelta(microseconds=1))


def test_config_hash_and_mark_scopes() -> None:
    workers = [Worker(id="a")]
    pool = Pool(
        id="p",
        members=(Member(worker="a", bid=5),),
        shadows=(StrategySpec(name="waterfall"), StrategySpec(name="least_loaded")),
    )
    one = router([pool], workers, default_pool="p")
    same = router([pool], workers, default_pool="p")
    reseeded = router([pool], workers, default_pool="p", seed=1)
    rebid = router(
        [Pool(id="p", members=(Member(worker="a", bid=6),), shadows=pool.shadows)],
        workers,
        default_pool="p",
    )
    assert one.config_hash == same.config_hash
    assert len({one.config_hash, reseeded.config_hash, rebid.config_hash}) == 3
    d = one.route(lead(), InMemoryRoutingState(), NOW)
    assert d.explanation.config_hash == one.config_hash
    assert one.mark_scopes("p") == ("p", "p#shadow:waterfall", "p#shadow:least_loaded")


def test_enricher_plugins_by_name_from_a_registry() -> None:
    from ductor_routing import EnricherRegistry, RoutingConfig, build_router

    class Region:
        name = "region"

        def __init__(self, regions: Mapping[str, str]) -> None:
            self.regions = regions

        def enrich(self, routable: Routable, now: datetime.datetime) -> Mapping[str, Any]:
            return {"region": self.regions.get(routable.attributes.get("state", ""), "other")}

    enrichers = EnricherRegistry()
    enrichers.register("region", lambda options: Region(options["map"]))
    with pytest.raises(ConfigError):
        enrichers.register("region", lambda options: Region({}))
    config = RoutingConfig(
        kinds=KINDS,
        enrichers=(
            EnricherSpec(plugin="region", options={"map": {"CA": "west", "NY": "east"}}),
            EnricherSpec(attribute="coastal", expr="attributes.region != 'other'"),
        ),
        workers=(Worker(id="a"), Worker(id="b")),
        pools=(
            Pool(id="west", members=(Member(worker="a"),)),
            Pool(id="rest", members=(Member(worker="b"),)),
        ),
        rule_set=RuleSet(
            rules=(Rule(id="w", pool="west", match=(Filter(attribute="region", value="west"),)),),
            default_pool="rest",
        ),
    )
    r = build_router(config, engine=default_engine(), enricher_registry=enrichers)
    d = r.route(lead(state="CA"), InMemoryRoutingState(), NOW)
    assert d.pool == "west"
    assert d.explanation.enriched == {"region": "west", "coastal": True}
    assert r.route(lead(state="TX"), InMemoryRoutingState(), NOW).pool == "rest"
    with pytest.raises(ConfigError) as err:
        build_router(config, engine=default_engine())  # no registry: the plugin is unknown
    assert [p.pointer for p in err.value.details] == ["/enrichers/0/plugin"]
    bad_shapes = msgspec.structs.replace(
        config,
        enrichers=(
            EnricherSpec(attribute="x"),
            EnricherSpec(plugin="region", attribute="x", expr="1"),
        ),
    )
    with pytest.raises(ConfigError) as err:
        build_router(bad_shapes, engine=default_engine(), enricher_registry=enrichers)
    assert [p.pointer for p in err.value.details] == ["/enrichers/0", "/enrichers/1"]


def test_an_enricher_that_exits_refuses_the_routable_not_the_process() -> None:
    from ductor_routing import EnricherRegistry, RoutingConfig, build_router

    class Exiting:
        name = "exiting"

        def enrich(self, routable: Routable, now: datetime.datetime) -> Mapping[str, Any]:
            sys.exit("an enricher's exit")

    enrichers = EnricherRegistry()
    enrichers.register("exiting", lambda options: Exiting())
    config = RoutingConfig(
        kinds=KINDS,
        enrichers=(EnricherSpec(plugin="exiting"),),
        workers=(Worker(id="a"),),
        pools=(Pool(id="rest", members=(Member(worker="a"),)),),
        rule_set=RuleSet(default_pool="rest"),
    )
    r = build_router(config, engine=default_engine(), enricher_registry=enrichers)
    d = r.route(lead(state="CA"), InMemoryRoutingState(), NOW)
    assert d.outcome is Outcome.INVALID
    assert d.intent is None
    [problem] = d.problems
    assert problem.pointer == "/enrich/exiting"
    assert problem.message == "SystemExit: an enricher's exit"
