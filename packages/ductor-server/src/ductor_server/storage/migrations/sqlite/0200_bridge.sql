-- Bridge app registry (SQLite flavour): apps that host SDK workflows, their
-- workflows and the events that trigger them. Timestamps are ISO-8601 UTC text.

CREATE TABLE bridge_apps (
    tenant_id TEXT NOT NULL,
    app_id TEXT NOT NULL,
    url TEXT,
    describe TEXT NOT NULL,
    synced_at TEXT NOT NULL,
    last_seen_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, app_id)
);

CREATE TABLE bridge_workflows (
    tenant_id TEXT NOT NULL,
    app_id TEXT NOT NULL,
    workflow_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    hash TEXT NOT NULL,
    info TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, app_id, workflow_id)
);

CREATE TABLE bridge_triggers (
    tenant_id TEXT NOT NULL,
    event_name TEXT NOT NULL,
    app_id TEXT NOT NULL,
    workflow_id TEXT NOT NULL,
    PRIMARY KEY (tenant_id, event_name, app_id, workflow_id)
);
