-- Pool settlement and returns, SQLite flavour (migration range 0800-0899).
-- A pool's settlement setting is kept beside the routing configuration (its
-- changes bump the routing generation); a settled assignment keeps its charge
-- entry (or, in hold mode, the postings to write when it completes) and the
-- routable (to route it again on a return); a return records the credit entry
-- it wrote. Every row has tenant_id.

CREATE TABLE settlement_pools (
    tenant_id TEXT NOT NULL,
    id TEXT NOT NULL,
    body TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, id)
);

CREATE TABLE settlement_charges (
    tenant_id TEXT NOT NULL,
    assignment_id TEXT NOT NULL,
    entry_id TEXT,
    postings TEXT,
    routable TEXT NOT NULL,
    created_at TEXT NOT NULL,
    config_hash TEXT,
    PRIMARY KEY (tenant_id, assignment_id)
);

CREATE TABLE settlement_returns (
    tenant_id TEXT NOT NULL,
    id TEXT NOT NULL,
    assignment_id TEXT NOT NULL,
    pool TEXT NOT NULL,
    buyer TEXT NOT NULL,
    reason TEXT NOT NULL,
    amount INTEGER NOT NULL,
    currency TEXT NOT NULL,
    entry_id TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX settlement_returns_by_buyer ON settlement_returns (tenant_id, pool, buyer, created_at);
CREATE INDEX settlement_returns_by_assignment ON settlement_returns (tenant_id, assignment_id);
CREATE INDEX routing_assignments_by_pool_worker
    ON routing_assignments (tenant_id, pool, worker, created_at);
