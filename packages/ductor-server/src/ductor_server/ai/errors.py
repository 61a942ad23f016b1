"""Errors of the inference proxy, each a `ServerError` with a stable code; no HTTP here.

ServerError
 ├── NotFoundError
 │    ├── AiRequestNotFound         ai.request_not_found
 │    └── PriceNotFound             ai.price_not_found
 ├── AiNoConnection                ai.no_connection
 ├── AiConnectionUnsupported       ai.connection_unsupported
 ├── AiUpstreamError               ai.upstream_error (details: upstream status and error)
 └── AiUpstreamTimeout             ai.upstream_timeout
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

    def __init__(self) -> None:
        super().__init__(
            "name the upstream connection: the Ductor-Connection header, the body's"
            " ductor_connection, or a default (PUT /v1/ai/settings)",
            details={"pointer": "/ductor_connection"},
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


__all__ = [
    "AiConnectionUnsupported",
    "AiNoConnection",
    "AiRequestNotFound",
    "AiUpstreamError",
    "AiUpstreamTimeout",
    "PriceNotFound",
]
