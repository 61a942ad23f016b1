"""Errors of the inference proxy, each a `ServerError` with a stable code; no HTTP here.

ServerError
 ├── NotFoundError
 │    ├── AiRequestNotFound         ai.request_not_found
 │    ├── PriceNotFound             ai.price_not_found
 │    └── ConversationNotFound      agent.conversation_not_found
 ├── AiNoConnection                ai.no_connection
 ├── AiConnectionUnsupported       ai.connection_unsupported
 ├── AiUpstreamError               ai.upstream_error (details: upstream status and error)
 ├── AiUpstreamTimeout             ai.upstream_timeout
 ├── ConversationBusy              agent.conversation_busy (a turn is running)
 ├── ConversationTooLong           agent.conversation_too_long
 ├── ConfirmationRequired          agent.confirmation_required (details: pending calls)
 └── ToolCallNotPending            agent.tool_call_not_pending (details: pointer, id)
"""

from __future__ import annotations

from typing import Any

from ductor_server.errors import NotFoundError, ServerError


class AiRequestNotFound(NotFoundError):
    """No model call with this id for this tenant."""

    code = "ai.request_not_found"

    def __init__(self, request_id: str) -> None:
        super().__init__(f"AI request {request_id!r} not found", details={"id": request_id})


class PriceNotFound(NotFoundError):
    """The tenant has no price for this model."""

    code = "ai.price_not_found"

    def __init__(self, model: str) -> None:
        super().__init__(f"no price for model {model!r}", details={"model": model})


class AiNoConnection(ServerError):
    """The request names no connection and the tenant has no default one."""

    code = "ai.no_connection"

    def __init__(self, *, pointer: str = "/ductor_connection", where: str | None = None) -> None:
        where = where or "the Ductor-Connection header, the body's ductor_connection"
        super().__init__(
            f"name the upstream connection: {where}, or a default (PUT /v1/ai/settings)",
            details={"pointer": pointer},
        )


class AiConnectionUnsupported(ServerError):
    """The named connection is not an `openai` connection."""

    code = "ai.connection_unsupported"

    def __init__(self, name: str, provider: str) -> None:
        super().__init__(
            f"connection {name!r} uses provider {provider!r}; the proxy forwards only to"
            " 'openai' connections",
            details={"name": name, "provider": provider},
        )


class AiUpstreamError(ServerError):
    """The upstream answered an error, or could not be reached."""

    code = "ai.upstream_error"
    retryable = True

    def __init__(self, message: str, details: dict[str, Any]) -> None:
        super().__init__(message, details=details)


class AiUpstreamTimeout(ServerError):
    """The upstream did not answer within the tenant's timeout."""

    code = "ai.upstream_timeout"
    retryable = True

    def __init__(self, seconds: float, details: dict[str, Any]) -> None:
        super().__init__(f"the upstream did not answer within {seconds:g}s", details=details)


class ConversationNotFound(NotFoundError):
    """No chat agent conversation with this id for this tenant."""

    code = "agent.conversation_not_found"

    def __init__(self, conversation_id: str) -> None:
        super().__init__(
            f"conversation {conversation_id!r} not found", details={"id": conversation_id}
        )


class ConversationBusy(ServerError):
    """Another request's turn is still running on the conversation."""

    code = "agent.conversation_busy"

    def __init__(self, conversation_id: str, turn: int) -> None:
        super().__init__(
            f"turn {turn} of conversation {conversation_id!r} is still running; send the"
            " next message when it has answered",
            details={"id": conversation_id, "turn": turn},
        )


class ConversationTooLong(ServerError):
    """The conversation holds as many messages as a conversation may."""

    code = "agent.conversation_too_long"

    def __init__(self, conversation_id: str, limit: int) -> None:
        super().__init__(
            f"conversation {conversation_id!r} has reached {limit} messages; start a new one",
            details={"id": conversation_id, "limit": limit},
        )


class ConfirmationRequired(ServerError):
    """Tool calls wait for the caller to confirm or reject them."""

    code = "agent.confirmation_required"

    def __init__(self, pending: list[str]) -> None:
        super().__init__(
            f"{len(pending)} tool call(s) wait for a decision: list each in `confirm` or `reject`",
            details={"pointer": "/confirm", "pending": pending},
        )


class ToolCallNotPending(ServerError):
    """A confirmed or rejected id names no tool call waiting in this conversation."""

    code = "agent.tool_call_not_pending"

    def __init__(self, call_id: str, pointer: str, status: str | None) -> None:
        why = "no tool call of this conversation" if status is None else f"it is {status}"
        super().__init__(
            f"{pointer}: tool call {call_id!r} does not wait for a decision ({why})",
            details={"pointer": pointer, "id": call_id, "status": status},
        )


__all__ = [
    "AiConnectionUnsupported",
    "AiNoConnection",
    "AiRequestNotFound",
    "AiUpstreamError",
    "AiUpstreamTimeout",
    "ConfirmationRequired",
    "ConversationBusy",
    "ConversationNotFound",
    "ConversationTooLong",
    "PriceNotFound",
    "ToolCallNotPending",
]
