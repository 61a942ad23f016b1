"""The Litestar application factory. Handlers stay thin: parse, call, serialize.

The lifespan opens the store (migrating it when asked), starts the engine
loops of this process, and closes both on shutdown.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from litestar import Litestar, Router
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig

from ductor_core.expressions import engine_by_name
from ductor_server.api.bridge import BridgeController
from ductor_server.api.dependencies import provide_services, provide_tenant_id
from ductor_server.api.errors import EXCEPTION_HANDLERS
from ductor_server.api.events import EventsController
from ductor_server.api.health import healthz, readyz
from ductor_server.api.openapi_bodies import document_request_bodies
from ductor_server.api.routing import ROUTING_CONTROLLERS, document_routing
from ductor_server.api.runs import RunsController
from ductor_server.api.workflows import WorkflowsController
from ductor_server.bridge import install as install_bridge
from ductor_server.engine.runtime import Runtime, RuntimeConfig
from ductor_server.routing import RouteStep, RoutingService
from ductor_server.settings import Settings
from ductor_server.storage import open_store

API_VERSION = "0.1.0"


def _lifespan(settings: Settings) -> Any:
    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        store = open_store(settings.store_target)
        await store.open()
        try:
            if settings.migrate_on_start:
                await store.migrate()
            config = RuntimeConfig(
                lease_seconds=settings.lease_seconds, poll_interval=settings.poll_interval
            )
            async with Runtime.start(
                store, roles=settings.roles, config=config, setup=install_bridge
            ) as runtime:
                app.state.store = store
                app.state.runtime = runtime
                app.state.services = runtime.services
                # Routing (issue 5): the service for /v1/route et al. and the
                # worker handler of STEP_TYPE_ROUTE, on the configured CEL engine.
                app.state.routing = RoutingService(
                    store, engine=engine_by_name(settings.cel_engine), clock=runtime.clock
                )
                runtime.actions.register("route", RouteStep(app.state.routing))
                yield
        finally:
            await store.close()

    return lifespan


def create_app(settings: Settings | None = None) -> Litestar:
    """Build the Ductor API application for `settings`.

    `/healthz` and `/readyz` are always served; the `/v1` resources only when
    the process has the `api` role. Every `/v1` call needs a Bearer API key.
    """
    settings = settings or Settings()
    handlers: list[Any] = [healthz, readyz]
    if "api" in settings.roles:
        handlers.append(
            Router(
                "/",
                # BridgeController: the server side of the bridge SDK (ductor_server.bridge).
                route_handlers=[
                    WorkflowsController,
                    RunsController,
                    EventsController,
                    *ROUTING_CONTROLLERS,  # routing (issue 5)
                    BridgeController,
                ],
                dependencies={
                    "tenant_id": Provide(provide_tenant_id),
                    "services": Provide(provide_services, sync_to_thread=False),
                },
            )
        )
    app = Litestar(
        route_handlers=handlers,
        lifespan=[_lifespan(settings)],
        exception_handlers=EXCEPTION_HANDLERS,
        request_max_body_size=settings.max_body_bytes,
        openapi_config=OpenAPIConfig(
            title="Ductor",
            version=API_VERSION,
            description="The clearing layer for units of work: workflows, runs and events.",
            path="/docs",
        ),
        on_startup=[document_request_bodies, document_routing],
    )
    app.state.settings = settings
    return app
