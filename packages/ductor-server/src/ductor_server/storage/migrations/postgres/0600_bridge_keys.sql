-- Per-app bridge signing keys and the nonces of accepted bridge requests
-- (Postgres flavour).
--
-- `secret` is the raw HMAC key: the server needs it to sign its calls to the
-- app and to verify the app's requests, so it cannot be stored as a one-way
-- hash. Whoever can read this table can sign as any app (see docs/sdk.md,
-- "Threat model"). A key is active while `revoked_at` is null and
-- `expires_at` is null or in the future.

CREATE TABLE bridge_app_keys (
    tenant_id text NOT NULL,
    app_id text NOT NULL,
    key_id text NOT NULL,
    secret text NOT NULL,
    created_at timestamptz NOT NULL,
    expires_at timestamptz,
    revoked_at timestamptz,
    PRIMARY KEY (tenant_id, key_id)
);

CREATE INDEX bridge_app_keys_by_app ON bridge_app_keys (tenant_id, app_id, created_at);

-- One row per nonce accepted on a signed /v1/bridge/* request, kept until
-- `expires_at` (unix seconds: the signature's timestamp plus the window) has
-- passed. Nonces are random, so one key across tenants is enough, and a
-- request cannot be replayed into another tenant either.
CREATE TABLE bridge_nonces (
    nonce text PRIMARY KEY,
    tenant_id text NOT NULL,
    app_id text NOT NULL,
    expires_at bigint NOT NULL
);

CREATE INDEX bridge_nonces_by_expiry ON bridge_nonces (expires_at);
