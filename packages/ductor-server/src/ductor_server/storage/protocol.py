"""The `Store`, `Tx` and `Session` protocols: everything the engine, the API and
the stores of other areas may ask of storage.

No implementation here. Every tenant-owned read or write takes the tenant
(directly, or inside each record of a batch); the only cross-tenant calls are
the engine's scans (claim runs, lease tasks, due timers), the API key lookup and
the operator's listing of tenants.

`Tx` is grouped by area (`RunsTx`, `TasksTx`, ...). Tables owned by other areas
(routing, the bridge registry, ...) are read and written through `tx.session`,
the public `Session` seam: plain parameterized SQL, value conversion, a named
lock and a before-commit hook. Nothing outside `ductor_server.storage` reaches
for a backend's private helpers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta
from typing import Any, Protocol

from ductor_core.runs import RunStatus
from ductor_server.storage.records import (
    ApiKeyRecord,
    AttemptRecord,
    EventRecord,
    HistoryRecord,
    IdempotencyRecord,
    InboxItem,
    InboxRef,
    NewHistoryEntry,
    NewInboxItem,
    NewRun,
    NewTask,
    QueueDepth,
    ReadyTask,
    RunInsert,
    RunPage,
    RunRecord,
    RunRef,
    RunUpdate,
    TaskRecord,
    TaskRef,
    TenantRecord,
    TimerRecord,
    TimerRef,
    WaitRecord,
    WaitRef,
    WorkflowFamilyRecord,
    WorkflowVersionRecord,
)

Row = tuple[Any, ...]
"""One result row, columns in SELECT order."""

Params = Sequence[Any]
"""The parameters of one statement, in placeholder order."""

BeforeCommit = Callable[[], Awaitable[None]]
"""A check or write to run inside the transaction just before it commits."""

AfterCommit = Callable[[], None]
"""A notice to give once the transaction has committed (it must not block)."""


class Session(Protocol):
    """Plain SQL inside one open transaction, the same on both backends.

    Statements use `%s` placeholders (SQLite gets them rewritten to `?`) and
    the SQL both backends understand (`ON CONFLICT`, `RETURNING`, row values).
    Values go in and come out in the backend's representation: pass times
    through `to_timestamp` and JSON through `to_json`, read them back with
    `from_timestamp` and `from_json`. Every statement must take the tenant.
    """

    @property
    def backend(self) -> str:
        """ "sqlite" or "postgres", for the rare statement that must differ."""
        ...

    async def execute(self, sql: str, params: Params = ()) -> int:
        """Run one statement; return how many rows it changed."""
        ...

    async def fetch_one(self, sql: str, params: Params = ()) -> Row | None:
        """Run a query; return its first row, or None."""
        ...

    async def fetch_all(self, sql: str, params: Params = ()) -> list[Row]:
        """Run a query; return every row."""
        ...

    async def executemany(self, sql: str, rows: Sequence[Params]) -> None:
        """Run a statement once per params row, batched in one round trip where
        the backend can (psycopg pipeline mode)."""
        ...

    async def executemany_returning(self, sql: str, rows: Sequence[Params]) -> list[Row | None]:
        """Run a `... RETURNING` statement once per params row; return each run's
        first result row (None where it returned nothing), in `rows` order."""
        ...

    def to_timestamp(self, value: datetime) -> Any:
        """`value` as the backend's timestamp parameter (timestamptz or ISO text)."""
        ...

    def from_timestamp(self, value: Any) -> datetime:
        """A timestamp column value as an aware UTC datetime."""
        ...

    def to_json(self, value: Any) -> str | None:
        """`value` as the text of a JSON column parameter (None stays SQL NULL)."""
        ...

    def from_json(self, raw: Any) -> Any:
        """A JSON column value (bytes or text) decoded; SQL NULL gives None."""
        ...

    async def advisory_lock(self, name: str, *, shared: bool = False) -> None:
        """Hold the lock called `name` until this transaction ends.

        Transactions that ask for the same name run one after the other, except
        that `shared` holders run side by side (each still waits for, and is
        waited for by, every holder that is not shared). On Postgres this is
        `pg_advisory_xact_lock` (`_shared`) on a 64-bit hash of the name (two
        names may share a hash: that only serializes more). On SQLite it does
        nothing: every transaction begins IMMEDIATE, so writers are already
        serialized for the whole transaction.
        """
        ...

    def before_commit(self, callback: BeforeCommit) -> None:
        """Run `callback` inside this transaction just before it commits.

        Callbacks run in registration order (one registered by a callback runs
        too) and may read and write through the session. If one raises, the
        transaction rolls back, nothing it wrote is kept, and the exception
        reaches the caller of `transaction()`. A block that raises runs none.
        """
        ...

    def after_commit(self, callback: AfterCommit) -> None:
        """Call `callback()` once this transaction has committed; never if it rolls back.

        Callbacks run in registration order on the committing task, right after
        the commit and before `transaction()` returns; they must not block (one
        that has slow work schedules it). One that raises is logged and skipped:
        the commit stands and the caller never sees the exception.
        """
        ...


class TenantsTx(Protocol):
    """Tenants and their API keys."""

    async def ensure_tenant(self, tenant_id: str, *, name: str, now: datetime) -> TenantRecord:
        """Create the tenant if it does not exist; return it (existing or new)."""
        ...

    async def insert_tenant(self, tenant_id: str, *, name: str, now: datetime) -> bool:
        """Create the tenant; False (and nothing written) if it exists already."""
        ...

    async def get_tenant(self, tenant_id: str) -> TenantRecord | None:
        """The tenant, or None."""
        ...

    async def page_tenants(self, *, after: str | None, limit: int) -> list[TenantRecord]:
        """Up to `limit` tenants by id, those after `after` (the operator's listing:
        the one read of tenants without a tenant)."""
        ...

    async def create_api_key(
        self,
        tenant_id: str,
        *,
        key_id: str,
        name: str,
        prefix: str,
        key_hash: str,
        now: datetime,
        scopes: Sequence[str] = ("admin",),
        expires_at: datetime | None = None,
    ) -> ApiKeyRecord:
        """Store a new API key (its SHA-256 hex hash, never the secret)."""
        ...

    async def find_api_key(self, key_hash: str) -> ApiKeyRecord | None:
        """The key whose hash is `key_hash`, revoked or not, or None.

        The one lookup without a tenant: authentication learns the tenant from it.
        """
        ...

    async def get_api_key(self, tenant_id: str, key_id: str) -> ApiKeyRecord | None:
        """The tenant's key with this id, revoked or not, or None."""
        ...

    async def list_api_keys(self, tenant_id: str) -> list[ApiKeyRecord]:
        """The tenant's keys, oldest first."""
        ...

    async def page_api_keys(
        self, tenant_id: str, *, before: tuple[datetime, str] | None, limit: int
    ) -> list[ApiKeyRecord]:
        """Up to `limit` of the tenant's keys, newest first by (created_at, id), those
        before `before` when given."""
        ...

    async def count_live_api_keys(
        self, tenant_id: str, *, now: datetime, scope: str | None = None
    ) -> int:
        """How many of the tenant's keys are neither revoked nor expired at `now`
        (only those listing `scope` when given)."""
        ...

    async def revoke_api_key(self, tenant_id: str, key_id: str, *, now: datetime) -> bool:
        """Mark a key revoked; False if the tenant has no such live key."""
        ...

    async def touch_api_key(
        self, tenant_id: str, key_id: str, *, now: datetime, stale_before: datetime
    ) -> bool:
        """Set the key's `last_used_at` to `now` unless it was set after
        `stale_before`; True if it was written."""
        ...


class WorkflowsTx(Protocol):
    """Published workflow versions and their triggers."""

    async def insert_workflow_version(
        self,
        tenant_id: str,
        *,
        family_slug: str,
        hash: str,
        definition: Any,
        trigger_events: Sequence[str],
        now: datetime,
    ) -> tuple[WorkflowVersionRecord, bool]:
        """Publish a definition as the family's next version number.

        If the family already has a version with this `hash`, that version is
        returned with False and nothing is written; otherwise the new version
        (max + 1, starting at 1) with True. Safe under concurrent publishers.
        `trigger_events` are the event names the definition's triggers listen to.
        """
        ...

    async def get_workflow_version(
        self, tenant_id: str, family_slug: str, version: int
    ) -> WorkflowVersionRecord | None:
        """One version, or None."""
        ...

    async def get_latest_workflow_version(
        self, tenant_id: str, family_slug: str
    ) -> WorkflowVersionRecord | None:
        """The family's highest version, or None if the family does not exist."""
        ...

    async def list_workflow_versions(
        self, tenant_id: str, family_slug: str
    ) -> list[WorkflowVersionRecord]:
        """Every version of a family, lowest version first (empty if none)."""
        ...

    async def list_workflow_families(self, tenant_id: str) -> list[WorkflowFamilyRecord]:
        """Every family of the tenant with its latest version, ordered by slug."""
        ...

    async def find_triggered_workflows(
        self, tenant_id: str, event_name: str
    ) -> list[WorkflowVersionRecord]:
        """The latest version of each family whose latest version has a trigger
        on `event_name` (the caller evaluates each trigger's filter)."""
        ...


class RunsTx(Protocol):
    """Runs: insert, read, list, and the guarded state write."""

    async def insert_runs(self, runs: Sequence[NewRun]) -> list[RunInsert]:
        """Insert runs (lock_version 0). A run whose `idempotency_key` or
        `child_key` is already taken for its tenant is not inserted; the
        existing run is returned with `created=False`."""
        ...

    async def get_run(self, tenant_id: str, run_id: str) -> RunRecord | None:
        """The run, or None (also when it belongs to another tenant)."""
        ...

    async def get_runs(self, refs: Sequence[RunRef]) -> list[RunRecord]:
        """The runs that exist among `refs` (missing ones are left out), in `refs` order."""
        ...

    async def run_statuses(self, refs: Sequence[RunRef]) -> list[RunStatus | None]:
        """Each run's status, in `refs` order (None: no such run of that tenant);
        reads nothing else of the run."""
        ...

    async def find_run_by_idempotency_key(self, tenant_id: str, key: str) -> RunRecord | None:
        """The run triggered with this idempotency key, or None."""
        ...

    async def find_runs_by_idempotency_keys(
        self, tenant_id: str, keys: Sequence[str]
    ) -> list[RunRecord | None]:
        """`find_run_by_idempotency_key` for each key, in order (one round trip)."""
        ...

    async def list_child_runs(
        self, tenant_id: str, parent_run_id: str, *, step_ref: str | None = None
    ) -> list[RunRecord]:
        """Runs started by `parent_run_id` (optionally by one of its steps), oldest first."""
        ...

    async def list_runs(
        self,
        tenant_id: str,
        *,
        status: str | None = None,
        family_slug: str | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> RunPage:
        """A page of runs, newest first, ordered by (created_at, id) descending.

        `status` filters on a `RunStatus` value (e.g. "RUN_STATUS_RUNNING"),
        `family_slug` on the workflow family; both are exact matches.

        `cursor` is the `next_cursor` of the previous page (opaque); a malformed
        cursor raises `InvalidCursor`. `next_cursor` is None on the last page.
        """
        ...

    async def update_runs(
        self, updates: Sequence[RunUpdate], *, locked: bool = False
    ) -> list[bool]:
        """Write new run states, each guarded by its expected lock_version.

        Returns, per update, whether it applied (and bumped lock_version by 1).
        False means another writer got there first: the caller must write
        nothing else for that run in this transaction, reload and retry.

        With `locked`, the caller holds every run's row lock in this transaction
        (`lock_runs`, `claim_runs`) and read it at the lock_version it expects,
        so no other writer can get there first: every update applies, and the
        store may send them with the transaction's next statement instead of
        waiting for their answer (one round trip less).
        """
        ...


INBOX_SIZE_PER_RUN = 4 * 1024 * 1024
"""How much input JSON (in characters) one load of a run's inbox takes at most
(`load_inbox`): a run sent a thousand large signals or results is ticked a few
megabytes at a time, not all at once."""


class InboxTx(Protocol):
    """The run inbox: pending tick inputs, claimed by the coordinator."""

    async def enqueue_inbox(self, items: Sequence[NewInboxItem]) -> list[int]:
        """Append pending tick inputs; returns their `seq` numbers."""
        ...

    async def claim_runs_with_inbox(self, *, now: datetime, limit: int) -> list[RunRef]:
        """Runs (any tenant) with inbox items available at `now`, oldest input first.

        On Postgres the run rows are locked FOR UPDATE SKIP LOCKED until this
        transaction ends, so concurrent coordinators claim disjoint runs. On
        SQLite there is only one writer anyway.
        """
        ...

    async def claim_runs(self, *, now: datetime, limit: int) -> list[RunRecord]:
        """`claim_runs_with_inbox`, each claimed run read as `get_runs` would, in
        claim order (on Postgres in the same statement)."""
        ...

    async def lock_runs(
        self, refs: Sequence[RunRef], *, max_state_bytes: int | None = None
    ) -> list[tuple[RunRecord, bool]]:
        """These runs, read as `get_runs` would, less any another transaction holds,
        each with whether its inbox holds any input (due or not), read in the
        same statement: a run whose inbox is empty needs no `load_inbox`.

        On Postgres each returned run row is locked FOR UPDATE until this
        transaction ends, and a run another transaction has locked is left out
        rather than waited for (a worker's report ticks the runs it can take and
        leaves the rest to the coordinator's claim). On SQLite there is only one
        writer, so every existing run is returned.

        With `max_state_bytes`, a run whose stored state is longer is left out
        too, before its state is decoded (on Postgres its row stays locked
        until this transaction ends).
        """
        ...

    async def load_inbox(
        self,
        refs: Sequence[RunRef],
        *,
        now: datetime,
        limit_per_run: int = 1000,
        size_per_run: int = INBOX_SIZE_PER_RUN,
    ) -> list[InboxItem]:
        """The available inbox items of these runs, ordered by (run, seq): of each
        run, its first `limit_per_run` items, and no more once their inputs' JSON
        reaches `size_per_run` characters (its first item is always taken; 0: no
        limit). The rest wait for a later load. An `EventReceived` stored without
        its data (an event is delivered to each waiting run by its id) comes with
        the data of the stored event of that id."""
        ...

    async def defer_inbox(self, refs: Sequence[RunRef], *, now: datetime, until: datetime) -> int:
        """Make the inbox items of these runs available at `now` wait until `until`
        (a coordinator that cannot tick a run leaves its input for later); returns
        how many items moved."""
        ...

    async def delete_inbox(self, refs: Sequence[InboxRef]) -> int:
        """Delete consumed inbox rows; returns how many were deleted."""
        ...


class TasksTx(Protocol):
    """Tasks, the durable queue the step workers lease from."""

    async def enqueue_tasks(self, tasks: Sequence[NewTask]) -> list[bool]:
        """Queue tasks; per task, False if its idempotency_key was already queued."""
        ...

    async def enqueue_task_ids(self, tasks: Sequence[NewTask]) -> list[str | None]:
        """Queue tasks; per task its new id, or None if its idempotency_key was
        already queued."""
        ...

    async def enqueue_tasks_leasing_later(
        self,
        tasks: Sequence[NewTask],
        leased: Sequence[bool],
        *,
        owner: str,
        lease_for: timedelta,
        now: datetime,
    ) -> Callable[[], Awaitable[list[TaskRecord | None]]]:
        """Insert tasks, each queued or, where `leased` says so, already leased to
        `owner` for `lease_for` from `now` (its first delivery): one statement
        where queueing and then leasing would take two. Its answer is asked for
        later: on Postgres the insert goes out with the transaction's next round
        trip (the next statement that answers, or COMMIT). Call the result,
        before or after the transaction ends, for each task's record, or None if
        its idempotency_key was already queued (nothing inserted)."""
        ...

    async def lease_tasks(
        self,
        *,
        owner: str,
        limit: int,
        lease_for: timedelta,
        now: datetime,
        handlers: Sequence[str] | None = None,
    ) -> list[TaskRecord]:
        """Lease up to `limit` tasks (any tenant) to `owner` until `now + lease_for`.

        Leasable: leased with lease_until <= now (an expired lease is re-leased:
        at-least-once), which come first, then queued with available_at <= now,
        higher tier first, then available_at, then creation. The result is in
        that order. Concurrent leasers get disjoint tasks
        (SKIP LOCKED on Postgres). Each lease bumps `deliveries`; taking over an
        expired lease also bumps `deaths` (its holder neither completed nor
        released it), in the same statement. Optionally only
        tasks whose handler is in `handlers`.
        """
        ...

    async def extend_leases(
        self, refs: Sequence[TaskRef], *, owner: str, lease_until: datetime
    ) -> list[bool]:
        """Heartbeat: push the lease of tasks `owner` still holds; False where it does not."""
        ...

    async def complete_tasks(self, refs: Sequence[TaskRef]) -> list[bool]:
        """Mark tasks done; per task, False if it was already done (or unknown)."""
        ...

    async def finish_tasks(self, refs: Sequence[TaskRef]) -> None:
        """Mark tasks done, answering nothing: the backend may send it with the
        transaction's next statement (`complete_tasks` says which were done)."""
        ...

    async def ready_tasks(
        self,
        *,
        now: datetime,
        after_id: str | None = None,
        limit: int = 10_000,
        expired_only: bool = False,
    ) -> list[ReadyTask]:
        """Tasks a worker could lease now, for a fair queue to choose from.

        With `after_id`: only queued tasks with a larger id (what was enqueued
        since the last look), lowest ids first. With `expired_only`: only tasks
        whose lease expired, oldest lease first. With neither: every queued task
        and every task whose lease expired (a rebuild), lowest ids first. At
        most `limit`.
        """
        ...

    async def leased_tasks(self, *, now: datetime, limit: int = 10_000) -> list[ReadyTask]:
        """Tasks leased now (their lease not expired), lowest ids first, at most
        `limit`: what a fair queue rebuilt from the store counts as running."""
        ...

    async def lease_chosen_tasks(
        self, refs: Sequence[TaskRef], *, owner: str, lease_for: timedelta, now: datetime
    ) -> list[TaskRecord | None]:
        """Lease these tasks to `owner` until `now + lease_for`; per ref the leased
        task, or None where it is not leasable (leased and not expired, done, gone).
        Taking over an expired lease counts a death, as in `lease_tasks`."""
        ...

    async def release_tasks(self, refs: Sequence[TaskRef], *, available_at: datetime) -> int:
        """Put leased tasks back in the queue (e.g. on shutdown); returns how many."""
        ...

    async def drop_run_tasks(self, tenant_id: str, run_id: str) -> int:
        """Mark a run's queued tasks done (the run ended or was cancelled); returns how many."""
        ...

    async def clear_ended_runs(self, runs: Sequence[RunRef]) -> None:
        """Forget what ended runs still hold: their timers and waits are deleted
        and their queued tasks marked done. It answers nothing, so the backend may
        send it with the transaction's next statement (on Postgres, one statement
        per kind of row for the whole batch)."""
        ...

    async def purge_done_tasks(self, *, created_before: datetime, limit: int = 1000) -> int:
        """Delete up to `limit` done tasks (any tenant) created before the cutoff;
        returns how many. Attempts keep the outcome; done tasks are dead weight."""
        ...

    async def get_task(self, tenant_id: str, task_id: str) -> TaskRecord | None:
        """One task, or None."""
        ...

    async def count_tasks(self, *, now: datetime) -> dict[str, int]:
        """Queue depth for metrics: {"ready", "scheduled", "leased"} counts."""
        ...

    async def queue_depth(self, *, now: datetime, tenants: int) -> QueueDepth:
        """Ready tasks (any tenant) per tier, and per tier and tenant for the
        `tenants` largest (tier, tenant) pairs: for the `ductor.queue.depth` gauge."""
        ...


class AttemptsTx(Protocol):
    """The append-only attempt outcomes."""

    async def record_attempts(self, attempts: Sequence[AttemptRecord]) -> list[bool]:
        """Append attempt outcomes; per attempt, False if its key already existed
        (a redelivery): nothing is written for it then."""
        ...

    async def record_attempts_later(
        self, attempts: Sequence[AttemptRecord]
    ) -> Callable[[], Awaitable[list[bool]]]:
        """`record_attempts`, whose answer is asked for later: on Postgres the
        insert goes out with the transaction's next round trip (the next
        statement that answers, or COMMIT) instead of one of its own. Call the
        result for the answer."""
        ...

    async def list_attempts(self, tenant_id: str, run_id: str) -> list[AttemptRecord]:
        """A run's attempts ordered by (started_at, step_ref, item_index, attempt)."""
        ...


class TimersTx(Protocol):
    """Durable timers of runs."""

    async def set_timers(self, timers: Sequence[TimerRecord]) -> None:
        """Create or replace timers (same run and timer_id: the new fire_at wins)."""
        ...

    async def delete_timers(self, refs: Sequence[TimerRef]) -> int:
        """Forget timers; returns how many existed."""
        ...

    async def delete_run_timers(self, tenant_id: str, run_id: str) -> int:
        """Forget every timer of a run; returns how many."""
        ...

    async def due_timers(self, *, now: datetime, limit: int) -> list[TimerRecord]:
        """Timers (any tenant) with fire_at <= now, earliest first.

        On Postgres the rows are locked FOR UPDATE SKIP LOCKED: the caller
        enqueues `TimerFired` and deletes them in this same transaction.
        """
        ...

    async def next_timer_at(self) -> datetime | None:
        """The earliest fire_at of any timer, or None (lets the timer loop sleep)."""
        ...

    async def list_run_timers(self, tenant_id: str, run_id: str) -> list[TimerRecord]:
        """A run's timers, earliest first."""
        ...


class WaitsTx(Protocol):
    """Waits of runs on events and signals."""

    async def add_waits(self, waits: Sequence[WaitRecord]) -> None:
        """Register waits (registering the same wait twice is harmless)."""
        ...

    async def clear_waits(self, refs: Sequence[WaitRef]) -> int:
        """Remove the waits of these steps; returns how many."""
        ...

    async def clear_run_waits(self, tenant_id: str, run_id: str) -> int:
        """Remove every wait of a run; returns how many."""
        ...

    async def find_waits(self, tenant_id: str, *, kind: str, name: str) -> list[WaitRecord]:
        """The waits on (kind, name), oldest first."""
        ...

    async def list_run_waits(self, tenant_id: str, run_id: str) -> list[WaitRecord]:
        """A run's waits."""
        ...


class EventsTx(Protocol):
    """Received events, deduplicated by id."""

    async def insert_events(self, events: Sequence[EventRecord]) -> list[bool]:
        """Store events; per event, False if the tenant already had that id."""
        ...

    async def purge_events(self, *, received_before: datetime, limit: int = 1000) -> int:
        """Delete up to `limit` events (any tenant) received before the cutoff; returns
        how many. The cutoff bounds the window in which a resent id is a duplicate.
        An event a run's inbox still names is kept (`load_inbox` reads its data)."""
        ...

    async def get_event(self, tenant_id: str, event_id: str) -> EventRecord | None:
        """One event, or None."""
        ...


class HistoryTx(Protocol):
    """Run history entries."""

    async def append_history(self, entries: Sequence[NewHistoryEntry]) -> None:
        """Append entries to runs' histories (in the given order)."""
        ...

    async def list_history(
        self, tenant_id: str, run_id: str, *, after_seq: int = 0, limit: int = 1000
    ) -> list[HistoryRecord]:
        """A run's history in append order, entries with seq > after_seq."""
        ...


class IdempotencyTx(Protocol):
    """Remembered responses of mutating requests."""

    async def get_idempotency(
        self, tenant_id: str, scope: str, key: str
    ) -> IdempotencyRecord | None:
        """The remembered response for (scope, key), or None."""
        ...

    async def put_idempotency(self, record: IdempotencyRecord) -> bool:
        """Remember a response; False (nothing written) if (tenant, scope, key) exists."""
        ...

    async def claim_idempotency(self, record: IdempotencyRecord) -> IdempotencyRecord | None:
        """Claim (tenant, scope, key) for this transaction, before doing the work it guards.

        None: the row is this transaction's (written with `record`'s fields; the
        caller does the work, then `complete_idempotency`, then commits). Otherwise
        the committed row someone else holds. A concurrent claim of the same key
        waits until the holder commits (it then gets the holder's row) or rolls
        back (it then gets the key): on Postgres through the primary key, on
        SQLite because write transactions never overlap.
        """
        ...

    async def complete_idempotency(
        self, tenant_id: str, scope: str, key: str, *, status_code: int, response: Any
    ) -> None:
        """Store the answer on a row this transaction claimed."""
        ...

    async def delete_idempotency_before(self, cutoff: datetime) -> int:
        """Forget records created before `cutoff` (all tenants); returns how many."""
        ...


class Tx(
    TenantsTx,
    WorkflowsTx,
    RunsTx,
    InboxTx,
    TasksTx,
    AttemptsTx,
    TimersTx,
    WaitsTx,
    EventsTx,
    HistoryTx,
    IdempotencyTx,
    Protocol,
):
    """One database transaction. Everything written through it commits together
    when the `transaction()` block exits normally, and nothing does if it raises.

    Batch methods take and return lists in the same order, so the coordinator can
    commit many runs and a worker many attempts in one round trip. The tables
    of other areas are reached through `session`.
    """

    @property
    def session(self) -> Session:
        """The plain-SQL seam of this same transaction (for other areas' tables)."""
        ...


class Store(Protocol):
    """A database holding everything Ductor keeps. Open before use, close after."""

    @property
    def backend(self) -> str:
        """ "sqlite" or "postgres"."""
        ...

    async def open(self) -> None:
        """Connect (create the pool or the SQLite file)."""
        ...

    async def close(self) -> None:
        """Release every connection. Safe to call twice."""
        ...

    async def migrate(self) -> list[str]:
        """Apply pending migrations in order; returns the names applied (empty if
        none). Idempotent and safe when several processes start at once. Raises
        `SchemaTooNew`, applying nothing, when the database records a migration
        this version does not have."""
        ...

    async def pending_migrations(self) -> list[str]:
        """The names of the migrations `migrate` would apply now (all of them on an
        empty database), without applying any; `SchemaTooNew` as `migrate`."""
        ...

    async def ping(self) -> None:
        """Raise `StoreUnavailable` if the database cannot answer a trivial query."""
        ...

    def transaction(self) -> AbstractAsyncContextManager[Tx]:
        """One transaction: `async with store.transaction() as tx: ...` commits on
        normal exit and rolls back (writing nothing) if the block raises."""
        ...

    def read(self) -> AbstractAsyncContextManager[Tx]:
        """Reads outside a transaction: `async with store.read() as tx: ...` runs
        each statement on its own, without BEGIN and COMMIT (one round trip
        instead of three for a lookup of one statement, such as a request's API
        key). Nothing holds one snapshot across its statements, so it is for
        lookups a later transaction does not rely on; write only through
        `transaction()`."""
        ...
