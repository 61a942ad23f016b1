"""The `Runtime`: the engine loops (coordinator, workers, timers) of one process.

Started and stopped inside the application's lifespan; holds no state that
the store does not also hold, so a crash loses nothing. What it runs is given
by its caller: the step handlers (`actions`) and the run kinds (`kinds`) beyond
the built-in ones, registered by a `setup` callable before the loops start.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from ductor_core.builtin_steps import BUILTIN_STEP_SPECS
from ductor_core.expressions import ExpressionEngine
from ductor_core.step_specs import OnWorker, StepSpecs
from ductor_server.engine.actions import ActionRegistry, default_registry
from ductor_server.engine.catalog import WorkflowCatalog
from ductor_server.engine.clock import Clock, SystemClock
from ductor_server.engine.coordinator import Coordinator
from ductor_server.engine.effects import EngineParts, StartTaker
from ductor_server.engine.emails import EmailPolicy, EmailSender
from ductor_server.engine.endings import RunEndings
from ductor_server.engine.errors import MissingHandler
from ductor_server.engine.fairness import FairPolicy
from ductor_server.engine.fairqueue import LocalFairQueue
from ductor_server.engine.housekeeping import Housekeeping, Retention
from ductor_server.engine.inboxfeed import InboxFeed, LocalInboxFeed
from ductor_server.engine.kinds import RunKinds
from ductor_server.engine.memory import release_free_memory
from ductor_server.engine.queue import InProcessWakeUp, Topic, WakeUp
from ductor_server.engine.queuedepth import QueueDepthSampler
from ductor_server.engine.taskqueue import TaskQueue
from ductor_server.engine.timers import Timers
from ductor_server.engine.workers import Workers
from ductor_server.storage.protocol import Store
from ductor_server.telemetry import metrics_enabled

log = logging.getLogger(__name__)


class Role(enum.StrEnum):
    """What a process does; `ductor serve` selects any subset, default all."""

    API = "api"
    COORDINATOR = "coordinator"
    WORKER = "worker"
    TIMER = "timer"


ALL_ROLES: frozenset[Role] = frozenset(Role)


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    """Tuning of the engine loops.

    Attributes:
        poll_interval: seconds a loop sleeps without a wake-up before looking again.
        coordinator_batch: runs claimed and ticked per coordinator transaction.
        coordinator_loops: coordinator loops in this process, each claiming its own
            batches (on Postgres they skip each other's runs, so one loop's batch is
            ticked while another waits for the database; SQLite has one writer).
        tick_reported: in a process with both the coordinator and worker roles,
            whether a worker's report transaction also ticks the runs of its
            results (`Coordinator.tick_reported`) rather than leaving them all to
            the coordinator's next claim.
        take_at_once: with `tick_reported`, whether the tasks those ticks queue
            are leased at once, in that transaction, to the worker that ran the
            step before them, when the fair queue lets them start without
            taking another task's turn (`TakesAtOnce`): no lease transaction
            and no wake-up between a run's steps.
        worker_batch: tasks leased per round trip.
        report_loops: worker report loops in this process, each committing its
            own batch of finished attempts while another waits for the database
            (their ticks lock runs `SKIP LOCKED`, so two batches never wait on
            one run: a run another report holds gets its result from the claim).
        worker_concurrency: handlers running at once in this process.
        lease_seconds: how long a leased task is ours before another worker may take it.
        poison_after: deaths (leases that expired with the task in flight) after which
            a task is quarantined as `attempt.poisoned` instead of run again; 0: never.
        timer_batch: due timers moved into inboxes per transaction.
        stop_grace: seconds running handlers may take to finish when stopping.
        housekeeping_interval: seconds between sweeps of expired rows (timer role).
        retention: how long done tasks, idempotency records and events are kept.
        fairness: the tenants' weights and limits in the task queue.
        emails: how the inbox's outbox emails are retried (worker role).
        queue_depth_interval: seconds between counts of the ready tasks for the
            `ductor.queue.depth` gauge (worker role, only while metrics are on).
        trim_interval: seconds between looks at whether the engine went quiet
            after work, when the heap's free memory is handed back to the
            operating system (`engine.memory`); 0: never.
    """

    poll_interval: float = 0.5
    coordinator_batch: int = 64
    coordinator_loops: int = 1
    tick_reported: bool = True
    take_at_once: bool = True
    worker_batch: int = 64
    report_loops: int = 1
    worker_concurrency: int = 128
    lease_seconds: float = 60.0
    poison_after: int = 3
    timer_batch: int = 256
    stop_grace: float = 5.0
    housekeeping_interval: float = 300.0
    retention: Retention = field(default_factory=Retention)
    fairness: FairPolicy = field(default_factory=FairPolicy)
    emails: EmailPolicy = field(default_factory=EmailPolicy)
    queue_depth_interval: float = 15.0
    trim_interval: float = 2.0


Setup = Callable[["Runtime"], object]
"""Registers run kinds and step handlers on a runtime before its loops start."""


class Runtime:
    """The engine loops of this process (the composition root binds services to them).

    Use `async with Runtime.start(store, roles=..., setup=...) as runtime:`; the
    loops run until the block exits, then stop gracefully (running handlers get
    `config.stop_grace` seconds, unfinished leases go back to the queue).

    Attributes:
        actions: the step handlers of this runtime (built-ins if not given).
        kinds: the run kinds of this runtime (the DAG kind if not given).
        queue: where the workers take tasks from (if not given, the store's tasks
            table in fair order, `LocalFairQueue`).
        parts: what carrying out ticks needs (catalog, CEL engine, kinds), shared
            by the coordinator, the services and whatever `setup` plugs in.
    """

    def __init__(
        self,
        store: Store,
        *,
        roles: Iterable[Role | str] = ALL_ROLES,
        config: RuntimeConfig | None = None,
        clock: Clock | None = None,
        engine: ExpressionEngine | None = None,
        actions: ActionRegistry | None = None,
        wakeup: WakeUp | None = None,
        kinds: RunKinds | None = None,
        queue: TaskQueue | None = None,
        specs: StepSpecs | None = None,
        inbox_feed: InboxFeed | None = None,
    ) -> None:
        self.store = store
        self.inbox_feed: InboxFeed = inbox_feed if inbox_feed is not None else LocalInboxFeed()
        self.roles = frozenset(Role(r) for r in roles)
        self.config = config or RuntimeConfig()
        self.clock = clock or SystemClock()
        self.engine = engine
        self.actions = actions if actions is not None else default_registry()
        self.wakeup = wakeup or InProcessWakeUp()
        self.kinds = kinds if kinds is not None else RunKinds()
        self.queue: TaskQueue = (
            queue
            if queue is not None
            else LocalFairQueue(
                store,
                policy=self.config.fairness,
                capacity=self.config.worker_concurrency,
                wake=self.wakeup,
            )
        )
        self.catalog = WorkflowCatalog()
        self.parts = EngineParts(
            catalog=self.catalog,
            engine=engine,
            kinds=self.kinds,
            specs=specs if specs is not None else BUILTIN_STEP_SPECS,
        )
        cfg = self.config
        self.coordinator = Coordinator(
            store,
            self.parts,
            clock=self.clock,
            wake=self.wakeup,
            batch=cfg.coordinator_batch,
            poll_interval=cfg.poll_interval,
            feed=self.inbox_feed,
        )
        self.workers = Workers(
            store,
            self.actions,
            clock=self.clock,
            wake=self.wakeup,
            batch=cfg.worker_batch,
            concurrency=cfg.worker_concurrency,
            lease_seconds=cfg.lease_seconds,
            poll_interval=cfg.poll_interval,
            queue=self.queue,
            poison_after=cfg.poison_after,
        )
        if Role.COORDINATOR in self.roles and cfg.tick_reported:
            # A process that both works and coordinates ticks its workers' results
            # in their report transactions (one commit less per step); the inbox
            # and the coordinator's claim remain for everything else.
            self.workers.ticker = self.coordinator
        self.workers.take_at_once = cfg.take_at_once
        self.timers = Timers(
            store,
            clock=self.clock,
            wake=self.wakeup,
            batch=cfg.timer_batch,
            poll_interval=cfg.poll_interval,
            feed=self.inbox_feed,
        )
        self.emails = EmailSender(
            store,
            self.actions,
            clock=self.clock,
            wake=self.wakeup,
            poll_interval=cfg.poll_interval,
            policy=cfg.emails,
        )
        self.housekeeping = Housekeeping(
            store,
            clock=self.clock,
            retention=cfg.retention,
            interval=cfg.housekeeping_interval,
        )
        self.queue_depth = QueueDepthSampler(
            store, clock=self.clock, interval=cfg.queue_depth_interval
        )
        # Requests of this process waiting for runs to end (any roles: the runs
        # may end in another process, which wakes this one or is polled).
        self.endings = RunEndings(store, self.wakeup)
        self.coordinator.endings = self.endings
        self._loops: list[asyncio.Task[None]] = []
        self.trims = 0  # times the heap's free memory was handed back

    @classmethod
    @asynccontextmanager
    async def start(
        cls,
        store: Store,
        *,
        roles: Iterable[Role | str] = ALL_ROLES,
        config: RuntimeConfig | None = None,
        clock: Clock | None = None,
        engine: ExpressionEngine | None = None,
        actions: ActionRegistry | None = None,
        kinds: RunKinds | None = None,
        queue: TaskQueue | None = None,
        specs: StepSpecs | None = None,
        setup: Setup | None = None,
    ) -> AsyncIterator[Runtime]:
        """Start the loops for `roles` on an opened, migrated store; stop them on exit.

        `setup(runtime)` runs before the loops start: the place to register run
        kinds and step handlers (`ductor_server.bridge.install` for the bridge).
        """
        runtime = cls(
            store,
            roles=roles,
            config=config,
            clock=clock,
            engine=engine,
            actions=actions,
            kinds=kinds,
            queue=queue,
            specs=specs,
        )
        if setup is not None:
            setup(runtime)
        runtime.launch()
        try:
            yield runtime
        finally:
            await runtime.stop()

    @property
    def running(self) -> bool:
        """True while the loops are running."""
        return bool(self._loops)

    def check_handlers(self) -> None:
        """Refuse to start when a worker-run step type has no handler of its name.

        Types whose handler depends on their args (ACTION's `action:<name>`) are
        resolved per step, so only fixed handler names are checked.

        Raises:
            MissingHandler: naming the step types and the handlers they need.
        """
        missing = {
            spec.type: spec.start.handler
            for spec in self.parts.specs
            if isinstance(spec.start, OnWorker)
            and spec.start.handler_for is None
            and self.actions.get(spec.start.handler) is None
        }
        if missing:
            needs = ", ".join(f"{t} needs {h!r}" for t, h in sorted(missing.items()))
            raise MissingHandler(f"no step handler registered for: {needs}")

    def start_taker(self, runs: int = 1) -> StartTaker | None:
        """What a trigger served by this process, starting `runs` runs, hands its
        transaction's new tasks to: this process's worker, which may lease the new
        runs' first tasks at once (`Workers.start_taker`). None unless this
        process runs the worker role's loops: the tasks then wait in the queue
        for a lease."""
        if Role.WORKER not in self.roles or not self._loops:
            return None
        return self.workers.start_taker(runs)

    def launch(self) -> None:
        """Start the loops of this process's roles (`start` does this for you).

        Raises:
            MissingHandler: see `check_handlers`.
        """
        if self._loops:
            return
        if Role.WORKER in self.roles:
            self.check_handlers()
        self.coordinator.stopped = self.workers.stopped = self.timers.stopped = False
        self.housekeeping.stopped = self.emails.stopped = self.queue_depth.stopped = False

        def spawn(name: str, coro: Coroutine[Any, Any, None]) -> None:
            self._loops.append(asyncio.create_task(coro, name=f"ductor-{name}"))

        if Role.COORDINATOR in self.roles:
            for loop in range(max(self.config.coordinator_loops, 1)):
                name = f"coordinator-{loop}" if loop else "coordinator"
                spawn(name, self.coordinator.run_forever(poll=loop == 0))
        if Role.WORKER in self.roles:
            spawn("workers", self.workers.run_forever())
            for loop in range(max(self.config.report_loops, 1)):
                spawn(
                    f"worker-reports-{loop}" if loop else "worker-reports",
                    self.workers.report_forever(),
                )
            spawn("worker-heartbeat", self.workers.heartbeat_forever())
            spawn("emails", self.emails.run_forever())
            if metrics_enabled():
                # Only a configured meter provider reads the gauge: no SDK, no query.
                spawn("queue-depth", self.queue_depth.run_forever())
        if Role.TIMER in self.roles:
            spawn("timers", self.timers.run_forever())
            spawn("housekeeping", self.housekeeping.run_forever())
        if self.config.trim_interval > 0:
            spawn("trim", self._trim_when_quiet())
        self.wake()

    async def stop(self) -> None:
        """Stop the loops: finish or release running tasks, then close the handlers."""
        loops, self._loops = self._loops, []
        self.coordinator.stopped = self.workers.stopped = self.timers.stopped = True
        self.housekeeping.stopped = self.emails.stopped = self.queue_depth.stopped = True
        for loop in loops:
            loop.cancel()
        if loops:
            # A loop that swallowed its cancellation must not hold the process:
            # cancel it once more, then leave it behind with a log line.
            _, pending = await asyncio.wait(loops, timeout=self.config.stop_grace)
            for loop in pending:
                loop.cancel()
            if pending:
                _, pending = await asyncio.wait(pending, timeout=self.config.stop_grace)
            for loop in pending:
                log.error("engine loop %s did not stop", loop.get_name())
            for loop in loops:
                if loop.done() and not loop.cancelled() and loop.exception() is not None:
                    log.error("engine loop %s failed", loop.get_name(), exc_info=loop.exception())
        if Role.WORKER in self.roles:
            await self.workers.drain(self.config.stop_grace)
        await self.actions.aclose()
        await self.endings.close()
        for part in (self.wakeup, self.inbox_feed):
            close = getattr(part, "aclose", None)
            if close is not None:
                await close()

    def _activity(self) -> tuple[int, ...]:
        """Counters that move whenever the engine does work in this process."""
        workers, timers = self.workers, self.timers
        return (
            self.coordinator.ticks,
            workers.lease_batches,
            workers.report_batches,
            timers.fired,
            timers.scheduled,
        )

    async def _trim_when_quiet(self) -> None:
        """Hand the heap's free memory back once the engine goes quiet after work
        (and once after start, which leaves the imports' garbage behind)."""
        last, busy = self._activity(), True
        while True:
            await asyncio.sleep(self.config.trim_interval)
            now = self._activity()
            if now != last:
                last, busy = now, True
            elif busy:
                busy = False
                if await asyncio.to_thread(release_free_memory):
                    self.trims += 1

    def wake(self) -> None:
        """Wake every loop of this process (after writing outside the services)."""
        for topic in Topic:
            self.wakeup.notify(topic)
