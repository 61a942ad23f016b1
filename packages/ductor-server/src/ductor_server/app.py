"""The Litestar application factory: the REST, MCP and Connect-RPC transports over one
process's services.

The lifespan runs the `Composition` (opening the store, migrating it when
asked, starting the engine loops of this process) and stops it on shutdown;
handlers reach the services through the dependencies of
`transports.rest.dependencies`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from litestar import Litestar, Router
from litestar.di import Provide
from litestar.logging import LoggingConfig
from litestar.openapi import OpenAPIConfig
from litestar.plugins import PluginProtocol
from litestar.plugins.core import MsgspecDIPlugin

from ductor_server.composition import Composition, build
from ductor_server.extensions import installed_extensions
from ductor_server.extensions.wiring import plugin_middleware
from ductor_server.settings import Settings
from ductor_server.transports.connect import METHODS as CONNECT_METHODS
from ductor_server.transports.connect import ConnectEndpoint
from ductor_server.transports.dashboard import (
    dashboard_routes,
    find_dashboard_assets,
    secure_dashboard_answers,
)
from ductor_server.transports.mcp import McpEndpoint
from ductor_server.transports.rest import (
    OPERATOR_CONTROLLERS,
    PUBLIC_ROUTES,
    V1_CONTROLLERS,
    healthz,
    readyz,
    receipt_keys,
)
from ductor_server.transports.rest.auth import (
    provide_tenant_id,
    require_api_key,
    require_operator_key,
)
from ductor_server.transports.rest.bodies import JsonBody
from ductor_server.transports.rest.dependencies import SERVICE_DEPENDENCIES
from ductor_server.transports.rest.errors import EXCEPTION_HANDLERS
from ductor_server.transports.rest.hangup import HangUpMiddleware
from ductor_server.transports.rest.parameters import refuse_nul_parameters
from ductor_server.transports.rest.telemetry import TelemetryMiddleware

API_VERSION = "0.1.0"

# Litestar's default logging sends every library's INFO to the root handler. The
# HTTP clients log each outbound request's URL at INFO (httpcore at DEBUG), and a
# URL can be a credential (a Slack webhook's): they only log warnings and worse.
_QUIET_LOGGERS = ("httpx", "httpcore")


def _lifespan(
    settings: Settings,
    composition: Composition | None,
    mcp: McpEndpoint | None,
    connect: ConnectEndpoint | None,
) -> Any:
    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        built = composition or build(settings, extensions=app.state.extensions)
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(built.running())
            app.state.composition = built
            app.state.services = built.services
            if connect is not None:
                await stack.enter_async_context(connect.running(built.services))
            if mcp is not None:
                # The MCP session manager runs inside the composition's lifetime.
                await stack.enter_async_context(mcp.running(built.services))
            yield

    return lifespan


class _Litestar(Litestar):
    """Litestar without the plugins it adds for pydantic and attrs models when those
    libraries are installed (the `mcp` and `openai` libraries bring pydantic in).
    No route takes or returns such a model: msgspec decodes every body and encodes
    every answer, and the MCP endpoint is an ASGI app of its own. So pydantic,
    several MiB, loads only with the first MCP request or AI call that needs it
    (`tests/test_lazy_imports.py`)."""

    @staticmethod
    def _get_default_plugins(plugins: list[PluginProtocol]) -> list[PluginProtocol]:
        plugins.append(MsgspecDIPlugin())
        return plugins


def create_app(
    settings: Settings | None = None, *, composition: Composition | None = None
) -> Litestar:
    """Build the Ductor API application for `settings`.

    `/healthz` and `/readyz` are always served; the `/v1` resources and the public
    receipt keys (`/.well-known/ductor-keys`), the MCP server (`/mcp`, see
    docs/mcp.md) and the Connect-RPC services (`/ductor.v1.<Service>/<Method>`, see
    docs/connect.md) only when the process has the `api` role. Every `/v1`, `/mcp`
    and Connect call needs a Bearer API key with the scope the call needs
    (`transports/rest/scopes.py`), but `/v1/tenants`, which needs the operator key
    (`DUCTOR_OPERATOR_KEY`). With the api role, `/ui` serves the web dashboard when
    the `ductor-ui` package is installed (see docs/dashboard.md), else a 404 naming
    the extra. The installed `ductor.middleware`
    plugins wrap every `/v1` route (see docs/extending.md).

    Args:
        settings: the process configuration (from the environment if None).
        composition: what to serve (built from `settings` at startup if None).
    """
    settings = composition.settings if composition is not None else settings or Settings()
    extensions = composition.extensions if composition is not None else installed_extensions()
    middleware = plugin_middleware(extensions)
    handlers: list[Any] = [healthz, readyz]
    mcp: McpEndpoint | None = None
    connect: ConnectEndpoint | None = None
    if "api" in settings.roles:
        connect = ConnectEndpoint(CONNECT_METHODS, max_body_bytes=settings.max_body_bytes)
        handlers.extend(connect.route_handlers())
        mcp = McpEndpoint(max_body_bytes=settings.max_body_bytes, version=API_VERSION)
        handlers.append(receipt_keys)
        handlers.append(mcp.route_handler())
        handlers.append(
            Router(
                "/",
                route_handlers=list(V1_CONTROLLERS),
                guards=[require_api_key, refuse_nul_parameters],
                middleware=middleware,
                dependencies={
                    "tenant_id": Provide(provide_tenant_id, sync_to_thread=False),
                    **SERVICE_DEPENDENCIES,
                },
                # Bodies are decoded by msgspec from the raw bytes; answers are encoded as is.
                dto=JsonBody,
                return_dto=None,
            )
        )
        handlers.append(
            Router(
                "/",
                route_handlers=list(OPERATOR_CONTROLLERS),
                guards=[require_operator_key, refuse_nul_parameters],
                dto=JsonBody,
                return_dto=None,
            )
        )
        handlers.extend(PUBLIC_ROUTES)
        # The optional dashboard (`ductor-server[ui]`): static files calling /v1.
        handlers.extend(dashboard_routes(find_dashboard_assets()))
    app = _Litestar(
        route_handlers=handlers,
        lifespan=[_lifespan(settings, composition, mcp, connect)],
        exception_handlers=EXCEPTION_HANDLERS,
        # Every /ui answer, errors included, with the dashboard's security headers.
        before_send=[secure_dashboard_answers],
        # A span and a latency measurement per routed request (docs/observability.md);
        # inside it, a read whose client hung up is ended, not waited out.
        middleware=[TelemetryMiddleware, HangUpMiddleware],
        request_max_body_size=settings.max_body_bytes,
        logging_config=LoggingConfig(
            loggers={name: {"level": "WARNING"} for name in _QUIET_LOGGERS}
        ),
        openapi_config=OpenAPIConfig(
            title="Ductor",
            version=API_VERSION,
            description="The clearing layer for units of work: workflows, runs and events.",
            path="/docs",
        ),
    )
    app.state.settings = settings
    app.state.extensions = extensions
    return app
