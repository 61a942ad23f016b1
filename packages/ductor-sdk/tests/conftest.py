"""Fixtures: real HTTP servers on 127.0.0.1 (uvicorn in a thread).

`serve` runs any ASGI app; `fake_server` is a small stand-in for the Ductor
server's bridge and REST endpoints that records what it received. Both are real
HTTP, so the SDK's signing, encoding and error handling are exercised end to end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ductor.protocol import (
    SIGNATURE_HEADER,
    CheckpointAck,
    CheckpointRequest,
    DescribeResponse,
    ErrorResponse,
    ExecutePayload,
    InlineRunRequest,
    InlineRunResponse,
    SeenNonces,
    SigningKeys,
    SyncAck,
    encode,
)

SERVER_KEY = "signkey-test-0001"
API_KEY = "api-key-test"


class _Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # the server runs in a thread
        pass


@pytest.fixture
def serve() -> Iterator[Callable[[Any], str]]:
    """Start ASGI apps under uvicorn on 127.0.0.1; returns their base URLs."""
    running: list[tuple[_Server, threading.Thread]] = []

    def start(app: Any) -> str:
        # Let uvicorn bind port 0 itself: handing it a pre-bound socket costs
        # ~40 ms per keep-alive request here (small writes meet delayed ACKs).
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
        server = _Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("uvicorn did not start within 10s")
            time.sleep(0.01)
        running.append((server, thread))
        port = server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in running:
        server.should_exit = True
        thread.join(timeout=10)


@dataclass
class FakeServer:
    """What the fake Ductor server received, and knobs for what it answers."""

    url: str = ""
    keys: SigningKeys = field(default_factory=lambda: SigningKeys(SERVER_KEY))
    received: list[tuple[str, str, bytes, dict[str, str]]] = field(default_factory=list)
    syncs: list[DescribeResponse] = field(default_factory=list)
    inline_runs: list[InlineRunRequest] = field(default_factory=list)
    checkpoints: list[CheckpointRequest] = field(default_factory=list)
    payloads: dict[str, ExecutePayload] = field(default_factory=dict)
    fail_checkpoints: bool = False
    sign_responses_with: str | None = None
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    idempotency: dict[str, str] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    signals: list[tuple[str, str, Any]] = field(default_factory=list)
    gets_until_done: int = 2
    waits: list[str | None] = field(default_factory=list)  # each GET's `wait`, if any
    nonces: SeenNonces = field(default_factory=SeenNonces)


def _fake_app(state: FakeServer) -> Starlette:
    def signed(status: int, value: msgspec.Struct) -> Response:
        body = encode(value)
        keys = SigningKeys(state.sign_responses_with) if state.sign_responses_with else state.keys
        return Response(
            body,
            status_code=status,
            media_type="application/json",
            headers={SIGNATURE_HEADER: keys.header(body, now=int(time.time()))},
        )

    def plain(status: int, value: Any) -> Response:
        return Response(
            msgspec.json.encode(value), status_code=status, media_type="application/json"
        )

    def error(status: int, code: str, message: str) -> Response:
        return plain(status, {"code": code, "message": message, "details": None})

    async def bridge_guard(request: Request) -> tuple[bytes, Response | None]:
        body = await request.body()
        state.received.append((request.method, request.url.path, body, dict(request.headers)))
        if request.headers.get("authorization") != f"Bearer {API_KEY}":
            return body, error(401, "auth.invalid", "bad api key")
        now = int(time.time())
        try:
            # as the server does: a nonce-bearing signature, each nonce accepted once
            verified = state.keys.check(
                body, request.headers.get(SIGNATURE_HEADER), now=now, require_nonce=True
            )
            assert verified.nonce is not None
            state.nonces.first_use(verified.nonce, timestamp=verified.timestamp, now=now)
        except Exception as exc:
            return body, error(401, "signature.invalid", str(exc))
        return body, None

    async def sync(request: Request) -> Response:
        body, denied = await bridge_guard(request)
        if denied:
            return denied
        manifest = msgspec.json.decode(body, type=DescribeResponse)
        state.syncs.append(manifest)
        return signed(
            200, SyncAck(app_id=manifest.app_id, accepted=[w.id for w in manifest.workflows])
        )

    async def inline(request: Request) -> Response:
        body, denied = await bridge_guard(request)
        if denied:
            return denied
        started = msgspec.json.decode(body, type=InlineRunRequest)
        state.inline_runs.append(started)
        run_id = f"run-inline-{len(state.inline_runs)}"
        return signed(200, InlineRunResponse(run_id=run_id, workflow_id=started.workflow_id))

    async def checkpoint(request: Request) -> Response:
        body, denied = await bridge_guard(request)
        if denied:
            return denied
        if state.fail_checkpoints:
            return error(503, "checkpoint.unavailable", "checkpoints are down")
        report = msgspec.json.decode(body, type=CheckpointRequest)
        if report.run_id != request.path_params["run_id"]:
            return error(400, "checkpoint.run_mismatch", "run id differs from the path")
        state.checkpoints.append(report)
        return signed(200, CheckpointAck(run_id=report.run_id, recorded=len(report.opcodes)))

    async def payload(request: Request) -> Response:
        _, denied = await bridge_guard(request)
        if denied:
            return denied
        ref = request.query_params.get("ref", "")
        found = state.payloads.get(ref)
        if found is None or found.run_id != request.path_params["run_id"]:
            return signed(404, ErrorResponse(code="payload.not_found", message=f"no {ref!r}"))
        return signed(200, found)

    def api_guard(request: Request) -> Response | None:
        if request.headers.get("authorization") != f"Bearer {API_KEY}":
            return error(401, "auth.invalid", "missing or wrong API key")
        return None

    async def trigger(request: Request) -> Response:
        if denied := api_guard(request):
            return denied
        body = msgspec.json.decode(await request.body())
        if not isinstance(body.get("family_slug"), str):
            return error(400, "request.invalid", "family_slug is required")
        key = request.headers.get("idempotency-key")
        if key is not None and key in state.idempotency:
            return plain(200, state.runs[state.idempotency[key]])
        run_id = f"run-{len(state.runs) + 1}"
        run = {
            "id": run_id,
            "status": "RUN_STATUS_PENDING",
            "family_slug": body["family_slug"],
            "version": body.get("version") or 1,
            "input": body.get("input"),
            "output": None,
            "error": None,
            "steps": [],
            "gets": 0,
        }
        state.runs[run_id] = run
        if key is not None:
            state.idempotency[key] = run_id
        return plain(201, {k: v for k, v in run.items() if k != "gets"})

    async def get_run(request: Request) -> Response:
        if denied := api_guard(request):
            return denied
        run = state.runs.get(request.path_params["run_id"])
        if run is None:
            return error(404, "run.not_found", f"no run {request.path_params['run_id']!r}")
        run["gets"] += 1
        state.waits.append(request.query_params.get("wait"))
        if run["status"] == "RUN_STATUS_PENDING" and run["gets"] >= state.gets_until_done:
            run["status"] = "RUN_STATUS_SUCCEEDED"
            run["output"] = {"echo": run["input"]}
        return plain(200, {k: v for k, v in run.items() if k != "gets"} | {"extra": "ignored"})

    async def cancel(request: Request) -> Response:
        if denied := api_guard(request):
            return denied
        run = state.runs.get(request.path_params["run_id"])
        if run is None:
            return error(404, "run.not_found", "no such run")
        run["status"] = "RUN_STATUS_CANCELLED"
        return plain(200, {k: v for k, v in run.items() if k != "gets"})

    async def signal(request: Request) -> Response:
        if denied := api_guard(request):
            return denied
        run_id = request.path_params["run_id"]
        if run_id not in state.runs:
            return error(404, "run.not_found", "no such run")
        body = msgspec.json.decode(await request.body())
        if not isinstance(body, dict) or set(body) - {"payload", "id"}:
            # As the server does: the body is {"payload", "id"?}, nothing else.
            return error(400, "request.invalid", "unknown field in the signal body")
        state.signals.append((run_id, request.path_params["name"], body.get("payload")))
        return Response(status_code=204)

    async def events(request: Request) -> Response:
        if denied := api_guard(request):
            return denied
        body = msgspec.json.decode(await request.body())
        state.events.append(body)
        answer = {
            "id": body.get("id") or f"evt-{len(state.events)}",
            "name": body["name"],
            "duplicate": False,
            "runs_started": [],
            "runs_notified": [],
        }
        return plain(202, answer)

    return Starlette(
        routes=[
            Route("/v1/bridge/sync", sync, methods=["POST"]),
            Route("/v1/bridge/runs", inline, methods=["POST"]),
            Route("/v1/bridge/runs/{run_id}/checkpoint", checkpoint, methods=["POST"]),
            Route("/v1/bridge/runs/{run_id}/payload", payload, methods=["GET"]),
            Route("/v1/runs", trigger, methods=["POST"]),
            Route("/v1/runs/{run_id}", get_run, methods=["GET"]),
            Route("/v1/runs/{run_id}/cancel", cancel, methods=["POST"]),
            Route("/v1/runs/{run_id}/signals/{name}", signal, methods=["POST"]),
            Route("/v1/events", events, methods=["POST"]),
        ]
    )


@pytest.fixture
def fake_server(serve: Callable[[Any], str]) -> FakeServer:
    """A fake Ductor server on 127.0.0.1 that records what it receives."""
    state = FakeServer()
    state.url = serve(_fake_app(state))
    return state
