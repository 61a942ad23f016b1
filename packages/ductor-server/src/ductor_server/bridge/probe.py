"""Calls the server makes to an app outside a run: `health` and `sync`.

Signed both ways like every bridge message; used by the `/v1/bridge/apps`
endpoints. Holds no state and writes nothing itself.
"""

from __future__ import annotations

import time
from typing import TypeVar

import httpx
import msgspec

from ductor.errors import ProtocolError, SignatureError
from ductor.protocol import (
    SIGNATURE_HEADER,
    ErrorResponse,
    HealthRequest,
    SyncRequest,
    decode,
    encode,
)
from ductor_server.bridge.keys import Signer
from ductor_server.engine.outbound import (
    MAX_RESPONSE_BYTES,
    OutboundForbidden,
    OutboundPolicy,
    guarded_transport,
    read_capped,
)
from ductor_server.errors import ServerError

_S = TypeVar("_S", bound=msgspec.Struct)


class AppCallFailed(ServerError):
    """The app could not be reached, refused the call or answered badly."""

    code = "bridge.app_call_failed"
    retryable = True


async def call_app(
    keys: Signer,
    url: str,
    request: HealthRequest | SyncRequest,
    answer_type: type[_S],
    *,
    call_seconds: float = 30.0,
    transport: httpx.AsyncBaseTransport | None = None,
    policy: OutboundPolicy | None = None,
) -> _S:
    """POST one signed action (a fresh nonce) to the app at `url` and return its
    verified answer.

    Raises:
        AppCallFailed: unreachable, an error answer, a bad signature or body.
    """
    body = encode(request)
    headers = {
        SIGNATURE_HEADER: keys.request_header(body, now=int(time.time())),
        "content-type": "application/json",
    }
    try:
        async with (
            httpx.AsyncClient(
                transport=transport or guarded_transport(policy),
                timeout=call_seconds,
                trust_env=policy is None,
            ) as http,
            http.stream("POST", url, content=body, headers=headers) as response,
        ):
            content = await read_capped(response)
    except OutboundForbidden as exc:
        raise AppCallFailed(
            str(exc), code="outbound.forbidden", retryable=False, details={"host": exc.host}
        ) from exc
    except httpx.HTTPError as exc:
        raise AppCallFailed(f"POST {url} failed: {exc!r}") from exc
    if content is None:
        raise AppCallFailed(f"{url} answered more than {MAX_RESPONSE_BYTES} bytes", retryable=False)
    try:
        keys.verify(content, response.headers.get(SIGNATURE_HEADER), now=int(time.time()))
    except SignatureError as exc:
        raise AppCallFailed(
            f"the answer of {url} failed verification: {exc.message}",
            details={"code": exc.code},
        ) from None
    if response.status_code >= 400:
        try:
            error = decode(content, ErrorResponse)
            details: object = {"status": response.status_code, "code": error.code}
            message = error.message
        except ProtocolError:
            details = {"status": response.status_code}
            message = content[:500].decode("utf-8", "replace")
        raise AppCallFailed(
            f"{url} answered HTTP {response.status_code}: {message}", details=details
        )
    try:
        return decode(content, answer_type)
    except ProtocolError as exc:
        raise AppCallFailed(f"{url} answered an unexpected body: {exc.message}") from None


__all__ = ["AppCallFailed", "call_app"]
