"""The lead-distribution scenario, offline: 3 pools, 20 buyers, 5,000 leads.

Every decision is checked against an independent oracle that tracks caps and
budgets itself and runs the auction by hand.
"""

from __future__ import annotations

import datetime
import random
from collections import Counter

from ductor_core.expressions import default_engine
from ductor_routing import (
    AttributeSpec,
    AttributeType,
    Budget,
    Cap,
    Consent,
    Filter,
    FilterOp,
    InMemoryRoutingState,
    KindSchema,
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
    WorkerKind,
)

STATES = ["CA", "TX", "FL", "NY", "AZ", "NV", "OR", "WA", "GA", "IL"]
RESERVE = {"solar": 10_000_000, "insurance": 5_000_000, "mortgage": 20_000_000}
START = datetime.datetime(2026, 11, 27, 0, 0, tzinfo=datetime.UTC)
LEADS = 5_000


def scenario() -> tuple[list[Worker], list[Pool], RuleSet]:
    rnd = random.Random(2026)
    workers = [Worker(id=f"b{i:02d}", kind=WorkerKind.SYSTEM) for i in range(1, 21)]
    members: dict[str, list[Member]] = {"solar": [], "insurance": [], "mortgage": []}
    for i, w in enumerate(workers):
        verticals = ["solar", "insurance", "mortgage"]
        for vertical in (
            (verticals[i % 3], verticals[(i + 1) % 3]) if i % 4 == 0 else (verticals[i % 3],)
        ):
            states = tuple(sorted(rnd.sample(STATES, rnd.randint(2, 6))))
            bid = rnd.randrange(4_000_000, 45_000_000, 500_000)
            members[vertical].append(
                Member(
                    worker=w.id,
                    filters=(Filter(attribute="state", op=FilterOp.IN, values=states),),
                    caps=(Cap(window=Window.DAY, limit=rnd.randint(20, 120)),),
                    budget=Budget(limit=rnd.randint(40, 200) * bid // 10, window=Window.DAY)
                    if i % 5 == 0
                    else None,
                    bid=bid,
                    quality=rnd.choice([8_000, 10_000, 10_000, 12_000]),
                )
            )
    pools = [
        Pool(
            id=v,
            channel="leads",
            members=tuple(ms),
            strategy=StrategySpec(name="auction", options={"reserve": RESERVE[v]}),
            shadows=(StrategySpec(name="round_robin"),),
        )
        for v, ms in members.items()
    ]
    rules = RuleSet(
        id="leads",
        version=12,
        rules=(
            Rule(
                id="mortgage-qualified",
                priority=1,
                pool="mortgage",
                match=(Filter(attribute="vertical", value="mortgage"),),
                when="attributes.credit >= 620",
            ),
            Rule(
                id="solar",
                priority=2,
                pool="solar",
                match=(Filter(attribute="vertical", value="solar"),),
            ),
            Rule(
                id="insurance",
                priority=3,
                pool="insurance",
                match=(Filter(attribute="vertical", value="insurance"),),
            ),
        ),
        default_pool=None,
    )
    return workers, pools, rules


def leads() -> list[tuple[datetime.datetime, Routable]]:
    rnd = random.Random(99)
    out = []
    for i in range(LEADS):
        at = START + datetime.timedelta(seconds=i * 2 * 86_400 // LEADS)  # two days
        attrs = {
            "state": rnd.choice(STATES),
            "vertical": rnd.choice(["solar", "insurance", "mortgage"]),
            "credit": rnd.randint(500, 820),
        }
        consent = Consent(granted=True, scopes=("phone",), evidence=f"form-{i}")
        out.append(
            (at, Routable(id=f"lead-{i:05d}", kind="lead", attributes=attrs, consent=consent))
        )
    return out


def test_five_thousand_leads_respect_caps_and_go_to_the_auction_winner() -> None:
    workers, pools, rules = scenario()
    router = Router(
        rule_set=rules,
        pools=pools,
        workers=workers,
        kinds={
            "lead": KindSchema(
                attributes={
                    "state": AttributeSpec(type=AttributeType.STRING, required=True),
                    "vertical": AttributeSpec(type=AttributeType.STRING, required=True),
                    "credit": AttributeSpec(type=AttributeType.INTEGER, required=True),
                },
                require_consent=True,
            )
        },
        engine=default_engine(),
    )
    state = InMemoryRoutingState()
    by_pool = {p.id: p for p in pools}
    # the oracle's own books
    count: Counter[tuple[str, str, str]] = Counter()  # (pool, buyer, day) -> leads
    spent: Counter[tuple[str, str, str]] = Counter()  # (pool, buyer, day) -> micros
    outcomes: Counter[Outcome] = Counter()
    cap_exclusions = 0
    for at, lead in leads():
        d = router.route(lead, state, at)
        outcomes[d.outcome] += 1
        day = at.strftime("%Y-%m-%d")
        attrs = lead.attributes
        vertical = attrs["vertical"]
        ex = d.explanation
        if vertical == "mortgage" and attrs["credit"] < 620:
            assert d.outcome is Outcome.UNASSIGNED
            assert ex.rule is None
            assert [(t.rule, t.reason) for t in ex.rules_not_matched] == [
                ("mortgage-qualified", "when"),
                ("solar", "match"),
                ("insurance", "match"),
            ]
            continue
        pool = by_pool[vertical]
        assert ex.pool == vertical
        expected_not_matched = {"mortgage": [], "solar": ["mortgage-qualified"]}.get(
            vertical, ["mortgage-qualified", "solar"]
        )
        assert [t.rule for t in ex.rules_not_matched] == expected_not_matched
        # eligibility and the auction, by hand
        eligible = []
        reasons: dict[str, str] = {}
        for pos, m in enumerate(pool.members):
            if attrs["state"] not in m.filters[0].values:
                reasons[m.worker] = "filter"
            elif count[(vertical, m.worker, day)] >= m.caps[0].limit:
                reasons[m.worker] = "cap"
            elif (
                m.budget is not None
                and spent[(vertical, m.worker, day)] + (m.bid or 0) > m.budget.limit
            ):
                reasons[m.worker] = "budget"
            else:
                eligible.append((pos, m))
        got = {w: e.reason for e in ex.excluded for w in e.workers}
        assert got == reasons
        cap_exclusions += sum(1 for r in reasons.values() if r == "cap")
        assert ex.candidates == tuple(m.worker for _, m in eligible)
        bidders = [
            (-(m.bid or 0) * m.quality // 10_000, pos, m)
            for pos, m in eligible
            if (m.bid or 0) >= RESERVE[vertical]
        ]
        if not bidders:
            assert d.outcome is Outcome.UNASSIGNED
            continue
        winner = min(bidders, key=lambda b: (b[0], b[1]))[2]
        assert d.outcome is Outcome.ASSIGNED
        assert d.worker == winner.worker
        assert d.charge == winner.bid
        assert ex.pick == winner.worker
        assert ex.strategy == "auction"
        assert {s.strategy for s in ex.shadows} == {"round_robin"}
        assert d.intent is not None
        state.commit(d.intent)
        count[(vertical, winner.worker, day)] += 1
        spent[(vertical, winner.worker, day)] += d.charge
    assert sum(outcomes.values()) == LEADS
    assert outcomes[Outcome.ASSIGNED] > 2_000
    assert cap_exclusions > 0  # caps really bind in this scenario
    for pool in pools:
        for m in pool.members:
            for day in ("2026-11-27", "2026-11-28"):
                assert count[(pool.id, m.worker, day)] <= m.caps[0].limit
                if m.budget is not None:
                    assert spent[(pool.id, m.worker, day)] <= m.budget.limit
