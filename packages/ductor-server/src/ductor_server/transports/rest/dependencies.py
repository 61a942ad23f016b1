"""How handlers get their services: one Litestar dependency per area, every one
taken from the single `Services` the composition root built for this process
(kept on the application's state by its lifespan). Nothing here serves a route.
"""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.di import Provide

from ductor_server.services import (
    BridgeService,
    EventsService,
    RoutingService,
    RunsService,
    Services,
    WorkflowsService,
)


def services_of(connection: ASGIConnection[Any, Any, Any, Any]) -> Services:
    """The services of the application serving `connection`."""
    services: Services = connection.app.state.services
    return services


def provide_workflows(request: Request[Any, Any, Any]) -> WorkflowsService:
    """The workflows service."""
    return services_of(request).workflows


def provide_runs(request: Request[Any, Any, Any]) -> RunsService:
    """The runs service."""
    return services_of(request).runs


def provide_events(request: Request[Any, Any, Any]) -> EventsService:
    """The events service."""
    return services_of(request).events


def provide_routing(request: Request[Any, Any, Any]) -> RoutingService:
    """The routing service."""
    return services_of(request).routing


def provide_bridge(request: Request[Any, Any, Any]) -> BridgeService:
    """The bridge service."""
    return services_of(request).bridge


#: The service dependencies of every /v1 route, by the parameter name handlers use.
SERVICE_DEPENDENCIES: dict[str, Provide] = {
    "workflows": Provide(provide_workflows, sync_to_thread=False),
    "runs": Provide(provide_runs, sync_to_thread=False),
    "events": Provide(provide_events, sync_to_thread=False),
    "routing": Provide(provide_routing, sync_to_thread=False),
    "bridge": Provide(provide_bridge, sync_to_thread=False),
}


__all__ = [
    "SERVICE_DEPENDENCIES",
    "provide_bridge",
    "provide_events",
    "provide_routing",
    "provide_runs",
    "provide_workflows",
    "services_of",
]
