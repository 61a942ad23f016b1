"""The bridge endpoint over real HTTP (uvicorn on 127.0.0.1) for each adapter:
the full execute loop for every primitive, the other actions, and signature
rejection with nothing run."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import msgspec
import pytest
from litestar import Litestar
from starlette.applications import Starlette

from ductor import CancelContext, Client, Context, Event, Signal, StepFailed
from ductor.asgi import MAX_BODY_BYTES, BridgeApp
from ductor.litestar import bridge_handler
from ductor.protocol import (
    SIGNATURE_HEADER,
    CancelResponse,
    DescribeResponse,
    ErrorInfo,
    ErrorResponse,
    ExecuteRequest,
    ExecuteResponse,
    HealthResponse,
    InvokeOp,
    SigningKeys,
    SyncResponse,
    WaitForEventOp,
    encode,
    sign,
    sign_v2,
)
from ductor.starlette import bridge_route
from ductor.testing import ChildFailed, LocalEngine, over_http

KEY = "signkey-test-0001"
OLD_KEY = "signkey-test-0000"
API_KEY = "api-key-test"
TLS = httpx.create_ssl_context()  # built once: it is the slow part of a new client

ADAPTERS: dict[str, Callable[[Client], Any]] = {
    "asgi": lambda client: BridgeApp(client),
    "starlette": lambda client: Starlette(routes=[bridge_route(client)]),
    "litestar": lambda client: Litestar(route_handlers=[bridge_handler(client)], debug=False),
}


def build_client(calls: Counter[str], **options: Any) -> Client:
    client = Client("shop", signing_key=KEY, **options)

    async def charge(order: dict[str, Any]) -> int:
        calls["charge"] += 1
        return int(order["total"])

    async def flaky() -> str:
        calls["flaky"] += 1
        if calls["flaky"] < 2:
            raise ConnectionError("try again")
        return "steady"

    def part(i: int) -> int:
        calls[f"part-{i}"] += 1
        return i * 10

    async def cancelled(ctx: CancelContext, order: Any) -> None:
        calls[f"cancel:{ctx.run_id}:{ctx.reason}"] += 1

    @client.workflow(
        "charge-order", trigger="order.created", retries=2, on_cancel=cancelled, timeout="1h"
    )
    async def charge_order(ctx: Context, order: dict[str, Any]) -> dict[str, Any]:
        total = await ctx.step.run("charge", charge, order)
        steady = await ctx.step.run("flaky", flaky)
        parts = await asyncio.gather(*(ctx.step.run(f"part-{i}", part, i) for i in range(3)))
        await ctx.step.sleep("cool-off", "10m")
        shipped = await ctx.step.wait_for_event("shipped", event="order.shipped", timeout="7d")
        refund = await ctx.step.wait_for_event("refund", event="order.refunded", timeout="1h")
        approval = await ctx.step.wait_for_signal("approve", timeout="1d")
        receipt = await ctx.step.invoke("receipt", workflow="send-receipt", input={"t": total})
        try:
            await ctx.step.invoke("audit", workflow="audit", input=None)
            audit = "ok"
        except StepFailed as failed:
            audit = failed.code
        return {
            "total": total,
            "steady": steady,
            "parts": list(parts),
            "shipped": shipped.data if shipped else None,
            "refund": refund,
            "approval": approval.data if approval else None,
            "receipt": receipt,
            "audit": audit,
            "trigger": ctx.event.name if ctx.event else None,
        }

    return client


async def child(op: InvokeOp) -> Any:
    if op.workflow == "audit":
        raise ChildFailed(ErrorInfo(code="audit.down", message="audit is down"))
    return {"sent": op.input}


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
async def test_full_execute_loop_over_http(adapter: str, serve: Callable[[Any], str]) -> None:
    calls: Counter[str] = Counter()
    client = build_client(calls)
    url = serve(ADAPTERS[adapter](client)) + "/api/ductor"
    engine = LocalEngine(
        over_http(url, KEY),
        events={"order.shipped": Event(name="order.shipped", data={"carrier": "ups"})},
        signals={"approve": Signal(name="approve", data={"by": "ops"})},
        invoke=child,
        reverse_parallel=True,
    )
    trigger = Event(name="order.created", data={"id": 1}, id="evt-1")
    outcome = await engine.run("charge-order", {"total": 42}, event=trigger)
    assert outcome.status == "RUN_STATUS_SUCCEEDED", outcome.error
    assert outcome.output == {
        "total": 42,
        "steady": "steady",
        "parts": [0, 10, 20],
        "shipped": {"carrier": "ups"},
        "refund": None,
        "approval": {"by": "ops"},
        "receipt": {"sent": {"t": 42}},
        "audit": "audit.down",
        "trigger": "order.created",
    }
    # every body ran once per successful attempt (flaky failed once, then succeeded)
    assert calls == {"charge": 1, "flaky": 2, "part-0": 1, "part-1": 1, "part-2": 1}


async def _post(url: str, body: bytes, header: str | None) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if header is not None:
        headers[SIGNATURE_HEADER] = header
    async with httpx.AsyncClient(verify=TLS) as http:
        return await http.post(url, content=body, headers=headers)


def _execute_body() -> bytes:
    return encode(ExecuteRequest(run_id="run-9", workflow_id="charge-order", input={"total": 1}))


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
async def test_bad_signatures_are_rejected_with_clear_errors_and_nothing_runs(
    adapter: str, serve: Callable[[Any], str]
) -> None:
    calls: Counter[str] = Counter()
    client = build_client(calls)
    url = serve(ADAPTERS[adapter](client)) + "/api/ductor"
    body = _execute_body()
    now = int(time.time())
    nonce = "0123456789abcdef0123456789abcdef"
    cases = {
        "signature.missing": None,
        "signature.malformed": "v1=abc",
        "signature.mismatch": f"t={now},n={nonce},v2={sign_v2(body, 'not-the-key', now, nonce)}",
        "signature.expired": f"t={now - 301},n={nonce},v2={sign_v2(body, KEY, now - 301, nonce)}",
        # a v1-only signature carries no nonce, so it could be replayed: refused
        "signature.nonce_required": f"t={now},v1={sign(body, KEY, now)}",
    }
    for code, header in cases.items():
        response = await _post(url, body, header)
        assert response.status_code == 401, code
        error = msgspec.json.decode(response.content, type=ErrorResponse)
        assert error.code == code
        assert SIGNATURE_HEADER in error.message
        # even the rejection is signed, so the engine can trust it
        SigningKeys(KEY).verify(response.content, response.headers[SIGNATURE_HEADER], now=now)
    # a body altered after signing is rejected too
    tampered = body.replace(b'"total":1', b'"total":9')
    response = await _post(url, tampered, SigningKeys(KEY).request_header(body, now=now))
    assert response.status_code == 401
    assert calls == {}


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
async def test_a_replayed_execute_is_refused_and_the_step_runs_once(
    adapter: str, serve: Callable[[Any], str]
) -> None:
    calls: Counter[str] = Counter()
    client = build_client(calls)
    url = serve(ADAPTERS[adapter](client)) + "/api/ductor"
    body = _execute_body()
    now = int(time.time())
    header = SigningKeys(KEY).request_header(body, now=now)
    first = await _post(url, body, header)
    assert first.status_code == 200
    assert calls == {"charge": 1}
    replayed = await _post(url, body, header)  # byte for byte the same request
    assert replayed.status_code == 401
    error = msgspec.json.decode(replayed.content, type=ErrorResponse)
    assert error.code == "signature.replayed"
    SigningKeys(KEY).verify(replayed.content, replayed.headers[SIGNATURE_HEADER], now=now)
    assert calls == {"charge": 1}  # the step body did not run again
    # the same body under a fresh nonce is a new request and is served
    again = await _post(url, body, SigningKeys(KEY).request_header(body, now=now))
    assert again.status_code == 200
    assert calls == {"charge": 2}


async def test_v1_requests_are_served_when_nonces_are_not_required(
    serve: Callable[[Any], str],
) -> None:
    calls: Counter[str] = Counter()
    client = build_client(calls, require_nonce=False)
    url = serve(BridgeApp(client)) + "/api/ductor"
    body = _execute_body()
    now = int(time.time())
    response = await _post(url, body, f"t={now},v1={sign(body, KEY, now)}")
    assert response.status_code == 200
    assert calls == {"charge": 1}


async def test_fallback_key_is_accepted_during_rotation(serve: Callable[[Any], str]) -> None:
    calls: Counter[str] = Counter()
    client = build_client(calls, fallback_signing_key=OLD_KEY)
    url = serve(BridgeApp(client)) + "/api/ductor"
    body = _execute_body()
    now = int(time.time())
    response = await _post(url, body, SigningKeys(OLD_KEY).request_header(body, now=now))
    assert response.status_code == 200
    answer = msgspec.json.decode(response.content, type=ExecuteResponse)
    assert answer.run_id == "run-9"
    assert calls == {"charge": 1}
    # answers are signed with the new primary key, never the old one
    SigningKeys(KEY).verify(response.content, response.headers[SIGNATURE_HEADER], now=now)
    with pytest.raises(Exception, match="does not match"):
        SigningKeys(OLD_KEY).verify(response.content, response.headers[SIGNATURE_HEADER], now=now)


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
async def test_health_describe_cancel_and_errors(adapter: str, serve: Callable[[Any], str]) -> None:
    calls: Counter[str] = Counter()
    client = build_client(calls)
    base = serve(ADAPTERS[adapter](client))
    url = base + "/api/ductor"
    now = int(time.time())
    keys = SigningKeys(KEY)
    async with httpx.AsyncClient(verify=TLS) as http:
        health = await http.get(url)  # unsigned
    assert health.status_code == 200
    assert msgspec.json.decode(health.content, type=HealthResponse).app_id == "shop"

    body = b'{"action":"describe"}'
    described = await _post(url, body, keys.request_header(body, now=now))
    assert described.status_code == 200
    info = msgspec.json.decode(described.content, type=DescribeResponse)
    assert info.app_id == "shop"
    (wf,) = info.workflows
    assert (wf.id, wf.retries, wf.timeout, wf.cancellable) == ("charge-order", 2, "1h", True)
    assert [t.event for t in wf.triggers] == ["order.created"]

    body = b'{"action":"cancel","run_id":"run-5","workflow_id":"charge-order","reason":"user"}'
    cancelled = await _post(url, body, keys.request_header(body, now=now))
    assert cancelled.status_code == 200
    assert msgspec.json.decode(cancelled.content, type=CancelResponse).handled is True
    assert calls == {"cancel:run-5:user": 1}

    body = b'{"action":"execute","run_id":"r","workflow_id":"nope"}'
    missing = await _post(url, body, keys.request_header(body, now=now))
    assert missing.status_code == 404
    assert msgspec.json.decode(missing.content, type=ErrorResponse).code == "workflow.not_found"

    body = b'{"action":"execute","run_id":"r"}'
    bad = await _post(url, body, keys.request_header(body, now=now))
    assert bad.status_code == 400
    error = msgspec.json.decode(bad.content, type=ErrorResponse)
    assert error.code == "protocol.invalid"
    assert "workflow_id" in error.message

    body = b'{"action":"explode"}'
    unknown = await _post(url, body, keys.request_header(body, now=now))
    assert unknown.status_code == 400


async def test_sync_action_posts_the_describe_payload_to_the_server(
    serve: Callable[[Any], str], fake_server: Any
) -> None:
    calls: Counter[str] = Counter()
    client = build_client(calls, server_url=fake_server.url, api_key=API_KEY)
    base = serve(BridgeApp(client))
    body = b'{"action":"sync","url":null}'
    response = await _post(
        base + "/api/ductor", body, SigningKeys(KEY).request_header(body, now=int(time.time()))
    )
    assert response.status_code == 200, response.content
    answer = msgspec.json.decode(response.content, type=SyncResponse)
    assert answer == SyncResponse(app_id="shop", synced=True, accepted=["charge-order"])
    (manifest,) = fake_server.syncs
    assert manifest.url == base + "/api/ductor"
    assert [w.id for w in manifest.workflows] == ["charge-order"]
    method, path, _, headers = fake_server.received[0]
    assert (method, path) == ("POST", "/v1/bridge/sync")
    assert headers["authorization"] == f"Bearer {API_KEY}"


async def test_wrong_path_and_method() -> None:
    calls: Counter[str] = Counter()
    app = BridgeApp(build_client(calls))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
        assert (await http.get("/elsewhere")).status_code == 404
        put = await http.put("/api/ductor", content=b"{}")
        assert put.status_code == 405
        assert msgspec.json.decode(put.content, type=ErrorResponse).code == "protocol.invalid"


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
async def test_other_methods_get_the_signed_405_of_every_adapter(adapter: str) -> None:
    calls: Counter[str] = Counter()
    transport = httpx.ASGITransport(app=ADAPTERS[adapter](build_client(calls)))
    keys = SigningKeys(KEY)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
        for method in ("PUT", "PATCH", "DELETE"):
            answer = await http.request(method, "/api/ductor", content=b"{}")
            assert answer.status_code == 405, (method, answer.content)
            keys.verify(answer.content, answer.headers[SIGNATURE_HEADER], now=int(time.time()))
            error = msgspec.json.decode(answer.content, type=ErrorResponse)
            assert error.code == "protocol.invalid"
        head = await http.head("/api/ductor")  # HEAD is health, as GET is
        assert head.status_code == 200
        assert SIGNATURE_HEADER.lower() in head.headers


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
async def test_every_adapter_takes_bodies_up_to_64_mib_and_refuses_larger(adapter: str) -> None:
    """The same limit everywhere: Litestar refused 10 MB with its own 413, and the
    Starlette route read any size into memory before the signature was checked."""
    calls: Counter[str] = Counter()
    transport = httpx.ASGITransport(app=ADAPTERS[adapter](build_client(calls)))
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
        eleven_mb = await http.post("/api/ductor", content=b" " * (11 * 1024 * 1024))
        assert eleven_mb.status_code == 401, eleven_mb.content[:200]
        error = msgspec.json.decode(eleven_mb.content, type=ErrorResponse)
        assert error.code == "signature.missing"
        too_large = await http.post("/api/ductor", content=b" " * (MAX_BODY_BYTES + 1))
        assert too_large.status_code == 413, too_large.content[:200]
    assert not calls


async def test_concurrent_runs_over_http_do_not_mix(serve: Callable[[Any], str]) -> None:
    client = Client("shop", signing_key=KEY)
    calls: Counter[str] = Counter()

    async def double(run: str, i: int) -> int:
        calls[run] += 1
        await asyncio.sleep(0.001)
        return i * 2

    @client.workflow("doubler")
    async def doubler(ctx: Context, n: int) -> list[int]:
        firsts = await asyncio.gather(
            *(ctx.step.run(f"p{i}", double, ctx.run_id, i) for i in range(2))
        )
        rest = [await ctx.step.run("seq", double, ctx.run_id, n + i) for i in range(3)]
        return [*firsts, *rest]

    url = serve(BridgeApp(client)) + "/api/ductor"
    runs = 8
    outcomes = await asyncio.gather(
        *(
            LocalEngine(over_http(url, KEY)).run("doubler", n, run_id=f"run-{n}")
            for n in range(runs)
        )
    )
    for n, outcome in enumerate(outcomes):
        assert outcome.output == [0, 2, 2 * n, 2 * (n + 1), 2 * (n + 2)]
    assert calls == {f"run-{n}": 5 for n in range(runs)}


async def test_asgi_lifespan_closes_the_server_pool(fake_server: Any) -> None:
    client = Client("shop", signing_key=KEY, server_url=fake_server.url, api_key=API_KEY)
    await client.sync()  # opens the pool
    assert client._http is not None
    app = BridgeApp(client)
    messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
    sent: list[str] = []

    async def receive() -> dict[str, Any]:
        return next(messages)

    async def send(message: Any) -> None:
        sent.append(message["type"])

    await app({"type": "lifespan"}, receive, send)
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert client._http is None


async def test_text_with_a_lone_surrogate_still_gets_an_answer_that_reads_back() -> None:
    """An event name holding half a surrogate pair has no JSON form: the signed answer
    carries U+FFFD in its place instead of failing to be written."""
    client = Client("odd", signing_key=KEY)

    @client.workflow("odd-event")
    async def odd_event(ctx: Context, _: Any) -> Any:
        return await ctx.step.wait_for_event("w", event="half \ud83d", timeout="1h")

    body = encode(ExecuteRequest(run_id="run-odd", workflow_id="odd-event", input=None))
    now, nonce = int(time.time()), "n" * 16
    header = f"t={now},n={nonce},v2={sign_v2(body, KEY, now, nonce)}"
    answer = await client.handle("POST", {SIGNATURE_HEADER: header}, body)
    assert answer.status == 200, answer.body
    [op] = msgspec.json.decode(answer.body, type=ExecuteResponse).opcodes
    assert isinstance(op, WaitForEventOp)
    assert op.event == "half \ufffd"
