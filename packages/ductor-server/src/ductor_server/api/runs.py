"""`/v1/runs`: trigger, read, list, cancel and signal runs. Thin handlers only."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, HeaderParameter, QueryParameter

from ductor_server.api.bodies import CancelRunBody, SignalBody, TriggerRunBody, decode_body
from ductor_server.api.idempotency import run_idempotent
from ductor_server.services import HistoryEntry, RunPage, RunView, Services, SignalAccepted

IdempotencyKey = Annotated[str | None, HeaderParameter(name="Idempotency-Key")]


class RunsController(Controller):
    """Runs of published workflows, pinned to the version they started with."""

    path = "/v1/runs"
    tags = ("runs",)

    @post("/")
    async def trigger(
        self,
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
        services: NamedDependency[Services],
        idempotency_key: IdempotencyKey = None,
    ) -> Response[RunView]:
        """Start a run: `{family_slug, version?, input}`. A repeated Idempotency-Key
        returns the run the first request started."""
        body = decode_body(await request.body(), TriggerRunBody)

        async def produce() -> tuple[int, RunView]:
            run = await services.trigger_run(
                tenant_id, body.family_slug, body.version, body.input, idempotency_key
            )
            return 201, run

        return await run_idempotent(
            request.app.state.store,
            tenant_id=tenant_id,
            scope="POST /v1/runs",
            key=idempotency_key,
            body=body,
            into=RunView,
            produce=produce,
            now=services.clock.now(),
        )

    @get("/")
    async def list_runs(
        self,
        tenant_id: NamedDependency[str],
        services: NamedDependency[Services],
        status: FromQuery[str | None] = None,
        family_slug: FromQuery[str | None] = None,
        cursor: FromQuery[str | None] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=500)] = 50,
    ) -> RunPage:
        """Runs newest first; filter by `status` and `family_slug`, page with `cursor`."""
        return await services.list_runs(
            tenant_id, status=status, family_slug=family_slug, cursor=cursor, limit=limit
        )

    @get("/{run_id:str}")
    async def get_run(
        self,
        run_id: FromPath[str],
        tenant_id: NamedDependency[str],
        services: NamedDependency[Services],
    ) -> RunView:
        """A run: status, input, output, error and every step's state."""
        return await services.get_run(tenant_id, run_id)

    @get("/{run_id:str}/history")
    async def history(
        self,
        run_id: FromPath[str],
        tenant_id: NamedDependency[str],
        services: NamedDependency[Services],
    ) -> list[HistoryEntry]:
        """The run's append-only history, oldest first."""
        return await services.run_history(tenant_id, run_id)

    @post("/{run_id:str}/cancel")
    async def cancel(
        self,
        run_id: FromPath[str],
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
        services: NamedDependency[Services],
        idempotency_key: IdempotencyKey = None,
    ) -> Response[RunView]:
        """Ask for the run (and its children) to be cancelled; 202, it happens on the next tick."""
        body = decode_body(await request.body(), CancelRunBody, optional=True)

        async def produce() -> tuple[int, RunView]:
            return 202, await services.cancel_run(tenant_id, run_id, body.reason)

        return await run_idempotent(
            request.app.state.store,
            tenant_id=tenant_id,
            scope=f"POST /v1/runs/{run_id}/cancel",
            key=idempotency_key,
            body=body,
            into=RunView,
            produce=produce,
            now=services.clock.now(),
        )

    @post("/{run_id:str}/signals/{name:str}")
    async def signal(
        self,
        run_id: FromPath[str],
        name: FromPath[str],
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
        services: NamedDependency[Services],
        idempotency_key: IdempotencyKey = None,
    ) -> Response[SignalAccepted]:
        """Send the signal `name` to a run: `{payload?, id?}`; 202."""
        body = decode_body(await request.body(), SignalBody, optional=True)

        signal_id = body.id or idempotency_key  # as for events: the key names the signal

        async def produce() -> tuple[int, SignalAccepted]:
            accepted = await services.signal_run(tenant_id, run_id, name, body.payload, signal_id)
            return 202, accepted

        return await run_idempotent(
            request.app.state.store,
            tenant_id=tenant_id,
            scope=f"POST /v1/runs/{run_id}/signals/{name}",
            key=idempotency_key,
            body=body,
            into=SignalAccepted,
            produce=produce,
            now=services.clock.now(),
        )
