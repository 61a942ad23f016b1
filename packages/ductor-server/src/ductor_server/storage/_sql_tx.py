"""The SQL both backends share: every `Tx` and `Session` method written once over a
few I/O hooks.

Statements use `%s` placeholders (the SQLite backend rewrites them to `?`).
Backends supply execution, value conversion and their locking clauses; this
module never opens a connection itself.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import msgspec

from ductor_core.runs import ErrorInfo, EventReceived, RunInput, RunState, RunStatus
from ductor_server.storage._outlined import Outlined, outline, splice
from ductor_server.storage.errors import InvalidCursor, StoreError
from ductor_server.storage.protocol import (
    INBOX_SIZE_PER_RUN,
    AfterCommit,
    BeforeCommit,
    Params,
    Row,
    Session,
)
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
    RunLimits,
    RunPage,
    RunRecord,
    RunRef,
    RunUpdate,
    TaskRecord,
    TaskRef,
    TaskStatus,
    TenantRecord,
    TimerRecord,
    TimerRef,
    WaitRecord,
    WaitRef,
    WorkflowFamilyRecord,
    WorkflowVersionRecord,
)

_log = logging.getLogger(__name__)

# Batches that become one `IN (...)` list are cut to this many items, well under
# SQLite's limit on bound variables.
_CHUNK = 400

_encoder = msgspec.json.Encoder()
_any_decoder = msgspec.json.Decoder()
_state_decoder = msgspec.json.Decoder(RunState)
_input_decoder: msgspec.json.Decoder[RunInput] = msgspec.json.Decoder(RunInput)
_error_decoder = msgspec.json.Decoder(ErrorInfo)
_strings_decoder = msgspec.json.Decoder(list[str])

_cursor_decoder = msgspec.json.Decoder(tuple[str, str])
_outlined_decoder = msgspec.json.Decoder(Outlined)


def _without_input(state: RunState) -> RunState:
    """A run's state as stored: its input is kept in `runs.input` alone, since
    every tick rewrites the state (a large input was written again at every step)."""
    return state if state.input is None else msgspec.structs.replace(state, input=None)


def _with_input(state: RunState, input: Any) -> RunState:
    """A stored state with the run's input put back (a state stored before inputs
    were kept apart still holds its own)."""
    if state.input is None and input is not None:
        return msgspec.structs.replace(state, input=input)
    return state


SAVE_RUN_OUTPUT = (
    "INSERT INTO run_outputs (tenant_id, run_id, step_ref, item_index, output)"
    " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (tenant_id, run_id, step_ref, item_index)"
    " DO UPDATE SET output = excluded.output"
)
LOAD_RUN_OUTPUTS = (
    "SELECT step_ref, item_index, output FROM run_outputs WHERE tenant_id = %s AND run_id = %s"
)


def utc(value: datetime) -> datetime:
    """`value` as an aware UTC datetime (a naive value is taken to be UTC)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def _chunks(items: Sequence[Any]) -> list[Sequence[Any]]:
    return [items[i : i + _CHUNK] for i in range(0, len(items), _CHUNK)]


def _tuples(count: int, width: int) -> str:
    one = "(" + ", ".join(["%s"] * width) + ")"
    return ", ".join([one] * count)


_TENANT_COLS = "id, name, created_at"
_KEY_COLS = (
    "id, tenant_id, name, prefix, key_hash, created_at, revoked_at, scopes, expires_at,"
    " last_used_at"
)
_WF_COLS = "tenant_id, family_slug, version, hash, definition, trigger_events, created_at"
_RUN_COLS = (
    "tenant_id, id, family_slug, version, status, state, lock_version, input, output, error,"
    " parent_run_id, parent_step_ref, parent_item_index, child_key, idempotency_key,"
    " created_at, updated_at, finished_at, kind, kind_state, trace_context, outlined"
)
_LIMIT_COLS = "limit_key, key_concurrency, key_rate, key_burst"
_INBOX_COLS = "seq, tenant_id, run_id, input, available_at"
_TASK_COLS = (
    "id, tenant_id, run_id, step_ref, item_index, attempt, step_type, handler, payload,"
    " idempotency_key, timeout_seconds, tier, status, available_at, lease_owner, lease_until,"
    " deliveries, created_at, deaths, trace_context"
)
_ATTEMPT_COLS = (
    "tenant_id, run_id, step_ref, item_index, attempt, ok, output, error, started_at, finished_at"
)
_TIMER_COLS = "tenant_id, run_id, timer_id, fire_at"
_WAIT_COLS = "tenant_id, run_id, step_ref, kind, name, created_at"
_EVENT_COLS = "tenant_id, id, name, data, received_at"
_HISTORY_COLS = "tenant_id, run_id, seq, at, kind, data"
_IDEM_COLS = "tenant_id, scope, key, request_hash, status_code, response, created_at"


def _qualified(columns: str, table: str) -> str:
    return ", ".join(f"{table}.{c.strip()}" for c in columns.split(","))


# --- the statements the engine runs for every step --------------------------------
# Each reaches its rows through a whole key (or through the one index built for
# it), so that its plan, custom or generic, on an empty table or a full one, is
# that index (see migrations/*/0500_lookup_keys.sql). Batches run these one-key
# statements once per item in a single round trip (on Postgres, the hottest as
# one statement over arrays, `BATCHES_PG` below) rather than one `IN (...)` list,
# whose generic plan may scan the table. `{lock}` and `{lock_runs}` are
# the backend's locking clauses, `{lease_key}` (`{lease_cols}`) its key of a task row and
# `{handlers}` an optional handler filter. tests/storage/test_plans.py EXPLAINs
# every entry of HOT_STATEMENTS on a freshly migrated Postgres database.

_PENDING_IN_TURNS = (
    "SELECT tenant_id, run_id, first_seq, turn FROM ("
    "SELECT tenant_id, run_id, MIN(seq) AS first_seq,"
    " ROW_NUMBER() OVER (PARTITION BY tenant_id ORDER BY MIN(seq)) AS turn"
    " FROM run_inbox WHERE available_at <= %s GROUP BY tenant_id, run_id"
    ") g ORDER BY turn, first_seq LIMIT %s"
)
"""Runs with input due, tenants taking turns: every tenant's oldest run, then every
tenant's second oldest, and so on, so one tenant's backlog of inbox input does
not stand in front of another tenant's first run in the coordinator's claims."""
CLAIM_RUNS_WITH_INBOX_PG = (
    f"SELECT r.tenant_id, r.id FROM ({_PENDING_IN_TURNS}"
    ") p CROSS JOIN LATERAL ("
    "SELECT tenant_id, id FROM runs WHERE tenant_id = p.tenant_id AND id = p.run_id{lock}"
    ") r LIMIT %s"
)
"""Postgres: lock each candidate run by its key as the claim reaches it, so no
plan can join the inbox to a scan of `runs`, and no more runs are locked than
are claimed."""
CLAIM_RUNS_PG = (
    f"SELECT {_qualified(_RUN_COLS, 'r')} FROM ({_PENDING_IN_TURNS}"
    ") p CROSS JOIN LATERAL ("
    f"SELECT {_RUN_COLS} FROM runs WHERE tenant_id = p.tenant_id AND id = p.run_id{{lock}}"
    ") r LIMIT %s"
)
"""Postgres: the claim that also reads each claimed run, in the same lookup by
its key (the coordinator's claim and `get_runs` in one round trip)."""
CLAIM_RUNS_WITH_INBOX_PLAIN = (
    f"WITH pending AS ({_PENDING_IN_TURNS}"
    ") SELECT r.tenant_id, r.id FROM runs r JOIN pending p"
    " ON p.tenant_id = r.tenant_id AND p.run_id = r.id"
    " ORDER BY p.turn, p.first_seq LIMIT %s{lock_runs}"
)
"""SQLite (one writer, no row locks, no LATERAL): a plain join."""
GET_RUN = f"SELECT {_RUN_COLS} FROM runs WHERE tenant_id = %s AND id = %s"
RUN_STATUS = "SELECT status FROM runs WHERE tenant_id = %s AND id = %s"
_HAS_INBOX = (
    "EXISTS (SELECT 1 FROM run_inbox i WHERE i.tenant_id = {runs}.tenant_id"
    " AND i.run_id = {runs}.id)"
)
LOCK_RUN = (
    f"SELECT {_RUN_COLS}, {_HAS_INBOX.format(runs='runs')} FROM runs"
    " WHERE tenant_id = %s AND id = %s{lock}"
)
"""A run read and locked for this transaction, unless another holds it (Postgres),
and whether the run has input in its inbox (due or not)."""
PG_SKIP_LOCKED = " FOR UPDATE SKIP LOCKED"
"""Postgres' `{lock}`: rows another transaction holds are passed over, not waited for."""
PG_SKIP_LOCKED_RUNS = " FOR UPDATE OF r SKIP LOCKED"
"""Postgres' `{lock_runs}`: `PG_SKIP_LOCKED` for the rows of `runs r` in a join."""
FIND_RUN_BY_KEY = f"SELECT {_RUN_COLS} FROM runs WHERE tenant_id = %s AND idempotency_key = %s"
INSERT_RUN = (
    f"INSERT INTO runs ({_RUN_COLS}, {_LIMIT_COLS}) VALUES ({', '.join(['%s'] * 26)})"
    " ON CONFLICT DO NOTHING RETURNING id"
)
UPDATE_RUN = (
    "UPDATE runs SET state = %s, status = %s, output = %s, error = %s,"
    " finished_at = %s, updated_at = %s, kind_state = %s, outlined = %s,"
    " lock_version = lock_version + 1"
    " WHERE tenant_id = %s AND id = %s AND lock_version = %s RETURNING lock_version"
)
_NO_LIMIT = 2**62
"""A LIMIT (of rows, or of characters) that limits nothing."""
_INBOX_UPTO = (
    f"SELECT {_INBOX_COLS}, size, SUM(size) OVER (ORDER BY seq) AS upto FROM"
    f" (SELECT {_INBOX_COLS}, size FROM run_inbox"
    " WHERE tenant_id = {tenant} AND run_id = {run} AND available_at <= {due}"
    " ORDER BY seq LIMIT {limit}) first"
)
"""A run's first due inbox rows, each with the length of the JSON up to and with it."""
LOAD_RUN_INBOX = (
    f"SELECT {_INBOX_COLS}, size FROM ("
    + _INBOX_UPTO.format(tenant="%s", run="%s", due="%s", limit="%s")
    + ") counted WHERE upto - size < %s ORDER BY seq"
)
"""A run's due inbox items in order: at most a number of them, and no more once
their JSON reaches a length (the first is always taken)."""
DELETE_INBOX_ITEM = "DELETE FROM run_inbox WHERE tenant_id = %s AND seq = %s RETURNING seq"
ENQUEUE_INBOX_ITEM = (
    "INSERT INTO run_inbox (tenant_id, run_id, input, available_at, size)"
    " VALUES (%s, %s, %s, %s, %s) RETURNING seq"
)
ENQUEUE_TASK = (
    "INSERT INTO tasks (tenant_id, run_id, step_ref, item_index, attempt, step_type,"
    " handler, payload, idempotency_key, timeout_seconds, tier, status, available_at,"
    " deliveries, created_at, trace_context)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 'queued', %s, 0, %s, %s)"
    " ON CONFLICT (tenant_id, idempotency_key) DO NOTHING RETURNING id"
)
ENQUEUE_TASK_LEASING = (
    "INSERT INTO tasks (tenant_id, run_id, step_ref, item_index, attempt, step_type,"
    " handler, payload, idempotency_key, timeout_seconds, tier, status, available_at,"
    " lease_owner, lease_until, deliveries, created_at, trace_context)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
    f" ON CONFLICT (tenant_id, idempotency_key) DO NOTHING RETURNING {_TASK_COLS}"
)
"""`ENQUEUE_TASK` with the task's status given: queued, or leased at once."""
LEASE_EXPIRED_TASKS = (
    "UPDATE tasks SET status = 'leased', lease_until = %s, lease_owner = %s,"
    " deliveries = deliveries + 1, deaths = deaths + 1"
    " WHERE {lease_key} IN (SELECT {lease_cols} FROM tasks"
    " WHERE status = 'leased' AND lease_until <= %s{handlers}"
    f" ORDER BY lease_until, id LIMIT %s{{lock}}) RETURNING {_TASK_COLS}"
)
LEASE_QUEUED_TASKS = (
    "UPDATE tasks SET status = 'leased', lease_until = %s, lease_owner = %s,"
    " deliveries = deliveries + 1"
    " WHERE {lease_key} IN (SELECT {lease_cols} FROM tasks"
    " WHERE status = 'queued' AND available_at <= %s{handlers}"
    f" ORDER BY tier DESC, available_at, id LIMIT %s{{lock}}) RETURNING {_TASK_COLS}"
)
LEASE_CHOSEN_TASK = (
    "UPDATE tasks SET status = 'leased', lease_until = %s, lease_owner = %s,"
    " deliveries = deliveries + 1,"
    " deaths = deaths + CASE WHEN status = 'leased' THEN 1 ELSE 0 END"
    " WHERE tenant_id = %s AND id = %s AND (status = 'queued' AND available_at <= %s"
    f" OR status = 'leased' AND lease_until <= %s) RETURNING {_TASK_COLS}"
)
_READY_COLS = (
    "t.id, t.tenant_id, COALESCE(r.family_slug, ''), t.tier,"
    " r.limit_key, r.key_concurrency, r.key_rate, r.key_burst"
)
_READY_FROM = "FROM tasks t LEFT JOIN runs r ON r.tenant_id = t.tenant_id AND r.id = t.run_id"
NEW_READY_TASKS = (
    f"SELECT {_READY_COLS}, 0 {_READY_FROM}"
    " WHERE t.status = 'queued' AND t.id > %s AND t.available_at <= %s ORDER BY t.id LIMIT %s"
)
EXPIRED_READY_TASKS = (
    f"SELECT {_READY_COLS}, 1 {_READY_FROM}"
    " WHERE t.status = 'leased' AND t.lease_until <= %s ORDER BY t.lease_until, t.id LIMIT %s"
)
LEASED_TASKS = (
    f"SELECT {_READY_COLS}, 0 {_READY_FROM}"
    " WHERE t.status = 'leased' AND t.lease_until > %s ORDER BY t.id LIMIT %s"
)
ALL_READY_TASKS = (
    f"SELECT * FROM (SELECT {_READY_COLS}, 0 {_READY_FROM}"
    " WHERE t.status = 'queued' AND t.available_at <= %s"
    f" UNION ALL SELECT {_READY_COLS}, 1 {_READY_FROM}"
    " WHERE t.status = 'leased' AND t.lease_until <= %s) AS ready ORDER BY 1 LIMIT %s"
)
EXTEND_LEASE = (
    "UPDATE tasks SET lease_until = %s WHERE tenant_id = %s AND id = %s"
    " AND status = 'leased' AND lease_owner = %s RETURNING id"
)
COMPLETE_TASK = (
    "UPDATE tasks SET status = 'done', lease_owner = NULL, lease_until = NULL"
    " WHERE tenant_id = %s AND id = %s AND status <> 'done' RETURNING id"
)
RELEASE_TASK = (
    "UPDATE tasks SET status = 'queued', lease_owner = NULL, lease_until = NULL,"
    " available_at = %s WHERE tenant_id = %s AND id = %s AND status = 'leased'"
    " RETURNING id"
)
DROP_RUN_TASKS = (
    "UPDATE tasks SET status = 'done', lease_owner = NULL, lease_until = NULL"
    " WHERE tenant_id = %s AND run_id = %s AND status = 'queued'"
)
RECORD_ATTEMPT = (
    f"INSERT INTO attempts ({_ATTEMPT_COLS})"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
    " ON CONFLICT DO NOTHING RETURNING attempt"
)
SET_TIMER = (
    f"INSERT INTO timers ({_TIMER_COLS}) VALUES (%s, %s, %s, %s)"
    " ON CONFLICT (tenant_id, run_id, timer_id) DO UPDATE SET fire_at = excluded.fire_at"
)
DUE_TIMERS = (
    f"SELECT {_TIMER_COLS} FROM timers WHERE fire_at <= %s"
    " ORDER BY fire_at, tenant_id, run_id, timer_id LIMIT %s{lock}"
)
DELETE_RUN_TIMERS = "DELETE FROM timers WHERE tenant_id = %s AND run_id = %s"
CLEAR_RUN_WAITS = "DELETE FROM waits WHERE tenant_id = %s AND run_id = %s"
APPEND_HISTORY = (
    "INSERT INTO run_history (tenant_id, run_id, at, kind, data) VALUES (%s, %s, %s, %s, %s)"
)


# --- Postgres: one statement per batch ---------------------------------------------
# On Postgres a batch of one of the statements above runs as one statement over
# arrays, one array a column of the batch's params rows (in the same order as the
# one-row statement's `%s`), unnested back into rows, followed by the batch's size:
# psycopg's work per row of a pipelined `executemany` costs more than the row
# itself. Each statement reads the batch through `LIMIT %s` (its size): a generic
# plan, which cannot see the arrays, then expects few rows and reaches each one by
# its key, as the one-row statement does, instead of hashing a scan of the table.


class Batch(NamedTuple):
    """The one statement that runs a whole batch of a one-row statement (Postgres).

    Its result rows start with the 1-based position of the params row they belong
    to when `ordinal` (an UPDATE or DELETE, or a query), else with the values of
    the params row at `key` (an INSERT, whose RETURNING cannot see the batch):
    result rows then belong to the first params rows with that key, in order.
    An UPDATE or DELETE touches a row once however often the batch names it, so
    a batch that names one `key` twice runs row by row instead.
    """

    sql: str
    key: tuple[int, ...]
    ordinal: bool


def _unnest(*columns: str) -> str:
    """The batch as rows: `columns` are "name type" pairs; adds the ordinal `n`."""
    arrays = ", ".join(f"%b::{c.split()[1]}[]" for c in columns)
    names = ", ".join(c.split()[0] for c in columns)
    return f"(SELECT * FROM unnest({arrays}) WITH ORDINALITY AS v({names}, n) LIMIT %s) v"


GET_RUNS_PG = (
    f"SELECT v.n, {_qualified(_RUN_COLS, 'r')} FROM "
    + _unnest("tenant_id text", "id text")
    + " JOIN runs r ON r.tenant_id = v.tenant_id AND r.id = v.id"
)
RUN_STATUSES_PG = (
    "SELECT v.n, r.status FROM "
    + _unnest("tenant_id text", "id text")
    + " JOIN runs r ON r.tenant_id = v.tenant_id AND r.id = v.id"
)
LOCK_RUNS_PG = (
    f"SELECT v.n, {_qualified(_RUN_COLS, 'r')}, {_HAS_INBOX.format(runs='r')} FROM "
    + _unnest("tenant_id text", "id text")
    + " JOIN runs r ON r.tenant_id = v.tenant_id AND r.id = v.id"
    + PG_SKIP_LOCKED_RUNS
)
UPDATE_RUNS_PG = (
    "UPDATE runs t SET state = v.state, status = v.status, output = v.output,"
    " error = v.error, finished_at = v.finished_at, updated_at = v.updated_at,"
    " kind_state = v.kind_state, outlined = v.outlined,"
    " lock_version = t.lock_version + 1 FROM "
    + _unnest(
        "state json",
        "status text",
        "output jsonb",
        "error jsonb",
        "finished_at timestamptz",
        "updated_at timestamptz",
        "kind_state jsonb",
        "outlined jsonb",
        "tenant_id text",
        "id text",
        "lock_version bigint",
    )
    + " WHERE t.tenant_id = v.tenant_id AND t.id = v.id AND t.lock_version = v.lock_version"
    " RETURNING v.n, t.lock_version"
)
LOAD_RUNS_INBOX_PG = (
    f"SELECT v.n, {_qualified(_INBOX_COLS, 'i')}, i.size FROM "
    + _unnest("tenant_id text", "run_id text", "due timestamptz", "lim bigint", "most bigint")
    + " CROSS JOIN LATERAL ("
    + _INBOX_UPTO.format(tenant="v.tenant_id", run="v.run_id", due="v.due", limit="v.lim")
    + ") i WHERE i.upto - i.size < v.most ORDER BY v.n, i.seq"
)
DELETE_INBOX_ITEMS_PG = (
    "DELETE FROM run_inbox t USING "
    + _unnest("tenant_id text", "seq bigint")
    + " WHERE t.tenant_id = v.tenant_id AND t.seq = v.seq RETURNING v.n, t.seq"
)
ENQUEUE_INBOX_ITEMS_PG = (
    "INSERT INTO run_inbox (tenant_id, run_id, input, available_at, size)"
    " SELECT tenant_id, run_id, input, available_at, size FROM "
    + _unnest(
        "tenant_id text",
        "run_id text",
        "input jsonb",
        "available_at timestamptz",
        "size integer",
    )
    + " ORDER BY n RETURNING tenant_id, run_id, seq"
)
_NEW_TASK_COLS = (
    "tenant_id, run_id, step_ref, item_index, attempt, step_type, handler, payload,"
    " idempotency_key, timeout_seconds, tier"
)
_NEW_TASK_TYPES = (
    "tenant_id text",
    "run_id text",
    "step_ref text",
    "item_index integer",
    "attempt integer",
    "step_type text",
    "handler text",
    "payload jsonb",
    "idempotency_key text",
    "timeout_seconds float8",
    "tier integer",
)
"""The batch columns of `_NEW_TASK_COLS` (the params a new task starts with)."""
ENQUEUE_TASKS_PG = (
    f"INSERT INTO tasks ({_NEW_TASK_COLS}, status, available_at, deliveries, created_at,"
    f" trace_context) SELECT {_NEW_TASK_COLS}, 'queued', available_at, 0, created_at,"
    " trace_context FROM "
    + _unnest(
        *_NEW_TASK_TYPES, "available_at timestamptz", "created_at timestamptz", "trace_context text"
    )
    + " ORDER BY n ON CONFLICT (tenant_id, idempotency_key) DO NOTHING"
    " RETURNING tenant_id, idempotency_key, id"
)
ENQUEUE_TASKS_LEASING_PG = (
    f"INSERT INTO tasks ({_NEW_TASK_COLS}, status, available_at, lease_owner, lease_until,"
    f" deliveries, created_at, trace_context) SELECT {_NEW_TASK_COLS}, status, available_at,"
    " lease_owner, lease_until, deliveries, created_at, trace_context FROM "
    + _unnest(
        *_NEW_TASK_TYPES,
        "status text",
        "available_at timestamptz",
        "lease_owner text",
        "lease_until timestamptz",
        "deliveries integer",
        "created_at timestamptz",
        "trace_context text",
    )
    + " ORDER BY n ON CONFLICT (tenant_id, idempotency_key) DO NOTHING"
    f" RETURNING tenant_id, idempotency_key, {_TASK_COLS}"
)
LEASE_CHOSEN_TASKS_PG = (
    "UPDATE tasks t SET status = 'leased', lease_until = v.lease_until,"
    " lease_owner = v.lease_owner, deliveries = t.deliveries + 1,"
    " deaths = t.deaths + CASE WHEN t.status = 'leased' THEN 1 ELSE 0 END FROM "
    + _unnest(
        "lease_until timestamptz",
        "lease_owner text",
        "tenant_id text",
        "id bigint",
        "queued_by timestamptz",
        "expired_by timestamptz",
    )
    + " WHERE t.tenant_id = v.tenant_id AND t.id = v.id"
    " AND (t.status = 'queued' AND t.available_at <= v.queued_by"
    " OR t.status = 'leased' AND t.lease_until <= v.expired_by)"
    f" RETURNING v.n, {_qualified(_TASK_COLS, 't')}"
)
COMPLETE_TASKS_PG = (
    "UPDATE tasks t SET status = 'done', lease_owner = NULL, lease_until = NULL FROM "
    + _unnest("tenant_id text", "id bigint")
    + " WHERE t.tenant_id = v.tenant_id AND t.id = v.id AND t.status <> 'done'"
    " RETURNING v.n, t.id"
)
RECORD_ATTEMPTS_PG = (
    f"INSERT INTO attempts ({_ATTEMPT_COLS}) SELECT {_ATTEMPT_COLS} FROM "
    + _unnest(
        "tenant_id text",
        "run_id text",
        "step_ref text",
        "item_index integer",
        "attempt integer",
        "ok boolean",
        "output jsonb",
        "error jsonb",
        "started_at timestamptz",
        "finished_at timestamptz",
    )
    + " ORDER BY n ON CONFLICT DO NOTHING"
    " RETURNING tenant_id, run_id, step_ref, item_index, attempt, attempt"
)
FIND_RUNS_BY_KEY_PG = (
    f"SELECT v.n, {_qualified(_RUN_COLS, 'r')} FROM "
    + _unnest("tenant_id text", "idempotency_key text")
    + " JOIN runs r ON r.tenant_id = v.tenant_id AND r.idempotency_key = v.idempotency_key"
)
INSERT_RUNS_PG = (
    f"INSERT INTO runs ({_RUN_COLS}, {_LIMIT_COLS}) SELECT {_RUN_COLS}, {_LIMIT_COLS} FROM "
    + _unnest(
        "tenant_id text",
        "id text",
        "family_slug text",
        "version integer",
        "status text",
        "state json",
        "lock_version bigint",
        "input json",
        "output jsonb",
        "error jsonb",
        "parent_run_id text",
        "parent_step_ref text",
        "parent_item_index integer",
        "child_key text",
        "idempotency_key text",
        "created_at timestamptz",
        "updated_at timestamptz",
        "finished_at timestamptz",
        "kind text",
        "kind_state jsonb",
        "trace_context text",
        "outlined jsonb",
        "limit_key text",
        "key_concurrency integer",
        "key_rate float8",
        "key_burst integer",
    )
    + " ORDER BY n ON CONFLICT DO NOTHING RETURNING tenant_id, id, id"
)
_RUNS = _unnest("tenant_id text", "run_id text")
DELETE_RUNS_TIMERS_PG = (
    f"DELETE FROM timers t USING {_RUNS}"
    " WHERE t.tenant_id = v.tenant_id AND t.run_id = v.run_id RETURNING v.n"
)
CLEAR_RUNS_WAITS_PG = (
    f"DELETE FROM waits t USING {_RUNS}"
    " WHERE t.tenant_id = v.tenant_id AND t.run_id = v.run_id RETURNING v.n"
)
DROP_RUNS_TASKS_PG = (
    # Each run's queued tasks are found and locked by its key (the LATERAL look,
    # which drops a task another transaction took meanwhile), then updated by
    # theirs: joined directly, a generic plan made on an empty table scans every
    # queued task for each batch instead.
    "UPDATE tasks t SET status = 'done', lease_owner = NULL, lease_until = NULL FROM"
    f" (SELECT v.n, q.tenant_id, q.id FROM {_RUNS} CROSS JOIN LATERAL (SELECT tenant_id, id"
    " FROM tasks WHERE tenant_id = v.tenant_id AND run_id = v.run_id AND status = 'queued'"
    " FOR UPDATE) q) x WHERE t.tenant_id = x.tenant_id AND t.id = x.id RETURNING x.n"
)
APPEND_HISTORIES_PG = (
    "INSERT INTO run_history (tenant_id, run_id, at, kind, data)"
    " SELECT tenant_id, run_id, at, kind, data FROM "
    + _unnest("tenant_id text", "run_id text", "at timestamptz", "kind text", "data jsonb")
    + " ORDER BY n"
)

BATCHES_PG: dict[str, Batch] = {
    GET_RUN: Batch(GET_RUNS_PG, (), ordinal=True),
    RUN_STATUS: Batch(RUN_STATUSES_PG, (), ordinal=True),
    LOCK_RUN.format(lock=PG_SKIP_LOCKED): Batch(LOCK_RUNS_PG, (), ordinal=True),
    UPDATE_RUN: Batch(UPDATE_RUNS_PG, (8, 9), ordinal=True),
    LOAD_RUN_INBOX: Batch(LOAD_RUNS_INBOX_PG, (), ordinal=True),
    DELETE_INBOX_ITEM: Batch(DELETE_INBOX_ITEMS_PG, (0, 1), ordinal=True),
    ENQUEUE_INBOX_ITEM: Batch(ENQUEUE_INBOX_ITEMS_PG, (0, 1), ordinal=False),
    ENQUEUE_TASK: Batch(ENQUEUE_TASKS_PG, (0, 8), ordinal=False),
    ENQUEUE_TASK_LEASING: Batch(ENQUEUE_TASKS_LEASING_PG, (0, 8), ordinal=False),
    LEASE_CHOSEN_TASK: Batch(LEASE_CHOSEN_TASKS_PG, (2, 3), ordinal=True),
    COMPLETE_TASK: Batch(COMPLETE_TASKS_PG, (0, 1), ordinal=True),
    RECORD_ATTEMPT: Batch(RECORD_ATTEMPTS_PG, (0, 1, 2, 3, 4), ordinal=False),
    APPEND_HISTORY: Batch(APPEND_HISTORIES_PG, (), ordinal=True),
    FIND_RUN_BY_KEY: Batch(FIND_RUNS_BY_KEY_PG, (), ordinal=True),
    INSERT_RUN: Batch(INSERT_RUNS_PG, (0, 1), ordinal=False),
    # A run named twice is cleared once: these answer only a count.
    DELETE_RUN_TIMERS: Batch(DELETE_RUNS_TIMERS_PG, (), ordinal=True),
    CLEAR_RUN_WAITS: Batch(CLEAR_RUNS_WAITS_PG, (), ordinal=True),
    DROP_RUN_TASKS: Batch(DROP_RUNS_TASKS_PG, (), ordinal=True),
}
"""Postgres: the one statement that runs a batch of each one-row statement."""

HOT_STATEMENTS: dict[str, str] = {
    "claim_runs_with_inbox": CLAIM_RUNS_WITH_INBOX_PG,
    "claim_runs": CLAIM_RUNS_PG,
    "get_run": GET_RUN,
    "run_status": RUN_STATUS,
    "lock_run": LOCK_RUN,
    "update_run": UPDATE_RUN,
    "load_run_inbox": LOAD_RUN_INBOX,
    "delete_inbox_item": DELETE_INBOX_ITEM,
    "enqueue_inbox_item": ENQUEUE_INBOX_ITEM,
    "enqueue_task": ENQUEUE_TASK,
    "enqueue_task_leasing": ENQUEUE_TASK_LEASING,
    "lease_expired_tasks": LEASE_EXPIRED_TASKS,
    "lease_queued_tasks": LEASE_QUEUED_TASKS,
    "lease_chosen_task": LEASE_CHOSEN_TASK,
    "new_ready_tasks": NEW_READY_TASKS,
    "expired_ready_tasks": EXPIRED_READY_TASKS,
    "extend_lease": EXTEND_LEASE,
    "complete_task": COMPLETE_TASK,
    "release_task": RELEASE_TASK,
    "drop_run_tasks": DROP_RUN_TASKS,
    "record_attempt": RECORD_ATTEMPT,
    "set_timer": SET_TIMER,
    "due_timers": DUE_TIMERS,
    "delete_run_timers": DELETE_RUN_TIMERS,
    "clear_run_waits": CLEAR_RUN_WAITS,
    "append_history": APPEND_HISTORY,
    "get_runs_batch": GET_RUNS_PG,
    "run_statuses_batch": RUN_STATUSES_PG,
    "lock_runs_batch": LOCK_RUNS_PG,
    "update_runs_batch": UPDATE_RUNS_PG,
    "load_runs_inbox_batch": LOAD_RUNS_INBOX_PG,
    "delete_inbox_items_batch": DELETE_INBOX_ITEMS_PG,
    "enqueue_inbox_items_batch": ENQUEUE_INBOX_ITEMS_PG,
    "enqueue_tasks_batch": ENQUEUE_TASKS_PG,
    "enqueue_tasks_leasing_batch": ENQUEUE_TASKS_LEASING_PG,
    "lease_chosen_tasks_batch": LEASE_CHOSEN_TASKS_PG,
    "complete_tasks_batch": COMPLETE_TASKS_PG,
    "record_attempts_batch": RECORD_ATTEMPTS_PG,
    "append_history_batch": APPEND_HISTORIES_PG,
    "find_run_by_key": FIND_RUN_BY_KEY,
    "insert_run": INSERT_RUN,
    "find_runs_by_key_batch": FIND_RUNS_BY_KEY_PG,
    "insert_runs_batch": INSERT_RUNS_PG,
    "delete_runs_timers_batch": DELETE_RUNS_TIMERS_PG,
    "clear_runs_waits_batch": CLEAR_RUNS_WAITS_PG,
    "drop_runs_tasks_batch": DROP_RUNS_TASKS_PG,
}
"""Every statement the engine runs per step (Postgres texts, before `render`)."""


def answered(rows: list[Row | None]) -> Callable[[], Awaitable[list[Row | None]]]:
    """Rows already read, handed out as `executemany_returning_later` hands them."""

    async def taken() -> list[Row | None]:
        return rows

    return taken


class SqlTx:
    """The `Tx` (and `Session`) implementation shared by both backends.

    Subclasses implement the I/O hooks (`fetch_all`, `execute`, `executemany`,
    `executemany_returning`, `advisory_lock`), value conversion
    (`to_timestamp`, `from_timestamp`) and the locking clauses; everything else
    lives here so both backends behave the same. The transaction is its own
    `session`.
    """

    # Appended to SELECTs that claim rows for this transaction (Postgres only).
    _skip_locked: str = ""
    _skip_locked_runs: str = ""
    # How a lease names the task rows it takes (the tasks' key on this backend).
    _lease_key: str = "id"
    _lease_cols: str = "id"
    _claim_runs_sql: str = CLAIM_RUNS_WITH_INBOX_PLAIN
    _claim_full_sql: str | None = None  # claim and read in one statement, where there is one

    @classmethod
    def render(cls, template: str, *, handlers: int = 0) -> str:
        """`template` (one of the statements above) with this backend's clauses."""
        return template.format(
            lock=cls._skip_locked,
            lock_runs=cls._skip_locked_runs,
            lease_key=cls._lease_key,
            lease_cols=cls._lease_cols,
            handlers=f" AND handler IN ({', '.join(['%s'] * handlers)})" if handlers else "",
        )

    backend: str = ""
    """ "sqlite" or "postgres" (set by each backend)."""

    def __init__(self) -> None:
        self._before_commit: list[BeforeCommit] = []
        self._after_commit: list[AfterCommit] = []

    @property
    def session(self) -> Session:
        """This transaction, seen as the plain-SQL `Session`."""
        return self

    # --- I/O hooks ---------------------------------------------------------------
    # Each backend (SqliteTx, PostgresTx) overrides every hook below; the base
    # class is never used on its own, so reaching one of these raises loudly.

    async def fetch_all(self, sql: str, params: Params = ()) -> list[Row]:
        """Run a query; return every row."""
        raise NotImplementedError(f"{type(self).__name__} must implement fetch_all")

    async def execute(self, sql: str, params: Params = ()) -> int:
        """Run one statement; return the number of rows it changed."""
        raise NotImplementedError(f"{type(self).__name__} must implement execute")

    async def executemany(self, sql: str, rows: Sequence[Params]) -> None:
        """Run a statement without results once per params row (batched)."""
        raise NotImplementedError(f"{type(self).__name__} must implement executemany")

    async def executemany_returning(self, sql: str, rows: Sequence[Params]) -> list[Row | None]:
        """Run `sql` once per params row; return each run's first result row (or None)."""
        raise NotImplementedError(f"{type(self).__name__} must implement executemany_returning")

    async def executemany_returning_later(
        self, sql: str, rows: Sequence[Params]
    ) -> Callable[[], Awaitable[list[Row | None]]]:
        """`executemany_returning` whose rows are asked for later: a backend that
        can (Postgres, in a transaction) sends it with the transaction's next
        round trip; this one runs it now."""
        return answered(await self.executemany_returning(sql, rows))

    async def executemany_fetch_all(self, sql: str, rows: Sequence[Params]) -> list[list[Row]]:
        """Run `sql` once per params row (batched); return every run's result rows."""
        raise NotImplementedError(f"{type(self).__name__} must implement executemany_fetch_all")

    async def advisory_lock(self, name: str, *, shared: bool = False) -> None:
        """Hold the lock `name` until the transaction ends (see `Session`)."""
        raise NotImplementedError(f"{type(self).__name__} must implement advisory_lock")

    def to_timestamp(self, value: datetime) -> Any:
        """A datetime as the backend's timestamp parameter."""
        raise NotImplementedError(f"{type(self).__name__} must implement to_timestamp")

    def from_timestamp(self, value: Any) -> datetime:
        """A timestamp column value as an aware UTC datetime."""
        raise NotImplementedError(f"{type(self).__name__} must implement from_timestamp")

    # --- the rest of the session -------------------------------------------------

    async def fetch_one(self, sql: str, params: Params = ()) -> Row | None:
        """Run a query; return its first row, or None."""
        rows = await self.fetch_all(sql, params)
        return rows[0] if rows else None

    def to_json(self, value: Any) -> str | None:
        """`value` as JSON text for a JSON column (None stays SQL NULL)."""
        return None if value is None else _encoder.encode(value).decode()

    @staticmethod
    def from_json(raw: Any) -> Any:
        """A JSON column value decoded (None for SQL NULL)."""
        return None if raw is None else _any_decoder.decode(raw)

    def before_commit(self, callback: BeforeCommit) -> None:
        """Run `callback` inside the transaction just before it commits (see `Session`)."""
        self._before_commit.append(callback)

    async def _run_before_commit(self) -> None:
        # Called by the backend's `transaction()` right before COMMIT; an
        # exception here rolls the whole transaction back.
        while self._before_commit:
            callback = self._before_commit.pop(0)
            await callback()

    def after_commit(self, callback: AfterCommit) -> None:
        """Call `callback()` once this transaction has committed (see `Session`)."""
        self._after_commit.append(callback)

    def _run_after_commit(self) -> None:
        # Called by the backend's `transaction()` once COMMIT has returned: the
        # work is durable, so a failing notice is logged and never raised.
        callbacks, self._after_commit = self._after_commit, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                _log.exception("an after-commit callback failed (the commit stands)")

    # --- conversion --------------------------------------------------------------

    def _ts_or_none(self, value: datetime | None) -> Any:
        return None if value is None else self.to_timestamp(value)

    def _dt_or_none(self, value: Any) -> datetime | None:
        return None if value is None else self.from_timestamp(value)

    @staticmethod
    def _error(raw: Any) -> ErrorInfo | None:
        return None if raw is None else _error_decoder.decode(raw)

    def _tenant(self, r: Row) -> TenantRecord:
        return TenantRecord(id=r[0], name=r[1], created_at=self.from_timestamp(r[2]))

    def _key(self, r: Row) -> ApiKeyRecord:
        return ApiKeyRecord(
            id=r[0],
            tenant_id=r[1],
            name=r[2],
            prefix=r[3],
            key_hash=r[4],
            created_at=self.from_timestamp(r[5]),
            revoked_at=self._dt_or_none(r[6]),
            scopes=tuple(r[7].split()),
            expires_at=self._dt_or_none(r[8]),
            last_used_at=self._dt_or_none(r[9]),
        )

    def _workflow(self, r: Row) -> WorkflowVersionRecord:
        return WorkflowVersionRecord(
            tenant_id=r[0],
            family_slug=r[1],
            version=r[2],
            hash=r[3],
            definition=self.from_json(r[4]),
            trigger_events=_strings_decoder.decode(r[5]),
            created_at=self.from_timestamp(r[6]),
        )

    def _run(self, r: Row) -> RunRecord:
        input = self.from_json(r[7])
        return RunRecord(
            tenant_id=r[0],
            id=r[1],
            family_slug=r[2],
            version=r[3],
            status=RunStatus(r[4]),
            state=_with_input(_state_decoder.decode(r[5]), input),
            lock_version=r[6],
            input=input,
            output=self.from_json(r[8]),
            error=self._error(r[9]),
            parent_run_id=r[10],
            parent_step_ref=r[11],
            parent_item_index=r[12],
            child_key=r[13],
            idempotency_key=r[14],
            created_at=self.from_timestamp(r[15]),
            updated_at=self.from_timestamp(r[16]),
            finished_at=self._dt_or_none(r[17]),
            kind=r[18],
            kind_state=self.from_json(r[19]),
            trace_context=r[20],
            outlined=() if r[21] is None else _outlined_decoder.decode(r[21]),
        )

    async def _run_of(self, row: Row) -> RunRecord:
        """One run's row as its record, with the outputs kept out of its state."""
        [record] = await self._runs_of([row])
        return record

    async def _runs_of(self, rows: Sequence[Row]) -> list[RunRecord]:
        """Runs' rows as records, each state with its outputs kept elsewhere put
        back (one look per run that has any)."""
        records = [self._run(r) for r in rows]
        outlined = [i for i, record in enumerate(records) if record.outlined]
        if not outlined:
            return records
        found = await self.executemany_fetch_all(
            LOAD_RUN_OUTPUTS, [(records[i].tenant_id, records[i].id) for i in outlined]
        )
        for i, stored in zip(outlined, found, strict=True):
            outputs = {(r[0], int(r[1])): self.from_json(r[2]) for r in stored}
            record = records[i]
            records[i] = msgspec.structs.replace(record, state=splice(record.state, outputs))
        return records

    def _inbox(self, r: Row) -> InboxItem:
        return InboxItem(
            seq=r[0],
            tenant_id=r[1],
            run_id=r[2],
            input=_input_decoder.decode(r[3]),
            available_at=self.from_timestamp(r[4]),
            size=r[5],
        )

    def _task(self, r: Row) -> TaskRecord:
        return TaskRecord(
            id=str(r[0]),
            tenant_id=r[1],
            run_id=r[2],
            step_ref=r[3],
            item_index=r[4],
            attempt=r[5],
            step_type=r[6],
            handler=r[7],
            payload=self.from_json(r[8]),
            idempotency_key=r[9],
            timeout_seconds=r[10],
            tier=r[11],
            status=TaskStatus(r[12]),
            available_at=self.from_timestamp(r[13]),
            lease_owner=r[14],
            lease_until=self._dt_or_none(r[15]),
            deliveries=r[16],
            created_at=self.from_timestamp(r[17]),
            deaths=r[18],
            trace_context=r[19],
        )

    def _attempt(self, r: Row) -> AttemptRecord:
        return AttemptRecord(
            tenant_id=r[0],
            run_id=r[1],
            step_ref=r[2],
            item_index=r[3],
            attempt=r[4],
            ok=bool(r[5]),
            output=self.from_json(r[6]),
            error=self._error(r[7]),
            started_at=self.from_timestamp(r[8]),
            finished_at=self.from_timestamp(r[9]),
        )

    def _timer(self, r: Row) -> TimerRecord:
        return TimerRecord(
            tenant_id=r[0], run_id=r[1], timer_id=r[2], fire_at=self.from_timestamp(r[3])
        )

    def _wait(self, r: Row) -> WaitRecord:
        return WaitRecord(
            tenant_id=r[0],
            run_id=r[1],
            step_ref=r[2],
            kind=r[3],
            name=r[4],
            created_at=self.from_timestamp(r[5]),
        )

    def _event(self, r: Row) -> EventRecord:
        return EventRecord(
            tenant_id=r[0],
            id=r[1],
            name=r[2],
            data=self.from_json(r[3]),
            received_at=self.from_timestamp(r[4]),
        )

    def _history(self, r: Row) -> HistoryRecord:
        return HistoryRecord(
            tenant_id=r[0],
            run_id=r[1],
            seq=r[2],
            at=self.from_timestamp(r[3]),
            kind=r[4],
            data=self.from_json(r[5]),
        )

    def _idem(self, r: Row) -> IdempotencyRecord:
        return IdempotencyRecord(
            tenant_id=r[0],
            scope=r[1],
            key=r[2],
            request_hash=r[3],
            status_code=r[4],
            response=self.from_json(r[5]),
            created_at=self.from_timestamp(r[6]),
        )

    @staticmethod
    def _task_id(task_id: str) -> int | None:
        # Task ids are the decimal form of an integer key; anything else names no task.
        return int(task_id) if task_id.isascii() and task_id.isdigit() else None

    # --- tenants and API keys -------------------------------------------------------

    async def ensure_tenant(self, tenant_id: str, *, name: str, now: datetime) -> TenantRecord:
        await self.execute(
            "INSERT INTO tenants (id, name, created_at) VALUES (%s, %s, %s)"
            " ON CONFLICT (id) DO NOTHING",
            (tenant_id, name, self.to_timestamp(now)),
        )
        tenant = await self.get_tenant(tenant_id)
        if tenant is None:  # pragma: no cover - the row was just written
            raise StoreError(f"tenant {tenant_id!r} vanished after insert")
        return tenant

    async def insert_tenant(self, tenant_id: str, *, name: str, now: datetime) -> bool:
        changed = await self.execute(
            "INSERT INTO tenants (id, name, created_at) VALUES (%s, %s, %s)"
            " ON CONFLICT (id) DO NOTHING",
            (tenant_id, name, self.to_timestamp(now)),
        )
        return changed > 0

    async def get_tenant(self, tenant_id: str) -> TenantRecord | None:
        row = await self.fetch_one(
            f"SELECT {_TENANT_COLS} FROM tenants WHERE id = %s", (tenant_id,)
        )
        return None if row is None else self._tenant(row)

    async def page_tenants(self, *, after: str | None, limit: int) -> list[TenantRecord]:
        rows = await self.fetch_all(
            f"SELECT {_TENANT_COLS} FROM tenants WHERE id > %s ORDER BY id LIMIT %s",
            ("" if after is None else after, limit),
        )
        return [self._tenant(r) for r in rows]

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
        await self.execute(
            f"INSERT INTO api_keys ({_KEY_COLS})"
            " VALUES (%s, %s, %s, %s, %s, %s, NULL, %s, %s, NULL)",
            (
                key_id,
                tenant_id,
                name,
                prefix,
                key_hash,
                self.to_timestamp(now),
                " ".join(scopes),
                None if expires_at is None else self.to_timestamp(expires_at),
            ),
        )
        return ApiKeyRecord(
            id=key_id,
            tenant_id=tenant_id,
            name=name,
            prefix=prefix,
            key_hash=key_hash,
            created_at=utc(now),
            scopes=tuple(scopes),
            expires_at=None if expires_at is None else utc(expires_at),
        )

    async def find_api_key(self, key_hash: str) -> ApiKeyRecord | None:
        row = await self.fetch_one(
            f"SELECT {_KEY_COLS} FROM api_keys WHERE key_hash = %s", (key_hash,)
        )
        return None if row is None else self._key(row)

    async def get_api_key(self, tenant_id: str, key_id: str) -> ApiKeyRecord | None:
        row = await self.fetch_one(
            f"SELECT {_KEY_COLS} FROM api_keys WHERE tenant_id = %s AND id = %s",
            (tenant_id, key_id),
        )
        return None if row is None else self._key(row)

    async def list_api_keys(self, tenant_id: str) -> list[ApiKeyRecord]:
        rows = await self.fetch_all(
            f"SELECT {_KEY_COLS} FROM api_keys WHERE tenant_id = %s ORDER BY created_at, id",
            (tenant_id,),
        )
        return [self._key(r) for r in rows]

    async def page_api_keys(
        self, tenant_id: str, *, before: tuple[datetime, str] | None, limit: int
    ) -> list[ApiKeyRecord]:
        if before is None:
            rows = await self.fetch_all(
                f"SELECT {_KEY_COLS} FROM api_keys WHERE tenant_id = %s"
                " ORDER BY created_at DESC, id DESC LIMIT %s",
                (tenant_id, limit),
            )
        else:
            at, key_id = before
            rows = await self.fetch_all(
                f"SELECT {_KEY_COLS} FROM api_keys WHERE tenant_id = %s"
                " AND (created_at, id) < (%s, %s)"
                " ORDER BY created_at DESC, id DESC LIMIT %s",
                (tenant_id, self.to_timestamp(at), key_id, limit),
            )
        return [self._key(r) for r in rows]

    async def count_live_api_keys(
        self, tenant_id: str, *, now: datetime, scope: str | None = None
    ) -> int:
        sql = (
            "SELECT count(*) FROM api_keys WHERE tenant_id = %s AND revoked_at IS NULL"
            " AND (expires_at IS NULL OR expires_at > %s)"
        )
        params: list[Any] = [tenant_id, self.to_timestamp(now)]
        if scope is not None:
            sql += " AND (' ' || scopes || ' ') LIKE %s"
            params.append(f"% {scope} %")
        row = await self.fetch_one(sql, params)
        return 0 if row is None else int(row[0])

    async def revoke_api_key(self, tenant_id: str, key_id: str, *, now: datetime) -> bool:
        changed = await self.execute(
            "UPDATE api_keys SET revoked_at = %s"
            " WHERE tenant_id = %s AND id = %s AND revoked_at IS NULL",
            (self.to_timestamp(now), tenant_id, key_id),
        )
        return changed > 0

    async def touch_api_key(
        self, tenant_id: str, key_id: str, *, now: datetime, stale_before: datetime
    ) -> bool:
        changed = await self.execute(
            "UPDATE api_keys SET last_used_at = %s WHERE tenant_id = %s AND id = %s"
            " AND (last_used_at IS NULL OR last_used_at <= %s)",
            (self.to_timestamp(now), tenant_id, key_id, self.to_timestamp(stale_before)),
        )
        return changed > 0

    # --- workflow versions ----------------------------------------------------------

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
        # Serializes publishers of one family (same lock name as ever, so a
        # rolling upgrade never has two processes numbering the same version).
        await self.advisory_lock(f"workflow:{tenant_id}:{family_slug}")
        row = await self.fetch_one(
            f"SELECT {_WF_COLS} FROM workflow_versions"
            " WHERE tenant_id = %s AND family_slug = %s AND hash = %s",
            (tenant_id, family_slug, hash),
        )
        if row is not None:
            return self._workflow(row), False
        top = await self.fetch_one(
            "SELECT COALESCE(MAX(version), 0) FROM workflow_versions"
            " WHERE tenant_id = %s AND family_slug = %s",
            (tenant_id, family_slug),
        )
        version = int(top[0] if top else 0) + 1
        events = sorted(set(trigger_events))
        await self.execute(
            f"INSERT INTO workflow_versions ({_WF_COLS}) VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (
                tenant_id,
                family_slug,
                version,
                hash,
                self.to_json(definition),
                self.to_json(events),
                self.to_timestamp(now),
            ),
        )
        if events:
            await self.executemany(
                "INSERT INTO workflow_triggers (tenant_id, event_name, family_slug, version)"
                " VALUES (%s, %s, %s, %s)",
                [(tenant_id, name, family_slug, version) for name in events],
            )
        record = WorkflowVersionRecord(
            tenant_id=tenant_id,
            family_slug=family_slug,
            version=version,
            hash=hash,
            definition=self.from_json(self.to_json(definition)),
            trigger_events=events,
            created_at=utc(now),
        )
        return record, True

    async def get_workflow_version(
        self, tenant_id: str, family_slug: str, version: int
    ) -> WorkflowVersionRecord | None:
        row = await self.fetch_one(
            f"SELECT {_WF_COLS} FROM workflow_versions"
            " WHERE tenant_id = %s AND family_slug = %s AND version = %s",
            (tenant_id, family_slug, version),
        )
        return None if row is None else self._workflow(row)

    async def get_latest_workflow_version(
        self, tenant_id: str, family_slug: str
    ) -> WorkflowVersionRecord | None:
        row = await self.fetch_one(
            f"SELECT {_WF_COLS} FROM workflow_versions"
            " WHERE tenant_id = %s AND family_slug = %s ORDER BY version DESC LIMIT 1",
            (tenant_id, family_slug),
        )
        return None if row is None else self._workflow(row)

    async def list_workflow_versions(
        self, tenant_id: str, family_slug: str
    ) -> list[WorkflowVersionRecord]:
        rows = await self.fetch_all(
            f"SELECT {_WF_COLS} FROM workflow_versions"
            " WHERE tenant_id = %s AND family_slug = %s ORDER BY version",
            (tenant_id, family_slug),
        )
        return [self._workflow(r) for r in rows]

    async def list_workflow_families(self, tenant_id: str) -> list[WorkflowFamilyRecord]:
        cols = ", ".join(f"w.{c.strip()}" for c in _WF_COLS.split(","))
        rows = await self.fetch_all(
            f"SELECT {cols}, f.n FROM workflow_versions w JOIN ("
            "  SELECT family_slug, MAX(version) AS v, COUNT(*) AS n FROM workflow_versions"
            "  WHERE tenant_id = %s GROUP BY family_slug"
            ") f ON f.family_slug = w.family_slug AND f.v = w.version"
            " WHERE w.tenant_id = %s ORDER BY w.family_slug",
            (tenant_id, tenant_id),
        )
        return [
            WorkflowFamilyRecord(
                family_slug=r[1], latest=self._workflow(r[:7]), version_count=int(r[7])
            )
            for r in rows
        ]

    async def find_triggered_workflows(
        self, tenant_id: str, event_name: str
    ) -> list[WorkflowVersionRecord]:
        cols = ", ".join(f"w.{c.strip()}" for c in _WF_COLS.split(","))
        rows = await self.fetch_all(
            f"SELECT {cols} FROM workflow_triggers t JOIN workflow_versions w"
            " ON w.tenant_id = t.tenant_id AND w.family_slug = t.family_slug"
            " AND w.version = t.version"
            " WHERE t.tenant_id = %s AND t.event_name = %s AND t.version = ("
            "  SELECT MAX(m.version) FROM workflow_versions m"
            "  WHERE m.tenant_id = t.tenant_id AND m.family_slug = t.family_slug"
            ") ORDER BY w.family_slug",
            (tenant_id, event_name),
        )
        return [self._workflow(r) for r in rows]

    # --- runs -----------------------------------------------------------------------

    async def insert_runs(self, runs: Sequence[NewRun]) -> list[RunInsert]:
        if not runs:
            return []
        params = []
        outlines = []
        for run in runs:
            state = run.state
            stored, keys, fresh = outline(_without_input(state), ())
            outlines.append((keys, fresh))
            params.append(
                (
                    run.tenant_id,
                    state.run_id,
                    run.family_slug,
                    run.version,
                    str(state.status),
                    self.to_json(stored),
                    0,
                    self.to_json(state.input),
                    self.to_json(state.output),
                    self.to_json(state.error),
                    run.parent_run_id,
                    run.parent_step_ref,
                    run.parent_item_index,
                    run.child_key,
                    run.idempotency_key,
                    self.to_timestamp(state.created_at),
                    self.to_timestamp(state.created_at),
                    self._ts_or_none(state.finished_at),
                    run.kind,
                    self.to_json(run.kind_state),
                    run.trace_context,
                    self._outlined_json(keys),
                    None if run.limits is None else run.limits.key,
                    None if run.limits is None else run.limits.concurrency,
                    None if run.limits is None else run.limits.rate,
                    1 if run.limits is None else run.limits.burst,
                )
            )
        inserted = await self.executemany_returning(INSERT_RUN, params)
        results: list[RunInsert] = []
        outputs: list[Params] = []
        for run, row, (keys, fresh) in zip(runs, inserted, outlines, strict=True):
            if row is not None:
                record = self._new_run_record(run)
                if keys:
                    record = msgspec.structs.replace(record, outlined=keys)
                    outputs.extend(self._output_rows(run.tenant_id, run.state.run_id, fresh))
                results.append(RunInsert(run=record, created=True))
                continue
            existing = await self._existing_run(run)
            if existing is None:
                raise StoreError(
                    f"run {run.state.run_id!r} conflicts with a run of another tenant",
                    code="storage.conflict",
                    retryable=False,
                )
            results.append(RunInsert(run=existing, created=False))
        if outputs:
            await self.executemany(SAVE_RUN_OUTPUT, outputs)
        return results

    def _outlined_json(self, keys: Outlined) -> Any:
        """`runs.outlined` as stored: the pairs as JSON, NULL when there are none."""
        return self.to_json(list(keys)) if keys else None

    def _output_rows(
        self, tenant_id: str, run_id: str, fresh: Sequence[tuple[str, int, Any]]
    ) -> list[Params]:
        return [
            (tenant_id, run_id, ref, index, self.to_json(output)) for ref, index, output in fresh
        ]

    def _new_run_record(self, run: NewRun) -> RunRecord:
        state = run.state
        created = utc(state.created_at)
        return RunRecord(
            tenant_id=run.tenant_id,
            id=state.run_id,
            family_slug=run.family_slug,
            version=run.version,
            status=state.status,
            state=state,
            lock_version=0,
            input=state.input,
            output=state.output,
            error=state.error,
            parent_run_id=run.parent_run_id,
            parent_step_ref=run.parent_step_ref,
            parent_item_index=run.parent_item_index,
            child_key=run.child_key,
            idempotency_key=run.idempotency_key,
            created_at=created,
            updated_at=created,
            finished_at=None if state.finished_at is None else utc(state.finished_at),
            kind=run.kind,
            kind_state=run.kind_state,
            trace_context=run.trace_context,
        )

    async def _existing_run(self, run: NewRun) -> RunRecord | None:
        if run.idempotency_key is not None:
            found = await self.find_run_by_idempotency_key(run.tenant_id, run.idempotency_key)
            if found is not None:
                return found
        if run.child_key is not None:
            row = await self.fetch_one(
                f"SELECT {_RUN_COLS} FROM runs WHERE tenant_id = %s AND child_key = %s",
                (run.tenant_id, run.child_key),
            )
            if row is not None:
                return await self._run_of(row)
        return await self.get_run(run.tenant_id, run.state.run_id)

    async def get_run(self, tenant_id: str, run_id: str) -> RunRecord | None:
        row = await self.fetch_one(GET_RUN, (tenant_id, run_id))
        return None if row is None else await self._run_of(row)

    async def get_runs(self, refs: Sequence[RunRef]) -> list[RunRecord]:
        if not refs:
            return []
        rows = await self.executemany_returning(
            GET_RUN, [(ref.tenant_id, ref.run_id) for ref in refs]
        )
        return await self._runs_of([r for r in rows if r is not None])

    async def run_statuses(self, refs: Sequence[RunRef]) -> list[RunStatus | None]:
        if not refs:
            return []
        rows = await self.executemany_returning(
            RUN_STATUS, [(ref.tenant_id, ref.run_id) for ref in refs]
        )
        return [None if row is None else RunStatus(row[0]) for row in rows]

    async def lock_runs(
        self, refs: Sequence[RunRef], *, max_state_bytes: int | None = None
    ) -> list[tuple[RunRecord, bool]]:
        if not refs:
            return []
        rows = await self.executemany_returning(
            self.render(LOCK_RUN), [(ref.tenant_id, ref.run_id) for ref in refs]
        )
        # The state's raw JSON (bytes on Postgres, text on SQLite) at position 5.
        found = [
            r
            for r in rows
            if r is not None and (max_state_bytes is None or len(r[5]) <= max_state_bytes)
        ]
        # The flag comes after the run's columns, which `_run` reads by position.
        records = await self._runs_of(found)
        return [(record, bool(row[-1])) for record, row in zip(records, found, strict=True)]

    async def find_run_by_idempotency_key(self, tenant_id: str, key: str) -> RunRecord | None:
        row = await self.fetch_one(FIND_RUN_BY_KEY, (tenant_id, key))
        return None if row is None else await self._run_of(row)

    async def find_runs_by_idempotency_keys(
        self, tenant_id: str, keys: Sequence[str]
    ) -> list[RunRecord | None]:
        if not keys:
            return []
        rows = await self.executemany_returning(FIND_RUN_BY_KEY, [(tenant_id, k) for k in keys])
        found = iter(await self._runs_of([row for row in rows if row is not None]))
        return [None if row is None else next(found) for row in rows]

    async def list_child_runs(
        self, tenant_id: str, parent_run_id: str, *, step_ref: str | None = None
    ) -> list[RunRecord]:
        sql = f"SELECT {_RUN_COLS} FROM runs WHERE tenant_id = %s AND parent_run_id = %s"
        params: list[Any] = [tenant_id, parent_run_id]
        if step_ref is not None:
            sql += " AND parent_step_ref = %s"
            params.append(step_ref)
        rows = await self.fetch_all(sql + " ORDER BY created_at, id", params)
        return await self._runs_of(rows)

    async def list_runs(
        self,
        tenant_id: str,
        *,
        status: str | None = None,
        family_slug: str | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> RunPage:
        if limit < 1:
            raise InvalidCursor(f"limit must be at least 1, got {limit}")
        sql = f"SELECT {_RUN_COLS} FROM runs WHERE tenant_id = %s"
        params: list[Any] = [tenant_id]
        if status is not None:
            sql += " AND status = %s"
            params.append(status)
        if family_slug is not None:
            sql += " AND family_slug = %s"
            params.append(family_slug)
        if cursor is not None:
            created_at, run_id = _decode_cursor(cursor)
            sql += " AND (created_at, id) < (%s, %s)"
            params += [self.to_timestamp(created_at), run_id]
        sql += " ORDER BY created_at DESC, id DESC LIMIT %s"
        params.append(limit + 1)
        rows = await self.fetch_all(sql, params)
        items = await self._runs_of(rows[:limit])
        next_cursor = None
        if len(rows) > limit:
            last = items[-1]
            next_cursor = _encode_cursor(last.created_at, last.id)
        return RunPage(items=items, next_cursor=next_cursor)

    async def update_runs(
        self, updates: Sequence[RunUpdate], *, locked: bool = False
    ) -> list[bool]:
        if not updates:
            return []
        params: list[Params] = []
        fresh_of: list[list[tuple[str, int, Any]]] = []
        for u in updates:
            stored, keys, fresh = outline(_without_input(u.state), u.outlined)
            fresh_of.append(fresh)
            params.append(
                (
                    self.to_json(stored),
                    str(u.state.status),
                    self.to_json(u.state.output),
                    self.to_json(u.state.error),
                    self._ts_or_none(u.state.finished_at),
                    self.to_timestamp(u.updated_at),
                    self.to_json(u.kind_state),
                    self._outlined_json(keys),
                    u.tenant_id,
                    u.run_id,
                    u.expected_lock_version,
                )
            )
        applied: list[bool]
        if locked:
            # Row locks held since the read: the guard cannot fail, so nothing
            # waits for the answer (a queued write on Postgres).
            await self.executemany(UPDATE_RUN, params)
            applied = [True] * len(params)
        else:
            rows = await self.executemany_returning(UPDATE_RUN, params)
            applied = [row is not None for row in rows]
        # Only an applied update's outputs: a lost race leaves its run as it was.
        outputs = [
            row
            for u, fresh, done in zip(updates, fresh_of, applied, strict=True)
            if done and fresh
            for row in self._output_rows(u.tenant_id, u.run_id, fresh)
        ]
        if outputs:
            await self.executemany(SAVE_RUN_OUTPUT, outputs)
        return applied

    # --- run inbox ------------------------------------------------------------------

    async def enqueue_inbox(self, items: Sequence[NewInboxItem]) -> list[int]:
        if not items:
            return []
        params: list[Params] = []
        for i in items:
            text = self.to_json(i.input)
            assert text is not None  # an input is never None
            params.append(
                (i.tenant_id, i.run_id, text, self.to_timestamp(i.available_at), len(text))
            )
        rows = await self.executemany_returning(ENQUEUE_INBOX_ITEM, params)
        seqs: list[int] = []
        for row in rows:
            if row is None:  # pragma: no cover - a plain insert always returns
                raise StoreError("inbox insert returned no seq")
            seqs.append(int(row[0]))
        return seqs

    async def claim_runs_with_inbox(self, *, now: datetime, limit: int) -> list[RunRef]:
        # Look a little past `limit` so runs another coordinator holds can be skipped.
        rows = await self.fetch_all(
            self.render(self._claim_runs_sql),
            (self.to_timestamp(now), limit * 4 + 16, limit),
        )
        return [RunRef(tenant_id=r[0], run_id=r[1]) for r in rows]

    async def claim_runs(self, *, now: datetime, limit: int) -> list[RunRecord]:
        if self._claim_full_sql is None:
            return await self.get_runs(await self.claim_runs_with_inbox(now=now, limit=limit))
        rows = await self.fetch_all(
            self.render(self._claim_full_sql),
            (self.to_timestamp(now), limit * 4 + 16, limit),
        )
        return await self._runs_of(rows)

    async def load_inbox(
        self,
        refs: Sequence[RunRef],
        *,
        now: datetime,
        limit_per_run: int = 1000,
        size_per_run: int = INBOX_SIZE_PER_RUN,
    ) -> list[InboxItem]:
        if not refs:
            return []
        at = self.to_timestamp(now)
        limit = limit_per_run if limit_per_run > 0 else _NO_LIMIT
        most = size_per_run if size_per_run > 0 else _NO_LIMIT
        found = await self.executemany_fetch_all(
            LOAD_RUN_INBOX, [(ref.tenant_id, ref.run_id, at, limit, most) for ref in refs]
        )
        items = [self._inbox(r) for rows in found for r in rows]
        items.sort(key=lambda i: (i.tenant_id, i.run_id, i.seq))
        return await self._with_event_data(items)

    async def _with_event_data(self, items: list[InboxItem]) -> list[InboxItem]:
        """`items`, each event delivered without its data given the data its
        stored event holds (read once per event, however many runs it reached)."""
        wanted = list(
            dict.fromkeys(
                (i.tenant_id, i.input.event_id)
                for i in items
                if isinstance(i.input, EventReceived) and i.input.data is None
            )
        )
        if not wanted:
            return items
        found = await self.executemany_fetch_all(
            f"SELECT {_EVENT_COLS} FROM events WHERE tenant_id = %s AND id = %s", wanted
        )
        data = {(e.tenant_id, e.id): e.data for rows in found for e in map(self._event, rows)}
        out: list[InboxItem] = []
        for item in items:
            sent = item.input
            if isinstance(sent, EventReceived) and sent.data is None:
                stored = data.get((item.tenant_id, sent.event_id))
                if stored is not None:
                    full = msgspec.structs.replace(sent, data=stored)
                    item = msgspec.structs.replace(item, input=full)
            out.append(item)
        return out

    async def defer_inbox(self, refs: Sequence[RunRef], *, now: datetime, until: datetime) -> int:
        deferred = 0
        for chunk in _chunks(refs):
            params: list[Any] = [self.to_timestamp(until)]
            params.extend(v for ref in chunk for v in (ref.tenant_id, ref.run_id))
            params.append(self.to_timestamp(now))
            deferred += await self.execute(
                "UPDATE run_inbox SET available_at = %s"
                f" WHERE (tenant_id, run_id) IN ({_tuples(len(chunk), 2)}) AND available_at <= %s",
                params,
            )
        return deferred

    async def delete_inbox(self, refs: Sequence[InboxRef]) -> int:
        if not refs:
            return 0
        rows = await self.executemany_returning(
            DELETE_INBOX_ITEM, [(ref.tenant_id, ref.seq) for ref in refs]
        )
        return sum(row is not None for row in rows)

    # --- tasks ----------------------------------------------------------------------

    async def enqueue_tasks(self, tasks: Sequence[NewTask]) -> list[bool]:
        return [task_id is not None for task_id in await self.enqueue_task_ids(tasks)]

    async def enqueue_task_ids(self, tasks: Sequence[NewTask]) -> list[str | None]:
        if not tasks:
            return []
        rows = await self.executemany_returning(
            ENQUEUE_TASK,
            [
                (
                    *self._new_task(t),
                    self.to_timestamp(t.available_at),
                    self.to_timestamp(t.created_at or t.available_at),
                    t.trace_context,
                )
                for t in tasks
            ],
        )
        return [None if row is None else str(row[0]) for row in rows]

    def _new_task(self, t: NewTask) -> tuple[Any, ...]:
        """The params of `_NEW_TASK_COLS` for `t`."""
        return (
            t.tenant_id,
            t.run_id,
            t.step_ref,
            t.item_index,
            t.attempt,
            t.step_type,
            t.handler,
            self.to_json(t.payload),
            t.idempotency_key,
            t.timeout_seconds,
            t.tier,
        )

    async def enqueue_tasks_leasing_later(
        self,
        tasks: Sequence[NewTask],
        leased: Sequence[bool],
        *,
        owner: str,
        lease_for: timedelta,
        now: datetime,
    ) -> Callable[[], Awaitable[list[TaskRecord | None]]]:
        until = self.to_timestamp(utc(now) + lease_for)
        later = await self.executemany_returning_later(
            ENQUEUE_TASK_LEASING,
            [
                (
                    *self._new_task(t),
                    "leased" if lease else "queued",
                    self.to_timestamp(t.available_at),
                    owner if lease else None,
                    until if lease else None,
                    1 if lease else 0,
                    self.to_timestamp(t.created_at or t.available_at),
                    t.trace_context,
                )
                for t, lease in zip(tasks, leased, strict=True)
            ],
        )

        async def stored() -> list[TaskRecord | None]:
            return [None if row is None else self._task(row) for row in await later()]

        return stored

    async def lease_tasks(
        self,
        *,
        owner: str,
        limit: int,
        lease_for: timedelta,
        now: datetime,
        handlers: Sequence[str] | None = None,
    ) -> list[TaskRecord]:
        if limit < 1 or (handlers is not None and not handlers):
            return []
        # Two index-friendly claims instead of one OR: overdue leases first (their
        # work is the oldest), then queued tasks by tier and availability. A lease
        # that expired was neither completed nor released: whoever held it died
        # (or stalled) with the task in flight, so taking it over counts a death.
        expired = await self._lease(
            LEASE_EXPIRED_TASKS,
            owner=owner,
            limit=limit,
            lease_for=lease_for,
            now=now,
            handlers=handlers,
        )
        expired.sort(key=lambda t: (t.available_at, int(t.id)))
        if len(expired) >= limit:
            return expired
        queued = await self._lease(
            LEASE_QUEUED_TASKS,
            owner=owner,
            limit=limit - len(expired),
            lease_for=lease_for,
            now=now,
            handlers=handlers,
        )
        queued.sort(key=lambda t: (-t.tier, t.available_at, int(t.id)))
        return expired + queued

    async def _lease(
        self,
        template: str,
        *,
        owner: str,
        limit: int,
        lease_for: timedelta,
        now: datetime,
        handlers: Sequence[str] | None,
    ) -> list[TaskRecord]:
        params: list[Any] = [self.to_timestamp(utc(now) + lease_for), owner, self.to_timestamp(now)]
        if handlers is not None:
            params.extend(handlers)
        params.append(limit)
        sql = self.render(template, handlers=0 if handlers is None else len(handlers))
        rows = await self.fetch_all(sql, params)
        return [self._task(r) for r in rows]

    async def ready_tasks(
        self,
        *,
        now: datetime,
        after_id: str | None = None,
        limit: int = 10_000,
        expired_only: bool = False,
    ) -> list[ReadyTask]:
        at = self.to_timestamp(now)
        if expired_only:
            rows = await self.fetch_all(EXPIRED_READY_TASKS, (at, limit))
        elif after_id is None:
            rows = await self.fetch_all(ALL_READY_TASKS, (at, at, limit))
        else:
            rows = await self.fetch_all(NEW_READY_TASKS, (self._task_id(after_id) or 0, at, limit))
        return [self._ready_task(r) for r in rows]

    async def leased_tasks(self, *, now: datetime, limit: int = 10_000) -> list[ReadyTask]:
        rows = await self.fetch_all(LEASED_TASKS, (self.to_timestamp(now), limit))
        return [self._ready_task(r) for r in rows]

    @staticmethod
    def _ready_task(r: Row) -> ReadyTask:
        limits = None
        if r[4] is not None:
            limits = RunLimits(
                key=r[4],
                concurrency=r[5],
                rate=None if r[6] is None else float(r[6]),
                burst=int(r[7] or 1),
            )
        return ReadyTask(
            id=str(r[0]),
            tenant_id=r[1],
            workflow=r[2],
            tier=r[3],
            expired=bool(r[8]),
            limits=limits,
        )

    async def lease_chosen_tasks(
        self, refs: Sequence[TaskRef], *, owner: str, lease_for: timedelta, now: datetime
    ) -> list[TaskRecord | None]:
        if not refs:
            return []
        until, at = self.to_timestamp(utc(now) + lease_for), self.to_timestamp(now)
        rows = await self.executemany_returning(
            LEASE_CHOSEN_TASK,
            [(until, owner, r.tenant_id, self._task_id(r.task_id), at, at) for r in refs],
        )
        return [None if row is None else self._task(row) for row in rows]

    async def extend_leases(
        self, refs: Sequence[TaskRef], *, owner: str, lease_until: datetime
    ) -> list[bool]:
        if not refs:
            return []
        rows = await self.executemany_returning(
            EXTEND_LEASE,
            [
                (self.to_timestamp(lease_until), r.tenant_id, self._task_id(r.task_id), owner)
                for r in refs
            ],
        )
        return [row is not None for row in rows]

    async def complete_tasks(self, refs: Sequence[TaskRef]) -> list[bool]:
        if not refs:
            return []
        rows = await self.executemany_returning(
            COMPLETE_TASK,
            [(r.tenant_id, self._task_id(r.task_id)) for r in refs],
        )
        return [row is not None for row in rows]

    async def finish_tasks(self, refs: Sequence[TaskRef]) -> None:
        if refs:
            await self.executemany(
                COMPLETE_TASK, [(r.tenant_id, self._task_id(r.task_id)) for r in refs]
            )

    async def release_tasks(self, refs: Sequence[TaskRef], *, available_at: datetime) -> int:
        if not refs:
            return 0
        rows = await self.executemany_returning(
            RELEASE_TASK,
            [
                (self.to_timestamp(available_at), r.tenant_id, self._task_id(r.task_id))
                for r in refs
            ],
        )
        return sum(row is not None for row in rows)

    async def drop_run_tasks(self, tenant_id: str, run_id: str) -> int:
        return await self.execute(DROP_RUN_TASKS, (tenant_id, run_id))

    async def clear_ended_runs(self, runs: Sequence[RunRef]) -> None:
        # `executemany`: nothing waits on them (Postgres queues them, see `PostgresTx`).
        rows = [(r.tenant_id, r.run_id) for r in runs]
        for sql in (DELETE_RUN_TIMERS, CLEAR_RUN_WAITS, DROP_RUN_TASKS):
            await self.executemany(sql, rows)

    async def purge_done_tasks(self, *, created_before: datetime, limit: int = 1000) -> int:
        return await self.execute(
            f"DELETE FROM tasks WHERE {self._lease_key} IN (SELECT {self._lease_cols} FROM tasks"
            " WHERE status = 'done' AND created_at < %s ORDER BY id LIMIT %s)",
            (self.to_timestamp(created_before), limit),
        )

    async def get_task(self, tenant_id: str, task_id: str) -> TaskRecord | None:
        key = self._task_id(task_id)
        if key is None:
            return None
        row = await self.fetch_one(
            f"SELECT {_TASK_COLS} FROM tasks WHERE tenant_id = %s AND id = %s", (tenant_id, key)
        )
        return None if row is None else self._task(row)

    async def count_tasks(self, *, now: datetime) -> dict[str, int]:
        at = self.to_timestamp(now)
        row = await self.fetch_one(
            "SELECT"
            " (SELECT COUNT(*) FROM tasks WHERE status = 'queued' AND available_at <= %s),"
            " (SELECT COUNT(*) FROM tasks WHERE status = 'queued' AND available_at > %s),"
            " (SELECT COUNT(*) FROM tasks WHERE status = 'leased')",
            (at, at),
        )
        ready, scheduled, leased = row if row is not None else (0, 0, 0)
        return {"ready": int(ready), "scheduled": int(scheduled), "leased": int(leased)}

    async def queue_depth(self, *, now: datetime, tenants: int) -> QueueDepth:
        at = self.to_timestamp(now)
        ready = "FROM tasks WHERE status = 'queued' AND available_at <= %s"
        tiers = await self.fetch_all(f"SELECT tier, COUNT(*) {ready} GROUP BY tier", (at,))
        rows = await self.fetch_all(
            f"SELECT tier, tenant_id, COUNT(*) {ready} GROUP BY tier, tenant_id"
            " ORDER BY 3 DESC, 1 DESC, 2 LIMIT %s",
            (at, max(tenants, 0)),
        )
        return QueueDepth(
            tiers={int(r[0]): int(r[1]) for r in tiers},
            tenants=[(int(r[0]), str(r[1]), int(r[2])) for r in rows],
        )

    # --- attempts -------------------------------------------------------------------

    async def record_attempts(self, attempts: Sequence[AttemptRecord]) -> list[bool]:
        return await (await self.record_attempts_later(attempts))()

    async def record_attempts_later(
        self, attempts: Sequence[AttemptRecord]
    ) -> Callable[[], Awaitable[list[bool]]]:
        later = await self.executemany_returning_later(
            RECORD_ATTEMPT,
            [
                (
                    a.tenant_id,
                    a.run_id,
                    a.step_ref,
                    a.item_index,
                    a.attempt,
                    a.ok,
                    self.to_json(a.output),
                    self.to_json(a.error),
                    self.to_timestamp(a.started_at),
                    self.to_timestamp(a.finished_at),
                )
                for a in attempts
            ],
        )

        async def fresh() -> list[bool]:
            return [row is not None for row in await later()]

        return fresh

    async def list_attempts(self, tenant_id: str, run_id: str) -> list[AttemptRecord]:
        rows = await self.fetch_all(
            f"SELECT {_ATTEMPT_COLS} FROM attempts WHERE tenant_id = %s AND run_id = %s"
            " ORDER BY started_at, step_ref, item_index, attempt",
            (tenant_id, run_id),
        )
        return [self._attempt(r) for r in rows]

    # --- timers ---------------------------------------------------------------------

    async def set_timers(self, timers: Sequence[TimerRecord]) -> None:
        if not timers:
            return
        await self.executemany(
            SET_TIMER,
            [(t.tenant_id, t.run_id, t.timer_id, self.to_timestamp(t.fire_at)) for t in timers],
        )

    async def delete_timers(self, refs: Sequence[TimerRef]) -> int:
        deleted = 0
        for chunk in _chunks(refs):
            params = [v for r in chunk for v in (r.tenant_id, r.run_id, r.timer_id)]
            deleted += await self.execute(
                "DELETE FROM timers WHERE (tenant_id, run_id, timer_id)"
                f" IN ({_tuples(len(chunk), 3)})",
                params,
            )
        return deleted

    async def delete_run_timers(self, tenant_id: str, run_id: str) -> int:
        return await self.execute(DELETE_RUN_TIMERS, (tenant_id, run_id))

    async def due_timers(self, *, now: datetime, limit: int) -> list[TimerRecord]:
        rows = await self.fetch_all(
            self.render(DUE_TIMERS),
            (self.to_timestamp(now), limit),
        )
        return [self._timer(r) for r in rows]

    async def next_timer_at(self) -> datetime | None:
        row = await self.fetch_one("SELECT MIN(fire_at) FROM timers")
        return None if row is None or row[0] is None else self.from_timestamp(row[0])

    async def list_run_timers(self, tenant_id: str, run_id: str) -> list[TimerRecord]:
        rows = await self.fetch_all(
            f"SELECT {_TIMER_COLS} FROM timers WHERE tenant_id = %s AND run_id = %s"
            " ORDER BY fire_at, timer_id",
            (tenant_id, run_id),
        )
        return [self._timer(r) for r in rows]

    # --- waits ----------------------------------------------------------------------

    async def add_waits(self, waits: Sequence[WaitRecord]) -> None:
        if not waits:
            return
        await self.executemany(
            f"INSERT INTO waits ({_WAIT_COLS}) VALUES (%s, %s, %s, %s, %s, %s)"
            " ON CONFLICT DO NOTHING",
            [
                (w.tenant_id, w.run_id, w.step_ref, w.kind, w.name, self.to_timestamp(w.created_at))
                for w in waits
            ],
        )

    async def clear_waits(self, refs: Sequence[WaitRef]) -> int:
        deleted = 0
        for chunk in _chunks(refs):
            params = [v for r in chunk for v in (r.tenant_id, r.run_id, r.step_ref)]
            deleted += await self.execute(
                "DELETE FROM waits WHERE (tenant_id, run_id, step_ref)"
                f" IN ({_tuples(len(chunk), 3)})",
                params,
            )
        return deleted

    async def clear_run_waits(self, tenant_id: str, run_id: str) -> int:
        return await self.execute(CLEAR_RUN_WAITS, (tenant_id, run_id))

    async def find_waits(self, tenant_id: str, *, kind: str, name: str) -> list[WaitRecord]:
        rows = await self.fetch_all(
            f"SELECT {_WAIT_COLS} FROM waits WHERE tenant_id = %s AND kind = %s AND name = %s"
            " ORDER BY created_at, run_id, step_ref",
            (tenant_id, kind, name),
        )
        return [self._wait(r) for r in rows]

    async def list_run_waits(self, tenant_id: str, run_id: str) -> list[WaitRecord]:
        rows = await self.fetch_all(
            f"SELECT {_WAIT_COLS} FROM waits WHERE tenant_id = %s AND run_id = %s"
            " ORDER BY created_at, step_ref, kind, name",
            (tenant_id, run_id),
        )
        return [self._wait(r) for r in rows]

    # --- events ---------------------------------------------------------------------

    async def insert_events(self, events: Sequence[EventRecord]) -> list[bool]:
        if not events:
            return []
        rows = await self.executemany_returning(
            f"INSERT INTO events ({_EVENT_COLS}) VALUES (%s, %s, %s, %s, %s)"
            " ON CONFLICT (tenant_id, id) DO NOTHING RETURNING id",
            [
                (e.tenant_id, e.id, e.name, self.to_json(e.data), self.to_timestamp(e.received_at))
                for e in events
            ],
        )
        return [row is not None for row in rows]

    async def purge_events(self, *, received_before: datetime, limit: int = 1000) -> int:
        # An event a run's inbox still names is kept: its data is read from here.
        field = "i.input->>'{}'" if self.backend == "postgres" else "json_extract(i.input, '$.{}')"
        return await self.execute(
            "DELETE FROM events WHERE (tenant_id, id) IN (SELECT tenant_id, id FROM events e"
            " WHERE received_at < %s AND NOT EXISTS (SELECT 1 FROM run_inbox i"
            f" WHERE i.tenant_id = e.tenant_id AND {field.format('type')} = 'event_received'"
            f" AND {field.format('event_id')} = e.id) ORDER BY received_at LIMIT %s)",
            (self.to_timestamp(received_before), limit),
        )

    async def get_event(self, tenant_id: str, event_id: str) -> EventRecord | None:
        row = await self.fetch_one(
            f"SELECT {_EVENT_COLS} FROM events WHERE tenant_id = %s AND id = %s",
            (tenant_id, event_id),
        )
        return None if row is None else self._event(row)

    # --- run history ----------------------------------------------------------------

    async def append_history(self, entries: Sequence[NewHistoryEntry]) -> None:
        if not entries:
            return
        await self.executemany(
            APPEND_HISTORY,
            [
                (e.tenant_id, e.run_id, self.to_timestamp(e.at), e.kind, self.to_json(e.data))
                for e in entries
            ],
        )

    async def list_history(
        self, tenant_id: str, run_id: str, *, after_seq: int = 0, limit: int = 1000
    ) -> list[HistoryRecord]:
        rows = await self.fetch_all(
            f"SELECT {_HISTORY_COLS} FROM run_history"
            " WHERE tenant_id = %s AND run_id = %s AND seq > %s ORDER BY seq LIMIT %s",
            (tenant_id, run_id, after_seq, limit),
        )
        return [self._history(r) for r in rows]

    # --- idempotency records --------------------------------------------------------

    async def get_idempotency(
        self, tenant_id: str, scope: str, key: str
    ) -> IdempotencyRecord | None:
        row = await self.fetch_one(
            f"SELECT {_IDEM_COLS} FROM idempotency_keys"
            " WHERE tenant_id = %s AND scope = %s AND key = %s",
            (tenant_id, scope, key),
        )
        return None if row is None else self._idem(row)

    async def put_idempotency(self, record: IdempotencyRecord) -> bool:
        row = await self.fetch_one(
            f"INSERT INTO idempotency_keys ({_IDEM_COLS}) VALUES (%s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (tenant_id, scope, key) DO NOTHING RETURNING key",
            (
                record.tenant_id,
                record.scope,
                record.key,
                record.request_hash,
                record.status_code,
                self.to_json(record.response),
                self.to_timestamp(record.created_at),
            ),
        )
        return row is not None

    async def claim_idempotency(self, record: IdempotencyRecord) -> IdempotencyRecord | None:
        # A housekeeping sweep may delete the holder's row between our INSERT and
        # SELECT; then the key is free again and the next round takes it.
        for _ in range(3):
            if await self.put_idempotency(record):
                return None
            found = await self.get_idempotency(record.tenant_id, record.scope, record.key)
            if found is not None:
                return found
        raise StoreError(f"idempotency key {record.key!r} kept changing hands")

    async def complete_idempotency(
        self, tenant_id: str, scope: str, key: str, *, status_code: int, response: Any
    ) -> None:
        changed = await self.execute(
            "UPDATE idempotency_keys SET status_code = %s, response = %s"
            " WHERE tenant_id = %s AND scope = %s AND key = %s",
            (status_code, self.to_json(response), tenant_id, scope, key),
        )
        if changed != 1:
            raise StoreError(f"idempotency key {key!r} was not claimed in this transaction")

    async def delete_idempotency_before(self, cutoff: datetime) -> int:
        return await self.execute(
            "DELETE FROM idempotency_keys WHERE created_at < %s", (self.to_timestamp(cutoff),)
        )


def _encode_cursor(created_at: datetime, run_id: str) -> str:
    raw = _encoder.encode((utc(created_at).isoformat(), run_id))
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, run_id = _cursor_decoder.decode(raw)
        return utc(datetime.fromisoformat(at)), run_id
    except (binascii.Error, msgspec.DecodeError, ValueError) as exc:
        raise InvalidCursor(f"invalid cursor {cursor!r}") from exc
