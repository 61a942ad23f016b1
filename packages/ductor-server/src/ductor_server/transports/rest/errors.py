"""The HTTP side of the one error table (`transports/error_codes.py`), and the
handlers that apply it.

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
from ductor_server.errors import bounded
from ductor_server.transports.error_codes import ERROR_CODES, error_code

log = logging.getLogger("ductor_server.transports.rest")

#: Every stable error code the API answers with, and its HTTP status (read from the
#: one table, `transports/error_codes.py`, which also gives each its Connect code).
STATUS_BY_CODE: dict[str, int] = {code: mapped.http for code, mapped in ERROR_CODES.items()}


def status_for(code: str, *, retryable: bool = False) -> int:
    """The HTTP status for an error code: the table first, then code families."""
    return error_code(code, retryable=retryable).http


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
        401: "Missing, unknown or revoked API key (`auth.unauthenticated`), or an expired"
        " one (`auth.key_expired`)",
        403: "The API key lacks the scope the call needs (`auth.forbidden`), or the"
        " tenant's plan does not allow it (`entitlement.missing`, ...)",
        404: "Not found for this tenant (`*.not_found`)",
        409: "The object's state forbids this (`run.not_cancellable`, `run.ended`, ...)",
        413: "Body over the size limit (`request.too_large`)",
        415: "Reserved (`request.unsupported_media_type`): no call answers it today, as a"
        " body is read as JSON whatever its Content-Type",
        422: "Invalid request (`request.invalid`, `definition.invalid`, `idempotency.conflict`)",
        429: "A blocking budget would be passed (`budget.exceeded`), or too many requests"
        " wait for runs (`run.wait_limit`)",
        502: "The AI upstream answered an error or could not be reached (`ai.upstream_error`)",
        504: "The AI upstream did not answer in time (`ai.upstream_timeout`)",
        503: "Cannot answer right now; retry (`service.unavailable`, `storage.unavailable`)",
    }.items()
}


def also_ok(model: type[Any], description: str) -> dict[int, ResponseSpec]:
    """`V1_ERRORS` plus a 200 answer, for a mutation that answers 201 when it creates
    and 200 when it replaces or finds what was there."""
    return {**V1_ERRORS, 200: ResponseSpec(data_container=model, description=description)}


def also_created(model: type[Any], description: str) -> dict[int, ResponseSpec]:
    """`V1_ERRORS` plus a 201 answer, for a replacing mutation (200) that answers
    201 when there was nothing to replace."""
    return {**V1_ERRORS, 201: ResponseSpec(data_container=model, description=description)}


def error_response(code: str, message: str, details: Any = None, *, status: int) -> Response[Any]:
    """Build the one error response shape (the message and details `bounded`)."""
    message, details = bounded(message, details)
    body = msgspec.to_builtins(ErrorBody(code=code, message=message, details=details))
    return Response(content=body, status_code=status, media_type=MediaType.JSON)


def body_too_large(max_body_bytes: int) -> ApiError:
    """The refusal of a body over `max_body_bytes` (413 `request.too_large`), as the
    transports that read a body themselves (MCP, Connect) give it."""
    return ApiError(
        "request body is larger than the limit",
        code="request.too_large",
        details={"max_body_bytes": max_body_bytes},
    )


def handle_ductor_error(_: Request[Any, Any, Any], exc: DuctorError) -> Response[Any]:
    """Map any `DuctorError` through the table."""
    return error_response(
        exc.code, exc.message, exc.details, status=status_for(exc.code, retryable=exc.retryable)
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
        _parameter_problems(exc.extra) or str(exc.detail),
        exc.extra or None,
        status=STATUS_BY_CODE["request.invalid"] if status == 400 else status,
    )


def _parameter_problems(extra: Any) -> str | None:
    """The message of the framework's parameter problems (`[{"key", "message",
    "source"}]`), naming each parameter and what is wrong with it."""
    if not isinstance(extra, list) or not extra:
        return None
    parts = []
    for problem in extra:
        if not isinstance(problem, dict) or "key" not in problem:
            return None
        where = problem.get("source")
        where = str(getattr(where, "value", where) or "")  # a ParamType, or its text
        source = {"query": "query parameter", "path": "path parameter"}.get(
            where, f"{where} parameter" if where else "parameter"
        )
        parts.append(f"invalid {source} `{problem['key']}`: {problem.get('message', '')}")
    return "; ".join(parts)


def handle_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """Anything else is a bug: log it, answer 500 without leaking internals."""
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response("internal", "internal server error", status=500)


EXCEPTION_HANDLERS: dict[int | type[Exception], Any] = {
    DuctorError: handle_ductor_error,
    HTTPException: handle_http_exception,
    Exception: handle_unexpected,
}
