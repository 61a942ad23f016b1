-- The ledger's tables, SQLite flavour (migration range 0700-0799 belongs to the ledger).
-- Every row has tenant_id. Amounts are integer micros; a posting's amount is signed
-- (positive = debit, negative = credit). An account's `balance` is the signed sum of
-- its postings, kept in the same transaction as the postings. SQLite has no deferred
-- constraint triggers: the ledger store checks that every entry it wrote balances in
-- a before-commit callback of the same transaction.

CREATE TABLE ledger_accounts (
    tenant_id TEXT NOT NULL,
    code TEXT NOT NULL,
    currency TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('asset', 'liability', 'equity', 'revenue', 'expense')),
    normal_balance TEXT NOT NULL CHECK (normal_balance IN ('debit', 'credit')),
    floor INTEGER,
    name TEXT NOT NULL DEFAULT '',
    balance INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, code)
);

CREATE TABLE ledger_entries (
    tenant_id TEXT NOT NULL,
    id TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    reference_kind TEXT NOT NULL,
    reference_id TEXT NOT NULL DEFAULT '',
    reverses TEXT,
    corrects TEXT,
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, id),
    UNIQUE (tenant_id, idempotency_key)
);
CREATE INDEX ledger_entries_by_time ON ledger_entries (tenant_id, created_at, id);
CREATE INDEX ledger_entries_by_reversed ON ledger_entries (tenant_id, reverses)
    WHERE reverses IS NOT NULL;

CREATE TABLE ledger_postings (
    tenant_id TEXT NOT NULL,
    entry_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    account TEXT NOT NULL,
    currency TEXT NOT NULL,
    amount INTEGER NOT NULL CHECK (amount <> 0),
    PRIMARY KEY (tenant_id, entry_id, seq),
    FOREIGN KEY (tenant_id, entry_id) REFERENCES ledger_entries (tenant_id, id),
    FOREIGN KEY (tenant_id, account) REFERENCES ledger_accounts (tenant_id, code)
);
CREATE INDEX ledger_postings_by_account ON ledger_postings (tenant_id, account, entry_id);

CREATE TABLE ledger_holds (
    tenant_id TEXT NOT NULL,
    id TEXT NOT NULL,
    debit_account TEXT NOT NULL,
    credit_account TEXT NOT NULL,
    amount INTEGER NOT NULL CHECK (amount > 0),
    currency TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL CHECK (status IN ('pending', 'posted', 'voided', 'expired')),
    posted_amount INTEGER NOT NULL DEFAULT 0 CHECK (posted_amount >= 0 AND posted_amount <= amount),
    created_at TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    finalized_at TEXT,
    entry_id TEXT,
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, debit_account) REFERENCES ledger_accounts (tenant_id, code),
    FOREIGN KEY (tenant_id, credit_account) REFERENCES ledger_accounts (tenant_id, code)
);
CREATE INDEX ledger_holds_pending_debit ON ledger_holds (tenant_id, debit_account)
    WHERE status = 'pending';
CREATE INDEX ledger_holds_pending_credit ON ledger_holds (tenant_id, credit_account)
    WHERE status = 'pending';
CREATE INDEX ledger_holds_pending_expiry ON ledger_holds (expires_at) WHERE status = 'pending';

-- Entries and postings are never changed: a correction is a new entry.
CREATE TRIGGER ledger_entries_no_update BEFORE UPDATE ON ledger_entries
BEGIN SELECT RAISE(ABORT, 'ledger_entries rows are immutable: write a new entry instead'); END;
CREATE TRIGGER ledger_entries_no_delete BEFORE DELETE ON ledger_entries
BEGIN SELECT RAISE(ABORT, 'ledger_entries rows are immutable: write a new entry instead'); END;
CREATE TRIGGER ledger_postings_no_update BEFORE UPDATE ON ledger_postings
BEGIN SELECT RAISE(ABORT, 'ledger_postings rows are immutable: write a new entry instead'); END;
CREATE TRIGGER ledger_postings_no_delete BEFORE DELETE ON ledger_postings
BEGIN SELECT RAISE(ABORT, 'ledger_postings rows are immutable: write a new entry instead'); END;
