"""Event ingestion: store an event once (by id), start the runs whose triggers
match it, and deliver it to runs waiting for its name.

Trigger filters and the first ticks of the runs they start are computed first,
in a worker thread and outside any transaction (`prepare_triggered`); then one
short transaction per event stores it and inserts the runs. A resent event id
is a duplicate and does nothing (the caller refuses one with other content); a
run key per (event id, family) makes a second start of the same run impossible.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec

from ductor_core.definitions import WorkflowDefinition
from ductor_core.errors import DuctorError
from ductor_core.expressions import ExpressionEngine
from ductor_core.input_schemas import InputProblem
from ductor_core.runs import EventReceived
from ductor_core.step_specs import StepSpecs
from ductor_server.engine.cheap import cheap
from ductor_server.engine.effects import Effects, EngineParts, FirstTick, create_run, first_tick
from ductor_server.engine.inputs import input_check
from ductor_server.engine.offload import ENGINE, resolve_engine
from ductor_server.storage.protocol import Store, Tx
from ductor_server.storage.records import EventRecord, NewInboxItem, WorkflowVersionRecord

log = logging.getLogger("ductor.events")

INLINE_CANDIDATES = 16
"""Most workflows an event's filters and first ticks are matched for on the loop;
more go to the engine lane, however cheap each is."""


class RefusedRun(msgspec.Struct, frozen=True, kw_only=True):
    """A run an event's trigger matched but did not start, and why.

    `code` "run.input_invalid": the event's data does not satisfy the version's
    `input_schema`.

    Attributes:
        family_slug: the family whose trigger matched.
        version: the version the run would have pinned (the family's latest).
        code: why it was not started.
        problems: each `{"pointer", "message"}`, pointers from the event (`/data/total`).
    """

    family_slug: str
    version: int
    code: str
    problems: list[InputProblem]


@dataclass
class IngestedEvent:
    """What storing one event did."""

    id: str
    name: str
    duplicate: bool
    other_content: bool = False  # a duplicate id whose stored event has another name or data
    runs_started: list[str] = field(default_factory=list)
    runs_refused: list[RefusedRun] = field(default_factory=list)
    runs_notified: list[str] = field(default_factory=list)


def canonical(value: Any) -> bytes:
    """`value` as JSON with sorted keys: equal for equal content, whatever its key order."""
    return msgspec.json.encode(msgspec.to_builtins(value), order="sorted")


def trigger_matches(engine: ExpressionEngine, filter_source: str | None, event: Any) -> bool:
    """Whether a trigger's CEL `filter` holds for `event` ({id, name, data}).

    A filter that fails to evaluate (a missing field, a type error) does not match.
    """
    if not filter_source:
        return True
    try:
        return engine.evaluate(filter_source, {"event": event}) is True
    except DuctorError as exc:
        log.info("trigger filter %r did not evaluate: %s", filter_source, exc)
        return False


@dataclass(frozen=True)
class TriggeredRun:
    """A DAG run an event starts: the latest version of a family whose trigger
    filter held, and the run's first tick; `problems` when the event's data does
    not satisfy the version's `input_schema` (the run is then not started)."""

    record: WorkflowVersionRecord
    definition: WorkflowDefinition
    first: FirstTick
    problems: tuple[InputProblem, ...] = ()


Candidates = list[tuple[WorkflowVersionRecord, WorkflowDefinition]]


async def triggered_candidates(tx: Tx, parts: EngineParts, tenant_id: str, name: str) -> Candidates:
    """The latest version of every family with a trigger on the event `name`."""
    records = await tx.find_triggered_workflows(tenant_id, name)
    return [(record, parts.catalog.decode(record)) for record in records]


def match_triggers(
    definitions: Sequence[WorkflowDefinition],
    *,
    event_id: str,
    name: str,
    data: Any,
    now: datetime,
    engine: ExpressionEngine | str | None,
    specs: StepSpecs | None,
) -> list[tuple[int, FirstTick]]:
    """The definitions (by index) whose trigger filter holds for the event, each
    with its run's first tick. Pure and possibly heavy: run it in a lane's
    worker, with `engine` and `specs` as `EngineParts.portable` gives them."""
    cel = resolve_engine(engine)
    event = {"id": event_id, "name": name, "data": data}
    matched: list[tuple[int, FirstTick]] = []
    for index, definition in enumerate(definitions):
        if any(
            trigger.event == name and trigger_matches(cel, trigger.filter, event)
            for trigger in definition.triggers
        ):
            first = first_tick(definition, input=data, now=now, engine=engine, specs=specs)
            matched.append((index, first))
    return matched


async def match_candidates(
    parts: EngineParts,
    candidates: Candidates,
    *,
    event_id: str,
    name: str,
    data: Any,
    now: datetime,
) -> list[TriggeredRun]:
    """The candidates whose trigger filter holds, matched in the engine lane
    unless all of them are cheap over the event's data."""
    if not candidates:
        return []
    engine, specs = parts.portable()
    cel = parts.expressions()
    # Cheap filters and first ticks over small data run on the loop (`engine.cheap`),
    # as long as they are few: a tenant's event that starts hundreds of runs would
    # hold the loop, and every other tenant's requests with it.
    inline = len(candidates) <= INLINE_CANDIDATES and all(
        cheap(definition, parts.specs, cel, [data]) for _, definition in candidates
    )
    match = functools.partial(
        match_triggers,
        [definition for _, definition in candidates],
        event_id=event_id,
        name=name,
        data=data,
        now=now,
        engine=engine,
        specs=specs,
    )
    # In the lane, on the tenant's turn: its flood leaves a slot to the others.
    tenant_id = candidates[0][0].tenant_id
    matched = match() if inline else await ENGINE.run_for(tenant_id, match)
    triggered: list[TriggeredRun] = []
    for index, first in matched:
        record, definition = candidates[index]
        # Only a matched trigger's schema is checked (the data as `/data`).
        found = await input_check(definition, data, tenant_id=tenant_id)
        problems = () if found.valid else _under_data(found.problems)
        triggered.append(TriggeredRun(record, definition, first, problems))
    return triggered


def _under_data(problems: Sequence[InputProblem]) -> tuple[InputProblem, ...]:
    # A run's input is the event's data: point into the event.
    return tuple(
        InputProblem(pointer="/data" + p.pointer.removeprefix("/input"), message=p.message)
        for p in problems
    )


async def prepare_triggered(
    store: Store,
    parts: EngineParts,
    *,
    tenant_id: str,
    event_id: str,
    name: str,
    data: Any,
    now: datetime,
) -> list[TriggeredRun]:
    """The DAG runs an event would start, found in a short read transaction and
    matched in a worker thread after it has closed."""
    async with store.transaction() as tx:
        candidates = await triggered_candidates(tx, parts, tenant_id, name)
    return await match_candidates(
        parts, candidates, event_id=event_id, name=name, data=data, now=now
    )


async def start_matched(
    tx: Tx,
    parts: EngineParts,
    effects: Effects,
    *,
    tenant_id: str,
    event_id: str,
    data: Any,
    triggered: Sequence[TriggeredRun],
    now: datetime,
) -> list[str]:
    """Insert the runs an event triggered (once per event id and family), but
    those whose input was refused; the ids of those this call created."""
    started: list[str] = []
    for run in triggered:
        if run.problems:
            continue
        inserted = await create_run(
            tx,
            parts,
            effects,
            tenant_id=tenant_id,
            record=run.record,
            definition=run.definition,
            input=data,
            now=now,
            idempotency_key=f"event:{event_id}:{run.record.family_slug}",
            first=run.first,
        )
        if inserted.created:
            started.append(inserted.run.id)
    return started


def refused_runs(triggered: Sequence[TriggeredRun]) -> list[RefusedRun]:
    """The matched runs not started because the event's data fails their schema."""
    refused: list[RefusedRun] = []
    for run in triggered:
        if run.problems:
            log.info(
                "event data does not satisfy the input_schema of %s v%d: %s %s",
                run.record.family_slug,
                run.record.version,
                run.problems[0].pointer,
                run.problems[0].message,
            )
            refused.append(
                RefusedRun(
                    family_slug=run.record.family_slug,
                    version=run.record.version,
                    code="run.input_invalid",
                    problems=list(run.problems),
                )
            )
    return refused


async def ingest_event(
    tx: Tx,
    parts: EngineParts,
    effects: Effects,
    *,
    tenant_id: str,
    event_id: str,
    name: str,
    data: Any,
    now: datetime,
    triggered: Sequence[TriggeredRun] | None = None,
) -> IngestedEvent:
    """Store the event, start the runs it triggers and notify the runs waiting on it
    (the writes gathered in `effects` are the caller's to flush).

    `triggered` are the DAG runs `prepare_triggered` found for this event
    (computed before `tx` opened, for the same `now`); without it the DAG kind
    matches its triggers inside `tx`.
    """
    [fresh] = await tx.insert_events(
        [EventRecord(tenant_id=tenant_id, id=event_id, name=name, data=data, received_at=now)]
    )
    if not fresh:
        # The first insert has committed (a conflicting insert waits for it), so
        # the stored event is there to compare with, key order aside.
        stored = await tx.get_event(tenant_id, event_id)
        if stored is None:  # purged meanwhile
            return IngestedEvent(id=event_id, name=name, duplicate=True)
        return IngestedEvent(
            id=event_id,
            name=stored.name,
            duplicate=True,
            other_content=stored.name != name or canonical(stored.data) != canonical(data),
        )
    outcome = IngestedEvent(id=event_id, name=name, duplicate=False)
    # Each run kind starts its own triggered runs (DAG definitions first, then
    # the kinds registered after it, e.g. SDK workflows over the bridge).
    for kind in parts.kinds:
        if triggered is not None and kind is parts.kinds.default:
            outcome.runs_refused.extend(refused_runs(triggered))
            outcome.runs_started.extend(
                await start_matched(
                    tx,
                    parts,
                    effects,
                    tenant_id=tenant_id,
                    event_id=event_id,
                    data=data,
                    triggered=triggered,
                    now=now,
                )
            )
            continue
        outcome.runs_started.extend(
            await kind.start_triggered(
                tx,
                parts,
                effects,
                tenant_id=tenant_id,
                event_id=event_id,
                name=name,
                data=data,
                now=now,
            )
        )
    waiting = await tx.find_waits(tenant_id, kind="event", name=name)
    run_ids = list(dict.fromkeys(w.run_id for w in waiting))
    # The event is stored once, above; each waiting run's inbox names it, and
    # loading the inbox reads its data back (`Tx.load_inbox`). A copy of a 1 MB
    # event per waiting run took 300 runs to 900 MB of the server's memory.
    delivered = EventReceived(event_id=event_id, name=name)
    effects.inbox.extend(
        NewInboxItem(tenant_id=tenant_id, run_id=run_id, input=delivered, available_at=now)
        for run_id in run_ids
    )
    outcome.runs_notified.extend(run_ids)
    return outcome
