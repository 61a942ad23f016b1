"""The DAG run kind: runs of published workflow definitions, ticked by the pure
`ductor_core.tick.tick`.

It reads definitions through the catalog and writes only through the given
`Tx` and `Effects`; it keeps no bookkeeping beside the run state.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from functools import partial
from typing import Any

from ductor_core.definitions import WorkflowDefinition
from ductor_core.errors import DuctorError
from ductor_core.expressions import ExpressionEngine
from ductor_core.runs import ErrorInfo, RunFinished, RunInput, RunState, StartChildRun
from ductor_core.step_specs import StepSpecs
from ductor_core.tick import tick
from ductor_server.engine.cheap import cheap, tick_binds
from ductor_server.engine.effects import MAX_START_DEPTH, Effects, EngineParts, create_run
from ductor_server.engine.events import (
    match_candidates,
    refused_runs,
    start_matched,
    triggered_candidates,
)
from ductor_server.engine.kinds import Computation, KindTick, failed_tick
from ductor_server.engine.offload import ENGINE, resolve_engine, resolve_specs
from ductor_server.errors import RunInputInvalid
from ductor_server.storage.protocol import Tx
from ductor_server.storage.records import DAG_KIND, RunRecord

log = logging.getLogger("ductor.coordinator")


def dag_tick(
    definition: WorkflowDefinition,
    state: RunState,
    inputs: list[RunInput],
    now: datetime,
    *,
    engine: ExpressionEngine | str | None,
    specs: StepSpecs | None,
) -> KindTick:
    """Tick a DAG run, in a lane's worker (`engine` and `specs` as
    `EngineParts.portable` gives them); a tick that raises fails the run."""
    try:
        return KindTick(
            tick(
                definition,
                state,
                inputs,
                now,
                engine=resolve_engine(engine),
                specs=resolve_specs(specs),
            )
        )
    except Exception as exc:  # a tick bug must not wedge the run (or the batch)
        log.exception("tick of run %s failed", state.run_id)
        error = ErrorInfo(code="engine.tick_failed", message=str(exc), retryable=False)
        return KindTick(failed_tick(state, error, now))


def _ready(ticked: KindTick) -> KindTick:
    return ticked


class DagKind:
    """Runs of published DAG definitions (every family slug no other kind claims)."""

    @property
    def name(self) -> str:
        """Always "dag"."""
        return DAG_KIND

    @property
    def slug_prefix(self) -> str | None:
        """None: the DAG kind serves every slug no other kind claims."""
        return None

    async def tick(
        self,
        tx: Tx,
        parts: EngineParts,
        run: RunRecord,
        inputs: Sequence[RunInput],
        now: datetime,
    ) -> KindTick:
        """Tick against the run's pinned definition, on the loop when that is cheap
        (`engine.cheap`), else in the engine lane; a run whose definition is gone
        or unreadable, or whose tick raises, fails instead."""
        compute = await self.prepare_tick(tx, parts, run, inputs, now)
        return compute() if compute.inline else await ENGINE.run(compute)

    async def prepare_tick(
        self,
        tx: Tx,
        parts: EngineParts,
        run: RunRecord,
        inputs: Sequence[RunInput],
        now: datetime,
    ) -> Computation:
        """Load the run's pinned definition; return the pure tick against it,
        marked inline when it is cheap (see `engine.cheap`)."""
        try:
            definition = await parts.catalog.definition(
                tx, run.tenant_id, run.family_slug, run.version
            )
        except DuctorError as exc:
            error = ErrorInfo(
                code="engine.definition_unreadable", message=exc.message, retryable=False
            )
            failed = KindTick(failed_tick(run.state, error, now))
            return Computation(partial(_ready, failed), inline=True)
        if definition is None:
            error = ErrorInfo(
                code="workflow.version_not_found",
                message=f"{run.family_slug} v{run.version} is not published",
                retryable=False,
            )
            failed = KindTick(failed_tick(run.state, error, now))
            return Computation(partial(_ready, failed), inline=True)
        engine, specs = parts.portable()
        compute = partial(
            dag_tick, definition, run.state, list(inputs), now, engine=engine, specs=specs
        )
        inline = cheap(definition, parts.specs, parts.expressions(), tick_binds(run.state, inputs))
        return Computation(compute, inline=inline)

    async def trigger(
        self,
        tx: Tx,
        parts: EngineParts,
        effects: Effects,
        *,
        tenant_id: str,
        family_slug: str,
        version: int | None,
        input: Any,
        now: datetime,
        idempotency_key: str | None = None,
    ) -> RunRecord | None:
        """Start a run of the family at `version` (latest if None); None if that
        version is not published."""
        if idempotency_key is not None:
            existing = await tx.find_run_by_idempotency_key(tenant_id, idempotency_key)
            if existing is not None:
                return existing
        resolved = await parts.catalog.resolve(tx, tenant_id, family_slug, version)
        if resolved is None:
            return None
        record, definition = resolved
        inserted = await create_run(
            tx,
            parts,
            effects,
            tenant_id=tenant_id,
            record=record,
            definition=definition,
            input=input,
            now=now,
            idempotency_key=idempotency_key,
        )
        return inserted.run

    async def start_child(
        self,
        tx: Tx,
        parts: EngineParts,
        effects: Effects,
        *,
        parent: RunRecord,
        command: StartChildRun,
        now: datetime,
        depth: int,
    ) -> ErrorInfo | None:
        """Start a child run of a published family (a SUBWORKFLOW or SCATTER step)."""
        resolved = await parts.catalog.resolve(
            tx, parent.tenant_id, command.family_slug, command.version
        )
        if resolved is None:
            what = command.family_slug + (f" v{command.version}" if command.version else "")
            message = f"child workflow {what} is not published"
            if parent.kind != DAG_KIND:
                # An SDK step's invoke without app_id names a DAG family; the
                # likely mistake is an SDK workflow id without its app.
                message += (
                    " as a DAG family; to invoke an SDK workflow, name its app too"
                    f' (workflow "{command.family_slug}" with app_id=... in Python,'
                    " appId: ... in TypeScript)"
                )
            return ErrorInfo(code="workflow.not_found", message=message, retryable=False)
        if depth >= MAX_START_DEPTH:
            return ErrorInfo(
                code="run.nesting_too_deep",
                message=f"child runs nested more than {MAX_START_DEPTH} deep in one step",
                retryable=False,
            )
        record, definition = resolved
        try:
            await create_run(
                tx,
                parts,
                effects,
                tenant_id=parent.tenant_id,
                record=record,
                definition=definition,
                input=command.input,
                now=now,
                parent=parent,
                parent_step_ref=command.step_ref,
                parent_item_index=command.item_index,
                child_key=command.child_key,
                depth=depth + 1,
            )
        except RunInputInvalid as error:
            # The child is not started; the step (or the SCATTER item) fails.
            return ErrorInfo(
                code=error.code,
                message=error.message,
                retryable=False,
                details={
                    "family_slug": record.family_slug,
                    "version": record.version,
                    "problems": error.problems,
                },
            )
        return None

    async def start_triggered(
        self,
        tx: Tx,
        parts: EngineParts,
        effects: Effects,
        *,
        tenant_id: str,
        event_id: str,
        name: str,
        data: Any,
        now: datetime,
    ) -> list[str]:
        """Start the latest version of every family with a trigger on the event
        whose filter holds (once per event id and family).

        The filters run in a worker thread, but inside `tx`: the events service
        matches them before its transaction opens instead (`prepare_triggered`).
        """
        candidates = await triggered_candidates(tx, parts, tenant_id, name)
        triggered = await match_candidates(
            parts, candidates, event_id=event_id, name=name, data=data, now=now
        )
        refused_runs(triggered)  # logged: this caller has no answer to carry them
        return await start_matched(
            tx,
            parts,
            effects,
            tenant_id=tenant_id,
            event_id=event_id,
            data=data,
            triggered=triggered,
            now=now,
        )

    async def on_finish(
        self,
        tx: Tx,
        parts: EngineParts,
        effects: Effects,
        *,
        run: RunRecord,
        finished: RunFinished,
        now: datetime,
    ) -> None:
        """Nothing: a DAG run holds nothing beyond its timers, waits and tasks."""


__all__ = ["DagKind"]
