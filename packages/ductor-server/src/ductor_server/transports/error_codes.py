"""The one table from every stable error code to its HTTP status (REST, MCP) and its
Connect code (Connect-RPC), and the fallbacks for a code the table does not name.

Plain data: no framework is imported here, so every transport reads the same table.
"""

from __future__ import annotations

from typing import NamedTuple

# Connect's codes (https://connectrpc.com/docs/protocol/#error-codes), by their wire names.
INVALID_ARGUMENT = "invalid_argument"
UNAUTHENTICATED = "unauthenticated"
PERMISSION_DENIED = "permission_denied"
NOT_FOUND = "not_found"
ALREADY_EXISTS = "already_exists"
FAILED_PRECONDITION = "failed_precondition"
ABORTED = "aborted"
RESOURCE_EXHAUSTED = "resource_exhausted"
UNIMPLEMENTED = "unimplemented"
UNAVAILABLE = "unavailable"
DEADLINE_EXCEEDED = "deadline_exceeded"
INTERNAL = "internal"


class ErrorCode(NamedTuple):
    """How one error code leaves each transport."""

    http: int
    """The HTTP status of a REST (and MCP refusal) answer."""
    connect: str
    """The Connect code of a Connect-RPC answer (its HTTP status is Connect's own)."""


_ = ErrorCode

#: Every stable error code the API answers with: its HTTP status and its Connect code.
ERROR_CODES: dict[str, ErrorCode] = {
    # the request itself
    "request.malformed_json": _(400, INVALID_ARGUMENT),
    "request.invalid": _(422, INVALID_ARGUMENT),
    "request.too_large": _(413, RESOURCE_EXHAUSTED),
    "request.unsupported_media_type": _(415, INVALID_ARGUMENT),
    "route.not_found": _(404, UNIMPLEMENTED),
    "route.method_not_allowed": _(405, UNIMPLEMENTED),
    # who is asking, and what its key may do
    "auth.unauthenticated": _(401, UNAUTHENTICATED),
    "auth.key_expired": _(401, UNAUTHENTICATED),
    "auth.forbidden": _(403, PERMISSION_DENIED),
    "key.invalid": _(422, INVALID_ARGUMENT),
    "key.not_found": _(404, NOT_FOUND),
    "key.last_admin": _(409, FAILED_PRECONDITION),
    "tenant.invalid": _(422, INVALID_ARGUMENT),
    "tenant.not_found": _(404, NOT_FOUND),
    "tenant.conflict": _(409, ALREADY_EXISTS),
    # replays
    "idempotency.conflict": _(422, FAILED_PRECONDITION),
    # definitions
    "definition.invalid": _(422, INVALID_ARGUMENT),
    "definition.malformed": _(422, INVALID_ARGUMENT),
    # not found (another tenant's object is not found too)
    "not_found": _(404, NOT_FOUND),
    "run.not_found": _(404, NOT_FOUND),
    "workflow.not_found": _(404, NOT_FOUND),
    "workflow.version_not_found": _(404, NOT_FOUND),
    # state conflicts and bad events
    "run.not_cancellable": _(409, FAILED_PRECONDITION),
    "run.ended": _(409, FAILED_PRECONDITION),
    "run.not_ended": _(409, FAILED_PRECONDITION),
    "run.input_invalid": _(422, INVALID_ARGUMENT),
    "run.wait_limit": _(429, RESOURCE_EXHAUSTED),
    "event.invalid": _(422, INVALID_ARGUMENT),
    # routing
    "routing.config": _(422, INVALID_ARGUMENT),
    "routing.routable_invalid": _(422, INVALID_ARGUMENT),
    "routing.strategy_failed": _(422, FAILED_PRECONDITION),
    "routing.assign_conflict": _(409, ABORTED),
    "routing.config_conflict": _(409, ABORTED),
    "routing.assignment_state": _(409, FAILED_PRECONDITION),
    "routing.in_use": _(409, FAILED_PRECONDITION),
    "worker.not_found": _(404, NOT_FOUND),
    "pool.not_found": _(404, NOT_FOUND),
    "rule_set.not_found": _(404, NOT_FOUND),
    "decision.not_found": _(404, NOT_FOUND),
    "assignment.not_found": _(404, NOT_FOUND),
    # the ledger (ductor_settlement's codes: every problem is in details.problems)
    "account.not_found": _(404, NOT_FOUND),
    "entry.not_found": _(404, NOT_FOUND),
    "settlement.naive_time": _(422, INVALID_ARGUMENT),
    "ledger.invalid_account": _(422, INVALID_ARGUMENT),
    "ledger.account_conflict": _(409, ALREADY_EXISTS),
    "ledger.unknown_account": _(422, INVALID_ARGUMENT),
    "ledger.unknown_entry": _(422, INVALID_ARGUMENT),
    "ledger.invalid_entry": _(422, INVALID_ARGUMENT),
    "ledger.invalid_amount": _(422, INVALID_ARGUMENT),
    "ledger.currency_mismatch": _(422, INVALID_ARGUMENT),
    "ledger.unbalanced": _(422, INVALID_ARGUMENT),
    "ledger.over_reversal": _(422, FAILED_PRECONDITION),
    "ledger.floor_crossed": _(422, FAILED_PRECONDITION),
    "ledger.idempotency_conflict": _(409, ALREADY_EXISTS),
    "ledger.batch_conflict": _(409, ABORTED),
    "hold.invalid": _(422, INVALID_ARGUMENT),
    # wallet top-ups through a payment processor
    "topup.not_found": _(404, NOT_FOUND),
    "wallet.unavailable": _(503, UNAVAILABLE),
    "wallet.processor_error": _(422, FAILED_PRECONDITION),
    "wallet.processor_unreachable": _(503, UNAVAILABLE),
    "webhook.signature_invalid": _(400, INVALID_ARGUMENT),
    "hold.not_found": _(404, NOT_FOUND),
    "hold.conflict": _(409, ALREADY_EXISTS),
    "hold.expired": _(409, FAILED_PRECONDITION),
    "hold.already_final": _(409, FAILED_PRECONDITION),
    "hold.amount_exceeded": _(422, INVALID_ARGUMENT),
    "settlement.invalid": _(422, INVALID_ARGUMENT),
    "settlement.not_found": _(404, NOT_FOUND),
    "pricing.invalid_rule": _(422, INVALID_ARGUMENT),
    "pricing.no_rule": _(422, FAILED_PRECONDITION),
    "pricing.invalid_charge": _(422, INVALID_ARGUMENT),
    "return.invalid_policy": _(422, INVALID_ARGUMENT),
    "return.not_returnable": _(422, FAILED_PRECONDITION),
    "return.window_closed": _(422, FAILED_PRECONDITION),
    "return.reason_not_allowed": _(422, INVALID_ARGUMENT),
    "return.rate_exceeded": _(422, FAILED_PRECONDITION),
    "return.already_returned": _(409, ALREADY_EXISTS),
    "return.invalid_amount": _(422, INVALID_ARGUMENT),
    "metering.invalid": _(422, INVALID_ARGUMENT),
    "meter.not_found": _(404, NOT_FOUND),
    "meter.conflict": _(409, ALREADY_EXISTS),
    "budget.not_found": _(404, NOT_FOUND),
    "budget.conflict": _(409, ALREADY_EXISTS),
    "plan.not_found": _(404, NOT_FOUND),
    "plan.conflict": _(409, ALREADY_EXISTS),
    "budget.exceeded": _(429, RESOURCE_EXHAUSTED),
    "entitlement.missing": _(403, PERMISSION_DENIED),
    "entitlement.limit_exceeded": _(403, PERMISSION_DENIED),
    "receipt.not_found": _(404, NOT_FOUND),
    "receipt.malformed": _(422, INVALID_ARGUMENT),
    "receipt.wrong_payload_type": _(422, INVALID_ARGUMENT),
    "receipt.unknown_key": _(422, INVALID_ARGUMENT),
    "receipt.bad_signature": _(422, INVALID_ARGUMENT),
    "receipt.not_canonical": _(422, INVALID_ARGUMENT),
    "receipt.invalid_key": _(422, INVALID_ARGUMENT),
    # connections and their secrets
    "connection.not_found": _(404, NOT_FOUND),
    "connection.invalid": _(422, INVALID_ARGUMENT),
    "connection.conflict": _(409, ALREADY_EXISTS),
    "provider.unknown": _(422, INVALID_ARGUMENT),
    "secrets.unconfigured": _(503, UNAVAILABLE),
    "secrets.undecryptable": _(503, UNAVAILABLE),
    # the inbox
    "inbox.not_found": _(404, NOT_FOUND),
    "inbox.socket_limit": _(429, RESOURCE_EXHAUSTED),
    "notification.not_found": _(404, NOT_FOUND),
    "email.not_found": _(404, NOT_FOUND),
    "notification.not_actionable": _(422, FAILED_PRECONDITION),
    # the inference proxy
    "ai.no_connection": _(422, FAILED_PRECONDITION),
    "ai.connection_unsupported": _(422, FAILED_PRECONDITION),
    "ai.request_not_found": _(404, NOT_FOUND),
    "ai.price_not_found": _(404, NOT_FOUND),
    "ai.upstream_error": _(502, UNAVAILABLE),
    "ai.upstream_timeout": _(504, DEADLINE_EXCEEDED),
    # the chat agent
    "agent.conversation_not_found": _(404, NOT_FOUND),
    "agent.conversation_busy": _(409, ABORTED),
    "agent.conversation_too_long": _(409, FAILED_PRECONDITION),
    "agent.confirmation_required": _(409, FAILED_PRECONDITION),
    "agent.tool_call_not_pending": _(409, FAILED_PRECONDITION),
    # bridge apps
    "app.not_found": _(404, NOT_FOUND),
    "app_key.not_found": _(404, NOT_FOUND),
    "bridge.not_configured": _(503, UNAVAILABLE),
    # the server
    "outbound.forbidden": _(422, PERMISSION_DENIED),
    "service.unavailable": _(503, UNAVAILABLE),
    "storage.unavailable": _(503, UNAVAILABLE),
    "internal": _(500, INTERNAL),
}

_CONNECT_BY_STATUS: dict[int, str] = {
    400: INVALID_ARGUMENT,
    401: UNAUTHENTICATED,
    403: PERMISSION_DENIED,
    404: NOT_FOUND,
    409: FAILED_PRECONDITION,
    413: RESOURCE_EXHAUSTED,
    422: INVALID_ARGUMENT,
    429: RESOURCE_EXHAUSTED,
    502: UNAVAILABLE,
    503: UNAVAILABLE,
    504: DEADLINE_EXCEEDED,
}


def error_code(code: str, *, retryable: bool = False) -> ErrorCode:
    """How `code` leaves the transports: the table first, then its family
    (`*.not_found` is 404; `definition.`, `expression.`, `duration.` and `request.`
    codes are 422), then 503 for a retryable error and 422 for any other."""
    if code in ERROR_CODES:
        return ERROR_CODES[code]
    if code.endswith(".not_found"):
        status = 404
    elif code.startswith(("definition.", "expression.", "duration.", "request.")):
        status = 422
    else:
        status = 503 if retryable else 422
    return ErrorCode(status, _CONNECT_BY_STATUS[status])


__all__ = ["ERROR_CODES", "ErrorCode", "error_code"]
