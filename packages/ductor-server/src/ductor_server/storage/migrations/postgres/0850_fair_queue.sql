-- The fair queue learns of newly queued tasks by id (`Tx.ready_tasks` with a
-- cursor); this index answers that without reading the whole ready queue.
CREATE INDEX tasks_queued_by_id ON tasks (id) WHERE status = 'queued';
-- A generic plan on a fresh table keeps the most recently made of two equally
-- cheap indexes (see 0500): remake the one dropping a run's tasks uses, so
-- that it stays the newest index that can answer that lookup.
DROP INDEX tasks_by_run;
CREATE INDEX tasks_by_run ON tasks (tenant_id, run_id) WHERE status = 'queued';
