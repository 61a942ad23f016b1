-- The fair queue's epoch (Postgres flavour): a random name drawn once per
-- database. The Redis queue keeps its keys under it (with the database's oid,
-- which a restore into a new database changes), so a Redis that served another
-- database, or this one before it was restored from a dump, is never taken for
-- this database's queue.

ALTER TABLE queue_fence ADD COLUMN epoch text NOT NULL DEFAULT '';
UPDATE queue_fence SET epoch = substr(md5(random()::text || clock_timestamp()::text), 1, 16);
