-- Pool settlement and returns, PostgreSQL flavour (migration range 0800-0899).
-- A pool's settlement setting is kept beside the routing configuration (its
-- changes bump the routing generation); a settled assignment keeps its charge
-- entry (or, in hold mode, the postings to write when it completes) and the
-- routable (to route it again on a return); a return records the credit entry
-- it wrote. Every row has tenant_id.

CREATE TABLE settlement_pools (
    tenant_id text NOT NULL,
    id text NOT NULL,
    body jsonb NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, id)
);

CREATE TABLE settlement_charges (
    tenant_id text NOT NULL,
    assignment_id text NOT NULL,
    entry_id text,
    postings jsonb,
    routable jsonb NOT NULL,
    created_at timestamptz NOT NULL,
    config_hash text,
    PRIMARY KEY (tenant_id, assignment_id)
);

CREATE TABLE settlement_returns (
    tenant_id text NOT NULL,
    id text NOT NULL,
    assignment_id text NOT NULL,
    pool text NOT NULL,
    buyer text NOT NULL,
    reason text NOT NULL,
    amount bigint NOT NULL,
    currency text NOT NULL,
    entry_id text NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX settlement_returns_by_buyer ON settlement_returns (tenant_id, pool, buyer, created_at);
CREATE INDEX settlement_returns_by_assignment ON settlement_returns (tenant_id, assignment_id);
CREATE INDEX routing_assignments_by_pool_worker
    ON routing_assignments (tenant_id, pool, worker, created_at);
