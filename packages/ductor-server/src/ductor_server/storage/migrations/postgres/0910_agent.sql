-- The chat agent, PostgreSQL flavour (migration range 0900-0919 belongs to AI).
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
    tenant_id text NOT NULL,
    id text NOT NULL,
    title text NOT NULL,
    model text NOT NULL,
    connection text,
    instructions text NOT NULL,
    create_key text,
    create_hash text,
    turns integer NOT NULL,
    messages integer NOT NULL,
    cost_micros bigint NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX agent_conversations_by_time
    ON agent_conversations (tenant_id, created_at DESC, id DESC);
CREATE UNIQUE INDEX agent_conversations_by_key ON agent_conversations (tenant_id, create_key)
    WHERE create_key IS NOT NULL;

CREATE TABLE agent_messages (
    tenant_id text NOT NULL,
    conversation_id text NOT NULL,
    seq integer NOT NULL,
    turn integer NOT NULL,
    role text NOT NULL,
    content text,
    ai_request_id text,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, conversation_id, seq)
);

CREATE TABLE agent_tool_calls (
    tenant_id text NOT NULL,
    id text NOT NULL,
    conversation_id text NOT NULL,
    message_seq integer NOT NULL,
    position integer NOT NULL,
    turn integer NOT NULL,
    tool text NOT NULL,
    arguments text NOT NULL,
    mutates boolean NOT NULL,
    status text NOT NULL,
    approval text,
    result text,
    result_truncated boolean NOT NULL,
    error_code text,
    created_at timestamptz NOT NULL,
    decided_at timestamptz,
    decided_turn integer,
    executed_at timestamptz,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX agent_tool_calls_by_message
    ON agent_tool_calls (tenant_id, conversation_id, message_seq, position);
CREATE INDEX agent_tool_calls_by_status ON agent_tool_calls (tenant_id, conversation_id, status);

CREATE TABLE agent_turns (
    tenant_id text NOT NULL,
    conversation_id text NOT NULL,
    turn integer NOT NULL,
    idempotency_key text,
    request_hash text NOT NULL,
    allow_mutations boolean NOT NULL,
    runner text NOT NULL,
    status text NOT NULL,
    error jsonb,
    model_calls integer NOT NULL,
    ai_request_ids jsonb NOT NULL,
    cost_micros bigint NOT NULL,
    lease_until timestamptz NOT NULL,
    created_at timestamptz NOT NULL,
    finished_at timestamptz,
    PRIMARY KEY (tenant_id, conversation_id, turn)
);
CREATE UNIQUE INDEX agent_turns_by_key ON agent_turns (tenant_id, conversation_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
