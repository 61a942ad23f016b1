-- Connections, PostgreSQL flavour (migration range 0860-0869 belongs to connections).
-- A tenant's configured instance of a provider. `config` holds the non-secret
-- settings (JSON text); the secrets are AES-GCM ciphertext under the server key
-- `secrets_key_id` (NULL when the connection has none), and `secrets_mask`
-- (JSON text) is what the API shows of them instead.

CREATE TABLE connections (
    tenant_id text NOT NULL,
    id text NOT NULL,
    name text NOT NULL,
    provider text NOT NULL,
    description text NOT NULL DEFAULT '',
    config text NOT NULL,
    secrets_ciphertext text,
    secrets_key_id text,
    secrets_mask text NOT NULL DEFAULT '{}',
    secrets_updated_at timestamptz,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, id),
    UNIQUE (tenant_id, name),
    CHECK ((secrets_ciphertext IS NULL) = (secrets_key_id IS NULL))
);
CREATE INDEX connections_by_key ON connections (secrets_key_id, tenant_id);
