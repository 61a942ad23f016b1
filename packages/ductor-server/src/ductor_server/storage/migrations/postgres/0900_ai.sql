-- The inference proxy, PostgreSQL flavour (migration range 0900-0919 belongs to AI).
-- `ai_settings`: a tenant's default upstream connection and timeout.
-- `ai_prices`: a tenant's price per model, in micros per million tokens.
-- `ai_requests`: one row per model call (a proxy request, or an ACTION on an
-- `openai` connection: `source`), with its tokens, latency, status and cost.
-- `source_key` dedupes an ACTION attempt delivered twice.

CREATE TABLE ai_settings (
    tenant_id text PRIMARY KEY,
    default_connection text,
    timeout_seconds double precision NOT NULL,
    updated_at timestamptz NOT NULL
);

CREATE TABLE ai_prices (
    tenant_id text NOT NULL,
    model text NOT NULL,
    input_per_million bigint NOT NULL,
    output_per_million bigint NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, model)
);

CREATE TABLE ai_requests (
    tenant_id text NOT NULL,
    id text NOT NULL,
    source text NOT NULL,
    source_key text,
    kind text NOT NULL,
    connection text NOT NULL,
    model text NOT NULL,
    stream boolean NOT NULL,
    status text NOT NULL,
    http_status integer NOT NULL,
    upstream_status integer,
    error_code text,
    tokens_in bigint NOT NULL,
    tokens_out bigint NOT NULL,
    usage_source text NOT NULL,
    latency_ms double precision NOT NULL,
    cost_micros bigint NOT NULL,
    priced boolean NOT NULL,
    run_id text,
    step_ref text,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX ai_requests_by_time ON ai_requests (tenant_id, created_at DESC, id DESC);
CREATE UNIQUE INDEX ai_requests_by_source_key ON ai_requests (tenant_id, source_key)
    WHERE source_key IS NOT NULL;
