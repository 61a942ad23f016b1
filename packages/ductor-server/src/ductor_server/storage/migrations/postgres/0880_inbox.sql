-- The inbox: notifications per tenant and subscriber, PostgreSQL flavour.
-- Every notification and every change to one takes the subscriber's next sequence
-- number (inbox_subscribers.last_seq, bumped under its row lock, so a subscriber's
-- changes commit in sequence order); inbox_changes keeps each change with the
-- notification as it became, so a client that reconnects reads exactly what it missed.
-- A group is the notifications one NOTIFY step created: its first clicked action wins.

CREATE TABLE inbox_secrets (
    tenant_id text PRIMARY KEY,
    secret text NOT NULL,
    rotated_at timestamptz NOT NULL
);

CREATE TABLE inbox_subscribers (
    tenant_id text NOT NULL,
    subscriber_id text NOT NULL,
    last_seq bigint NOT NULL DEFAULT 0,
    preferences jsonb NOT NULL DEFAULT '[]',
    PRIMARY KEY (tenant_id, subscriber_id)
);

CREATE TABLE inbox_notifications (
    tenant_id text NOT NULL,
    id text NOT NULL,
    subscriber_id text NOT NULL,
    feed text NOT NULL,
    title text NOT NULL,
    body text NOT NULL,
    data jsonb,
    avatar text,
    ctas jsonb NOT NULL,
    workflow text,
    run_id text,
    step_ref text,
    group_id text,
    created_at timestamptz NOT NULL,
    seen_at timestamptz,
    read_at timestamptz,
    archived_at timestamptz,
    snoozed_until timestamptz,
    acted jsonb,
    seq bigint NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX inbox_notifications_by_subscriber
    ON inbox_notifications (tenant_id, subscriber_id, created_at DESC, id DESC);
CREATE INDEX inbox_notifications_snoozed
    ON inbox_notifications (snoozed_until) WHERE snoozed_until IS NOT NULL;

CREATE TABLE inbox_groups (
    tenant_id text NOT NULL,
    group_id text NOT NULL,
    run_id text NOT NULL,
    step_ref text NOT NULL,
    await_action boolean NOT NULL,
    acted jsonb,
    PRIMARY KEY (tenant_id, group_id)
);

CREATE TABLE inbox_changes (
    tenant_id text NOT NULL,
    subscriber_id text NOT NULL,
    seq bigint NOT NULL,
    kind text NOT NULL CHECK (kind IN ('created', 'updated', 'deleted')),
    notification_id text NOT NULL,
    notification jsonb,
    at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, subscriber_id, seq)
);
