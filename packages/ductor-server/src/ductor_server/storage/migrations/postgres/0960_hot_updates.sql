-- A run's row is rewritten at every tick. With full pages (the default
-- fillfactor of 100) the new version lands on another page, and every index of
-- the table gets a new entry for it. Room left on each page lets Postgres keep
-- the new version beside the old one (a heap-only tuple update): no index entry,
-- and the WAL record holds only the bytes that changed.
ALTER TABLE runs SET (fillfactor = 50);
