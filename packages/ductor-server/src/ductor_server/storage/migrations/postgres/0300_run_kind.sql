-- Run kinds (Postgres flavour): which engine kind ticks a run ('dag' for
-- published definitions, 'bridge' for SDK-hosted workflows), and the kind's
-- own bookkeeping, kept apart from the run state the API shows.
-- Runs stored before this migration get their kind from the family slug; a
-- bridge run's bookkeeping stays in its old place until its next tick moves it.

ALTER TABLE runs ADD COLUMN kind text NOT NULL DEFAULT 'dag';
ALTER TABLE runs ADD COLUMN kind_state jsonb;
UPDATE runs SET kind = 'bridge' WHERE family_slug LIKE 'bridge:%';
