"""The `bridge` handler against an app played by an httpx transport: what it sends
(signed, inlined or by reference) and how each kind of answer fails the attempt."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import httpx
import msgspec
import pytest

from ductor.protocol import (
    INLINE_LIMIT_BYTES,
    SIGNATURE_HEADER,
    DescribeResponse,
    ErrorResponse,
    ExecuteRequest,
    ExecuteResponse,
    RunCompleteOp,
    SigningKeys,
    decode,
    encode,
)
from ductor_server.bridge.driver import BridgeDriver
from ductor_server.bridge.registry import sync_app
from ductor_server.engine.actions import ActionCall, ActionFailed
from ductor_server.storage import Store

from .conftest import KEY, TENANT

URL = "http://app.test/api/ductor"
KEYS = SigningKeys(KEY)


def _call(input: Any = None) -> ActionCall:
    request = ExecuteRequest(run_id="run-1", workflow_id="wf", input=input)
    return ActionCall(
        tenant_id=TENANT,
        run_id="run-1",
        step_ref="execute",
        attempt=1,
        handler="bridge",
        payload={"app_id": "shop", "workflow_id": "wf", "request": msgspec.to_builtins(request)},
        idempotency_key="run-1:execute:1",
    )


def _signed(body: bytes, status: int = 200, keys: SigningKeys = KEYS) -> httpx.Response:
    header = keys.header(body, now=int(time.time()))
    return httpx.Response(status, content=body, headers={SIGNATURE_HEADER: header})


async def _driver(store: Store, handler: Any) -> BridgeDriver:
    async with store.transaction() as tx:
        describe = DescribeResponse(app_id="shop", sdk="test", sdk_version="0")
        await sync_app(tx, TENANT, describe, url=URL, now=datetime.now(UTC))
    return BridgeDriver(store, keys=KEYS, transport=httpx.MockTransport(handler))


async def test_small_requests_are_inlined_and_large_ones_sent_by_reference(store: Store) -> None:
    seen: list[ExecuteRequest] = []

    def app(request: httpx.Request) -> httpx.Response:
        KEYS.verify(request.content, request.headers[SIGNATURE_HEADER], now=int(time.time()))
        assert request.headers["Idempotency-Key"] == "run-1:execute:1"
        seen.append(decode(request.content, ExecuteRequest))
        return _signed(encode(ExecuteResponse(run_id="run-1", opcodes=[RunCompleteOp(output=1)])))

    driver = await _driver(store, app)
    small = await driver(_call("x"))
    assert small == {"opcodes": [{"op": "RUN_COMPLETE", "output": 1}]}
    await driver(_call("x" * (INLINE_LIMIT_BYTES + 1)))
    await driver.aclose()
    assert seen[0].input == "x"
    assert seen[0].payload_ref is None
    assert seen[1].input is None
    assert seen[1].payload_ref == "run-1:1"


@pytest.mark.parametrize(
    ("answer", "code", "retryable"),
    [
        (lambda: _signed(b'{"run_id":"run-1"}'), "bridge.bad_response", False),
        (lambda: httpx.Response(200, content=b"{}"), "signature.missing", False),
        (
            lambda: _signed(b"{}", keys=SigningKeys("someone-else")),
            "signature.mismatch",
            False,
        ),
        (
            lambda: _signed(encode(ErrorResponse(code="signature.expired", message="old")), 401),
            "signature.expired",
            False,
        ),
        (
            lambda: _signed(encode(ErrorResponse(code="internal", message="boom")), 500),
            "internal",
            True,
        ),
    ],
    ids=["bad-body", "unsigned", "wrong-key", "app-refused", "app-crashed"],
)
async def test_bad_answers_fail_the_attempt_clearly(
    store: Store, answer: Any, code: str, retryable: bool
) -> None:
    driver = await _driver(store, lambda _: answer())
    with pytest.raises(ActionFailed) as failed:
        await driver(_call())
    await driver.aclose()
    assert failed.value.error.code == code
    assert failed.value.error.retryable is retryable


@pytest.mark.parametrize(
    ("op", "pointer"),
    [
        ({"op": "SLEEP", "duration": "banana", "until": None}, "/opcodes/1/duration"),
        ({"op": "SLEEP", "duration": "36501d", "until": None}, "/opcodes/1/duration"),
        ({"op": "SLEEP", "duration": None, "until": "99999-01-01"}, "/opcodes/1/until"),
        ({"op": "SLEEP", "duration": None, "until": None}, "/opcodes/1"),
        (
            {"op": "WAIT_FOR_EVENT", "event": "e", "match": None, "timeout": "7x"},
            "/opcodes/1/timeout",
        ),
        ({"op": "WAIT_FOR_SIGNAL", "signal": "s", "timeout": ""}, "/opcodes/1/timeout"),
    ],
    ids=[
        "sleep-banana",
        "sleep-too-long",
        "until-year-99999",
        "sleep-of-nothing",
        "event",
        "signal",
    ],
)
async def test_an_answer_with_a_time_the_engine_cannot_keep_fails_naming_it(
    store: Store, op: dict[str, Any], pointer: str
) -> None:
    """Such a sleep or timeout used to be read as none at all: it fired at once."""
    ops = [{"op": "SLEEP", "id": "a" * 32, "name": "fine", "duration": "1m", "until": None}]
    ops.append({"id": "b" * 32, "name": "bad", **op})
    body = msgspec.json.encode({"run_id": "run-1", "opcodes": ops})
    driver = await _driver(store, lambda _: _signed(body))
    with pytest.raises(ActionFailed) as failed:
        await driver(_call())
    await driver.aclose()
    assert failed.value.error.code == "bridge.bad_response"
    assert failed.value.error.retryable is False
    assert f"at {pointer}:" in failed.value.error.message


async def test_an_unreachable_or_unknown_app_is_retryable(store: Store) -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    driver = await _driver(store, down)
    with pytest.raises(ActionFailed) as failed:
        await driver(_call())
    assert failed.value.error.code == "bridge.unreachable"
    assert failed.value.error.retryable
    other = msgspec.structs.replace(_call(), payload={**_call().payload, "app_id": "nobody"})
    with pytest.raises(ActionFailed) as missing:
        await driver(other)
    assert missing.value.error.code == "app.not_found"
    await driver.aclose()
