"""The routing pipeline: Validate, Enrich, Filter, Select, Assign, always in that order.

A `Router` compiles rules, pools and workers once (CEL programs, structured
filter indexes, strategies) and then routes each routable against a read-only
`RoutingState`, returning a `Decision` with its explanation and the
`AssignIntent` for the caller to commit. It does no I/O and reads no clock.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Collection, Hashable, Mapping, Sequence
from typing import Any

import msgspec

from ductor_core.errors import DuctorError, fault_text
from ductor_core.expressions import CompiledExpression, ExpressionEngine
from ductor_routing.activations import Activations
from ductor_routing.decisions import (
    Decision,
    Exclusion,
    Explanation,
    Outcome,
    RuleTrace,
    ShadowPick,
)
from ductor_routing.enrichment import CelEnricher, Enricher, EnricherRegistry, EnricherSpec
from ductor_routing.errors import ConfigError, RoutingError
from ductor_routing.filters import (
    MISSING,
    AttributeIndex,
    Predicate,
    attribute_getter,
    compile_filter,
    describe_filter,
    filter_problems,
    index_key,
    index_values,
    is_indexable,
)
from ductor_routing.kinds import KindSchema, Problem, pointer_token, validate_routable
from ductor_routing.pools import MAX_MICROS, Member, Pool, Window
from ductor_routing.routables import Routable
from ductor_routing.rules import Rule, RuleSet
from ductor_routing.state import (
    AssignIntent,
    CounterKey,
    CounterScope,
    Mark,
    MarkKind,
    Reservation,
    RoutingState,
    format_time,
    period_of,
)
from ductor_routing.strategies.base import Candidate, Selection, SelectionContext, Strategy
from ductor_routing.strategies.registry import StrategyRegistry
from ductor_routing.workers import MAX_PROFICIENCY, Availability, Worker


class _Rule:
    __slots__ = ("prefilters", "program", "rule", "when_false")

    def __init__(self, rule: Rule, program: CompiledExpression | None) -> None:
        self.rule = rule
        self.program = program
        # Traces are immutable and built once, so a miss costs one append.
        self.prefilters: tuple[tuple[Predicate, RuleTrace], ...] = tuple(
            (
                compile_filter(f),
                RuleTrace(
                    rule=rule.id,
                    priority=rule.priority,
                    matched=False,
                    reason="match",
                    detail=describe_filter(f),
                ),
            )
            for f in rule.match
        )
        self.when_false = RuleTrace(
            rule=rule.id, priority=rule.priority, matched=False, reason="when", detail="false"
        )


class _RulePlan:
    """Which rules can match for each value of one attribute, with the misses between.

    Rules with an `eq`/`in` pre-filter on the attribute are only tried when
    the routable's value is one they accept; the others are skipped with their
    prebuilt trace. Each plan is a sequence of (traces of the rules skipped
    before it, rule to try), then the traces of the rules skipped after the last.
    """

    __slots__ = ("_by_value", "_unknown", "get")

    def __init__(self, attribute: str | None, rules: Sequence[_Rule]) -> None:
        self.get = attribute_getter(attribute) if attribute is not None else None
        # Per rule: its eq/in filters on the attribute, as (accepted keys, miss trace).
        tests: list[tuple[tuple[frozenset[Hashable], RuleTrace], ...]] = []
        values: set[Hashable] = set()
        for cr in rules:
            mine = tuple(
                (frozenset(index_values(f)), trace)
                for f, (_, trace) in zip(cr.rule.match, cr.prefilters, strict=True)
                if attribute is not None and f.attribute == attribute and is_indexable(f)
            )
            tests.append(mine)
            for keys, _ in mine:
                values.update(keys)
        self._by_value = {v: self._plan(rules, tests, v) for v in values}
        self._unknown = self._plan(rules, tests, MISSING)

    @staticmethod
    def _plan(
        rules: Sequence[_Rule],
        tests: Sequence[tuple[tuple[frozenset[Hashable], RuleTrace], ...]],
        value: Hashable,
    ) -> tuple[tuple[tuple[tuple[RuleTrace, ...], _Rule], ...], tuple[RuleTrace, ...]]:
        steps: list[tuple[tuple[RuleTrace, ...], _Rule]] = []
        gap: list[RuleTrace] = []
        for cr, mine in zip(rules, tests, strict=True):
            # The first of the rule's indexed filters that refuses the value, if any.
            miss = next((trace for keys, trace in mine if value not in keys), None)
            if miss is None:
                steps.append((tuple(gap), cr))
                gap = []
            else:
                gap.append(miss)
        return tuple(steps), tuple(gap)

    def plan(
        self, attrs: Mapping[str, Any]
    ) -> tuple[tuple[tuple[tuple[RuleTrace, ...], _Rule], ...], tuple[RuleTrace, ...]]:
        """The rules to try for these attributes, in priority order."""
        if self.get is None:
            return self._unknown
        value = self.get(attrs)
        if value is MISSING:
            return self._unknown
        return self._by_value.get(index_key(value), self._unknown)


def _index_attribute(rules: Sequence[_Rule]) -> str | None:
    """The attribute most rules pre-filter on with eq/in (first seen wins a tie)."""
    counts: dict[str, int] = {}
    for cr in rules:
        for attribute in dict.fromkeys(f.attribute for f in cr.rule.match if is_indexable(f)):
            counts[attribute] = counts.get(attribute, 0) + 1
    if not counts:
        return None
    return max(counts, key=lambda a: counts[a])


class _Member:
    __slots__ = (
        "activation",
        "budget_key",
        "cap_keys",
        "capacity",
        "load_key",
        "member",
        "position",
        "program",
        "residual",
        "worker",
    )

    def __init__(
        self,
        position: int,
        worker: Worker,
        member: Member,
        pool: Pool,
        residual: tuple[tuple[Predicate, str], ...],
        program: CompiledExpression | None,
    ) -> None:
        self.position = position
        self.worker = worker
        self.member = member
        self.residual = residual
        self.program = program
        self.capacity = worker.capacity.get(pool.channel)
        self.load_key = CounterKey(scope=CounterScope.LOAD, worker=worker.id, channel=pool.channel)
        # Last key built per window: periods change rarely, keys are reused.
        self.cap_keys: dict[Window, tuple[str, CounterKey]] = {}
        self.budget_key: tuple[str, CounterKey] | None = None
        self.activation: dict[str, Any] = {
            "worker": worker.activation(),
            "member": {
                "bid": member.bid,
                "quality": member.quality,
                "priority": member.priority,
                "weight": member.weight,
            },
        }

    def cap_key(self, pool: str, window: Window, period: str) -> CounterKey:
        cached = self.cap_keys.get(window)
        if cached is not None and cached[0] == period:
            return cached[1]
        key = CounterKey(
            scope=CounterScope.CAP, worker=self.worker.id, pool=pool, window=window, period=period
        )
        self.cap_keys[window] = (period, key)
        return key

    def spend_key(self, pool: str, window: Window, period: str) -> CounterKey:
        cached = self.budget_key
        if cached is not None and cached[0] == period:
            return cached[1]
        key = CounterKey(
            scope=CounterScope.BUDGET,
            worker=self.worker.id,
            pool=pool,
            window=window,
            period=period,
        )
        self.budget_key = (period, key)
        return key


class _Pool:
    __slots__ = (
        "available",
        "ids",
        "indexes",
        "members",
        "pool",
        "shadows",
        "strategy",
        "unavailable",
    )

    def __init__(
        self,
        pool: Pool,
        members: tuple[_Member, ...],
        strategy: Strategy,
        shadows: tuple[tuple[str, Strategy], ...],
    ) -> None:
        self.pool = pool
        self.members = members
        self.ids = tuple(m.worker.id for m in members)
        self.strategy = strategy
        self.shadows = shadows
        self.available = tuple(
            m.position for m in members if m.worker.availability is Availability.AVAILABLE
        )
        unavailable = tuple(
            m.worker.id for m in members if m.worker.availability is not Availability.AVAILABLE
        )
        self.unavailable = (
            Exclusion(reason="unavailable", detail="", workers=unavailable) if unavailable else None
        )
        accepts: dict[str, dict[int, frozenset[Hashable] | None]] = {}
        for m in members:
            for f in m.member.filters:
                if is_indexable(f):
                    accepts.setdefault(f.attribute, {})
        for attribute, by_position in accepts.items():
            for p in self.available:
                keys: frozenset[Hashable] | None = None
                for f in members[p].member.filters:
                    if f.attribute == attribute and is_indexable(f):
                        values = frozenset(index_values(f))
                        keys = values if keys is None else keys & values
                by_position[p] = keys
        self.indexes = tuple(AttributeIndex(a, bp, self.ids) for a, bp in accepts.items())


def _config_hash(
    rule_set: RuleSet,
    pools: Sequence[Pool],
    workers: Sequence[Worker],
    kinds: Mapping[str, KindSchema],
    enrichers: Sequence[EnricherSpec | Enricher],
    seed: int,
) -> str:
    """A short, stable fingerprint of a routing configuration as given."""
    document = {
        "rule_set": rule_set,
        "pools": list(pools),
        "workers": list(workers),
        "kinds": dict(sorted(kinds.items())),
        "enrichers": [e if isinstance(e, EnricherSpec) else f"plugin:{e.name}" for e in enrichers],
        "seed": seed,
    }
    return hashlib.blake2b(msgspec.json.encode(document), digest_size=12).hexdigest()


SHOWN_VALUE_CHARS = 80
"""The most characters of a condition's non-boolean value an explanation quotes: the
value may come from a routable's attributes, and every rule and member that gives
it would otherwise copy it whole into the stored decision."""


def _shown(value: object) -> str:
    """`repr(value)`, cut to `SHOWN_VALUE_CHARS` (with its length) when longer."""
    text = repr(value)
    if len(text) <= SHOWN_VALUE_CHARS:
        return text
    return f"{text[:SHOWN_VALUE_CHARS]}... ({len(text):,} characters)"


def _decision_id(routable: Routable, now_text: str) -> str:
    text = f"{routable.tenant}\x00{routable.id}\x00{now_text}"
    return "dec_" + hashlib.blake2b(text.encode(), digest_size=10).hexdigest()


STRATEGY_FAILED = "routing.strategy_failed"
"""The code of a decision whose strategy raised or answered something not a Selection."""


def _select(strategy: Strategy, name: str, ctx: SelectionContext) -> Selection:
    """`strategy.select(ctx)`, a plugin's exception or wrong answer made a RoutingError."""
    try:
        selection = strategy.select(ctx)
    except DuctorError:
        raise
    except (Exception, SystemExit) as exc:  # a plugin's bug fails this decision, not the process
        raise RoutingError(
            f"strategy {name!r} failed: {fault_text(exc)}", code=STRATEGY_FAILED
        ) from exc
    if not isinstance(selection, Selection):
        raise RoutingError(
            f"strategy {name!r} answered {type(selection).__name__}, not a Selection",
            code=STRATEGY_FAILED,
        )
    return selection


class Router:
    """The compiled routing configuration; `route` runs the five stages.

    Args:
        rule_set: the rules that pick a pool.
        pools: every pool a rule (or the default) can pick.
        workers: the worker registry.
        kinds: the schema of each routable kind (an undeclared kind is invalid).
        engine: the CEL engine; every expression is compiled once here.
        enrichers: CEL enricher specs and enricher plugins, applied in order.
        registry: the strategy registry (built-ins if omitted).
        enricher_registry: where enricher specs naming a `plugin` are found.
        seed: fixes every seeded random draw, so a replay gives the same decisions.

    Raises:
        ConfigError: the configuration is inconsistent; `details` lists every problem.
    """

    def __init__(
        self,
        *,
        rule_set: RuleSet,
        pools: Sequence[Pool],
        workers: Sequence[Worker],
        kinds: Mapping[str, KindSchema],
        engine: ExpressionEngine,
        enrichers: Sequence[EnricherSpec | Enricher] = (),
        registry: StrategyRegistry | None = None,
        enricher_registry: EnricherRegistry | None = None,
        seed: int = 0,
    ) -> None:
        self.rule_set = rule_set
        self.kinds = dict(kinds)
        self.engine = engine
        self.seed = seed
        self.registry = registry if registry is not None else StrategyRegistry()
        self.config_hash = _config_hash(rule_set, pools, workers, kinds, enrichers, seed)
        problems: list[Problem] = []

        def compile_cel(source: str | None, pointer: str) -> CompiledExpression | None:
            if source is None:
                return None
            try:
                return engine.compile(source)
            except DuctorError as exc:
                problems.append(Problem(pointer=pointer, message=exc.message))
                return None

        workers_by_id: dict[str, Worker] = {}
        for i, w in enumerate(workers):
            if w.id in workers_by_id:
                problems.append(Problem(pointer=f"/workers/{i}/id", message="duplicate worker"))
            workers_by_id[w.id] = w
            for skill, level in w.skills.items():
                if not 0 <= level <= MAX_PROFICIENCY:
                    problems.append(
                        Problem(
                            pointer=f"/workers/{i}/skills/{pointer_token(skill)}",
                            message=f"must be from 0 to {MAX_PROFICIENCY}",
                        )
                    )
            if w.weight < 0:
                problems.append(Problem(pointer=f"/workers/{i}/weight", message="must be >= 0"))
            for channel, slots in w.capacity.items():
                if slots < 0:
                    problems.append(
                        Problem(
                            pointer=f"/workers/{i}/capacity/{pointer_token(channel)}",
                            message="must be >= 0",
                        )
                    )
        self.workers = workers_by_id

        for kind, schema in kinds.items():
            for name, spec in schema.attributes.items():
                low, high = spec.minimum, spec.maximum
                if low is not None and high is not None and low > high:
                    problems.append(
                        Problem(
                            pointer=f"/kinds/{pointer_token(kind)}/attributes/{pointer_token(name)}",
                            message=f"minimum {low:g} is above maximum {high:g}: no value can pass",
                        )
                    )

        self._enrichers: list[Enricher] = []
        for i, e in enumerate(enrichers):
            if not isinstance(e, EnricherSpec):
                self._enrichers.append(e)
                continue
            shape = e.problem()
            if shape is not None:
                problems.append(Problem(pointer=f"/enrichers/{i}", message=shape))
            elif e.plugin is not None:
                try:
                    found = (enricher_registry or EnricherRegistry()).create(e.plugin, e.options)
                except DuctorError as exc:
                    problems.append(Problem(pointer=f"/enrichers/{i}/plugin", message=exc.message))
                else:
                    self._enrichers.append(found)
            else:
                try:
                    self._enrichers.append(CelEnricher(e, engine))
                except DuctorError as exc:
                    problems.append(Problem(pointer=f"/enrichers/{i}/expr", message=exc.message))

        self._pools: dict[str, _Pool] = {}
        # Every pool id the configuration defines, a pool with problems included, so a
        # rule naming it is not also told the pool is unknown.
        defined: set[str] = set()
        for pi, pool in enumerate(pools):
            base = f"/pools/{pi}"
            duplicate = pool.id in defined
            if duplicate:
                problems.append(Problem(pointer=f"{base}/id", message="duplicate pool"))
            defined.add(pool.id)
            members: list[_Member] = []
            seen: set[str] = set()
            for mi, m in enumerate(pool.members):
                mp = f"{base}/members/{mi}"
                worker = workers_by_id.get(m.worker)
                if worker is None:
                    problems.append(
                        Problem(pointer=f"{mp}/worker", message=f"unknown worker {m.worker!r}")
                    )
                elif m.worker in seen:
                    problems.append(
                        Problem(pointer=f"{mp}/worker", message="worker is a member twice")
                    )
                    worker = None
                seen.add(m.worker)
                for fi, f in enumerate(m.filters):
                    for below, message in filter_problems(f):
                        problems.append(
                            Problem(pointer=f"{mp}/filters/{fi}{below}", message=message)
                        )
                for field, value in (
                    ("bid", m.bid),
                    ("quality", m.quality),
                    ("weight", m.weight),
                    ("budget/limit", m.budget.limit if m.budget is not None else None),
                    *((f"caps/{ci}/limit", c.limit) for ci, c in enumerate(m.caps)),
                ):
                    if value is not None and value < 0:
                        problems.append(Problem(pointer=f"{mp}/{field}", message="must be >= 0"))
                for field, value in (
                    ("bid", m.bid),
                    ("budget/limit", m.budget.limit if m.budget is not None else None),
                ):
                    if value is not None and value > MAX_MICROS:
                        problems.append(
                            Problem(
                                pointer=f"{mp}/{field}",
                                message="must be at most 10^15 micros",
                            )
                        )
                program = compile_cel(m.when, f"{mp}/when")
                if worker is None:
                    continue
                residual = tuple(
                    (compile_filter(f), f.attribute) for f in m.filters if not is_indexable(f)
                )
                members.append(_Member(len(members), worker, m, pool, residual, program))
            try:
                strategy = self.registry.create(pool.strategy)
                shadows = tuple((s.display, self.registry.create(s)) for s in pool.shadows)
            except RoutingError as exc:
                problems.append(Problem(pointer=f"{base}/strategy", message=exc.message))
                continue
            labels = [label for label, _ in shadows]
            for si, label in enumerate(labels):
                if label in labels[:si]:
                    problems.append(
                        Problem(
                            pointer=f"{base}/shadows/{si}/label",
                            message=f"another shadow is already called {label!r}; give a label",
                        )
                    )
            if not duplicate:
                self._pools[pool.id] = _Pool(pool, tuple(members), strategy, shadows)

        ordered = sorted(enumerate(rule_set.rules), key=lambda item: (item[1].priority, item[0]))
        self._rules: list[_Rule] = []
        rule_ids: set[str] = set()
        for ri, rule in ordered:
            rp = f"/rule_set/rules/{ri}"
            if rule.id in rule_ids:
                problems.append(Problem(pointer=f"{rp}/id", message="duplicate rule"))
            rule_ids.add(rule.id)
            for fi, f in enumerate(rule.match):
                for below, message in filter_problems(f):
                    problems.append(Problem(pointer=f"{rp}/match/{fi}{below}", message=message))
            if rule.pool not in defined:
                problems.append(
                    Problem(pointer=f"{rp}/pool", message=f"unknown pool {rule.pool!r}")
                )
            self._rules.append(_Rule(rule, compile_cel(rule.when, f"{rp}/when")))
        if rule_set.default_pool is not None and rule_set.default_pool not in defined:
            problems.append(
                Problem(
                    pointer="/rule_set/default_pool",
                    message=f"unknown pool {rule_set.default_pool!r}",
                )
            )
        self._plan = _RulePlan(_index_attribute(self._rules), self._rules)
        self._rule_activations = Activations(cr.rule.when for cr in self._rules)
        self._member_activations = Activations(
            m.member.when for cp in self._pools.values() for m in cp.members
        )
        self._member_vars = self._member_activations.names
        if problems:
            summary = "; ".join(f"{p.pointer}: {p.message}" for p in problems[:5])
            raise ConfigError(f"invalid routing configuration: {summary}", details=problems)

    @property
    def pool_ids(self) -> tuple[str, ...]:
        """Every pool id, in configuration order."""
        return tuple(self._pools)

    def pool(self, pool_id: str) -> Pool:
        """The pool with this id (KeyError if unknown)."""
        return self._pools[pool_id].pool

    def counter_keys(self, pool_id: str, now: datetime.datetime) -> tuple[CounterKey, ...]:
        """Every counter a decision in `pool_id` at `now` may read (to prefetch a snapshot)."""
        cp = self._pools[pool_id]
        keys: list[CounterKey] = []
        for m in cp.members:
            keys.append(m.load_key)
            for cap in m.member.caps:
                keys.append(m.cap_key(pool_id, cap.window, period_of(cap.window, now)))
            budget = m.member.budget
            if budget is not None:
                keys.append(m.spend_key(pool_id, budget.window, period_of(budget.window, now)))
        return tuple(keys)

    def mark_scopes(self, pool_id: str) -> tuple[str, ...]:
        """The mark scopes a decision in `pool_id` may read: the pool's, then each shadow's."""
        cp = self._pools[pool_id]
        return (pool_id, *(f"{pool_id}#shadow:{name}" for name, _ in cp.shadows))

    # -- the five stages -------------------------------------------------------------

    def route(
        self,
        routable: Routable,
        state: RoutingState,
        now: datetime.datetime,
        *,
        decision_id: str | None = None,
        exclude: Collection[str] = (),
        funds: Mapping[str, Mapping[str, int]] | None = None,
    ) -> Decision:
        """Route one routable against `state` at `now` (naive times are taken as UTC).

        Args:
            routable: what to route.
            state: the read-only state view.
            now: the decision time.
            decision_id: the decision's id (default: derived from tenant,
                routable id and time).
            exclude: workers that must not get it (e.g. the buyer who returned
                a lead, on reroute); they are excluded with reason "excluded".
            funds: per pool id, the most each worker's money can cover of a
                routing charge in that pool, in micros (a settled pool's
                wallets); a member whose bid (or the routable's price) exceeds
                it is excluded with reason "funds". Pools and workers not named
                are not limited.

        Returns a decision whose `intent` (when assigned) the caller commits;
        the state is only read.
        """
        if now.tzinfo is None:
            now = now.replace(tzinfo=datetime.UTC)
        now_text = format_time(now)
        did = decision_id if decision_id is not None else _decision_id(routable, now_text)
        rs = self.rule_set
        base = Explanation(
            rule_set=rs.id, rule_set_version=rs.version, config_hash=self.config_hash
        )

        def finish(outcome: Outcome, explanation: Explanation, **extra: Any) -> Decision:
            return Decision(
                id=did,
                routable_id=routable.id,
                tenant=routable.tenant,
                kind=routable.kind,
                at=now_text,
                outcome=outcome,
                explanation=explanation,
                **extra,
            )

        # 1. Validate
        problems = validate_routable(self.kinds.get(routable.kind), routable)
        if problems:
            return finish(Outcome.INVALID, base, problems=problems)

        # 2. Enrich
        routable, enriched, problems = self._enrich(routable, now)
        if problems:
            return finish(
                Outcome.INVALID,
                msgspec.structs.replace(base, enriched=enriched),
                problems=problems,
            )

        # 3. Filter: the first rule that matches picks the pool, then eligibility.
        rule_id, pool_id, traces = self._match_rule(routable, now)
        if pool_id is None:
            return finish(
                Outcome.UNASSIGNED,
                msgspec.structs.replace(
                    base,
                    rules_not_matched=traces,
                    enriched=enriched,
                    note="no rule matched and there is no default pool",
                ),
            )
        cp = self._pools[pool_id]
        pool = cp.pool
        candidates, excluded, periods = self._eligible(cp, routable, state, now, exclude, funds)

        # 4. Select, live and in shadow.
        ctx = SelectionContext(
            routable=routable,
            pool=pool.id,
            scope=pool.id,
            channel=pool.channel,
            candidates=candidates,
            state=state,
            now=now,
            now_text=now_text,
            seed=self.seed,
        )
        selection = _select(cp.strategy, pool.strategy.display, ctx)
        shadow_picks, shadow_marks = self._shadows(cp, ctx, selection)
        explanation = msgspec.structs.replace(
            base,
            rule=rule_id,
            rules_not_matched=traces,
            enriched=enriched,
            pool=pool.id,
            candidates=tuple(c.worker.id for c in candidates),
            excluded=excluded,
            strategy=pool.strategy.display,
            scores=selection.scores,
            pick=selection.pick,
            note=selection.note if candidates else "no eligible candidate",
            shadows=shadow_picks,
        )
        if selection.pick is None:
            return finish(Outcome.UNASSIGNED, explanation, pool=pool.id)
        picked = next((c for c in candidates if c.worker.id == selection.pick), None)
        if picked is None:
            raise RoutingError(
                f"strategy {pool.strategy.display!r} picked {selection.pick!r}, not a candidate",
                code=STRATEGY_FAILED,
            )
        charge = selection.price if selection.price is not None else picked.charge
        if charge < 0 or (charge > picked.charge and picked.member.budget is not None):
            # Eligibility checked the budget against picked.charge; a strategy
            # may lower the price (second price) but never raise it past that.
            return finish(
                Outcome.UNASSIGNED,
                msgspec.structs.replace(
                    explanation, note=f"price {charge} is outside what the budget check allowed"
                ),
                pool=pool.id,
            )

        # 5. Assign: the intent the caller commits atomically.
        intent = self._intent(
            cp, picked, charge, selection, shadow_marks, periods, did, routable, now_text
        )
        return finish(
            Outcome.ASSIGNED,
            explanation,
            pool=pool.id,
            worker=picked.worker.id,
            charge=charge,
            intent=intent,
        )

    def _enrich(
        self, routable: Routable, now: datetime.datetime
    ) -> tuple[Routable, dict[str, Any], tuple[Problem, ...]]:
        """Apply every enricher in order; stop at the first that fails."""
        enriched: dict[str, Any] = {}
        for enricher in self._enrichers:
            try:
                added = enricher.enrich(routable, now)
            except DuctorError as exc:
                message = exc.message
            except (Exception, SystemExit) as exc:  # a plugin's bug must not take it down
                message = fault_text(exc)
            else:
                if not added:
                    continue
                try:
                    # What a plugin answers is stored with the decision: JSON, by name.
                    if not isinstance(added, Mapping):
                        raise TypeError(f"it answered {type(added).__name__}, not a mapping")
                    attributes = msgspec.json.decode(msgspec.json.encode(dict(added)))
                except (TypeError, ValueError, msgspec.MsgspecError) as exc:
                    message = f"{type(exc).__name__}: {exc}"
                else:
                    enriched.update(attributes)
                    routable = routable.with_attributes(attributes)
                    continue
            return (
                routable,
                enriched,
                (Problem(pointer=f"/enrich/{enricher.name}", message=message),),
            )
        return routable, enriched, ()

    def _match_rule(
        self, routable: Routable, now: datetime.datetime
    ) -> tuple[str | None, str | None, tuple[RuleTrace, ...]]:
        """(rule id, pool id, why each higher-priority rule did not match)."""
        attrs = routable.attributes
        traces: list[RuleTrace] = []
        bound: Any = None
        bind_error: str | None = None
        steps, tail = self._plan.plan(attrs)
        for skipped, cr in steps:
            if skipped:
                traces.extend(skipped)
            failed = None
            for predicate, trace in cr.prefilters:
                if not predicate(attrs):
                    failed = trace
                    break
            if failed is not None:
                traces.append(failed)
                continue
            if cr.program is not None:
                if bound is None and bind_error is None:
                    # Converted once per decision, then every rule evaluates against it.
                    try:
                        bound = self.engine.bind(self._rule_activations.build(routable, now))
                    except DuctorError as exc:
                        bind_error = exc.message
                detail: str | None = bind_error
                if detail is None:
                    try:
                        value = cr.program.evaluate(bound)
                    except DuctorError as exc:
                        detail = exc.message
                    else:
                        if value is False:
                            traces.append(cr.when_false)
                            continue
                        if value is not True:
                            detail = f"condition gave {_shown(value)}, not a bool"
                if detail is not None:
                    traces.append(
                        RuleTrace(
                            rule=cr.rule.id,
                            priority=cr.rule.priority,
                            matched=False,
                            reason="error",
                            detail=detail,
                        )
                    )
                    continue
            return cr.rule.id, cr.rule.pool, tuple(traces)
        traces.extend(tail)
        if self.rule_set.default_pool is not None:
            return "default", self.rule_set.default_pool, tuple(traces)
        return None, None, tuple(traces)

    def _eligible(
        self,
        cp: _Pool,
        routable: Routable,
        state: RoutingState,
        now: datetime.datetime,
        exclude: Collection[str],
        funds: Mapping[str, Mapping[str, int]] | None = None,
    ) -> tuple[list[Candidate], tuple[Exclusion, ...], dict[Window, str]]:
        """The pool's eligible members, the excluded ones by reason, and the window periods."""
        attrs = routable.attributes
        pool = cp.pool
        excluded: list[Exclusion] = []
        if cp.unavailable is not None:
            excluded.append(cp.unavailable)
        alive: Sequence[int] = cp.available
        ids = cp.ids
        if exclude:
            names = tuple(ids[p] for p in alive if ids[p] in exclude)
            if names:
                excluded.append(Exclusion(reason="excluded", detail="", workers=names))
                alive = tuple(p for p in alive if ids[p] not in exclude)
        for index in cp.indexes:
            allowed, kept, _, names = index.lookup(attrs)
            if alive is cp.available:
                # The index's prebuilt split is over exactly the available members.
                alive = kept
            else:
                names = tuple(ids[p] for p in alive if p not in allowed)
                alive = tuple(p for p in alive if p in allowed)
            if names:
                excluded.append(Exclusion(reason="filter", detail=index.attribute, workers=names))
        late: dict[tuple[str, str], list[str]] = {}
        candidates: list[Candidate] = []
        periods: dict[Window, str] = {}
        price = routable.price if routable.price is not None else 0
        member_activation: dict[str, Any] | None = None
        covers = funds.get(pool.id) if funds is not None else None
        for p in alive:
            cm = cp.members[p]
            member = cm.member
            reason: tuple[str, str] | None = None
            for predicate, attribute in cm.residual:
                if not predicate(attrs):
                    reason = ("filter", attribute)
                    break
            load = 0
            if reason is None:
                load = state.counter(cm.load_key)
                if cm.capacity is not None and load >= cm.capacity:
                    reason = ("capacity", pool.channel)
            if reason is None:
                for cap in member.caps:
                    period = periods.get(cap.window)
                    if period is None:
                        period = periods[cap.window] = period_of(cap.window, now)
                    if state.counter(cm.cap_key(pool.id, cap.window, period)) >= cap.limit:
                        reason = ("cap", cap.window.value)
                        break
            # The most this member can be charged: an auction's clearing price is not
            # known until every candidate is, and never exceeds the bid. A member that
            # cannot cover its own bid is not eligible, so it cannot set the price
            # others pay with money it does not have.
            charge = member.bid if member.bid is not None else price
            if reason is None and member.budget is not None:
                budget = member.budget
                period = periods.get(budget.window)
                if period is None:
                    period = periods[budget.window] = period_of(budget.window, now)
                spent = state.counter(cm.spend_key(pool.id, budget.window, period))
                if spent + charge > budget.limit:
                    reason = ("budget", budget.window.value)
            if reason is None and covers is not None:
                cover = covers.get(cm.worker.id)
                if cover is not None and charge > cover:
                    reason = ("funds", "")
            if reason is None and cm.program is not None:
                if member_activation is None:
                    member_activation = self._member_activations.build(routable, now)
                for name in ("worker", "member"):
                    if name in self._member_vars:
                        member_activation[name] = cm.activation[name]
                try:
                    value = cm.program.evaluate(member_activation)
                except DuctorError as exc:
                    reason = ("when", f"error: {exc.message}")
                else:
                    if value is not True:
                        reason = ("when", "false" if value is False else f"gave {_shown(value)}")
            if reason is not None:
                late.setdefault(reason, []).append(cm.worker.id)
                continue
            candidates.append(
                Candidate(
                    position=p,
                    worker=cm.worker,
                    member=member,
                    charge=charge,
                    load=load,
                    capacity=cm.capacity,
                )
            )
        for (reason_name, detail), workers in late.items():
            for i, early in enumerate(excluded):
                if early.reason == reason_name and early.detail == detail:
                    # An indexed and a residual filter on one attribute: one group.
                    excluded[i] = Exclusion(
                        reason=reason_name, detail=detail, workers=early.workers + tuple(workers)
                    )
                    break
            else:
                excluded.append(
                    Exclusion(reason=reason_name, detail=detail, workers=tuple(workers))
                )
        return candidates, tuple(excluded), periods

    @staticmethod
    def _shadows(
        cp: _Pool, ctx: SelectionContext, live: Selection
    ) -> tuple[tuple[ShadowPick, ...], tuple[Mark, ...]]:
        """Every shadow strategy's pick, each with its marks in its own scope."""
        picks: list[ShadowPick] = []
        marks: list[Mark] = []
        for name, shadow in cp.shadows:
            try:
                sel = _select(shadow, name, ctx.with_scope(f"{cp.pool.id}#shadow:{name}"))
            except DuctorError as error:
                # A shadow is only watched: its failure is its pick's note, and the
                # live decision stands.
                picks.append(ShadowPick(strategy=name, pick=None, agrees=False, note=error.message))
                continue
            picks.append(
                ShadowPick(
                    strategy=name,
                    pick=sel.pick,
                    agrees=sel.pick == live.pick,
                    price=sel.price,
                    scores=sel.scores,
                    note=sel.note,
                )
            )
            marks.extend(sel.marks)
        return tuple(picks), tuple(marks)

    @staticmethod
    def _intent(
        cp: _Pool,
        picked: Candidate,
        charge: int,
        selection: Selection,
        shadow_marks: tuple[Mark, ...],
        periods: Mapping[Window, str],
        decision_id: str,
        routable: Routable,
        now_text: str,
    ) -> AssignIntent:
        """The reservations and marks that make the pick real."""
        pool = cp.pool
        cm = cp.members[picked.position]
        member = cm.member
        reservations = [Reservation(key=cm.load_key, amount=1, limit=cm.capacity)]
        for cap in member.caps:
            reservations.append(
                Reservation(
                    key=cm.cap_key(pool.id, cap.window, periods[cap.window]),
                    amount=1,
                    limit=cap.limit,
                )
            )
        if member.budget is not None:
            budget = member.budget
            reservations.append(
                Reservation(
                    key=cm.spend_key(pool.id, budget.window, periods[budget.window]),
                    amount=charge,
                    limit=budget.limit,
                )
            )
        marks = (
            *selection.marks,
            Mark(kind=MarkKind.LAST_ASSIGNED, scope="", key=picked.worker.id, value=now_text),
        )
        return AssignIntent(
            decision_id=decision_id,
            routable_id=routable.id,
            tenant=routable.tenant,
            pool=pool.id,
            worker=picked.worker.id,
            channel=pool.channel,
            at=now_text,
            charge=charge,
            reservations=tuple(reservations),
            marks=marks,
            shadow_marks=shadow_marks,
        )


def encode_decision(decision: Decision) -> bytes:
    """The decision as one compact JSON document (stable field order)."""
    return msgspec.json.encode(decision)
