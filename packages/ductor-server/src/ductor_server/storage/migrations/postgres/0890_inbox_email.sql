-- Inbox email, PostgreSQL flavour (migration range 0890-0899 belongs to inbox email).
-- A subscriber's profile gains an email address. inbox_emails is the outbox: one
-- row per email a NOTIFY step (or a send through the API) wants, written in the
-- transaction that writes the notifications; the engine's email loop sends each
-- through the tenant's SMTP connection. `next_at` is when the row is next due (a
-- claim moves it a lease ahead, so a crashed send is taken again after the lease);
-- `attempts` counts claims and fences a stale claimer's write.

ALTER TABLE inbox_subscribers ADD COLUMN email text;

CREATE TABLE inbox_emails (
    tenant_id text NOT NULL,
    id text NOT NULL,
    subscriber_id text NOT NULL,
    to_address text NOT NULL,
    connection text NOT NULL,
    subject text NOT NULL,
    text_body text NOT NULL,
    notification_id text,
    workflow text,
    run_id text,
    step_ref text,
    status text NOT NULL CHECK (status IN ('pending', 'sent', 'failed')),
    attempts integer NOT NULL DEFAULT 0,
    next_at timestamptz NOT NULL,
    message_id text,
    error jsonb,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    sent_at timestamptz,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX inbox_emails_due ON inbox_emails (next_at) WHERE status = 'pending';
CREATE INDEX inbox_emails_by_run ON inbox_emails (tenant_id, run_id);
CREATE INDEX inbox_emails_by_subscriber ON inbox_emails (tenant_id, subscriber_id, created_at);
