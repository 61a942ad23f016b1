"""The rows the store reads and writes, as frozen msgspec records.

Plain data only: no SQL and no I/O here. Times are timezone-aware UTC
datetimes; JSON-valued fields hold decoded values (`Any`) or typed core structs.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

import msgspec

from ductor_core.runs import DispatchTask, ErrorInfo, RunInput, RunState, RunStatus
from ductor_server.storage._outlined import Outlined


class _Record(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every storage record."""


# --- tenants and keys ----------------------------------------------------------


class TenantRecord(_Record, frozen=True, kw_only=True):
    """A tenant: the owner of every other row."""

    id: str
    name: str
    created_at: datetime


class ApiKeyRecord(_Record, frozen=True, kw_only=True):
    """An API key. Only the SHA-256 hex digest of the secret is stored."""

    id: str
    tenant_id: str
    name: str
    prefix: str  # the first characters of the secret, for display
    key_hash: str  # sha256 hex of the whole secret
    created_at: datetime
    revoked_at: datetime | None = None
    scopes: tuple[str, ...] = ("admin",)  # what the key may do (keys of old were admin)
    expires_at: datetime | None = None  # refused from then on; None: never
    last_used_at: datetime | None = None  # to the minute: written at most once a minute


# --- workflows -----------------------------------------------------------------


class WorkflowVersionRecord(_Record, frozen=True, kw_only=True):
    """One immutable published version of a workflow family."""

    tenant_id: str
    family_slug: str
    version: int
    hash: str
    definition: Any  # the definition as decoded JSON (dicts, lists, scalars)
    trigger_events: list[str] = []  # event names the definition's triggers listen to
    created_at: datetime


class WorkflowFamilyRecord(_Record, frozen=True, kw_only=True):
    """A workflow family: its latest version and how many versions it has."""

    family_slug: str
    latest: WorkflowVersionRecord
    version_count: int


# --- runs ----------------------------------------------------------------------


class RunRef(_Record, frozen=True, kw_only=True):
    """Names one run of one tenant."""

    tenant_id: str
    run_id: str


DAG_KIND = "dag"
"""The kind of runs of published workflow definitions (`runs.kind`'s default)."""


class RunLimits(_Record, frozen=True, kw_only=True):
    """A run's own limits in the task queue: its workflow's `concurrency` option
    with the option's key evaluated over the run's input.

    Attributes:
        key: the limit key; the run's tasks share the limits with every task of
            the tenant's runs of the same workflow and key.
        concurrency: at most this many of those tasks leased at once (None: no limit).
        rate: at most this many of them started per second (None: no limit).
        burst: how many starts the rate lets through at once.
    """

    key: str
    concurrency: int | None = None
    rate: float | None = None
    burst: int = 1


class NewRun(_Record, frozen=True, kw_only=True):
    """A run to insert. Id, status, input, output, error, created_at and
    finished_at are all taken from `state`.

    `kind` names the engine kind that ticks the run ("dag", "bridge", ...);
    `kind_state` is that kind's own bookkeeping (JSON), kept beside the state;
    `limits` its own limits in the task queue (None: none).
    """

    tenant_id: str
    family_slug: str
    version: int
    state: RunState
    kind: str = DAG_KIND
    kind_state: Any = None
    parent_run_id: str | None = None
    parent_step_ref: str | None = None
    parent_item_index: int = -1
    child_key: str | None = None  # unique per tenant: makes a child start idempotent
    idempotency_key: str | None = None  # unique per tenant: makes a trigger idempotent
    trace_context: str | None = None  # W3C trace context of its creator (telemetry.context)
    limits: RunLimits | None = None


class RunRecord(_Record, frozen=True, kw_only=True):
    """A stored run: the run's state plus the columns lists and filters use."""

    tenant_id: str
    id: str
    family_slug: str
    version: int
    status: RunStatus
    state: RunState
    lock_version: int  # bumped by every successful update (optimistic lock)
    input: Any = None
    output: Any = None
    error: ErrorInfo | None = None
    parent_run_id: str | None = None
    parent_step_ref: str | None = None
    parent_item_index: int = -1
    child_key: str | None = None
    idempotency_key: str | None = None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    kind: str = DAG_KIND  # the engine kind that ticks the run
    kind_state: Any = None  # that kind's own bookkeeping (JSON), None if it keeps none
    trace_context: str | None = None  # W3C trace context of its creator (telemetry.context)
    # The step outputs the store keeps out of the stored state ((step_ref,
    # item_index) pairs; `state` holds them all): pass it back in `RunUpdate`.
    outlined: Outlined = ()


class RunInsert(_Record, frozen=True, kw_only=True):
    """The outcome of inserting one `NewRun`: the stored run and whether it is new.

    `created` is False when a run with the same `idempotency_key` or `child_key`
    (or id) already existed for the tenant; `run` is then that existing run.
    """

    run: RunRecord
    created: bool


class RunUpdate(_Record, frozen=True, kw_only=True):
    """A guarded state write: applies only if the stored lock_version still equals
    `expected_lock_version`. Status, output, error and finished_at come from `state`;
    `kind_state` replaces the kind's bookkeeping (None clears it)."""

    tenant_id: str
    run_id: str
    expected_lock_version: int
    state: RunState
    updated_at: datetime
    kind_state: Any = None
    # The `outlined` of the record this update replaces (outputs already stored
    # out of the state, not written again).
    outlined: Outlined = ()


class RunPage(_Record, frozen=True, kw_only=True):
    """One page of runs, newest first, and the opaque cursor of the next page."""

    items: list[RunRecord]
    next_cursor: str | None = None


# --- run inbox -----------------------------------------------------------------


class NewInboxItem(_Record, frozen=True, kw_only=True):
    """A pending tick input for a run, visible to the coordinator from `available_at`."""

    tenant_id: str
    run_id: str
    input: RunInput
    available_at: datetime


class InboxItem(_Record, frozen=True, kw_only=True):
    """A stored pending tick input; `seq` orders a run's inputs (and is unique).
    `size` is the length of its JSON as stored (0 for an input never stored, or
    stored before lengths were)."""

    seq: int
    tenant_id: str
    run_id: str
    input: RunInput
    available_at: datetime
    size: int = 0


class InboxRef(_Record, frozen=True, kw_only=True):
    """Names one inbox row."""

    tenant_id: str
    seq: int


# --- tasks (the durable queue) -------------------------------------------------


class TaskStatus(enum.StrEnum):
    """Where a task is: waiting, leased by a worker, or finished (done or dropped)."""

    QUEUED = "queued"
    LEASED = "leased"
    DONE = "done"


class NewTask(_Record, frozen=True, kw_only=True):
    """A unit of work for a step worker; a duplicate `idempotency_key` is ignored."""

    tenant_id: str
    run_id: str
    step_ref: str
    item_index: int = -1
    attempt: int
    step_type: str
    handler: str  # "action:<name>" | "bridge" | "route" | "notify"
    payload: Any = None
    idempotency_key: str  # f"{run_id}:{step_ref}:{item_index}:{attempt}"
    timeout_seconds: float | None = None
    tier: int = 0  # higher tiers are leased first
    available_at: datetime
    created_at: datetime | None = None  # when enqueued; `available_at` if not given
    trace_context: str | None = None  # W3C trace context of its creator (telemetry.context)

    @classmethod
    def from_dispatch(
        cls,
        tenant_id: str,
        run_id: str,
        command: DispatchTask,
        *,
        available_at: datetime,
        trace_context: str | None = None,
    ) -> NewTask:
        """The task that carries out a tick's `DispatchTask` command."""
        return cls(
            tenant_id=tenant_id,
            run_id=run_id,
            step_ref=command.step_ref,
            item_index=command.item_index,
            attempt=command.attempt,
            step_type=command.step_type,
            handler=command.handler,
            payload=command.payload,
            idempotency_key=command.idempotency_key,
            timeout_seconds=command.timeout_seconds,
            available_at=available_at,
            trace_context=trace_context,
        )


class TaskRecord(_Record, frozen=True, kw_only=True):
    """A stored task. `deliveries` counts leases: above 1 means a redelivery.

    `deaths` counts the leases of this task that expired (neither completed nor
    released): the times a process died or stalled with the task in flight.
    """

    id: str
    tenant_id: str
    run_id: str
    step_ref: str
    item_index: int
    attempt: int
    step_type: str
    handler: str
    payload: Any = None
    idempotency_key: str
    timeout_seconds: float | None = None
    tier: int
    status: TaskStatus
    available_at: datetime
    lease_owner: str | None = None
    lease_until: datetime | None = None
    deliveries: int = 0
    created_at: datetime
    deaths: int = 0
    trace_context: str | None = None  # W3C trace context of its creator (telemetry.context)


class QueueDepth(_Record, frozen=True, kw_only=True):
    """Tasks ready to run (queued and due): per tier, and per (tier, tenant) for
    the tenants with the most, as (tier, tenant, count), largest first."""

    tiers: dict[int, int]
    tenants: list[tuple[int, str, int]]


class ReadyTask(_Record, frozen=True, kw_only=True):
    """What a fair queue needs to know of a task that can be leased: who it
    belongs to, its run's workflow, its tier, whether its lease expired
    (`expired`) rather than it never having been leased, and its run's own
    limits (`limits`, None: none)."""

    id: str
    tenant_id: str
    workflow: str
    tier: int
    expired: bool = False
    limits: RunLimits | None = None


class TaskRef(_Record, frozen=True, kw_only=True):
    """Names one task."""

    tenant_id: str
    task_id: str


# --- attempts ------------------------------------------------------------------


class AttemptRecord(_Record, frozen=True, kw_only=True):
    """The append-only outcome of one attempt, keyed by
    (tenant_id, run_id, step_ref, item_index, attempt)."""

    tenant_id: str
    run_id: str
    step_ref: str
    item_index: int = -1
    attempt: int
    ok: bool
    output: Any = None
    error: ErrorInfo | None = None
    started_at: datetime
    finished_at: datetime


# --- timers, waits, events -----------------------------------------------------


class TimerRecord(_Record, frozen=True, kw_only=True):
    """A durable timer of a run; (tenant_id, run_id, timer_id) is unique."""

    tenant_id: str
    run_id: str
    timer_id: str
    fire_at: datetime


class TimerRef(_Record, frozen=True, kw_only=True):
    """Names one timer."""

    tenant_id: str
    run_id: str
    timer_id: str


class WaitRecord(_Record, frozen=True, kw_only=True):
    """A run's step waits for events (kind "event") or signals (kind "signal") named `name`."""

    tenant_id: str
    run_id: str
    step_ref: str
    kind: str
    name: str
    created_at: datetime


class WaitRef(_Record, frozen=True, kw_only=True):
    """Names the waits one step of one run registered."""

    tenant_id: str
    run_id: str
    step_ref: str


class EventRecord(_Record, frozen=True, kw_only=True):
    """A received event; (tenant_id, id) is unique, so a resend is a duplicate."""

    tenant_id: str
    id: str
    name: str
    data: Any = None
    received_at: datetime


# --- history and idempotency ---------------------------------------------------


class NewHistoryEntry(_Record, frozen=True, kw_only=True):
    """Something that happened to a run, to append to its history."""

    tenant_id: str
    run_id: str
    at: datetime
    kind: str
    data: Any = None


class HistoryRecord(_Record, frozen=True, kw_only=True):
    """A stored history entry; `seq` increases in append order (unique store-wide)."""

    tenant_id: str
    run_id: str
    seq: int
    at: datetime
    kind: str
    data: Any = None


class IdempotencyRecord(_Record, frozen=True, kw_only=True):
    """The remembered response of a mutating request, keyed by (tenant_id, scope, key)."""

    tenant_id: str
    scope: str  # e.g. "POST /v1/runs"
    key: str
    request_hash: str
    status_code: int
    response: Any = None
    created_at: datetime
