-- Poison-task quarantine (Postgres flavour): how many times a task's lease
-- expired without the task being completed or released, i.e. how many times
-- the process running it died (or stalled past its lease) with it in flight.
-- Counted by the statement that takes an expired lease; a worker quarantines a
-- task leased with too many deaths instead of running it again.

ALTER TABLE tasks ADD COLUMN deaths integer NOT NULL DEFAULT 0;
