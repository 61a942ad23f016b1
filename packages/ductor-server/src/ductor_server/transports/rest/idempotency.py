"""The `Idempotency-Key` header and the `Idempotency-Replayed` answer header.

The key is checked here and handed to the service, which claims it in the
transaction of its effect (`ductor_server.services.idempotency`); this module
only turns the service's `Answer` into a response. No route handlers here.
"""

from __future__ import annotations

from typing import Annotated, TypeVar

from litestar import MediaType, Response
from litestar.params import HeaderParameter

from ductor_server.services import Answer
from ductor_server.services.idempotency import KEY_RULE, usable_key
from ductor_server.transports.rest.errors import ApiError

T = TypeVar("T")

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotency-Replayed"

IdempotencyKey = Annotated[
    str | None,
    HeaderParameter(
        name=HEADER,
        description="Makes the call idempotent: a repeat with the same key and body "
        "gets the first answer again.",
    ),
]
"""The type of a handler's `idempotency_key` parameter."""


def checked_key(key: str | None) -> str | None:
    """The header's key; None when the request has none.

    Raises:
        ApiError: `request.invalid` for an empty, blank or oversized key, or
            one holding a control character.
    """
    if key is None:
        return None
    if not usable_key(key):
        raise ApiError(
            f"{HEADER} must be {KEY_RULE}",
            code="request.invalid",
            details={"header": HEADER},
        )
    return key


def answered(answer: Answer[T]) -> Response[T]:
    """The response of a mutation: its value, its outcome as the status, and
    `Idempotency-Replayed: true` when it is a remembered answer."""
    headers = {REPLAYED_HEADER: "true"} if answer.replayed else None
    return Response(
        content=answer.value,
        status_code=int(answer.outcome),
        media_type=MediaType.JSON,
        headers=headers,
    )


__all__ = ["HEADER", "REPLAYED_HEADER", "IdempotencyKey", "answered", "checked_key"]
