"""`AgentService`: the methods of `/v1/agent/conversations`, the chat agent's
conversations, each calling the `AgentService` function its REST route calls. A
turn that fails answers its error with the conversation and turn in the detail's
`details`, as REST does."""

from __future__ import annotations

from ductor_server.services.agent import (
    AgentAnswer,
    ConversationBody,
    ConversationPage,
    ConversationView,
    MessageBody,
)
from ductor_server.transports.connect.method import (
    Cursor,
    Id,
    Limit200,
    Method,
    Req,
    body_of,
    method,
)


class ListConversationsRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The tenant's conversations newest first, paged by cursor."""

    cursor: Cursor | None = None
    limit: Limit200 = 50


class ConversationRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One conversation."""

    conversation_id: Id


class SendMessageRequest(MessageBody, frozen=True, kw_only=True):
    """A message, decisions on the tool calls that wait, or both, to a conversation."""

    conversation_id: Id


AGENT = "AgentService"

METHODS: tuple[Method, ...] = (
    method(
        AGENT,
        "CreateConversation",
        ConversationBody,
        AgentAnswer,
        lambda s, t, r, k: s.agent.create(t, r, idempotency_key=k),
        rest="POST /v1/agent/conversations",
        mutates=True,
        doc="Start a conversation; with a `message`, run its first turn and answer it.",
    ),
    method(
        AGENT,
        "ListConversations",
        ListConversationsRequest,
        ConversationPage,
        lambda s, t, r, k: s.agent.list(t, cursor=r.cursor, limit=r.limit),
        rest="GET /v1/agent/conversations",
        doc="The tenant's conversations newest first, paged by cursor.",
    ),
    method(
        AGENT,
        "GetConversation",
        ConversationRequest,
        ConversationView,
        lambda s, t, r, k: s.agent.get(t, r.conversation_id),
        rest="GET /v1/agent/conversations/{conversation_id}",
        doc="A conversation: its messages, tool calls, turns and their cost.",
    ),
    method(
        AGENT,
        "SendMessage",
        SendMessageRequest,
        AgentAnswer,
        lambda s, t, r, k: s.agent.post_message(
            t, r.conversation_id, body_of(r, MessageBody), idempotency_key=k
        ),
        rest="POST /v1/agent/conversations/{conversation_id}/messages",
        mutates=True,
        doc="Send a message or decide waiting tool calls, then run the turn and answer it.",
    ),
)
"""The methods of the chat agent's service."""


__all__ = ["AGENT", "METHODS"]
