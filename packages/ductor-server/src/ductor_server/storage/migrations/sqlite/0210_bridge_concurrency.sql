-- Bridge concurrency slots (SQLite flavour): one row per live run of an SDK
-- workflow that declares `concurrency`. `active` rows (1) hold a slot; the
-- others wait and are admitted oldest `seq` first when a slot frees.

CREATE TABLE bridge_concurrency (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    family_slug TEXT NOT NULL,
    conc_key TEXT NOT NULL,
    active INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    UNIQUE (tenant_id, run_id)
);

CREATE INDEX bridge_concurrency_by_key
    ON bridge_concurrency (tenant_id, family_slug, conc_key, active, seq);
