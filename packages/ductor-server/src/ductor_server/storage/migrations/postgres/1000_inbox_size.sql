-- The length of each inbox input's JSON, written with it. A tick takes a run's
-- inputs in order up to a total length (see `Tx.load_inbox`), so a flood of large
-- signals or results is ticked a few megabytes at a time: loading them all at
-- once, 1,000 signals of 900 kB took the server to 3 GB. Rows stored before this
-- count as 0 (their tick takes them by number alone, as before).

ALTER TABLE run_inbox ADD COLUMN size integer NOT NULL DEFAULT 0;
