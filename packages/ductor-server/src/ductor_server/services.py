"""The service layer the API calls: workflows, runs, signals and events.

It speaks in tenants, view structs and `ServerError`s; it never mentions HTTP.
Run state is written only by the coordinator; these functions add inputs to a
run's inbox (or create the run) and wake the engine.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec

from ductor_core.definitions import (
    StepType,
    WorkflowDefinition,
    content_hash,
    definition_from_obj,
)
from ductor_core.errors import DuctorError
from ductor_core.expressions import ExpressionEngine
from ductor_core.runs import (
    CancelRequested,
    ErrorInfo,
    ItemState,
    RunStatus,
    SignalReceived,
    StepState,
    StepStatus,
)
from ductor_core.validation import ValidationReport, validate_definition
from ductor_server.engine.catalog import WorkflowCatalog
from ductor_server.engine.clock import Clock, SystemClock
from ductor_server.engine.effects import Effects, EngineParts, create_run
from ductor_server.engine.events import ingest_event
from ductor_server.engine.kinds import RunKinds
from ductor_server.engine.queue import NullWakeUp, Topic, WakeUp
from ductor_server.errors import (
    DefinitionInvalid,
    EventInvalid,
    RequestInvalid,
    RunEnded,
    RunNotCancellable,
    RunNotFound,
    ServerError,
    WorkflowNotFound,
    WorkflowVersionNotFound,
)
from ductor_server.storage.errors import InvalidCursor
from ductor_server.storage.protocol import Store
from ductor_server.storage.records import (
    IdempotencyRecord,
    NewInboxItem,
    RunRecord,
    WorkflowVersionRecord,
)

# --- views ---------------------------------------------------------------------


class _View(msgspec.Struct, frozen=True, kw_only=True):
    pass


class ItemView(_View, frozen=True, kw_only=True):
    """One item of a SCATTER step."""

    index: int
    status: StepStatus
    attempt: int = 0
    output: Any = None
    error: ErrorInfo | None = None
    child_run_id: str | None = None


class StepView(_View, frozen=True, kw_only=True):
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


class RunView(_View, frozen=True, kw_only=True):
    """A run as the API shows it: status, input, output, error and every step."""

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


class RunSummary(_View, frozen=True, kw_only=True):
    """A run in a listing (no per-step state)."""

    id: str
    family_slug: str
    version: int
    status: RunStatus
    parent_run_id: str | None = None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None


class RunPage(_View, frozen=True, kw_only=True):
    """One page of runs, newest first; pass `next_cursor` back for the next page."""

    items: list[RunSummary]
    next_cursor: str | None = None


class HistoryEntry(_View, frozen=True, kw_only=True):
    """One line of a run's append-only history (`kind` e.g. "run.started", "step.succeeded")."""

    seq: int
    at: datetime
    kind: str
    data: Any = None


class PublishedWorkflow(_View, frozen=True, kw_only=True):
    """The answer to a publish: `created` is False when identical content already existed."""

    family_slug: str
    version: int
    hash: str
    created: bool


class WorkflowSummary(_View, frozen=True, kw_only=True):
    """A workflow family in a listing."""

    family_slug: str
    title: str
    latest_version: int
    latest_hash: str
    updated_at: datetime


class VersionInfo(_View, frozen=True, kw_only=True):
    """One published version of a family."""

    version: int
    hash: str
    created_at: datetime


class WorkflowVersionView(_View, frozen=True, kw_only=True):
    """One published version with its definition."""

    family_slug: str
    version: int
    hash: str
    created_at: datetime
    definition: WorkflowDefinition


class WorkflowFamilyView(_View, frozen=True, kw_only=True):
    """A family: its latest version (with definition) and every version, oldest first."""

    family_slug: str
    latest: WorkflowVersionView
    versions: list[VersionInfo]


class SignalAccepted(_View, frozen=True, kw_only=True):
    """A signal was queued for the run (`duplicate`: this signal id was seen before)."""

    run_id: str
    signal_id: str
    name: str
    duplicate: bool = False


class EventAccepted(_View, frozen=True, kw_only=True):
    """An event was stored; which runs it started and how many waiting runs it reached."""

    id: str
    name: str
    duplicate: bool
    runs_started: list[str] = []
    runs_notified: list[str] = []


# --- services ------------------------------------------------------------------

_STATUS_ALIASES = {status.name.lower(): status for status in RunStatus} | {
    status.value: status for status in RunStatus
}
MAX_PAGE = 500
MAX_NAME_LENGTH = 256


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


def _check_name(what: str, name: Any, error: type[ServerError]) -> str:
    if not isinstance(name, str) or not name.strip():
        raise error(f"{what} must be a non-empty string")
    if len(name) > MAX_NAME_LENGTH:
        raise error(f"{what} is longer than {MAX_NAME_LENGTH} characters")
    return name


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
    """The API view of a stored run; steps in definition order.

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
        idempotency_key=run.idempotency_key,
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


def _version_view(
    record: WorkflowVersionRecord, definition: WorkflowDefinition
) -> WorkflowVersionView:
    return WorkflowVersionView(
        family_slug=record.family_slug,
        version=record.version,
        hash=record.hash,
        created_at=record.created_at,
        definition=definition,
    )


def _request_hash(*parts: Any) -> str:
    return hashlib.sha256(msgspec.json.encode(list(parts), order="sorted")).hexdigest()


class Services:
    """What the API can ask of the engine; every call is scoped to one tenant.

    Args:
        store: the opened, migrated `Store`.
        wake: how to wake the engine's loops after writing (the `Runtime`'s wake-up).
        engine: the CEL engine for validation and trigger filters; the default if None.
        clock: where `now` comes from; the system clock if None.
        catalog: the definition cache to share with the engine loops.
        kinds: the run kinds to share with the engine loops (only DAG if None).
    """

    def __init__(
        self,
        store: Store,
        *,
        wake: WakeUp | None = None,
        engine: ExpressionEngine | None = None,
        clock: Clock | None = None,
        catalog: WorkflowCatalog | None = None,
        kinds: RunKinds | None = None,
    ) -> None:
        self.store = store
        self.wake = wake or NullWakeUp()
        self.engine = engine
        self.clock = clock or SystemClock()
        self.catalog = catalog or WorkflowCatalog()
        self._parts = EngineParts(catalog=self.catalog, engine=engine, kinds=kinds or RunKinds())

    # --- workflows ---------------------------------------------------------------

    async def validate_workflow(self, tenant_id: str, body: Any) -> ValidationReport:
        """Validate a definition (parsed JSON); report every problem with a pointer."""
        return validate_definition(body, engine=self.engine)

    async def publish_workflow(self, tenant_id: str, body: Any) -> PublishedWorkflow:
        """Publish a definition as the next version; same content, same version.

        Raises:
            DefinitionInvalid: with the problems as `details`.
        """
        report = validate_definition(body, engine=self.engine)
        if not report.valid:
            raise DefinitionInvalid(
                f"the definition has {len(report.problems)} problem(s)",
                details=msgspec.to_builtins(report.problems),
            )
        try:
            definition = definition_from_obj(body)
        except DuctorError as exc:  # validation passed, so this is unexpected
            raise DefinitionInvalid(exc.message, details=[]) from exc
        async with self.store.transaction() as tx:
            record, created = await tx.insert_workflow_version(
                tenant_id,
                family_slug=definition.family_slug,
                hash=content_hash(definition),
                definition=msgspec.to_builtins(definition),
                trigger_events=sorted({t.event for t in definition.triggers}),
                now=self.clock.now(),
            )
        return PublishedWorkflow(
            family_slug=record.family_slug,
            version=record.version,
            hash=record.hash,
            created=created,
        )

    async def list_workflows(self, tenant_id: str) -> list[WorkflowSummary]:
        """Every workflow family of the tenant, by slug."""
        async with self.store.transaction() as tx:
            families = await tx.list_workflow_families(tenant_id)
        summaries = []
        for family in families:
            definition = self.catalog.decode(family.latest)
            summaries.append(
                WorkflowSummary(
                    family_slug=family.family_slug,
                    title=definition.title,
                    latest_version=family.latest.version,
                    latest_hash=family.latest.hash,
                    updated_at=family.latest.created_at,
                )
            )
        return summaries

    async def get_workflow(self, tenant_id: str, slug: str) -> WorkflowFamilyView:
        """The family's latest definition and its versions.

        Raises:
            WorkflowNotFound
        """
        async with self.store.transaction() as tx:
            versions = await tx.list_workflow_versions(tenant_id, slug)
        if not versions:
            raise WorkflowNotFound(slug)
        latest = versions[-1]
        return WorkflowFamilyView(
            family_slug=slug,
            latest=_version_view(latest, self.catalog.decode(latest)),
            versions=[
                VersionInfo(version=v.version, hash=v.hash, created_at=v.created_at)
                for v in versions
            ],
        )

    async def get_workflow_version(
        self, tenant_id: str, slug: str, version: int
    ) -> WorkflowVersionView:
        """One version of a family.

        Raises:
            WorkflowNotFound, WorkflowVersionNotFound
        """
        async with self.store.transaction() as tx:
            record = await tx.get_workflow_version(tenant_id, slug, version)
            if record is None:
                if await tx.get_latest_workflow_version(tenant_id, slug) is None:
                    raise WorkflowNotFound(slug)
                raise WorkflowVersionNotFound(slug, version)
        return _version_view(record, self.catalog.decode(record))

    # --- runs --------------------------------------------------------------------

    async def trigger_run(
        self,
        tenant_id: str,
        family_slug: str,
        version: int | None,
        input: Any,
        idempotency_key: str | None,
    ) -> RunView:
        """Start a run of `family_slug` at `version` (latest if None).

        The run is created with its first tick in one transaction. A repeated
        `idempotency_key` returns the run it started the first time.

        Raises:
            WorkflowNotFound, WorkflowVersionNotFound, RequestInvalid
        """
        if version is not None and (isinstance(version, bool) or version < 1):
            raise RequestInvalid("version must be a positive integer")
        effects = Effects()
        now = self.clock.now()
        # A slug another run kind claims (an SDK workflow, "bridge:<app>:<workflow>")
        # starts a run of that kind.
        kind = self._parts.kinds.for_slug(family_slug)
        if kind is not self._parts.kinds.default:
            async with self.store.transaction() as tx:
                other = await kind.trigger(
                    tx,
                    self._parts,
                    effects,
                    tenant_id=tenant_id,
                    family_slug=family_slug,
                    version=version,
                    input=input,
                    now=now,
                    idempotency_key=idempotency_key,
                )
                if other is None:
                    raise WorkflowNotFound(family_slug)
                await effects.flush(tx)
            effects.notify(self.wake)
            return run_view(other, None)
        async with self.store.transaction() as tx:
            if idempotency_key is not None:
                existing = await tx.find_run_by_idempotency_key(tenant_id, idempotency_key)
                if existing is not None:
                    definition = await self.catalog.definition(
                        tx, tenant_id, existing.family_slug, existing.version
                    )
                    return run_view(existing, definition)
            resolved = await self.catalog.resolve(tx, tenant_id, family_slug, version)
            if resolved is None:
                if (
                    version is None
                    or await tx.get_latest_workflow_version(tenant_id, family_slug) is None
                ):
                    raise WorkflowNotFound(family_slug)
                raise WorkflowVersionNotFound(family_slug, version)
            record, definition = resolved
            inserted = await create_run(
                tx,
                self._parts,
                effects,
                tenant_id=tenant_id,
                record=record,
                definition=definition,
                input=input,
                now=now,
                idempotency_key=idempotency_key,
            )
            if inserted.created:
                await effects.flush(tx)
            run = inserted.run
            if not inserted.created:
                definition = (
                    await self.catalog.definition(tx, tenant_id, run.family_slug, run.version)
                    or definition
                )
        effects.notify(self.wake)
        return run_view(run, definition)

    async def _load_run(self, tenant_id: str, run_id: str) -> RunView:
        async with self.store.transaction() as tx:
            run = await tx.get_run(tenant_id, run_id)
            if run is None:
                raise RunNotFound(run_id)
            definition = await self.catalog.definition(tx, tenant_id, run.family_slug, run.version)
            children: list[RunRecord] = []
            if _starts_children(definition) and not run.status.terminal:
                # The tick learns a child's id only when the child ends; show it sooner.
                children = await tx.list_child_runs(tenant_id, run_id)
        return run_view(run, definition, children)

    async def get_run(self, tenant_id: str, run_id: str) -> RunView:
        """A run with per-step state.

        Raises:
            RunNotFound
        """
        return await self._load_run(tenant_id, run_id)

    async def list_runs(
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
            async with self.store.transaction() as tx:
                page = await tx.list_runs(
                    tenant_id,
                    status=status_value,
                    family_slug=family_slug or None,
                    cursor=cursor or None,
                    limit=limit,
                )
        except InvalidCursor as exc:
            raise RequestInvalid(exc.message, details={"cursor": cursor}) from exc
        return RunPage(items=[_summary(r) for r in page.items], next_cursor=page.next_cursor)

    async def run_history(self, tenant_id: str, run_id: str) -> list[HistoryEntry]:
        """A run's history, oldest first.

        Raises:
            RunNotFound
        """
        entries: list[HistoryEntry] = []
        async with self.store.transaction() as tx:
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

    async def cancel_run(self, tenant_id: str, run_id: str, reason: str) -> RunView:
        """Ask the coordinator to cancel a run and its children.

        The cancel is queued: the returned view has `cancel_requested` set once
        the coordinator has applied it; poll the run to see it end CANCELLED.

        Raises:
            RunNotFound, RunNotCancellable
        """
        now = self.clock.now()
        async with self.store.transaction() as tx:
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
            definition = await self.catalog.definition(tx, tenant_id, run.family_slug, run.version)
        self.wake.notify(Topic.INBOX)
        return run_view(run, definition)

    async def signal_run(
        self, tenant_id: str, run_id: str, name: str, payload: Any, signal_id: str | None
    ) -> SignalAccepted:
        """Send a named signal to a run; a repeated `signal_id` is accepted once.

        Raises:
            RunNotFound, RunEnded, RequestInvalid
        """
        _check_name("signal name", name, RequestInvalid)
        if signal_id is not None:
            _check_name("signal id", signal_id, RequestInvalid)
        sid = signal_id or f"sig_{uuid.uuid4().hex}"
        now = self.clock.now()
        async with self.store.transaction() as tx:
            run = await tx.get_run(tenant_id, run_id)
            if run is None:
                raise RunNotFound(run_id)
            if run.status.terminal:
                raise RunEnded(run_id, run.status.value)
            fresh = await tx.put_idempotency(
                IdempotencyRecord(
                    tenant_id=tenant_id,
                    scope=f"signal:{run_id}",
                    key=sid,
                    request_hash=_request_hash(name, payload),
                    status_code=202,
                    response={"name": name},
                    created_at=now,
                )
            )
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
        if fresh:
            self.wake.notify(Topic.INBOX)
        return SignalAccepted(run_id=run_id, signal_id=sid, name=name, duplicate=not fresh)

    async def send_event(
        self, tenant_id: str, name: str, data: Any, event_id: str | None
    ) -> EventAccepted:
        """Store an event (dedupe by id), start runs it triggers, wake runs waiting on it.

        Raises:
            EventInvalid
        """
        _check_name("event name", name, EventInvalid)
        if event_id is not None:
            _check_name("event id", event_id, EventInvalid)
        eid = event_id or f"evt_{uuid.uuid4().hex}"
        effects = Effects()
        async with self.store.transaction() as tx:
            outcome = await ingest_event(
                tx,
                self._parts,
                effects,
                tenant_id=tenant_id,
                event_id=eid,
                name=name,
                data=data,
                now=self.clock.now(),
            )
            await effects.flush(tx)
        effects.notify(self.wake)
        return EventAccepted(
            id=outcome.id,
            name=outcome.name,
            duplicate=outcome.duplicate,
            runs_started=outcome.runs_started,
            runs_notified=outcome.runs_notified,
        )


__all__ = [
    "EventAccepted",
    "HistoryEntry",
    "ItemView",
    "PublishedWorkflow",
    "RunPage",
    "RunSummary",
    "RunView",
    "Services",
    "SignalAccepted",
    "StepView",
    "VersionInfo",
    "WorkflowFamilyView",
    "WorkflowSummary",
    "WorkflowVersionView",
    "parse_run_status",
    "run_view",
]
