-- Operators' per-tenant fair queue policies (SQLite flavour), set through
-- `PUT /v1/admin/tenants/{tenant}/queue-policy`: a tenant's weight, tier and
-- limits, in place of what `DUCTOR_FAIRNESS` says for it. Every queue reads
-- the table again when told of a change, and at least every few seconds.

CREATE TABLE queue_policies (
    tenant_id TEXT PRIMARY KEY,
    policy TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
