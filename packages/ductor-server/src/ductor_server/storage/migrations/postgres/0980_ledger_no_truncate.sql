-- TRUNCATE fires no row triggers, so entries and postings refuse it with a
-- statement trigger of their own (TRUNCATE ... CASCADE fires it on each table).
CREATE TRIGGER ledger_entries_no_truncate BEFORE TRUNCATE ON ledger_entries
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_immutable();
CREATE TRIGGER ledger_postings_no_truncate BEFORE TRUNCATE ON ledger_postings
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_immutable();
