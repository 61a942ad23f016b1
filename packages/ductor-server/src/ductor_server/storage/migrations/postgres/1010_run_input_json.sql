-- A run's input is kept once, in this column, and no longer also in its state,
-- which every tick rewrites (a 500 kB input was written again at every step).
-- Reading a run puts it back into the state, so the input a tick sees must be
-- the JSON as it was sent: json keeps the text as written, where jsonb reorders
-- an object's keys. Runs stored before keep their input in their state too.

ALTER TABLE runs ALTER COLUMN input TYPE json USING input::json;
