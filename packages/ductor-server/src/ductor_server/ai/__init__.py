"""The inference proxy's and the chat agent's tables and errors (the rules are
`services.ai`'s and `services.agent`'s): no transport, no HTTP to the upstream here."""

from __future__ import annotations

from ductor_server.ai.agent_store import (
    AgentTx,
    ConversationRecord,
    MessageRecord,
    ToolCallRecord,
    TurnRecord,
)
from ductor_server.ai.errors import (
    AiConnectionUnsupported,
    AiNoConnection,
    AiRequestNotFound,
    AiUpstreamError,
    AiUpstreamTimeout,
    ConfirmationRequired,
    ConversationBusy,
    ConversationNotFound,
    ConversationTooLong,
    PriceNotFound,
    ToolCallNotPending,
)
from ductor_server.ai.store import AiRequestRecord, AiSettingsRecord, AiTx, PriceRecord

__all__ = [
    "AgentTx",
    "AiConnectionUnsupported",
    "AiNoConnection",
    "AiRequestNotFound",
    "AiRequestRecord",
    "AiSettingsRecord",
    "AiTx",
    "AiUpstreamError",
    "AiUpstreamTimeout",
    "ConfirmationRequired",
    "ConversationBusy",
    "ConversationNotFound",
    "ConversationRecord",
    "ConversationTooLong",
    "MessageRecord",
    "PriceNotFound",
    "PriceRecord",
    "ToolCallNotPending",
    "ToolCallRecord",
    "TurnRecord",
]
