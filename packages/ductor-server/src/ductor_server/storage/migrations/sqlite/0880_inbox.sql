-- The inbox: notifications per tenant and subscriber, SQLite flavour.
-- Every notification and every change to one takes the subscriber's next sequence
-- number (inbox_subscribers.last_seq, bumped under its row lock, so a subscriber's
-- changes commit in sequence order); inbox_changes keeps each change with the
-- notification as it became, so a client that reconnects reads exactly what it missed.
-- A group is the notifications one NOTIFY step created: its first clicked action wins.

CREATE TABLE inbox_secrets (
    tenant_id TEXT PRIMARY KEY,
    secret TEXT NOT NULL,
    rotated_at TEXT NOT NULL
);

CREATE TABLE inbox_subscribers (
    tenant_id TEXT NOT NULL,
    subscriber_id TEXT NOT NULL,
    last_seq INTEGER NOT NULL DEFAULT 0,
    preferences TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (tenant_id, subscriber_id)
);

CREATE TABLE inbox_notifications (
    tenant_id TEXT NOT NULL,
    id TEXT NOT NULL,
    subscriber_id TEXT NOT NULL,
    feed TEXT NOT NULL,
    title TEXT NOT NULL,
    body TEXT NOT NULL,
    data TEXT,
    avatar TEXT,
    ctas TEXT NOT NULL,
    workflow TEXT,
    run_id TEXT,
    step_ref TEXT,
    group_id TEXT,
    created_at TEXT NOT NULL,
    seen_at TEXT,
    read_at TEXT,
    archived_at TEXT,
    snoozed_until TEXT,
    acted TEXT,
    seq INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX inbox_notifications_by_subscriber
    ON inbox_notifications (tenant_id, subscriber_id, created_at, id);
CREATE INDEX inbox_notifications_snoozed
    ON inbox_notifications (snoozed_until) WHERE snoozed_until IS NOT NULL;

CREATE TABLE inbox_groups (
    tenant_id TEXT NOT NULL,
    group_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    step_ref TEXT NOT NULL,
    await_action INTEGER NOT NULL,
    acted TEXT,
    PRIMARY KEY (tenant_id, group_id)
);

CREATE TABLE inbox_changes (
    tenant_id TEXT NOT NULL,
    subscriber_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('created', 'updated', 'deleted')),
    notification_id TEXT NOT NULL,
    notification TEXT,
    at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, subscriber_id, seq)
);
