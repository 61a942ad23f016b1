"""The one table from error codes to HTTP statuses, and the handlers that apply it.

Every error leaves the API as `{"code", "message", "details"}` (the bridge's
signed routes wrap the same codes in the protocol's `ErrorResponse`). No
service logic here: this module only translates exceptions into responses and
tells the OpenAPI document about them.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException
from litestar.openapi import ResponseSpec

from ductor_core.errors import DuctorError

log = logging.getLogger("ductor_server.transports.rest")

#: Every stable error code the API answers with, and its HTTP status.
STATUS_BY_CODE: dict[str, int] = {
    # the request itself
    "request.malformed_json": 400,
    "request.invalid": 422,
    "request.too_large": 413,
    "request.unsupported_media_type": 415,
    "route.not_found": 404,
    "route.method_not_allowed": 405,
    # who is asking
    "auth.unauthenticated": 401,
    "auth.operator_only": 403,
    # replays
    "idempotency.conflict": 422,
    # definitions
    "definition.invalid": 422,
    "definition.malformed": 422,
    # not found (another tenant's object is not found too)
    "not_found": 404,
    "run.not_found": 404,
    "workflow.not_found": 404,
    "workflow.version_not_found": 404,
    # state conflicts and bad events
    "run.not_cancellable": 409,
    "run.ended": 409,
    "event.invalid": 422,
    # routing (issue 5)
    "routing.config": 422,
    "routing.routable_invalid": 422,
    "routing.assign_conflict": 409,
    "routing.config_conflict": 409,
    "routing.assignment_state": 409,
    "routing.in_use": 409,
    # the ledger (ductor_settlement's codes: every problem is in details.problems)
    "account.not_found": 404,
    "entry.not_found": 404,
    "settlement.naive_time": 422,
    "ledger.invalid_account": 422,
    "ledger.account_conflict": 409,
    "ledger.unknown_account": 422,
    "ledger.unknown_entry": 422,
    "ledger.invalid_entry": 422,
    "ledger.invalid_amount": 422,
    "ledger.currency_mismatch": 422,
    "ledger.unbalanced": 422,
    "ledger.over_reversal": 422,
    "ledger.floor_crossed": 422,
    "ledger.idempotency_conflict": 409,
    "ledger.batch_conflict": 409,
    "hold.invalid": 422,
    # wallet top-ups through a payment processor
    "topup.not_found": 404,
    "wallet.unavailable": 503,
    "wallet.processor_error": 422,
    "wallet.processor_unreachable": 503,
    "webhook.signature_invalid": 400,
    "hold.not_found": 404,
    "hold.conflict": 409,
    "hold.expired": 409,
    "hold.already_final": 409,
    "hold.amount_exceeded": 422,
    "settlement.invalid": 422,
    "settlement.not_found": 404,
    "pricing.invalid_rule": 422,
    "pricing.no_rule": 422,
    "pricing.invalid_charge": 422,
    "return.invalid_policy": 422,
    "return.not_returnable": 422,
    "return.window_closed": 422,
    "return.reason_not_allowed": 422,
    "return.rate_exceeded": 422,
    "return.already_returned": 409,
    "return.invalid_amount": 422,
    "metering.invalid": 422,
    "meter.not_found": 404,
    "meter.conflict": 409,
    "budget.not_found": 404,
    "budget.conflict": 409,
    "plan.not_found": 404,
    "plan.conflict": 409,
    "budget.exceeded": 429,
    "entitlement.missing": 403,
    "entitlement.limit_exceeded": 403,
    "receipt.not_found": 404,
    "receipt.malformed": 422,
    "receipt.wrong_payload_type": 422,
    "receipt.unknown_key": 422,
    "receipt.bad_signature": 422,
    "receipt.not_canonical": 422,
    "receipt.invalid_key": 422,
    # connections and their secrets
    "connection.not_found": 404,
    "connection.invalid": 422,
    "connection.conflict": 409,
    "provider.unknown": 422,
    "secrets.unconfigured": 503,
    "secrets.undecryptable": 503,
    # the inbox
    "inbox.not_found": 404,
    "notification.not_found": 404,
    "email.not_found": 404,
    "notification.not_actionable": 422,
    # the inference proxy
    "ai.no_connection": 422,
    "ai.connection_unsupported": 422,
    "ai.request_not_found": 404,
    "ai.price_not_found": 404,
    "ai.upstream_error": 502,
    "ai.upstream_timeout": 504,
    # the server
    "outbound.forbidden": 422,
    "service.unavailable": 503,
    "storage.unavailable": 503,
    "internal": 500,
}


def status_for(code: str, *, retryable: bool = False) -> int:
    """The HTTP status for an error code: the table first, then code families."""
    if code in STATUS_BY_CODE:
        return STATUS_BY_CODE[code]
    if code.endswith(".not_found"):
        return 404
    if code.startswith(("definition.", "expression.", "duration.", "request.")):
        return 422
    return 503 if retryable else 422


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    """The JSON body of every error response."""

    code: str
    message: str
    details: Any = None


class ApiError(DuctorError):
    """An error raised by the API layer itself (body, size, route problems)."""


#: The error answers every /v1 operation may give, for the OpenAPI document.
V1_ERRORS: dict[int, ResponseSpec] = {
    status: ResponseSpec(data_container=ErrorBody, description=description)
    for status, description in {
        400: "Malformed JSON (`request.malformed_json`, with line and column)",
        401: "Missing, unknown or revoked API key (`auth.unauthenticated`)",
        403: "The tenant's plan does not allow it (`entitlement.missing`, ...)",
        404: "Not found for this tenant (`*.not_found`)",
        409: "The object's state forbids this (`run.not_cancellable`, `run.ended`, ...)",
        413: "Body over the size limit (`request.too_large`)",
        415: "The body is not JSON (`request.unsupported_media_type`)",
        422: "Invalid request (`request.invalid`, `definition.invalid`, `idempotency.conflict`)",
        429: "A blocking budget would be passed (`budget.exceeded`)",
        502: "The AI upstream answered an error or could not be reached (`ai.upstream_error`)",
        504: "The AI upstream did not answer in time (`ai.upstream_timeout`)",
        503: "Cannot answer right now; retry (`service.unavailable`, `storage.unavailable`)",
    }.items()
}


def also_ok(model: type[Any], description: str) -> dict[int, ResponseSpec]:
    """`V1_ERRORS` plus a 200 answer, for a mutation that answers 201 when it creates
    and 200 when it replaces or finds what was there."""
    return {**V1_ERRORS, 200: ResponseSpec(data_container=model, description=description)}


def error_response(code: str, message: str, details: Any = None, *, status: int) -> Response[Any]:
    """Build the one error response shape."""
    body = msgspec.to_builtins(ErrorBody(code=code, message=message, details=details))
    return Response(content=body, status_code=status, media_type=MediaType.JSON)


def handle_ductor_error(_: Request[Any, Any, Any], exc: DuctorError) -> Response[Any]:
    """Map any `DuctorError` through the table."""
    details = exc.details
    if details is not None:
        details = msgspec.to_builtins(details)
    return error_response(
        exc.code,
        exc.message,
        details,
        status=status_for(exc.code, retryable=exc.retryable),
    )


_HTTP_CODES: dict[int, tuple[str, str]] = {
    404: ("route.not_found", "no such route"),
    405: ("route.method_not_allowed", "method not allowed on this route"),
    413: ("request.too_large", "request body is larger than the limit"),
    415: ("request.unsupported_media_type", "send the body as application/json"),
}


def handle_http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    """Framework errors (unknown route, wrong method, body too large) in the same shape."""
    status = exc.status_code
    if status in _HTTP_CODES:
        code, message = _HTTP_CODES[status]
        details: Any = None
        if status == 413:
            details = {"max_body_bytes": request.app.state.settings.max_body_bytes}
        elif status in (404, 405):
            details = {"method": request.method, "path": request.url.path}
        return error_response(code, message, details, status=status)
    if status >= 500:
        log.error("server error on %s %s: %s", request.method, request.url.path, exc.detail)
        return error_response("internal", "internal server error", status=status)
    # Litestar's own validation (query and path parameters, headers).
    return error_response(
        "request.invalid",
        str(exc.detail),
        exc.extra or None,
        status=STATUS_BY_CODE["request.invalid"] if status == 400 else status,
    )


def handle_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """Anything else is a bug: log it, answer 500 without leaking internals."""
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response("internal", "internal server error", status=500)


EXCEPTION_HANDLERS: dict[int | type[Exception], Any] = {
    DuctorError: handle_ductor_error,
    HTTPException: handle_http_exception,
    Exception: handle_unexpected,
}
