"""The Connect-RPC server proper: the `connectrpc` library's ASGI application over
an endpoint's methods, with the msgspec JSON codec and the authenticating
interceptor (the order of checks is in `endpoint.py`).

`ConnectEndpoint` imports this module on the first Connect request, so a server
that is never called over Connect does not load `connectrpc` and `protobuf`.
"""

from __future__ import annotations

import base64
import logging
import re
import zlib
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qs

import msgspec
from connectrpc.code import Code
from connectrpc.compression.gzip import GzipCompression
from connectrpc.errors import ConnectError
from connectrpc.method import IdempotencyLevel, MethodInfo, StreamType
from connectrpc.request import RequestContext
from connectrpc.server import ConnectASGIApplication, Endpoint
from protobuf import Oneof
from protobuf.wkt import ListValue, Struct, Value

from ductor_core.errors import DuctorError
from ductor_server.errors import RequestInvalid, shown
from ductor_server.services import Answer
from ductor_server.services.keys import Caller, Scope
from ductor_server.transports.connect.method import PACKAGE, Method
from ductor_server.transports.error_codes import error_code
from ductor_server.transports.rest.auth import bearer_token
from ductor_server.transports.rest.bodies import decode_body
from ductor_server.transports.rest.errors import ApiError, body_too_large
from ductor_server.transports.rest.idempotency import HEADER, REPLAYED_HEADER, checked_key
from ductor_server.transports.rest.scopes import scope_for

if TYPE_CHECKING:
    from ductor_server.transports.connect.endpoint import ConnectEndpoint

log = logging.getLogger("ductor_server.transports.connect")

_CALLER: ContextVar[Caller] = ContextVar("ductor_connect_caller")


def _value(data: Any) -> Value:
    """`data` as a `google.protobuf.Value`. An integer is kept as one (`from_python`
    makes it a float), so the detail's JSON (`debug`) writes it as REST does; its
    binary form is a double either way."""
    if isinstance(data, int) and not isinstance(data, bool):
        number: Oneof[Literal["number_value"], float] = Oneof(field="number_value", value=data)
        return Value(kind=number)
    if isinstance(data, dict):
        fields = {key: _value(item) for key, item in data.items()}
        struct: Oneof[Literal["struct_value"], Struct] = Oneof(
            field="struct_value", value=Struct(fields=fields)
        )
        return Value(kind=struct)
    if isinstance(data, list):
        values = [_value(item) for item in data]
        array: Oneof[Literal["list_value"], ListValue] = Oneof(
            field="list_value", value=ListValue(values=values)
        )
        return Value(kind=array)
    return Value.from_python(data)


def _detail(error: DuctorError) -> dict[str, Any]:
    return {"code": error.code, "details": shown(error)[1]}


def connect_error(error: DuctorError) -> ConnectError:
    """`error` as Connect sends it: the table's Connect code, the same message, and a
    `google.protobuf.Struct` detail `{code, details}` (Ductor's stable code and the
    REST error's `details`)."""
    detail = Struct(fields={k: _value(v) for k, v in _detail(error).items()})
    mapped = error_code(error.code, retryable=error.retryable)
    return ConnectError(Code(mapped.connect), shown(error)[0], [detail])


def _error_json(error: DuctorError) -> bytes:
    """`error` as Connect's error JSON, written as the library writes a method's."""
    connect = connect_error(error)
    [detail] = connect.details
    return msgspec.json.encode(
        {
            "code": connect.code.value,
            "message": connect.message,
            "details": [
                {
                    "type": detail.type_name,
                    "value": base64.b64encode(detail.message_bytes).decode().rstrip("="),
                    "debug": _detail(error),
                }
            ],
        }
    )


def _internal() -> ConnectError:
    return connect_error(ApiError("internal server error", code="internal"))


class MsgspecJsonCodec:
    """The `json` codec: msgspec decodes a request strictly into its struct (an
    int64 may come as a decimal string, as proto3 JSON writes it) and encodes the
    service's answer as is, the same JSON REST answers."""

    def name(self) -> str:
        """The codec's name (`application/json`)."""
        return "json"

    def encode(self, message: Any) -> bytes:
        """The JSON of a response message."""
        return msgspec.json.encode(message)

    def decode(self, data: bytes | bytearray, message_class: type[Any]) -> Any:
        """Decode a request message.

        Raises:
            ConnectError: `invalid_argument`, with REST's message and details.
        """
        try:
            return decode_body(bytes(data), message_class, optional=True, strict=False)
        except DuctorError as error:
            raise connect_error(error) from None


class Authenticate:
    """The leading metadata interceptor: finds the caller from its API key,
    and checks that the key holds the scope of the REST call the method mirrors,
    before the request's body is read."""

    def __init__(self, endpoint: ConnectEndpoint) -> None:
        self._endpoint = endpoint
        self._scopes = {
            (f"{PACKAGE}.{spec.service}", spec.name): scope_for(*spec.rest.split(" ", 1))
            for spec in endpoint.methods
        }

    async def on_start(self, ctx: RequestContext[Any, Any]) -> object:
        """Resolve the caller; it is what the method's call is given.

        Raises:
            ConnectError: `unauthenticated`, `permission_denied` (the key lacks the
                scope), or `unavailable` when not serving.
        """
        info = ctx.method
        try:
            key = bearer_token(ctx.request_headers.get("authorization"))
            caller = await self._endpoint.services.keys.authenticate(key)
            # A method unknown here cannot be routed; it needs `admin`, as a REST
            # route missing from the scope table does.
            needed = self._scopes.get((info.service_name, info.name), Scope.ADMIN)
            if needed is not None:
                caller.require(needed)
        except DuctorError as error:
            raise connect_error(error) from None
        return _CALLER.set(caller)

    async def on_end(
        self, token: object, ctx: RequestContext[Any, Any], error: Exception | None, /
    ) -> None:
        """Nothing to undo (the caller lives in the request's own context)."""


def _method_info(spec: Method) -> MethodInfo[Any, Any]:
    return MethodInfo(
        name=spec.name,
        service_name=f"{PACKAGE}.{spec.service}",
        input=spec.request,
        output=object,
        idempotency_level=IdempotencyLevel.NO_SIDE_EFFECTS
        if spec.read_only
        else IdempotencyLevel.UNKNOWN,
        stream_type=StreamType.UNARY,
    )


def _function(endpoint: ConnectEndpoint, spec: Method) -> Any:
    async def call(request: Any, ctx: RequestContext[Any, Any]) -> Any:
        try:
            key = checked_key(ctx.request_headers.get(HEADER)) if spec.mutates else None
            value = await spec.call(endpoint.services, _CALLER.get(), request, key)
        except DuctorError as error:
            raise connect_error(error) from None
        except ConnectError:
            raise
        except Exception:
            log.exception("%s failed", spec.path)
            raise _internal() from None
        if isinstance(value, Answer):
            if value.replayed:
                ctx.response_headers[REPLAYED_HEADER] = "true"
            value = value.value
        return spec.message(value)

    return call


class _Application(ConnectASGIApplication["ConnectEndpoint"]):
    """The library's ASGI application; its endpoints are every method's path."""

    @property
    def path(self) -> str:
        return f"/{PACKAGE}."


def _limited(scope: Any, receive: Any, max_body_bytes: int) -> Any:
    """`receive`, refusing a body over `max_body_bytes` as REST does (Connect
    `resource_exhausted`, detail `request.too_large` with the limit): at once when
    `content-length` says so, else when the bytes read pass it."""
    declared = dict(scope.get("headers") or ()).get(b"content-length", b"")
    declared_size = int(declared) if declared.isdigit() else 0
    read = 0

    async def limited_receive() -> Any:
        nonlocal read
        if declared_size > max_body_bytes:
            raise connect_error(body_too_large(max_body_bytes))
        message = await receive()
        if message.get("type") == "http.request":
            read += len(message.get("body", b""))
            if read > max_body_bytes:
                raise connect_error(body_too_large(max_body_bytes))
        return message

    return limited_receive


_CONTENT_ENCODING = ("the header", {"header": "Content-Encoding"})
_COMPRESSION = ("the parameter", {"parameter": "compression"})
_COMPRESSED_BY: ContextVar[tuple[str, dict[str, str]]] = ContextVar(
    "ductor_connect_compressed_by", default=_CONTENT_ENCODING
)
"""Where the request says it is gzip: GET's `compression` parameter, else the
`Content-Encoding` header (for the message and details of its refusal)."""


class _Gzip(GzipCompression):
    """The library's gzip, whose refusal of a body that inflates past the limit
    carries REST's `request.too_large` detail, as a body sent that large does, and
    of a body that is not gzip a `request.invalid` naming the header (or GET's
    parameter) that said it was."""

    def decompress(
        self, data: bytes | bytearray | memoryview, read_max_bytes: int | None = None
    ) -> bytes:
        try:
            return super().decompress(data, read_max_bytes)
        except (zlib.error, OSError, EOFError):
            where, details = _COMPRESSED_BY.get()
            message = f"the request body is not gzip, as {where} {_details_name(details)} says"
            error = RequestInvalid(message, details=details)
            raise connect_error(error) from None
        except ConnectError as exc:
            if read_max_bytes is None or exc.code != Code.RESOURCE_EXHAUSTED:
                raise
            raise connect_error(body_too_large(read_max_bytes)) from None


_BASE64URL = re.compile(r"(?:[A-Za-z0-9_-]{4})*(?:[A-Za-z0-9_-]{2,3}={0,2})?")
"""URL-safe base64, padded or not (`base64=1` on a GET)."""


def _details_name(details: dict[str, str]) -> str:
    """The one name in a `{header|parameter: name}` detail."""
    [name] = details.values()
    return name


def _encoding_refused(scope: Any) -> DuctorError | None:
    """The refusal of a request compressed other than by gzip (or of a GET whose
    `connect` or base64 `message` is wrong), else None.

    A POST's `Content-Encoding` is read as HTTP has it (case-insensitive, a list
    whose `identity` entries change nothing) and handed on as `gzip` or not at
    all; a GET's `compression` is Connect's, one exact name. Another coding is
    bad input: the library would answer it `unimplemented`, a 501.
    """
    if scope["method"] == "GET":
        query_string: bytes = scope.get("query_string", b"")
        params = parse_qs(query_string.decode("latin-1"), keep_blank_values=True)
        named = params.get("compression", [""])[0]
        _COMPRESSED_BY.set(_COMPRESSION)
        if params.get("connect", ["v1"])[0] != "v1":
            # The query's form of Connect-Protocol-Version, which the library skips.
            return RequestInvalid(
                "connect must be v1: the Connect protocol's version 1 is served",
                details={"parameter": "connect"},
            )
        message = params.get("message", [""])[0]
        if params.get("base64", [""])[0] == "1" and not _BASE64URL.fullmatch(message):
            # The library's decoder would skip what is not base64 and read the rest.
            return RequestInvalid(
                "the message is not URL-safe base64, as base64=1 says",
                details={"parameter": "message"},
            )
        if named in ("", "identity", "gzip"):
            return None
        what, details = named, _COMPRESSION[1]
    else:
        _COMPRESSED_BY.set(_CONTENT_ENCODING)
        headers: list[tuple[bytes, bytes]] = list(scope.get("headers") or ())
        given = [value for name, value in headers if name == b"content-encoding"]
        codings = [coding.strip().lower() for value in given for coding in value.split(b",")]
        codings = [coding for coding in codings if coding not in (b"", b"identity")]
        if codings in ([], [b"gzip"]):
            kept = [(name, value) for name, value in headers if name != b"content-encoding"]
            scope["headers"] = kept + [(b"content-encoding", b"gzip")] * len(codings)
            return None
        what, details = b", ".join(given).decode("latin-1"), _CONTENT_ENCODING[1]
    shown_what = what if len(what) <= 40 else what[:40] + "..."
    return RequestInvalid(
        f"{_details_name(details)} {shown_what!r} is not served: send the message plain or gzip",
        details=details,
    )


def _unsupported_media(scope: Any, read_only: bool) -> bool:
    """The request is in a form other than Connect's unary JSON: a POST whose
    `Content-Type` is not `application/json` (the library would take `json` alone,
    and `application/grpc...` as gRPC or gRPC-web), or a GET of a read-only method
    without `encoding=json`. Other HTTP methods are left to the library (405)."""
    if scope["method"] == "POST":
        # One Content-Type, JSON's (of two, the library would read the first).
        given = [value for name, value in scope.get("headers") or () if name == b"content-type"]
        media = [value.partition(b";")[0].strip().lower() for value in given]
        return media != [b"application/json"]
    if scope["method"] == "GET" and read_only:
        query_string: bytes = scope.get("query_string", b"")
        encoding = parse_qs(query_string.decode("latin-1")).get("encoding", [""])[0]
        return encoding != "json"
    return False


def _as_rest_reads_them(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """`headers` with every value past ASCII re-encoded from Latin-1 to UTF-8: the
    library decodes values as UTF-8 (a byte that is not UTF-8 would be its 500),
    REST as Latin-1, so a key (`Idempotency-Key`) reads the same over both."""
    return [
        (name, value if value.isascii() else value.decode("latin-1").encode())
        for name, value in headers
    ]


def _accepts_gzip(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether `Accept-Encoding` names gzip (or `*`) with a q-value above 0, read as
    HTTP has it: case-insensitive, with parameters (the library matches each entry
    whole, so `gzip;q=1.0` and `GZIP` would get a plain answer)."""
    for name, value in headers:
        if name != b"accept-encoding":
            continue
        for entry in value.decode("latin-1").split(","):
            coding, *params = (part.strip().lower() for part in entry.split(";"))
            if coding not in ("gzip", "x-gzip", "*"):
                continue
            weight = next((p[2:].strip() for p in params if p.startswith("q=")), "1")
            try:
                if float(weight) > 0:
                    return True
            except ValueError:
                continue
    return False


async def _send_empty(send: Any, status: int, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


async def _send_error(send: Any, status: int, error: DuctorError) -> None:
    body = _error_json(error)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def build_application(endpoint: ConnectEndpoint, *, max_body_bytes: int) -> Any:
    """The ASGI application serving every method of `endpoint`."""
    endpoints = {
        spec.path: Endpoint.unary(_method_info(spec), _function(endpoint, spec))
        for spec in endpoint.methods
    }
    read_only = {spec.path: spec.read_only for spec in endpoint.methods}
    application = _Application(
        service=endpoint,
        endpoints=lambda _: endpoints,
        interceptors=[Authenticate(endpoint)],
        read_max_bytes=max_body_bytes,
        compressions=[_Gzip()],
        codecs=[MsgspecJsonCodec()],
    )

    async def limited(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] not in endpoints:
            # As REST answers an unknown route (the library answers an empty 404).
            unknown = ApiError(
                "no such route",
                code="route.not_found",
                details={"method": scope["method"], "path": scope["path"]},
            )
            await _send_error(send, 404, unknown)
            return
        path = scope["path"]
        headers = _as_rest_reads_them(list(scope.get("headers") or ()))
        # The library gzips an answer when an entry of Accept-Encoding is `gzip`.
        accepted = [(b"accept-encoding", b"gzip")] if _accepts_gzip(headers) else []
        scope["headers"] = [h for h in headers if h[0] != b"accept-encoding"] + accepted
        if _unsupported_media(scope, read_only[path]):
            # Only the JSON codec is served (the library's own 415 offers proto too).
            await _send_empty(send, 415, [(b"accept-post", b"application/json")])
            return
        served = scope["method"] == "POST" or (scope["method"] == "GET" and read_only[path])
        if served and (refused := _encoding_refused(scope)):
            # Read before the key, as Content-Type is.
            await _send_error(send, 400, refused)
            return
        await application(scope, _limited(scope, receive, max_body_bytes), send)

    return limited


__all__ = ["Authenticate", "MsgspecJsonCodec", "build_application", "connect_error"]
