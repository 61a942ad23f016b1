-- Inbox email, SQLite flavour (migration range 0890-0899 belongs to inbox email).
-- A subscriber's profile gains an email address. inbox_emails is the outbox: one
-- row per email a NOTIFY step (or a send through the API) wants, written in the
-- transaction that writes the notifications; the engine's email loop sends each
-- through the tenant's SMTP connection. `next_at` is when the row is next due (a
-- claim moves it a lease ahead, so a crashed send is taken again after the lease);
-- `attempts` counts claims and fences a stale claimer's write.

ALTER TABLE inbox_subscribers ADD COLUMN email TEXT;

CREATE TABLE inbox_emails (
    tenant_id TEXT NOT NULL,
    id TEXT NOT NULL,
    subscriber_id TEXT NOT NULL,
    to_address TEXT NOT NULL,
    connection TEXT NOT NULL,
    subject TEXT NOT NULL,
    text_body TEXT NOT NULL,
    notification_id TEXT,
    workflow TEXT,
    run_id TEXT,
    step_ref TEXT,
    status TEXT NOT NULL CHECK (status IN ('pending', 'sent', 'failed')),
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at TEXT NOT NULL,
    message_id TEXT,
    error TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    sent_at TEXT,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX inbox_emails_due ON inbox_emails (next_at) WHERE status = 'pending';
CREATE INDEX inbox_emails_by_run ON inbox_emails (tenant_id, run_id);
CREATE INDEX inbox_emails_by_subscriber ON inbox_emails (tenant_id, subscriber_id, created_at);
