-- A run's own limits in the fair task queue (SQLite flavour): its workflow's
-- `concurrency` option (a DAG definition's, or an SDK workflow's) as it stood
-- when the run was created, with the option's CEL `key` evaluated once over the
-- run's input. The queue reads them with each ready task (tasks join their run)
-- and only compares `limit_key` strings: tasks of one tenant, workflow and
-- limit key share `key_concurrency` (tasks leased at once) and `key_rate` /
-- `key_burst` (starts per second, and at once). NULL `limit_key`: no limits.
-- Runs stored before this migration have none.

ALTER TABLE runs ADD COLUMN limit_key TEXT;
ALTER TABLE runs ADD COLUMN key_concurrency INTEGER;
ALTER TABLE runs ADD COLUMN key_rate REAL;
ALTER TABLE runs ADD COLUMN key_burst INTEGER NOT NULL DEFAULT 1;
