-- Per-app bridge signing keys and the nonces of accepted bridge requests
-- (SQLite flavour; timestamps are ISO-8601 UTC text).
--
-- `secret` is the raw HMAC key: the server needs it to sign its calls to the
-- app and to verify the app's requests, so it cannot be stored as a one-way
-- hash. Whoever can read this table can sign as any app (see docs/sdk.md,
-- "Threat model"). A key is active while `revoked_at` is null and
-- `expires_at` is null or in the future.

CREATE TABLE bridge_app_keys (
    tenant_id TEXT NOT NULL,
    app_id TEXT NOT NULL,
    key_id TEXT NOT NULL,
    secret TEXT NOT NULL,
    created_at TEXT NOT NULL,
    expires_at TEXT,
    revoked_at TEXT,
    PRIMARY KEY (tenant_id, key_id)
);

CREATE INDEX bridge_app_keys_by_app ON bridge_app_keys (tenant_id, app_id, created_at);

-- One row per nonce accepted on a signed /v1/bridge/* request, kept until
-- `expires_at` (unix seconds: the signature's timestamp plus the window) has
-- passed. Nonces are random, so one key across tenants is enough, and a
-- request cannot be replayed into another tenant either.
CREATE TABLE bridge_nonces (
    nonce TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    app_id TEXT NOT NULL,
    expires_at INTEGER NOT NULL
);

CREATE INDEX bridge_nonces_by_expiry ON bridge_nonces (expires_at);
