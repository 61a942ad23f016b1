"""Runs: trigger, read, list, cancel and signal them; the views a caller sees.

Run state is written only by the coordinator: these operations create a run
with its first tick, or add an input to a run's inbox, and wake the engine.
It speaks in tenants, views and `ServerError`s; it never mentions a transport.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec
from opentelemetry import trace

from ductor_core.definitions import StepType, WorkflowDefinition
from ductor_core.input_schemas import MAX_PROBLEMS
from ductor_core.runs import (
    CancelRequested,
    ErrorInfo,
    ItemState,
    RunStatus,
    SignalReceived,
    StepState,
    StepStatus,
)
from ductor_server.engine.catalog import WorkflowCatalog
from ductor_server.engine.effects import (
    Effects,
    FirstTick,
    RunStart,
    compute_first_tick,
    create_run,
    create_runs,
)
from ductor_server.engine.queue import Topic
from ductor_server.errors import (
    RequestInvalid,
    RunEnded,
    RunInputInvalid,
    RunNotCancellable,
    RunNotEnded,
    RunNotFound,
    ServerError,
    WorkflowNotFound,
    WorkflowVersionNotFound,
)
from ductor_server.services.context import ServiceContext, start_taking
from ductor_server.services.idempotency import (
    Answer,
    Claim,
    Outcome,
    check_key,
    fingerprint,
    once,
    shown_run_key,
    user_run_key,
)
from ductor_server.services.metering import refuse_over_budget
from ductor_server.storage.errors import InvalidCursor
from ductor_server.storage.protocol import Tx
from ductor_server.storage.records import (
    IdempotencyRecord,
    NewInboxItem,
    RunInsert,
    RunRecord,
    RunRef,
    WorkflowVersionRecord,
)
from ductor_server.telemetry import traced

# --- views ---------------------------------------------------------------------


class ItemView(msgspec.Struct, frozen=True, kw_only=True):
    """One item of a SCATTER step."""

    index: int
    status: StepStatus
    attempt: int = 0
    output: Any = None
    error: ErrorInfo | None = None
    child_run_id: str | None = None


class StepView(msgspec.Struct, frozen=True, kw_only=True):
    """The state of one step of a run, in definition order."""

    ref: str
    type: str
    title: str = ""
    status: StepStatus
    attempt: int = 0
    output: Any = None
    error: ErrorInfo | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    retry_at: datetime | None = None
    waiting_for: str | None = None
    child_run_id: str | None = None
    items: list[ItemView] | None = None


class RunView(msgspec.Struct, frozen=True, kw_only=True):
    """A run as a caller sees it: status, input, output, error and every step."""

    id: str
    family_slug: str
    version: int
    status: RunStatus
    input: Any = None
    output: Any = None
    error: ErrorInfo | None = None
    steps: list[StepView] = []
    parent_run_id: str | None = None
    parent_step_ref: str | None = None
    idempotency_key: str | None = None
    cancel_requested: bool = False
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None


class RunSummary(msgspec.Struct, frozen=True, kw_only=True):
    """A run in a listing (no per-step state)."""

    id: str
    family_slug: str
    version: int
    status: RunStatus
    parent_run_id: str | None = None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None


class RunPage(msgspec.Struct, frozen=True, kw_only=True):
    """One page of runs, newest first; pass `next_cursor` back for the next page."""

    items: list[RunSummary]
    next_cursor: str | None = None


MAX_WAIT_SECONDS = 60.0
"""The longest a read of a run may wait for it to end (`RunsService.get`)."""
MAX_RUNS_PER_BATCH = 500
"""The most runs one `trigger_many` (`POST /v1/runs/batch`) starts."""


class RunRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One run of a batch start.

    Attributes:
        family_slug: the workflow family (or another run kind's slug).
        version: the version to pin (latest if None).
        input: the run's input.
        key: names the run: a later start with the same key (in any batch, or as a
            single trigger's Idempotency-Key) returns this run.
    """

    family_slug: str
    version: int | None = None
    input: Any = None
    key: str | None = None


class StartedRun(msgspec.Struct, frozen=True, kw_only=True):
    """A run a batch start asked for: new (`created`) or found by its key."""

    id: str
    family_slug: str
    version: int
    status: RunStatus
    created: bool


class RunsStarted(msgspec.Struct, frozen=True, kw_only=True):
    """The runs of a batch start, in the order asked; `created` of them are new."""

    runs: tuple[StartedRun, ...]
    created: int


class RerunView(msgspec.Struct, frozen=True, kw_only=True):
    """`POST /v1/runs/{id}/rerun`: the new run, and the ended run it re-runs."""

    rerun_of: str
    run: RunView


class HistoryEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One line of a run's append-only history (`kind` e.g. "run.started", "step.succeeded")."""

    seq: int
    at: datetime
    kind: str
    data: Any = None


class SignalAccepted(msgspec.Struct, frozen=True, kw_only=True):
    """A signal was queued for the run (`duplicate`: this signal id was seen before)."""

    run_id: str
    signal_id: str
    name: str
    duplicate: bool = False


_STATUS_ALIASES = {status.name.lower(): status for status in RunStatus} | {
    status.value: status for status in RunStatus
}
MAX_PAGE = 500
MAX_NAME_LENGTH = 256
MAX_CANCEL_REASON = 10_000
"""The longest reason a cancel takes (kept in the run's history and its error)."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def parse_run_status(value: str) -> RunStatus:
    """A run status from its wire name ("RUN_STATUS_RUNNING") or short name ("running").

    Raises:
        RequestInvalid: not a run status.
    """
    status = _STATUS_ALIASES.get(value) or _STATUS_ALIASES.get(value.lower())
    if status is None:
        raise RequestInvalid(
            f"unknown run status {value!r}",
            details={"allowed": [s.value for s in RunStatus]},
        )
    return status


def check_reason(reason: str) -> None:
    """Refuse a reason (a cancel's, an assignment's) over `MAX_CANCEL_REASON`
    characters: it is kept whole in history and errors.

    Raises:
        RequestInvalid: at `$.reason`.
    """
    if len(reason) > MAX_CANCEL_REASON:
        problem = f"is longer than {MAX_CANCEL_REASON:,} characters"
        raise RequestInvalid(
            f"reason {problem}", details={"path": "$.reason", "reason": f"reason {problem}"}
        )


def check_name(what: str, name: Any, error: type[ServerError], *, path: str | None = None) -> str:
    """`name` if it is a non-empty string of at most MAX_NAME_LENGTH characters,
    without control characters.

    Args:
        what: how the message names it ("event id").
        name: the value to check.
        error: the error to raise.
        path: the JSON path of the field in the request body, if it came from one
            (becomes `details.path`).

    Raises:
        error: otherwise, naming `what`.
    """
    reason = None
    if not isinstance(name, str) or not name.strip():
        reason = "must be a non-empty string"
    elif len(name) > MAX_NAME_LENGTH:
        reason = f"is longer than {MAX_NAME_LENGTH} characters"
    elif _CONTROL.search(name):
        reason = "contains a control character"
    if reason is not None:
        details = None if path is None else {"path": path, "reason": f"{what} {reason}"}
        raise error(f"{what} {reason}", details=details)
    return str(name)


def _duplicate_signal(
    run_id: str, signal_id: str, delivered: IdempotencyRecord, name: str
) -> Answer[SignalAccepted]:
    """The answer to a signal id the run already took: the name it was delivered
    under (a repeat under another name delivers nothing under that one)."""
    response = delivered.response
    first = response.get("name") if isinstance(response, dict) else None
    shown = first if isinstance(first, str) else name
    accepted = SignalAccepted(run_id=run_id, signal_id=signal_id, name=shown, duplicate=True)
    return Answer(accepted, Outcome.ACCEPTED)


def _item_view(item: ItemState) -> ItemView:
    return ItemView(
        index=item.index,
        status=item.status,
        attempt=item.attempt,
        output=item.output,
        error=item.error,
        child_run_id=item.child_run_id,
    )


def _step_view(ref: str, step_type: str, title: str, state: StepState | None) -> StepView:
    if state is None:
        return StepView(ref=ref, type=step_type, title=title, status=StepStatus.PENDING)
    return StepView(
        ref=ref,
        type=step_type,
        title=title,
        status=state.status,
        attempt=state.attempt,
        output=state.output,
        error=state.error,
        started_at=state.started_at,
        finished_at=state.finished_at,
        retry_at=state.retry_at,
        waiting_for=state.waiting_for,
        child_run_id=state.child_run_id,
        items=None if state.items is None else [_item_view(i) for i in state.items],
    )


def _starts_children(definition: WorkflowDefinition | None) -> bool:
    if definition is None:
        return False
    for step in definition.steps:
        if step.type == StepType.SUBWORKFLOW.value:
            return True
        if step.type == StepType.SCATTER.value and step.args.get("workflow") is not None:
            return True
    return False


def _with_children(state: StepState, children: dict[tuple[str, int], str]) -> StepState:
    if state.child_run_id is None and (state.ref, -1) in children:
        state = msgspec.structs.replace(state, child_run_id=children[(state.ref, -1)])
    if state.items and any((state.ref, i.index) in children for i in state.items):
        items = [
            msgspec.structs.replace(i, child_run_id=children[(state.ref, i.index)])
            if i.child_run_id is None and (state.ref, i.index) in children
            else i
            for i in state.items
        ]
        state = msgspec.structs.replace(state, items=items)
    return state


def run_view(
    run: RunRecord,
    definition: WorkflowDefinition | None,
    children: Sequence[RunRecord] = (),
) -> RunView:
    """The view of a stored run; steps in definition order.

    `children` (the run's child runs) fill in the child run ids the state
    does not know yet (a child's id reaches the state when the child ends).
    """
    state = run.state
    by_unit = {
        (c.parent_step_ref, c.parent_item_index): c.id
        for c in children
        if c.parent_step_ref is not None
    }
    steps: list[StepView] = []
    seen: set[str] = set()
    for step in definition.steps if definition is not None else []:
        step_state = state.steps.get(step.ref)
        if step_state is not None and by_unit:
            step_state = _with_children(step_state, by_unit)
        steps.append(_step_view(step.ref, step.type, step.title, step_state))
        seen.add(step.ref)
    for ref, step_state in state.steps.items():
        if ref not in seen:
            steps.append(_step_view(ref, "", "", step_state))
    return RunView(
        id=run.id,
        family_slug=run.family_slug,
        version=run.version,
        status=state.status,
        input=state.input,
        output=state.output,
        error=state.error,
        steps=steps,
        parent_run_id=run.parent_run_id,
        parent_step_ref=run.parent_step_ref,
        idempotency_key=shown_run_key(run.idempotency_key),
        cancel_requested=state.cancel_requested,
        created_at=run.created_at,
        updated_at=run.updated_at,
        finished_at=state.finished_at or run.finished_at,
    )


def _summary(run: RunRecord) -> RunSummary:
    return RunSummary(
        id=run.id,
        family_slug=run.family_slug,
        version=run.version,
        status=run.status,
        parent_run_id=run.parent_run_id,
        created_at=run.created_at,
        updated_at=run.updated_at,
        finished_at=run.finished_at,
    )


# --- the service -----------------------------------------------------------------


class RunsService:
    """Runs of every tenant, pinned to the version they started with."""

    def __init__(self, context: ServiceContext) -> None:
        self._context = context

    @traced("ductor.runs.trigger")
    async def trigger(
        self,
        tenant_id: str,
        family_slug: str,
        version: int | None = None,
        input: Any = None,
        run_key: str | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> Answer[RunView]:
        """Start a run of `family_slug` at `version` (latest if None); `CREATED`.

        The run is created with its first tick in one transaction. `run_key`
        names the run: a second trigger with it returns the first run, whatever
        its input. Without a `run_key`, the idempotency key names the run too.

        Raises:
            WorkflowNotFound, WorkflowVersionNotFound, RequestInvalid
            IdempotencyConflict: the key was used with other arguments.
            BudgetExceeded: `budget.exceeded`, a blocking budget on `runs`.
            RunInputInvalid: `run.input_invalid`, the input does not satisfy the
                version's `input_schema` (nothing is stored).
        """
        if version is not None and (isinstance(version, bool) or version < 1):
            raise RequestInvalid(
                "version must be a positive integer",
                details={"path": "$.version", "reason": "must be a positive integer"},
            )
        now = self._context.clock.now()
        claim = Claim.of(
            tenant_id,
            "runs.trigger",
            idempotency_key,
            [family_slug, version, input, run_key],
            now=now,
        )
        stored_key = user_run_key(run_key or (claim.key if claim is not None else None))
        return await self._start(tenant_id, claim, family_slug, version, input, stored_key, now)

    async def rerun(
        self,
        tenant_id: str,
        run_id: str,
        *,
        latest: bool = False,
        idempotency_key: str | None = None,
    ) -> Answer[RerunView]:
        """Start a new run with an ended run's family, version (the family's latest with
        `latest`) and input; `CREATED`. The old run is left as it is.

        Raises:
            RunNotFound
            RunNotEnded: `run.not_ended`, the run has not ended yet.
            WorkflowNotFound, WorkflowVersionNotFound: the family (or version) is gone.
            IdempotencyConflict: the key was used with other arguments.
            BudgetExceeded: `budget.exceeded`, a blocking budget on `runs`.
            RunInputInvalid: `run.input_invalid`, the input does not satisfy the
                `input_schema` of the version the new run would pin.
        """
        context = self._context
        async with context.store.transaction() as tx:
            run = await tx.get_run(tenant_id, run_id)
        if run is None:
            raise RunNotFound(run_id)
        if not run.status.terminal:
            raise RunNotEnded(run_id, run.status.value)
        kinds = context.parts.kinds
        # Another kind's run (an SDK workflow) is started as its trigger would start it.
        pinned = not latest and kinds.for_slug(run.family_slug) is kinds.default
        now = context.clock.now()
        claim = Claim.of(tenant_id, "runs.rerun", idempotency_key, [latest], now=now, target=run_id)
        stored_key = user_run_key(claim.key) if claim is not None else None
        if stored_key is not None:
            # The new run is named by the rerun's key within the old run's scope, so
            # the same key may rerun two runs, and trigger a third.
            stored_key = f"{stored_key}#rerun:{run_id}"
        answer = await self._start(
            tenant_id,
            claim,
            run.family_slug,
            run.version if pinned else None,
            run.input,
            stored_key,
            now,
        )
        return Answer(RerunView(rerun_of=run_id, run=answer.value), answer.outcome, answer.replayed)

    async def _start(
        self,
        tenant_id: str,
        claim: Claim | None,
        family_slug: str,
        version: int | None,
        input: Any,
        stored_key: str | None,
        now: datetime,
    ) -> Answer[RunView]:
        """Start one run, once per `claim` (see `trigger`)."""
        context = self._context
        effects = Effects()
        first = await self._first_tick(tenant_id, family_slug, version, input, stored_key, now)

        async def effect(tx: Tx) -> Answer[RunView]:
            # A slug another run kind claims (an SDK workflow, "bridge:<app>:<workflow>")
            # starts a run of that kind.
            kinds = context.parts.kinds
            kind = kinds.for_slug(family_slug)
            if kind is not kinds.default:
                other = await kind.trigger(
                    tx,
                    context.parts,
                    effects,
                    tenant_id=tenant_id,
                    family_slug=family_slug,
                    version=version,
                    input=input,
                    now=now,
                    idempotency_key=stored_key,
                )
                if other is None:
                    raise WorkflowNotFound(family_slug)
                await effects.flush(tx)
                refuse_over_budget(effects.budgeted)
                return Answer(run_view(other, None), Outcome.CREATED)
            view, _ = await self._create(
                tx, effects, tenant_id, family_slug, version, input, stored_key, now, first
            )
            # The runs it created are metered by the flush: past a blocking budget
            # on `runs`, the whole trigger rolls back.
            refuse_over_budget(effects.budgeted)
            return Answer(view, Outcome.CREATED)

        # A worker of this process may lease the run's first task in this very
        # transaction, and start it once it commits (no lease, no wake-up).
        async with start_taking(context) as taker:
            effects.taker = taker
            answer = await once(context.store, claim, RunView, effect)
        effects.notify(context.wake, context.feed)
        span = trace.get_current_span()
        span.set_attribute("ductor.family_slug", family_slug)
        span.set_attribute("ductor.run_id", answer.value.id)
        return answer

    @traced("ductor.runs.trigger_many")
    async def trigger_many(
        self,
        tenant_id: str,
        requests: Sequence[RunRequest],
        *,
        idempotency_key: str | None = None,
    ) -> Answer[RunsStarted]:
        """Start up to `MAX_RUNS_PER_BATCH` runs in one transaction, all or none: `CREATED`.

        A run's `key` (else the batch's Idempotency-Key and its index,
        ``<key>#3``) names it, so a retried batch starts nothing twice. First
        ticks are computed before the transaction, as for one trigger.

        Raises:
            RequestInvalid: no runs, too many, a bad version, a key used twice (with
                the `pointer` of the run).
            WorkflowNotFound, WorkflowVersionNotFound: with the run's `pointer`.
            IdempotencyConflict: the batch's key was used with other runs.
            BudgetExceeded: `budget.exceeded`, the batch would pass a blocking
                budget on `runs` (none is started).
            RunInputInvalid: `run.input_invalid`, runs whose input does not satisfy
                their version's `input_schema`, each problem's pointer under its
                run (`/runs/3/input/total`); none is started.
        """
        count = len(requests)
        if not 1 <= count <= MAX_RUNS_PER_BATCH:
            raise RequestInvalid(
                f"a batch starts 1 to {MAX_RUNS_PER_BATCH} runs, not {count}",
                details={"pointer": "/runs", "count": count},
            )
        context = self._context
        now = context.clock.now()
        claim = Claim.of(tenant_id, "runs.trigger_many", idempotency_key, list(requests), now=now)
        keys: list[str | None] = []
        for index, request in enumerate(requests):
            version = request.version
            if version is not None and (isinstance(version, bool) or version < 1):
                raise RequestInvalid(
                    "version must be a positive integer",
                    details={"pointer": f"/runs/{index}/version"},
                )
            if request.key is not None:
                try:
                    key: str | None = check_key(request.key)
                except RequestInvalid as error:
                    error.details = {"pointer": f"/runs/{index}/key"}
                    raise
            else:
                key = f"{claim.key}#{index}" if claim is not None else None
            stored = user_run_key(key)
            if stored is not None and stored in keys:
                raise RequestInvalid(
                    f"the run key {key!r} is used twice in the batch",
                    details={"pointer": f"/runs/{index}/key"},
                )
            keys.append(stored)
        firsts = await self._first_ticks(tenant_id, requests, keys, now, batch=True)
        effects = Effects()

        async def effect(tx: Tx) -> Answer[RunsStarted]:
            kinds = context.parts.kinds
            versions = _Versions(context.catalog, tx, tenant_id)
            views: list[tuple[RunView, bool] | None] = [None] * count
            # The DAG runs of the batch are inserted together, after every other
            # kind's: (index, start) for each.
            dag: list[tuple[int, RunStart]] = []
            for index, (request, key, first) in enumerate(zip(requests, keys, firsts, strict=True)):
                try:
                    kind = kinds.for_slug(request.family_slug)
                    if kind is not kinds.default:
                        other = await kind.trigger(
                            tx,
                            context.parts,
                            effects,
                            tenant_id=tenant_id,
                            family_slug=request.family_slug,
                            version=request.version,
                            input=request.input,
                            now=now,
                            idempotency_key=key,
                        )
                        if other is None:
                            raise WorkflowNotFound(request.family_slug)
                        views[index] = (run_view(other, None), True)
                        continue
                    resolved = (
                        (first.record, first.definition)
                        if first is not None
                        else await self._resolve_or_existing(
                            tx, versions, tenant_id, request.family_slug, request.version, key
                        )
                    )
                except ServerError as error:
                    error.details = {**(error.details or {}), "pointer": f"/runs/{index}"}
                    raise
                if isinstance(resolved, RunView):
                    views[index] = (resolved, False)
                    continue
                record, definition = resolved
                dag.append(
                    (
                        index,
                        RunStart(
                            tenant_id=tenant_id,
                            record=record,
                            definition=definition,
                            input=request.input,
                            idempotency_key=key,
                            first=first.first if first is not None else None,
                        ),
                    )
                )
            try:
                inserted = await create_runs(
                    tx, context.parts, effects, [start for _, start in dag], now=now
                )
            except RunInputInvalid as error:
                raise error.under(f"/runs/{dag[error.start_index][0]}") from None
            for (index, start), one in zip(dag, inserted, strict=True):
                views[index] = await self._inserted_view(tx, tenant_id, start.definition, one)
            started: list[StartedRun] = []
            for found in views:
                assert found is not None
                view, created = found
                started.append(
                    StartedRun(
                        id=view.id,
                        family_slug=view.family_slug,
                        version=view.version,
                        status=view.status,
                        created=created,
                    )
                )
            await effects.flush(tx)
            # Past a blocking budget on `runs`, the whole batch rolls back.
            refuse_over_budget(effects.budgeted)
            made = sum(1 for run in started if run.created)
            return Answer(RunsStarted(runs=tuple(started), created=made), Outcome.CREATED)

        # A worker of this process may lease the new runs' first tasks in this
        # very transaction, as many as it has free slots for (see `_start`).
        async with start_taking(context, count) as taker:
            effects.taker = taker
            answer = await once(context.store, claim, RunsStarted, effect)
        effects.notify(context.wake, context.feed)
        return answer

    async def _first_tick(
        self,
        tenant_id: str,
        family_slug: str,
        version: int | None,
        input: Any,
        stored_key: str | None,
        now: datetime,
    ) -> _Ready | None:
        """The first tick of the DAG run a trigger would start, computed before the
        trigger's transaction opens (on the loop only when cheap) (it evaluates CEL over the
        input, which may be large), with the version it is for; None when there
        is nothing to start (another kind's slug, an unknown workflow, a run key
        already taken)."""
        request = RunRequest(family_slug=family_slug, version=version, input=input)
        [first] = await self._first_ticks(tenant_id, [request], [stored_key], now)
        return first

    async def _first_ticks(
        self,
        tenant_id: str,
        requests: Sequence[RunRequest],
        stored_keys: Sequence[str | None],
        now: datetime,
        *,
        batch: bool = False,
    ) -> list[_Ready | None]:
        """`_first_tick` for each request of a batch, read together: the run keys
        already taken in one round trip, each named version once.

        Raises:
            RunInputInvalid: inputs that do not satisfy their version's
                `input_schema` (in a `batch`, pointers start with `/runs/<index>`).
        """
        context = self._context
        kinds = context.parts.kinds
        ours = [i for i, r in enumerate(requests) if kinds.for_slug(r.family_slug) is kinds.default]
        if not ours:
            return [None] * len(requests)
        resolved: list[tuple[WorkflowVersionRecord, WorkflowDefinition] | None] = [None] * len(
            requests
        )
        # A hint, checked again by the insert's transaction: read without one.
        async with context.store.read() as tx:
            keyed = [i for i in ours if stored_keys[i] is not None]
            taken = await tx.find_runs_by_idempotency_keys(
                tenant_id, [k for i in keyed if (k := stored_keys[i]) is not None]
            )
            skip = {i for i, run in zip(keyed, taken, strict=True) if run is not None}
            versions = _Versions(context.catalog, tx, tenant_id)
            for i in ours:
                if i not in skip:
                    resolved[i] = await versions.resolve(
                        requests[i].family_slug, requests[i].version
                    )
        firsts: list[_Ready | None] = []
        refused: list[RunInputInvalid] = []
        for index, (request, found) in enumerate(zip(requests, resolved, strict=True)):
            if found is None:
                firsts.append(None)
                continue
            record, definition = found
            try:
                first = await compute_first_tick(
                    context.parts, definition, input=request.input, now=now, tenant_id=tenant_id
                )
            except RunInputInvalid as error:
                # A batch names the run; every refused run's problems are listed.
                refused.append(error.under(f"/runs/{index}") if batch else error)
                firsts.append(None)
                continue
            firsts.append(_Ready(record, definition, first))
        if refused:
            problems = [p for error in refused for p in error.problems][:MAX_PROBLEMS]
            raise RunInputInvalid(refused[0].family_slug, problems)
        return firsts

    async def _create(
        self,
        tx: Tx,
        effects: Effects,
        tenant_id: str,
        family_slug: str,
        version: int | None,
        input: Any,
        stored_key: str | None,
        now: datetime,
        first: _Ready | None = None,
    ) -> tuple[RunView, bool]:
        """The run started (True) and its effects written, or the one its key
        names (False).

        A run key already taken is found by the insert itself (it writes nothing
        then and returns the run); it is looked up first only when the workflow
        cannot be resolved, so that a retry still gets its run. With `first`, the
        version read before the transaction is the one the run pins."""
        if first is not None:
            record, definition = first.record, first.definition
        else:
            versions = _Versions(self._context.catalog, tx, tenant_id)
            resolved = await self._resolve_or_existing(
                tx, versions, tenant_id, family_slug, version, stored_key
            )
            if isinstance(resolved, RunView):
                return resolved, False
            record, definition = resolved
        inserted = await create_run(
            tx,
            self._context.parts,
            effects,
            tenant_id=tenant_id,
            record=record,
            definition=definition,
            input=input,
            now=now,
            idempotency_key=stored_key,
            first=first.first if first is not None else None,
        )
        if inserted.created:
            await effects.flush(tx)
        return await self._inserted_view(tx, tenant_id, definition, inserted)

    async def _resolve_or_existing(
        self,
        tx: Tx,
        versions: _Versions,
        tenant_id: str,
        family_slug: str,
        version: int | None,
        stored_key: str | None,
    ) -> tuple[WorkflowVersionRecord, WorkflowDefinition] | RunView:
        """The version a new run would pin, or, when there is none, the run the
        key already names (a retry gets its run even so).

        Raises:
            WorkflowNotFound, WorkflowVersionNotFound: neither exists.
        """
        resolved = await versions.resolve(family_slug, version)
        if resolved is not None:
            return resolved
        if stored_key is not None:
            existing = await tx.find_run_by_idempotency_key(tenant_id, stored_key)
            if existing is not None:
                definition = await self._context.catalog.definition(
                    tx, tenant_id, existing.family_slug, existing.version
                )
                return run_view(existing, definition)
        if version is None or await tx.get_latest_workflow_version(tenant_id, family_slug) is None:
            raise WorkflowNotFound(family_slug)
        raise WorkflowVersionNotFound(family_slug, version)

    async def _inserted_view(
        self, tx: Tx, tenant_id: str, definition: WorkflowDefinition, inserted: RunInsert
    ) -> tuple[RunView, bool]:
        """The view of a run just created (True), or of the run its key already
        named (False), with the definition it pinned."""
        run = inserted.run
        if inserted.created:
            return run_view(run, definition), True
        catalog = self._context.catalog
        pinned = await catalog.definition(tx, tenant_id, run.family_slug, run.version)
        return run_view(run, pinned or definition), False

    async def get(self, tenant_id: str, run_id: str, *, wait: float | None = None) -> RunView:
        """A run with per-step state; with `wait`, once it has ended or `wait`
        seconds have passed, whichever comes first (a long poll).

        Raises:
            RunNotFound
            RunWaitLimit: `run.wait_limit`, too many requests of the tenant wait.
        """
        endings = self._context.endings
        if wait is None or wait <= 0 or endings is None:
            return await self._read(tenant_id, run_id)
        # Watch before the first look: an end committed after it still wakes us.
        with endings.watch(tenant_id, run_id) as ended:
            async with self._context.store.read() as tx:
                [status] = await tx.run_statuses([RunRef(tenant_id=tenant_id, run_id=run_id)])
            if status is None:
                raise RunNotFound(run_id)
            if not status.terminal:
                try:
                    async with asyncio.timeout(wait):
                        await ended
                except TimeoutError:
                    pass
        return await self._read(tenant_id, run_id)

    async def _read(self, tenant_id: str, run_id: str) -> RunView:
        # A view, which nothing writes on: each statement on its own (no BEGIN
        # and COMMIT); the children, listed after the run, may be newer.
        async with self._context.store.read() as tx:
            run = await tx.get_run(tenant_id, run_id)
            if run is None:
                raise RunNotFound(run_id)
            definition = await self._context.catalog.definition(
                tx, tenant_id, run.family_slug, run.version
            )
            children: list[RunRecord] = []
            if _starts_children(definition) and not run.status.terminal:
                # The tick learns a child's id only when the child ends; show it sooner.
                children = await tx.list_child_runs(tenant_id, run_id)
        return run_view(run, definition, children)

    async def page(
        self,
        tenant_id: str,
        *,
        status: str | None = None,
        family_slug: str | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> RunPage:
        """Runs newest first, filtered by status and family.

        Raises:
            RequestInvalid: unknown status, bad cursor or limit.
        """
        if isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE:
            raise RequestInvalid(f"limit must be between 1 and {MAX_PAGE}")
        status_value = parse_run_status(status).value if status else None
        try:
            async with self._context.store.transaction() as tx:
                page = await tx.list_runs(
                    tenant_id,
                    status=status_value,
                    family_slug=family_slug or None,
                    cursor=cursor or None,
                    limit=limit,
                )
        except InvalidCursor as exc:
            raise RequestInvalid(
                exc.message, details={"pointer": "cursor", "cursor": cursor}
            ) from exc
        return RunPage(items=[_summary(r) for r in page.items], next_cursor=page.next_cursor)

    async def history(self, tenant_id: str, run_id: str) -> list[HistoryEntry]:
        """A run's history, oldest first.

        Raises:
            RunNotFound
        """
        entries: list[HistoryEntry] = []
        async with self._context.store.transaction() as tx:
            if await tx.get_run(tenant_id, run_id) is None:
                raise RunNotFound(run_id)
            after = 0
            while True:
                batch = await tx.list_history(tenant_id, run_id, after_seq=after, limit=1000)
                entries.extend(
                    HistoryEntry(seq=h.seq, at=h.at, kind=h.kind, data=h.data) for h in batch
                )
                if len(batch) < 1000:
                    break
                after = batch[-1].seq
        return entries

    async def cancel(
        self,
        tenant_id: str,
        run_id: str,
        reason: str = "",
        *,
        idempotency_key: str | None = None,
    ) -> Answer[RunView]:
        """Ask the coordinator to cancel a run and its children; `ACCEPTED`.

        The cancel is queued: the returned view has `cancel_requested` set once
        the coordinator has applied it; poll the run to see it end CANCELLED.

        Raises:
            RunNotFound, RunNotCancellable
            RequestInvalid: `reason` is over `MAX_CANCEL_REASON` characters.
            IdempotencyConflict: the key was used with another reason.
        """
        check_reason(reason)
        context = self._context
        now = context.clock.now()
        claim = Claim.of(
            tenant_id, "runs.cancel", idempotency_key, [reason], now=now, target=run_id
        )

        async def effect(tx: Tx) -> Answer[RunView]:
            run = await tx.get_run(tenant_id, run_id)
            if run is None:
                raise RunNotFound(run_id)
            if run.status.terminal:
                raise RunNotCancellable(run_id, run.status.value)
            await tx.enqueue_inbox(
                [
                    NewInboxItem(
                        tenant_id=tenant_id,
                        run_id=run_id,
                        input=CancelRequested(reason=reason),
                        available_at=now,
                    )
                ]
            )
            definition = await context.catalog.definition(
                tx, tenant_id, run.family_slug, run.version
            )
            return Answer(run_view(run, definition), Outcome.ACCEPTED)

        answer = await once(context.store, claim, RunView, effect)
        if not answer.replayed:
            context.wake.notify(Topic.INBOX)
        return answer

    async def signal(
        self,
        tenant_id: str,
        run_id: str,
        name: str,
        payload: Any = None,
        signal_id: str | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> Answer[SignalAccepted]:
        """Send a named signal to a run; a repeated signal id is accepted once; `ACCEPTED`.

        Without a `signal_id`, the idempotency key names the signal.

        Raises:
            RunNotFound, RunEnded, RequestInvalid
            IdempotencyConflict: the key was used with another payload or id.
        """
        check_name("signal name", name, RequestInvalid, path="$.name")
        if signal_id is not None:
            check_name("signal id", signal_id, RequestInvalid, path="$.id")
        context = self._context
        now = context.clock.now()
        claim = Claim.of(
            tenant_id,
            "runs.signal",
            idempotency_key,
            [payload, signal_id],
            now=now,
            target=f"{run_id}:{name}",
        )
        sid = signal_id or (claim.key if claim is not None else f"sig_{uuid.uuid4().hex}")
        effects = Effects()

        async def effect(tx: Tx) -> Answer[SignalAccepted]:
            # The status alone: the run's state, which can be large, is the tick's.
            [status] = await tx.run_statuses([RunRef(tenant_id=tenant_id, run_id=run_id)])
            if status is None:
                raise RunNotFound(run_id)
            scope = f"signal:{run_id}"
            if status.terminal:
                # A signal sent again after it ended the run (a retry whose
                # first answer was lost) is the duplicate it is, not a refusal.
                delivered = await tx.get_idempotency(tenant_id, scope, sid)
                if delivered is None:
                    raise RunEnded(run_id, status.value)
                return _duplicate_signal(run_id, sid, delivered, name)
            # A signal id is delivered once per run, whoever sends it again.
            fresh = await tx.put_idempotency(
                IdempotencyRecord(
                    tenant_id=tenant_id,
                    scope=scope,
                    key=sid,
                    request_hash=fingerprint(name, payload),
                    status_code=int(Outcome.ACCEPTED),
                    response={"name": name},
                    created_at=now,
                )
            )
            if not fresh:
                delivered = await tx.get_idempotency(tenant_id, scope, sid)
                if delivered is not None:
                    return _duplicate_signal(run_id, sid, delivered, name)
            if fresh:
                await tx.enqueue_inbox(
                    [
                        NewInboxItem(
                            tenant_id=tenant_id,
                            run_id=run_id,
                            input=SignalReceived(signal_id=sid, name=name, payload=payload),
                            available_at=now,
                        )
                    ]
                )
                effects.topics.add(Topic.INBOX)
            accepted = SignalAccepted(run_id=run_id, signal_id=sid, name=name, duplicate=not fresh)
            return Answer(accepted, Outcome.ACCEPTED)

        answer = await once(context.store, claim, SignalAccepted, effect)
        effects.notify(context.wake, context.feed)
        return answer


__all__ = [
    "MAX_CANCEL_REASON",
    "MAX_NAME_LENGTH",
    "MAX_PAGE",
    "HistoryEntry",
    "ItemView",
    "RerunView",
    "RunPage",
    "RunSummary",
    "RunView",
    "RunsService",
    "SignalAccepted",
    "StepView",
    "check_name",
    "check_reason",
    "parse_run_status",
    "run_view",
]


@dataclass(frozen=True)
class _Ready:
    """A DAG run a trigger starts, prepared before its transaction opens: the
    version it pins (the family's latest as read then, when none is named), its
    definition, and its first tick. A publish that commits meanwhile is as if
    it came after the trigger."""

    record: WorkflowVersionRecord
    definition: WorkflowDefinition
    first: FirstTick


class _Versions:
    """The workflow versions one transaction of a request names, each read once
    (`WorkflowCatalog.resolve` reads "latest" from the store every time)."""

    def __init__(self, catalog: WorkflowCatalog, tx: Tx, tenant_id: str) -> None:
        self._catalog = catalog
        self._tx = tx
        self._tenant_id = tenant_id
        self._seen: dict[
            tuple[str, int | None], tuple[WorkflowVersionRecord, WorkflowDefinition] | None
        ] = {}

    async def resolve(
        self, family_slug: str, version: int | None
    ) -> tuple[WorkflowVersionRecord, WorkflowDefinition] | None:
        """The record and definition at `version` (the latest if None), or None."""
        key = (family_slug, version)
        if key not in self._seen:
            self._seen[key] = await self._catalog.resolve(
                self._tx, self._tenant_id, family_slug, version
            )
        return self._seen[key]
