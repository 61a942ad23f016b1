-- The inference proxy, SQLite flavour (migration range 0900-0919 belongs to AI).
-- `ai_settings`: a tenant's default upstream connection and timeout.
-- `ai_prices`: a tenant's price per model, in micros per million tokens.
-- `ai_requests`: one row per model call (a proxy request, or an ACTION on an
-- `openai` connection: `source`), with its tokens, latency, status and cost.
-- `source_key` dedupes an ACTION attempt delivered twice.

CREATE TABLE ai_settings (
    tenant_id TEXT PRIMARY KEY,
    default_connection TEXT,
    timeout_seconds REAL NOT NULL,
    updated_at TEXT NOT NULL
);

CREATE TABLE ai_prices (
    tenant_id TEXT NOT NULL,
    model TEXT NOT NULL,
    input_per_million INTEGER NOT NULL,
    output_per_million INTEGER NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, model)
);

CREATE TABLE ai_requests (
    tenant_id TEXT NOT NULL,
    id TEXT NOT NULL,
    source TEXT NOT NULL,
    source_key TEXT,
    kind TEXT NOT NULL,
    connection TEXT NOT NULL,
    model TEXT NOT NULL,
    stream INTEGER NOT NULL,
    status TEXT NOT NULL,
    http_status INTEGER NOT NULL,
    upstream_status INTEGER,
    error_code TEXT,
    tokens_in INTEGER NOT NULL,
    tokens_out INTEGER NOT NULL,
    usage_source TEXT NOT NULL,
    latency_ms REAL NOT NULL,
    cost_micros INTEGER NOT NULL,
    priced INTEGER NOT NULL,
    run_id TEXT,
    step_ref TEXT,
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX ai_requests_by_time ON ai_requests (tenant_id, created_at DESC, id DESC);
CREATE UNIQUE INDEX ai_requests_by_source_key ON ai_requests (tenant_id, source_key)
    WHERE source_key IS NOT NULL;
