-- Signed receipts, SQLite flavour (migration range 0810-0819 belongs to receipts).
-- One receipt per (tenant, subject): an assignment or a run is proven once, so a
-- retried issue finds the row instead of signing again. `envelope` is the DSSE
-- envelope exactly as signed (JSON text; its payload is the canonical receipt).

CREATE TABLE receipts (
    tenant_id TEXT NOT NULL,
    id TEXT NOT NULL,
    subject_kind TEXT NOT NULL CHECK (subject_kind IN ('assignment', 'run')),
    subject_id TEXT NOT NULL,
    key_id TEXT NOT NULL,
    envelope TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, id),
    UNIQUE (tenant_id, subject_kind, subject_id)
);
CREATE INDEX receipts_by_time ON receipts (tenant_id, created_at, id);
