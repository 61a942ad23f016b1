"""API keys and tenants: `/v1/keys` (a tenant's own keys, admin scope) and
`/v1/tenants` (the operator's, with the operator key). Thin handlers over
`KeysService` and `TenantsService`.

A created key's secret is in its create answer only; a replay of the create
(the same `Idempotency-Key`) answers the same key with `key` null.
"""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request, Response, delete, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter

from ductor_server.services.keys import (
    Caller,
    CreatedKey,
    CreateKeyBody,
    KeyPage,
    KeysService,
    KeyView,
)
from ductor_server.services.tenants import TenantBody, TenantCreated, TenantPage, TenantsService
from ductor_server.transports.rest.auth import provide_caller
from ductor_server.transports.rest.bodies import NO_BODY, NoBody, required
from ductor_server.transports.rest.dependencies import services_of
from ductor_server.transports.rest.errors import V1_ERRORS
from ductor_server.transports.rest.idempotency import IdempotencyKey, answered, checked_key


def provide_keys(request: Request[Any, Any, Any]) -> KeysService:
    """The API keys service."""
    return services_of(request).keys


def provide_tenants(request: Request[Any, Any, Any]) -> TenantsService:
    """The operator's tenants service."""
    return services_of(request).tenants


class KeysController(Controller):
    """The calling tenant's API keys (every route needs the `admin` scope)."""

    path = "/v1/keys"
    tags = ("keys",)
    dependencies = {  # noqa: RUF012
        "keys": Provide(provide_keys, sync_to_thread=False),
        "caller": Provide(provide_caller, sync_to_thread=False),
    }

    @post("/", status_code=201, responses=V1_ERRORS)
    async def create_key(
        self,
        caller: NamedDependency[Caller],
        keys: NamedDependency[KeysService],
        data: JSONBody[CreateKeyBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[CreatedKey]:
        """Create a key with `scopes` (none the calling key lacks) and an optional
        expiry; the answer holds the secret `key`, shown this once."""
        body = required(data)
        key = checked_key(idempotency_key)
        return answered(await keys.create(caller, body, idempotency_key=key))

    @get("/", responses=V1_ERRORS)
    async def list_keys(
        self,
        tenant_id: NamedDependency[str],
        keys: NamedDependency[KeysService],
        cursor: FromQuery[str | None] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=500)] = 50,
    ) -> KeyPage:
        """The tenant's keys, newest first (revoked and expired ones too), never a secret."""
        return await keys.list(tenant_id, cursor=cursor, limit=limit)

    @get("/{key_id:str}", responses=V1_ERRORS)
    async def get_key(
        self,
        key_id: FromPath[str],
        tenant_id: NamedDependency[str],
        keys: NamedDependency[KeysService],
    ) -> KeyView:
        """One of the tenant's keys."""
        return await keys.get(tenant_id, key_id)

    @delete("/{key_id:str}", status_code=204, responses=V1_ERRORS)
    async def revoke_key(
        self,
        key_id: FromPath[str],
        tenant_id: NamedDependency[str],
        keys: NamedDependency[KeysService],
    ) -> None:
        """Revoke a key: its next request fails. The tenant's last live admin key
        cannot be revoked (409 `key.last_admin`)."""
        await keys.revoke(tenant_id, key_id)


class TenantsController(Controller):
    """Tenants, for the operator (the `DUCTOR_OPERATOR_KEY` bearer key)."""

    path = "/v1/tenants"
    tags = ("tenants",)
    dependencies = {"tenants": Provide(provide_tenants, sync_to_thread=False)}  # noqa: RUF012

    @post("/", status_code=201, responses=V1_ERRORS)
    async def create_tenant(
        self,
        tenants: NamedDependency[TenantsService],
        data: JSONBody[TenantBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[TenantCreated]:
        """Create a tenant and its first admin key (the secret shown this once);
        409 `tenant.conflict` when the id is taken."""
        body = required(data)
        key = checked_key(idempotency_key)
        return answered(await tenants.create(body, idempotency_key=key))

    @get("/", responses=V1_ERRORS)
    async def list_tenants(
        self,
        tenants: NamedDependency[TenantsService],
        cursor: FromQuery[str | None] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=500)] = 100,
    ) -> TenantPage:
        """Every tenant, by id."""
        return await tenants.list(cursor=cursor, limit=limit)

    @post("/{tenant_id:str}/keys", status_code=201, responses=V1_ERRORS)
    async def create_tenant_key(
        self,
        tenant_id: FromPath[str],
        tenants: NamedDependency[TenantsService],
        data: JSONBody[CreateKeyBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[CreatedKey]:
        """Create a key of any scopes for an existing tenant (e.g. an admin key for a
        tenant that lost its own); 404 `tenant.not_found`."""
        body = required(data)
        key = checked_key(idempotency_key)
        return answered(await tenants.create_key(tenant_id, body, idempotency_key=key))


OPERATOR_CONTROLLERS = (TenantsController,)
"""Controllers guarded by the operator key instead of a tenant's API key."""

__all__ = ["OPERATOR_CONTROLLERS", "KeysController", "TenantsController"]
