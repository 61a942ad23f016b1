"""Inbound events: store one (deduplicated by id), start the runs it triggers,
wake the runs waiting on it. It never mentions a transport.
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
from opentelemetry import trace

from ductor_server.engine.effects import Effects
from ductor_server.engine.events import RefusedRun, ingest_event, prepare_triggered
from ductor_server.errors import EventInvalid
from ductor_server.services.context import ServiceContext, start_taking
from ductor_server.services.idempotency import Answer, Claim, Outcome, once
from ductor_server.services.metering import refuse_over_budget
from ductor_server.services.runs import check_name
from ductor_server.storage.protocol import Tx
from ductor_server.telemetry import traced


class EventAccepted(msgspec.Struct, frozen=True, kw_only=True):
    """An event was stored; which runs it started, which waiting runs it reached,
    and the runs a trigger matched but did not start (`runs_refused`: the event's
    data does not satisfy the workflow's `input_schema`)."""

    id: str
    name: str
    duplicate: bool
    runs_started: list[str] = []
    runs_notified: list[str] = []
    runs_refused: list[RefusedRun] = []


class EventsService:
    """Events of every tenant."""

    def __init__(self, context: ServiceContext) -> None:
        self._context = context

    @traced("ductor.events.send")
    async def send(
        self,
        tenant_id: str,
        name: str,
        data: Any = None,
        event_id: str | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> Answer[EventAccepted]:
        """Store an event (dedupe by id), start runs it triggers, wake runs waiting on it;
        `ACCEPTED`. Without an `event_id`, the idempotency key names the event. A
        repeated id with the same name and data is a duplicate that does nothing
        (answered with the stored event).

        Raises:
            EventInvalid: a bad name or id, or an id stored with another name or data.
            IdempotencyConflict: the key was used with another event.
            BudgetExceeded: `budget.exceeded`: the runs it starts would pass a
                blocking budget on `runs` (nothing is stored).
        """
        check_name("event name", name, EventInvalid, path="$.name")
        if event_id is not None:
            check_name("event id", event_id, EventInvalid, path="$.id")
        context = self._context
        now = context.clock.now()
        claim = Claim.of(tenant_id, "events.send", idempotency_key, [name, data, event_id], now=now)
        eid = event_id or (claim.key if claim is not None else f"evt_{uuid.uuid4().hex}")
        effects = Effects()
        # Trigger filters and first ticks run in a worker thread before the
        # transaction opens; the transaction only stores what they decided.
        triggered = await prepare_triggered(
            context.store,
            context.parts,
            tenant_id=tenant_id,
            event_id=eid,
            name=name,
            data=data,
            now=now,
        )

        async def effect(tx: Tx) -> Answer[EventAccepted]:
            outcome = await ingest_event(
                tx,
                context.parts,
                effects,
                tenant_id=tenant_id,
                event_id=eid,
                name=name,
                data=data,
                now=now,
                triggered=triggered,
            )
            if outcome.other_content:
                reason = f"event id {eid!r} was used before with another name or data"
                details: dict[str, Any] = {"id": eid, "reason": reason}
                if event_id is not None:
                    details["path"] = "$.id"
                else:
                    details["header"] = "Idempotency-Key"
                raise EventInvalid(reason, details=details)
            await effects.flush(tx)
            refuse_over_budget(effects.budgeted)  # the runs it started, on `runs`
            accepted = EventAccepted(
                id=outcome.id,
                name=outcome.name,
                duplicate=outcome.duplicate,
                runs_started=outcome.runs_started,
                runs_notified=outcome.runs_notified,
                runs_refused=outcome.runs_refused,
            )
            return Answer(accepted, Outcome.ACCEPTED)

        # A worker of this process may lease a started run's first task in this
        # very transaction, and start it once it commits.
        async with start_taking(context) as taker:
            effects.taker = taker
            answer = await once(context.store, claim, EventAccepted, effect)
        effects.notify(context.wake, context.feed)
        span = trace.get_current_span()
        span.set_attribute("ductor.event.name", name)
        span.set_attribute("ductor.runs_started", len(answer.value.runs_started))
        return answer


__all__ = ["EventAccepted", "EventsService", "RefusedRun"]
