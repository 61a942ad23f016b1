"""`/v1/events`: accept an event, start the runs it triggers, wake runs waiting on it."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request, Response, post
from litestar.di import NamedDependency
from litestar.params import HeaderParameter

from ductor_server.api.bodies import EventBody, decode_body
from ductor_server.api.idempotency import run_idempotent
from ductor_server.services import EventAccepted, Services

IdempotencyKey = Annotated[str | None, HeaderParameter(name="Idempotency-Key")]


class EventsController(Controller):
    """Inbound events (deduplicated by `id`)."""

    path = "/v1/events"
    tags = ("events",)

    @post("/")
    async def send(
        self,
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
        services: NamedDependency[Services],
        idempotency_key: IdempotencyKey = None,
    ) -> Response[EventAccepted]:
        """Accept `{name, data, id?}`; 202 with the runs it started or reached.

        A repeated `id` is a duplicate: stored once, starts nothing again."""
        body = decode_body(await request.body(), EventBody)

        # Without an explicit id the Idempotency-Key names the event, so even two
        # concurrent requests with one key store a single event.
        event_id = body.id or idempotency_key

        async def produce() -> tuple[int, EventAccepted]:
            return 202, await services.send_event(tenant_id, body.name, body.data, event_id)

        return await run_idempotent(
            request.app.state.store,
            tenant_id=tenant_id,
            scope="POST /v1/events",
            key=idempotency_key,
            body=body,
            into=EventAccepted,
            produce=produce,
            now=services.clock.now(),
        )
