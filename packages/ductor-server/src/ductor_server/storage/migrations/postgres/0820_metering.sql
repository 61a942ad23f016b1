-- Metering, budgets and plans, PostgreSQL flavour (migration range 0800-0899 belongs
-- to metering). Every row has tenant_id.
--
-- `usage_counters` holds one row per tenant, meter, window kind (hour, day, month)
-- and window start. An increment is one upsert (`value = value + delta`, or the
-- greater of the two for a max meter) of the three windows in one statement; the
-- engine adds a whole batch's usage per tenant and meter at once. The row lock the
-- upsert takes is what serializes concurrent budget checks on one counter.
-- Built-in meters (runs, steps, route_decisions) have no `meters` row.

CREATE TABLE meters (
    tenant_id text NOT NULL,
    name text NOT NULL,
    unit text NOT NULL,
    aggregation text NOT NULL CHECK (aggregation IN ('sum', 'count', 'max')),
    description text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, name)
);

CREATE TABLE usage_counters (
    tenant_id text NOT NULL,
    meter text NOT NULL,
    win text NOT NULL CHECK (win IN ('hour', 'day', 'month')),
    window_start timestamptz NOT NULL,
    value bigint NOT NULL CHECK (value >= 0),
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, meter, win, window_start)
);

-- One budget per tenant and meter. `alert_percents` is a JSON array of integers.
CREATE TABLE budgets (
    tenant_id text NOT NULL,
    meter text NOT NULL,
    win text NOT NULL CHECK (win IN ('hour', 'day', 'month')),
    lim bigint NOT NULL CHECK (lim >= 0),
    alert_percents text NOT NULL DEFAULT '[]',
    block boolean NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, meter)
);

-- An alert threshold crossed, once per window (the key makes it once).
CREATE TABLE budget_alerts (
    tenant_id text NOT NULL,
    meter text NOT NULL,
    win text NOT NULL,
    window_start timestamptz NOT NULL,
    percent integer NOT NULL,
    lim bigint NOT NULL,
    value bigint NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, meter, win, window_start, percent)
);
CREATE INDEX budget_alerts_by_time ON budget_alerts (tenant_id, meter, created_at);

-- `entitlements` is the JSON object of the plan's entitlements by feature.
CREATE TABLE plans (
    tenant_id text NOT NULL,
    id text NOT NULL,
    name text NOT NULL DEFAULT '',
    entitlements text NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, id)
);

CREATE TABLE tenant_plans (
    tenant_id text PRIMARY KEY,
    plan_id text NOT NULL,
    assigned_at timestamptz NOT NULL,
    FOREIGN KEY (tenant_id, plan_id) REFERENCES plans (tenant_id, id)
);
