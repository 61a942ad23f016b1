"""`/v1/bridge/...`: the server side of the bridge SDK. Thin handlers only.

Every body is checked against the bridge signing key before anything is read
or written, and every answer is signed; a bad or expired signature gets 401
with the signature error's code and records nothing.
"""

from __future__ import annotations

import time
from typing import Any, TypeVar

import msgspec
from litestar import Controller, MediaType, Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery

from ductor.errors import ProtocolError, SignatureError
from ductor.protocol import (
    SIGNATURE_HEADER,
    CheckpointRequest,
    DescribeResponse,
    ErrorResponse,
    HealthResponse,
    InlineRunRequest,
    SigningKeys,
    SyncResponse,
    decode,
    encode,
)
from ductor_core.errors import DuctorError
from ductor_server.api.bodies import decode_body
from ductor_server.api.errors import status_for
from ductor_server.bridge.keys import signing_keys_from_env
from ductor_server.bridge.service import AppView, BridgeService
from ductor_server.errors import ServerError
from ductor_server.services import Services

_S = TypeVar("_S", bound=msgspec.Struct)


def _keys(request: Request[Any, Any, Any]) -> SigningKeys | None:
    state = request.app.state
    if "bridge_keys" not in state:
        state.bridge_keys = signing_keys_from_env()
    keys: SigningKeys | None = state.bridge_keys
    return keys


class AppUrlBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/bridge/apps`: where the app's bridge endpoint is."""

    url: str


def _required_keys(request: Request[Any, Any, Any]) -> SigningKeys:
    keys = _keys(request)
    if keys is None:
        raise BridgeNotConfigured()
    return keys


class BridgeNotConfigured(ServerError):
    """The server has no bridge signing key."""

    code = "bridge.not_configured"
    retryable = True

    def __init__(self) -> None:
        super().__init__("the server has no bridge signing key: set DUCTOR_BRIDGE_SIGNING_KEY")


def _service(request: Request[Any, Any, Any], services: Services) -> BridgeService:
    state = request.app.state
    if "bridge_service" not in state:
        runtime = state.runtime
        state.bridge_service = BridgeService(
            services.store, runtime.coordinator.parts, services.wake
        )
    service: BridgeService = state.bridge_service
    return service


def _signed(keys: SigningKeys | None, body: bytes, status: int) -> Response[bytes]:
    headers = {}
    if keys is not None:
        headers[SIGNATURE_HEADER] = keys.header(body, now=int(time.time()))
    return Response(content=body, status_code=status, media_type=MediaType.JSON, headers=headers)


def _error(
    keys: SigningKeys | None, code: str, message: str, status: int, **kw: Any
) -> Response[bytes]:
    return _signed(keys, encode(ErrorResponse(code=code, message=message, **kw)), status)


async def _call(
    request: Request[Any, Any, Any],
    body_type: type[_S] | None,
    run: Any,
    status: int = 200,
) -> Response[bytes]:
    """Verify the signature, decode the body, run `run(body)`, sign its answer."""
    keys = _keys(request)
    if keys is None:
        return _error(
            None,
            "bridge.not_configured",
            "the server has no bridge signing key: set DUCTOR_BRIDGE_SIGNING_KEY",
            503,
        )
    raw = await request.body()
    try:
        keys.verify(raw, request.headers.get(SIGNATURE_HEADER), now=int(time.time()))
    except SignatureError as exc:
        return _error(keys, exc.code, exc.message, 401)
    try:
        body = decode(raw, body_type) if body_type is not None else None
    except ProtocolError as exc:
        return _error(keys, "protocol.invalid", exc.message, 400)
    try:
        answer = await run(body)
    except DuctorError as exc:
        details = msgspec.to_builtins(exc.details) if exc.details is not None else None
        return _error(
            keys,
            exc.code,
            exc.message,
            status_for(exc.code, retryable=exc.retryable),
            details=details,
            retryable=exc.retryable,
        )
    return _signed(keys, encode(answer), status)


class BridgeController(Controller):
    """SDK apps register, start inline runs, checkpoint steps and fetch large payloads."""

    path = "/v1/bridge"
    tags = ("bridge",)

    @post("/sync")
    async def sync(
        self,
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
        services: NamedDependency[Services],
    ) -> Response[bytes]:
        """Register or refresh an app: body `DescribeResponse`, answer `SyncAck`."""
        service = _service(request, services)

        async def run(body: DescribeResponse) -> Any:
            return await service.sync(tenant_id, body, now=services.clock.now())

        return await _call(request, DescribeResponse, run)

    @post("/runs")
    async def inline_run(
        self,
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
        services: NamedDependency[Services],
    ) -> Response[bytes]:
        """Start a run the caller executes itself: `InlineRunRequest` -> `InlineRunResponse`."""
        service = _service(request, services)

        async def run(body: InlineRunRequest) -> Any:
            return await service.inline_run(tenant_id, body, now=services.clock.now())

        return await _call(request, InlineRunRequest, run, status=201)

    @post("/runs/{run_id:str}/checkpoint")
    async def checkpoint(
        self,
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
        services: NamedDependency[Services],
        run_id: FromPath[str],
    ) -> Response[bytes]:
        """Record opcodes an app produced in-process: `CheckpointRequest` -> `CheckpointAck`."""
        service = _service(request, services)

        async def run(body: CheckpointRequest) -> Any:
            return await service.checkpoint(tenant_id, run_id, body, now=services.clock.now())

        return await _call(request, CheckpointRequest, run)

    @get("/runs/{run_id:str}/payload")
    async def payload(
        self,
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
        services: NamedDependency[Services],
        run_id: FromPath[str],
        ref: FromQuery[str | None] = None,
    ) -> Response[bytes]:
        """The input, steps and event of an execute sent with `payload_ref`."""
        service = _service(request, services)

        async def run(_: None) -> Any:
            return await service.payload(tenant_id, run_id, ref)

        return await _call(request, None, run)

    @post("/apps", status_code=200)
    async def request_sync(
        self,
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
        services: NamedDependency[Services],
    ) -> SyncResponse:
        """Ask an app to register itself: body `{"url": "<its bridge endpoint>"}`.

        The server sends the app the signed `sync` action; the app POSTs its
        describe payload to `/v1/bridge/sync` and the app's answer comes back.
        """
        body = decode_body(await request.body(), AppUrlBody)
        return await _service(request, services).request_sync(_required_keys(request), body.url)

    @post("/apps/{app_id:str}/health", status_code=200)
    async def probe(
        self,
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
        services: NamedDependency[Services],
        app_id: FromPath[str],
    ) -> HealthResponse:
        """Call a registered app's `health` action now (a quiet app stops being stale)."""
        service = _service(request, services)
        keys = _required_keys(request)
        return await service.probe(tenant_id, app_id, keys, now=services.clock.now())

    @get("/apps")
    async def apps(
        self,
        request: Request[Any, Any, Any],
        tenant_id: NamedDependency[str],
        services: NamedDependency[Services],
    ) -> list[AppView]:
        """The registered apps; `stale` when one has neither synced nor answered lately."""
        return await _service(request, services).apps(tenant_id, now=services.clock.now())


__all__ = ["BridgeController"]
