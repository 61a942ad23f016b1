-- The fair queue learns of newly queued tasks by id (`Tx.ready_tasks` with a
-- cursor); on SQLite the id is the rowid, which already answers that. This
-- migration keeps the version numbers of both backends in step.
SELECT 1;
