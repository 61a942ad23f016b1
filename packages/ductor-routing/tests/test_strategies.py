from __future__ import annotations

import datetime
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ductor_core.expressions import default_engine
from ductor_routing import (
    ENRICHER_ENTRY_POINT_GROUP,
    ENTRY_POINT_GROUP,
    ConfigError,
    EnricherRegistry,
    InMemoryRoutingState,
    KindSchema,
    Member,
    Outcome,
    Pool,
    Routable,
    Router,
    RuleSet,
    StrategyRegistry,
    StrategySpec,
    UnknownStrategy,
    Worker,
)
from ductor_routing.state import CounterKey, CounterScope

NOW = datetime.datetime(2026, 11, 29, 12, tzinfo=datetime.UTC)


def make(
    strategy: str,
    members: list[Member],
    workers: list[Worker] | None = None,
    registry: StrategyRegistry | None = None,
    **options: Any,
) -> Router:
    workers = workers if workers is not None else [Worker(id=m.worker) for m in members]
    pool = Pool(
        id="p",
        members=tuple(members),
        strategy=StrategySpec(name=strategy, options=options),
        channel="c",
    )
    return Router(
        rule_set=RuleSet(default_pool="p"),
        pools=[pool],
        workers=workers,
        kinds={"job": KindSchema()},
        engine=default_engine(),
        registry=registry,
    )


def job(rid: str, **attributes: Any) -> Routable:
    return Routable(id=rid, kind="job", attributes=attributes)


def run(
    r: Router,
    n: int,
    state: InMemoryRoutingState | None = None,
    prefix: str = "j",
    **attrs: Any,
) -> list[str]:
    state = state if state is not None else InMemoryRoutingState()
    picks = []
    for i in range(n):
        d = r.route(job(f"{prefix}{i}", **attrs), state, NOW + datetime.timedelta(seconds=i))
        assert d.intent is not None
        assert state.commit(d.intent)
        picks.append(d.worker or "")
    return picks


def test_round_robin_cycles_in_id_order() -> None:
    r = make("round_robin", [Member(worker="c"), Member(worker="a"), Member(worker="b")])
    assert run(r, 7) == ["a", "b", "c", "a", "b", "c", "a"]


def test_least_loaded_uses_capacity_share() -> None:
    workers = [Worker(id="big", capacity={"c": 10}), Worker(id="small", capacity={"c": 2})]
    r = make("least_loaded", [Member(worker="small"), Member(worker="big")], workers)
    state = InMemoryRoutingState()
    state.counters[CounterKey(scope=CounterScope.LOAD, worker="big", channel="c")] = 3
    d = r.route(job("x"), state, NOW)
    # small: 0/2 beats big: 3/10
    assert d.worker == "small"
    state.counters[CounterKey(scope=CounterScope.LOAD, worker="small", channel="c")] = 1
    assert r.route(job("y"), state, NOW).worker == "big"  # 0.3 < 0.5
    assert [s.value for s in r.route(job("y"), state, NOW).explanation.scores] == [0.5, 0.3]


def test_longest_idle_prefers_never_then_oldest() -> None:
    r = make("longest_idle", [Member(worker="a"), Member(worker="b"), Member(worker="c")])
    assert run(r, 6) == ["a", "b", "c", "a", "b", "c"]


def test_waterfall_falls_through_only_when_upper_tier_is_ineligible() -> None:
    from ductor_routing import Cap, Window

    members = [
        Member(worker="backup", priority=2),
        Member(worker="primary", priority=1, caps=(Cap(window=Window.DAY, limit=2),)),
    ]
    assert run(make("waterfall", members), 4) == ["primary", "primary", "backup", "backup"]


def test_skills_match_by_proficiency_and_disqualifies_missing_skills() -> None:
    workers = [
        Worker(id="junior", skills={"python": 40, "sql": 90}),
        Worker(id="senior", skills={"python": 95, "sql": 70}),
        Worker(id="dba", skills={"sql": 99}),
    ]
    members = [Member(worker=w.id) for w in workers]
    r = make("skills_match", members, workers)
    d = r.route(job("x", skills=["python", "sql"]), InMemoryRoutingState(), NOW)
    assert d.worker == "senior"
    notes = {s.worker: (s.value, s.note) for s in d.explanation.scores}
    assert notes["dba"] == (None, "missing skill python")
    assert notes["senior"][0] == pytest.approx(82.5)
    minimum = r.route(job("y", skills={"python": 50}), InMemoryRoutingState(), NOW)
    assert minimum.worker == "senior"
    nobody = r.route(job("z", skills={"python": 99}), InMemoryRoutingState(), NOW)
    assert nobody.outcome is Outcome.UNASSIGNED
    assert nobody.explanation.note == "no candidate has the skills"
    with pytest.raises(ConfigError):
        make("skills_match", members, workers, required="python")


@pytest.mark.parametrize(
    ("skills", "note"),
    [
        (
            "python",
            "skills is 'python', not a list of skill names or an object of skill name to level",
        ),
        (["python", 5], "skills[1] is 5, not a skill name"),
        ({"python": "high"}, "skills.python is 'high', not an integer level"),
        ({"python": True}, "skills.python is True, not an integer level"),
        ({"python": 1.5}, "skills.python is 1.5, not an integer level"),
    ],
)
def test_skills_match_assigns_nobody_on_a_requirement_it_cannot_read(
    skills: object, note: str
) -> None:
    # It used to drop such a requirement and assign anyone, skilled or not.
    workers = [Worker(id="dba", skills={"sql": 99}), Worker(id="dev", skills={"python": 90})]
    r = make("skills_match", [Member(worker=w.id) for w in workers], workers)
    d = r.route(job("x", skills=skills), InMemoryRoutingState(), NOW)
    assert d.outcome is Outcome.UNASSIGNED
    assert d.explanation.note == note
    assert {(s.worker, s.value, s.note) for s in d.explanation.scores} == {
        ("dba", None, note),
        ("dev", None, note),
    }
    assert r.route(job("y"), InMemoryRoutingState(), NOW).worker == "dba"  # no requirement


def test_auction_first_and_second_price_with_reserve() -> None:
    members = [
        Member(worker="low", bid=9_000_000),
        Member(worker="mid", bid=20_000_000),
        Member(worker="high", bid=25_000_000, quality=7_000),  # effective 17.5
        Member(worker="none"),
    ]
    first = make("auction", members, reserve=10_000_000)
    d = first.route(job("x"), InMemoryRoutingState(), NOW)
    assert (d.worker, d.charge) == ("mid", 20_000_000)
    scores = {s.worker: (s.value, s.note) for s in d.explanation.scores}
    assert scores["low"] == (None, "below reserve")
    assert scores["none"] == (None, "no bid")
    assert scores["high"][0] == 17_500_000
    second = make("auction", members, reserve=10_000_000, pricing="second")
    assert second.route(job("x"), InMemoryRoutingState(), NOW).charge == 17_500_000
    alone = make(
        "auction", [Member(worker="mid", bid=20_000_000)], reserve=12_000_000, pricing="second"
    )
    assert alone.route(job("x"), InMemoryRoutingState(), NOW).charge == 12_000_000
    unmet = make("auction", members[:1], reserve=10_000_000)
    d = unmet.route(job("x"), InMemoryRoutingState(), NOW)
    assert d.outcome is Outcome.UNASSIGNED
    assert d.explanation.note == "reserve not met"
    with pytest.raises(ConfigError):
        make("auction", members, reserve=-1)
    with pytest.raises(ConfigError):
        make("auction", members, pricing="third")


def test_sticky_keeps_a_key_with_its_worker_and_rebinds_when_ineligible() -> None:
    from ductor_routing import Availability

    members = [Member(worker="a"), Member(worker="b"), Member(worker="c")]
    r = make("sticky", members, key="customer")
    state = InMemoryRoutingState()
    picks = run(r, 3, state, customer="acme")
    assert picks == ["a", "a", "a"]
    other = run(r, 1, state, prefix="g", customer="globex")
    assert other == ["b"]  # the fallback round robin moved on
    # a gone: acme is rebound by the fallback, then stays
    workers = [Worker(id="a", availability=Availability.OFFLINE), Worker(id="b"), Worker(id="c")]
    r2 = make("sticky", members, workers, key="customer")
    d = r2.route(job("k", customer="acme"), state, NOW)
    assert d.worker == "c"
    assert d.explanation.note == "rebound, previous worker not eligible"
    assert d.intent is not None
    state.commit(d.intent)
    assert r.route(job("k2", customer="acme"), state, NOW).worker == "c"
    no_key = r.route(job("k3"), state, NOW)
    assert no_key.explanation.note.startswith("no customer")
    with pytest.raises(ConfigError):
        make("sticky", members)
    with pytest.raises(ConfigError):
        make("sticky", members, key="k", fallback={"name": "sticky"})


def test_unknown_strategy_and_duplicate_registration() -> None:
    registry = StrategyRegistry()
    with pytest.raises(UnknownStrategy) as err:
        registry.create(StrategySpec(name="psychic"))
    assert err.value.code == "routing.strategy_unknown"
    assert "round_robin" in str(err.value)
    with pytest.raises(ConfigError):
        registry.register(
            "auction", lambda options, registry: registry.create(StrategySpec(name="auction"))
        )


PLUGIN = textwrap.dedent(
    '''
    """A third-party strategy: always the last candidate."""
    from ductor_routing import Score, Selection


    class LastOne:
        name = "last_one"

        def __init__(self, label):
            self.label = label

        def select(self, ctx):
            if not ctx.candidates:
                return Selection(pick=None, note="empty")
            last = ctx.candidates[-1].worker.id
            scores = tuple(Score(worker=c.worker.id, value=c.position) for c in ctx.candidates)
            return Selection(pick=last, scores=scores, note=self.label)


    def factory(options, registry):
        return LastOne(options.get("label", "last"))


    class Shout:
        name = "shout"

        def enrich(self, routable, now):
            return {"shout": str(routable.attributes.get("word", "")).upper()}


    def shout(options):
        return Shout()
    '''
)


def test_third_party_strategy_is_found_by_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "last_one_strategy.py").write_text(PLUGIN)
    dist = tmp_path / "last_one_strategy-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: last-one-strategy\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\nlast_one = last_one_strategy:factory\n\n"
        f"[{ENRICHER_ENTRY_POINT_GROUP}]\nshout = last_one_strategy:shout\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "last_one_strategy", raising=False)
    registry = StrategyRegistry()
    assert "last_one" not in registry.names()
    assert registry.discover() == ("last_one",)
    members = [Member(worker="a"), Member(worker="b"), Member(worker="c")]
    r = make("last_one", members, registry=registry, label="plugin")
    d = r.route(job("x"), InMemoryRoutingState(), NOW)
    assert d.worker == "c"
    assert d.explanation.strategy == "last_one"
    assert d.explanation.note == "plugin"
    assert [s.value for s in d.explanation.scores] == [0, 1, 2]
    enrichers = EnricherRegistry()
    assert enrichers.discover() == ("shout",)
    assert dict(enrichers.create("shout", {}).enrich(job("y", word="hi"), NOW)) == {"shout": "HI"}
