"""`/v1/workflows`: validate, publish and read workflow definitions. Thin handlers only."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, HeaderParameter

from ductor_core.validation import ValidationReport
from ductor_server.api.bodies import decode_body
from ductor_server.api.idempotency import run_idempotent
from ductor_server.services import (
    PublishedWorkflow,
    Services,
    WorkflowFamilyView,
    WorkflowSummary,
    WorkflowVersionView,
)

IdempotencyKey = Annotated[str | None, HeaderParameter(name="Idempotency-Key")]


class WorkflowsController(Controller):
    """Workflow definitions: draft -> validate -> publish (immutable versions)."""

    path = "/v1/workflows"
    tags = ("workflows",)

    @post("/validate", status_code=200)
    async def validate(
        self,
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
        services: NamedDependency[Services],
    ) -> ValidationReport:
        """Check a definition without publishing it: `{valid, problems[]}`, each with a pointer."""
        body = decode_body(await request.body(), Any)
        return await services.validate_workflow(tenant_id, body)

    @post("/")
    async def publish(
        self,
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
        services: NamedDependency[Services],
        idempotency_key: IdempotencyKey = None,
    ) -> Response[PublishedWorkflow]:
        """Publish a definition as a new immutable version (201), or find the
        identical version already published (200)."""
        body = decode_body(await request.body(), Any)

        async def produce() -> tuple[int, PublishedWorkflow]:
            published = await services.publish_workflow(tenant_id, body)
            return (201 if published.created else 200), published

        return await run_idempotent(
            request.app.state.store,
            tenant_id=tenant_id,
            scope="POST /v1/workflows",
            key=idempotency_key,
            body=body,
            into=PublishedWorkflow,
            produce=produce,
            now=services.clock.now(),
        )

    @get("/")
    async def list_workflows(
        self, tenant_id: NamedDependency[str], services: NamedDependency[Services]
    ) -> list[WorkflowSummary]:
        """Every workflow family of the caller's tenant."""
        return await services.list_workflows(tenant_id)

    @get("/{slug:str}")
    async def get_workflow(
        self,
        slug: FromPath[str],
        tenant_id: NamedDependency[str],
        services: NamedDependency[Services],
    ) -> WorkflowFamilyView:
        """A family: its latest definition and the list of versions."""
        return await services.get_workflow(tenant_id, slug)

    @get("/{slug:str}/versions/{version:int}")
    async def get_version(
        self,
        slug: FromPath[str],
        version: FromPath[int],
        tenant_id: NamedDependency[str],
        services: NamedDependency[Services],
    ) -> WorkflowVersionView:
        """One published version with its definition."""
        return await services.get_workflow_version(tenant_id, slug, version)
