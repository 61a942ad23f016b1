-- Routing tables, PostgreSQL flavour (migration range 0100-0199 belongs to routing).
-- Every row has tenant_id; counters and marks are the live routing state.

CREATE TABLE routing_generations (
    tenant_id text PRIMARY KEY,
    generation bigint NOT NULL
);

CREATE TABLE routing_workers (
    tenant_id text NOT NULL,
    id text NOT NULL,
    body jsonb NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, id)
);

CREATE TABLE routing_pools (
    tenant_id text NOT NULL,
    id text NOT NULL,
    body jsonb NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, id)
);

CREATE TABLE routing_rule_sets (
    tenant_id text NOT NULL,
    version integer NOT NULL,
    body jsonb NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, version)
);

CREATE TABLE routing_decisions (
    tenant_id text NOT NULL,
    id text NOT NULL,
    routable_id text NOT NULL,
    outcome text NOT NULL,
    pool text,
    worker text,
    charge bigint NOT NULL,
    body jsonb NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX routing_decisions_by_pool ON routing_decisions (tenant_id, pool, created_at);

CREATE TABLE routing_assignments (
    tenant_id text NOT NULL,
    id text NOT NULL,
    decision_id text NOT NULL,
    routable_id text NOT NULL,
    pool text NOT NULL,
    worker text NOT NULL,
    channel text NOT NULL,
    charge bigint NOT NULL,
    status text NOT NULL,
    reservations jsonb NOT NULL,
    origin text,
    result jsonb,
    reason text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
CREATE UNIQUE INDEX routing_assignments_by_origin ON routing_assignments (tenant_id, origin)
    WHERE origin IS NOT NULL;

CREATE TABLE routing_counters (
    tenant_id text NOT NULL,
    key text NOT NULL,
    value bigint NOT NULL,
    PRIMARY KEY (tenant_id, key)
);

CREATE TABLE routing_marks (
    tenant_id text NOT NULL,
    kind text NOT NULL,
    scope text NOT NULL,
    key text NOT NULL,
    value text NOT NULL,
    PRIMARY KEY (tenant_id, kind, scope, key)
);

CREATE INDEX routing_assignments_by_routable ON routing_assignments (tenant_id, routable_id);
