-- A run's state is rewritten at every tick and read at the next; past about
-- 2 kB Postgres compresses it, with pglz unless told otherwise. lz4 compresses
-- and decompresses several times faster for about the same size. Builds
-- without lz4 keep pglz.

DO $$ BEGIN IF EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN EXECUTE 'ALTER TABLE runs ALTER COLUMN state SET COMPRESSION lz4'; END IF; END $$;
