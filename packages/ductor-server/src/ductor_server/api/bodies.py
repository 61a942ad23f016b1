"""Request bodies: the JSON structs the API accepts and how raw bytes become them.

Decoding errors name where the problem is (line and column for bad JSON, a
field path for wrong types). Nothing here touches the store.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from ductor_server.api.errors import ApiError

T = TypeVar("T")

_BYTE_AT = re.compile(r"\(byte (\d+)\)")
_PATH_AT = re.compile(r" - at `([^`]*)`$")


class _In(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of request bodies: unknown fields are an error, not ignored."""


class TriggerRunBody(_In, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/runs`: start a run of a published family (latest version if none)."""

    family_slug: str
    version: int | None = None
    input: Any = None


class CancelRunBody(_In, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/runs/{id}/cancel`: an optional reason, kept in the history."""

    reason: str = ""


class SignalBody(_In, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/runs/{id}/signals/{name}`: the payload and an optional dedupe id."""

    payload: Any = None
    id: str | None = None


class EventBody(_In, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/events`: a named event; a repeated `id` is a duplicate."""

    name: str
    data: Any = None
    id: str | None = None


def line_column(raw: bytes, offset: int) -> tuple[int, int]:
    """The 1-based line and column (in characters) of byte `offset` in `raw`."""
    offset = max(0, min(offset, len(raw)))
    before = raw[:offset]
    line = before.count(b"\n") + 1
    line_start = before.rfind(b"\n") + 1
    column = len(raw[line_start:offset].decode("utf-8", "replace")) + 1
    return line, column


def decode_body(raw: bytes, into: type[T], *, optional: bool = False) -> T:
    """Decode a JSON request body into `into`.

    Args:
        raw: the body bytes as received.
        into: the struct (or `Any`) to decode into.
        optional: an empty body means "all defaults" instead of an error.

    Raises:
        ApiError: `request.malformed_json` (with line/column) or
            `request.invalid` (with the field path).
    """
    if not raw.strip():
        if optional:
            return msgspec.json.decode(b"{}", type=into)
        raise ApiError(
            "the request needs a JSON body",
            code="request.invalid",
            details={"path": "$", "reason": "empty body"},
        )
    try:
        return msgspec.json.decode(raw, type=into)
    except msgspec.ValidationError as exc:
        text = str(exc)
        match = _PATH_AT.search(text)
        path = match.group(1) if match else "$"
        reason = text[: match.start()] if match else text
        raise ApiError(
            f"invalid request body at {path}: {reason}",
            code="request.invalid",
            details={"path": path, "reason": reason},
        ) from None
    except msgspec.DecodeError as exc:
        text = str(exc)
        found = _BYTE_AT.search(text)
        offset = int(found.group(1)) if found else len(raw)
        line, column = line_column(raw, offset)
        raise ApiError(
            f"malformed JSON at line {line}, column {column}: {text}",
            code="request.malformed_json",
            details={"line": line, "column": column, "byte": offset},
        ) from None
