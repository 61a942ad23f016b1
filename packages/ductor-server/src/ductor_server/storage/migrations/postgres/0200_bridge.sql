-- Bridge app registry (Postgres flavour): apps that host SDK workflows, their
-- workflows and the events that trigger them. Timestamps are timestamptz.

CREATE TABLE bridge_apps (
    tenant_id text NOT NULL,
    app_id text NOT NULL,
    url text,
    describe text NOT NULL,
    synced_at timestamptz NOT NULL,
    last_seen_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, app_id)
);

CREATE TABLE bridge_workflows (
    tenant_id text NOT NULL,
    app_id text NOT NULL,
    workflow_id text NOT NULL,
    version integer NOT NULL,
    hash text NOT NULL,
    info text NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, app_id, workflow_id)
);

CREATE TABLE bridge_triggers (
    tenant_id text NOT NULL,
    event_name text NOT NULL,
    app_id text NOT NULL,
    workflow_id text NOT NULL,
    PRIMARY KEY (tenant_id, event_name, app_id, workflow_id)
);
