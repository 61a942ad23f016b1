-- The fair queue's epoch (SQLite flavour): a random name drawn once per
-- database. The Redis queue keeps its keys under it, so a Redis that served
-- another database is never taken for this database's queue.

ALTER TABLE queue_fence ADD COLUMN epoch text NOT NULL DEFAULT '';
UPDATE queue_fence SET epoch = lower(hex(randomblob(8)));
