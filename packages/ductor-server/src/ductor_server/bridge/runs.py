"""Starting bridge runs inside the caller's transaction: by trigger, by event,
as an inline run or as the child of another run.

Writes go through the given `Tx` and `Effects`; the caller flushes and commits.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import msgspec

from ductor.protocol import Event
from ductor_core.expressions import ExpressionEngine, default_engine
from ductor_core.timestamps import utc_text
from ductor_server.bridge.concurrency import option_of
from ductor_server.bridge.registry import BridgeWorkflow, get_workflow, triggered_workflows
from ductor_server.bridge.tick import (
    BRIDGE_KIND,
    BridgeData,
    bridge_slug,
    bridge_start,
    parse_bridge_slug,
    read_data,
)
from ductor_server.engine.effects import (
    Effects,
    EngineParts,
    apply_commands,
    new_run_id,
    run_limits,
)
from ductor_server.engine.events import trigger_matches
from ductor_server.engine.history import transition_entries
from ductor_server.storage.protocol import Tx
from ductor_server.storage.records import NewHistoryEntry, NewRun, RunInsert, RunRecord
from ductor_server.telemetry import current_trace_context

log = logging.getLogger("ductor.bridge")


async def create_bridge_run(
    tx: Tx,
    parts: EngineParts,
    effects: Effects,
    *,
    tenant_id: str,
    workflow: BridgeWorkflow,
    input: Any,
    now: datetime,
    event: Event | None = None,
    inline: bool = False,
    idempotency_key: str | None = None,
    parent: RunRecord | None = None,
    parent_step_ref: str | None = None,
    parent_item_index: int = -1,
    child_key: str | None = None,
) -> RunInsert:
    """Insert a bridge run of `workflow` with its first tick; gather its commands.

    The run's version is the registered workflow's version. A taken
    idempotency or child key returns the existing run with `created=False`.
    With a `concurrency` option the run keeps its limit key and limits, and
    the task queue holds its steps to them (an inline run's steps too, once
    they run through the engine).
    """
    run_id = new_run_id()
    slug = bridge_slug(workflow.app_id, workflow.workflow_id)
    limits = run_limits(
        option_of(workflow.info.concurrency), parts.engine or default_engine(), input
    )
    result = bridge_start(
        run_id=run_id,
        app_id=workflow.app_id,
        workflow_id=workflow.workflow_id,
        input=input,
        now=now,
        event=event,
        inline=inline,
        timeout=workflow.info.timeout,
        cancellable=workflow.info.cancellable,
    )
    [inserted] = await tx.insert_runs(
        [
            NewRun(
                tenant_id=tenant_id,
                family_slug=slug,
                version=workflow.version,
                state=result.state,
                kind=BRIDGE_KIND,
                kind_state=msgspec.to_builtins(result.data),
                parent_run_id=parent.id if parent is not None else None,
                parent_step_ref=parent_step_ref,
                parent_item_index=parent_item_index,
                child_key=child_key,
                idempotency_key=idempotency_key,
                trace_context=current_trace_context(),
                limits=limits,
            )
        ]
    )
    if not inserted.created:
        return inserted
    data: dict[str, Any] = {"family_slug": slug, "version": workflow.version, "inline": inline}
    if parent is not None:
        data.update(parent_run_id=parent.id, parent_step_ref=parent_step_ref)
    effects.history.append(
        NewHistoryEntry(tenant_id=tenant_id, run_id=run_id, at=now, kind="run.created", data=data)
    )
    effects.history.extend(transition_entries(tenant_id, None, result.state, at=now))
    await apply_commands(tx, parts, effects, run=inserted.run, commands=result.commands, now=now)
    return inserted


def bridge_data(run: RunRecord) -> BridgeData:
    """The bookkeeping of a stored bridge run (also one stored by an earlier release).

    Raises:
        KeyError: the run keeps none (not a bridge run).
        msgspec.ValidationError: what it keeps is not bridge bookkeeping.
    """
    return read_data(run.kind_state, run.state)


async def find_workflow(
    tx: Tx, tenant_id: str, app_id: str, workflow_id: str
) -> BridgeWorkflow | None:
    """The registered workflow `workflow_id` of `app_id`, or None."""
    return await get_workflow(tx, tenant_id, app_id, workflow_id)


async def start_triggered_runs(
    tx: Tx,
    parts: EngineParts,
    effects: Effects,
    *,
    tenant_id: str,
    event_id: str,
    name: str,
    data: Any,
    now: datetime,
    engine: ExpressionEngine | None = None,
) -> list[str]:
    """Start a run of every registered SDK workflow whose trigger matches the event.

    Idempotent per (event id, workflow): a resent event starts nothing twice.
    """
    started: list[str] = []
    cel = engine or parts.engine or default_engine()
    payload = {"id": event_id, "name": name, "data": data}
    ts = utc_text(now)
    for workflow in await triggered_workflows(tx, tenant_id, name):
        if not any(
            trigger.event == name and trigger_matches(cel, trigger.match, payload)
            for trigger in workflow.info.triggers
        ):
            continue
        slug = bridge_slug(workflow.app_id, workflow.workflow_id)
        inserted = await create_bridge_run(
            tx,
            parts,
            effects,
            tenant_id=tenant_id,
            workflow=workflow,
            input=data,
            now=now,
            event=Event(name=name, data=data, id=event_id, ts=ts),
            idempotency_key=f"event:{event_id}:{slug}",
        )
        if inserted.created:
            started.append(inserted.run.id)
    return started


async def start_bridge_child(
    tx: Tx,
    parts: EngineParts,
    effects: Effects,
    *,
    parent: RunRecord,
    step_ref: str,
    item_index: int,
    child_key: str,
    family_slug: str,
    input: Any,
    now: datetime,
) -> bool:
    """Start a bridge run as a child of `parent` (an INVOKE with `app_id`, or a DAG's
    BRIDGE step); False when the app does not serve that workflow."""
    app_id, workflow_id = parse_bridge_slug(family_slug)
    workflow = await get_workflow(tx, parent.tenant_id, app_id, workflow_id)
    if workflow is None:
        return False
    await create_bridge_run(
        tx,
        parts,
        effects,
        tenant_id=parent.tenant_id,
        workflow=workflow,
        input=input,
        now=now,
        parent=parent,
        parent_step_ref=step_ref,
        parent_item_index=item_index,
        child_key=child_key,
    )
    return True


async def trigger_bridge_run(
    tx: Tx,
    parts: EngineParts,
    effects: Effects,
    *,
    tenant_id: str,
    family_slug: str,
    input: Any,
    now: datetime,
    idempotency_key: str | None = None,
) -> RunRecord | None:
    """Start a run of a registered SDK workflow by its bridge slug (`POST /v1/runs`);
    None when the app does not serve that workflow."""
    if idempotency_key is not None:
        existing = await tx.find_run_by_idempotency_key(tenant_id, idempotency_key)
        if existing is not None:
            return existing
    try:
        app_id, workflow_id = parse_bridge_slug(family_slug)
    except ValueError:  # "bridge:" without an app or a workflow names none
        return None
    workflow = await get_workflow(tx, tenant_id, app_id, workflow_id)
    if workflow is None:
        return None
    inserted = await create_bridge_run(
        tx,
        parts,
        effects,
        tenant_id=tenant_id,
        workflow=workflow,
        input=input,
        now=now,
        idempotency_key=idempotency_key,
    )
    return inserted.run


__all__ = [
    "bridge_data",
    "create_bridge_run",
    "find_workflow",
    "start_bridge_child",
    "start_triggered_runs",
    "trigger_bridge_run",
]
