-- Cron triggers of SDK workflows (SQLite flavour): one row per (workflow,
-- cron expression) an app's last sync declared. `next_at` is the next time the
-- expression falls due; the timer loop starts a run then and moves it on.

CREATE TABLE bridge_schedules (
    tenant_id TEXT NOT NULL,
    app_id TEXT NOT NULL,
    workflow_id TEXT NOT NULL,
    cron TEXT NOT NULL,
    next_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, app_id, workflow_id, cron)
);

CREATE INDEX bridge_schedules_by_next_at ON bridge_schedules (next_at);
