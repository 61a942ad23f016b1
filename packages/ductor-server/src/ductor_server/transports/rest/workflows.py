"""`/v1/workflows`: validate, publish and read workflow definitions. Thin handlers only."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Response, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody

from ductor_core.definitions import WorkflowDefinition
from ductor_core.validation import ValidationReport
from ductor_server.services import (
    PublishedWorkflow,
    WorkflowFamilyView,
    WorkflowsService,
    WorkflowSummary,
    WorkflowVersionView,
)
from ductor_server.transports.rest.bodies import (
    NO_BODY,
    DocumentedAs,
    VersionPath,
    path_version,
    required,
)
from ductor_server.transports.rest.errors import V1_ERRORS, also_ok
from ductor_server.transports.rest.idempotency import IdempotencyKey, answered, checked_key

# Decoded as any JSON value, so validation can report every problem at once.
DefinitionBody = JSONBody[Annotated[Any, DocumentedAs(WorkflowDefinition)]]


class WorkflowsController(Controller):
    """Workflow definitions: draft -> validate -> publish (immutable versions)."""

    path = "/v1/workflows"
    tags = ("workflows",)

    @post("/validate", status_code=200, responses=V1_ERRORS)
    async def validate(
        self,
        tenant_id: NamedDependency[str],
        workflows: NamedDependency[WorkflowsService],
        data: DefinitionBody = NO_BODY,
    ) -> ValidationReport:
        """Check a definition without publishing it: `{valid, problems[]}`, each with a pointer."""
        return await workflows.validate(tenant_id, required(data))

    @post(
        "/",
        status_code=201,
        responses=also_ok(PublishedWorkflow, "The same content was already published"),
    )
    async def publish(
        self,
        tenant_id: NamedDependency[str],
        workflows: NamedDependency[WorkflowsService],
        data: DefinitionBody = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[PublishedWorkflow]:
        """Publish a definition as a new immutable version (201), or find the
        identical version already published (200)."""
        definition = required(data)
        key = checked_key(idempotency_key)
        return answered(await workflows.publish(tenant_id, definition, idempotency_key=key))

    @get("/", responses=V1_ERRORS)
    async def families(
        self, tenant_id: NamedDependency[str], workflows: NamedDependency[WorkflowsService]
    ) -> list[WorkflowSummary]:
        """Every workflow family of the caller's tenant."""
        return await workflows.families(tenant_id)

    @get("/{slug:str}", responses=V1_ERRORS)
    async def family(
        self,
        slug: FromPath[str],
        tenant_id: NamedDependency[str],
        workflows: NamedDependency[WorkflowsService],
    ) -> WorkflowFamilyView:
        """A family: its latest definition and the list of versions."""
        return await workflows.family(tenant_id, slug)

    @get("/{slug:str}/versions/{version:str}", responses=V1_ERRORS)
    async def version(
        self,
        slug: FromPath[str],
        version: VersionPath,
        tenant_id: NamedDependency[str],
        workflows: NamedDependency[WorkflowsService],
    ) -> WorkflowVersionView:
        """One published version with its definition."""
        return await workflows.version(tenant_id, slug, path_version(version))


__all__ = ["WorkflowsController"]
