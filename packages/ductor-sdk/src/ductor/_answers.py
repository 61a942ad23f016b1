"""Reading the server's HTTP answers: the error body and typed decoding.

Shared by the REST client (api) and the bridge client (client); sends nothing.
"""

from __future__ import annotations

from typing import Any, TypeVar

import httpx
import msgspec

from ductor.errors import ApiError
from ductor.protocol import UNREADABLE_JSON

T = TypeVar("T")


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    """The server's error shape, read leniently (unknown fields are ignored)."""

    code: str = "api.error"
    message: str = ""
    details: Any = None


def decode_answer(method: str, path: str, response: httpx.Response, type_: type[T]) -> T:
    """The answer's JSON body as `type_`.

    Raises:
        ApiError: `api.bad_response` when the body does not decode as `type_`.
    """
    try:
        return msgspec.json.decode(response.content, type=type_)
    except UNREADABLE_JSON as exc:
        raise ApiError(
            f"{method} {path}: unexpected answer: {exc}",
            status=response.status_code,
            code="api.bad_response",
        ) from None
