-- Wallet top-ups through a payment processor, SQLite flavour.
-- A top-up is pending until the processor's signed webhook says it was paid; it is
-- then credited by one ledger entry (keyed `topup:<id>`, so exactly once) or failed.
-- A processor's payment id belongs to one top-up, whatever tenant asks.

CREATE TABLE wallet_topups (
    tenant_id TEXT NOT NULL,
    id TEXT NOT NULL,
    account TEXT NOT NULL,
    currency TEXT NOT NULL,
    amount INTEGER NOT NULL CHECK (amount > 0),
    description TEXT NOT NULL DEFAULT '',
    processor TEXT NOT NULL,
    payment_id TEXT NOT NULL,
    client_secret TEXT,
    status TEXT NOT NULL CHECK (status IN ('pending', 'credited', 'failed')),
    credited_amount INTEGER NOT NULL DEFAULT 0,
    entry_id TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, account) REFERENCES ledger_accounts (tenant_id, code)
);
CREATE UNIQUE INDEX wallet_topups_by_payment ON wallet_topups (processor, payment_id);
CREATE INDEX wallet_topups_by_account ON wallet_topups (tenant_id, account, created_at);
