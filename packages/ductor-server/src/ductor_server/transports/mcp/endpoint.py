"""`/mcp`: the MCP server over streamable HTTP, mounted in the Litestar app.

Every request is checked before any MCP work: the API key (the same
`Authorization: Bearer` as REST; 401 `auth.unauthenticated` or
`auth.key_expired` otherwise; each tool then needs the scope of the REST call it
mirrors, see `server.py`), then
the method (405 `route.method_not_allowed` but for POST: stateless, the server
opens no stream for a GET and keeps no session for a DELETE to end), then the
body size (413 `request.too_large` over `max_body_bytes`); the body is read as
JSON whatever its Content-Type, as REST reads one. These refusals
are JSON-RPC error bodies whose `error.data` is the REST error body, so an MCP
client shows the reason. The session manager runs stateless with JSON answers:
any `ductor serve` process can answer any request, no session is kept.

The `mcp` library's JSON parsers give up on arrays and objects nested ~200 (or
~1,000) levels deep and on integers of thousands of digits, answering a bare
JSON-RPC parse error. Such a value is refused by the tool anyway (deeper than
`MAX_DEPTH`, outside 64 bits), so `parseable` first cuts what nests deeper than
`PARSED_DEPTH` down to `[]` and shortens a long integer to 20 digits: the tool then
refuses the argument by name, as it refuses one nested 65 levels deep.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeAlias, cast

import msgspec
from litestar import types as asgi_types
from litestar.handlers import ASGIRouteHandler, asgi

from ductor_core.errors import DuctorError
from ductor_server.json_depth import MAX_DEPTH, nesting_depth
from ductor_server.services import Services
from ductor_server.services.tools import error_body
from ductor_server.transports.rest.auth import bearer_token
from ductor_server.transports.rest.errors import ApiError, body_too_large, status_for

if TYPE_CHECKING:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

MCP_PATH = "/mcp"
"""Where the MCP server is mounted."""

Scope: TypeAlias = MutableMapping[str, Any]
Message: TypeAlias = MutableMapping[str, Any]
Receive: TypeAlias = Callable[[], Awaitable[Message]]
Send: TypeAlias = Callable[[Message], Awaitable[None]]

INVALID_REQUEST = -32600
"""The JSON-RPC error code of a refused request."""

INVALID_PARAMS = -32602
"""The JSON-RPC error code of a request whose params are not what its method takes."""

TENANT_KEY = "ductor.tenant_id"
"""Where `handle` leaves the caller's tenant in the request scope's `state`."""

CALLER_KEY = "ductor.caller"
"""Where `handle` leaves the caller (tenant, key, scopes) in the request scope's `state`."""

PARSED_DEPTH = 2 * MAX_DEPTH
"""How deeply a message may nest as the `mcp` library receives it: deep enough that
a cut value is still too deep for any tool (arguments start 3 levels down), well
within what its parsers take."""

LONG_INTEGER = 100
"""Digits past which an integer literal is shortened (what the parsers take is ~4,300)."""

ARGUMENTS_DEPTH = 3
"""How deep a tool's arguments lie in a message (`{"params": {"arguments": {...`): a
long integer is shortened there or deeper only, never the message's own `id`."""

# A JSON string (valid JSON only: possessive, so it never backtracks), a run of
# opening or of closing brackets, or an integer literal of more than LONG_INTEGER
# digits (not part of a float).
_TOKEN = re.compile(
    rb'"(?:[^"\\]++|\\.)*+"|([\[{]++)|([\]}]++)|(?<![0-9.eE+-])(-?)[0-9]{%d,}(?![0-9.eE])'
    % (LONG_INTEGER + 1),
    re.DOTALL,
)
_LONG_DIGITS = re.compile(rb"[0-9]{%d}" % (LONG_INTEGER + 1))


def unparseable(raw: bytes) -> bool:
    """Whether `raw` may nest deeper than `PARSED_DEPTH` or hold an integer longer than
    `LONG_INTEGER` digits: `parseable` changes nothing when not. At C speed."""
    return nesting_depth(raw) > PARSED_DEPTH or _LONG_DIGITS.search(raw) is not None


def parseable(raw: bytes) -> bytes:
    """`raw`, a JSON-RPC message, as the `mcp` library can parse it: each array or
    object opening deeper than `PARSED_DEPTH` replaced by `[]`, each integer of more
    than `LONG_INTEGER` digits at least `ARGUMENTS_DEPTH` deep by 20 nines (same
    sign). Either was outside what a tool
    takes and still is, at the same place. A loop per token (a run of brackets is
    one): call it when `unparseable`, off the event loop."""
    out: list[bytes] = []
    depth, kept, cutting = 0, 0, False
    for token in _TOKEN.finditer(raw):
        opens, closes, sign = token.group(1, 2, 3)
        if opens is not None:
            if not cutting and depth + len(opens) > PARSED_DEPTH:
                at = token.start() + PARSED_DEPTH - depth  # opens PARSED_DEPTH + 1
                out.append(raw[kept:at])
                cutting = True
            depth += len(opens)
        elif closes is not None:
            if cutting and depth - len(closes) <= PARSED_DEPTH:
                at = token.start() + depth - PARSED_DEPTH - 1  # closes PARSED_DEPTH + 1
                out.append(b"[]")
                kept, cutting = at + 1, False
            depth -= len(closes)
        elif sign is not None and not cutting and depth >= ARGUMENTS_DEPTH:
            out.append(raw[kept : token.start()])
            out.append(sign + b"9" * 20)
            kept = token.end()
    if not cutting:
        out.append(raw[kept:])
    return b"".join(out)


class _Envelope(msgspec.Struct):
    """What `not_one_request` reads of a JSON-RPC message (the rest is skipped)."""

    jsonrpc: Any = msgspec.UNSET
    id: Any = msgspec.UNSET
    method: Any = msgspec.UNSET
    params: msgspec.Raw = msgspec.Raw()  # empty: absent


class _Params(msgspec.Struct):
    """What `bad_params` reads of a request's params (the rest is skipped)."""

    name: Any = msgspec.UNSET
    uri: Any = msgspec.UNSET
    arguments: msgspec.Raw = msgspec.Raw()  # empty: absent


_NEEDS_PARAMS = {"tools/call": ("name",), "resources/read": ("uri",)}
"""The requests whose params `bad_params` checks, and their string params."""


def bad_params(body: bytes) -> tuple[Any, ApiError] | None:
    """The id of a `tools/call` or `resources/read` request (as `not_one_request`
    lets through) whose params are not what it takes, and why: no params object, a
    `name` (`uri`) that is not a string, `arguments` that are not an object. The
    `mcp` library refuses these with a bare "Invalid request parameters"."""
    try:
        envelope = msgspec.json.decode(body.lstrip(), type=_Envelope)
    except (msgspec.DecodeError, RecursionError):
        return None
    strings = _NEEDS_PARAMS.get(envelope.method) if isinstance(envelope.method, str) else None
    if strings is None or envelope.id is msgspec.UNSET:
        return None

    def refused(path: str, reason: str) -> tuple[Any, ApiError]:
        error = ApiError(
            f"invalid {envelope.method} params at {path}: {reason}",
            code="request.invalid",
            details={"path": path, "reason": reason},
        )
        return envelope.id, error

    params = None
    if len(envelope.params):
        try:
            params = msgspec.json.decode(envelope.params, type=_Params)
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            params = None
    if params is None:
        return refused("$.params", "must be an object")
    for name in strings:
        if not isinstance(getattr(params, name), str):
            return refused(f"$.params.{name}", "required: a string")
    arguments = params.arguments
    if len(arguments) and bytes(arguments)[:1] not in (b"{", b"n"):
        return refused("$.params.arguments", "must be an object of the tool's arguments")
    return None


def _refusal(path: str, message: str, reason: str) -> ApiError:
    return ApiError(message, code="request.invalid", details={"path": path, "reason": reason})


_KINDS = {"NoneType": "null", "bool": "boolean", "float": "number", "dict": "object"}


def _kind(value: Any) -> str:
    name = type(value).__name__
    return _KINDS.get(name, {"list": "array", "str": "string", "int": "integer"}.get(name, name))


def not_one_request(body: bytes) -> ApiError | None:
    """Why `body`, valid JSON, is no JSON-RPC message the server can answer, where
    the `mcp` library would answer a validation dump or nothing: a batch (an array;
    the protocol has none since 2025-06-18) or another value than an object, a
    `jsonrpc` other than "2.0", a `method` that is not a string, `params` that are
    not an object, or a request (it has a `method`) whose `id` is not a string or
    an integer, which the library takes for a notification and leaves unanswered.
    None for anything else, malformed JSON included (the library's parse error
    names its line and column)."""
    stripped = body.lstrip()
    try:
        if not stripped.startswith(b"{"):
            value = msgspec.json.decode(stripped, type=msgspec.Raw)
            if bytes(value)[:1] == b"[":
                return _refusal(
                    "$",
                    "a JSON-RPC batch (an array) is not served: send one message per POST",
                    "a batch",
                )
            kind = _kind(msgspec.json.decode(value))
            return _refusal("$", f"a JSON-RPC message is an object, not {kind}", f"not {kind}")
        envelope = msgspec.json.decode(stripped, type=_Envelope)
    except (msgspec.DecodeError, RecursionError):
        return None
    if envelope.jsonrpc != "2.0":
        return _refusal("$.jsonrpc", 'a JSON-RPC message says "jsonrpc": "2.0"', 'must be "2.0"')
    if envelope.method is msgspec.UNSET:
        return None  # a response: the library reads it
    if not isinstance(envelope.method, str):
        kind = _kind(envelope.method)
        return _refusal("$.method", f"a request's method is a string, not {kind}", f"not {kind}")
    if len(envelope.params) and bytes(envelope.params)[:1] not in (b"{", b"n"):
        kind = _kind(msgspec.json.decode(envelope.params))
        return _refusal("$.params", f"a request's params are an object, not {kind}", f"not {kind}")
    request_id = envelope.id
    if request_id is msgspec.UNSET or isinstance(request_id, str):
        return None  # a notification, or a request the library answers
    if isinstance(request_id, int) and not isinstance(request_id, bool):
        return None
    kind = _kind(request_id)
    return _refusal(
        "$.id",
        f"a request's id must be a string or an integer, not {kind}",
        f"must be a string or an integer, not {kind}",
    )


class McpEndpoint:
    """The MCP server of one app: its streamable-HTTP session manager and the ASGI
    handler in front of it. `running(services)` must wrap its serving time (the
    app's lifespan does it).

    The `mcp` library (pydantic models of two protocol eras) takes seconds to
    import on a busy machine, so it is imported and started in the background
    when the first authenticated MCP request comes: the server starts as fast
    as without it, and that first request waits until it is there.
    """

    def __init__(self, *, max_body_bytes: int, version: str) -> None:
        self.max_body_bytes = max_body_bytes
        self.version = version
        self._services: Services | None = None
        self._manager: StreamableHTTPSessionManager | None = None
        self._started: asyncio.Future[None] | None = None
        self._wanted: asyncio.Event | None = None

    def _build(self) -> StreamableHTTPSessionManager:
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

        from ductor_server.transports.mcp.server import build_server

        return StreamableHTTPSessionManager(
            build_server(self.version, self._lifespan),
            json_response=True,
            stateless=True,
            max_request_body_size=self.max_body_bytes,
        )

    @asynccontextmanager
    async def _lifespan(self, _: Any) -> AsyncIterator[Services]:
        if self._services is None:
            raise RuntimeError("McpEndpoint.running() gives the services first")
        yield self._services

    @asynccontextmanager
    async def running(self, services: Services) -> AsyncIterator[None]:
        """Serve MCP requests with `services` until the block ends."""
        self._services = services
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()
        self._started, self._wanted = started, asyncio.Event()
        task = asyncio.create_task(
            self._serve(started, self._wanted, stop), name="mcp-session-manager"
        )
        try:
            yield
        finally:
            stop.set()
            await task
            self._started = self._wanted = None
            self._services = None
            self._manager = None

    async def _serve(
        self, started: asyncio.Future[None], wanted: asyncio.Event, stop: asyncio.Event
    ) -> None:
        try:
            if await _first(wanted, stop):
                manager = await asyncio.to_thread(self._build)
                async with manager.run():
                    self._manager = manager
                    started.set_result(None)
                    await stop.wait()
        except Exception as error:
            started.set_exception(error)
        finally:
            if not started.done():
                started.set_exception(RuntimeError("the server is stopping"))
            if started.done() and not started.cancelled():
                started.exception()  # retrieved here: waiting requests report it

    async def _ready(self) -> StreamableHTTPSessionManager:
        started, wanted = self._started, self._wanted
        if started is None or wanted is None:
            raise ApiError(
                "the MCP server is not running", code="service.unavailable", retryable=True
            )
        wanted.set()
        try:
            await asyncio.shield(started)
        except Exception as error:
            raise ApiError(
                f"the MCP server failed to start: {error}",
                code="service.unavailable",
                retryable=True,
            ) from None
        assert self._manager is not None
        return self._manager

    def route_handler(self) -> ASGIRouteHandler:
        """The Litestar handler mounting this endpoint at `MCP_PATH`."""

        async def mcp_endpoint(
            scope: asgi_types.Scope, receive: asgi_types.Receive, send: asgi_types.Send
        ) -> None:
            await self.handle(cast(Scope, scope), cast(Receive, receive), cast(Send, send))

        handler: ASGIRouteHandler = asgi(MCP_PATH, is_mount=True, copy_scope=True)(mcp_endpoint)
        return handler

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Authenticate, bound the body, then let the session manager answer."""
        if scope["type"] == "websocket":
            # No WebSocket is served here: refused before the handshake (HTTP 403),
            # as on every other path.
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":
            return
        under = str(scope.get("path", ""))  # what follows MCP_PATH (the mount strips it)
        if under not in ("", "/"):
            # A path under the mount: no route, as REST answers one (before the key).
            await _refuse(
                send,
                ApiError(
                    "no such route",
                    code="route.not_found",
                    details={"method": scope.get("method"), "path": _requested_path(scope)},
                ),
            )
            return
        try:
            key = bearer_token(_header(scope, b"authorization"))
            services = self._services
            if services is None:
                raise ApiError(
                    "the MCP server is not running", code="service.unavailable", retryable=True
                )
            caller = await services.keys.authenticate(key)
            if scope.get("method") != "POST":
                # Stateless: no stream to open (GET) and no session to end (DELETE).
                raise ApiError(
                    f"{scope.get('method')} is not served at {MCP_PATH}: the server is"
                    " stateless and opens no stream; send each JSON-RPC message with POST",
                    code="route.method_not_allowed",
                    details={"allowed": ["POST"]},
                )
            body = await self._read_body(scope, receive)
            if unparseable(body):
                body = await asyncio.to_thread(parseable, body)
            refusal = not_one_request(body)
            if refusal is not None:
                await _refuse(send, refusal, status=400)
                return
            misparams = bad_params(body)
            if misparams is not None:
                request_id, error = misparams
                await _refuse(send, error, status=200, request_id=request_id, code=INVALID_PARAMS)
                return
            manager = await self._ready()
        except DuctorError as error:
            await _refuse(send, error)
            return
        state: dict[str, Any] = dict(scope.get("state") or {})
        state[TENANT_KEY] = caller.tenant_id
        state[CALLER_KEY] = caller
        scope["state"] = state
        # The body is read as JSON whatever its Content-Type, as REST reads one (the
        # library would answer a missing or other type with a plain-text 400).
        scope["headers"] = [
            *((name, value) for name, value in scope["headers"] if name.lower() != b"content-type"),
            (b"content-type", b"application/json"),
        ]
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await manager.handle_request(scope, replay, send)

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise self._too_large()
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise self._too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    def _too_large(self) -> ApiError:
        return body_too_large(self.max_body_bytes)


async def _first(wanted: asyncio.Event, stop: asyncio.Event) -> bool:
    """Wait for `wanted` or `stop`; True if `wanted` came first."""
    waits = [asyncio.ensure_future(wanted.wait()), asyncio.ensure_future(stop.wait())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for wait in waits:
        wait.cancel()
    return wanted.is_set() and not stop.is_set()


def _requested_path(scope: Scope) -> str:
    """The path the client asked for, as it sent it (the mount rewrites `path`)."""
    raw = scope.get("raw_path")
    if isinstance(raw, bytes):
        return raw.decode("latin-1")[:1000]
    return MCP_PATH + str(scope.get("path", ""))[:1000]


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


async def _refuse(
    send: Send,
    error: DuctorError,
    *,
    status: int | None = None,
    request_id: Any = None,
    code: int = INVALID_REQUEST,
) -> None:
    """Answer a refused request: the REST status (or `status`), a JSON-RPC error
    (`code`, for `request_id`) whose `data` is the REST error body."""
    body = error_body(error)
    payload = {
        "jsonrpc": "2.0",
        "id": request_id,
        "error": {
            "code": code,
            "message": f"{error.code}: {error.message}",
            "data": body,
        },
    }
    if status is None:
        status = status_for(error.code, retryable=error.retryable)
    headers = [(b"content-type", b"application/json")]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="ductor"'))
    if status == 405:
        headers.append((b"allow", b"POST"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": json.dumps(payload).encode()})


__all__ = [
    "CALLER_KEY",
    "MCP_PATH",
    "PARSED_DEPTH",
    "TENANT_KEY",
    "McpEndpoint",
    "bad_params",
    "error_body",
    "not_one_request",
    "parseable",
    "unparseable",
]
