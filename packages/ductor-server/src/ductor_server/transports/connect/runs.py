"""`WorkflowService`, `RunService` and `EventService`: the methods of `/v1/workflows`,
`/v1/runs` and `/v1/events`, each calling the service function its REST route calls."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from ductor_core.validation import ValidationReport
from ductor_server.services import (
    EventAccepted,
    HistoryEntry,
    PublishedWorkflow,
    RunPage,
    RunView,
    SignalAccepted,
    WorkflowFamilyView,
    WorkflowSummary,
    WorkflowVersionView,
)
from ductor_server.services.runs import MAX_WAIT_SECONDS, RerunView, RunsStarted
from ductor_server.transports.connect.method import (
    Cursor,
    Empty,
    Id,
    Limit500,
    Method,
    Req,
    Version,
    method,
)
from ductor_server.transports.rest.bodies import EventBody, TriggerRunBody, TriggerRunsBody


class DefinitionRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A workflow definition (any JSON, so validation reports every problem at once)."""

    definition: Any = None


class FamilyRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One workflow family."""

    family_slug: Id


class VersionRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One published version of a family."""

    family_slug: Id
    version: Version


class ListRunsRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Runs newest first, filtered and paged as `GET /v1/runs`."""

    status: str | None = None
    family_slug: str | None = None
    cursor: Cursor | None = None
    limit: Limit500 = 50


class RunRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One run."""

    run_id: Id


class GetRunRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One run; with `wait` (seconds), answered once it has ended or the time is up."""

    run_id: Id
    wait: Annotated[float, msgspec.Meta(gt=0, le=MAX_WAIT_SECONDS)] | None = None


class CancelRunRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Cancel a run, with an optional reason kept in its history."""

    run_id: Id
    reason: str = ""


class RerunRunRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Re-run an ended run (with its family's latest version when `latest`)."""

    run_id: Id
    latest: bool = False


class SignalRunRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Send the signal `name` to a run; a repeated `id` is accepted once."""

    run_id: Id
    name: Id
    payload: Any = None
    id: str | None = None


WORKFLOWS = "WorkflowService"
RUNS = "RunService"
EVENTS = "EventService"

METHODS: tuple[Method, ...] = (
    method(
        WORKFLOWS,
        "ValidateWorkflow",
        DefinitionRequest,
        ValidationReport,
        lambda s, t, r, k: s.workflows.validate(t, r.definition),
        rest="POST /v1/workflows/validate",
        doc="Check a definition without publishing it: every problem with a JSON pointer.",
    ),
    method(
        WORKFLOWS,
        "PublishWorkflow",
        DefinitionRequest,
        PublishedWorkflow,
        lambda s, t, r, k: s.workflows.publish(t, r.definition, idempotency_key=k),
        rest="POST /v1/workflows",
        mutates=True,
        doc="Publish a definition as a new immutable version (or find the identical one).",
    ),
    method(
        WORKFLOWS,
        "ListWorkflows",
        Empty,
        list[WorkflowSummary],
        lambda s, t, r, k: s.workflows.families(t),
        rest="GET /v1/workflows",
        doc="Every workflow family of the tenant.",
    ),
    method(
        WORKFLOWS,
        "GetWorkflow",
        FamilyRequest,
        WorkflowFamilyView,
        lambda s, t, r, k: s.workflows.family(t, r.family_slug),
        rest="GET /v1/workflows/{slug}",
        doc="A family: its latest definition and its versions.",
    ),
    method(
        WORKFLOWS,
        "GetWorkflowVersion",
        VersionRequest,
        WorkflowVersionView,
        lambda s, t, r, k: s.workflows.version(t, r.family_slug, r.version),
        rest="GET /v1/workflows/{slug}/versions/{version}",
        doc="One published version with its definition.",
    ),
    method(
        RUNS,
        "TriggerRun",
        TriggerRunBody,
        RunView,
        lambda s, t, r, k: s.runs.trigger(t, r.family_slug, r.version, r.input, idempotency_key=k),
        rest="POST /v1/runs",
        mutates=True,
        doc="Start a run of a published family (its latest version unless `version`).",
    ),
    method(
        RUNS,
        "TriggerRuns",
        TriggerRunsBody,
        RunsStarted,
        lambda s, t, r, k: s.runs.trigger_many(t, r.runs, idempotency_key=k),
        rest="POST /v1/runs/batch",
        mutates=True,
        doc="Start up to 500 runs in one transaction, all or none.",
    ),
    method(
        RUNS,
        "ListRuns",
        ListRunsRequest,
        RunPage,
        lambda s, t, r, k: s.runs.page(
            t, status=r.status, family_slug=r.family_slug, cursor=r.cursor, limit=r.limit
        ),
        rest="GET /v1/runs",
        doc="Runs newest first, filtered by status and family, paged by cursor.",
    ),
    method(
        RUNS,
        "GetRun",
        GetRunRequest,
        RunView,
        lambda s, t, r, k: s.runs.get(t, r.run_id, wait=r.wait),
        rest="GET /v1/runs/{run_id}",
        doc=(
            "A run: status, input, output, error and every step's state. With `wait`"
            " (seconds, up to 60), answered once the run has ended or the time is up."
        ),
    ),
    method(
        RUNS,
        "GetRunHistory",
        RunRequest,
        list[HistoryEntry],
        lambda s, t, r, k: s.runs.history(t, r.run_id),
        rest="GET /v1/runs/{run_id}/history",
        doc="The run's append-only history, oldest first.",
    ),
    method(
        RUNS,
        "CancelRun",
        CancelRunRequest,
        RunView,
        lambda s, t, r, k: s.runs.cancel(t, r.run_id, r.reason, idempotency_key=k),
        rest="POST /v1/runs/{run_id}/cancel",
        mutates=True,
        doc="Ask for the run and its children to be cancelled on its next tick.",
    ),
    method(
        RUNS,
        "RerunRun",
        RerunRunRequest,
        RerunView,
        lambda s, t, r, k: s.runs.rerun(t, r.run_id, latest=r.latest, idempotency_key=k),
        rest="POST /v1/runs/{run_id}/rerun",
        mutates=True,
        doc="Start a new run with an ended run's family, version and input.",
    ),
    method(
        RUNS,
        "SignalRun",
        SignalRunRequest,
        SignalAccepted,
        lambda s, t, r, k: s.runs.signal(t, r.run_id, r.name, r.payload, r.id, idempotency_key=k),
        rest="POST /v1/runs/{run_id}/signals/{name}",
        mutates=True,
        doc="Send a named signal to a run.",
    ),
    method(
        EVENTS,
        "SendEvent",
        EventBody,
        EventAccepted,
        lambda s, t, r, k: s.events.send(t, r.name, r.data, r.id, idempotency_key=k),
        rest="POST /v1/events",
        mutates=True,
        doc="Accept an event: start the runs it triggers, wake the runs waiting on it.",
    ),
)
"""The methods of the workflow, run and event services."""


__all__ = ["EVENTS", "METHODS", "RUNS", "WORKFLOWS"]
