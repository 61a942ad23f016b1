"""The Connect-RPC endpoint: the `connectrpc` library's ASGI application over the
methods of `METHODS`, with a msgspec JSON codec, mounted in the Litestar app.

Every call is checked in this order, as on REST:

1. the API key (`Authorization: Bearer`), before the body is read
   (`unauthenticated`, detail `auth.unauthenticated`);
2. the body: decoded strictly by msgspec as the method's request struct, with
   REST's limits and messages (`invalid_argument`, detail `request.invalid` with
   the field's `path`, or `request.malformed_json` with line and column);
3. the `Idempotency-Key` header, on methods that change something, handed to the
   service exactly as REST hands it (the same store, the same scopes), and
   `Idempotency-Replayed: true` on a remembered answer;
4. the service call; a `DuctorError` leaves as the Connect code the one table
   (`transports/error_codes.py`) gives its code, with the message unchanged and
   one error detail, a `google.protobuf.Struct` `{code, details}`.

Only JSON is spoken (`application/json`; `application/proto` is 415). Nothing here
knows a service's internals.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any, cast

import msgspec
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.method import IdempotencyLevel, MethodInfo, StreamType
from connectrpc.request import RequestContext
from connectrpc.server import ConnectASGIApplication, Endpoint
from litestar import types as asgi_types
from litestar.handlers import ASGIRouteHandler, asgi
from protobuf.wkt import Struct

from ductor_core.errors import DuctorError
from ductor_server.services import Answer, Services
from ductor_server.services.keys import Caller, Scope
from ductor_server.transports.connect.method import PACKAGE, Method
from ductor_server.transports.error_codes import error_code
from ductor_server.transports.rest.auth import bearer_token
from ductor_server.transports.rest.bodies import decode_body
from ductor_server.transports.rest.errors import ApiError
from ductor_server.transports.rest.idempotency import HEADER, REPLAYED_HEADER, checked_key
from ductor_server.transports.rest.scopes import scope_for

log = logging.getLogger("ductor_server.transports.connect")

_CALLER: ContextVar[Caller] = ContextVar("ductor_connect_caller")


def connect_error(error: DuctorError) -> ConnectError:
    """`error` as Connect sends it: the table's Connect code, the same message, and a
    `google.protobuf.Struct` detail `{code, details}` (Ductor's stable code and the
    REST error's `details`)."""
    details = error.details
    if details is not None:
        details = msgspec.to_builtins(details)
    detail = Struct.from_python({"code": error.code, "details": details})
    mapped = error_code(error.code, retryable=error.retryable)
    return ConnectError(Code(mapped.connect), error.message, [detail])


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


class ConnectEndpoint:
    """The Connect-RPC server of one app: every method of `methods` at its
    `/ductor.v1.<Service>/<Method>` path. `running(services)` must wrap its serving
    time (the app's lifespan does it)."""

    def __init__(self, methods: tuple[Method, ...], *, max_body_bytes: int) -> None:
        self.methods = methods
        self._services: Services | None = None
        endpoints = {
            spec.path: Endpoint.unary(_method_info(spec), self._function(spec)) for spec in methods
        }
        self._app = _Application(
            service=self,
            endpoints=lambda _: endpoints,
            interceptors=[Authenticate(self)],
            read_max_bytes=max_body_bytes,
            codecs=[MsgspecJsonCodec()],
        )

    @property
    def services(self) -> Services:
        """The services being served.

        Raises:
            ApiError: `service.unavailable` outside `running`.
        """
        if self._services is None:
            raise ApiError("the server is not running", code="service.unavailable", retryable=True)
        return self._services

    @asynccontextmanager
    async def running(self, services: Services) -> AsyncIterator[None]:
        """Serve calls with `services` until the block ends."""
        self._services = services
        try:
            yield
        finally:
            self._services = None

    def _function(self, spec: Method) -> Any:
        async def call(request: Any, ctx: RequestContext[Any, Any]) -> Any:
            try:
                key = checked_key(ctx.request_headers.get(HEADER)) if spec.mutates else None
                value = await spec.call(self.services, _CALLER.get(), request, key)
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

    def route_handlers(self) -> list[ASGIRouteHandler]:
        """The Litestar handlers mounting this endpoint: one per service, at
        `/ductor.v1.<Service>`."""
        services = sorted({spec.service for spec in self.methods})
        return [self._mount(f"/{PACKAGE}.{service}") for service in services]

    def _mount(self, prefix: str) -> ASGIRouteHandler:
        async def connect_endpoint(
            scope: asgi_types.Scope, receive: asgi_types.Receive, send: asgi_types.Send
        ) -> None:
            # Litestar hands a mount the rest of the path ("/GetRun/"): the library
            # finds a method by its whole path.
            scope["path"] = prefix + scope["path"].rstrip("/")
            await self._app(cast(Any, scope), cast(Any, receive), cast(Any, send))

        handler: ASGIRouteHandler = asgi(
            prefix, is_mount=True, copy_scope=True, name=f"connect{prefix}"
        )(connect_endpoint)
        return handler


class _Application(ConnectASGIApplication[ConnectEndpoint]):
    """The library's ASGI application; its endpoints are every method's path."""

    @property
    def path(self) -> str:
        return f"/{PACKAGE}."


__all__ = ["Authenticate", "ConnectEndpoint", "MsgspecJsonCodec", "connect_error"]
