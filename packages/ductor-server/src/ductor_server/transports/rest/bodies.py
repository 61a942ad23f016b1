"""Request bodies: the JSON structs the API accepts, and how raw bytes become them.

A handler declares its body as a typed `data` parameter (`data: TriggerRunBody
| NoBody = NO_BODY`); `JsonBody`, the DTO of every /v1 route, decodes it
from the raw bytes with msgspec, strictly, so errors name the line and column
of bad JSON or the path of a wrong field, and describes the declared type in
the OpenAPI document. Nothing here touches the store.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, TypeVar, cast
from urllib.parse import unquote

import msgspec
from litestar.connection import ASGIConnection
from litestar.dto import AbstractDTO, DTOConfig, DTOFieldDefinition
from litestar.openapi.spec import Operation, Reference, RequestBody, Schema
from litestar.params import PathParameter
from litestar.typing import FieldDefinition

from ductor_server.services.json_limits import (
    INT64_MAX,
    INT64_MIN,
    MAX_DEPTH,
    may_be_unstorable,
    nesting_depth,
    too_deep_message,
    unstorable,
    validation_path,
)
from ductor_server.services.runs import RunRequest
from ductor_server.transports.rest.errors import ApiError

T = TypeVar("T")

_BYTE_AT = re.compile(r"\(byte (\d+)\)")

VersionPath = Annotated[
    str, PathParameter(description="An integer from 1 to 2^63-1, in plain decimal digits")
]
"""A `{version:str}` path parameter; `path_version` reads it (taken as text, so that
`abc` or `1.5` is a bad version, not an unknown route)."""

_DIGITS = re.compile(r"[0-9]{1,19}")
_SLASHES = re.compile(r"/{2,}")


def path_id(connection: ASGIConnection[Any, Any, Any, Any], param: str) -> str:
    """What the `{param:path}` parameter of a route names: an id or name that may
    hold a `/`, which a client sends as it is or as `%2F`.

    Litestar hands the parameter over from the decoded path with its slashes
    normalized (runs squeezed to one, one at the end dropped), so `a%2F` or `a/`
    would name `a`, another object. The name is read from the raw path instead,
    where the route's segments before it are counted; a raw path that does not
    line up with the route (a prefix with doubled slashes) keeps Litestar's value.
    """
    routed = str(connection.path_params[param]).removeprefix("/")
    scope = cast(Mapping[str, Any], connection.scope)  # a server may leave raw_path out
    template, raw = scope.get("path_template"), scope.get("raw_path")
    if not isinstance(template, str) or not isinstance(raw, bytes):
        return routed
    segments = template.split("/")
    # The template names the parameter `{param}` (Litestar drops its type there).
    markers = [
        i for i, part in enumerate(segments) if part in (f"{{{param}}}", f"{{{param}:path}}")
    ]
    if len(markers) != 1:
        return routed
    start = markers[0]
    raw_segments = raw.decode("latin-1").split("/")
    exact = unquote("/".join(raw_segments[start:]), errors="replace")
    return exact if _squeezed(exact) == _squeezed(routed) else routed


def _squeezed(path: str) -> str:
    return _SLASHES.sub("/", path).strip("/")


def path_version(text: str) -> int:
    """The version a `{version}` path parameter names: plain decimal digits, 1 up to
    the largest 64-bit integer (no sign, space, fraction or exponent).

    Raises:
        ApiError: `request.invalid` naming the parameter.
    """
    if _DIGITS.fullmatch(text) is not None and 1 <= (version := int(text)) <= INT64_MAX:
        return version
    reason = f"must be an integer from 1 to {INT64_MAX} in decimal digits"
    raise ApiError(
        f"version {reason}, not {text[:100]!r}",
        code="request.invalid",
        details={"path": "version", "reason": reason, "value": text[:100]},
    )


class NoBody(enum.Enum):
    """The type of `NO_BODY`: the request came without a body (or only whitespace)."""

    NO_BODY = "no body"


NO_BODY = NoBody.NO_BODY
"""The default of every `data` parameter: what a handler gets when no body was sent."""


@dataclass(frozen=True)
class DocumentedAs:
    """`Annotated` metadata of a `data` parameter decoded as one type (e.g. `Any`, so
    validation can report every problem) but described in OpenAPI as another."""

    schema: Any


class _In(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of request bodies: unknown fields are an error, not ignored."""


class EmptyBody(_In, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The body of a call that takes none, if one is sent: `{}`, as any field in it
    is unknown (refused, not ignored, as in every other body)."""


class TriggerRunBody(_In, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/runs`: start a run of a published family (latest version if none)."""

    family_slug: str
    version: int | None = None
    input: Any = None


class TriggerRunsBody(_In, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/runs/batch`: start up to 500 runs at once, all or none."""

    runs: tuple[RunRequest, ...]


class CancelRunBody(_In, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/runs/{id}/cancel`: an optional reason, kept in the history."""

    reason: str = ""


class RerunBody(_In, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/runs/{id}/rerun`: run the family's latest version instead of the old
    run's."""

    latest: bool = False


class SignalBody(_In, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/runs/{id}/signals/{name}`: the payload and an optional dedupe id."""

    payload: Any = None
    id: str | None = None


class EventBody(_In, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/events`: a named event; a repeated `id` is a duplicate."""

    name: str
    data: Any = None
    id: str | None = None


class AppUrlBody(_In, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/bridge/apps`: where the app's bridge endpoint is."""

    url: str


def line_column(raw: bytes, offset: int) -> tuple[int, int]:
    """The 1-based line and column (in characters) of byte `offset` in `raw`."""
    offset = max(0, min(offset, len(raw)))
    before = raw[:offset]
    line = before.count(b"\n") + 1
    line_start = before.rfind(b"\n") + 1
    column = len(raw[line_start:offset].decode("utf-8", "replace")) + 1
    return line, column


def too_deep() -> ApiError:
    """The error of a body nested deeper than `MAX_DEPTH`."""
    reason = too_deep_message()
    return ApiError(
        f"invalid request body at $: {reason}",
        code="request.invalid",
        details={"path": "$", "reason": reason},
    )


def check_limits(raw: bytes, value: Any) -> None:
    """Refuse a decoded body that nests deeper than `MAX_DEPTH`, or holds an integer
    outside 64 bits or a NUL character (which no store can keep): the limits of
    `services.json_limits`.

    Raises:
        ApiError: `request.invalid` naming the path.
    """
    if nesting_depth(raw) > MAX_DEPTH:
        raise too_deep()
    if not may_be_unstorable(raw):
        return
    found = unstorable(value)
    if found is not None:
        path, reason = found
        raise ApiError(
            f"invalid request body at {path}: {reason}",
            code="request.invalid",
            details={"path": path, "reason": reason},
        )


def malformed(raw: bytes, offset: int, text: str) -> ApiError:
    """The error of a body that is not JSON, pointing at byte `offset`."""
    line, column = line_column(raw, offset)
    return ApiError(
        f"malformed JSON at line {line}, column {column}: {text}",
        code="request.malformed_json",
        details={"line": line, "column": column, "byte": offset},
    )


def _bad_utf8_at(raw: bytes) -> int:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start
    return len(raw)


def empty_body() -> ApiError:
    """The error of a request that needs a body and sent none."""
    return ApiError(
        "the request needs a JSON body",
        code="request.invalid",
        details={"path": "$", "reason": "empty body"},
    )


def decode_body(raw: bytes, into: type[T], *, optional: bool = False, strict: bool = True) -> T:
    """Decode a JSON request body into `into`.

    Args:
        raw: the body bytes as received.
        into: the struct (or `Any`) to decode into.
        optional: an empty body means "all defaults" instead of an error.
        strict: False lets a string stand for a number or a boolean (proto3 JSON
            writes 64-bit integers as strings; Connect-RPC decodes so).

    Raises:
        ApiError: `request.malformed_json` (with line/column; also for invalid
            UTF-8) or `request.invalid` (with the field path; also for a body
            nested too deep or holding an integer outside 64 bits).
    """
    if not raw.strip():
        if optional:
            raw = b"{}"
        else:
            raise empty_body()
    try:
        value = msgspec.json.decode(raw, type=into, strict=strict)
    except UnicodeDecodeError:
        raise malformed(raw, _bad_utf8_at(raw), "invalid UTF-8") from None
    except RecursionError:
        raise too_deep() from None
    except msgspec.ValidationError as exc:
        path, reason = validation_path(exc)
        raise ApiError(
            f"invalid request body at {path}: {reason}",
            code="request.invalid",
            details={"path": path, "reason": reason},
        ) from None
    except msgspec.DecodeError as exc:
        text = str(exc)
        found = _BYTE_AT.search(text)
        offset = int(found.group(1)) if found else len(raw)
        lone = _lone_high_surrogate(raw) if found is None else None
        if lone is not None:  # the decoder calls it truncated input
            offset, text = lone, "a \\u escape of a high surrogate (D800-DBFF) must be"
            text += " followed by one of a low surrogate (DC00-DFFF)"
        raise malformed(raw, offset, text) from None
    check_limits(raw, value)
    return value


_HIGH_SURROGATE = re.compile(rb"(?<!\\)(?:\\\\)*\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])")


def _lone_high_surrogate(raw: bytes) -> int | None:
    """The byte offset of the first escaped high surrogate that no escaped low
    surrogate follows (`"\\ud800x"`), if there is one."""
    found = _HIGH_SURROGATE.search(raw)
    return None if found is None else found.end() - 6


def required(data: T | NoBody) -> T:
    """The body of a handler that needs one.

    Raises:
        ApiError: `request.invalid` with reason "empty body".
    """
    if isinstance(data, NoBody):
        raise empty_body()
    return data


def or_default(data: T | NoBody, default: T) -> T:
    """The body of a handler whose body is optional (`default` when none was sent)."""
    return default if isinstance(data, NoBody) else data


@dataclass
class OptionalBody(Operation):
    """The OpenAPI operation of a handler whose body may be left out (one that reads it
    with `or_default`): pass it as the handler's `operation_class`, so the document
    does not call the body required."""

    def __post_init__(self) -> None:
        if isinstance(self.request_body, RequestBody):
            self.request_body.required = False


def declared_type(field: FieldDefinition) -> Any:
    """The type a `data: X | NoBody` parameter is decoded as (X)."""
    if field.is_union:
        inner = [t for t in field.inner_types if not t.is_subclass_of(NoBody)]
        if len(inner) == 1:
            return inner[0].annotation
    return field.annotation


def documented_type(field: FieldDefinition) -> Any:
    """The type a `data` parameter is described as in OpenAPI."""
    for meta in field.metadata:
        if isinstance(meta, DocumentedAs):
            return meta.schema
    return declared_type(field)


class JsonBody(AbstractDTO[Any]):
    """The DTO of /v1 request bodies: msgspec decodes the raw bytes into the handler's
    declared `data` type; the OpenAPI document describes that type.

    Whitespace-only bodies decode to `NO_BODY`, as empty ones do.
    """

    config: ClassVar[DTOConfig] = DTOConfig()
    _fields: ClassVar[dict[str, FieldDefinition]] = {}

    @classmethod
    def generate_field_definitions(
        cls, model_type: type[Any]
    ) -> Generator[DTOFieldDefinition, None, None]:
        """Not used: bodies are decoded whole by msgspec, never field by field."""
        yield from ()

    @classmethod
    def detect_nested_field(cls, field_definition: FieldDefinition) -> bool:
        """Not used (see `generate_field_definitions`)."""
        return False

    @classmethod
    def create_for_field_definition(
        cls,
        field_definition: FieldDefinition,
        handler_id: str,
        backend_cls: Any = None,
    ) -> None:
        """Remember the handler's `data` declaration (called once per handler at startup)."""
        cls._fields[handler_id] = field_definition

    @classmethod
    def create_openapi_schema(
        cls, field_definition: FieldDefinition, handler_id: str, schema_creator: Any
    ) -> Reference | Schema:
        """Describe the declared body type (its component schema), with what the
        declaration's `Body(...)` adds (a description, `schema_extra`)."""
        schema: Reference | Schema = schema_creator.for_field_definition(
            FieldDefinition.from_annotation(
                documented_type(field_definition),
                kwarg_definition=field_definition.kwarg_definition,
            )
        )
        return schema

    def decode_bytes(self, value: bytes) -> Any:
        """Decode the body of this request.

        Raises:
            ApiError: malformed JSON or a body of the wrong shape.
        """
        if not value.strip():
            return NO_BODY
        return self.decode(value, declared_type(self.field()))

    def field(self) -> FieldDefinition:
        """The `data` declaration of the handler serving this request."""
        return self._fields[self.asgi_connection.route_handler.handler_id]

    def decode(self, raw: bytes, into: Any) -> Any:
        """Decode a non-blank body as `into` (a subclass may decode another way)."""
        return decode_body(raw, into)


__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MAX_DEPTH",
    "NO_BODY",
    "AppUrlBody",
    "CancelRunBody",
    "DocumentedAs",
    "EmptyBody",
    "EventBody",
    "JsonBody",
    "NoBody",
    "OptionalBody",
    "RerunBody",
    "SignalBody",
    "TriggerRunBody",
    "VersionPath",
    "check_limits",
    "decode_body",
    "empty_body",
    "line_column",
    "malformed",
    "nesting_depth",
    "or_default",
    "path_id",
    "path_version",
    "required",
    "too_deep",
]
