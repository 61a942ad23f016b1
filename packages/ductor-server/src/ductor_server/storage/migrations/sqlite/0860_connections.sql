-- Connections, SQLite flavour (migration range 0860-0869 belongs to connections).
-- A tenant's configured instance of a provider. `config` holds the non-secret
-- settings (JSON text); the secrets are AES-GCM ciphertext under the server key
-- `secrets_key_id` (NULL when the connection has none), and `secrets_mask`
-- (JSON text) is what the API shows of them instead.

CREATE TABLE connections (
    tenant_id TEXT NOT NULL,
    id TEXT NOT NULL,
    name TEXT NOT NULL,
    provider TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    config TEXT NOT NULL,
    secrets_ciphertext TEXT,
    secrets_key_id TEXT,
    secrets_mask TEXT NOT NULL DEFAULT '{}',
    secrets_updated_at TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, id),
    UNIQUE (tenant_id, name),
    CHECK ((secrets_ciphertext IS NULL) = (secrets_key_id IS NULL))
);
CREATE INDEX connections_by_key ON connections (secrets_key_id, tenant_id);
