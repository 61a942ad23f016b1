"""The composition root: the store, the expression engine, the action registry, the
engine runtime and every service of one process, built once from the settings.

Nothing else builds these: the REST app's lifespan and the CLI's `serve`, `dev`
and `tenants create --database` start from `build(settings)`; transports are handed
`Composition.services`. This module wires; it holds no logic of its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

from ductor.protocol import SigningKeys
from ductor_core.builtin_steps import BUILTIN_STEP_SPECS
from ductor_core.expressions import (
    DEFAULT_COST_LIMITS,
    ExpressionEngine,
    default_engine,
    engine_by_name,
)
from ductor_core.step_specs import StepSpecs
from ductor_routing import EnricherRegistry, StrategyRegistry
from ductor_server.bridge import install as install_bridge
from ductor_server.bridge.keys import signing_keys_from_env
from ductor_server.connections import HANDLER as CONNECTION_HANDLER
from ductor_server.connections import ConnectionCalls, SecretKeys, load_secret_keys
from ductor_server.engine.actions import ActionRegistry, HttpAction, default_registry
from ductor_server.engine.clock import Clock
from ductor_server.engine.inboxfeed import InboxFeed
from ductor_server.engine.offload import add_worker_setup
from ductor_server.engine.outbound import OutboundPolicy
from ductor_server.engine.queue import WakeUp
from ductor_server.engine.runtime import Runtime, RuntimeConfig
from ductor_server.engine.taskqueue import TaskQueue
from ductor_server.extensions import (
    CEL_FUNCTIONS,
    DEFAULT_HOOK_TIMEOUT,
    SERVER_STARTED,
    SERVER_STOPPING,
    Extensions,
    HookDispatcher,
    HookEvent,
    install_cel_functions,
    installed_extensions,
    is_installed,
    register_cel_functions,
)
from ductor_server.extensions.kinds import KindValidators
from ductor_server.extensions.wiring import (
    plugin_enrichers,
    plugin_hooks,
    plugin_kinds,
    plugin_middleware,
    plugin_providers,
    plugin_steps,
    plugin_strategies,
    run_finished_hook,
)
from ductor_server.ledger.store import expire_due_holds
from ductor_server.payments import PaymentGateway
from ductor_server.providers import ProviderRegistry, builtin_providers
from ductor_server.receipts.keys import KEYS_FILE_ENV, ReceiptKeyError, load_keys
from ductor_server.sandbox import SandboxedEngine, SandboxLimits, SandboxPool
from ductor_server.services import (
    AgentService,
    AiService,
    BridgeService,
    ConnectionsService,
    EventsService,
    KeysService,
    LedgerService,
    MeteringService,
    QueueService,
    ReceiptService,
    RoutingService,
    RunsService,
    ServiceContext,
    Services,
    TenantsService,
    WorkflowsService,
)
from ductor_server.services.inbox import InboxService
from ductor_server.services.route_step import RouteStep
from ductor_server.services.wallets import WalletService
from ductor_server.settings import Settings
from ductor_server.storage import Store, open_store
from ductor_settlement import KeyRing

if TYPE_CHECKING:
    from redis.asyncio import Redis


@dataclass(frozen=True, kw_only=True)
class Composition:
    """Everything one process runs, wired together.

    Attributes:
        settings: what it was built from.
        store: the store (opened by `running` or `opened`).
        expressions: the CEL engine of every expression: DAG runs, validation,
            trigger filters and routing (`settings.cel_engine`).
        actions: this runtime's step handlers (`route` and `bridge` included).
        runtime: the engine loops of the configured roles.
        services: what transports call.
        redis: the Redis client when `settings.redis_url` is set (closed by `running`).
        extensions: the plugins this process loaded (and those that failed).
        providers: the providers of this process: the built-in ones, then the
            plugins' (`ductor.providers`).
        hooks: the plugins' lifecycle hooks (`ductor.hooks`).
    """

    settings: Settings
    store: Store
    expressions: ExpressionEngine
    actions: ActionRegistry
    runtime: Runtime
    services: Services
    redis: Redis | None = None
    extensions: Extensions = field(default_factory=Extensions)
    providers: ProviderRegistry = field(default_factory=ProviderRegistry)
    hooks: HookDispatcher = field(default_factory=HookDispatcher)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Composition]:
        """Open the store (migrating it when the settings ask), run the engine loops,
        and on exit stop them and close the store."""
        await self.store.open()
        try:
            if self.settings.migrate_on_start:
                await self.store.migrate()
            self.runtime.launch()
            try:
                await self.hooks.deliver(_server_event(SERVER_STARTED, self))
                yield self
            finally:
                await self.hooks.deliver(_server_event(SERVER_STOPPING, self))
                await self.runtime.stop()
                await self.hooks.drain()
        finally:
            await self._close()

    @asynccontextmanager
    async def opened(self, *, migrate: bool = True) -> AsyncIterator[Composition]:
        """Open (and migrate) the store without engine loops, for one-off commands
        (`serve --seed`); on exit close what `running` closes."""
        await self.store.open()
        try:
            if migrate:
                await self.store.migrate()
            yield self
        finally:
            await self._close()

    async def _close(self) -> None:
        await self.store.close()
        if self.redis is not None:
            await self.redis.aclose()
        if isinstance(self.expressions, SandboxedEngine):
            self.expressions.close()


def _server_event(name: str, composition: Composition) -> HookEvent:
    return HookEvent(
        name=name,
        at=composition.runtime.clock.now(),
        data={"roles": sorted(composition.settings.roles)},
    )


def build_services(
    runtime: Runtime,
    *,
    expressions: ExpressionEngine | None = None,
    bridge_keys: SigningKeys | None = None,
    payments: PaymentGateway | None = None,
    receipt_keys: KeyRing | None = None,
    outbound: OutboundPolicy | None = None,
    strategies: StrategyRegistry | None = None,
    enrichers: EnricherRegistry | None = None,
    kinds: KindValidators | None = None,
    hooks: HookDispatcher | None = None,
    providers: ProviderRegistry | None = None,
    secret_keys: SecretKeys | None = None,
    calls: ConnectionCalls | None = None,
    operator_key: str | None = None,
) -> Services:
    """The services bound to `runtime`'s store, clock, wake-up and definition cache.

    Args:
        runtime: the engine loops the services write for.
        expressions: the CEL engine of routing (the runtime's, else the default).
        bridge_keys: the bridge signing keys, if the server has them.
        payments: the processor wallets are topped up through, if any.
        receipt_keys: the receipt signing ring (None: no receipts are issued).
        outbound: the guard of calls to app URLs (none: unguarded).
        strategies: the routing strategies (built-ins and installed entry points if None).
        enrichers: the routing enricher plugins (installed entry points if None).
        kinds: the plugin validators of routable kinds (none if None).
        hooks: told of decisions and ledger entries after they commit (none if None).
        providers: the providers connections may use (none if None).
        secret_keys: the ring connection secrets are sealed with (None: connections
            with secrets are refused).
        calls: how connections are called and tested (one on `outbound`, or a
            guard with no allowed range, if None).
        operator_key: the key of the operator's tenant calls (None: none over the API).
    """
    context = ServiceContext(
        store=runtime.store,
        wake=runtime.wakeup,
        clock=runtime.clock,
        parts=runtime.parts,
        feed=runtime.inbox_feed,
        start_taker=runtime.start_taker,
        endings=runtime.endings,
    )
    routing_engine = expressions or runtime.engine or default_engine()
    ledger = LedgerService(runtime.store, clock=runtime.clock, hooks=hooks)
    receipts = ReceiptService(runtime.store, keys=receipt_keys, clock=runtime.clock)
    providers = providers if providers is not None else ProviderRegistry()
    if calls is None:
        calls = ConnectionCalls(
            runtime.store,
            providers,
            secret_keys,
            policy=outbound or OutboundPolicy(),
            clock=runtime.clock,
        )
    connections = ConnectionsService(
        runtime.store, providers, secret_keys, calls, clock=runtime.clock
    )
    events = EventsService(context)
    ai = AiService(runtime.store, providers, secret_keys, calls, clock=runtime.clock)
    calls.observe(ai.record_action)
    # A turn's loop holds its turn as a worker holds a task: a dead process's turn
    # is taken over within the same lease.
    agent = AgentService(
        runtime.store,
        ai,
        clock=runtime.clock,
        lease=timedelta(seconds=runtime.config.lease_seconds),
    )
    services = Services(
        workflows=WorkflowsService(context, connections=connections, actions=runtime.actions),
        runs=RunsService(context),
        events=events,
        routing=RoutingService(
            runtime.store,
            engine=routing_engine,
            clock=runtime.clock,
            receipts=receipts,
            registry=strategies,
            enrichers=enrichers,
            kinds=kinds,
            hooks=hooks,
        ),
        bridge=BridgeService(context, keys=bridge_keys, policy=outbound),
        keys=KeysService(runtime.store, clock=runtime.clock),
        tenants=TenantsService(runtime.store, clock=runtime.clock, operator_key=operator_key),
        ledger=ledger,
        wallets=WalletService(runtime.store, ledger, payments, clock=runtime.clock),
        receipts=receipts,
        metering=MeteringService(runtime.store, clock=runtime.clock),
        connections=connections,
        inbox=InboxService(context, events),
        ai=ai,
        agent=agent,
        queue=QueueService(context, base=runtime.config.fairness),
    )
    # The agent's tools call these very services (the MCP server's tool table).
    agent.bind(lambda: services)
    return services


def payment_gateway(settings: Settings) -> PaymentGateway | None:
    """The payment processor the settings configure: Stripe when both its API key and
    its webhook secret are set, else none.

    Raises:
        ValueError: only one of the two is set, or the `stripe` extra is not installed.
    """
    key, secret = settings.stripe_api_key, settings.stripe_webhook_secret
    if key is None and secret is None:
        return None
    if key is None or secret is None:
        raise ValueError(
            "set both DUCTOR_STRIPE_API_KEY and DUCTOR_STRIPE_WEBHOOK_SECRET, or neither"
        )
    try:
        from ductor_server.payments.stripe import StripeGateway
    except ImportError as error:
        raise ValueError(
            "Stripe top-ups need the 'stripe' extra: pip install 'ductor-server[stripe]'"
        ) from error
    return StripeGateway(key, secret, api_base=settings.stripe_api_base)


def sandboxed(
    engine: ExpressionEngine, settings: Settings, *, shared: tuple[str, ...] = ()
) -> ExpressionEngine:
    """`engine`, wrapped so costly expressions run in the sandbox when the settings
    ask and the engine is cel-rust (cel-python stops itself: its step limit);
    `shared` names the custom functions the sandbox processes register too."""
    if not settings.cel_sandbox or engine.name != "cel-rust":
        return engine
    pool = SandboxPool(
        engine.name,
        limits=getattr(engine, "limits", DEFAULT_COST_LIMITS),
        sandbox=SandboxLimits(
            processes=settings.cel_sandbox_processes,
            memory_bytes=settings.cel_sandbox_memory_mb * 1024 * 1024,
            timeout=settings.cel_sandbox_timeout,
        ),
    )
    return SandboxedEngine(engine, pool, threshold=settings.cel_sandbox_threshold, shared=shared)


def default_providers() -> ProviderRegistry:
    """The built-in providers (a new registry each call)."""
    return builtin_providers()


def refuse_unpluggable(extensions: Extensions) -> None:
    """Plug `extensions` into the built-ins as `build` and `create_app` do, keeping
    nothing: each plugin they would refuse (a taken name, middleware that does not
    answer an app) moves to the failures, so that a listing made without a server
    (`ductor extensions list`) reports what a server would."""
    # In `build`'s order, so that the failures are listed in the same order.
    policy = OutboundPolicy(())
    plugin_steps(extensions, BUILTIN_STEP_SPECS, default_registry(HttpAction(policy=policy)))
    plugin_providers(extensions, default_providers())
    plugin_strategies(extensions)
    plugin_middleware(extensions)


def build(
    settings: Settings,
    *,
    clock: Clock | None = None,
    actions: ActionRegistry | None = None,
    specs: StepSpecs | None = None,
    bridge_keys: SigningKeys | None = None,
    receipt_keys: KeyRing | None = None,
    extensions: Extensions | None = None,
    hook_timeout: float = DEFAULT_HOOK_TIMEOUT,
    providers: ProviderRegistry | None = None,
    secret_keys: SecretKeys | None = None,
) -> Composition:
    """Build everything the process runs for `settings` (no I/O until `running`).

    Args:
        settings: the process configuration.
        clock: where `now` comes from (the system clock if None).
        actions: the step handlers to start from (`default_registry()` if None).
        specs: the step types definitions may use (the built-ins if None); each
            worker-run type needs a handler of its name in `actions`.
        bridge_keys: the bridge signing keys (from the environment if None).
        receipt_keys: the receipt signing ring (from `settings.receipt_keys_file` or
            `settings.receipt_key` if None; no receipts when neither is set).
        extensions: the plugins to plug in (the installed entry points if None; see
            docs/extending.md): their CEL functions, strategies, enrichers,
            providers, step types, hooks and kind validators.
        hook_timeout: seconds one lifecycle hook may take with one event.
        providers: the providers connections may use (the built-in ones if None).
        secret_keys: the ring connection secrets are sealed with (from
            `settings.secret_keys` or `settings.secret_keys_file` if None; without
            either, connections with secrets are refused).

    Raises:
        ValueError: `settings.cel_engine` names no engine, or the receipt keys
            (`ReceiptKeyError`) or secret keys (`SecretKeysInvalid`) cannot be read.
    """
    if extensions is None:
        extensions = installed_extensions()
    # Every process that builds an engine registers the plugins' functions first:
    # this one, its lanes' worker processes, its sandbox children.
    register_cel_functions(extensions)
    shared: tuple[str, ...] = ()
    if is_installed(extensions):
        # The sandbox children and lane workers load exactly these.
        shared = tuple(entry.name for entry, _ in extensions.values(CEL_FUNCTIONS))
        add_worker_setup(install_cel_functions)
    store = open_store(settings.store_target)
    expressions = sandboxed(engine_by_name(settings.cel_engine), settings, shared=shared)
    policy = OutboundPolicy(settings.outbound_allow or ())
    actions = actions if actions is not None else default_registry(HttpAction(policy=policy))
    specs = plugin_steps(extensions, specs or BUILTIN_STEP_SPECS, actions)
    redis: Redis | None = None
    wakeup: WakeUp | None = None
    queue: TaskQueue | None = None
    inbox_feed: InboxFeed | None = None
    config = RuntimeConfig(
        lease_seconds=settings.lease_seconds,
        poll_interval=settings.engine_poll_interval,
        coordinator_loops=settings.engine_coordinator_loops,
        report_loops=settings.engine_report_loops,
        worker_concurrency=settings.worker_concurrency,
        poison_after=settings.poison_after,
        stop_grace=settings.stop_grace,
        fairness=settings.fairness,
    )
    if settings.redis_url:
        # Only a process with Redis configured loads redis and the modules over it.
        from redis.asyncio import Redis

        from ductor_server.engine.redisinbox import RedisInboxFeed
        from ductor_server.engine.redisqueue import RedisFairQueue
        from ductor_server.engine.rediswake import RedisWakeUp

        redis = Redis.from_url(settings.redis_url)
        wakeup = RedisWakeUp(redis, prefix=settings.redis_prefix)
        inbox_feed = RedisInboxFeed(redis, prefix=settings.redis_prefix)
        queue = RedisFairQueue(
            store,
            redis,
            prefix=settings.redis_prefix,
            policy=settings.fairness,
            capacity=config.worker_concurrency,
            wake=wakeup,
        )
    runtime = Runtime(
        store,
        roles=settings.roles,
        config=config,
        wakeup=wakeup,
        queue=queue,
        clock=clock,
        engine=expressions,
        actions=actions,
        specs=specs,
        inbox_feed=inbox_feed,
    )
    keys = bridge_keys if bridge_keys is not None else signing_keys_from_env()
    install_bridge(runtime, keys=keys, policy=policy)
    runtime.housekeeping.add_sweep("holds", expire_due_holds)
    if receipt_keys is None:
        try:
            receipt_keys = load_keys(settings.receipt_keys_file, settings.receipt_key)
        except ReceiptKeyError as exc:
            # A file the operator named (not the one `ductor dev` keeps): say which setting.
            named = settings.receipt_keys_file not in (None, settings.dev_receipt_keys_file)
            if named and not str(exc).startswith("DUCTOR_"):
                raise ReceiptKeyError(f"{KEYS_FILE_ENV}: {exc}") from None
            raise
    if settings.receipts_for_runs and receipt_keys is None:
        raise ReceiptKeyError(
            "DUCTOR_RECEIPTS_FOR_RUNS is on but no receipt signing key is set"
            " (DUCTOR_RECEIPT_KEYS or DUCTOR_RECEIPT_KEY)"
        )
    hooks = HookDispatcher(plugin_hooks(extensions), timeout=hook_timeout)
    if secret_keys is None:
        secret_keys = load_secret_keys(settings.secret_keys, settings.secret_keys_file)
    providers = providers if providers is not None else default_providers()
    calls = ConnectionCalls(store, providers, secret_keys, policy=policy, clock=runtime.clock)
    plugin_providers(extensions, providers)
    services = build_services(
        runtime,
        expressions=expressions,
        bridge_keys=keys,
        receipt_keys=receipt_keys,
        payments=payment_gateway(settings),
        outbound=policy,
        strategies=plugin_strategies(extensions),
        enrichers=plugin_enrichers(extensions),
        kinds=plugin_kinds(extensions),
        hooks=hooks,
        providers=providers,
        secret_keys=secret_keys,
        calls=calls,
        operator_key=settings.operator_key,
    )
    actions.register("route", RouteStep(services.routing))
    actions.register(CONNECTION_HANDLER, calls)
    if settings.receipts_for_runs:
        runtime.parts.on_finish.append(services.receipts.on_run_finished)
    if hooks:
        runtime.parts.on_finish.append(run_finished_hook(hooks))
    return Composition(
        settings=settings,
        store=store,
        expressions=expressions,
        actions=actions,
        runtime=runtime,
        services=services,
        redis=redis,
        extensions=extensions,
        providers=providers,
        hooks=hooks,
    )


__all__ = [
    "Composition",
    "build",
    "build_services",
    "default_providers",
    "payment_gateway",
    "sandboxed",
]
