"""The coordinator: the only writer of run state.

It claims runs with pending inbox input and loads them in one short
transaction and ticks each through its run kind (the pure
`ductor_core.tick.tick` for DAG runs). When every tick of the batch is cheap
(no or cheap CEL over small values, see `engine.cheap`), it ticks them on the
loop and commits in that same transaction. Otherwise it ticks them in the
engine lane's worker process with no transaction open, and commits the new
states and their commands in a second transaction. Either way each run is
guarded by its lock_version: a run another writer changed in between is left,
with its input, for the next round. A run whose kind this process does not
know is left for one that does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, TypeGuard

import msgspec
from opentelemetry import trace
from opentelemetry.trace import Link, Span

from ductor_core.errors import DuctorError
from ductor_core.runs import ErrorInfo, IgnoredInput
from ductor_server.engine.clock import Clock
from ductor_server.engine.effects import Effects, EngineParts, TaskTaker, apply_commands
from ductor_server.engine.errors import OffloadFailed
from ductor_server.engine.history import ignored_entry, input_entry, transition_entries
from ductor_server.engine.inboxfeed import InboxFeed
from ductor_server.engine.kinds import Computation, KindTick, PreparedTick, RunKind, failed_tick
from ductor_server.engine.offload import ENGINE, ISOLATION
from ductor_server.engine.queue import Topic, WakeUp
from ductor_server.storage.errors import StoreUnavailable
from ductor_server.storage.protocol import INBOX_SIZE_PER_RUN, Store, Tx
from ductor_server.storage.records import (
    InboxItem,
    InboxRef,
    NewInboxItem,
    RunRecord,
    RunRef,
    RunUpdate,
)
from ductor_server.telemetry import TICK_DURATION, context_from, meter, tracer, wants_spans

if TYPE_CHECKING:
    from ductor_server.engine.endings import RunEndings

log = logging.getLogger("ductor.coordinator")
_conflicts = meter.create_counter(
    "ductor.coordinator.conflicts",
    unit="{run}",
    description="Ticks not applied because another coordinator changed the run first",
)

UNPOLLED_WAIT = 3600.0
"""How long a coordinator loop that does not poll waits for a wake-up before it
looks anyway."""
UNSTORED = 0
"""The `seq` of an input handed to a tick straight from a worker's report: it has
no inbox row (stored rows count from 1)."""
INPUTS_PER_TICK = 1000
"""The most inbox items one tick of a run takes; the rest wait for the next."""
REPORT_STATE_BYTES = 64 * 1024
"""The longest stored state of a run that a worker's report ticks (`tick_reported`).
A report's transaction carries the results of every tenant's steps: decoding,
ticking and writing a larger state there (a SCATTER of thousands of items, about
1 MB for 10,000) held up each of them, once per report. Such a run's results go to
its inbox and the claim ticks them, many at a time."""
UNKNOWN_KIND_DELAY = timedelta(seconds=30)
"""How long the input of a run of an unknown kind is put off, so that such runs
never crowd the claim (a process that knows the kind ticks them then)."""
SET_ASIDE_DELAY = timedelta(hours=1)
"""How long the input of a run whose tick can be neither written nor replaced by
its failure is put off (see `Coordinator._set_aside`)."""
OFFLOAD_DEATHS = 3
"""How many times in a row a run's tick, ticked alone and the run unchanged, may
lose its worker process (`engine.offload_failed`) before the run is failed."""
DEATHS_KEPT = 1024
"""The most runs whose worker deaths the coordinator counts at once; the run
counted longest ago is forgotten first."""


async def _flagged(
    results: list[NewInboxItem], fresh: Callable[[], Awaitable[list[bool]]] | None
) -> list[NewInboxItem]:
    """The results `fresh` flags, in order (all of them without it)."""
    if fresh is None:
        return results
    return [r for r, keep in zip(results, await fresh(), strict=True) if keep]


class Coordinator:
    """Ticks runs that have pending input, a batch per transaction."""

    def __init__(
        self,
        store: Store,
        parts: EngineParts,
        *,
        clock: Clock,
        wake: WakeUp,
        batch: int = 64,
        poll_interval: float = 0.5,
        feed: InboxFeed | None = None,
    ) -> None:
        self.store = store
        self.endings: RunEndings | None = None  # set by the Runtime
        self.feed = feed
        self.parts = parts
        self.clock = clock
        self.wake = wake
        self.batch = batch
        self.poll_interval = poll_interval
        self.stopped = False  # set by the Runtime on stop; loops exit at their next turn
        self.ticks = 0  # runs ticked since start (for metrics and benchmarks)
        self.batches = 0  # transactions that ticked at least one run
        self.inline_batches = 0  # batches ticked on the loop in one transaction
        self.offloaded_batches = 0  # batches ticked in the engine lane between two
        self.direct_batches = 0  # batches ticked in a worker's report (`tick_reported`)
        self.conflicts = 0  # ticks dropped: another writer changed the run first
        self.empty_rounds = 0  # claims that found no run to tick (polls, lost wake-up races)
        self._running = 0  # loops in run_forever
        self._pollers = 0  # loops in run_forever that poll
        self._watching = False  # one loop at a time waits on the wake-up (see _await_input)
        self._handover = asyncio.Event()  # set when the watching loop stops watching
        # (tenant, run) -> (lock_version, worker deaths in a row): see `_died`.
        self._deaths: dict[tuple[str, str], tuple[int, int]] = {}

    async def run_forever(self, *, poll: bool = True) -> None:
        """Tick until cancelled; sleep on the inbox wake-up when there is nothing to do.

        Several loops may run at once (`RuntimeConfig.coordinator_loops`). One
        wake-up sets one loop claiming: only one idle loop at a time waits on
        the wake-up, and it hands that watch to the next idle loop as it goes to
        claim, so input that comes while it ticks is claimed by another loop
        meanwhile, and one run's input does not send every loop to claim it
        (all but one of them finding nothing). The watching loop looks every
        `poll_interval` without a wake-up as long as one loop was started with
        `poll`, so an idle process polls no more for having more loops. The
        last one out logs what they did, lost races (conflicts) included."""
        self._running += 1
        self._pollers += poll
        try:
            await self._run()
        finally:
            self._running -= 1
            self._pollers -= poll
            if not self._running:
                log.info(
                    "coordinator done: %d runs ticked in %d batches, %d conflicts",
                    self.ticks,
                    self.batches,
                    self.conflicts,
                )

    async def _run(self) -> None:
        failures = 0
        alone = 0  # rounds still to go one run at a time after a failed batch
        while not self.stopped:
            limit = 1 if alone else self.batch
            claimed: list[RunRecord] = []
            try:
                done = await self._round(limit, claimed)
                failures = 0
                alone = max(0, alone - 1)
                if self._deaths:
                    for run in claimed:
                        self._deaths.pop((run.tenant_id, run.id), None)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                log.exception("coordinator batch failed (%d in a row)", failures)
                # A run whose tick alone cannot be written however often it is
                # tried, or kills its worker process each time, is failed rather
                # than left to hold every other.
                lasting = limit == 1 and len(claimed) == 1
                lasting = lasting and (_lasting(exc) or self._died(claimed[0], exc))
                if lasting and await self._set_aside(claimed[0], exc):
                    failures = 0
                    continue
                # After a failed batch, go one run at a time for a batch's worth
                # of rounds, so that one run that cannot be committed is found
                # and does not hold back the others.
                alone = self.batch
                await asyncio.sleep(min(0.05 * 2**failures, 5.0))
                continue
            # A batch that claimed fewer runs than it could and left nothing behind
            # (no lost race, no run with more input than one batch takes) has seen
            # all the input there was: wait for the next wake-up rather than look
            # again at once. The wake-ups of writes made meanwhile are kept, so
            # such a wait returns at once.
            if done.claimed == 0 or (done.claimed < limit and not done.left_over):
                await self._await_input()

    def _died(self, claimed: RunRecord, exc: Exception) -> bool:
        """Count `exc` if it says the worker process of the `claimed` run's tick,
        ticked alone, died (`OffloadFailed`); return whether it has died
        `OFFLOAD_DEATHS` times in a row with the run unchanged.

        A run counted is ticked in the `ISOLATION` lane until its tick is written
        or it changes, so that its further deaths are its own tick's, never those
        of another call that shared its worker process."""
        if not isinstance(exc, OffloadFailed):
            return False
        key = (claimed.tenant_id, claimed.id)
        version, deaths = self._deaths.pop(key, (claimed.lock_version, 0))
        deaths = deaths + 1 if version == claimed.lock_version else 1
        if deaths >= OFFLOAD_DEATHS:
            return True
        self._deaths[key] = (claimed.lock_version, deaths)
        if len(self._deaths) > DEATHS_KEPT:
            del self._deaths[next(iter(self._deaths))]
        return False

    def _suspect(self, run: RunRecord) -> bool:
        """Whether a worker process died in the tick of `run` as it is now (`_died`)."""
        counted = self._deaths.get((run.tenant_id, run.id))
        return counted is not None and counted[0] == run.lock_version

    async def _set_aside(self, claimed: RunRecord, exc: Exception) -> bool:
        """Fail the `claimed` run, whose tick failed alone with an error that
        retrying will not mend (`_lasting`, `_died`), taking the input that tick
        was given, unless the run has changed since it was claimed; if even that
        cannot be written, put its input off (`SET_ASIDE_DELAY`). Returns whether
        either was done."""
        ref = RunRef(tenant_id=claimed.tenant_id, run_id=claimed.id)
        code = exc.code if isinstance(exc, DuctorError) else type(exc).__name__
        message = f"the run's tick could not be written ({code})"
        if isinstance(exc, OffloadFailed):
            message = (
                "the run's tick could not be computed: its worker process died"
                f" {OFFLOAD_DEATHS} times ({code})"
            )
        error = ErrorInfo(code="engine.tick_failed", message=message, retryable=False)
        effects = Effects(watch_budgets=False)
        now = self.clock.now()
        try:
            async with self.store.transaction() as tx:
                locked = await tx.lock_runs([ref])
                if not locked or locked[0][0].lock_version != claimed.lock_version:
                    return False  # another writer has it, or its tick was written
                run, _ = locked[0]
                items = await tx.load_inbox([ref], now=now, limit_per_run=INPUTS_PER_TICK)
                plan = _Plan(run, items, None)
                if not run.status.terminal:
                    plan.ticked = KindTick(failed_tick(run.state, error, now), run.kind_state)
                await self._write(tx, effects, [plan], now, _Round(), locked=True)
        except Exception:
            log.exception(
                "run %s/%s could not be failed: its input is put off", ref.tenant_id, ref.run_id
            )
            try:
                async with self.store.transaction() as tx:
                    await tx.defer_inbox([ref], now=now, until=now + SET_ASIDE_DELAY)
            except Exception:
                log.exception(
                    "the input of run %s/%s could not be put off", ref.tenant_id, ref.run_id
                )
                return False
            return True
        log.error("run %s/%s failed: %s", ref.tenant_id, ref.run_id, message)
        self._notify(effects)
        return True

    async def _await_input(self) -> None:
        """Wait for the next inbox wake-up, or for a poll's time if this loop
        watches; a loop that another one's watch leaves idle waits its turn."""
        while self._watching:
            self._handover.clear()
            await self._handover.wait()
        self._watching = True
        try:
            await self.wake.wait(
                Topic.INBOX, self.poll_interval if self._pollers else UNPOLLED_WAIT
            )
        finally:
            self._watching = False
            self._handover.set()

    async def tick_batch(self, limit: int | None = None) -> int:
        """Claim up to `limit` (default `batch`) runs with input, tick them and
        commit; return how many.

        Each run's tick is a `ductor.tick` span whose parent is the trace context
        stored with the run; a batch that ticked runs is a `ductor.coordinator.batch`
        span linking them (an empty poll leaves no span).
        """
        return (await self._round(limit or self.batch)).claimed

    async def _round(self, limit: int, claimed: list[RunRecord] | None = None) -> _Round:
        """One claim round of up to `limit` runs; the runs it claimed are added to
        `claimed` as soon as they are (so a round that fails still tells them)."""
        effects = Effects(watch_budgets=False)  # a tick refuses nothing over a budget
        done = await self._traced(
            effects,
            lambda now, spans, done: self._tick_batch(now, effects, limit, spans, done, claimed),
            self.clock.now(),
        )
        if done.claimed:
            self._notify(effects)
        else:
            self.empty_rounds += 1
        return done

    async def tick_reported(
        self,
        tx: Tx,
        results: Sequence[NewInboxItem],
        now: datetime,
        *,
        taker: TaskTaker | None = None,
        fresh: Callable[[], Awaitable[list[bool]]] | None = None,
    ) -> tuple[list[NewInboxItem], Callable[[], None] | None]:
        """Tick, in a worker's report transaction, the runs of the results it reports.

        A worker of this process hands its attempts' results here instead of
        queueing them all in the inbox, so that they are ticked in the report's
        commit rather than in a claim of its own (one transaction less per step,
        and no inbox row written, read back and deleted). Only runs this
        transaction can lock at once (`Tx.lock_runs`: none another writer holds),
        whose stored state is at most `REPORT_STATE_BYTES` long, and whose
        ticks are cheap enough for the loop are ticked, each with its
        stored input first and these results after it. Returns the results it
        did not tick, which the caller queues in the inbox for the claim, and
        what to call once the caller commits (None: nothing was ticked). The
        ticks' new tasks are queued through `taker` when given (the worker,
        which may lease some of them at once).

        With `fresh`, the results are candidates: only those it flags are taken
        (the attempts recorded now, not redelivered). It is asked once the runs
        are locked, so the insert that answers it goes out with the lock.
        """
        left = list(results)
        if self.stopped or not left:
            return await _flagged(left, fresh), None
        keys = dict.fromkeys((r.tenant_id, r.run_id) for r in left)
        locked = await tx.lock_runs(
            [RunRef(tenant_id=t, run_id=r) for t, r in keys], max_state_bytes=REPORT_STATE_BYTES
        )
        left = await _flagged(left, fresh)
        pending: dict[tuple[str, str], list[InboxItem]] = defaultdict(list)
        for r in left:
            pending[(r.tenant_id, r.run_id)].append(
                InboxItem(
                    seq=UNSTORED,
                    tenant_id=r.tenant_id,
                    run_id=r.run_id,
                    input=r.input,
                    available_at=r.available_at,
                )
            )
        # A run whose results were all redelivered stays as it is.
        locked = [(run, has) for run, has in locked if (run.tenant_id, run.id) in pending]
        if not locked:
            return left, None
        runs = [run for run, _ in locked]
        effects = Effects(taker=taker, watch_budgets=False)
        handled: set[tuple[str, str]] = set()

        async def tick(now: datetime, spans: list[Span], done: _Round) -> int:
            # Only the runs with stored input have any to load (input stored
            # after the lock waits for the claim, as input stored after the
            # load always has).
            refs = [RunRef(tenant_id=run.tenant_id, run_id=run.id) for run, has in locked if has]
            items = await tx.load_inbox(refs, now=now, limit_per_run=INPUTS_PER_TICK)
            stored: dict[tuple[str, str], int] = defaultdict(int)
            length: dict[tuple[str, str], int] = defaultdict(int)
            for item in items:
                stored[(item.tenant_id, item.run_id)] += 1
                length[(item.tenant_id, item.run_id)] += item.size
            # A run with more input than one tick takes (or than this load took:
            # it stops at INBOX_SIZE_PER_RUN) gets these results after the rest,
            # from the claim.
            taken = [
                run
                for run in runs
                if stored[(run.tenant_id, run.id)] + len(pending[(run.tenant_id, run.id)])
                <= INPUTS_PER_TICK
                and length[(run.tenant_id, run.id)] < INBOX_SIZE_PER_RUN
            ]
            for run in taken:
                items.extend(pending[(run.tenant_id, run.id)])
            ready: list[_Plan] = []
            for plan in await self._plan(tx, taken, items, now, spans, done):
                if _inline(plan.compute):
                    ready.append(plan)
                elif plan.span is not None:  # left to the claim, with its input
                    plan.span.set_attribute("ductor.tick.deferred", True)
            if not ready:
                return 0
            handled.update(await self._tick_inline(tx, effects, ready, now, done))
            self.direct_batches += 1
            return len(ready)

        await self._traced(effects, tick, now)
        left = [r for r in left if (r.tenant_id, r.run_id) not in handled]
        return left, (lambda: self._notify(effects)) if handled else None

    def _notify(self, effects: Effects) -> None:
        """After a commit: answer the requests of this process that wait for the
        runs it ended, then wake the loops (see `RunEndings`)."""
        if self.endings is not None and effects.ended:
            self.endings.ended(effects.ended)
        effects.notify(self.wake, self.feed)

    async def _traced(
        self,
        effects: Effects,
        body: Callable[[datetime, list[Span], _Round], Awaitable[int]],
        now: datetime,
    ) -> _Round:
        """Run one batch (`body`), with its tick spans, its batch span and metrics."""
        done = _Round()
        started, clock = time.time_ns(), time.perf_counter()
        inline = self.inline_batches
        spans: list[Span] = []
        try:
            ticked = await body(now, spans, done)
        except BaseException as exc:
            for span in spans:
                span.record_exception(exc)
                span.set_status(trace.StatusCode.ERROR, type(exc).__name__)
            raise
        finally:
            for span in spans:
                span.end()
        if ticked:
            mode = "inline" if self.inline_batches > inline else "offloaded"
            TICK_DURATION.record(time.perf_counter() - clock, {"ductor.tick.mode": mode})
            batch = tracer.start_span(
                "ductor.coordinator.batch",
                start_time=started,
                links=[Link(span.get_span_context()) for span in spans],
                attributes={"ductor.runs": ticked, "ductor.tick.mode": mode},
            )
            batch.end()
            self.batches += 1
        done.claimed = ticked
        return done

    async def _tick_batch(
        self,
        now: datetime,
        effects: Effects,
        limit: int,
        spans: list[Span],
        done: _Round,
        claimed: list[RunRecord] | None = None,
    ) -> int:
        # Read in one short transaction. A cheap batch is ticked and written
        # there; any other is ticked in the engine lane with no transaction
        # open and written in a second transaction. In both each run's
        # lock_version guards against a writer that got there in between.
        async with self.store.transaction() as tx:
            runs = await tx.claim_runs(now=now, limit=limit)
            if not runs:
                return 0
            refs = [RunRef(tenant_id=run.tenant_id, run_id=run.id) for run in runs]
            if claimed is not None:
                claimed.extend(runs)
            items = await tx.load_inbox(refs, now=now, limit_per_run=INPUTS_PER_TICK)
            plans = await self._plan(tx, runs, items, now, spans, done)
            if not plans:
                return len(runs)
            if all(_inline(plan.compute) for plan in plans):
                await self._tick_inline(tx, effects, plans, now, done)
                return len(runs)

        self.offloaded_batches += 1
        computes = [plan.compute for plan in plans if plan.compute is not None]
        if computes:
            lane = ISOLATION if len(runs) == 1 and self._suspect(runs[0]) else ENGINE
            ticked = await lane.run(_compute_all, computes)
            for plan, result in zip(
                [plan for plan in plans if plan.compute is not None], ticked, strict=True
            ):
                plan.ticked = result

        async with self.store.transaction() as tx:
            for plan in plans:
                if plan.kind is not None and plan.ticked is None:
                    inputs = [i.input for i in plan.pending]
                    plan.ticked = await plan.kind.tick(tx, self.parts, plan.run, inputs, now)
            await self._write(tx, effects, plans, now, done)
        return len(runs)

    async def _plan(
        self,
        tx: Tx,
        runs: list[RunRecord],
        items: list[InboxItem],
        now: datetime,
        spans: list[Span],
        done: _Round,
    ) -> list[_Plan]:
        """The claimed `runs` with their pending input (`items`, in order), prepared
        for their ticks.

        A run with no input left (another coordinator took it) is dropped; the
        stored input of a run of a kind this process does not know is put off."""
        plans: list[_Plan] = []
        by_run: dict[tuple[str, str], list[InboxItem]] = defaultdict(list)
        for item in items:
            by_run[(item.tenant_id, item.run_id)].append(item)
        unknown: list[RunRef] = []
        for run in runs:
            pending = by_run.get((run.tenant_id, run.id), [])
            if (
                len(pending) >= INPUTS_PER_TICK
                or sum(item.size for item in pending) >= INBOX_SIZE_PER_RUN
            ):
                done.left_over = True
            if not pending:
                # Another coordinator ticked it and took its input between this
                # claim's look at the inbox and its lock on the run: nothing to do.
                continue
            if run.status.terminal:
                # Late input for an ended run (a child's end after a cancel, ...).
                plans.append(_Plan(run, pending, None))
                continue
            kind = self.parts.kinds.find(run.kind)
            if kind is None:
                unknown.append(RunRef(tenant_id=run.tenant_id, run_id=run.id))
                continue
            plan = _Plan(run, pending, kind)
            if wants_spans(run.trace_context):
                # The tick's span continues the trace the run was started in.
                plan.span = tracer.start_span(
                    "ductor.tick",
                    context=context_from(run.trace_context),
                    attributes={
                        "ductor.tenant": run.tenant_id,
                        "ductor.run_id": run.id,
                        "ductor.run.kind": run.kind,
                        "ductor.inputs": len(pending),
                    },
                )
                spans.append(plan.span)
            if _prepares(kind):
                inputs = [i.input for i in pending]
                plan.compute = await kind.prepare_tick(tx, self.parts, run, inputs, now)
            plans.append(plan)
        if unknown:
            log.error(
                "%d run(s) of a kind this process does not know (it knows %s): put off %s",
                len(unknown),
                ", ".join(self.parts.kinds.names()),
                UNKNOWN_KIND_DELAY,
            )
            await tx.defer_inbox(unknown, now=now, until=now + UNKNOWN_KIND_DELAY)
        return plans

    async def _tick_inline(
        self, tx: Tx, effects: Effects, plans: list[_Plan], now: datetime, done: _Round
    ) -> set[tuple[str, str]]:
        """Tick `plans` on the loop and write them, all in `tx`; return the
        (tenant, run) keys of the runs whose input was taken (see `_write`)."""
        for plan in plans:
            if plan.compute is not None:
                plan.ticked = plan.compute()
            elif plan.kind is not None:
                inputs = [i.input for i in plan.pending]
                plan.ticked = await plan.kind.tick(tx, self.parts, plan.run, inputs, now)
        # The runs were read and locked in `tx` (a claim, or `lock_runs`).
        applied = await self._write(tx, effects, plans, now, done, locked=True)
        self.inline_batches += 1
        return applied

    async def _write(
        self,
        tx: Tx,
        effects: Effects,
        plans: list[_Plan],
        now: datetime,
        done: _Round,
        *,
        locked: bool = False,
    ) -> set[tuple[str, str]]:
        """Write the ticked plans' new states guarded by their lock_version, their
        commands and history, and delete the stored input they took; return the
        keys of the runs whose input was taken (an applied tick, or late input
        recorded as ignored). `locked`: `tx` holds the runs' row locks since it
        read them (`Tx.update_runs`)."""
        live = [(plan.run, plan.ticked) for plan in plans if plan.ticked is not None]
        applied = await tx.update_runs(
            [
                RunUpdate(
                    tenant_id=run.tenant_id,
                    run_id=run.id,
                    expected_lock_version=run.lock_version,
                    state=ticked.result.state,
                    updated_at=now,
                    kind_state=ticked.kind_state,
                    outlined=run.outlined,
                )
                for run, ticked in live
            ],
            locked=locked,
        )
        ok = {(run.tenant_id, run.id) for (run, _), good in zip(live, applied, strict=True) if good}
        consumed: list[InboxRef] = []
        taken: set[tuple[str, str]] = set()
        for plan in plans:
            run, pending, ticked = plan.run, plan.pending, plan.ticked
            if ticked is None:
                # No version guards this, so the inbox delete does: only the
                # coordinator that removed the late input records it.
                refs = [InboxRef(tenant_id=i.tenant_id, seq=i.seq) for i in pending if i.seq]
                if refs and await tx.delete_inbox(refs) == 0:
                    continue
                for item in pending:
                    ignored = IgnoredInput(input=item.input, reason="run has ended")
                    effects.history.append(ignored_entry(run.tenant_id, run.id, ignored, at=now))
                taken.add((run.tenant_id, run.id))
                continue
            if (run.tenant_id, run.id) not in ok:
                # Lost a race: the inbox stays, the next round retries.
                done.left_over = True
                self.conflicts += 1
                _conflicts.add(1)
                if plan.span is not None:
                    plan.span.set_attribute("ductor.conflict", True)
                continue
            result = ticked.result
            taken.add((run.tenant_id, run.id))
            consumed.extend(InboxRef(tenant_id=i.tenant_id, seq=i.seq) for i in pending if i.seq)
            for item in pending:
                entry = input_entry(run.tenant_id, run.id, item.input, at=now)
                if entry is not None:
                    effects.history.append(entry)
            for ignored in result.ignored:
                effects.history.append(ignored_entry(run.tenant_id, run.id, ignored, at=now))
            effects.history.extend(
                transition_entries(run.tenant_id, run.state, result.state, at=now)
            )
            updated = msgspec.structs.replace(
                run,
                state=result.state,
                status=result.state.status,
                kind_state=ticked.kind_state,
            )
            span = plan.span
            if span is not None:
                span.set_attribute("ductor.run.status", str(result.state.status))
            # The span is current while its commands are gathered: new tasks and
            # child runs store this tick's trace context.
            current = nullcontext() if span is None else trace.use_span(span, end_on_exit=False)
            with current:
                await apply_commands(
                    tx, self.parts, effects, run=updated, commands=result.commands, now=now
                )
            self.ticks += 1
        if consumed:
            await tx.delete_inbox(consumed)
        await effects.flush(tx)
        return taken


@dataclass
class _Round:
    """What one claim round did: the runs it claimed, and whether it left input
    it could have ticked (a lost race, a run with more input than one tick takes)."""

    claimed: int = 0
    left_over: bool = False


@dataclass
class _Plan:
    """One claimed run on its way through a batch: its input, its kind (None
    for an ended run), and its tick once computed."""

    run: RunRecord
    pending: list[InboxItem]
    kind: RunKind | None
    compute: Callable[[], KindTick] | None = None
    ticked: KindTick | None = None
    span: Span | None = None


_PREPARES: dict[type, bool] = {}


def _prepares(kind: RunKind) -> TypeGuard[PreparedTick]:
    """Whether `kind` meets `PreparedTick`, checked once per class (an isinstance
    check against a runtime protocol walks its members every time)."""
    known = _PREPARES.get(type(kind))
    if known is None:
        known = _PREPARES[type(kind)] = isinstance(kind, PreparedTick)
    return known


def _lasting(exc: Exception) -> bool:
    """Whether retrying what raised `exc` will fail the same way: an error that
    says it is not retryable (a value the database refuses, a broken kind), or
    no `DuctorError` at all (a bug); not an unreachable database or a lost race."""
    if isinstance(exc, StoreUnavailable):
        return False
    return not isinstance(exc, DuctorError) or not exc.retryable


def _inline(compute: Callable[[], KindTick] | None) -> bool:
    # No computation (an ended run, a kind ticked in the write transaction) is
    # no reason to leave the loop.
    return compute is None or (isinstance(compute, Computation) and compute.inline)


def _compute_all(computes: list[Callable[[], KindTick]]) -> list[KindTick]:
    """Every prepared tick of a batch (in a lane's worker)."""
    return [compute() for compute in computes]
