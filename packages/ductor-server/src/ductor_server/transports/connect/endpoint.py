"""The Connect-RPC endpoint: the `connectrpc` library's ASGI application over the
methods of `METHODS`, with a msgspec JSON codec, mounted in the Litestar app.
The application (`server.py`) is built on the first Connect request.

A path that names no method is answered as REST answers an unknown route (404,
Connect `unimplemented`, detail `route.not_found`). Every call is checked in this
order, as on REST:

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

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

from litestar import types as asgi_types
from litestar.handlers import ASGIRouteHandler, asgi

from ductor_server.services import Services
from ductor_server.transports.connect.method import PACKAGE, Method
from ductor_server.transports.rest.errors import ApiError
from ductor_server.transports.rest.telemetry import ROUTES_OPT


class ConnectEndpoint:
    """The Connect-RPC server of one app: every method of `methods` at its
    `/ductor.v1.<Service>/<Method>` path. `running(services)` must wrap its serving
    time (the app's lifespan does it).

    The `connectrpc` library (and `protobuf` under it) is imported, and the
    application built, when the first Connect request comes, in a thread: the
    idle server does not hold it, and other requests go on while it loads.
    """

    def __init__(self, methods: tuple[Method, ...], *, max_body_bytes: int) -> None:
        self.methods = methods
        self._max_body_bytes = max_body_bytes
        self._services: Services | None = None
        self._app: Any = None
        self._loading = threading.Lock()

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

    def _build(self) -> Any:
        with self._loading:
            if self._app is None:
                from ductor_server.transports.connect.server import build_application

                self._app = build_application(self, max_body_bytes=self._max_body_bytes)
            return self._app

    async def application(self) -> Any:
        """The ASGI application of every method (built on first use)."""
        app = self._app
        if app is None:
            app = await asyncio.to_thread(self._build)
        return app

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
            app = await self.application()
            await app(cast(Any, scope), cast(Any, receive), cast(Any, send))

        # Its methods' paths name a call's span and metric (not what follows the
        # prefix in the request, which anyone may write).
        paths = frozenset(spec.path for spec in self.methods if spec.path.startswith(prefix + "/"))
        handler: ASGIRouteHandler = asgi(
            prefix,
            is_mount=True,
            copy_scope=True,
            name=f"connect{prefix}",
            opt={ROUTES_OPT: paths},
        )(connect_endpoint)
        return handler


__all__ = ["ConnectEndpoint"]
