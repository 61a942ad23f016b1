-- Metering, budgets and plans, SQLite flavour (migration range 0800-0899 belongs to
-- metering). Every row has tenant_id; timestamps are ISO-8601 UTC text.
--
-- `usage_counters` holds one row per tenant, meter, window kind (hour, day, month)
-- and window start. An increment is one upsert (`value = value + delta`, or the
-- greater of the two for a max meter) of the three windows in one statement; the
-- engine adds a whole batch's usage per tenant and meter at once. Every write
-- transaction runs alone, so concurrent budget checks on one counter queue.
-- Built-in meters (runs, steps, route_decisions) have no `meters` row.

CREATE TABLE meters (
    tenant_id TEXT NOT NULL,
    name TEXT NOT NULL,
    unit TEXT NOT NULL,
    aggregation TEXT NOT NULL CHECK (aggregation IN ('sum', 'count', 'max')),
    description TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, name)
);

CREATE TABLE usage_counters (
    tenant_id TEXT NOT NULL,
    meter TEXT NOT NULL,
    win TEXT NOT NULL CHECK (win IN ('hour', 'day', 'month')),
    window_start TEXT NOT NULL,
    value INTEGER NOT NULL CHECK (value >= 0),
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, meter, win, window_start)
);

-- One budget per tenant and meter. `alert_percents` is a JSON array of INTEGERs.
CREATE TABLE budgets (
    tenant_id TEXT NOT NULL,
    meter TEXT NOT NULL,
    win TEXT NOT NULL CHECK (win IN ('hour', 'day', 'month')),
    lim INTEGER NOT NULL CHECK (lim >= 0),
    alert_percents TEXT NOT NULL DEFAULT '[]',
    block INTEGER NOT NULL CHECK (block IN (0, 1)),
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, meter)
);

-- An alert threshold crossed, once per window (the key makes it once).
CREATE TABLE budget_alerts (
    tenant_id TEXT NOT NULL,
    meter TEXT NOT NULL,
    win TEXT NOT NULL,
    window_start TEXT NOT NULL,
    percent INTEGER NOT NULL,
    lim INTEGER NOT NULL,
    value INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, meter, win, window_start, percent)
);
CREATE INDEX budget_alerts_by_time ON budget_alerts (tenant_id, meter, created_at);

-- `entitlements` is the JSON object of the plan's entitlements by feature.
CREATE TABLE plans (
    tenant_id TEXT NOT NULL,
    id TEXT NOT NULL,
    name TEXT NOT NULL DEFAULT '',
    entitlements TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, id)
);

CREATE TABLE tenant_plans (
    tenant_id TEXT PRIMARY KEY,
    plan_id TEXT NOT NULL,
    assigned_at TEXT NOT NULL,
    FOREIGN KEY (tenant_id, plan_id) REFERENCES plans (tenant_id, id)
);
