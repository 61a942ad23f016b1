"""`/v1/runs`: trigger, read, list, cancel, signal and re-run runs. Thin handlers only."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter

from ductor_server.errors import RequestInvalid
from ductor_server.services import HistoryEntry, RunPage, RunsService, RunView, SignalAccepted
from ductor_server.services.runs import MAX_WAIT_SECONDS, RerunView, RunsStarted, check_name
from ductor_server.transports.rest.bodies import (
    NO_BODY,
    CancelRunBody,
    NoBody,
    OptionalBody,
    RerunBody,
    SignalBody,
    TriggerRunBody,
    TriggerRunsBody,
    or_default,
    path_id,
    required,
)
from ductor_server.transports.rest.errors import V1_ERRORS
from ductor_server.transports.rest.idempotency import IdempotencyKey, answered, checked_key


class RunsController(Controller):
    """Runs of published workflows, pinned to the version they started with."""

    path = "/v1/runs"
    tags = ("runs",)

    @post("/", status_code=201, responses=V1_ERRORS)
    async def trigger(
        self,
        tenant_id: NamedDependency[str],
        runs: NamedDependency[RunsService],
        data: JSONBody[TriggerRunBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[RunView]:
        """Start a run: `{family_slug, version?, input}`. A repeated Idempotency-Key
        returns the run the first request started."""
        body = required(data)
        key = checked_key(idempotency_key)
        return answered(
            await runs.trigger(
                tenant_id, body.family_slug, body.version, body.input, idempotency_key=key
            )
        )

    @post("/batch", status_code=201, responses=V1_ERRORS)
    async def trigger_many(
        self,
        tenant_id: NamedDependency[str],
        runs: NamedDependency[RunsService],
        data: JSONBody[TriggerRunsBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[RunsStarted]:
        """Start up to 500 runs in one transaction, all or none: `{runs: [{family_slug,
        version?, input?, key?}]}`. A run's `key` names it, so a retry starts it once."""
        body = required(data)
        key = checked_key(idempotency_key)
        return answered(await runs.trigger_many(tenant_id, body.runs, idempotency_key=key))

    @get("/", responses=V1_ERRORS)
    async def page(
        self,
        tenant_id: NamedDependency[str],
        runs: NamedDependency[RunsService],
        status: FromQuery[str | None] = None,
        family_slug: FromQuery[str | None] = None,
        cursor: FromQuery[str | None] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=500)] = 50,
    ) -> RunPage:
        """Runs newest first; filter by `status` and `family_slug`, page with `cursor`."""
        return await runs.page(
            tenant_id, status=status, family_slug=family_slug, cursor=cursor, limit=limit
        )

    @get("/{run_id:str}", responses=V1_ERRORS)
    async def get_run(
        self,
        run_id: FromPath[str],
        tenant_id: NamedDependency[str],
        runs: NamedDependency[RunsService],
        # Litestar leaves a falsy bound out of the OpenAPI document: `gt=0` is restated.
        wait: Annotated[
            float | None,
            QueryParameter(gt=0, le=MAX_WAIT_SECONDS, schema_extra={"exclusive_minimum": 0}),
        ] = None,
    ) -> RunView:
        """A run: status, input, output, error and every step's state. With `wait`
        (seconds, up to 60), answered once the run has ended or the time is up,
        whichever comes first: check `status`."""
        return await runs.get(tenant_id, run_id, wait=wait)

    @get("/{run_id:str}/history", responses=V1_ERRORS)
    async def history(
        self,
        run_id: FromPath[str],
        tenant_id: NamedDependency[str],
        runs: NamedDependency[RunsService],
    ) -> list[HistoryEntry]:
        """The run's append-only history, oldest first."""
        return await runs.history(tenant_id, run_id)

    @post(
        "/{run_id:str}/cancel",
        status_code=202,
        responses=V1_ERRORS,
        operation_class=OptionalBody,
    )
    async def cancel(
        self,
        run_id: FromPath[str],
        tenant_id: NamedDependency[str],
        runs: NamedDependency[RunsService],
        data: JSONBody[CancelRunBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[RunView]:
        """Ask for the run (and its children) to be cancelled; 202, it happens on the next
        tick. The body is optional."""
        body = or_default(data, CancelRunBody())
        key = checked_key(idempotency_key)
        return answered(await runs.cancel(tenant_id, run_id, body.reason, idempotency_key=key))

    @post(
        "/{run_id:str}/rerun",
        status_code=201,
        responses=V1_ERRORS,
        operation_class=OptionalBody,
    )
    async def rerun(
        self,
        run_id: FromPath[str],
        tenant_id: NamedDependency[str],
        runs: NamedDependency[RunsService],
        data: JSONBody[RerunBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[RerunView]:
        """Start a new run with an ended run's family, version and input (`{latest:
        true}`: the family's latest version); 409 `run.not_ended` while it runs."""
        body = or_default(data, RerunBody())
        key = checked_key(idempotency_key)
        return answered(
            await runs.rerun(tenant_id, run_id, latest=body.latest, idempotency_key=key)
        )

    # `path`, not `str`: a signal name may hold a `/` (see `path_id`).
    @post(
        "/{run_id:str}/signals/{name:path}",
        status_code=202,
        responses=V1_ERRORS,
        operation_class=OptionalBody,
    )
    async def signal(
        self,
        run_id: FromPath[str],
        name: FromPath[str],
        tenant_id: NamedDependency[str],
        runs: NamedDependency[RunsService],
        request: Request[Any, Any, Any],
        data: JSONBody[SignalBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[SignalAccepted]:
        """Send the signal `name` to a run: `{payload?, id?}` (optional body); 202.
        Without an `id`, the Idempotency-Key names the signal."""
        name = path_id(request, "name")
        # The name is a path parameter here (the service names the body field).
        check_name("signal name", name, RequestInvalid, path="name")
        body = or_default(data, SignalBody())
        key = checked_key(idempotency_key)
        return answered(
            await runs.signal(tenant_id, run_id, name, body.payload, body.id, idempotency_key=key)
        )


__all__ = ["RunsController"]
