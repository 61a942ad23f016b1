"""The service layer the API calls: workflows, runs, signals and events.

It speaks in tenants, view structs and `ServerError`s; it never mentions HTTP.
Run state is written only by the coordinator; these functions add inputs to a
run's inbox (or create the run) and wake the engine.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from ductor_core.definitions import WorkflowDefinition
from ductor_core.expressions import ExpressionEngine
from ductor_core.runs import ErrorInfo, RunStatus, StepStatus
from ductor_server.engine.clock import Clock, SystemClock
from ductor_server.engine.queue import NullWakeUp, WakeUp

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


class Services:
    """What the API can ask of the engine; every call is scoped to one tenant.

    Args:
        store: the `Store` (storage protocol) holding everything.
        wake: how to wake the engine's loops after writing (the `Runtime`).
        engine: the CEL engine for trigger filters; the default engine if None.
        clock: where `now` comes from; the system clock if None.
    """

    def __init__(
        self,
        store: Any,
        *,
        wake: WakeUp | None = None,
        engine: ExpressionEngine | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.store = store
        self.wake = wake or NullWakeUp()
        self.engine = engine
        self.clock = clock or SystemClock()

    async def validate_workflow(self, tenant_id: str, body: Any) -> Any:
        """Validate a definition (parsed JSON); report every problem (ValidationReport)."""
        raise NotImplementedError

    async def publish_workflow(self, tenant_id: str, body: Any) -> PublishedWorkflow:
        """Publish a definition as the next version; same content, same version.

        Raises:
            DefinitionInvalid: with the problems as `details`.
        """
        raise NotImplementedError

    async def list_workflows(self, tenant_id: str) -> list[WorkflowSummary]:
        """Every workflow family of the tenant, by slug."""
        raise NotImplementedError

    async def get_workflow(self, tenant_id: str, slug: str) -> WorkflowFamilyView:
        """The family's latest definition and its versions.

        Raises:
            WorkflowNotFound
        """
        raise NotImplementedError

    async def get_workflow_version(
        self, tenant_id: str, slug: str, version: int
    ) -> WorkflowVersionView:
        """One version of a family.

        Raises:
            WorkflowNotFound, WorkflowVersionNotFound
        """
        raise NotImplementedError

    async def trigger_run(
        self,
        tenant_id: str,
        family_slug: str,
        version: int | None,
        input: Any,
        idempotency_key: str | None,
    ) -> RunView:
        """Start a run of `family_slug` at `version` (latest if None).

        A repeated `idempotency_key` returns the run it started the first time.

        Raises:
            WorkflowNotFound, WorkflowVersionNotFound
        """
        raise NotImplementedError

    async def get_run(self, tenant_id: str, run_id: str) -> RunView:
        """A run with per-step state.

        Raises:
            RunNotFound
        """
        raise NotImplementedError

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
        raise NotImplementedError

    async def run_history(self, tenant_id: str, run_id: str) -> list[HistoryEntry]:
        """A run's history, oldest first.

        Raises:
            RunNotFound
        """
        raise NotImplementedError

    async def cancel_run(self, tenant_id: str, run_id: str, reason: str) -> RunView:
        """Ask the coordinator to cancel a run and its children.

        Raises:
            RunNotFound, RunNotCancellable
        """
        raise NotImplementedError

    async def signal_run(
        self, tenant_id: str, run_id: str, name: str, payload: Any, signal_id: str | None
    ) -> SignalAccepted:
        """Send a named signal to a run; a repeated `signal_id` is accepted once.

        Raises:
            RunNotFound, RunNotCancellable (the run has ended), RequestInvalid
        """
        raise NotImplementedError

    async def send_event(
        self, tenant_id: str, name: str, data: Any, event_id: str | None
    ) -> EventAccepted:
        """Store an event (dedupe by id), start runs it triggers, wake runs waiting on it.

        Raises:
            EventInvalid
        """
        raise NotImplementedError


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
]
