-- Narrower task indexes (SQLite flavour), as in the Postgres migration: only
-- dropping a finished run's queued tasks looks tasks up by run, and only taking
-- over expired leases scans leased tasks, oldest lease first. Lookups by tenant
-- and id already use the rowid (tasks) or the unique id (runs) here.

DROP INDEX tasks_by_run;
CREATE INDEX tasks_by_run ON tasks (tenant_id, run_id) WHERE status = 'queued';
DROP INDEX tasks_leased;
CREATE INDEX tasks_leased ON tasks (lease_until, id)
    WHERE status = 'leased' AND lease_until IS NOT NULL;
