"""The server side of the bridge SDK: sync an app, start an inline run, accept a
checkpoint, hand out an execute payload, list and probe apps.

Built on the bridge internals (`ductor_server.bridge`): the app registry, bridge
runs and the bridge tick's inputs. Run state is never written here (a
checkpoint goes to the run's inbox, so the coordinator stays its only
writer). Signing and verifying bodies is the transport's; the keys live here
so every transport uses the same ones. No transport types here.
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
from ductor_server.engine.effects import Effects
from ductor_server.engine.queue import Topic
from ductor_server.errors import (
    BridgeNotConfigured,
    NotFoundError,
    RequestInvalid,
    RunEnded,
    RunNotFound,
)
from ductor_server.services.context import ServiceContext
from ductor_server.services.idempotency import Answer, Claim, Outcome, once
from ductor_server.storage.protocol import Tx
from ductor_server.storage.records import NewInboxItem

STALE_AFTER = timedelta(minutes=10)
"""An app that has neither synced nor answered for this long is reported stale."""


class BridgeWorkflowNotFound(NotFoundError):
    """The app is not registered or does not serve that workflow."""

    code = "workflow.not_found"

    def __init__(self, app_id: str, workflow_id: str) -> None:
        super().__init__(
            f"app {app_id!r} has no registered workflow {workflow_id!r}: sync the app first",
            details={"app_id": app_id, "workflow_id": workflow_id},
        )


class AppNotFound(NotFoundError):
    """No app registered under this id for this tenant."""

    code = "app.not_found"

    def __init__(self, app_id: str) -> None:
        super().__init__(f"app {app_id!r} is not registered", details={"app_id": app_id})


class AppView(msgspec.Struct, frozen=True, kw_only=True):
    """A registered app as a caller sees it."""

    app_id: str
    url: str | None
    sdk: str
    sdk_version: str
    workflows: list[str]
    synced_at: datetime
    last_seen_at: datetime
    stale: bool


class BridgeService:
    """The bridge operations of every tenant.

    Args:
        context: the shared service dependencies.
        keys: the bridge signing keys; None when the server has none (then
            apps cannot be called and signed requests cannot be checked).
    """

    def __init__(self, context: ServiceContext, *, keys: SigningKeys | None) -> None:
        self._context = context
        self.keys = keys

    def required_keys(self) -> SigningKeys:
        """The signing keys.

        Raises:
            BridgeNotConfigured: the server has none.
        """
        if self.keys is None:
            raise BridgeNotConfigured()
        return self.keys

    async def sync(
        self, tenant_id: str, describe: DescribeResponse, *, idempotency_key: str | None = None
    ) -> Answer[SyncAck]:
        """Register or refresh an app and its workflows; `OK`.

        Raises:
            RequestInvalid: an empty app id.
            IdempotencyConflict: the key was used with another describe payload.
        """
        if not describe.app_id:
            raise RequestInvalid("app_id must not be empty")
        now = self._context.clock.now()
        claim = Claim.of(tenant_id, "bridge.sync", idempotency_key, describe, now=now)

        async def effect(tx: Tx) -> Answer[SyncAck]:
            outcome = await sync_app(tx, tenant_id, describe, url=describe.url, now=now)
            return Answer(SyncAck(app_id=outcome.app_id, accepted=outcome.accepted))

        return await once(self._context.store, claim, SyncAck, effect)

    async def inline_run(
        self, tenant_id: str, body: InlineRunRequest, *, idempotency_key: str | None = None
    ) -> Answer[InlineRunResponse]:
        """Create a run the caller executes itself (the engine takes over on hand-off);
        `CREATED`.

        Raises:
            BridgeWorkflowNotFound: the app or workflow is not registered.
            IdempotencyConflict: the key was used with another request.
        """
        context = self._context
        now = context.clock.now()
        claim = Claim.of(tenant_id, "bridge.runs.start", idempotency_key, body, now=now)
        effects = Effects()

        async def effect(tx: Tx) -> Answer[InlineRunResponse]:
            workflow = await find_workflow(tx, tenant_id, body.app_id, body.workflow_id)
            if workflow is None:
                raise BridgeWorkflowNotFound(body.app_id, body.workflow_id)
            inserted = await create_bridge_run(
                tx,
                context.parts,
                effects,
                tenant_id=tenant_id,
                workflow=workflow,
                input=body.input,
                now=now,
                inline=True,
            )
            await effects.flush(tx)
            started = InlineRunResponse(run_id=inserted.run.id, workflow_id=body.workflow_id)
            return Answer(started, Outcome.CREATED)

        answer = await once(context.store, claim, InlineRunResponse, effect)
        effects.notify(context.wake)
        return answer

    async def checkpoint(
        self,
        tenant_id: str,
        run_id: str,
        body: CheckpointRequest,
        *,
        idempotency_key: str | None = None,
    ) -> Answer[CheckpointAck]:
        """Queue a checkpoint's opcodes for the run's next tick, all or nothing; `OK`.

        Raises:
            RunNotFound, RunEnded, RequestInvalid
            IdempotencyConflict: the key was used with another checkpoint.
        """
        if body.run_id != run_id:
            raise RequestInvalid(f"the body is for run {body.run_id!r}, the path for {run_id!r}")
        context = self._context
        now = context.clock.now()
        claim = Claim.of(
            tenant_id, "bridge.runs.checkpoint", idempotency_key, body, now=now, target=run_id
        )

        async def effect(tx: Tx) -> Answer[CheckpointAck]:
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
            return Answer(CheckpointAck(run_id=run_id, recorded=len(body.opcodes)))

        answer = await once(context.store, claim, CheckpointAck, effect)
        if body.opcodes and not answer.replayed:
            context.wake.notify(Topic.INBOX)
        return answer

    async def payload(self, tenant_id: str, run_id: str, ref: str | None) -> ExecutePayload:
        """The input, recorded steps and event of a run whose execute was too large to inline.

        Raises:
            RequestInvalid: no `ref`.
            RunNotFound: no such bridge run (or its data is unreadable).
        """
        if not ref:
            raise RequestInvalid("the 'ref' query parameter is required")
        async with self._context.store.transaction() as tx:
            run = await tx.get_run(tenant_id, run_id)
        if run is None or run.kind != BRIDGE_KIND:
            raise RunNotFound(run_id)
        try:
            data = bridge_data(run)
        except (KeyError, msgspec.ValidationError, DuctorError) as exc:
            raise RunNotFound(run_id) from exc
        event: Any = msgspec.convert(data.event, Event) if data.event is not None else None
        return ExecutePayload(run_id=run_id, input=run.state.input, steps=data.history, event=event)

    async def apps(self, tenant_id: str) -> list[AppView]:
        """Every registered app, with `stale` set when it has gone quiet."""
        now = self._context.clock.now()
        async with self._context.store.transaction() as tx:
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

    async def request_sync(self, url: str) -> SyncResponse:
        """Ask the app at `url` to sync: it POSTs its describe payload back to the server.

        Raises:
            BridgeNotConfigured: the server has no signing key.
            RequestInvalid: not an http(s) URL.
        """
        keys = self.required_keys()
        if not url.startswith(("http://", "https://")):
            raise RequestInvalid("url must be an http(s) URL of the app's bridge endpoint")
        return await call_app(keys, url, SyncRequest(url=url), SyncResponse)

    async def probe(self, tenant_id: str, app_id: str) -> HealthResponse:
        """Call a registered app's `health` action; record when it answered.

        Raises:
            BridgeNotConfigured: the server has no signing key.
            AppNotFound: no such app, or it registered no URL.
        """
        keys = self.required_keys()
        async with self._context.store.transaction() as tx:
            app = await get_app(tx, tenant_id, app_id)
        if app is None or not app.url:
            raise AppNotFound(app_id)
        health = await call_app(keys, app.url, HealthRequest(), HealthResponse)
        async with self._context.store.transaction() as tx:
            await touch_app(tx, tenant_id, app_id, now=self._context.clock.now())
        return health


__all__ = [
    "STALE_AFTER",
    "AppNotFound",
    "AppView",
    "BridgeService",
    "BridgeWorkflowNotFound",
]
