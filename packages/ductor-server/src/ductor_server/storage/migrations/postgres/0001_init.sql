-- Ductor schema, PostgreSQL flavour. Timestamps are timestamptz, JSON is jsonb.
-- Every tenant-owned row has tenant_id.

CREATE TABLE tenants (
    id text PRIMARY KEY,
    name text NOT NULL,
    created_at timestamptz NOT NULL
);

CREATE TABLE api_keys (
    id text PRIMARY KEY,
    tenant_id text NOT NULL,
    name text NOT NULL,
    prefix text NOT NULL,
    key_hash text NOT NULL UNIQUE,
    created_at timestamptz NOT NULL,
    revoked_at timestamptz
);
CREATE INDEX api_keys_by_tenant ON api_keys (tenant_id, created_at);

CREATE TABLE workflow_versions (
    tenant_id text NOT NULL,
    family_slug text NOT NULL,
    version integer NOT NULL,
    hash text NOT NULL,
    definition jsonb NOT NULL,
    trigger_events jsonb NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, family_slug, version),
    UNIQUE (tenant_id, family_slug, hash)
);

CREATE TABLE workflow_triggers (
    tenant_id text NOT NULL,
    event_name text NOT NULL,
    family_slug text NOT NULL,
    version integer NOT NULL,
    PRIMARY KEY (tenant_id, event_name, family_slug, version)
);

CREATE TABLE runs (
    id text PRIMARY KEY,
    tenant_id text NOT NULL,
    family_slug text NOT NULL,
    version integer NOT NULL,
    status text NOT NULL,
    state jsonb NOT NULL,
    lock_version bigint NOT NULL DEFAULT 0,
    input jsonb,
    output jsonb,
    error jsonb,
    parent_run_id text,
    parent_step_ref text,
    parent_item_index integer NOT NULL DEFAULT -1,
    child_key text,
    idempotency_key text,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    finished_at timestamptz
);
CREATE UNIQUE INDEX runs_by_child_key ON runs (tenant_id, child_key) WHERE child_key IS NOT NULL;
CREATE UNIQUE INDEX runs_by_idempotency_key ON runs (tenant_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX runs_by_tenant ON runs (tenant_id, created_at, id);
CREATE INDEX runs_by_status ON runs (tenant_id, status, created_at, id);
CREATE INDEX runs_by_family ON runs (tenant_id, family_slug, created_at, id);
CREATE INDEX runs_by_parent ON runs (tenant_id, parent_run_id) WHERE parent_run_id IS NOT NULL;

CREATE TABLE run_inbox (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id text NOT NULL,
    run_id text NOT NULL,
    input jsonb NOT NULL,
    available_at timestamptz NOT NULL
);
CREATE INDEX run_inbox_by_run ON run_inbox (tenant_id, run_id, seq);
CREATE INDEX run_inbox_by_time ON run_inbox (available_at);
ALTER TABLE run_inbox SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 500);

CREATE TABLE tasks (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id text NOT NULL,
    run_id text NOT NULL,
    step_ref text NOT NULL,
    item_index integer NOT NULL,
    attempt integer NOT NULL,
    step_type text NOT NULL,
    handler text NOT NULL,
    payload jsonb,
    idempotency_key text NOT NULL,
    timeout_seconds double precision,
    tier integer NOT NULL DEFAULT 0,
    status text NOT NULL CHECK (status IN ('queued', 'leased', 'done')),
    available_at timestamptz NOT NULL,
    lease_owner text,
    lease_until timestamptz,
    deliveries integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL,
    UNIQUE (tenant_id, idempotency_key)
);
CREATE INDEX tasks_ready ON tasks (tier DESC, available_at, id) WHERE status = 'queued';
CREATE INDEX tasks_leased ON tasks (lease_until) WHERE status = 'leased';
CREATE INDEX tasks_by_run ON tasks (tenant_id, run_id);
CREATE INDEX tasks_done ON tasks (created_at) WHERE status = 'done';
-- Queue tables churn: vacuum them early so dead index entries do not slow leasing.
ALTER TABLE tasks SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 500);

CREATE TABLE attempts (
    tenant_id text NOT NULL,
    run_id text NOT NULL,
    step_ref text NOT NULL,
    item_index integer NOT NULL,
    attempt integer NOT NULL,
    ok boolean NOT NULL,
    output jsonb,
    error jsonb,
    started_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, run_id, step_ref, item_index, attempt)
);

CREATE TABLE timers (
    tenant_id text NOT NULL,
    run_id text NOT NULL,
    timer_id text NOT NULL,
    fire_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, run_id, timer_id)
);
CREATE INDEX timers_by_time ON timers (fire_at);
ALTER TABLE timers SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 500);

CREATE TABLE waits (
    tenant_id text NOT NULL,
    run_id text NOT NULL,
    step_ref text NOT NULL,
    kind text NOT NULL,
    name text NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, run_id, step_ref, kind, name)
);
CREATE INDEX waits_by_name ON waits (tenant_id, kind, name);

CREATE TABLE events (
    tenant_id text NOT NULL,
    id text NOT NULL,
    name text NOT NULL,
    data jsonb,
    received_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX events_by_age ON events (received_at);

CREATE TABLE run_history (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id text NOT NULL,
    run_id text NOT NULL,
    at timestamptz NOT NULL,
    kind text NOT NULL,
    data jsonb
);
CREATE INDEX run_history_by_run ON run_history (tenant_id, run_id, seq);

CREATE TABLE idempotency_keys (
    tenant_id text NOT NULL,
    scope text NOT NULL,
    key text NOT NULL,
    request_hash text NOT NULL,
    status_code integer NOT NULL,
    response jsonb,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, scope, key)
);
CREATE INDEX idempotency_keys_by_age ON idempotency_keys (created_at);
