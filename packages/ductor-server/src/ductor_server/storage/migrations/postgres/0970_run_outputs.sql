-- A step's output larger than OUTLINE_BYTES is written once, when the step
-- succeeds, to a row of its own; the run's state, rewritten at every tick, keeps
-- only the list of such outputs (runs.outlined, [step_ref, item_index] pairs)
-- and the store puts them back when it reads the run.
CREATE TABLE run_outputs (
    tenant_id text NOT NULL,
    run_id text NOT NULL,
    step_ref text NOT NULL,
    item_index integer NOT NULL,
    output jsonb,
    PRIMARY KEY (tenant_id, run_id, step_ref, item_index)
);
ALTER TABLE runs ADD COLUMN outlined jsonb;
