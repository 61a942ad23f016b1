-- API key scopes, expiry and last use, SQLite flavour (migration range 0920-0924
-- belongs to keys). `scopes`: space-separated, from admin, write, read,
-- events:send. Keys made before scopes existed could do everything, so they
-- become admin keys. `last_used_at` is written at most about once a minute per key.

ALTER TABLE api_keys ADD COLUMN scopes TEXT NOT NULL DEFAULT 'admin';
ALTER TABLE api_keys ADD COLUMN expires_at TEXT;
ALTER TABLE api_keys ADD COLUMN last_used_at TEXT;
