-- Bridge concurrency slots (Postgres flavour): one row per live run of an SDK
-- workflow that declares `concurrency`. `active` rows hold a slot; the others
-- wait and are admitted oldest `seq` first when a slot frees.

CREATE TABLE bridge_concurrency (
    tenant_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    family_slug TEXT NOT NULL,
    conc_key TEXT NOT NULL,
    seq BIGINT GENERATED ALWAYS AS IDENTITY,
    active BOOLEAN NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (tenant_id, run_id)
);

CREATE INDEX bridge_concurrency_by_key
    ON bridge_concurrency (tenant_id, family_slug, conc_key, active, seq);
