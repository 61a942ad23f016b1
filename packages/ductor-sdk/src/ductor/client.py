"""The `Client`: workflow registration, the bridge endpoint's five actions, and the
SDK's calls to the server (sync, checkpoint, inline runs, payload fetch).

Framework-free: adapters turn HTTP into `Client.handle(...)` and back. Nothing
here knows about Litestar, Starlette or ASGI.
"""

from __future__ import annotations

import inspect
import time
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, Literal, TypeVar

import httpx
import msgspec

from ductor import _telemetry
from ductor._answers import ErrorBody, decode_answer
from ductor._replay import Context, ExecuteParams, error_info, execute_workflow
from ductor._version import __version__
from ductor.durations import canonical_duration, parse_duration
from ductor.errors import (
    ApiError,
    DuctorError,
    NonRetriableError,
    ProtocolError,
    SignatureError,
    WorkflowNotFound,
)
from ductor.protocol import (
    APP_HEADER,
    CHECKPOINT_PATH,
    INLINE_RUN_PATH,
    PAYLOAD_PATH,
    SIGNATURE_HEADER,
    SYNC_PATH,
    UNREADABLE_JSON,
    CancelRequest,
    CancelResponse,
    CheckpointAck,
    CheckpointRequest,
    ConcurrencyInfo,
    DescribeRequest,
    DescribeResponse,
    ErrorInfo,
    ErrorResponse,
    ExecutePayload,
    ExecuteRequest,
    ExecuteResponse,
    HealthRequest,
    HealthResponse,
    InlineRunRequest,
    InlineRunResponse,
    Opcode,
    RateInfo,
    RunCompleteOp,
    RunFailedOp,
    SeenNonces,
    SigningKeys,
    SyncAck,
    SyncRequest,
    SyncResponse,
    TriggerInfo,
    WorkflowInfo,
    decode_request,
    encode,
    new_nonce,
)

InputT = TypeVar("InputT")
OutputT = TypeVar("OutputT")
S = TypeVar("S", bound=msgspec.Struct)

SDK_NAME = "ductor-python"
"""How this SDK names itself in `health` and `describe`."""


@dataclass(frozen=True, kw_only=True)
class Trigger:
    """What starts a workflow: an event name (with an optional CEL `match`) or a cron."""

    event: str | None = None
    cron: str | None = None
    match: str | None = None

    def __post_init__(self) -> None:
        if (self.event is None) == (self.cron is None):
            raise ValueError("a Trigger needs exactly one of event= or cron=")
        _check_text("trigger event", self.event, empty=False)
        _check_text("trigger cron", self.cron)
        _check_text("trigger match", self.match)


@dataclass(frozen=True, kw_only=True)
class Rate:
    """At most `limit` step starts per `period` ("1m", or a timedelta), `burst`
    of them at once (the rest spread out evenly)."""

    limit: int
    period: str | timedelta
    burst: int = 1

    def __post_init__(self) -> None:
        _check_int("rate limit", self.limit, minimum=1)
        _check_int("rate burst", self.burst, minimum=1)
        if self.burst > self.limit:
            raise ValueError(f"rate burst must be 1 to the limit ({self.limit}), got {self.burst}")
        # canonical_duration raises for a period that does not parse
        if parse_duration(canonical_duration(self.period)) <= timedelta(0):
            raise ValueError(f"rate period must be longer than zero, got {self.period!r}")

    def info(self) -> RateInfo:
        """The wire form."""
        return RateInfo(limit=self.limit, period=canonical_duration(self.period), burst=self.burst)


@dataclass(frozen=True, kw_only=True)
class Concurrency:
    """Limits on a workflow's steps, per value of the CEL `key` (over the run's
    input) if set: at most `limit` running at once, at most `rate` started per
    period. A run that sleeps or waits holds no slot; only running steps count."""

    limit: int | None = None
    key: str | None = None
    rate: Rate | None = None

    def __post_init__(self) -> None:
        if self.limit is None and self.rate is None:
            raise ValueError("a Concurrency needs a limit=, a rate= or both")
        if self.limit is not None:
            _check_int("concurrency limit", self.limit, minimum=1)
        _check_text("concurrency key", self.key)
        if self.rate is not None and not isinstance(self.rate, Rate):
            raise TypeError(f"concurrency rate must be a Rate, got {self.rate!r}")

    def info(self) -> ConcurrencyInfo:
        """The wire form."""
        return ConcurrencyInfo(
            limit=self.limit,
            key=self.key,
            rate=None if self.rate is None else self.rate.info(),
        )


@dataclass(frozen=True, kw_only=True)
class CancelContext:
    """What a cancellation handler gets: the cancelled run and why."""

    run_id: str
    workflow_id: str
    reason: str | None


WorkflowFn = Callable[[Context, InputT], Awaitable[OutputT]]
"""A workflow body: `async def body(ctx: Context, input: I) -> O`."""

CancelHandler = Callable[[CancelContext, Any], Awaitable[None]]
"""A cancellation handler: `async def on_cancel(ctx: CancelContext, input) -> None`."""


class Workflow(Generic[InputT, OutputT]):
    """A registered workflow: its body and the options the engine applies to it."""

    def __init__(
        self,
        *,
        id: str,
        fn: WorkflowFn[InputT, OutputT],
        name: str | None,
        triggers: tuple[Trigger, ...],
        retries: int,
        concurrency: Concurrency | None,
        timeout: str | None,
        on_cancel: CancelHandler | None,
    ) -> None:
        self.id = id
        self.fn = fn
        self.name = name
        self.triggers = triggers
        self.retries = retries
        self.concurrency = concurrency
        self.timeout = timeout
        self.on_cancel = on_cancel
        self._input_type = _input_type(fn)

    async def __call__(self, ctx: Context, input: InputT) -> OutputT:
        """Call the body directly (no replay), e.g. from a unit test."""
        return await self.fn(ctx, input)

    def info(self) -> WorkflowInfo:
        """The wire description of this workflow, as `describe` reports it."""
        return WorkflowInfo(
            id=self.id,
            name=self.name,
            triggers=[
                TriggerInfo(event=t.event, cron=t.cron, match=t.match) for t in self.triggers
            ],
            retries=self.retries,
            concurrency=None if self.concurrency is None else self.concurrency.info(),
            timeout=self.timeout,
            cancellable=self.on_cancel is not None,
        )

    async def _body(self, ctx: Context, value: Any) -> Any:
        """The body as replay calls it: the JSON input converted to the annotated type."""
        if self._input_type is not None:
            try:
                value = msgspec.convert(value, self._input_type)
            except msgspec.ValidationError as exc:
                raise _InputInvalid(f"workflow {self.id!r} input is invalid: {exc}") from None
        return await self.fn(ctx, value)


class _InputInvalid(NonRetriableError):
    code = "workflow.input_invalid"


def _input_type(fn: Callable[..., Any]) -> Any:
    """The annotated type of a body's second parameter, or None when there is none to apply."""
    try:
        hints = typing.get_type_hints(fn)
        params = list(inspect.signature(fn).parameters)
    except Exception:  # unresolved forward references: take the input as JSON
        return None
    if len(params) < 2 or params[1] not in hints:
        return None
    hint = hints[params[1]]
    return None if hint is Any else hint


@dataclass(frozen=True, kw_only=True)
class BridgeResponse:
    """An answer of the bridge endpoint, ready for any HTTP framework to send."""

    status: int
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True, kw_only=True)
class InlineRun:
    """The outcome of `Client.run_inline`.

    `status` is `RUN_STATUS_SUCCEEDED` or `RUN_STATUS_FAILED` when the run ended
    in this process, `RUN_STATUS_RUNNING` when it waits (sleep, event, signal,
    child, retry) and the engine drives the rest through the bridge, or when the
    server did not record the last checkpoint (read the run for its status).
    """

    run_id: str
    status: Literal["RUN_STATUS_SUCCEEDED", "RUN_STATUS_FAILED", "RUN_STATUS_RUNNING"]
    output: Any = None
    error: ErrorInfo | None = None


_STATUS = {
    ProtocolError: 400,
    WorkflowNotFound: 404,
}


class Client:
    """One app's connection to Ductor: its workflows, its keys, its server.

    Args:
        app_id: this app's id, unique per server.
        signing_key: the app's signing key (created for it with `POST
            /v1/bridge/apps/{app_id}/keys`, or the server-wide key): signs and
            verifies every bridge request and response.
        fallback_signing_key: the previous key during rotation (verify only).
        server_url: the Ductor server's base URL.
        api_key: bearer token for the server's API (sync, checkpoint, payloads).
        url: the public URL of this app's bridge endpoint, sent on sync.
        checkpoint: run consecutive steps in one execute, reporting each through
            the server's checkpoint endpoint (falls back to one step per call).
        clock: seconds since the epoch; injectable for tests.
        transport: httpx transport for calls to the server; injectable for tests.
        require_nonce: accept only nonce-bearing (`v2`) signatures on the bridge
            endpoint, each nonce once (replay protection). Set False only to
            serve a server that predates nonces: its `v1` requests can be
            replayed within the signature window.
        seen_nonces: where accepted nonces are remembered (one per process by
            default; see `SeenNonces`).
    """

    def __init__(
        self,
        app_id: str,
        *,
        signing_key: str,
        fallback_signing_key: str | None = None,
        server_url: str = "http://127.0.0.1:7070",
        api_key: str | None = None,
        url: str | None = None,
        checkpoint: bool = False,
        clock: Callable[[], float] = time.time,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = 30.0,
        require_nonce: bool = True,
        seen_nonces: SeenNonces | None = None,
    ) -> None:
        if not app_id:
            raise ValueError("app_id must not be empty")
        if ":" in app_id:  # its runs' family slug is bridge:<app_id>:<workflow_id>
            raise ValueError(f"app_id must not contain ':', got {app_id!r}")
        self.app_id = app_id
        self.keys = SigningKeys(signing_key, fallback_signing_key)
        self.server_url = server_url.rstrip("/")
        self.api_key = api_key
        self.url = url
        self.checkpoint = checkpoint
        self._clock = clock
        self._transport = transport
        self._timeout = timeout
        self._workflows: dict[str, Workflow[Any, Any]] = {}
        self._http: httpx.AsyncClient | None = None
        self.require_nonce = require_nonce
        self.seen_nonces = seen_nonces if seen_nonces is not None else SeenNonces()

    # ------------------------------------------------------------ registration

    def workflow(
        self,
        id: str,
        *,
        trigger: str | Trigger | Sequence[str | Trigger] | None = None,
        retries: int = 3,
        concurrency: int | Concurrency | None = None,
        timeout: str | timedelta | None = None,
        on_cancel: CancelHandler | None = None,
        name: str | None = None,
    ) -> Callable[[WorkflowFn[InputT, OutputT]], Workflow[InputT, OutputT]]:
        """Register an `async def body(ctx, input)` as workflow `id`.

        Args:
            id: the workflow's id, unique in this app.
            trigger: event name(s) or `Trigger`s that start a run.
            retries: retries of each step (and of the body) after the first try.
            concurrency: the most steps running at once (an int), or a `Concurrency`
                with a key, a rate or both.
            timeout: the longest a run may take ("1h", or a timedelta).
            on_cancel: called when a run of this workflow is cancelled.
            name: a human title.
        """
        if not id:
            raise ValueError("workflow id must not be empty")
        if id in self._workflows:
            raise ValueError(f"workflow {id!r} is already registered on app {self.app_id!r}")
        _check_int("retries", retries, minimum=0)
        _check_text("name", name)
        triggers = _triggers(trigger)
        if concurrency is None or isinstance(concurrency, Concurrency):
            limit = concurrency
        elif isinstance(concurrency, int) and not isinstance(concurrency, bool):
            limit = Concurrency(limit=concurrency)
        else:
            raise TypeError(f"concurrency must be an int or a Concurrency, got {concurrency!r}")
        text = None if timeout is None else canonical_duration(timeout)
        if text == "0s":  # every run would time out at once
            raise ValueError(f"timeout must be longer than zero, got {timeout!r}")
        if on_cancel is not None and not callable(on_cancel):
            raise TypeError(f"on_cancel must be an async function, got {on_cancel!r}")

        def register(fn: WorkflowFn[InputT, OutputT]) -> Workflow[InputT, OutputT]:
            wf: Workflow[InputT, OutputT] = Workflow(
                id=id,
                fn=fn,
                name=name,
                triggers=triggers,
                retries=retries,
                concurrency=limit,
                timeout=text,
                on_cancel=on_cancel,
            )
            self._workflows[id] = wf
            return wf

        return register

    @property
    def workflows(self) -> Mapping[str, Workflow[Any, Any]]:
        """The registered workflows by id."""
        return dict(self._workflows)

    def describe(self, url: str | None = None) -> DescribeResponse:
        """The `describe` payload: this app, its URL and its workflows."""
        return DescribeResponse(
            app_id=self.app_id,
            url=self.url or url,
            sdk=SDK_NAME,
            sdk_version=__version__,
            workflows=[wf.info() for wf in self._workflows.values()],
        )

    # ------------------------------------------------------------ the bridge endpoint

    async def handle(
        self,
        method: str,
        headers: Mapping[str, str],
        body: bytes,
        *,
        url: str | None = None,
    ) -> BridgeResponse:
        """Answer one HTTP request to the bridge endpoint.

        GET is `health`, unsigned. POST must carry a valid `Ductor-Signature`;
        its body selects the action. Every answer is signed.

        Args:
            method: the HTTP method.
            headers: the request headers (any case).
            body: the raw request body, exactly as received.
            url: the URL the request reached, used by `sync` when no `url` was configured.
        """
        method = method.upper()
        if method in ("GET", "HEAD"):
            return self._respond(200, self._health())
        if method != "POST":
            return self._error(405, ProtocolError(f"method {method} not allowed; use GET or POST"))
        try:
            self._verify_request(body, _header(headers, SIGNATURE_HEADER))
            request = decode_request(body)
            if isinstance(request, HealthRequest):
                return self._respond(200, self._health())
            if isinstance(request, DescribeRequest):
                return self._respond(200, self.describe(url))
            if isinstance(request, SyncRequest):
                ack = await self.sync(url=request.url or url)
                return self._respond(
                    200, SyncResponse(app_id=self.app_id, synced=True, accepted=ack.accepted)
                )
            if isinstance(request, ExecuteRequest):
                with _telemetry.request_span(
                    "execute",
                    headers,
                    traceparent=request.traceparent,
                    attributes={
                        "ductor.app_id": self.app_id,
                        "ductor.workflow_id": request.workflow_id,
                        "ductor.run_id": request.run_id,
                        # The try this is, 1 for the first, as on the engine's
                        # `ductor.attempt` span (`request.attempt` counts failures).
                        "ductor.attempt": request.attempt + 1,
                    },
                ):
                    return self._respond(200, await self.execute(request))
            with _telemetry.request_span(
                "cancel",
                headers,
                traceparent=None,
                attributes={
                    "ductor.app_id": self.app_id,
                    "ductor.workflow_id": request.workflow_id,
                    "ductor.run_id": request.run_id,
                },
            ):
                return self._respond(200, await self.cancel(request))
        except ApiError as exc:
            return self._error(502, exc)
        except SignatureError as exc:
            return self._error(503 if exc.retryable else 401, exc)
        except DuctorError as exc:
            return self._error(_STATUS.get(type(exc), 500), exc)
        except Exception as exc:  # a bug, not the engine's fault: still a signed answer
            return self._error(
                500, DuctorError(f"internal error in the bridge: {exc!r}", code="bridge.internal")
            )

    def _verify_request(self, body: bytes, header: str | None) -> None:
        """Verify a request's signature and accept its nonce once; nothing runs otherwise."""
        now = int(self._clock())
        verified = self.keys.check(body, header, now=now, require_nonce=self.require_nonce)
        if verified.nonce is not None:
            self.seen_nonces.first_use(verified.nonce, timestamp=verified.timestamp, now=now)

    async def execute(self, request: ExecuteRequest) -> ExecuteResponse:
        """Advance a run by one execute request (see docs/sdk.md for the rules)."""
        wf = self._workflow(request.workflow_id)
        if request.payload_ref is not None:
            payload = await self._fetch_payload(request.run_id, request.payload_ref)
            inputs, steps, event = payload.input, payload.steps, payload.event
        else:
            inputs, steps, event = request.input, request.steps, request.event
        params = ExecuteParams(
            run_id=request.run_id,
            workflow_id=wf.id,
            attempt=request.attempt,
            input=inputs,
            steps=steps,
            event=event,
            target_step=request.target_step,
            retries=wf.retries,
            traceparent=request.traceparent,
        )
        checkpoint = self._checkpointer(request.run_id, wf.id) if self.checkpoint else None
        opcodes = await execute_workflow(wf._body, params, checkpoint=checkpoint)
        return ExecuteResponse(run_id=request.run_id, opcodes=opcodes)

    async def cancel(self, request: CancelRequest) -> CancelResponse:
        """Run the workflow's cancellation handler, if it has one."""
        wf = self._workflow(request.workflow_id)
        if wf.on_cancel is None:
            return CancelResponse(run_id=request.run_id, handled=False)
        ctx = CancelContext(run_id=request.run_id, workflow_id=wf.id, reason=request.reason)
        try:
            await wf.on_cancel(ctx, request.input)
        except Exception as exc:
            # Always an answer: a 5xx would have the engine call the handler again.
            return CancelResponse(
                run_id=request.run_id,
                handled=True,
                error=error_info(exc, default_code="cancel.error", retryable=False),
            )
        return CancelResponse(run_id=request.run_id, handled=True)

    # ------------------------------------------------------------ calls to the server

    async def aclose(self) -> None:
        """Close the connection pool used for calls to the server."""
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def sync(self, url: str | None = None) -> SyncAck:
        """Register (or refresh) this app and its workflows with the server.

        Raises:
            ApiError: the server refused or could not be reached.
        """
        return await self._call("POST", SYNC_PATH, self.describe(url), SyncAck)

    async def run_inline(self, workflow: str | Workflow[Any, Any], input: Any = None) -> InlineRun:
        """Start a run on the server and execute it here, checkpointing each step.

        The run ends here when the body needs no wait; otherwise the engine
        takes over at the first sleep, wait, invoke, retry or parallel fan-out.

        Raises:
            WorkflowNotFound: the workflow is not registered on this client.
            ApiError: the server refused to start the run.
        """
        wf = self._workflow(workflow if isinstance(workflow, str) else workflow.id)
        value = msgspec.json.decode(msgspec.json.encode(input))
        started = await self._call(
            "POST",
            INLINE_RUN_PATH,
            InlineRunRequest(app_id=self.app_id, workflow_id=wf.id, input=value),
            InlineRunResponse,
        )
        checkpoint = self._checkpointer(started.run_id, wf.id)
        params = ExecuteParams(
            run_id=started.run_id,
            workflow_id=wf.id,
            attempt=0,
            input=value,
            steps=[],
            event=None,
            target_step=None,
            retries=wf.retries,
        )
        opcodes = await execute_workflow(wf._body, params, checkpoint=checkpoint)
        # The last opcodes were not reported yet. Unrecorded, the run did not end
        # here: the engine drives it from its last checkpoint, or it already
        # ended otherwise (cancelled, timed out), and the server says how.
        if not await checkpoint(opcodes):
            return InlineRun(run_id=started.run_id, status="RUN_STATUS_RUNNING")
        last = opcodes[-1]
        if isinstance(last, RunCompleteOp):
            return InlineRun(
                run_id=started.run_id, status="RUN_STATUS_SUCCEEDED", output=last.output
            )
        if isinstance(last, RunFailedOp):
            return InlineRun(run_id=started.run_id, status="RUN_STATUS_FAILED", error=last.error)
        return InlineRun(run_id=started.run_id, status="RUN_STATUS_RUNNING")

    def _checkpointer(
        self, run_id: str, workflow_id: str
    ) -> Callable[[list[Opcode]], Awaitable[bool]]:
        async def checkpoint(opcodes: list[Opcode]) -> bool:
            body = CheckpointRequest(
                run_id=run_id, app_id=self.app_id, workflow_id=workflow_id, opcodes=opcodes
            )
            try:
                ack = await self._call(
                    "POST", CHECKPOINT_PATH.format(run_id=run_id), body, CheckpointAck
                )
            except ApiError:
                return False
            return ack.recorded == len(opcodes)

        return checkpoint

    async def _fetch_payload(self, run_id: str, ref: str) -> ExecutePayload:
        payload = await self._call(
            "GET", PAYLOAD_PATH.format(run_id=run_id), None, ExecutePayload, params={"ref": ref}
        )
        if payload.run_id != run_id:
            raise ApiError(
                f"payload {ref!r} belongs to run {payload.run_id!r}, not {run_id!r}",
                status=200,
                code="payload.run_mismatch",
            )
        return payload

    async def _call(
        self,
        method: str,
        path: str,
        body: msgspec.Struct | None,
        response_type: type[S],
        *,
        params: Mapping[str, str] | None = None,
    ) -> S:
        """One signed call to the server's bridge API, with a verified, typed answer."""
        content = b"" if body is None else encode(body)
        headers = {
            SIGNATURE_HEADER: self.keys.header(content, now=int(self._clock()), nonce=new_nonce()),
            APP_HEADER: self.app_id,
            "content-type": "application/json",
        }
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        _telemetry.inject(headers)  # the server's request joins this trace
        if self._http is None:
            self._http = httpx.AsyncClient(transport=self._transport, timeout=self._timeout)
        try:
            response = await self._http.request(
                method, self.server_url + path, content=content, headers=headers, params=params
            )
        except httpx.HTTPError as exc:
            raise ApiError(
                f"{method} {path} failed: {exc!r}", status=0, code="api.unreachable", retryable=True
            ) from exc
        if response.status_code >= 400:
            raise _api_error(method, path, response)
        # A bad answer is the server's fault, never the engine's request: report
        # it as an ApiError so the bridge answers 502, not 400/401.
        try:
            self.keys.verify(
                response.content, response.headers.get(SIGNATURE_HEADER), now=int(self._clock())
            )
        except SignatureError as exc:
            raise ApiError(
                f"{method} {path}: the server's answer failed verification: {exc.message}",
                status=response.status_code,
                code=exc.code,
            ) from None
        return decode_answer(method, path, response, response_type)

    # ------------------------------------------------------------ internals

    def _workflow(self, workflow_id: str) -> Workflow[Any, Any]:
        wf = self._workflows.get(workflow_id)
        if wf is None:
            served = ", ".join(sorted(self._workflows)) or "none"
            raise WorkflowNotFound(
                f"app {self.app_id!r} does not serve workflow {workflow_id!r} (serves: {served})"
            )
        return wf

    def _health(self) -> HealthResponse:
        return HealthResponse(app_id=self.app_id, sdk=SDK_NAME, sdk_version=__version__)

    def _respond(self, status: int, value: msgspec.Struct) -> BridgeResponse:
        body = encode(value)
        return BridgeResponse(
            status=status,
            headers={
                "content-type": "application/json",
                SIGNATURE_HEADER: self.keys.header(body, now=int(self._clock())),
            },
            body=body,
        )

    def _error(self, status: int, exc: DuctorError) -> BridgeResponse:
        return self._respond(
            status,
            ErrorResponse(
                code=exc.code, message=exc.message, details=exc.details, retryable=exc.retryable
            ),
        )


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name) or headers.get(name.lower())
    if value is not None:
        return value
    lowered = name.lower()
    for key, candidate in headers.items():
        if key.lower() == lowered:
            return candidate
    return None


def _triggers(trigger: str | Trigger | Sequence[str | Trigger] | None) -> tuple[Trigger, ...]:
    if trigger is None:
        return ()
    items = [trigger] if isinstance(trigger, str | Trigger) else trigger
    if not isinstance(items, Sequence):
        raise TypeError(
            f"trigger must be an event name, a Trigger or a list of them, got {items!r}"
        )
    triggers = []
    for item in items:
        if isinstance(item, str):
            triggers.append(Trigger(event=item))
        elif isinstance(item, Trigger):
            triggers.append(item)
        else:
            raise TypeError(f"a trigger must be an event name or a Trigger, got {item!r}")
    return tuple(triggers)


def _check_int(what: str, value: object, *, minimum: int) -> None:
    """Refuse what is not an int (a bool is none) of at least `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{what} must be at least {minimum}, got {value}")


def _check_text(what: str, value: object, *, empty: bool = True) -> None:
    """Refuse what is neither None nor a string (nor an empty one, unless `empty`)."""
    if value is None:
        return
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, got {value!r}")
    if not value and not empty:
        raise ValueError(f"{what} must not be empty")


def _api_error(method: str, path: str, response: httpx.Response) -> ApiError:
    try:
        err = msgspec.json.decode(response.content, type=ErrorBody)
    except UNREADABLE_JSON:
        return ApiError(
            f"{method} {path} answered {response.status_code}: {response.text[:200]}",
            status=response.status_code,
            retryable=response.status_code >= 500,
        )
    return ApiError(
        err.message,
        status=response.status_code,
        code=err.code,
        details=err.details,
        retryable=response.status_code >= 500 or response.status_code == 429,
    )
