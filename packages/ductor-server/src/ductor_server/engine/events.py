"""Event ingestion: store an event once (by id), start the runs whose triggers
match it, and deliver it to runs waiting for its name.

One transaction per event: a resent event id is a duplicate and does nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ductor_core.errors import DuctorError
from ductor_core.expressions import ExpressionEngine
from ductor_core.runs import EventReceived
from ductor_server.engine.effects import Effects, EngineParts
from ductor_server.storage.protocol import Tx
from ductor_server.storage.records import EventRecord, NewInboxItem

log = logging.getLogger("ductor.events")


@dataclass
class IngestedEvent:
    """What storing one event did."""

    id: str
    name: str
    duplicate: bool
    runs_started: list[str] = field(default_factory=list)
    runs_notified: list[str] = field(default_factory=list)


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
) -> IngestedEvent:
    """Store the event, start the runs it triggers and notify the runs waiting on it
    (the writes gathered in `effects` are the caller's to flush)."""
    [fresh] = await tx.insert_events(
        [EventRecord(tenant_id=tenant_id, id=event_id, name=name, data=data, received_at=now)]
    )
    outcome = IngestedEvent(id=event_id, name=name, duplicate=not fresh)
    if not fresh:
        return outcome
    # Each run kind starts its own triggered runs (DAG definitions first, then
    # the kinds registered after it, e.g. SDK workflows over the bridge).
    for kind in parts.kinds:
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
    effects.inbox.extend(
        NewInboxItem(
            tenant_id=tenant_id,
            run_id=run_id,
            input=EventReceived(event_id=event_id, name=name, data=data),
            available_at=now,
        )
        for run_id in run_ids
    )
    outcome.runs_notified.extend(run_ids)
    return outcome
