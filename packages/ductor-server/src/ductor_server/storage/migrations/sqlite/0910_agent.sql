-- The chat agent, SQLite flavour (migration range 0900-0919 belongs to AI).
-- `agent_conversations`: a tenant's conversation with its model, upstream
-- connection, totals and the Idempotency-Key that created it (`create_key`).
-- `agent_messages`: the user's and the model's messages, in order (`seq`); the
-- results of tool calls are the calls' rows, placed after their message.
-- `agent_tool_calls`: each call the model asked for, its arguments, whether it
-- was allowed, confirmed or rejected, and its result as the model saw it.
-- `agent_turns`: one request's work: its status, its model calls (AI request
-- ids) and their cost; `idempotency_key` answers a repeated request once;
-- `runner` and `lease_until` say which loop works on a running turn, until when.

CREATE TABLE agent_conversations (
    tenant_id TEXT NOT NULL,
    id TEXT NOT NULL,
    title TEXT NOT NULL,
    model TEXT NOT NULL,
    connection TEXT,
    instructions TEXT NOT NULL,
    create_key TEXT,
    create_hash TEXT,
    turns INTEGER NOT NULL,
    messages INTEGER NOT NULL,
    cost_micros INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX agent_conversations_by_time
    ON agent_conversations (tenant_id, created_at DESC, id DESC);
CREATE UNIQUE INDEX agent_conversations_by_key ON agent_conversations (tenant_id, create_key)
    WHERE create_key IS NOT NULL;

CREATE TABLE agent_messages (
    tenant_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    turn INTEGER NOT NULL,
    role TEXT NOT NULL,
    content TEXT,
    ai_request_id TEXT,
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, conversation_id, seq)
);

CREATE TABLE agent_tool_calls (
    tenant_id TEXT NOT NULL,
    id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    message_seq INTEGER NOT NULL,
    position INTEGER NOT NULL,
    turn INTEGER NOT NULL,
    tool TEXT NOT NULL,
    arguments TEXT NOT NULL,
    mutates INTEGER NOT NULL,
    status TEXT NOT NULL,
    approval TEXT,
    result TEXT,
    result_truncated INTEGER NOT NULL,
    error_code TEXT,
    created_at TEXT NOT NULL,
    decided_at TEXT,
    decided_turn INTEGER,
    executed_at TEXT,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX agent_tool_calls_by_message
    ON agent_tool_calls (tenant_id, conversation_id, message_seq, position);
CREATE INDEX agent_tool_calls_by_status ON agent_tool_calls (tenant_id, conversation_id, status);

CREATE TABLE agent_turns (
    tenant_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    turn INTEGER NOT NULL,
    idempotency_key TEXT,
    request_hash TEXT NOT NULL,
    allow_mutations INTEGER NOT NULL,
    runner TEXT NOT NULL,
    status TEXT NOT NULL,
    error TEXT,
    model_calls INTEGER NOT NULL,
    ai_request_ids TEXT NOT NULL,
    cost_micros INTEGER NOT NULL,
    lease_until TEXT NOT NULL,
    created_at TEXT NOT NULL,
    finished_at TEXT,
    PRIMARY KEY (tenant_id, conversation_id, turn)
);
CREATE UNIQUE INDEX agent_turns_by_key ON agent_turns (tenant_id, conversation_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
