"""`/v1/events`: accept an event, start the runs it triggers, wake runs waiting on it."""

from __future__ import annotations

from litestar import Controller, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from ductor_server.services import EventAccepted, EventsService
from ductor_server.transports.rest.bodies import NO_BODY, EventBody, NoBody, required
from ductor_server.transports.rest.errors import V1_ERRORS
from ductor_server.transports.rest.idempotency import IdempotencyKey, answered, checked_key


class EventsController(Controller):
    """Inbound events (deduplicated by `id`)."""

    path = "/v1/events"
    tags = ("events",)

    @post("/", status_code=202, responses=V1_ERRORS)
    async def send(
        self,
        tenant_id: NamedDependency[str],
        events: NamedDependency[EventsService],
        data: JSONBody[EventBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[EventAccepted]:
        """Accept `{name, data, id?}`; 202 with the runs it started or reached.

        A repeated `id` is a duplicate: stored once, starts nothing again. Without
        an `id`, the Idempotency-Key names the event."""
        body = required(data)
        key = checked_key(idempotency_key)
        return answered(
            await events.send(tenant_id, body.name, body.data, body.id, idempotency_key=key)
        )


__all__ = ["EventsController"]
