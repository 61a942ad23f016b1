"""`/v1/bridge/...`: the server side of the bridge SDK. Thin handlers only.

The signed routes (`sync`, inline `runs`, `checkpoint`, `payload`) check the
body against the bridge signing key (the `verify_signature` guard) before
anything is decoded, read or written, and sign every answer, errors included
(as the protocol's `ErrorResponse`); a bad or expired signature gets 401 with
the signature error's code and records nothing. The `apps` routes are plain
API calls.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
from litestar import Controller, MediaType, Request, Response, get, post
from litestar.connection import ASGIConnection
from litestar.di import NamedDependency
from litestar.handlers import BaseRouteHandler
from litestar.openapi import ResponseSpec
from litestar.params import FromPath, FromQuery, JSONBody

from ductor.errors import ProtocolError, SignatureError
from ductor.protocol import (
    SIGNATURE_HEADER,
    CheckpointAck,
    CheckpointRequest,
    DescribeResponse,
    ErrorResponse,
    ExecutePayload,
    HealthResponse,
    InlineRunRequest,
    InlineRunResponse,
    SigningKeys,
    SyncAck,
    SyncResponse,
    decode,
    encode,
)
from ductor_core.errors import DuctorError
from ductor_server.errors import BridgeNotConfigured
from ductor_server.services import Answer, AppView, BridgeService
from ductor_server.transports.rest.bodies import (
    NO_BODY,
    AppUrlBody,
    JsonBody,
    NoBody,
    check_limits,
    declared_type,
    required,
)
from ductor_server.transports.rest.dependencies import services_of
from ductor_server.transports.rest.errors import V1_ERRORS, status_for
from ductor_server.transports.rest.idempotency import REPLAYED_HEADER, IdempotencyKey, checked_key

T = TypeVar("T")


class SignedRefusal(Exception):
    """A signed route's error, answered as a signed `ErrorResponse` with `status`."""

    def __init__(self, keys: SigningKeys | None, error: ErrorResponse, status: int) -> None:
        super().__init__(error.message)
        self.keys = keys
        self.error = error
        self.status = status

    @classmethod
    def of(cls, keys: SigningKeys | None, exc: DuctorError) -> SignedRefusal:
        """The refusal for an error of the service layer (status from the one table)."""
        details = msgspec.to_builtins(exc.details) if exc.details is not None else None
        error = ErrorResponse(
            code=exc.code, message=exc.message, details=details, retryable=exc.retryable
        )
        return cls(keys, error, status_for(exc.code, retryable=exc.retryable))


def _keys(connection: ASGIConnection[Any, Any, Any, Any]) -> SigningKeys | None:
    return services_of(connection).bridge.keys


def _signed(
    keys: SigningKeys | None, body: bytes, status: int, headers: dict[str, str] | None = None
) -> Response[bytes]:
    sent = dict(headers or {})
    if keys is not None:
        sent[SIGNATURE_HEADER] = keys.header(body, now=int(time.time()))
    return Response(content=body, status_code=status, media_type=MediaType.JSON, headers=sent)


def answer_signed_refusal(_: Request[Any, Any, Any], exc: SignedRefusal) -> Response[bytes]:
    """Exception handler of the signed routes: the refusal, signed when keys exist."""
    return _signed(exc.keys, encode(exc.error), exc.status)


async def verify_signature(
    connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
) -> None:
    """Guard of the signed routes: the raw body must carry a valid signature.

    Raises:
        SignedRefusal: 503 without a signing key, 401 for a bad or stale signature.
    """
    keys = _keys(connection)
    if keys is None:
        missing = BridgeNotConfigured()
        error = ErrorResponse(code=missing.code, message=missing.message)
        raise SignedRefusal(None, error, 503)
    raw = await connection.body() if isinstance(connection, Request) else b""
    try:
        keys.verify(raw, connection.headers.get(SIGNATURE_HEADER), now=int(time.time()))
    except SignatureError as exc:
        raise SignedRefusal(keys, ErrorResponse(code=exc.code, message=exc.message), 401) from exc


class ProtocolBody(JsonBody):
    """The DTO of the signed routes: bodies are wire messages of `ductor.protocol`."""

    def decode_bytes(self, value: bytes) -> Any:
        """Decode any non-empty body (blank is a protocol error too)."""
        return self.decode(value, declared_type(self.field()))

    def decode(self, raw: bytes, into: Any) -> Any:
        """Decode a wire message; a bad one is a signed 400 `protocol.invalid`."""
        return _protocol_decode(_keys(self.asgi_connection), raw, into)


def _protocol_decode(keys: SigningKeys | None, raw: bytes, into: type[T]) -> T:
    try:
        value = decode(raw, into)
        check_limits(raw, value)
    except ProtocolError as exc:
        raise _invalid(keys, exc.message) from exc
    except DuctorError as exc:  # nested too deep, an integer outside 64 bits, a NUL
        raise _invalid(keys, exc.message) from exc
    except UnicodeDecodeError as exc:
        raise _invalid(keys, "the body is not valid UTF-8") from exc
    except RecursionError as exc:
        raise _invalid(keys, "the body is nested too deeply") from exc
    return value


def _invalid(keys: SigningKeys | None, message: str) -> SignedRefusal:
    """A signed 400 `protocol.invalid`."""
    return SignedRefusal(keys, ErrorResponse(code="protocol.invalid", message=message), 400)


def _message(keys: SigningKeys | None, data: T | NoBody, into: type[T]) -> T:
    """The decoded wire message of a signed route (an empty body is refused as the
    protocol refuses it)."""
    if isinstance(data, NoBody):
        return _protocol_decode(keys, b"", into)
    return data


async def _answer(
    keys: SigningKeys | None, produce: Callable[[], Awaitable[Answer[Any]]]
) -> Response[bytes]:
    """Run the service call and sign its answer (or its error)."""
    try:
        answer = await produce()
    except DuctorError as exc:
        raise SignedRefusal.of(keys, exc) from exc
    headers = {REPLAYED_HEADER: "true"} if answer.replayed else None
    return _signed(keys, encode(answer.value), int(answer.outcome), headers)


def _signed_responses(answer: type[Any], status: int) -> dict[int, ResponseSpec]:
    description = "A signed wire message (or a signed `ErrorResponse`)"
    errors = {
        code: ResponseSpec(data_container=ErrorResponse, description=text.description)
        for code, text in V1_ERRORS.items()
    }
    errors[503] = ResponseSpec(
        data_container=ErrorResponse, description="No bridge signing key (`bridge.not_configured`)"
    )
    return {**errors, status: ResponseSpec(data_container=answer, description=description)}


class BridgeController(Controller):
    """SDK apps register, start inline runs, checkpoint steps and fetch large payloads."""

    path = "/v1/bridge"
    tags = ("bridge",)
    dto = ProtocolBody
    exception_handlers = {SignedRefusal: answer_signed_refusal}  # noqa: RUF012

    @post(
        "/sync",
        status_code=200,
        guards=[verify_signature],
        responses=_signed_responses(SyncAck, 200),
    )
    async def sync(
        self,
        tenant_id: NamedDependency[str],
        bridge: NamedDependency[BridgeService],
        data: JSONBody[DescribeResponse | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[bytes]:
        """Register or refresh an app: body `DescribeResponse`, answer `SyncAck`."""
        describe = _message(bridge.keys, data, DescribeResponse)

        async def produce() -> Answer[SyncAck]:
            key = checked_key(idempotency_key)
            return await bridge.sync(tenant_id, describe, idempotency_key=key)

        return await _answer(bridge.keys, produce)

    @post(
        "/runs",
        status_code=201,
        guards=[verify_signature],
        responses=_signed_responses(InlineRunResponse, 201),
    )
    async def inline_run(
        self,
        tenant_id: NamedDependency[str],
        bridge: NamedDependency[BridgeService],
        data: JSONBody[InlineRunRequest | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[bytes]:
        """Start a run the caller executes itself: `InlineRunRequest` -> `InlineRunResponse`."""
        body = _message(bridge.keys, data, InlineRunRequest)

        async def produce() -> Answer[InlineRunResponse]:
            key = checked_key(idempotency_key)
            return await bridge.inline_run(tenant_id, body, idempotency_key=key)

        return await _answer(bridge.keys, produce)

    @post(
        "/runs/{run_id:str}/checkpoint",
        status_code=200,
        guards=[verify_signature],
        responses=_signed_responses(CheckpointAck, 200),
    )
    async def checkpoint(
        self,
        run_id: FromPath[str],
        tenant_id: NamedDependency[str],
        bridge: NamedDependency[BridgeService],
        data: JSONBody[CheckpointRequest | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[bytes]:
        """Record opcodes an app produced in-process: `CheckpointRequest` -> `CheckpointAck`."""
        body = _message(bridge.keys, data, CheckpointRequest)

        async def produce() -> Answer[CheckpointAck]:
            key = checked_key(idempotency_key)
            return await bridge.checkpoint(tenant_id, run_id, body, idempotency_key=key)

        return await _answer(bridge.keys, produce)

    @get(
        "/runs/{run_id:str}/payload",
        guards=[verify_signature],
        responses=_signed_responses(ExecutePayload, 200),
    )
    async def payload(
        self,
        run_id: FromPath[str],
        tenant_id: NamedDependency[str],
        bridge: NamedDependency[BridgeService],
        ref: FromQuery[str | None] = None,
    ) -> Response[bytes]:
        """The input, steps and event of an execute sent with `payload_ref`."""

        async def read() -> Answer[ExecutePayload]:
            return Answer(await bridge.payload(tenant_id, run_id, ref))

        return await _answer(bridge.keys, read)

    @post("/apps", status_code=200, dto=JsonBody, responses=V1_ERRORS)
    async def request_sync(
        self,
        bridge: NamedDependency[BridgeService],
        data: JSONBody[AppUrlBody | NoBody] = NO_BODY,
    ) -> SyncResponse:
        """Ask an app to register itself: body `{"url": "<its bridge endpoint>"}`.

        The server sends the app the signed `sync` action; the app POSTs its
        describe payload to `/v1/bridge/sync` and the app's answer comes back.
        """
        return await bridge.request_sync(required(data).url)

    @post("/apps/{app_id:str}/health", status_code=200, responses=V1_ERRORS)
    async def probe(
        self,
        app_id: FromPath[str],
        tenant_id: NamedDependency[str],
        bridge: NamedDependency[BridgeService],
    ) -> HealthResponse:
        """Call a registered app's `health` action now (a quiet app stops being stale)."""
        return await bridge.probe(tenant_id, app_id)

    @get("/apps", responses=V1_ERRORS)
    async def apps(
        self, tenant_id: NamedDependency[str], bridge: NamedDependency[BridgeService]
    ) -> list[AppView]:
        """The registered apps; `stale` when one has neither synced nor answered lately."""
        return await bridge.apps(tenant_id)


__all__ = ["BridgeController", "SignedRefusal", "verify_signature"]
