"""Routing: workers, pools and rule sets kept in the store, `route`, and assignments.

It speaks in tenants, structs and `DuctorError`s, never a transport. Routing
itself is `ductor_routing.Router`; this module loads its configuration, gives
it a snapshot of the live counters and marks read in a short transaction, runs
it (inline when its CEL is cheap, else in a lane) with no transaction open, and
commits its Assign intent in a second short transaction, whose conditional
counter updates keep every cap under concurrency (a lost race, or a
configuration that changed in between, rolls back and routes again on fresh
state, claiming the call's idempotency key again in that new transaction).
A configuration change is compiled in a lane before its transaction opens; the
transaction only checks that the configuration it was built from is still
current (else it is built again) and writes.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence
from datetime import datetime, timedelta
from typing import Annotated, Any, TypeVar

import msgspec

from ductor_core.errors import DuctorError
from ductor_core.expressions import ExpressionEngine, estimate_cost
from ductor_routing import (
    MAX_MICROS,
    AssignConflict,
    ConfigError,
    Consent,
    CounterKey,
    CounterScope,
    Decision,
    EnricherRegistry,
    EnricherSpec,
    Explanation,
    KindSchema,
    MarkKind,
    Outcome,
    Pool,
    Problem,
    Routable,
    Router,
    Rule,
    RuleSet,
    ShadowStrategyReport,
    StrategyRegistry,
    Worker,
    encode_decision,
    shadow_report,
)
from ductor_routing.kinds import pointer_token
from ductor_server.connections.shapes import problems_of
from ductor_server.engine.cheap import INLINE_COST, INLINE_LIMITS, small
from ductor_server.engine.clock import Clock, SystemClock
from ductor_server.engine.offload import VALIDATION
from ductor_server.errors import RequestInvalid
from ductor_server.extensions.hooks import DECISION_MADE, HookDispatcher, to_data
from ductor_server.extensions.kinds import KindValidators
from ductor_server.extensions.loader import installed_extensions
from ductor_server.extensions.wiring import plugin_enrichers, plugin_strategies
from ductor_server.ledger.settlement_store import ReturnRecord, SettlementTx
from ductor_server.ledger.store import LedgerTx
from ductor_server.routing.errors import (
    AssignmentStateConflict,
    ConfigChangeConflict,
    RoutableInvalid,
    RoutingObjectInUse,
    RoutingObjectNotFound,
)
from ductor_server.routing.store import AssignmentRecord, RoutingTx, StoredReservation
from ductor_server.services.idempotency import Answer, Claim
from ductor_server.services.idempotency import Outcome as MutationOutcome
from ductor_server.services.ledger import tell_entry_posted
from ductor_server.services.metering import charge_usage, require_entitlement
from ductor_server.services.receipts import ReceiptService, decision_ref
from ductor_server.services.runs import check_name, check_reason
from ductor_server.services.settlement import (
    PoolSettlement,
    PoolSettlementView,
    check_settlement,
    finish_held_charge,
    funds_for,
    raise_problems,
    settle_assignment,
)
from ductor_server.storage.protocol import Store, Tx
from ductor_server.telemetry import ROUTE_DURATION, tracer
from ductor_settlement import (
    ConsentRecord,
    Cost,
    Entry,
    Ledger,
    LedgerSnapshot,
    Subject,
    SubjectKind,
    document_hash,
    quote,
)
from ductor_settlement.errors import AlreadyReturned, NotReturnable
from ductor_settlement.returns import (
    AssignmentFacts,
    ReturnCredit,
    ReturnRefusal,
    ReturnStats,
    decide_return,
)

T = TypeVar("T")
_S = TypeVar("_S", bound=msgspec.Struct)


# --- bodies and views ---------------------------------------------------------------


class RulesBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/rules`: the tenant's rule set, kinds and enrichers (a new version each time).

    Attributes:
        id: the rule set's name, recorded in every decision.
        rules: priority-ordered rules, each picking a pool.
        default_pool: the pool used when no rule matches.
        kinds: routable kind to its schema (an undeclared kind is invalid).
        enrichers: CEL enrichers and enricher plugins, applied in order.
        seed: fixes the seeded draws (weighted random).
    """

    id: str = "default"
    rules: tuple[Rule, ...] = ()
    default_pool: str | None = None
    kinds: dict[str, KindSchema] = {}
    enrichers: tuple[EnricherSpec, ...] = ()
    seed: int = 0


class ConfigCheckBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/routing/validate`: workers, pools and a rule set to check together with
    the stored configuration, as if each were put (nothing is written).

    Each object is checked as its own `POST` would check it; then the configuration
    they lead to (these over the stored ones, by id) is compiled as a whole.
    """

    workers: list[Any] = []
    pools: list[Any] = []
    rule_set: Any = None


class ConfigCheck(msgspec.Struct, frozen=True, kw_only=True):
    """What `POST /v1/routing/validate` found: every problem, pointers into its body
    (a problem of a stored object no body object replaces names it in the message)."""

    valid: bool
    problems: list[Problem]


class RuleSetView(msgspec.Struct, frozen=True, kw_only=True):
    """One stored version of the tenant's rule set."""

    version: int
    created_at: datetime
    rule_set: RulesBody


class RuleSetVersion(msgspec.Struct, frozen=True, kw_only=True):
    """A rule set version in a listing."""

    version: int
    created_at: datetime


class RouteBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/route`: the routable (its tenant is the caller's) and who to exclude.

    Attributes:
        id: the caller's id for the routable.
        kind: selects the schema it is validated against.
        attributes: JSON attributes.
        consent: the consent trail, when the kind needs one.
        price: the routable's own price in micros.
        exclude: workers that must not get it (e.g. on a reroute).
        pool: route straight to this pool, skipping the rules.
    """

    id: str
    kind: str
    attributes: dict[str, Any] = {}
    consent: Consent | None = None
    price: Annotated[int, msgspec.Meta(ge=-MAX_MICROS, le=MAX_MICROS)] | None = None
    exclude: tuple[str, ...] = ()
    pool: str | None = None


class DecisionView(msgspec.Struct, frozen=True, kw_only=True):
    """A routing decision as the API shows it, with its explanation and assignment."""

    id: str
    routable_id: str
    kind: str
    at: str
    outcome: Outcome
    pool: str | None = None
    worker: str | None = None
    charge: int = 0
    assignment_id: str | None = None
    explanation: Explanation


class AssignmentView(msgspec.Struct, frozen=True, kw_only=True):
    """An assignment: who holds which routable, and where it stands."""

    id: str
    decision_id: str
    routable_id: str
    pool: str
    worker: str
    channel: str
    charge: int
    status: str
    result: Any = None
    reason: str = ""
    created_at: datetime
    updated_at: datetime


class ShadowReportView(msgspec.Struct, frozen=True, kw_only=True):
    """How often each shadow strategy of a pool agreed with the live one."""

    pool: str
    decisions: int
    strategies: tuple[ShadowStrategyReport, ...]


class OutcomeBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/assignments/{id}/complete|reject|accept`: an optional result and reason."""

    result: Any = None
    reason: str = ""


class ReturnBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/assignments/{id}/return`: send a settled assignment back.

    Attributes:
        reason: why the buyer returns it (the pool's policy may allow only some).
        reroute: route the routable again in its pool, without the returning buyer.
        amount: credit exactly this many micros (a partial return); default: the
            policy's share of what is left of the charge.
    """

    reason: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    reroute: bool = False
    amount: Annotated[int, msgspec.Meta(ge=1, le=MAX_MICROS)] | None = None


class ReturnView(msgspec.Struct, frozen=True, kw_only=True):
    """An accepted return: the credit it wrote and, with a reroute, the new decision."""

    id: str
    assignment_id: str
    reason: str
    amount: int
    currency: str
    full: bool
    entry_id: str
    reverses: str
    created_at: datetime
    decision: DecisionView | None = None


#: Assignment statuses.
STATUSES = ("assigned", "accepted", "completed", "rejected", "expired", "returned")
ASSIGNED, ACCEPTED, COMPLETED, REJECTED, EXPIRED, RETURNED = STATUSES
OPEN_STATUSES = (ASSIGNED, ACCEPTED)


def counter_text(key: CounterKey) -> str:
    """The stored form of a counter key (JSON array: unambiguous and sortable)."""
    window = key.window.value if key.window is not None else ""
    return msgspec.json.encode(
        [key.scope.value, key.worker, key.pool, key.channel, window, key.period]
    ).decode()


class Snapshot:
    """A `RoutingState` read from the store at one moment; routing only reads it."""

    def __init__(
        self,
        counters: dict[CounterKey, int],
        marks: dict[tuple[MarkKind, str, str], str],
        funds: dict[str, dict[str, int]] | None = None,
    ) -> None:
        self._counters = counters
        self._marks = marks
        self.funds = funds or None
        """Per settled pool, what each member's wallet can cover (see `Router.route`)."""

    def counter(self, key: CounterKey) -> int:
        """The counter's value when the snapshot was taken (0 if absent)."""
        return self._counters.get(key, 0)

    def mark(self, kind: MarkKind, scope: str, key: str) -> str | None:
        """The mark's value when the snapshot was taken, or None."""
        return self._marks.get((kind, scope, key))


def _decode(raw: bytes, into: type[Any]) -> Any:
    return msgspec.json.decode(raw, type=into)


def _view(decision: Decision, assignment_id: str | None) -> DecisionView:
    return DecisionView(
        id=decision.id,
        routable_id=decision.routable_id,
        kind=decision.kind,
        at=decision.at,
        outcome=decision.outcome,
        pool=decision.pool,
        worker=decision.worker,
        charge=decision.charge,
        assignment_id=assignment_id,
        explanation=decision.explanation,
    )


def assignment_view(record: AssignmentRecord) -> AssignmentView:
    """The API view of an assignment row."""
    return AssignmentView(
        id=record.id,
        decision_id=record.decision_id,
        routable_id=record.routable_id,
        pool=record.pool,
        worker=record.worker,
        channel=record.channel,
        charge=record.charge,
        status=record.status,
        result=record.result,
        reason=record.reason,
        created_at=record.created_at,
        updated_at=record.updated_at,
    )


class _Config(msgspec.Struct, frozen=True, kw_only=True):
    workers: tuple[Worker, ...]
    pools: tuple[Pool, ...]
    rules: RulesBody
    version: int
    settlement: dict[str, PoolSettlement] = {}


INLINE_MEMBERS = 1_000
"""The most pool members a configuration may have and still be routed on the loop
(structured filters and strategies cost about 0.3 us a member on top of CEL)."""


def _route_cost(config: _Config, pool: str | None, engine: ExpressionEngine) -> int:
    """The estimated cost of all the CEL a decision of `config` may evaluate, at the
    inline sizes (`engine/cheap.py`); -1 when it must not run on the loop (an
    expression that cannot be estimated, an enricher plugin, too many members)."""
    rules = config.rules
    sources = [r.when for r in rules.rules if r.when is not None] if pool is None else []
    members = 0
    for p in config.pools:
        members += len(p.members)
        sources.extend(m.when for m in p.members if m.when is not None)
    for enricher in rules.enrichers:
        if enricher.plugin is not None:
            return -1  # code we cannot estimate
        if enricher.expr is not None:
            sources.append(enricher.expr)
    if members > INLINE_MEMBERS:
        return -1
    total = 0
    for source in sources:
        try:
            total += estimate_cost(source, INLINE_LIMITS).cost
        except DuctorError:
            return -1
    return total if total <= INLINE_COST.get(engine.name, -1) or not sources else -1


class _Compiled:
    """A compiled router and whether its decisions are cheap enough for the loop."""

    __slots__ = ("config_hash", "cost", "router", "settled")

    def __init__(self, router: Router, cost: int, config: _Config) -> None:
        self.router = router
        self.cost = cost
        # What a receipt names as the configuration the decision was made under. A
        # tenant's attributes may hold 64-bit integers: hashed as JSON readers see them.
        self.config_hash = document_hash(config)
        # The enabled settlement of each pool the router may pick, with its members.
        self.settled: dict[str, tuple[PoolSettlement, tuple[str, ...]]] = {
            p.id: (config.settlement[p.id], tuple(m.worker for m in p.members))
            for p in config.pools
            if p.id in router.pool_ids
            and p.id in config.settlement
            and config.settlement[p.id].enabled
        }

    def inline(self, routable: Routable) -> bool:
        """Whether routing `routable` may run on the event loop: a configuration
        whose CEL is cheap, and attributes small enough to bind quickly."""
        return self.cost >= 0 and small((routable.attributes, routable.consent))


def _rule_set_names(rules: RulesBody) -> list[tuple[str, str, str, str]]:
    """The rule ids, kind names, kind attribute names and enricher attributes of
    `rules` as (JSON path, pointer, what, name), to be bounded like every other id: a
    kind `POST /v1/route` could never name (empty, over 256 characters, a control
    character) would be dead configuration, and a name is printed in explanations."""
    found = [
        (f"$.rules[{i}].id", f"/rules/{i}/id", "rule id", rule.id)
        for i, rule in enumerate(rules.rules)
    ]
    found.extend(("$.kinds", "/kinds", "routable kind", kind) for kind in rules.kinds)
    for kind, schema in rules.kinds.items():
        path = f"$.kinds[{msgspec.json.encode(kind).decode()}].attributes"
        pointer = f"/kinds/{pointer_token(kind)}/attributes"
        found.extend((path, pointer, "kind attribute name", name) for name in schema.attributes)
    found.extend(
        (
            f"$.enrichers[{i}].attribute",
            f"/enrichers/{i}/attribute",
            "enricher attribute",
            e.attribute,
        )
        for i, e in enumerate(rules.enrichers)
        if e.attribute is not None
    )
    return found


def _worker_names(worker: Worker) -> list[tuple[str, str, str, str]]:
    """The capacity channels and skill names of `worker` as (JSON path, pointer, what,
    name), bounded like an id: a channel is part of every capacity counter's key, a
    skill is named in the skills strategy's explanations."""
    found = [("$.capacity", "/capacity", "capacity channel", c) for c in worker.capacity]
    found.extend(("$.skills", "/skills", "skill name", skill) for skill in worker.skills)
    return found


def _pool_names(pool: Pool) -> list[tuple[str, str, str, str]]:
    """The channel and strategy labels of `pool` as (JSON path, pointer, what, name),
    bounded like an id: the channel is part of every capacity counter's key, a label
    names its strategy in every decision and shadow report."""
    found = [("$.channel", "/channel", "pool channel", pool.channel)]
    if pool.strategy.label is not None:
        found.append(("$.strategy.label", "/strategy/label", "strategy label", pool.strategy.label))
    found.extend(
        (f"$.shadows[{i}].label", f"/shadows/{i}/label", "shadow label", s.label)
        for i, s in enumerate(pool.shadows)
        if s.label is not None
    )
    return found


def _slashed_pool_id(pool_id: str) -> str | None:
    """Why `pool_id` cannot name a pool, or None: a `/` in it would leave the pool
    out of reach of `/v1/pools/{id}` and its `/settlement` and `/shadow-report`."""
    if "/" in pool_id:
        return "pool id may not contain '/' (the pool's own URLs could not reach it)"
    return None


class _Stale(Exception):
    """The configuration changed between the read and the write: build again."""


_E = TypeVar("_E", Worker, Pool)


def _replaced(items: tuple[_E, ...], item: _E) -> tuple[_E, ...]:
    """`items` (ordered by id, as the store lists them) with `item` put in by id."""
    kept = [i for i in items if i.id != item.id]
    kept.append(item)
    return tuple(sorted(kept, key=lambda i: i.id))


def _relative(error: ConfigError, prefix: str | None) -> ConfigError:
    """`error` with the pointers of problems inside the changed object made relative
    to the request body (`/rule_set/rules/0/when` becomes `/rules/0/when`); problems
    elsewhere in the configuration keep their configuration pointers."""
    problems = error.details
    if prefix is None or not isinstance(problems, list):
        return error
    moved = [
        Problem(pointer=p.pointer[len(prefix) :], message=p.message)
        if isinstance(p, Problem) and (p.pointer == prefix or p.pointer.startswith(prefix + "/"))
        else p
        for p in problems
    ]
    summary = "; ".join(f"{p.pointer}: {p.message}" for p in moved[:5])
    return ConfigError(f"invalid routing configuration: {summary}", details=moved)


def _references(config: _Config, what: str, entity_id: str) -> list[dict[str, str]]:
    """What in `config` still names the worker or pool `entity_id`, with pointers."""
    if what == "worker":
        return [
            {"pool": pool.id, "pointer": f"/pools/{i}/members/{j}/worker"}
            for i, pool in enumerate(config.pools)
            for j, member in enumerate(pool.members)
            if member.worker == entity_id
        ]
    rules = config.rules
    used = [
        {"rule": rule.id, "pointer": f"/rule_set/rules/{i}/pool"}
        for i, rule in enumerate(rules.rules)
        if rule.pool == entity_id
    ]
    if rules.default_pool == entity_id:
        used.append({"rule_set": rules.id, "pointer": "/rule_set/default_pool"})
    return used


_Entity = TypeVar("_Entity", Worker, Pool)


def _origins(
    stored: Sequence[_Entity], given: Sequence[_Entity | None]
) -> list[tuple[_Entity, int | None]]:
    """The merged objects by id, each with its index in the body (None for a stored
    one the body does not name); a body may name one id twice: both are kept."""
    named = {item.id for item in given if item is not None}
    return sorted(
        [(item, None) for item in stored if item.id not in named]
        + [(item, i) for i, item in enumerate(given) if item is not None],
        key=lambda pair: pair[0].id,
    )


def _body_problem(
    found: Problem,
    workers: Sequence[tuple[Worker, int | None]],
    pools: Sequence[tuple[Pool, int | None]],
    rules_given: bool,
) -> Problem:
    """`found` (a pointer into a whole configuration) with its pointer moved into a
    `ConfigCheckBody`; a stored object's problem keeps no pointer and names the object.
    `workers` and `pools` are the configuration's, each with its index in the body
    (None for a stored one)."""
    parts = found.pointer.split("/", 3)  # "", "workers", "3", rest
    if len(parts) >= 3 and parts[1] in ("workers", "pools") and parts[2].isdigit():
        items: Sequence[tuple[Worker | Pool, int | None]] = (
            workers if parts[1] == "workers" else pools
        )
        index = int(parts[2])
        rest = "/" + parts[3] if len(parts) == 4 else ""
        if index < len(items):
            item, given = items[index]
            if given is not None:
                return Problem(pointer=f"/{parts[1]}/{given}{rest}", message=found.message)
            what = parts[1][:-1]
            return Problem(
                pointer="", message=f"stored {what} {item.id!r}: {rest}: {found.message}"
            )
    if found.pointer.startswith(("/enrichers", "/kinds")):
        found = Problem(pointer="/rule_set" + found.pointer, message=found.message)
    if rules_given:
        return found
    return Problem(pointer="", message=f"stored rule set: {found.pointer}: {found.message}")


class RoutingService:
    """Routing configuration and decisions of every tenant, on one store.

    Args:
        store: the opened store.
        engine: the CEL engine routers compile with.
        clock: the decision time source.
        registry: strategy registry (built-ins plus the installed plugins by default).
        max_attempts: how often a decision is routed again after losing a cap race.
        receipts: where decision receipts are signed, if anywhere.
        enrichers: the enricher plugins configurations may name (the installed plugins
            by default).
        kinds: the plugin validators of routable kinds (none if None).
        hooks: told of each decision and ledger entry after it commits (none if None).
    """

    def __init__(
        self,
        store: Store,
        *,
        engine: ExpressionEngine,
        clock: Clock | None = None,
        registry: StrategyRegistry | None = None,
        max_attempts: int = 20,
        receipts: ReceiptService | None = None,
        enrichers: EnricherRegistry | None = None,
        kinds: KindValidators | None = None,
        hooks: HookDispatcher | None = None,
    ) -> None:
        self.store = store
        if enrichers is None:
            enrichers = plugin_enrichers(installed_extensions())
        self.enrichers = enrichers
        self.kinds = kinds if kinds is not None else KindValidators()
        self.hooks = hooks if hooks is not None else HookDispatcher()
        self.receipts = receipts
        self.engine = engine
        self.clock = clock or SystemClock()
        if registry is None:
            registry = plugin_strategies(installed_extensions())
        self.registry = registry
        self.max_attempts = max_attempts
        self.conflicts = 0  # commits that lost a race and routed again
        self._routers: dict[tuple[str, str | None], tuple[int, _Compiled]] = {}

    # --- configuration -------------------------------------------------------------

    async def _load_config(self, rtx: RoutingTx, tenant_id: str) -> _Config:
        workers = tuple(_decode(b, Worker) for b in await rtx.list_entities("worker", tenant_id))
        pools = tuple(_decode(b, Pool) for b in await rtx.list_entities("pool", tenant_id))
        settled = (
            _decode(b, PoolSettlementView) for b in await rtx.list_entities("settlement", tenant_id)
        )
        settlement = {v.pool: v.settlement for v in settled}
        found = await rtx.get_rule_set(tenant_id)
        if found is None:
            return _Config(
                workers=workers, pools=pools, rules=RulesBody(), version=0, settlement=settlement
            )
        version, body, _ = found
        return _Config(
            workers=workers,
            pools=pools,
            rules=_decode(body, RulesBody),
            version=version,
            settlement=settlement,
        )

    def _build(self, config: _Config, pool: str | None = None) -> Router:
        rules = config.rules
        rule_set = RuleSet(
            id=rules.id,
            version=config.version,
            rules=rules.rules if pool is None else (),
            default_pool=rules.default_pool if pool is None else pool,
        )
        return Router(
            rule_set=rule_set,
            pools=config.pools,
            workers=config.workers,
            kinds=rules.kinds,
            engine=self.engine,
            enrichers=rules.enrichers,
            registry=self.registry,
            enricher_registry=self.enrichers,
            seed=rules.seed,
        )

    async def _change(
        self,
        tenant_id: str,
        claim: Claim | None,
        into: type[T],
        edit: Callable[[_Config], tuple[_Config, str | None]],
        apply: Callable[[RoutingTx], Awaitable[Answer[T]]],
    ) -> Answer[T]:
        """Make a configuration change, at most once per `claim`.

        `edit` gives the configuration the change leads to (from the current
        one) and the pointer prefix of the changed object in it; that
        configuration is compiled in a lane with no transaction open. The
        write transaction then bumps the generation, and only if no other
        change came in between (compare and swap on the generation read)
        runs `apply(rtx)`; otherwise it rolls back and the change is built
        again from the newer configuration.
        """
        for attempt in range(self.max_attempts):
            async with self.store.transaction() as tx:
                rtx = RoutingTx(tx)
                generation = await rtx.generation(tenant_id)
                current = await self._load_config(rtx, tenant_id)
            changed, prefix = edit(current)
            problem: ConfigError | None = None
            try:
                # Compiling every rule is heavy: a lane keeps the loop free.
                await VALIDATION.run_for(tenant_id, self._build, changed)
            except ConfigError as exc:
                problem = _relative(exc, prefix)
            try:
                async with self.store.transaction() as tx:
                    if claim is not None:
                        replay = await claim.take(tx, into)
                        if replay is not None:
                            return replay
                    rtx = RoutingTx(tx)
                    # The bump also serializes writers: a value other than the
                    # next one means another change committed since the read.
                    if await rtx.bump_generation(tenant_id) != generation + 1:
                        raise _Stale
                    if problem is not None:
                        raise problem
                    answer = await apply(rtx)
                    if claim is not None:
                        await claim.settle(tx, answer)
            except _Stale:
                self.conflicts += 1
                await asyncio.sleep(0.001 * min(attempt, 10))
                continue
            return answer
        raise ConfigChangeConflict(
            f"the routing configuration changed under this change {self.max_attempts}"
            " times; try again"
        )

    async def put_worker(
        self, tenant_id: str, worker: Worker, *, idempotency_key: str | None = None
    ) -> Answer[Worker]:
        """Create (`CREATED`) or replace (`OK`) a worker.

        Raises:
            ConfigError: the change would leave the configuration inconsistent.
            IdempotencyConflict: the key was used with another worker.
        """
        check_name("worker id", worker.id, RequestInvalid, path="$.id")
        for path, _, what, name in _worker_names(worker):
            check_name(what, name, RequestInvalid, path=path)
        return await self._put(tenant_id, "worker", worker, Worker, idempotency_key)

    async def put_pool(
        self, tenant_id: str, pool: Pool, *, idempotency_key: str | None = None
    ) -> Answer[Pool]:
        """Create (`CREATED`) or replace (`OK`) a pool (its members must be existing workers).

        Raises:
            ConfigError: unknown member, bad strategy or CEL, duplicates (every problem).
            IdempotencyConflict: the key was used with another pool.
        """
        check_name("pool id", pool.id, RequestInvalid, path="$.id")
        slashed = _slashed_pool_id(pool.id)
        if slashed is not None:
            raise RequestInvalid(slashed, details={"path": "$.id", "reason": slashed})
        for path, _, what, name in _pool_names(pool):
            check_name(what, name, RequestInvalid, path=path)
        return await self._put(tenant_id, "pool", pool, Pool, idempotency_key)

    async def _put(
        self,
        tenant_id: str,
        what: str,
        entity: _E,
        into: type[_E],
        idempotency_key: str | None,
    ) -> Answer[_E]:
        """Create (`CREATED`) or replace (`OK`) the worker or pool `entity`: stored
        under its id, and put in by id in the configuration's `<what>s`."""
        field = what + "s"
        now = self.clock.now()
        claim = Claim.of(tenant_id, f"routing.{field}.put", idempotency_key, entity, now=now)

        async def apply(rtx: RoutingTx) -> Answer[_E]:
            created = await rtx.put_entity(
                what, tenant_id, entity.id, msgspec.json.encode(entity), now
            )
            return Answer(entity, MutationOutcome.CREATED if created else MutationOutcome.OK)

        def edit(config: _Config) -> tuple[_Config, str | None]:
            items = _replaced(getattr(config, field), entity)
            at = next(i for i, item in enumerate(items) if item.id == entity.id)
            return msgspec.structs.replace(config, **{field: items}), f"/{field}/{at}"

        return await self._change(tenant_id, claim, into, edit, apply)

    async def put_settlement(
        self,
        tenant_id: str,
        pool_id: str,
        settlement: PoolSettlement,
        *,
        idempotency_key: str | None = None,
    ) -> Answer[PoolSettlementView]:
        """Set a pool's settlement (`CREATED` the first time, then `OK`); the next
        decision of the pool charges by it.

        Raises:
            RoutingObjectNotFound: no such pool.
            SettlementInvalid: a bad price rule, return policy or account (every problem).
            IdempotencyConflict: the key was used with another setting.
        """
        now = self.clock.now()
        claim = Claim.of(
            tenant_id,
            "routing.pools.settlement",
            idempotency_key,
            settlement,
            now=now,
            target=pool_id,
        )
        view = PoolSettlementView(pool=pool_id, settlement=settlement)
        async with self.store.transaction() as tx:
            if await RoutingTx(tx).get_entity("pool", tenant_id, pool_id) is None:
                raise RoutingObjectNotFound("pool", pool_id)
            raise_problems(await check_settlement(tx, tenant_id, pool_id, settlement))

        async def apply(rtx: RoutingTx) -> Answer[PoolSettlementView]:
            if await rtx.get_entity("pool", tenant_id, pool_id) is None:
                raise RoutingObjectNotFound("pool", pool_id)
            created = await rtx.put_entity(
                "settlement", tenant_id, pool_id, msgspec.json.encode(view), now
            )
            return Answer(view, MutationOutcome.CREATED if created else MutationOutcome.OK)

        def edit(config: _Config) -> tuple[_Config, str | None]:
            changed = {**config.settlement, pool_id: settlement}
            return msgspec.structs.replace(config, settlement=changed), None

        return await self._change(tenant_id, claim, PoolSettlementView, edit, apply)

    async def get_settlement(self, tenant_id: str, pool_id: str) -> PoolSettlementView:
        """A pool's settlement (`settlement.not_found` when the pool has none)."""
        async with self.store.transaction() as tx:
            rtx = RoutingTx(tx)
            if await rtx.get_entity("pool", tenant_id, pool_id) is None:
                raise RoutingObjectNotFound("pool", pool_id)
            raw = await rtx.get_entity("settlement", tenant_id, pool_id)
        if raw is None:
            raise RoutingObjectNotFound("settlement", pool_id)
        view: PoolSettlementView = _decode(raw, PoolSettlementView)
        return view

    async def delete_entity(self, tenant_id: str, what: str, entity_id: str) -> None:
        """Delete a worker or pool.

        Raises:
            RoutingObjectNotFound: no such worker or pool.
            RoutingObjectInUse: a pool or rule still refers to it.
        """

        async def apply(rtx: RoutingTx) -> Answer[None]:
            if not await rtx.delete_entity(what, tenant_id, entity_id):
                raise RoutingObjectNotFound(what, entity_id)
            if what == "pool":  # a pool made again later starts unsettled
                await rtx.delete_entity("settlement", tenant_id, entity_id)
            return Answer(None)

        def edit(config: _Config) -> tuple[_Config, str | None]:
            used_by = _references(config, what, entity_id)
            if used_by:
                raise RoutingObjectInUse(what, entity_id, used_by)
            if what == "worker":
                workers = tuple(w for w in config.workers if w.id != entity_id)
                return msgspec.structs.replace(config, workers=workers), None
            pools = tuple(p for p in config.pools if p.id != entity_id)
            settlement = {k: v for k, v in config.settlement.items() if k != entity_id}
            return msgspec.structs.replace(config, pools=pools, settlement=settlement), None

        await self._change(tenant_id, None, type(None), edit, apply)

    async def get_worker(self, tenant_id: str, worker_id: str) -> Worker:
        """One worker (RoutingObjectNotFound if absent)."""
        raw = await self._get("worker", tenant_id, worker_id)
        worker: Worker = _decode(raw, Worker)
        return worker

    async def get_pool(self, tenant_id: str, pool_id: str) -> Pool:
        """One pool (RoutingObjectNotFound if absent)."""
        raw = await self._get("pool", tenant_id, pool_id)
        pool: Pool = _decode(raw, Pool)
        return pool

    async def _get(self, what: str, tenant_id: str, entity_id: str) -> bytes:
        async with self.store.transaction() as tx:
            raw = await RoutingTx(tx).get_entity(what, tenant_id, entity_id)
        if raw is None:
            raise RoutingObjectNotFound(what, entity_id)
        return raw

    async def list_workers(self, tenant_id: str) -> list[Worker]:
        """Every worker of the tenant, by id."""
        async with self.store.transaction() as tx:
            raws = await RoutingTx(tx).list_entities("worker", tenant_id)
        return [_decode(r, Worker) for r in raws]

    async def list_pools(self, tenant_id: str) -> list[Pool]:
        """Every pool of the tenant, by id."""
        async with self.store.transaction() as tx:
            raws = await RoutingTx(tx).list_entities("pool", tenant_id)
        return [_decode(r, Pool) for r in raws]

    async def publish_rules(
        self, tenant_id: str, rules: RulesBody, *, idempotency_key: str | None = None
    ) -> Answer[RuleSetView]:
        """Store `rules` as the tenant's next rule set version (`CREATED`); routing uses
        it at once.

        Raises:
            ConfigError: unknown pool, bad CEL, duplicate rule (every problem, with pointers).
            IdempotencyConflict: the key was used with another rule set.
        """
        check_name("rule set id", rules.id, RequestInvalid, path="$.id")
        for path, _, what, name in _rule_set_names(rules):
            check_name(what, name, RequestInvalid, path=path)
        now = self.clock.now()
        claim = Claim.of(tenant_id, "routing.rules.publish", idempotency_key, rules, now=now)

        async def apply(rtx: RoutingTx) -> Answer[RuleSetView]:
            version = await rtx.insert_rule_set(tenant_id, msgspec.json.encode(rules), now)
            view = RuleSetView(version=version, created_at=now, rule_set=rules)
            return Answer(view, MutationOutcome.CREATED)

        def edit(config: _Config) -> tuple[_Config, str | None]:
            changed = msgspec.structs.replace(config, rules=rules, version=config.version + 1)
            return changed, "/rule_set"

        return await self._change(tenant_id, claim, RuleSetView, edit, apply)

    async def check_config(self, tenant_id: str, body: ConfigCheckBody) -> ConfigCheck:
        """Check `body`'s workers, pools and rule set as their puts would, and the
        configuration they lead to as a whole; write nothing."""
        problems: list[Problem] = []
        broken: set[str] = set()

        def shaped(raw: Any, into: type[_S], at: str, what: str) -> _S | None:
            found = [
                Problem(pointer=p["pointer"], message=p["message"])
                for p in problems_of(raw, into, at)
            ]
            name = raw.get("id", "default") if isinstance(raw, dict) else None
            if isinstance(raw, dict):
                try:
                    check_name(what, name, RequestInvalid)
                except RequestInvalid as exc:
                    found.append(Problem(pointer=f"{at}/id", message=exc.message))
                else:
                    slashed = _slashed_pool_id(str(name)) if into is Pool else None
                    if slashed is not None:
                        found.append(Problem(pointer=f"{at}/id", message=slashed))
            if found:
                problems.extend(found)
                if isinstance(name, str):
                    broken.add(name)
                return None
            return msgspec.convert(raw, into)

        workers = [
            shaped(w, Worker, f"/workers/{i}", "worker id") for i, w in enumerate(body.workers)
        ]
        pools = [shaped(p, Pool, f"/pools/{i}", "pool id") for i, p in enumerate(body.pools)]
        rules = (
            None
            if body.rule_set is None
            else shaped(body.rule_set, RulesBody, "/rule_set", "rule set id")
        )
        for _, pointer, what, name in () if rules is None else _rule_set_names(rules):
            try:
                check_name(what, name, RequestInvalid)
            except RequestInvalid as exc:
                problems.append(Problem(pointer=f"/rule_set{pointer}", message=exc.message))
        named = [
            (f"/workers/{i}{pointer}", what, name)
            for i, worker in enumerate(workers)
            if worker is not None
            for _, pointer, what, name in _worker_names(worker)
        ]
        named.extend(
            (f"/pools/{i}{pointer}", what, name)
            for i, pool in enumerate(pools)
            if pool is not None
            for _, pointer, what, name in _pool_names(pool)
        )
        for pointer, what, name in named:
            try:
                check_name(what, name, RequestInvalid)
            except RequestInvalid as exc:
                problems.append(Problem(pointer=pointer, message=exc.message))
        async with self.store.transaction() as tx:
            current = await self._load_config(RoutingTx(tx), tenant_id)
        # Each object of the merged configuration with where it came from: its index in
        # the body, or None if stored (a body may name one id twice: both are checked).
        worker_origins = _origins(current.workers, workers)
        pool_origins = _origins(current.pools, pools)
        merged_workers = tuple(w for w, _ in worker_origins)
        merged_pools = tuple(p for p, _ in pool_origins)
        changed = msgspec.structs.replace(
            current,
            workers=merged_workers,
            pools=merged_pools,
            rules=rules if rules is not None else current.rules,
        )
        try:
            await VALIDATION.run_for(tenant_id, self._build, changed)
        except ConfigError as exc:
            details = exc.details if isinstance(exc.details, list) else []
            for found in details:
                if not isinstance(found, Problem):
                    continue
                if found.message.startswith("unknown worker ") and any(
                    found.message == f"unknown worker {b!r}" for b in broken
                ):
                    continue  # the worker's own problems were reported
                problems.append(
                    _body_problem(found, worker_origins, pool_origins, body.rule_set is not None)
                )
        return ConfigCheck(valid=not problems, problems=problems)

    async def get_rules(self, tenant_id: str, version: int | None = None) -> RuleSetView:
        """The latest rule set, or one version (RoutingObjectNotFound if absent)."""
        async with self.store.transaction() as tx:
            found = await RoutingTx(tx).get_rule_set(tenant_id, version)
        if found is None:
            raise RoutingObjectNotFound("rule_set", "latest" if version is None else str(version))
        number, body, created_at = found
        return RuleSetView(version=number, created_at=created_at, rule_set=_decode(body, RulesBody))

    async def list_rule_versions(self, tenant_id: str) -> list[RuleSetVersion]:
        """Every version of the tenant's rule set, newest first."""
        async with self.store.transaction() as tx:
            found = await RoutingTx(tx).list_rule_set_versions(tenant_id)
        return [RuleSetVersion(version=v, created_at=at) for v, at in found]

    # --- routing ---------------------------------------------------------------------

    async def _read(
        self, tenant_id: str, pool: str | None, now: datetime
    ) -> tuple[int, _Compiled, Snapshot]:
        """The configuration generation, its compiled router and a snapshot of the
        counters and marks it reads, from one short read transaction (a router
        not cached yet is compiled in a lane after that transaction, then read again).
        """
        for _ in range(self.max_attempts):
            async with self.store.transaction() as tx:
                rtx = RoutingTx(tx)
                generation = await rtx.generation(tenant_id)
                cached = self._routers.get((tenant_id, pool))
                if cached is not None and cached[0] == generation:
                    compiled = cached[1]
                    return generation, compiled, await self._snapshot(tx, tenant_id, compiled, now)
                config = await self._load_config(rtx, tenant_id)
            if pool is not None and pool not in {p.id for p in config.pools}:
                raise RoutingObjectNotFound("pool", pool)
            router = await VALIDATION.run_for(tenant_id, self._build, config, pool)
            self._routers[(tenant_id, pool)] = (
                generation,
                _Compiled(router, _route_cost(config, pool, self.engine), config),
            )
        raise AssignConflict(
            f"the routing configuration kept changing for {self.max_attempts} tries; try again"
        )

    async def _router(self, tenant_id: str, pool: str | None = None) -> Router:
        """The compiled router of the tenant's current configuration (or of one pool)."""
        _, compiled, _ = await self._read(tenant_id, pool, self.clock.now())
        return compiled.router

    async def route(
        self,
        tenant_id: str,
        body: RouteBody,
        *,
        decision_id: str | None = None,
        origin: str | None = None,
        idempotency_key: str | None = None,
    ) -> Answer[DecisionView]:
        """Route one routable and commit the decision (and its assignment) atomically;
        `CREATED`.

        `decision_id` makes the call idempotent for the engine: a decision
        already stored under it is returned as it was. `origin` ties the
        assignment to a workflow step. `idempotency_key` makes it idempotent for
        a caller: claimed in the transaction that commits the decision.

        Raises:
            RoutableInvalid: the routable fails its kind's schema (nothing is stored).
            RoutingObjectNotFound: `body.pool` names no pool.
            AssignConflict: caps kept changing under it for `max_attempts` tries.
            IdempotencyConflict: the key was used with another routable.
            EntitlementMissing: the tenant's plan lacks `routing`.
            BudgetExceeded: a blocking budget on `route_decisions` (nothing is stored).
        """
        started = time.perf_counter()
        outcome = "error"
        with tracer.start_as_current_span(
            "ductor.route",
            attributes={"ductor.tenant": tenant_id, "ductor.routable.kind": body.kind},
        ) as span:
            try:
                answer = await self._route(
                    tenant_id,
                    body,
                    decision_id=decision_id,
                    origin=origin,
                    idempotency_key=idempotency_key,
                )
                outcome = str(answer.value.outcome)
                span.set_attribute("ductor.decision_id", answer.value.id)
                span.set_attribute("ductor.route.outcome", outcome)
                return answer
            except RoutableInvalid:
                outcome = str(Outcome.INVALID)  # refused whole: nothing was stored
                span.set_attribute("ductor.route.outcome", outcome)
                raise
            finally:
                ROUTE_DURATION.record(
                    time.perf_counter() - started,
                    {
                        "ductor.route.outcome": outcome,
                        "ductor.route.origin": "api" if origin is None else "step",
                    },
                )

    async def _route(
        self,
        tenant_id: str,
        body: RouteBody,
        *,
        decision_id: str | None = None,
        origin: str | None = None,
        idempotency_key: str | None = None,
    ) -> Answer[DecisionView]:
        check_name("routable id", body.id, RequestInvalid, path="$.id")
        check_name("routable kind", body.kind, RequestInvalid, path="$.kind")
        if body.pool is not None:
            check_name("pool id", body.pool, RequestInvalid, path="$.pool")
        for index, worker in enumerate(body.exclude):
            check_name("excluded worker id", worker, RequestInvalid, path=f"$.exclude[{index}]")
        created = MutationOutcome.CREATED
        if decision_id is not None:
            found = await self._stored_decision(tenant_id, decision_id)
            if found is not None:
                return Answer(found, created)
        claim = Claim.of(tenant_id, "routing.route", idempotency_key, body, now=self.clock.now())
        did = decision_id or f"dec_{uuid.uuid4().hex}"
        routable = Routable(
            id=body.id,
            kind=body.kind,
            tenant=tenant_id,
            attributes=body.attributes,
            consent=body.consent,
            price=body.price,
        )
        problems = self.kinds.problems(routable)
        if problems:
            raise RoutableInvalid(
                f"routable {body.id!r} is invalid for kind {body.kind!r}",
                msgspec.to_builtins(problems),
            )
        for attempt in range(self.max_attempts):
            now = self.clock.now()
            # Read in one short transaction, route with none open, commit in a
            # second: the snapshot may be stale by then, and the conditional
            # counter updates and the generation check catch that (route again).
            generation, compiled, state = await self._read(tenant_id, body.pool, now)
            failure: DuctorError | None = None
            decision: Decision | None = None
            try:
                if compiled.inline(routable):
                    decision = compiled.router.route(
                        routable,
                        state,
                        now,
                        decision_id=did,
                        exclude=body.exclude,
                        funds=state.funds,
                    )
                else:
                    decision = await VALIDATION.run_for(
                        tenant_id,
                        compiled.router.route,
                        routable,
                        state,
                        now,
                        decision_id=did,
                        exclude=body.exclude,
                        funds=state.funds,
                    )
            except DuctorError as exc:
                failure = exc  # raised after the claim: a committed answer wins
            try:
                async with self.store.transaction() as tx:
                    if claim is not None:
                        replay = await claim.take(tx, DecisionView)
                        if replay is not None:
                            return replay
                    rtx = RoutingTx(tx)
                    if await rtx.generation(tenant_id) != generation:
                        raise _Stale
                    await require_entitlement(tx, tenant_id, "routing")
                    if failure is not None:
                        raise failure
                    assert decision is not None
                    if decision.outcome is Outcome.INVALID:
                        raise RoutableInvalid(
                            f"routable {body.id!r} is invalid for kind {body.kind!r}",
                            msgspec.to_builtins(decision.problems),
                        )
                    fresh, assignment_id = await self._commit(
                        tx, compiled, tenant_id, decision, origin, now, body
                    )
                    if fresh:
                        await charge_usage(tx, tenant_id, "route_decisions", 1, now)
                        answer = Answer(_view(decision, assignment_id), created)
                        self.hooks.after_commit(
                            tx,
                            DECISION_MADE,
                            at=now,
                            tenant_id=tenant_id,
                            data=to_data(answer.value),
                        )
                    else:  # the engine routed this decision id before: answer as it was
                        stored = await self._decision_in(rtx, tenant_id, did)
                        assert stored is not None
                        answer = Answer(stored, created)
                    if claim is not None:
                        await claim.settle(tx, answer)
            except (AssignConflict, _Stale):
                self.conflicts += 1
                await asyncio.sleep(0.001 * min(attempt, 10))
                continue
            return answer
        raise AssignConflict(
            f"routable {body.id!r} lost {self.max_attempts} races for capacity; try again",
            details={"decision_id": did},
        )

    async def _snapshot(
        self, tx: Tx, tenant_id: str, compiled: _Compiled, now: datetime
    ) -> Snapshot:
        rtx = RoutingTx(tx)
        router = compiled.router
        keys: dict[str, CounterKey] = {}
        scopes: list[str] = [""]
        for pool_id in router.pool_ids:
            for key in router.counter_keys(pool_id, now):
                keys[counter_text(key)] = key
            scopes.extend(router.mark_scopes(pool_id))
        values = await rtx.read_counters(tenant_id, list(keys))
        counters = {keys[text]: value for text, value in values.items()}
        marks = {
            (MarkKind(kind), scope, key): value
            for kind, scope, key, value in await rtx.read_marks(tenant_id, scopes)
        }
        funds = await funds_for(tx, tenant_id, compiled.settled, now) if compiled.settled else None
        return Snapshot(counters, marks, funds)

    async def _commit(
        self,
        tx: Tx,
        compiled: _Compiled,
        tenant_id: str,
        decision: Decision,
        origin: str | None,
        now: datetime,
        routable: RouteBody,
    ) -> tuple[bool, str | None]:
        """Store the decision and make its intent real: (fresh, assignment id);
        fresh is False (nothing written) when the decision id was already stored."""
        rtx = RoutingTx(tx)
        fresh = await rtx.insert_decision(
            tenant_id,
            decision_id=decision.id,
            routable_id=decision.routable_id,
            outcome=decision.outcome.value,
            pool=decision.pool,
            worker=decision.worker,
            charge=decision.charge,
            body=encode_decision(decision),
            now=now,
        )
        if not fresh:
            return False, None
        intent = decision.intent
        if decision.outcome is not Outcome.ASSIGNED or intent is None:
            return True, None
        # A fixed lock order (sorted keys) means concurrent commits never deadlock.
        ordered = sorted(intent.reservations, key=lambda r: counter_text(r.key))
        texts = [counter_text(r.key) for r in ordered]
        fits = await rtx.reserve_many(
            tenant_id, [(t, r.amount, r.limit) for t, r in zip(texts, ordered, strict=True)]
        )
        for res, fit in zip(ordered, fits, strict=True):
            if not fit:
                raise AssignConflict(
                    f"{res.key.scope.value} counter of {res.key.worker!r} is at its limit",
                    details={"decision_id": decision.id},
                )
        held = [
            StoredReservation(key=t, amount=r.amount, scope=r.key.scope.value)
            for t, r in zip(texts, ordered, strict=True)
        ]
        await rtx.set_marks(
            tenant_id,
            [
                (m.kind.value, m.scope, m.key, m.value)
                for m in (*intent.marks, *intent.shadow_marks)
            ],
        )
        assignment_id = "asg_" + decision.id.removeprefix("dec_")
        await rtx.insert_assignment(
            AssignmentRecord(
                tenant_id=tenant_id,
                id=assignment_id,
                decision_id=decision.id,
                routable_id=decision.routable_id,
                pool=intent.pool,
                worker=intent.worker,
                channel=intent.channel,
                charge=intent.charge,
                status=ASSIGNED,
                reservations=tuple(held),
                origin=origin,
                result=None,
                reason="",
                created_at=now,
                updated_at=now,
            )
        )
        await self._settle(tx, compiled, tenant_id, decision, assignment_id, now, routable)
        return True, assignment_id

    async def _settle(
        self,
        tx: Tx,
        compiled: _Compiled,
        tenant_id: str,
        decision: Decision,
        assignment_id: str,
        now: datetime,
        routable: RouteBody,
    ) -> tuple[str, ...]:
        """Charge an assignment of a settled pool in its commit's transaction: the ids
        of the ledger entries written (none when its pool is not settled, or when
        its charge is held until the assignment completes).

        Raises:
            AssignConflict: the buyer's wallet was spent since the snapshot.
        """
        intent = decision.intent
        assert intent is not None
        found = compiled.settled.get(intent.pool)
        if found is None:
            return ()
        written, held = await settle_assignment(
            tx,
            tenant_id,
            found[0],
            pool=intent.pool,
            worker=intent.worker,
            routing_charge=intent.charge,
            decision_id=decision.id,
            assignment_id=assignment_id,
            now=now,
            on_entry=self._entry_posted(tx, now),
        )
        await SettlementTx(tx).insert_charge(
            tenant_id,
            assignment_id,
            written[0] if written else None,
            msgspec.json.encode(routable),
            now,
            postings=held,
            config_hash=compiled.config_hash,
        )
        if written:
            priced = quote(found[0].rule(intent.pool), routing_charge=intent.charge)
            await self._receipt(
                tx,
                tenant_id,
                assignment_id,
                decision,
                Cost(micros=priced.charge, currency=priced.currency),
                compiled.config_hash,
                written,
                routable.consent,
                now,
            )
        return written

    def _entry_posted(self, tx: Tx, now: datetime) -> Callable[[Entry], None]:
        """Tells the hooks of a ledger entry written in `tx`, once `tx` commits."""

        def posted(entry: Entry) -> None:
            tell_entry_posted(self.hooks, tx, entry, now)

        return posted

    async def _receipt(
        self,
        tx: Tx,
        tenant_id: str,
        assignment_id: str,
        decision: Decision,
        cost: Cost,
        config_hash: str | None,
        entries: tuple[str, ...],
        consent: Consent | None,
        now: datetime,
    ) -> None:
        """Issue the settled assignment's signed receipt in the transaction that
        charged it, with the routable's consent as its consent trail (nothing when
        the server has no receipt key)."""
        if self.receipts is None:
            return
        trail = (
            ()
            if consent is None
            else (
                ConsentRecord(
                    granted=consent.granted,
                    scopes=consent.scopes,
                    evidence=consent.evidence,
                    captured_at=consent.captured_at,
                ),
            )
        )
        await self.receipts.issue_in(
            tx,
            tenant_id,
            Subject(kind=SubjectKind.ASSIGNMENT, id=assignment_id),
            cost=cost,
            decision=decision_ref(decision.id, msgspec.to_builtins(decision.explanation)),
            configuration_hash=config_hash,
            consent=trail,
            ledger_entries=entries,
            now=now,
        )

    async def _stored_decision(self, tenant_id: str, decision_id: str) -> DecisionView | None:
        async with self.store.transaction() as tx:
            return await self._decision_in(RoutingTx(tx), tenant_id, decision_id)

    async def _decision_in(
        self, rtx: RoutingTx, tenant_id: str, decision_id: str
    ) -> DecisionView | None:
        raw = await rtx.get_decision(tenant_id, decision_id)
        if raw is None:
            return None
        assignment = await rtx.find_assignment_by_decision(tenant_id, decision_id)
        decision: Decision = _decode(raw, Decision)
        return _view(decision, assignment.id if assignment is not None else None)

    async def get_decision(self, tenant_id: str, decision_id: str) -> DecisionView:
        """A stored decision with its explanation (RoutingObjectNotFound if absent)."""
        found = await self._stored_decision(tenant_id, decision_id)
        if found is None:
            raise RoutingObjectNotFound("decision", decision_id)
        return found

    async def shadow_report(self, tenant_id: str, pool_id: str, *, limit: int) -> ShadowReportView:
        """Agreement of the pool's shadow strategies over its latest `limit` decisions."""
        async with self.store.transaction() as tx:
            rtx = RoutingTx(tx)
            if await rtx.get_entity("pool", tenant_id, pool_id) is None:
                raise RoutingObjectNotFound("pool", pool_id)
            raws = await rtx.list_pool_decisions(tenant_id, pool_id, limit=limit)
        decisions = [_decode(r, Decision) for r in raws]
        return ShadowReportView(
            pool=pool_id,
            decisions=len(decisions),
            strategies=tuple(r for r in shadow_report(decisions) if r.pool == pool_id),
        )

    # --- assignments -----------------------------------------------------------------

    async def get_assignment(self, tenant_id: str, assignment_id: str) -> AssignmentView:
        """One assignment (RoutingObjectNotFound if absent)."""
        async with self.store.transaction() as tx:
            record = await RoutingTx(tx).get_assignment(tenant_id, assignment_id)
        if record is None:
            raise RoutingObjectNotFound("assignment", assignment_id)
        return assignment_view(record)

    async def move_assignment(
        self,
        tenant_id: str,
        assignment_id: str,
        to_status: str,
        *,
        result: Any = None,
        reason: str = "",
        idempotency_key: str | None = None,
    ) -> Answer[AssignmentView]:
        """Accept, complete, reject or expire an assignment; `OK`.

        Completing gives back the worker's load; rejecting or expiring gives
        back every reservation (load, cap, budget), so the work can go elsewhere.
        In a pool settled in hold mode, completing posts the held charge and
        rejecting or expiring voids its hold, in the same transaction.

        Raises:
            RoutingObjectNotFound: no such assignment.
            AssignmentStateConflict: it is not open (or, to accept, already accepted).
            RequestInvalid: `reason` is over `MAX_CANCEL_REASON` characters, as a
                cancel's may not be (it is kept in the assignment and a ROUTE step's error).
            IdempotencyConflict: the key was used with another result or reason.
            LedgerError: completing a held charge whose hold expired, from a wallet
                that can no longer pay it (nothing changes).
        """
        check_reason(reason)
        sources: Sequence[str] = (ASSIGNED,) if to_status == ACCEPTED else OPEN_STATUSES
        now = self.clock.now()
        claim = Claim.of(
            tenant_id,
            f"routing.assignments.{to_status}",
            idempotency_key,
            [result, reason],
            now=now,
            target=assignment_id,
        )
        async with self.store.transaction() as tx:
            if claim is not None:
                replay = await claim.take(tx, AssignmentView)
                if replay is not None:
                    return replay
            rtx = RoutingTx(tx)
            record = await rtx.get_assignment(tenant_id, assignment_id)
            if record is None:
                raise RoutingObjectNotFound("assignment", assignment_id)
            moved = await rtx.move_assignment(
                tenant_id,
                assignment_id,
                from_statuses=sources,
                to_status=to_status,
                result=result,
                reason=reason,
                now=now,
            )
            if not moved:
                raise AssignmentStateConflict(
                    f"assignment {assignment_id!r} is {record.status};"
                    f" it cannot become {to_status}",
                    details={"assignment": assignment_id, "status": record.status},
                )
            if to_status != ACCEPTED:
                give_back: Collection[str] = (
                    (CounterScope.LOAD.value,)
                    if to_status == COMPLETED
                    else tuple(s.value for s in CounterScope)
                )
                for res in sorted(record.reservations, key=lambda r: r.key):
                    if res.scope in give_back and res.amount:
                        await rtx.release(tenant_id, res.key, res.amount)
                await self._finish_held(tx, record, to_status == COMPLETED, now)
            updated = await rtx.get_assignment(tenant_id, assignment_id)
            assert updated is not None
            answer = Answer(assignment_view(updated))
            if claim is not None:
                await claim.settle(tx, answer)
        return answer

    async def _finish_held(
        self, tx: Tx, record: AssignmentRecord, complete: bool, now: datetime
    ) -> tuple[str, ...]:
        """Post (on completion) or void the held charge of an assignment of a pool
        settled in hold mode, after its counters (as every path takes them); the
        ids of the entries written."""
        settlement = SettlementTx(tx)
        charge = await settlement.get_charge(record.tenant_id, record.id)
        if charge is None or charge.entry_id is not None or charge.postings is None:
            return ()
        written = await finish_held_charge(
            tx,
            record.tenant_id,
            assignment_id=record.id,
            pool=record.pool,
            decision_id=record.decision_id,
            postings=charge.postings,
            complete=complete,
            now=now,
            on_entry=self._entry_posted(tx, now),
        )
        if written:
            await settlement.set_charge_entry(record.tenant_id, record.id, written[0])
            raw = await RoutingTx(tx).get_decision(record.tenant_id, record.decision_id)
            if raw is not None:
                debits = [p for p in charge.postings if p.amount > 0]
                await self._receipt(
                    tx,
                    record.tenant_id,
                    record.id,
                    _decode(raw, Decision),
                    Cost(micros=sum(p.amount for p in debits), currency=debits[0].currency),
                    charge.config_hash,
                    written,
                    msgspec.json.decode(charge.routable, type=RouteBody).consent,
                    now,
                )
        return written

    async def return_assignment(
        self,
        tenant_id: str,
        assignment_id: str,
        body: ReturnBody,
        *,
        idempotency_key: str | None = None,
    ) -> Answer[ReturnView]:
        """Return a settled assignment under its pool's return policy; `CREATED`.

        One transaction writes the credit entry (a reversal of the charge, linked
        to it), the return and the assignment's `returned` status; with
        `reroute` (and a policy that reroutes), the routable is then routed
        again in its pool excluding the returning buyer (and earlier ones), as
        decision ``dec_<return id>``, so a retry answers the same decision.

        Raises:
            RoutingObjectNotFound: no such assignment.
            ReturnError: ``return.not_returnable`` (not settled, or no policy),
                ``return.window_closed``, ``return.reason_not_allowed``,
                ``return.rate_exceeded``, ``return.already_returned``,
                ``return.invalid_amount``; nothing is written.
            LedgerError: the ledger refuses the credit (e.g. a seller payable's floor).
            IdempotencyConflict: the key was used with another body.
        """
        now = self.clock.now()
        claim = Claim.of(
            tenant_id,
            "routing.assignments.return",
            idempotency_key,
            body,
            now=now,
            target=assignment_id,
        )
        if claim is not None:
            digest = hashlib.sha256(f"{tenant_id}\x1f{assignment_id}\x1f{claim.key}".encode())
            return_id = "ret_" + digest.hexdigest()[:32]
        else:
            return_id = "ret_" + uuid.uuid4().hex
        answer: Answer[ReturnView] | None = None
        async with self.store.transaction() as tx:
            if claim is not None:
                answer = await claim.take(tx, ReturnView)
            if answer is None:
                answer = await self._credit_return(
                    tx, tenant_id, assignment_id, body, return_id, now
                )
                if claim is not None:
                    await claim.settle(tx, answer)
        view = answer.value
        if not body.reroute or view.decision is not None:
            return answer
        async with self.store.transaction() as tx:
            record = await RoutingTx(tx).get_assignment(tenant_id, assignment_id)
            charge = await SettlementTx(tx).get_charge(tenant_id, assignment_id)
            raw = (
                await RoutingTx(tx).get_entity("settlement", tenant_id, record.pool)
                if record
                else None
            )
        assert record is not None
        assert charge is not None
        setting = _decode(raw, PoolSettlementView).settlement if raw is not None else None
        if setting is None or setting.returns is None or not setting.returns.reroute:
            return answer
        routed: RouteBody = _decode(charge.routable, RouteBody)
        again = msgspec.structs.replace(
            routed,
            pool=record.pool,
            exclude=tuple(dict.fromkeys((*routed.exclude, record.worker))),
        )
        decision = await self.route(tenant_id, again, decision_id="dec_" + return_id)
        with_decision = msgspec.structs.replace(view, decision=decision.value)
        return Answer(with_decision, answer.outcome, replayed=answer.replayed)

    async def _credit_return(
        self,
        tx: Tx,
        tenant_id: str,
        assignment_id: str,
        body: ReturnBody,
        return_id: str,
        now: datetime,
    ) -> Answer[ReturnView]:
        rtx = RoutingTx(tx)
        settlement = SettlementTx(tx)
        ledger = LedgerTx(tx)
        # Locked first (then counters, then accounts): two returns of one
        # assignment run one after the other, the second seeing the first's credit.
        record = await rtx.get_assignment(tenant_id, assignment_id, lock=True)
        if record is None:
            raise RoutingObjectNotFound("assignment", assignment_id)
        charge = await settlement.get_charge(tenant_id, assignment_id)
        raw = await rtx.get_entity("settlement", tenant_id, record.pool)
        setting = _decode(raw, PoolSettlementView).settlement if raw is not None else None
        entry = None
        if charge is not None and charge.entry_id is not None:
            entry = await ledger.get_entry(tenant_id, charge.entry_id)
        if setting is None or entry is None or charge is None:
            raise NotReturnable(
                f"assignment {assignment_id} was not charged by a settled pool",
                details={"assignment": assignment_id, "pool": record.pool},
            )
        policy = setting.returns.policy() if setting.returns is not None else None
        routed: RouteBody = _decode(charge.routable, RouteBody)
        since = now - (policy.rate_window if policy is not None else timedelta(0))

        async def decide(reversals: Sequence[Entry]) -> ReturnCredit:
            assigned, returned = await settlement.buyer_stats(
                tenant_id, record.pool, record.worker, since, excluding=assignment_id
            )
            already: dict[str, int] = {}
            for reversal in reversals:
                for posting in reversal.postings:
                    already[posting.account] = already.get(posting.account, 0) + posting.amount
            facts = AssignmentFacts(
                assignment_id=assignment_id,
                routable_id=record.routable_id,
                pool=record.pool,
                buyer=record.worker,
                # The account the charge debited (the wallet prefix may have changed since).
                buyer_account=next(p.account for p in entry.postings if p.amount > 0),
                delivered_at=record.created_at,
                charge_entry=entry,
                already_reversed=already,
                excluded=routed.exclude,
            )
            decided = decide_return(
                policy,
                facts,
                now=now,
                stats=ReturnStats(assignments=assigned, returns=returned),
                reason=body.reason,
                return_id=return_id,
                amount=body.amount,
            )
            if isinstance(decided, ReturnRefusal):
                if decided.code == AlreadyReturned.code:
                    # Name the return that took the charge back, not this refused attempt.
                    last = await settlement.last_return_id(tenant_id, assignment_id)
                    details = {**decided.details, "return": last}
                    decided = msgspec.structs.replace(decided, details=details)
                raise decided.error()
            return decided

        reversals = await ledger.reversals_of(tenant_id, entry.id)
        decided = await decide(reversals)
        # Counters before accounts, as a routing commit takes them: no deadlock.
        moved = await rtx.move_assignment(
            tenant_id,
            assignment_id,
            from_statuses=(*OPEN_STATUSES, COMPLETED, RETURNED),
            to_status=RETURNED,
            result=record.result,
            reason=body.reason,
            now=now,
        )
        if moved and record.status in OPEN_STATUSES:
            for res in sorted(record.reservations, key=lambda r: r.key):
                if res.scope == CounterScope.LOAD.value and res.amount:
                    await rtx.release(tenant_id, res.key, res.amount)
        # Every account of the charge (a credit posts to some of them), then decide
        # again on what the lock lets through: a reversal of the charge posted by
        # hand, or another return of the buyer's (both post to these accounts),
        # that committed since the first reading is seen, so the credit is what
        # is left and the buyer's return rate counts the other return.
        accounts = {p.account for p in entry.postings}
        locked, holds = await ledger.lock_with_holds(tenant_id, accounts, now)
        reversals = await ledger.reversals_of(tenant_id, entry.id)
        decided = await decide(reversals)
        book = Ledger.from_snapshot(
            LedgerSnapshot(
                tenant_id=tenant_id,
                accounts=tuple(r.account for r in locked),
                balances={r.account.code: r.balance for r in locked},
                holds=tuple(holds),
                entries=(entry, *reversals),
            )
        )
        credit = book.post(decided.entry, at=now)
        if await ledger.write_entry(credit, now):
            tell_entry_posted(self.hooks, tx, credit, now)
        await settlement.insert_return(
            ReturnRecord(
                tenant_id=tenant_id,
                id=return_id,
                assignment_id=assignment_id,
                pool=record.pool,
                buyer=record.worker,
                reason=body.reason,
                amount=decided.amount,
                currency=decided.currency,
                entry_id=credit.id,
                created_at=now,
            )
        )
        view = ReturnView(
            id=return_id,
            assignment_id=assignment_id,
            reason=body.reason,
            amount=decided.amount,
            currency=decided.currency,
            full=decided.full,
            entry_id=credit.id,
            reverses=entry.id,
            created_at=now,
        )
        return Answer(view, MutationOutcome.CREATED)

    async def list_assignments(
        self,
        tenant_id: str,
        *,
        routable_id: str | None = None,
        worker: str | None = None,
        status: str | None = None,
        after: str | None = None,
        limit: int = 100,
    ) -> list[AssignmentView]:
        """Assignments by routable, worker (an assignee's inbox) and status, oldest first;
        with `after` (an assignment id, the last of the previous page), those after it.

        Raises:
            RequestInvalid: `status` is not an assignment status, or `after` names no
                assignment of the tenant.
        """
        # An empty filter is none, as on every list.
        routable_id, worker, status, after = (
            routable_id or None,
            worker or None,
            status or None,
            after or None,
        )
        if status is not None and status not in STATUSES:
            raise RequestInvalid(
                f"unknown assignment status {status!r}",
                details={"path": "status", "value": status, "allowed": list(STATUSES)},
            )
        async with self.store.transaction() as tx:
            store = RoutingTx(tx)
            last = None
            if after is not None:
                last = await store.get_assignment(tenant_id, after)
                if last is None:
                    raise RequestInvalid(
                        f"after names no assignment: {after!r:.300}",
                        details={"path": "after", "value": after[:300]},
                    )
            records = await store.list_assignments(
                tenant_id,
                routable_id=routable_id,
                worker=worker,
                status=status,
                after=last,
                limit=limit,
            )
        return [assignment_view(r) for r in records]

    async def assignments_of(self, tenant_id: str, routable_id: str) -> list[AssignmentView]:
        """Every assignment of one routable, oldest first."""
        async with self.store.transaction() as tx:
            records = await RoutingTx(tx).list_assignments_of_routable(tenant_id, routable_id)
        return [assignment_view(r) for r in records]


__all__ = [
    "ACCEPTED",
    "ASSIGNED",
    "COMPLETED",
    "EXPIRED",
    "OPEN_STATUSES",
    "REJECTED",
    "RETURNED",
    "AssignmentView",
    "DecisionView",
    "OutcomeBody",
    "ReturnBody",
    "ReturnView",
    "RouteBody",
    "RoutingService",
    "RuleSetVersion",
    "RuleSetView",
    "RulesBody",
    "ShadowReportView",
    "Snapshot",
    "assignment_view",
    "counter_text",
]
