-- Cron triggers of SDK workflows (Postgres flavour): one row per (workflow,
-- cron expression) an app's last sync declared. `next_at` is the next time the
-- expression falls due; the timer loop starts a run then and moves it on.

CREATE TABLE bridge_schedules (
    tenant_id text NOT NULL,
    app_id text NOT NULL,
    workflow_id text NOT NULL,
    cron text NOT NULL,
    next_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, app_id, workflow_id, cron)
);

CREATE INDEX bridge_schedules_by_next_at ON bridge_schedules (next_at);
