-- The ledger's tables, PostgreSQL flavour (migration range 0700-0799 belongs to the ledger).
-- Every row has tenant_id. Amounts are bigint micros; a posting's amount is signed
-- (positive = debit, negative = credit). An account's `balance` is the signed sum of
-- its postings, kept in the same transaction as the postings (the row is locked for
-- the floor check anyway, so reads need no SUM over history).
--
-- The migration splitter cuts statements at lines that end with a semicolon, so the
-- plpgsql bodies below put each inner semicolon at the start of the next line.

CREATE TABLE ledger_accounts (
    tenant_id text NOT NULL,
    code text NOT NULL,
    currency text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('asset', 'liability', 'equity', 'revenue', 'expense')),
    normal_balance text NOT NULL CHECK (normal_balance IN ('debit', 'credit')),
    floor bigint,
    name text NOT NULL DEFAULT '',
    balance bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, code)
);

CREATE TABLE ledger_entries (
    tenant_id text NOT NULL,
    id text NOT NULL,
    idempotency_key text NOT NULL,
    description text NOT NULL DEFAULT '',
    reference_kind text NOT NULL,
    reference_id text NOT NULL DEFAULT '',
    reverses text,
    corrects text,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, id),
    UNIQUE (tenant_id, idempotency_key)
);
CREATE INDEX ledger_entries_by_time ON ledger_entries (tenant_id, created_at, id);
CREATE INDEX ledger_entries_by_reversed ON ledger_entries (tenant_id, reverses)
    WHERE reverses IS NOT NULL;

CREATE TABLE ledger_postings (
    tenant_id text NOT NULL,
    entry_id text NOT NULL,
    seq integer NOT NULL,
    account text NOT NULL,
    currency text NOT NULL,
    amount bigint NOT NULL CHECK (amount <> 0),
    PRIMARY KEY (tenant_id, entry_id, seq),
    FOREIGN KEY (tenant_id, entry_id) REFERENCES ledger_entries (tenant_id, id),
    FOREIGN KEY (tenant_id, account) REFERENCES ledger_accounts (tenant_id, code)
);
CREATE INDEX ledger_postings_by_account ON ledger_postings (tenant_id, account, entry_id);

CREATE TABLE ledger_holds (
    tenant_id text NOT NULL,
    id text NOT NULL,
    debit_account text NOT NULL,
    credit_account text NOT NULL,
    amount bigint NOT NULL CHECK (amount > 0),
    currency text NOT NULL,
    description text NOT NULL DEFAULT '',
    status text NOT NULL CHECK (status IN ('pending', 'posted', 'voided', 'expired')),
    posted_amount bigint NOT NULL DEFAULT 0 CHECK (posted_amount >= 0 AND posted_amount <= amount),
    created_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    finalized_at timestamptz,
    entry_id text,
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, debit_account) REFERENCES ledger_accounts (tenant_id, code),
    FOREIGN KEY (tenant_id, credit_account) REFERENCES ledger_accounts (tenant_id, code)
);
CREATE INDEX ledger_holds_pending_debit ON ledger_holds (tenant_id, debit_account)
    WHERE status = 'pending';
CREATE INDEX ledger_holds_pending_credit ON ledger_holds (tenant_id, credit_account)
    WHERE status = 'pending';
CREATE INDEX ledger_holds_pending_expiry ON ledger_holds (expires_at) WHERE status = 'pending';

-- At commit, every entry a transaction wrote nets to zero per currency and has at
-- least two postings, whoever wrote it (the store, a script, psql).
CREATE FUNCTION ledger_entry_balanced() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    bad record
; BEGIN
    SELECT currency, SUM(amount) AS net INTO bad FROM ledger_postings
     WHERE tenant_id = NEW.tenant_id AND entry_id = NEW.entry_id
     GROUP BY currency HAVING SUM(amount) <> 0 LIMIT 1
    ; IF FOUND THEN
        RAISE EXCEPTION 'ledger entry % of tenant % does not balance in %: debits minus credits = %',
            NEW.entry_id, NEW.tenant_id, bad.currency, bad.net
            USING ERRCODE = 'check_violation'
    ; END IF
    ; RETURN NULL
; END
$$;

CREATE CONSTRAINT TRIGGER ledger_postings_balanced
    AFTER INSERT ON ledger_postings
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION ledger_entry_balanced();

CREATE FUNCTION ledger_entry_has_postings() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    postings integer
; BEGIN
    SELECT count(*) INTO postings FROM ledger_postings
     WHERE tenant_id = NEW.tenant_id AND entry_id = NEW.id
    ; IF postings < 2 THEN
        RAISE EXCEPTION 'ledger entry % of tenant % has % postings; an entry needs two or more',
            NEW.id, NEW.tenant_id, postings
            USING ERRCODE = 'check_violation'
    ; END IF
    ; RETURN NULL
; END
$$;

CREATE CONSTRAINT TRIGGER ledger_entries_have_postings
    AFTER INSERT ON ledger_entries
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION ledger_entry_has_postings();

-- Entries and postings are never changed: a correction is a new entry.
CREATE FUNCTION ledger_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% rows are immutable: write a new entry instead', TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation'
; END
$$;

CREATE TRIGGER ledger_entries_immutable BEFORE UPDATE OR DELETE ON ledger_entries
    FOR EACH ROW EXECUTE FUNCTION ledger_immutable();
CREATE TRIGGER ledger_postings_immutable BEFORE UPDATE OR DELETE ON ledger_postings
    FOR EACH ROW EXECUTE FUNCTION ledger_immutable();

-- Lock the named accounts in code order, then read them with the live holds against
-- each (as a JSON array) in one round trip. The read is a second statement of a
-- VOLATILE function, so under READ COMMITTED it sees what the transactions it
-- waited for committed (a subquery of the locking statement would not).
CREATE FUNCTION ledger_lock_accounts(p_tenant text, p_codes text[], p_now timestamptz)
RETURNS TABLE (
    code text, currency text, kind text, normal_balance text, floor bigint, name text,
    balance bigint, created_at timestamptz, updated_at timestamptz, holds json
) LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    PERFORM 1 FROM ledger_accounts a
     WHERE a.tenant_id = p_tenant AND a.code = ANY (p_codes) ORDER BY a.code FOR UPDATE
    ; RETURN QUERY
    SELECT a.code, a.currency, a.kind, a.normal_balance, a.floor, a.name, a.balance,
           a.created_at, a.updated_at,
           (SELECT json_agg(json_build_array(h.id, h.debit_account, h.credit_account, h.amount,
                   h.currency, h.description, h.status, h.posted_amount, h.created_at,
                   h.expires_at, h.finalized_at, h.entry_id) ORDER BY h.created_at, h.id)
              FROM ledger_holds h
             WHERE h.tenant_id = p_tenant AND h.status = 'pending' AND h.expires_at > p_now
               AND (h.debit_account = a.code OR h.credit_account = a.code))
      FROM ledger_accounts a
     WHERE a.tenant_id = p_tenant AND a.code = ANY (p_codes) ORDER BY a.code
; END
$$;
