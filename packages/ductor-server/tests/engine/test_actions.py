"""The action registry and the built-in handlers, against a real local HTTP server."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from ductor_server.engine.actions import (
    ActionCall,
    ActionFailed,
    ActionRegistry,
    HttpAction,
    default_registry,
)
from ductor_server.engine.errors import DuplicateHandler

from .httpsink import HttpSink


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as s:
        yield s


def call(
    params: dict[str, Any], *, handler: str = "action:http", key: str = "r1:s:-1:1"
) -> ActionCall:
    return ActionCall(
        tenant_id="t",
        run_id="r1",
        step_ref="s",
        attempt=1,
        handler=handler,
        payload={"action": "http", "params": params},
        idempotency_key=key,
    )


async def test_http_post_sends_json_and_the_idempotency_key(sink: HttpSink) -> None:
    http = HttpAction()
    try:
        out = await http(
            call({"url": f"{sink.url}/json", "body": {"a": 1}, "headers": {"X-Trace": "t1"}})
        )
    finally:
        await http.aclose()
    [seen] = sink.requests_to("/json")
    assert seen.method == "POST"
    assert seen.headers["idempotency-key"] == "r1:s:-1:1"
    assert seen.headers["x-trace"] == "t1"
    assert seen.headers["content-type"] == "application/json"
    assert msgspec.json.decode(seen.body) == {"a": 1}
    assert out["status"] == 200
    assert out["body"] == {"path": "/json", "key": "r1:s:-1:1", "body": {"a": 1}}
    assert out["headers"]["etag"] == '"v1"'
    assert "date" not in out["headers"]


async def test_http_get_without_body_and_text_response(sink: HttpSink) -> None:
    http = HttpAction()
    try:
        out = await http(call({"url": f"{sink.url}/text"}))
    finally:
        await http.aclose()
    assert sink.requests_to("/text")[0].method == "GET"
    assert out["body"] == "plain words"


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(400, False), (404, False), (422, False), (429, True), (500, True), (503, True)],
)
async def test_http_error_statuses(sink: HttpSink, status: int, retryable: bool) -> None:
    http = HttpAction()
    try:
        with pytest.raises(ActionFailed) as caught:
            await http(call({"url": f"{sink.url}/status/{status}", "method": "PUT"}))
    finally:
        await http.aclose()
    error = caught.value.error
    assert error.code == f"http.{status}"
    assert error.retryable is retryable
    assert error.details["status"] == status
    if status in (429, 503):
        assert error.retry_after_seconds == 0.0


async def test_http_timeout_is_retryable(sink: HttpSink) -> None:
    http = HttpAction()
    try:
        with pytest.raises(ActionFailed) as caught:
            await http(call({"url": f"{sink.url}/sleep/1", "timeout": "100ms"}))
    finally:
        await http.aclose()
    assert caught.value.error.code == "http.timeout"
    assert caught.value.error.retryable


async def test_http_connection_refused_is_retryable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    http = HttpAction()
    try:
        with pytest.raises(ActionFailed) as caught:
            await http(call({"url": f"http://127.0.0.1:{port}/x", "timeout": 2}))
    finally:
        await http.aclose()
    assert caught.value.error.code == "http.connection"
    assert caught.value.error.retryable


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"url": "ftp://example/x"},
        {"url": "http://127.0.0.1:1/x", "headers": ["nope"]},
        {"url": "http://127.0.0.1:1/x", "timeout": "soon"},
        {"url": "http://127.0.0.1:1/x", "method": 3},
        # a number of seconds is held to what a duration may be: above zero, at most 36500d
        *({"url": "http://127.0.0.1:1/x", "timeout": t} for t in (0, -1, 0.0, -0.5)),
        *({"url": "http://127.0.0.1:1/x", "timeout": t} for t in (float("nan"), float("inf"))),
        {"url": "http://127.0.0.1:1/x", "timeout": 1e300},
        {"url": "http://127.0.0.1:1/x", "timeout": "0s"},
    ],
)
async def test_http_bad_params_are_not_retryable(params: dict[str, Any]) -> None:
    http = HttpAction()
    with pytest.raises(ActionFailed) as caught:
        await http(call(params))
    assert caught.value.error.code == "action.bad_params"
    assert not caught.value.error.retryable


async def test_registry_builtins_and_unknown_handlers() -> None:
    registry = default_registry()
    assert {"action:http", "action:noop", "bridge", "route"} <= set(registry.names())
    # NOTIFY runs in the coordinator now: no worker handler stands behind it.
    assert "notify" not in registry.names()
    out = await registry.run(call({"x": 1}, handler="action:noop"))
    assert out == {"x": 1}
    for name in ("bridge", "route"):
        with pytest.raises(ActionFailed) as caught:
            await registry.run(call({}, handler=name))
        assert caught.value.error.code == "handler.unavailable"
        assert not caught.value.error.retryable
    with pytest.raises(ActionFailed) as unknown:
        await registry.run(call({}, handler="action:missing"))
    assert unknown.value.error.code == "handler.unknown"


async def test_a_second_handler_under_one_name_is_refused_unless_replacing() -> None:
    registry = ActionRegistry()

    async def one(c: ActionCall) -> Any:
        return 1

    async def two(c: ActionCall) -> Any:
        return 2

    registry.register_action("n", one)
    with pytest.raises(DuplicateHandler) as caught:
        registry.register_action("n", two)
    assert caught.value.code == "engine.duplicate_handler"
    assert await registry.run(call({}, handler="action:n")) == 1
    registry.register_action("n", two, replace=True)
    assert await registry.run(call({}, handler="action:n")) == 2


async def test_a_placeholder_gives_way_to_the_real_handler_once() -> None:
    registry = default_registry()

    async def route(c: ActionCall) -> Any:
        return "routed"

    registry.register("route", route)  # replaces the built-in placeholder
    assert await registry.run(call({}, handler="route")) == "routed"
    with pytest.raises(DuplicateHandler):
        registry.register("route", route)
    with pytest.raises(DuplicateHandler):
        registry.register_placeholder("route", route)


def test_every_default_registry_is_its_own() -> None:
    first, second = default_registry(), default_registry()

    async def mine(c: ActionCall) -> Any:
        return None

    first.register_action("mine", mine)
    assert "action:mine" in first.names()
    assert "action:mine" not in second.names()
