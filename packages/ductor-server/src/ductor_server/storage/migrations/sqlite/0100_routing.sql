-- Routing tables, SQLite flavour (migration range 0100-0199 belongs to routing).
-- Every row has tenant_id; counters and marks are the live routing state.

CREATE TABLE routing_generations (
    tenant_id TEXT PRIMARY KEY,
    generation INTEGER NOT NULL
);

CREATE TABLE routing_workers (
    tenant_id TEXT NOT NULL,
    id TEXT NOT NULL,
    body TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, id)
);

CREATE TABLE routing_pools (
    tenant_id TEXT NOT NULL,
    id TEXT NOT NULL,
    body TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, id)
);

CREATE TABLE routing_rule_sets (
    tenant_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    body TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, version)
);

CREATE TABLE routing_decisions (
    tenant_id TEXT NOT NULL,
    id TEXT NOT NULL,
    routable_id TEXT NOT NULL,
    outcome TEXT NOT NULL,
    pool TEXT,
    worker TEXT,
    charge INTEGER NOT NULL,
    body TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX routing_decisions_by_pool ON routing_decisions (tenant_id, pool, created_at);

CREATE TABLE routing_assignments (
    tenant_id TEXT NOT NULL,
    id TEXT NOT NULL,
    decision_id TEXT NOT NULL,
    routable_id TEXT NOT NULL,
    pool TEXT NOT NULL,
    worker TEXT NOT NULL,
    channel TEXT NOT NULL,
    charge INTEGER NOT NULL,
    status TEXT NOT NULL,
    reservations TEXT NOT NULL,
    origin TEXT,
    result TEXT,
    reason TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
CREATE UNIQUE INDEX routing_assignments_by_origin ON routing_assignments (tenant_id, origin)
    WHERE origin IS NOT NULL;

CREATE TABLE routing_counters (
    tenant_id TEXT NOT NULL,
    key TEXT NOT NULL,
    value INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, key)
);

CREATE TABLE routing_marks (
    tenant_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    scope TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (tenant_id, kind, scope, key)
);

CREATE INDEX routing_assignments_by_routable ON routing_assignments (tenant_id, routable_id);
