-- A step's output larger than OUTLINE_BYTES is written once, when the step
-- succeeds, to a row of its own; the run's state keeps only the list of such
-- outputs (runs.outlined) and the store puts them back when it reads the run.
CREATE TABLE run_outputs (
    tenant_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    step_ref TEXT NOT NULL,
    item_index INTEGER NOT NULL,
    output TEXT,
    PRIMARY KEY (tenant_id, run_id, step_ref, item_index)
);
ALTER TABLE runs ADD COLUMN outlined TEXT;
