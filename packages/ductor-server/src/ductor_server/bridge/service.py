"""What the bridge endpoints ask of the engine: sync an app, start an inline run,
accept a checkpoint, hand out an execute payload, list apps.

One transaction per call; run state is never written here (a checkpoint goes
to the run's inbox, so the coordinator stays its only writer).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import msgspec

from ductor.protocol import (
    CheckpointAck,
    CheckpointRequest,
    DescribeResponse,
    Event,
    ExecutePayload,
    HealthRequest,
    HealthResponse,
    InlineRunRequest,
    InlineRunResponse,
    SigningKeys,
    SyncAck,
    SyncRequest,
    SyncResponse,
)
from ductor_core.errors import DuctorError
from ductor_server.bridge.probe import call_app
from ductor_server.bridge.registry import get_app, list_apps, sync_app, touch_app
from ductor_server.bridge.runs import bridge_data, create_bridge_run, find_workflow
from ductor_server.bridge.tick import BRIDGE_KIND, checkpoint_input, parse_bridge_slug
from ductor_server.engine.effects import Effects, EngineParts
from ductor_server.engine.queue import Topic, WakeUp
from ductor_server.errors import RequestInvalid, RunEnded, RunNotFound, ServerError
from ductor_server.storage.protocol import Store
from ductor_server.storage.records import NewInboxItem

STALE_AFTER = timedelta(minutes=10)
"""An app that has neither synced nor answered for this long is reported stale."""


class BridgeWorkflowNotFound(ServerError):
    """The app is not registered or does not serve that workflow."""

    code = "workflow.not_found"

    def __init__(self, app_id: str, workflow_id: str) -> None:
        super().__init__(
            f"app {app_id!r} has no registered workflow {workflow_id!r}: sync the app first",
            details={"app_id": app_id, "workflow_id": workflow_id},
        )


class AppNotFound(ServerError):
    """No app registered under this id for this tenant."""

    code = "app.not_found"

    def __init__(self, app_id: str) -> None:
        super().__init__(f"app {app_id!r} is not registered", details={"app_id": app_id})


class AppView(msgspec.Struct, frozen=True, kw_only=True):
    """A registered app as the API shows it."""

    app_id: str
    url: str | None
    sdk: str
    sdk_version: str
    workflows: list[str]
    synced_at: datetime
    last_seen_at: datetime
    stale: bool


class BridgeService:
    """The bridge endpoints' service layer, bound to a store and the engine's wake-up."""

    def __init__(self, store: Store, parts: EngineParts, wake: WakeUp) -> None:
        self.store = store
        self.parts = parts
        self.wake = wake

    async def sync(self, tenant_id: str, describe: DescribeResponse, *, now: datetime) -> SyncAck:
        """Register or refresh an app and its workflows."""
        if not describe.app_id:
            raise RequestInvalid("app_id must not be empty")
        async with self.store.transaction() as tx:
            outcome = await sync_app(tx, tenant_id, describe, url=describe.url, now=now)
        return SyncAck(app_id=outcome.app_id, accepted=outcome.accepted)

    async def apps(self, tenant_id: str, *, now: datetime) -> list[AppView]:
        """Every registered app, with `stale` set when it has gone quiet."""
        async with self.store.transaction() as tx:
            apps = await list_apps(tx, tenant_id)
        return [
            AppView(
                app_id=app.app_id,
                url=app.url,
                sdk=app.describe.sdk,
                sdk_version=app.describe.sdk_version,
                workflows=[wf.id for wf in app.describe.workflows],
                synced_at=app.synced_at,
                last_seen_at=app.last_seen_at,
                stale=now - max(app.last_seen_at, app.synced_at) > STALE_AFTER,
            )
            for app in apps
        ]

    async def request_sync(self, keys: SigningKeys, url: str) -> SyncResponse:
        """Ask the app at `url` to sync: it POSTs its describe payload back to us."""
        if not url.startswith(("http://", "https://")):
            raise RequestInvalid("url must be an http(s) URL of the app's bridge endpoint")
        return await call_app(keys, url, SyncRequest(url=url), SyncResponse)

    async def probe(
        self, tenant_id: str, app_id: str, keys: SigningKeys, *, now: datetime
    ) -> HealthResponse:
        """Call a registered app's `health` action; record when it answered."""
        async with self.store.transaction() as tx:
            app = await get_app(tx, tenant_id, app_id)
        if app is None or not app.url:
            raise AppNotFound(app_id)
        health = await call_app(keys, app.url, HealthRequest(), HealthResponse)
        async with self.store.transaction() as tx:
            await touch_app(tx, tenant_id, app_id, now=now)
        return health

    async def inline_run(
        self, tenant_id: str, body: InlineRunRequest, *, now: datetime
    ) -> InlineRunResponse:
        """Create a run the caller executes itself (the engine takes over on hand-off)."""
        effects = Effects()
        async with self.store.transaction() as tx:
            workflow = await find_workflow(tx, tenant_id, body.app_id, body.workflow_id)
            if workflow is None:
                raise BridgeWorkflowNotFound(body.app_id, body.workflow_id)
            inserted = await create_bridge_run(
                tx,
                self.parts,
                effects,
                tenant_id=tenant_id,
                workflow=workflow,
                input=body.input,
                now=now,
                inline=True,
            )
            await effects.flush(tx)
        effects.notify(self.wake)
        return InlineRunResponse(run_id=inserted.run.id, workflow_id=body.workflow_id)

    async def checkpoint(
        self, tenant_id: str, run_id: str, body: CheckpointRequest, *, now: datetime
    ) -> CheckpointAck:
        """Queue a checkpoint's opcodes for the run's next tick; all or nothing."""
        if body.run_id != run_id:
            raise RequestInvalid(f"the body is for run {body.run_id!r}, the path for {run_id!r}")
        async with self.store.transaction() as tx:
            run = await tx.get_run(tenant_id, run_id)
            if run is None or run.kind != BRIDGE_KIND:
                raise RunNotFound(run_id)
            if parse_bridge_slug(run.family_slug) != (body.app_id, body.workflow_id):
                raise RequestInvalid(
                    f"run {run_id} is not a run of {body.app_id}/{body.workflow_id}"
                )
            if run.status.terminal:
                raise RunEnded(run_id, run.status.value)
            if body.opcodes:
                await tx.enqueue_inbox(
                    [
                        NewInboxItem(
                            tenant_id=tenant_id,
                            run_id=run_id,
                            input=checkpoint_input(run.lock_version, body.opcodes),
                            available_at=now,
                        )
                    ]
                )
        if body.opcodes:
            self.wake.notify(Topic.INBOX)
        return CheckpointAck(run_id=run_id, recorded=len(body.opcodes))

    async def payload(self, tenant_id: str, run_id: str, ref: str | None) -> ExecutePayload:
        """The input, recorded steps and event of a run whose execute was too large to inline."""
        if not ref:
            raise RequestInvalid("the 'ref' query parameter is required")
        async with self.store.transaction() as tx:
            run = await tx.get_run(tenant_id, run_id)
        if run is None or run.kind != BRIDGE_KIND:
            raise RunNotFound(run_id)
        try:
            data = bridge_data(run)
        except (KeyError, msgspec.ValidationError, DuctorError) as exc:
            raise RunNotFound(run_id) from exc
        event: Any = msgspec.convert(data.event, Event) if data.event is not None else None
        return ExecutePayload(run_id=run_id, input=run.state.input, steps=data.history, event=event)


__all__ = ["STALE_AFTER", "AppNotFound", "AppView", "BridgeService", "BridgeWorkflowNotFound"]
