"""The server side of the bridge SDK: sync an app, start an inline run, accept a
checkpoint, hand out an execute payload, list and probe apps, manage each
app's signing keys and accept each signed request once.

Built on the bridge internals (`ductor_server.bridge`): the app registry, bridge
runs and the bridge tick's inputs. Run state is never written here (a
checkpoint goes to the run's inbox, so the coordinator stays its only
writer). The transport hands `authenticate` the raw body and signature of a
signed request; what that request may then do is checked here, against the
`BridgeCaller` it returns, inside the transaction that does it. No transport
types here.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, NoReturn

import msgspec

from ductor.errors import SignatureError
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
from ductor_core.durations import parse_duration
from ductor_core.errors import DuctorError, DurationError, ExpressionError
from ductor_core.expressions import ExpressionEngine, default_engine
from ductor_core.validation import unseen_variables
from ductor_server.bridge.concurrency import option_problems
from ductor_server.bridge.cron import cron_problem
from ductor_server.bridge.keys import (
    DEFAULT_GRACE,
    AppKey,
    BridgeKeys,
    NewAppKey,
    create_app_key,
    has_own_keys,
    keys_for_app,
    list_app_keys,
    require_nonce_from_env,
    revoke_app_key,
)
from ductor_server.bridge.nonces import first_use
from ductor_server.bridge.probe import call_app
from ductor_server.bridge.registry import get_app, list_apps, sync_app, touch_app
from ductor_server.bridge.runs import bridge_data, create_bridge_run, find_workflow
from ductor_server.bridge.tick import (
    BRIDGE_KIND,
    checkpoint_input,
    opcode_problems,
    parse_bridge_slug,
)
from ductor_server.engine.effects import Effects
from ductor_server.engine.outbound import OutboundPolicy
from ductor_server.engine.queue import Topic
from ductor_server.errors import (
    BridgeNotConfigured,
    NotFoundError,
    RequestInvalid,
    RunEnded,
    RunNotFound,
    ServerError,
)
from ductor_server.services.context import ServiceContext
from ductor_server.services.idempotency import Answer, Claim, Outcome, once
from ductor_server.storage.protocol import Tx
from ductor_server.storage.records import NewInboxItem

STALE_AFTER = timedelta(minutes=10)

MAX_GRACE = timedelta(days=3650)
"""The longest an app's other keys stay valid after a new key is created."""


def grace_period(seconds: int) -> timedelta:
    """A request's `grace_seconds` as a timedelta.

    Raises:
        RequestInvalid: negative, or longer than `MAX_GRACE` (far beyond, no
            date could hold the expiry).
    """
    if not 0 <= seconds <= MAX_GRACE.total_seconds():
        raise RequestInvalid(
            f"grace_seconds must be 0 to {int(MAX_GRACE.total_seconds())} (ten years),"
            f" got {seconds}"
        )
    return timedelta(seconds=seconds)


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


class AppKeyNotFound(NotFoundError):
    """The app has no signing key with this id."""

    code = "app_key.not_found"

    def __init__(self, app_id: str, key_id: str) -> None:
        super().__init__(
            f"app {app_id!r} has no signing key {key_id!r}",
            details={"app_id": app_id, "key_id": key_id},
        )


class BridgeAppForbidden(ServerError):
    """A signed request acts for an app its signature does not speak for."""

    code = "bridge.app_forbidden"

    def __init__(self, app_id: str, caller: BridgeCaller) -> None:
        signer = f"app {caller.app_id!r}'s key" if caller.own_key else "the server-wide key"
        super().__init__(
            f"a request signed with {signer} cannot act for app {app_id!r}",
            details={"app_id": app_id, "signed_for": caller.app_id},
        )


class BridgeCaller(msgspec.Struct, frozen=True, kw_only=True):
    """Who a verified signed request speaks for.

    Attributes:
        tenant_id: the tenant of the API key it came with.
        app_id: the app whose keys verified it (`own_key`), or the app it named
            (`Ductor-App`) when the server-wide key verified it, or None.
        own_key: verified with the app's own key, not the server-wide key.
    """

    tenant_id: str
    app_id: str | None
    own_key: bool


class AppKeyView(msgspec.Struct, frozen=True, kw_only=True):
    """An app's signing key as listed: never its secret."""

    app_id: str
    key_id: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    active: bool
    primary: bool


class CreatedAppKey(msgspec.Struct, frozen=True, kw_only=True):
    """A new app signing key; `signing_key` is shown this once only."""

    app_id: str
    key_id: str
    signing_key: str
    created_at: datetime
    previous_keys_expire_at: datetime | None


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
        policy: the outbound guard app URLs must pass (none: unguarded).
    """

    def __init__(
        self,
        context: ServiceContext,
        *,
        keys: SigningKeys | None,
        require_nonce: bool | None = None,
        policy: OutboundPolicy | None = None,
    ) -> None:
        self._context = context
        self._policy = policy
        self.keys = keys
        self.require_nonce = require_nonce_from_env() if require_nonce is None else require_nonce
        self.server_keys = (
            None if keys is None else BridgeKeys.server(keys, require_nonce=self.require_nonce)
        )

    def required_keys(self) -> SigningKeys:
        """The server-wide signing keys.

        Raises:
            BridgeNotConfigured: the server has none.
        """
        if self.keys is None:
            raise BridgeNotConfigured()
        return self.keys

    # ------------------------------------------------------------ signed requests

    async def request_keys(self, tenant_id: str, app_id: str | None) -> BridgeKeys:
        """The keys a signed request naming `app_id` (`Ductor-App`) is verified with.

        Raises:
            BridgeNotConfigured: the app has no keys of its own and the server none.
        """
        async with self._context.store.transaction() as tx:
            keys = await keys_for_app(
                tx,
                tenant_id,
                app_id or None,
                now=self._context.clock.now(),
                server=self.server_keys,
            )
        if keys is None:
            raise BridgeNotConfigured()
        return keys

    async def authenticate(
        self,
        tenant_id: str,
        keys: BridgeKeys,
        body: bytes,
        header: str | None,
        *,
        app_id: str | None,
    ) -> BridgeCaller:
        """Verify a signed request with `keys` (from `request_keys`) and accept its nonce once.

        Raises:
            SignatureError: the signature does not verify, or `signature.replayed`
                when its nonce was accepted before (nothing is recorded then).
        """
        now = int(self._context.clock.now().timestamp())
        verified = keys.check(body, header, now=now)
        if verified.nonce is not None:
            async with self._context.store.transaction() as tx:
                fresh = await first_use(
                    tx,
                    tenant_id,
                    keys.app_id or app_id or "",
                    verified.nonce,
                    timestamp=verified.timestamp,
                    now=now,
                )
            if not fresh:
                raise SignatureError(
                    f"this signed request (nonce {verified.nonce!r}) was already accepted once",
                    code="signature.replayed",
                )
        if keys.own:
            return BridgeCaller(tenant_id=tenant_id, app_id=keys.app_id, own_key=True)
        return BridgeCaller(tenant_id=tenant_id, app_id=app_id or None, own_key=False)

    async def _check_caller(self, tx: Tx, caller: BridgeCaller, app_id: str) -> None:
        """The caller may act for `app_id`: signed with that app's own key, or with the
        server-wide key for an app that has none (and names no other app).

        Raises:
            BridgeAppForbidden: it may not.
        """
        if caller.own_key:
            allowed = caller.app_id == app_id
        else:
            allowed = caller.app_id in (None, app_id) and not await has_own_keys(
                tx, caller.tenant_id, app_id
            )
        if not allowed:
            raise BridgeAppForbidden(app_id, caller)

    async def _allow(self, caller: BridgeCaller, app_id: str) -> None:
        """`_check_caller` in its own transaction, before anything (an idempotent
        replay's stored answer included) is read or written."""
        async with self._context.store.transaction() as tx:
            await self._check_caller(tx, caller, app_id)

    # ------------------------------------------------------------ app keys

    async def create_key(
        self, tenant_id: str, app_id: str, *, grace: timedelta = DEFAULT_GRACE
    ) -> CreatedAppKey:
        """Create a signing key for the app (registered or not yet); it becomes the
        key the server signs with, the app's other keys stay valid for `grace`.

        Raises:
            RequestInvalid: an app id a sync would refuse (`app_id_problem`), or a
                negative grace.
        """
        if (wrong := app_id_problem(app_id)) is not None:
            raise RequestInvalid(wrong, details={"path": "app_id", "reason": wrong})
        grace_period(int(grace.total_seconds()))  # raises for a negative or too long grace
        now = self._context.clock.now()
        async with self._context.store.transaction() as tx:
            created: NewAppKey = await create_app_key(tx, tenant_id, app_id, now=now, grace=grace)
            keys = await list_app_keys(tx, tenant_id, app_id)
        others = [k for k in keys if k.key_id != created.key.key_id and k.active(now)]
        return CreatedAppKey(
            app_id=app_id,
            key_id=created.key.key_id,
            signing_key=created.signing_key,
            created_at=created.key.created_at,
            previous_keys_expire_at=max(
                (k.expires_at for k in others if k.expires_at is not None), default=None
            ),
        )

    async def list_keys(self, tenant_id: str, app_id: str) -> list[AppKeyView]:
        """The app's signing keys, newest first (the first active one is `primary`)."""
        now = self._context.clock.now()
        async with self._context.store.transaction() as tx:
            keys = await list_app_keys(tx, tenant_id, app_id)
        primary = next((k.key_id for k in keys if k.active(now)), None)
        return [_key_view(k, now, primary) for k in keys]

    async def revoke_key(self, tenant_id: str, app_id: str, key_id: str) -> AppKeyView:
        """Revoke one of the app's keys now. The app keeps its other keys; with none
        left its calls fail (the server-wide key is never used for it again).

        Raises:
            AppKeyNotFound: the app has no such key.
        """
        now = self._context.clock.now()
        async with self._context.store.transaction() as tx:
            revoked = await revoke_app_key(tx, tenant_id, app_id, key_id, now=now)
            keys = await list_app_keys(tx, tenant_id, app_id)
        if revoked is None:
            raise AppKeyNotFound(app_id, key_id)
        primary = next((k.key_id for k in keys if k.active(now)), None)
        return _key_view(revoked, now, primary)

    async def sync(
        self,
        tenant_id: str,
        describe: DescribeResponse,
        *,
        caller: BridgeCaller,
        idempotency_key: str | None = None,
    ) -> Answer[SyncAck]:
        """Register or refresh an app and its workflows; `OK`.

        Raises:
            RequestInvalid: an empty app id.
            BridgeAppForbidden: `caller` may not act for that app.
            IdempotencyConflict: the key was used with another describe payload.
        """
        if not describe.app_id:
            raise RequestInvalid("app_id must not be empty")
        now = self._context.clock.now()
        await self._allow(caller, describe.app_id)
        _check_options(describe, self._context.expressions or default_engine())
        claim = Claim.of(tenant_id, "bridge.sync", idempotency_key, describe, now=now)

        async def effect(tx: Tx) -> Answer[SyncAck]:
            outcome = await sync_app(tx, tenant_id, describe, url=describe.url, now=now)
            return Answer(SyncAck(app_id=outcome.app_id, accepted=outcome.accepted))

        answer = await once(self._context.store, claim, SyncAck, effect)
        if not answer.replayed:
            # Its cron triggers may have changed: the timer loop plans again.
            self._context.wake.notify(Topic.TIMERS)
        return answer

    async def inline_run(
        self,
        tenant_id: str,
        body: InlineRunRequest,
        *,
        caller: BridgeCaller,
        idempotency_key: str | None = None,
    ) -> Answer[InlineRunResponse]:
        """Create a run the caller executes itself (the engine takes over on hand-off);
        `CREATED`.

        Raises:
            BridgeAppForbidden: `caller` may not act for that app.
            BridgeWorkflowNotFound: the app or workflow is not registered.
            IdempotencyConflict: the key was used with another request.
        """
        context = self._context
        now = context.clock.now()
        await self._allow(caller, body.app_id)
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
        effects.notify(context.wake, context.feed)
        return answer

    async def checkpoint(
        self,
        tenant_id: str,
        run_id: str,
        body: CheckpointRequest,
        *,
        caller: BridgeCaller,
        idempotency_key: str | None = None,
    ) -> Answer[CheckpointAck]:
        """Queue a checkpoint's opcodes for the run's next tick, all or nothing; `OK`.

        Raises:
            BridgeAppForbidden: `caller` may not act for that app.
            RunNotFound, RunEnded, RequestInvalid
            IdempotencyConflict: the key was used with another checkpoint.
        """
        if body.run_id != run_id:
            raise RequestInvalid(f"the body is for run {body.run_id!r}, the path for {run_id!r}")
        await self._allow(caller, body.app_id)
        problems = opcode_problems(body.opcodes)
        if problems:
            _refuse(problems)
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

    async def payload(
        self, tenant_id: str, run_id: str, ref: str | None, *, caller: BridgeCaller
    ) -> ExecutePayload:
        """The input, recorded steps and event of a run whose execute was too large to inline.

        Raises:
            RequestInvalid: no `ref`.
            RunNotFound: no such bridge run (or its data is unreadable).
            BridgeAppForbidden: `caller` may not act for the run's app.
        """
        if not ref:
            raise RequestInvalid("the 'ref' query parameter is required")
        async with self._context.store.transaction() as tx:
            run = await tx.get_run(tenant_id, run_id)
            if run is None or run.kind != BRIDGE_KIND:
                raise RunNotFound(run_id)
            app_id, _ = parse_bridge_slug(run.family_slug)
            await self._check_caller(tx, caller, app_id)
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

    async def request_sync(
        self, url: str, *, tenant_id: str | None = None, app_id: str | None = None
    ) -> SyncResponse:
        """Ask the app at `url` to sync: it POSTs its describe payload back to the server.

        The call is signed with the tenant's keys of `app_id` when it names one
        that has them, else with the server-wide key.

        Raises:
            BridgeNotConfigured: no key to sign with.
            RequestInvalid: not an http(s) URL.
        """
        if not url.startswith(("http://", "https://")):
            raise RequestInvalid("url must be an http(s) URL of the app's bridge endpoint")
        if tenant_id is not None and app_id:
            keys: BridgeKeys | SigningKeys = await self.request_keys(tenant_id, app_id)
        else:
            keys = self.required_keys()
        return await call_app(keys, url, SyncRequest(url=url), SyncResponse, policy=self._policy)

    async def probe(self, tenant_id: str, app_id: str) -> HealthResponse:
        """Call a registered app's `health` action; record when it answered.

        Raises:
            BridgeNotConfigured: the server has no signing key.
            AppNotFound: no such app, or it registered no URL.
        """
        async with self._context.store.transaction() as tx:
            app = await get_app(tx, tenant_id, app_id)
        if app is None or not app.url:
            raise AppNotFound(app_id)
        keys = await self.request_keys(tenant_id, app_id)
        health = await call_app(keys, app.url, HealthRequest(), HealthResponse, policy=self._policy)
        async with self._context.store.transaction() as tx:
            await touch_app(tx, tenant_id, app_id, now=self._context.clock.now())
        return health


def _key_view(key: AppKey, now: datetime, primary: str | None) -> AppKeyView:
    return AppKeyView(
        app_id=key.app_id,
        key_id=key.key_id,
        created_at=key.created_at,
        expires_at=key.expires_at,
        revoked_at=key.revoked_at,
        active=key.active(now),
        primary=key.key_id == primary,
    )


MAX_CRONS_PER_APP = 100
"""The most cron triggers one app's workflows may declare (a sync with more is refused)."""

MAX_WORKFLOWS_PER_APP = 1_000
"""The most workflows one app may describe."""

MAX_TRIGGERS_PER_WORKFLOW = 100
"""The most triggers one workflow may declare."""

MAX_BRIDGE_ID_LENGTH = 256
"""The longest app id or workflow id a sync takes (as the API's other names)."""


def app_id_problem(app_id: str) -> str | None:
    """Why `app_id` cannot name an app, or None when it can: an app id is 1 to
    `MAX_BRIDGE_ID_LENGTH` characters without ':' (its slugs split on it) or
    control characters (it travels in the `Ductor-App` header)."""
    if not app_id or len(app_id) > MAX_BRIDGE_ID_LENGTH or ":" in app_id:
        return f"an app id is 1 to {MAX_BRIDGE_ID_LENGTH} characters without ':'"
    if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in app_id):
        return "an app id must not contain control characters"
    return None


def _check_options(describe: DescribeResponse, engine: ExpressionEngine) -> None:
    """Refuse a sync whose workflows' options cannot work, naming every problem
    with its JSON pointer into the describe body.

    Raises:
        RequestInvalid: `details.pointer` is the first problem's place,
            `details.problems` all of them.
    """
    problems: list[dict[str, str]] = []
    if ":" in describe.app_id:  # bridge:<app_id>:<workflow_id> must split one way only
        problems.append({"pointer": "/app_id", "message": "an app id must not contain ':'"})
    if len(describe.app_id) > MAX_BRIDGE_ID_LENGTH:
        message = f"an app id is at most {MAX_BRIDGE_ID_LENGTH} characters"
        problems.append({"pointer": "/app_id", "message": message})
    if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in describe.app_id):
        message = "an app id must not contain control characters"
        problems.append({"pointer": "/app_id", "message": message})
    if len(describe.workflows) > MAX_WORKFLOWS_PER_APP:
        message = (
            f"{len(describe.workflows)} workflows: an app may describe at most"
            f" {MAX_WORKFLOWS_PER_APP}"
        )
        problems.append({"pointer": "/workflows", "message": message})
        _refuse(problems)  # one problem, not one per workflow
    first_at: dict[str, int] = {}
    for i, info in enumerate(describe.workflows):
        if not info.id:
            problems.append({"pointer": f"/workflows/{i}/id", "message": "must not be empty"})
        elif len(info.id) > MAX_BRIDGE_ID_LENGTH:
            message = f"a workflow id is at most {MAX_BRIDGE_ID_LENGTH} characters"
            problems.append({"pointer": f"/workflows/{i}/id", "message": message})
        elif info.id in first_at:
            message = (
                f"workflow {info.id!r} is described twice (first at /workflows/{first_at[info.id]})"
            )
            problems.append({"pointer": f"/workflows/{i}/id", "message": message})
        else:
            first_at[info.id] = i
        if info.retries < 0:
            message = f"must be at least 0, got {info.retries}"
            problems.append({"pointer": f"/workflows/{i}/retries", "message": message})
        if len(info.triggers) > MAX_TRIGGERS_PER_WORKFLOW:
            message = f"a workflow may declare at most {MAX_TRIGGERS_PER_WORKFLOW} triggers"
            problems.append({"pointer": f"/workflows/{i}/triggers", "message": message})
            continue
        for j, trigger in enumerate(info.triggers):
            pointer = f"/workflows/{i}/triggers/{j}"
            if trigger.event is None and trigger.cron is None:
                message = "a trigger needs exactly one of event and cron"
                problems.append({"pointer": pointer, "message": message})
            elif trigger.event == "":
                problems.append({"pointer": pointer + "/event", "message": "must not be empty"})
            elif trigger.event is not None and len(trigger.event) > MAX_BRIDGE_ID_LENGTH:
                message = f"an event name is at most {MAX_BRIDGE_ID_LENGTH} characters"
                problems.append({"pointer": pointer + "/event", "message": message})
            if trigger.match is not None and trigger.cron is None and trigger.match.strip():
                # Compiled as the events' filters are: within the engine's cost limits.
                try:
                    engine.compile(trigger.match)
                except ExpressionError as exc:
                    message = exc.message.split("\n", 1)[0]
                    problems.append({"pointer": pointer + "/match", "message": message})
                else:
                    # Evaluated over the event alone (`trigger_matches`).
                    unseen = unseen_variables(trigger.match, ("event",), engine.functions.names())
                    if unseen is not None:
                        message = f"the match {unseen}: {trigger.match!r:.80}"
                        problems.append({"pointer": pointer + "/match", "message": message})
    crons = sum(1 for info in describe.workflows for t in info.triggers if t.cron is not None)
    crons_checked = crons <= MAX_CRONS_PER_APP  # else one problem, not one per cron
    if not crons_checked:
        message = f"{crons} cron triggers: an app may have at most {MAX_CRONS_PER_APP}"
        problems.append({"pointer": "/workflows", "message": message})
    for i, info in enumerate(describe.workflows):
        if info.concurrency is not None:
            for pointer, message in option_problems(
                info.concurrency, engine, f"/workflows/{i}/concurrency"
            ):
                problems.append({"pointer": pointer, "message": message})
        if info.timeout is not None:
            try:
                if parse_duration(info.timeout) <= timedelta(0):  # every run would fail at once
                    message = f"must be longer than zero, got {info.timeout!r}"
                    problems.append({"pointer": f"/workflows/{i}/timeout", "message": message})
            except DurationError as exc:
                problems.append({"pointer": f"/workflows/{i}/timeout", "message": exc.message})
        for j, trigger in enumerate(info.triggers):
            if trigger.cron is None or not crons_checked:
                continue
            pointer = f"/workflows/{i}/triggers/{j}"
            if trigger.event is not None or trigger.match is not None:
                problems.append(
                    {"pointer": pointer, "message": "a cron trigger takes no event and no match"}
                )
            problem = cron_problem(trigger.cron)
            if problem is not None:
                problems.append({"pointer": pointer + "/cron", "message": problem})
    if problems:
        _refuse(problems)


def _refuse(problems: list[dict[str, str]]) -> NoReturn:
    """Raise the refusal of a sync or checkpoint naming every problem (`details.problems`)."""
    first = problems[0]
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    raise RequestInvalid(
        f"{first['pointer']}: {first['message']}{more}",
        details={"pointer": first["pointer"], "problems": problems},
    )


__all__ = [
    "MAX_BRIDGE_ID_LENGTH",
    "MAX_CRONS_PER_APP",
    "MAX_TRIGGERS_PER_WORKFLOW",
    "MAX_WORKFLOWS_PER_APP",
    "STALE_AFTER",
    "AppKeyNotFound",
    "AppKeyView",
    "AppNotFound",
    "AppView",
    "BridgeAppForbidden",
    "BridgeCaller",
    "BridgeService",
    "BridgeWorkflowNotFound",
    "CreatedAppKey",
]
