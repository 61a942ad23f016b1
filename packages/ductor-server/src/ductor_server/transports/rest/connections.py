"""Connection resources: `/v1/connections` (create, list, get, update, delete, test) and
`GET /v1/providers`. Thin handlers over `ConnectionsService`.

No answer ever holds a secret; another tenant's connection is 404. Every
mutation accepts an `Idempotency-Key`.
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, delete, get, patch, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, JSONBody

from ductor_server.providers import CheckResult
from ductor_server.services.connections import (
    ConnectionBody,
    ConnectionCheck,
    ConnectionPatch,
    ConnectionsService,
    ConnectionView,
    ProviderView,
)
from ductor_server.transports.rest.bodies import NO_BODY, EmptyBody, NoBody, required
from ductor_server.transports.rest.dependencies import services_of
from ductor_server.transports.rest.errors import V1_ERRORS
from ductor_server.transports.rest.idempotency import IdempotencyKey, answered, checked_key


def provide_connections(request: Request[Any, Any, Any]) -> ConnectionsService:
    """The connections service."""
    return services_of(request).connections


_CONNECTIONS = {"connections": Provide(provide_connections, sync_to_thread=False)}


class ConnectionsController(Controller):
    """A tenant's connections: configured instances of providers."""

    path = "/v1/connections"
    tags = ("connections",)
    dependencies = _CONNECTIONS

    @post("/", status_code=201, responses=V1_ERRORS)
    async def create_connection(
        self,
        tenant_id: NamedDependency[str],
        connections: NamedDependency[ConnectionsService],
        data: JSONBody[ConnectionBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[ConnectionView]:
        """Create a connection (201); its secrets are stored encrypted and shown only
        as masks. A taken name is 409 `connection.conflict`."""
        body = required(data)
        key = checked_key(idempotency_key)
        return answered(await connections.create(tenant_id, body, idempotency_key=key))

    @post("/validate", status_code=200, responses=V1_ERRORS)
    async def validate_connection(
        self,
        connections: NamedDependency[ConnectionsService],
        data: JSONBody[ConnectionBody | NoBody] = NO_BODY,
    ) -> ConnectionCheck:
        """Check a connection as its create would (`{valid, problems}`), writing nothing;
        the secrets only when some are given."""
        problems = connections.check(required(data))
        return ConnectionCheck(valid=not problems, problems=problems)

    @get("/", responses=V1_ERRORS)
    async def list_connections(
        self, tenant_id: NamedDependency[str], connections: NamedDependency[ConnectionsService]
    ) -> list[ConnectionView]:
        """The tenant's connections, by name."""
        return await connections.list_connections(tenant_id)

    @get("/{name:str}", responses=V1_ERRORS)
    async def get_connection(
        self,
        name: FromPath[str],
        tenant_id: NamedDependency[str],
        connections: NamedDependency[ConnectionsService],
    ) -> ConnectionView:
        """One connection."""
        return await connections.get(tenant_id, name)

    @patch("/{name:str}", responses=V1_ERRORS)
    async def update_connection(
        self,
        name: FromPath[str],
        tenant_id: NamedDependency[str],
        connections: NamedDependency[ConnectionsService],
        data: JSONBody[ConnectionPatch | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[ConnectionView]:
        """Change the description, the config (replaced whole) or secrets (field by
        field; a null removes one)."""
        body = required(data)
        key = checked_key(idempotency_key)
        return answered(await connections.update(tenant_id, name, body, idempotency_key=key))

    @delete("/{name:str}", status_code=204, responses=V1_ERRORS)
    async def delete_connection(
        self,
        name: FromPath[str],
        tenant_id: NamedDependency[str],
        connections: NamedDependency[ConnectionsService],
    ) -> None:
        """Delete a connection; steps naming it fail `connection.not_found` from now on."""
        await connections.delete(tenant_id, name)

    @post("/{name:str}/test", status_code=200, responses=V1_ERRORS)
    async def test_connection(
        self,
        name: FromPath[str],
        tenant_id: NamedDependency[str],
        connections: NamedDependency[ConnectionsService],
        data: JSONBody[EmptyBody | NoBody] = NO_BODY,
    ) -> CheckResult:
        """Check the connection through the outbound guard: `{ok, message, latency_ms,
        details}`; a failure (a refused address included) is `ok: false` with
        `details.code`. It takes no body (`{}` at most)."""
        return await connections.test(tenant_id, name)


class ProvidersController(Controller):
    """The providers connections may use."""

    path = "/v1/providers"
    tags = ("connections",)
    dependencies = _CONNECTIONS

    @get("/", responses=V1_ERRORS)
    async def list_providers(
        self, connections: NamedDependency[ConnectionsService]
    ) -> list[ProviderView]:
        """Every provider with its settings and secrets schemas and its operations'
        input and output schemas."""
        return connections.list_providers()


CONNECTION_CONTROLLERS = (ConnectionsController, ProvidersController)
"""The controllers of connections and providers."""

__all__ = ["CONNECTION_CONTROLLERS", "ConnectionsController", "ProvidersController"]
