"""Workflow definitions: validate, publish (immutable, content-addressed versions), read.

It speaks in tenants, views and `ServerError`s; it never mentions a transport.
"""

from __future__ import annotations

import difflib
from datetime import datetime
from typing import Any

import msgspec

from ductor_core.definitions import (
    WorkflowDefinition,
    content_hash,
    definition_from_obj,
)
from ductor_core.errors import DuctorError
from ductor_core.expressions import ExpressionEngine
from ductor_core.step_specs import StepSpecs
from ductor_core.validation import Problem, ValidationReport, validate_definition
from ductor_server.engine.actions import ActionRegistry
from ductor_server.engine.offload import (
    VALIDATION,
    portable_engine,
    portable_specs,
    resolve_engine,
    resolve_specs,
)
from ductor_server.errors import DefinitionInvalid, WorkflowNotFound, WorkflowVersionNotFound
from ductor_server.services.action_steps import action_steps
from ductor_server.services.connections import ConnectionsService
from ductor_server.services.context import ServiceContext
from ductor_server.services.idempotency import Answer, Claim, Outcome, once
from ductor_server.services.metering import require_entitlement
from ductor_server.storage.protocol import Tx
from ductor_server.storage.records import WorkflowVersionRecord

# --- views ---------------------------------------------------------------------


class PublishedWorkflow(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to a publish: `created` is False when identical content already existed."""

    family_slug: str
    version: int
    hash: str
    created: bool


class WorkflowSummary(msgspec.Struct, frozen=True, kw_only=True):
    """A workflow family in a listing."""

    family_slug: str
    title: str
    latest_version: int
    latest_hash: str
    updated_at: datetime


class VersionInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One published version of a family."""

    version: int
    hash: str
    created_at: datetime


class WorkflowVersionView(msgspec.Struct, frozen=True, kw_only=True):
    """One published version with its definition."""

    family_slug: str
    version: int
    hash: str
    created_at: datetime
    definition: WorkflowDefinition


class WorkflowFamilyView(msgspec.Struct, frozen=True, kw_only=True):
    """A family: its latest version (with definition) and every version, oldest first."""

    family_slug: str
    latest: WorkflowVersionView
    versions: list[VersionInfo]


def _version_view(
    record: WorkflowVersionRecord, definition: WorkflowDefinition
) -> WorkflowVersionView:
    return WorkflowVersionView(
        family_slug=record.family_slug,
        version=record.version,
        hash=record.hash,
        created_at=record.created_at,
        definition=definition,
    )


class _Checked(msgspec.Struct, frozen=True, kw_only=True):
    """What validating a definition for publishing found (crosses processes)."""

    report: ValidationReport
    parsed: WorkflowDefinition | None = None
    hash: str = ""
    error: str | None = None


def _report(
    definition: Any, *, engine: ExpressionEngine | str | None, specs: StepSpecs | None
) -> ValidationReport:
    """Validate in a worker (see `offload.portable_engine`)."""
    return validate_definition(
        definition, engine=resolve_engine(engine), specs=resolve_specs(specs)
    )


def _checked(
    definition: Any, *, engine: ExpressionEngine | str | None, specs: StepSpecs | None
) -> _Checked:
    """Validate, parse and hash a definition for publishing, in a worker."""
    report = _report(definition, engine=engine, specs=specs)
    if not report.valid:
        return _Checked(report=report)
    try:
        parsed = definition_from_obj(definition)
    except DuctorError as exc:  # validation passed, so this is unexpected
        return _Checked(report=report, error=exc.message)
    return _Checked(report=report, parsed=parsed, hash=content_hash(parsed))


# --- what only the server knows ---------------------------------------------------


def action_problems(definition: Any, known: list[str]) -> list[Problem]:
    """`definition.unknown_action` for every ACTION step naming an action not in
    `known` (the actions the server's step handlers serve)."""
    problems = []
    for step in action_steps(definition):
        name = step.args.get("action")
        if not isinstance(name, str) or not name.strip() or name in known:
            continue  # core reports a missing or blank one
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"known: {', '.join(known) or 'none'}"
        problems.append(
            Problem(
                code="definition.unknown_action",
                message=f"{step.name}: '{step.prefix}args.action' names no action this server"
                f" has: {name[:64]!r} ({hint})",
                pointer=step.pointer + "/args/action",
            )
        )
    return problems


# --- the service -----------------------------------------------------------------


class WorkflowsService:
    """Definitions of every tenant: draft -> validate -> publish; every call takes the tenant."""

    def __init__(
        self,
        context: ServiceContext,
        *,
        connections: ConnectionsService | None = None,
        actions: ActionRegistry | None = None,
    ) -> None:
        self._context = context
        self._connections = connections
        self._actions = actions

    async def _server_problems(self, tenant_id: str, definition: Any) -> list[Problem]:
        """The problems only the server can see: ACTION steps naming an action its
        step handlers do not serve (not checked without a registry), and steps
        naming the tenant's connections (none without a connections service)."""
        problems = []
        if self._actions is not None:
            problems += action_problems(definition, self._actions.action_names())
        if self._connections is not None:
            problems += await self._connections.definition_problems(tenant_id, definition)
        return problems

    async def validate(self, tenant_id: str, definition: Any) -> ValidationReport:
        """Validate a definition (parsed JSON); report every problem with a pointer.

        Validation compiles every expression, so it runs in a worker thread of
        the validation lane, never on the event loop. ACTION steps are checked
        against the actions this server serves, and those that name a connection
        against the tenant's connections.
        """
        report = await VALIDATION.run_for(
            tenant_id,
            _report,
            definition,
            engine=portable_engine(self._context.expressions),
            specs=portable_specs(self._context.parts.specs),
        )
        extra = await self._server_problems(tenant_id, definition)
        if not extra:
            return report
        return ValidationReport(valid=False, problems=[*report.problems, *extra])

    async def publish(
        self, tenant_id: str, definition: Any, *, idempotency_key: str | None = None
    ) -> Answer[PublishedWorkflow]:
        """Publish a definition as the next version; same content, same version.

        `CREATED` when this content is new, `OK` when it was already published.

        Raises:
            DefinitionInvalid: with the problems as `details`.
            IdempotencyConflict: the key was used with another definition.
            EntitlementError: a new family the tenant's plan does not allow
                (`entitlement.missing`, `entitlement.limit_exceeded` on `workflows`).
        """
        context = self._context
        claim = Claim.of(
            tenant_id, "workflows.publish", idempotency_key, [definition], now=context.clock.now()
        )
        # Validate (in a worker thread) before the transaction opens: it
        # compiles every expression, which must hold neither the loop nor a
        # connection.
        checked = await VALIDATION.run_for(
            tenant_id,
            _checked,
            definition,
            engine=portable_engine(context.expressions),
            specs=portable_specs(context.parts.specs),
        )
        problems = [
            *checked.report.problems,
            *await self._server_problems(tenant_id, definition),
        ]
        if problems:
            raise DefinitionInvalid(
                f"the definition has {len(problems)} problem(s)",
                details=msgspec.to_builtins(problems),
            )
        parsed, hash_ = checked.parsed, checked.hash
        if parsed is None:
            raise DefinitionInvalid(checked.error or "the definition does not parse", details=[])

        async def effect(tx: Tx) -> Answer[PublishedWorkflow]:
            record, created = await tx.insert_workflow_version(
                tenant_id,
                family_slug=parsed.family_slug,
                hash=hash_,
                definition=msgspec.to_builtins(parsed),
                trigger_events=sorted({t.event for t in parsed.triggers}),
                now=context.clock.now(),
            )
            if created and record.version == 1:  # a new family: the plan's `workflows`
                # One new family at a time per tenant, so each count sees the last one.
                await tx.session.advisory_lock(f"workflows.families:{tenant_id}")
                families = await tx.list_workflow_families(tenant_id)
                await require_entitlement(tx, tenant_id, "workflows", len(families))
            published = PublishedWorkflow(
                family_slug=record.family_slug,
                version=record.version,
                hash=record.hash,
                created=created,
            )
            return Answer(published, Outcome.CREATED if created else Outcome.OK)

        return await once(context.store, claim, PublishedWorkflow, effect)

    async def families(self, tenant_id: str) -> list[WorkflowSummary]:
        """Every workflow family of the tenant, by slug."""
        async with self._context.store.transaction() as tx:
            families = await tx.list_workflow_families(tenant_id)
        summaries = []
        for family in families:
            definition = self._context.catalog.decode(family.latest)
            summaries.append(
                WorkflowSummary(
                    family_slug=family.family_slug,
                    title=definition.title,
                    latest_version=family.latest.version,
                    latest_hash=family.latest.hash,
                    updated_at=family.latest.created_at,
                )
            )
        return summaries

    async def family(self, tenant_id: str, slug: str) -> WorkflowFamilyView:
        """The family's latest definition and its versions.

        Raises:
            WorkflowNotFound
        """
        async with self._context.store.transaction() as tx:
            versions = await tx.list_workflow_versions(tenant_id, slug)
        if not versions:
            raise WorkflowNotFound(slug)
        latest = versions[-1]
        return WorkflowFamilyView(
            family_slug=slug,
            latest=_version_view(latest, self._context.catalog.decode(latest)),
            versions=[
                VersionInfo(version=v.version, hash=v.hash, created_at=v.created_at)
                for v in versions
            ],
        )

    async def version(self, tenant_id: str, slug: str, version: int) -> WorkflowVersionView:
        """One version of a family.

        Raises:
            WorkflowNotFound, WorkflowVersionNotFound
        """
        async with self._context.store.transaction() as tx:
            record = await tx.get_workflow_version(tenant_id, slug, version)
            if record is None:
                if await tx.get_latest_workflow_version(tenant_id, slug) is None:
                    raise WorkflowNotFound(slug)
                raise WorkflowVersionNotFound(slug, version)
        return _version_view(record, self._context.catalog.decode(record))


__all__ = [
    "PublishedWorkflow",
    "VersionInfo",
    "WorkflowFamilyView",
    "WorkflowSummary",
    "WorkflowVersionView",
    "WorkflowsService",
]
