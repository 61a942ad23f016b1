-- Keys that match the lookups (Postgres flavour). The engine reaches runs, tasks
-- and inbox items by tenant and id, so those pairs are the primary keys; every
-- other index that could also answer such a lookup is narrowed so that it
-- cannot. A prepared statement's generic plan is made once, early, on a table
-- the planner has no statistics for: every index then looks equally cheap and
-- the planner keeps the one it met first, the most recently created. Made last,
-- the primary keys win such a tie; narrowed, the other indexes cannot enter it.
-- tests/storage/test_plans.py holds every statement the engine runs per step to
-- its index, under a forced generic plan, on a fresh and on a full database.

ALTER TABLE runs DROP CONSTRAINT runs_pkey;
ALTER TABLE runs ADD CONSTRAINT runs_pkey PRIMARY KEY (tenant_id, id);

-- Only dropping a finished run's queued tasks looks tasks up by run.
DROP INDEX tasks_by_run;
CREATE INDEX tasks_by_run ON tasks (tenant_id, run_id) WHERE status = 'queued';
-- Only taking over expired leases scans leased tasks, oldest lease first; a
-- lookup of one leased task by id does not imply `lease_until IS NOT NULL`.
DROP INDEX tasks_leased;
CREATE INDEX tasks_leased ON tasks (lease_until, id)
    WHERE status = 'leased' AND lease_until IS NOT NULL;
-- The idempotency key is only ever a conflict target: lead with it.
ALTER TABLE tasks DROP CONSTRAINT tasks_tenant_id_idempotency_key_key;
ALTER TABLE tasks ADD CONSTRAINT tasks_idempotency_key UNIQUE (idempotency_key, tenant_id);
ALTER TABLE tasks DROP CONSTRAINT tasks_pkey;
ALTER TABLE tasks ADD CONSTRAINT tasks_pkey PRIMARY KEY (tenant_id, id);

ALTER TABLE run_inbox DROP CONSTRAINT run_inbox_pkey;
ALTER TABLE run_inbox ADD CONSTRAINT run_inbox_pkey PRIMARY KEY (tenant_id, seq);
