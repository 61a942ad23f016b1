-- Wallet top-ups through a payment processor, PostgreSQL flavour.
-- A top-up is pending until the processor's signed webhook says it was paid; it is
-- then credited by one ledger entry (keyed `topup:<id>`, so exactly once) or failed.
-- A processor's payment id belongs to one top-up, whatever tenant asks.

CREATE TABLE wallet_topups (
    tenant_id text NOT NULL,
    id text NOT NULL,
    account text NOT NULL,
    currency text NOT NULL,
    amount bigint NOT NULL CHECK (amount > 0),
    description text NOT NULL DEFAULT '',
    processor text NOT NULL,
    payment_id text NOT NULL,
    client_secret text,
    status text NOT NULL CHECK (status IN ('pending', 'credited', 'failed')),
    credited_amount bigint NOT NULL DEFAULT 0,
    entry_id text,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, account) REFERENCES ledger_accounts (tenant_id, code)
);
CREATE UNIQUE INDEX wallet_topups_by_payment ON wallet_topups (processor, payment_id);
CREATE INDEX wallet_topups_by_account ON wallet_topups (tenant_id, account, created_at);
