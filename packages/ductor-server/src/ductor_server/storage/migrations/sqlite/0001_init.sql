-- Ductor schema, SQLite flavour. Timestamps are fixed-width ISO-8601 UTC text
-- (text order is time order); JSON is text. Every tenant-owned row has tenant_id.

CREATE TABLE tenants (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    created_at TEXT NOT NULL
);

CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    name TEXT NOT NULL,
    prefix TEXT NOT NULL,
    key_hash TEXT NOT NULL UNIQUE,
    created_at TEXT NOT NULL,
    revoked_at TEXT
);
CREATE INDEX api_keys_by_tenant ON api_keys (tenant_id, created_at);

CREATE TABLE workflow_versions (
    tenant_id TEXT NOT NULL,
    family_slug TEXT NOT NULL,
    version INTEGER NOT NULL,
    hash TEXT NOT NULL,
    definition TEXT NOT NULL,
    trigger_events TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, family_slug, version),
    UNIQUE (tenant_id, family_slug, hash)
);

CREATE TABLE workflow_triggers (
    tenant_id TEXT NOT NULL,
    event_name TEXT NOT NULL,
    family_slug TEXT NOT NULL,
    version INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, event_name, family_slug, version)
);

CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    family_slug TEXT NOT NULL,
    version INTEGER NOT NULL,
    status TEXT NOT NULL,
    state TEXT NOT NULL,
    lock_version INTEGER NOT NULL DEFAULT 0,
    input TEXT,
    output TEXT,
    error TEXT,
    parent_run_id TEXT,
    parent_step_ref TEXT,
    parent_item_index INTEGER NOT NULL DEFAULT -1,
    child_key TEXT,
    idempotency_key TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    finished_at TEXT
);
CREATE UNIQUE INDEX runs_by_child_key ON runs (tenant_id, child_key) WHERE child_key IS NOT NULL;
CREATE UNIQUE INDEX runs_by_idempotency_key ON runs (tenant_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX runs_by_tenant ON runs (tenant_id, created_at, id);
CREATE INDEX runs_by_status ON runs (tenant_id, status, created_at, id);
CREATE INDEX runs_by_family ON runs (tenant_id, family_slug, created_at, id);
CREATE INDEX runs_by_parent ON runs (tenant_id, parent_run_id) WHERE parent_run_id IS NOT NULL;

CREATE TABLE run_inbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    input TEXT NOT NULL,
    available_at TEXT NOT NULL
);
CREATE INDEX run_inbox_by_run ON run_inbox (tenant_id, run_id, seq);
CREATE INDEX run_inbox_by_time ON run_inbox (available_at);

CREATE TABLE tasks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    step_ref TEXT NOT NULL,
    item_index INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    step_type TEXT NOT NULL,
    handler TEXT NOT NULL,
    payload TEXT,
    idempotency_key TEXT NOT NULL,
    timeout_seconds REAL,
    tier INTEGER NOT NULL DEFAULT 0,
    status TEXT NOT NULL,
    available_at TEXT NOT NULL,
    lease_owner TEXT,
    lease_until TEXT,
    deliveries INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL,
    UNIQUE (tenant_id, idempotency_key)
);
CREATE INDEX tasks_ready ON tasks (tier DESC, available_at, id) WHERE status = 'queued';
CREATE INDEX tasks_leased ON tasks (lease_until) WHERE status = 'leased';
CREATE INDEX tasks_by_run ON tasks (tenant_id, run_id);
CREATE INDEX tasks_done ON tasks (created_at) WHERE status = 'done';

CREATE TABLE attempts (
    tenant_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    step_ref TEXT NOT NULL,
    item_index INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    ok INTEGER NOT NULL,
    output TEXT,
    error TEXT,
    started_at TEXT NOT NULL,
    finished_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, run_id, step_ref, item_index, attempt)
);

CREATE TABLE timers (
    tenant_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    timer_id TEXT NOT NULL,
    fire_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, run_id, timer_id)
);
CREATE INDEX timers_by_time ON timers (fire_at);

CREATE TABLE waits (
    tenant_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    step_ref TEXT NOT NULL,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, run_id, step_ref, kind, name)
);
CREATE INDEX waits_by_name ON waits (tenant_id, kind, name);

CREATE TABLE events (
    tenant_id TEXT NOT NULL,
    id TEXT NOT NULL,
    name TEXT NOT NULL,
    data TEXT,
    received_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX events_by_age ON events (received_at);

CREATE TABLE run_history (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    at TEXT NOT NULL,
    kind TEXT NOT NULL,
    data TEXT
);
CREATE INDEX run_history_by_run ON run_history (tenant_id, run_id, seq);

CREATE TABLE idempotency_keys (
    tenant_id TEXT NOT NULL,
    scope TEXT NOT NULL,
    key TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    status_code INTEGER NOT NULL,
    response TEXT,
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, scope, key)
);
CREATE INDEX idempotency_keys_by_age ON idempotency_keys (created_at);
