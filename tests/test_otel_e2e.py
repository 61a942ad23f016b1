"""OpenTelemetry end to end, in one process with the SDK's in-memory exporter and
metric reader: a real server (uvicorn on 127.0.0.1, from the app factory), a real
SDK app (uvicorn on 127.0.0.1) and a real HTTP sink.

One trace links a trigger request to the coordinator's ticks, to the task and
attempt of every step, to the bridge call and to the SDK app's span for it (and
its steps); a DAG run's HTTP action is a client span of the same trace and its
sink receives that trace's `traceparent`; an event's runs join the event's
trace. Every named metric reads back with its attributes. Restart survival of
the stored trace context is the store's test
(packages/ductor-server/tests/storage/test_trace_context.py).
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from ductor import Client, Context, NonRetriableError
from ductor.asgi import serve_asgi
from ductor.protocol import BRIDGE_PATH, SigningKeys
from ductor_server import Settings, create_app
from ductor_server.cli_server import create_key
from ductor_server.composition import Composition, build, build_services
from ductor_server.engine.actions import ActionCall, default_registry
from ductor_server.engine.clock import ManualClock
from ductor_server.engine.fairness import FairPolicy
from ductor_server.engine.runtime import Runtime, RuntimeConfig
from ductor_server.storage import open_store
from ductor_server.telemetry.setup import setup_from_env, wanted
from ductor_server.testing import free_port, serve_process

KEY = "signkey-otel-0001"
TENANT, SLOW_TENANT = "t_otel", "t_depth"
APP_ID = "otel-app"
TIMEOUT = 60.0
CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_PARENT = f"00-{CALLER_TRACE}-b7ad6b7169203331-01"

SPANS = InMemorySpanExporter()
METRICS = InMemoryMetricReader()


def _install_providers() -> None:
    """The SDK's providers with in-memory export, once per process (the API lets
    a provider be set only once)."""
    current = trace.get_tracer_provider()
    if isinstance(current, trace.ProxyTracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(SPANS))
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[METRICS]))
    else:  # this module installed them already in this process
        assert isinstance(current, TracerProvider)


class _Uvicorn(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # runs in a thread
        pass


def _serve(app: Any) -> tuple[str, Callable[[], None]]:
    """Serve an ASGI app (lifespan included) on 127.0.0.1 in a thread."""
    server = _Uvicorn(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + TIMEOUT
    while not server.started:
        assert thread.is_alive(), "uvicorn stopped"
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=30)

    return f"http://127.0.0.1:{port}", stop


@dataclass
class Sink:
    """An HTTP endpoint that records the headers it got and answers 200 (after
    `slow` seconds on `/slow`; 404 under `/gone`)."""

    url: str = ""
    received: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    bodies: list[tuple[str, bytes]] = field(default_factory=list)
    slow: float = 1.0

    def start(self) -> Callable[[], None]:
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                sink.bodies.append((self.path, body))
                sink.received.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                if self.path == "/slow":
                    time.sleep(sink.slow)
                body = b'{"ok": true}'
                self.send_response(404 if self.path.startswith("/gone") else 200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{server.server_address[1]}"

        def stop() -> None:
            server.shutdown()
            server.server_close()

        return stop


@dataclass
class World:
    server: str
    keys: dict[str, str]
    sink: Sink
    composition: Composition

    def http(self, tenant: str = TENANT) -> httpx.Client:
        return httpx.Client(
            base_url=self.server,
            headers={"Authorization": f"Bearer {self.keys[tenant]}"},
            timeout=30,
        )

    def wait_run(self, run_id: str, tenant: str = TENANT) -> dict[str, Any]:
        deadline = time.monotonic() + TIMEOUT
        with self.http(tenant) as http:
            while True:
                run: dict[str, Any] = http.get(f"/v1/runs/{run_id}").json()
                if run["status"] in ("RUN_STATUS_SUCCEEDED", "RUN_STATUS_FAILED"):
                    assert run["status"] == "RUN_STATUS_SUCCEEDED", run
                    return run
                assert time.monotonic() < deadline, run
                time.sleep(0.05)


def _app_client(server: str, api_key: str) -> Client:
    client = Client(APP_ID, signing_key=KEY, server_url=server, api_key=api_key)

    @client.workflow("two-steps")
    async def two_steps(ctx: Context, order: dict[str, Any]) -> dict[str, Any]:
        first = await ctx.step.run("reserve", lambda: {"reserved": order["id"]})
        second = await ctx.step.run("charge", lambda: {"charged": order["total"]})
        return {**first, **second, "traceparent_seen": ctx.traceparent is not None}

    @client.workflow("out-of-stock")
    async def out_of_stock(ctx: Context, order: dict[str, Any]) -> None:
        def refuse() -> None:
            raise NonRetriableError(f"no stock for {order['sku']}", code="stock.none")

        await ctx.step.run("reserve", refuse)

    return client


async def _mint(target: str) -> dict[str, str]:
    store = open_store(target)
    await store.open()
    try:
        await store.migrate()
        return {t: await create_key(store, t, name=t) for t in (TENANT, SLOW_TENANT)}
    finally:
        await store.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    _install_providers()
    data_dir: Path = tmp_path_factory.mktemp("otel")
    settings = Settings(
        data_dir=data_dir,
        outbound_allow=("127.0.0.0/8",),
        fairness=FairPolicy.from_json(json.dumps({"tenants": {SLOW_TENANT: {"max_running": 1}}})),
    )
    keys = asyncio.run(_mint(settings.store_target))
    composition = build(settings, bridge_keys=SigningKeys(KEY))
    composition.runtime.queue_depth.interval = 0.1
    sink = Sink()
    stops = [sink.start()]
    try:
        server, stop = _serve(create_app(composition=composition))
        stops.append(stop)
        client = _app_client(server, keys[TENANT])
        app_base, stop = _serve(serve_asgi(client))
        stops.append(stop)

        async def sync() -> None:
            try:
                await client.sync(url=app_base + BRIDGE_PATH)
            finally:
                await client.aclose()  # its pool belongs to this loop

        asyncio.run(sync())
        yield World(server=server, keys=keys, sink=sink, composition=composition)
    finally:
        for stop in reversed(stops):
            stop()
        # The providers stay for this process; later tests' spans are not kept.
        SPANS.clear()
        SPANS.shutdown()


def _spans() -> list[ReadableSpan]:
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    provider.force_flush()
    return list(SPANS.get_finished_spans())


def _trace_of(trace_id: int) -> list[ReadableSpan]:
    return [s for s in _spans() if s.context is not None and s.context.trace_id == trace_id]


def _ancestry(span: ReadableSpan, by_id: dict[int, ReadableSpan]) -> list[str]:
    """The names of `span` and its ancestors, nearest first."""
    names = [span.name]
    while span.parent is not None and span.parent.span_id in by_id:
        span = by_id[span.parent.span_id]
        names.append(span.name)
    return names


def _attr(span: ReadableSpan, name: str) -> Any:
    assert span.attributes is not None
    return span.attributes.get(name)


def test_one_trace_links_a_trigger_to_the_sdk_apps_steps(world: World) -> None:
    with world.http() as http:
        response = http.post(
            "/v1/runs",
            json={"family_slug": f"bridge:{APP_ID}:two-steps", "input": {"id": 7, "total": 500}},
        )
        assert response.status_code == 201, response.text
        run_id = response.json()["id"]
    run = world.wait_run(run_id)
    assert run["output"] == {"reserved": 7, "charged": 500, "traceparent_seen": True}

    [trigger] = [
        s
        for s in _spans()
        if s.name == "ductor.runs.trigger" and _attr(s, "ductor.run_id") == run_id
    ]
    spans = _trace_of(trigger.context.trace_id)  # type: ignore[union-attr]
    by_id = {s.context.span_id: s for s in spans}  # type: ignore[union-attr]
    assert trigger.parent is not None
    request = by_id[trigger.parent.span_id]
    assert request.kind is SpanKind.SERVER
    assert request.parent is None  # the caller sent no traceparent: a new trace
    assert _attr(request, "http.route") == "/v1/runs"
    assert _attr(request, "http.response.status_code") == 201
    named: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        named.setdefault(span.name, []).append(span)

    assert named["ductor.runs.trigger"] == [trigger]
    assert _attr(trigger, "ductor.tenant") == TENANT

    # The coordinator ticked the run (a step result each time) under the trigger.
    ticks = [s for s in named["ductor.tick"] if _attr(s, "ductor.run_id") == run_id]
    assert len(ticks) >= 3
    assert all(_ancestry(t, by_id)[1:] == ["ductor.runs.trigger", "POST /v1/runs"] for t in ticks)
    assert {_attr(t, "ductor.run.status") for t in ticks} >= {"RUN_STATUS_SUCCEEDED"}

    # Three executes (one per step, then the end), each a task and its attempt; the
    # first task was queued by the trigger, the others by ticks.
    tasks = [s for s in named["ductor.task"] if _attr(s, "ductor.run_id") == run_id]
    assert len(tasks) == 3
    assert all(
        t.kind is SpanKind.CONSUMER and _attr(t, "ductor.handler") == "bridge" for t in tasks
    )
    parents = sorted(_ancestry(t, by_id)[1] for t in tasks)
    assert parents == ["ductor.runs.trigger", "ductor.tick", "ductor.tick"]

    # Each attempt made one bridge call, and the app's span for it is the call's child.
    executes = named["ductor.execute"]
    assert len(executes) == 3
    for execute in executes:
        assert execute.kind is SpanKind.SERVER
        assert _attr(execute, "ductor.run_id") == run_id
        assert _attr(execute, "ductor.workflow_id") == "two-steps"
        chain = _ancestry(execute, by_id)
        assert chain[:4] == [
            "ductor.execute",
            "ductor.bridge.call",
            "ductor.attempt",
            "ductor.task",
        ]
        assert chain[-2:] == ["ductor.runs.trigger", "POST /v1/runs"]
        call = by_id[execute.parent.span_id]  # type: ignore[union-attr]
        assert call.kind is SpanKind.CLIENT
        assert _attr(call, "ductor.bridge.action") == "execute"
        assert _attr(call, "http.response.status_code") == 200
        attempt = by_id[call.parent.span_id]  # type: ignore[union-attr]
        assert _attr(attempt, "ductor.outcome") == "ok"
    # ... and the steps the app ran are spans inside those executes.
    steps = named["ductor.step"]
    assert sorted(_attr(s, "ductor.step") for s in steps) == ["charge", "reserve"]
    assert all(_ancestry(s, by_id)[1] == "ductor.execute" for s in steps)
    # No HTTP client span doubles the bridge call's.
    assert "POST" not in named


def _http_action(slug: str, url: str, *, event: str | None = None) -> dict[str, Any]:
    definition: dict[str, Any] = {
        "family_slug": slug,
        "steps": [
            {
                "ref": "notify",
                "type": "STEP_TYPE_ACTION",
                "args": {
                    "action": "http",
                    "params": {"url": json.dumps(url), "method": '"POST"', "body": "input"},
                },
            },
            {
                "ref": "done",
                "type": "STEP_TYPE_DATAFLOW",
                "args": {"operation": "project", "project": {"ok": "true"}},
            },
        ],
        "edges": [{"source_ref": "notify", "target_ref": "done"}],
    }
    if event is not None:
        definition["triggers"] = [{"event": event}]
    return definition


def test_an_http_action_continues_the_callers_trace_to_the_sink(world: World) -> None:
    with world.http() as http:
        published = http.post("/v1/workflows", json=_http_action("notify", world.sink.url + "/a"))
        assert published.status_code in (200, 201), published.text
        response = http.post(
            "/v1/runs",
            json={"family_slug": "notify", "input": {"n": 1}},
            headers={"traceparent": CALLER_PARENT},
        )
        assert response.status_code == 201, response.text
    run_id = response.json()["id"]
    world.wait_run(run_id)

    # The sink got the trace the caller started.
    [(_, headers)] = [r for r in world.sink.received if r[0] == "/a"]
    assert headers["traceparent"].split("-")[1] == CALLER_TRACE
    spans = _trace_of(int(CALLER_TRACE, 16))
    by_id = {s.context.span_id: s for s in spans}  # type: ignore[union-attr]
    [request] = [s for s in spans if s.name == "POST /v1/runs"]
    assert request.parent is not None
    assert f"{request.parent.span_id:016x}" == CALLER_PARENT.split("-")[2]
    [client] = [s for s in spans if s.name == "POST"]
    assert client.kind is SpanKind.CLIENT
    assert _attr(client, "http.response.status_code") == 200
    assert _attr(client, "server.address") == "127.0.0.1"
    assert headers["traceparent"].split("-")[2] == f"{client.context.span_id:016x}"  # type: ignore[union-attr]
    assert _ancestry(client, by_id) == [
        "POST",
        "ductor.attempt",
        "ductor.task",
        "ductor.runs.trigger",
        "POST /v1/runs",
    ]
    assert any(s.name == "ductor.tick" and _attr(s, "ductor.run_id") == run_id for s in spans)


def test_the_runs_an_event_starts_join_the_events_trace(world: World) -> None:
    with world.http() as http:
        definition = _http_action("on-ping", world.sink.url + "/e", event="otel.ping")
        assert http.post("/v1/workflows", json=definition).status_code in (200, 201)
        response = http.post("/v1/events", json={"name": "otel.ping", "data": {"n": 2}})
        assert response.status_code == 202, response.text
    [run_id] = response.json()["runs_started"]
    world.wait_run(run_id)
    [(_, headers)] = [r for r in world.sink.received if r[0] == "/e"]
    trace_id = int(headers["traceparent"].split("-")[1], 16)
    spans = _trace_of(trace_id)
    by_id = {s.context.span_id: s for s in spans}  # type: ignore[union-attr]
    [client] = [s for s in spans if s.name == "POST"]
    chain = _ancestry(client, by_id)
    assert chain[-2:] == ["ductor.events.send", "POST /v1/events"]
    [send] = [s for s in spans if s.name == "ductor.events.send"]
    assert _attr(send, "ductor.event.name") == "otel.ping"
    assert _attr(send, "ductor.runs_started") == 1


def _points(name: str) -> list[Any]:
    data = METRICS.get_metrics_data()
    assert data is not None
    found: list[Any] = []
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    found.extend(metric.data.data_points)
    return found


def _where(points: list[Any], **attributes: Any) -> list[Any]:
    return [
        p
        for p in points
        if all(p.attributes.get(k.replace("__", ".")) == v for k, v in attributes.items())
    ]


def test_every_metric_reads_back(world: World) -> None:
    # What this test counts it makes itself, whichever worker runs it and alone:
    # one bridge run (three executes) and two HTTP-action runs, then below three
    # slow runs, so six triggers, three bridge attempts and five HTTP attempts.
    with world.http() as http:
        own = [
            http.post(
                "/v1/runs",
                json={"family_slug": f"bridge:{APP_ID}:two-steps", "input": {"id": 1, "total": 2}},
            )
        ]
        action = _http_action("counted", world.sink.url + "/counted")
        assert http.post("/v1/workflows", json=action).status_code in (200, 201)
        own += [
            http.post("/v1/runs", json={"family_slug": "counted", "input": {"n": n}})
            for n in (1, 2)
        ]
        assert [r.status_code for r in own] == [201, 201, 201], [r.text for r in own]
    for response in own:
        world.wait_run(response.json()["id"])
    # Two routing calls: one assigned, one refused before a decision.
    with world.http() as http:
        assert http.post("/v1/workers", json={"id": "ana"}).status_code == 201
        pool = {"id": "desk", "members": [{"worker": "ana"}]}
        assert http.post("/v1/pools", json=pool).status_code == 201
        rules = {"kinds": {"ticket": {}}, "default_pool": "desk"}
        assert http.post("/v1/rules", json=rules).status_code == 201
        routable = {"id": "t-1", "kind": "ticket", "attributes": {"subject": "refund"}}
        routed = http.post("/v1/route", json=routable)
        assert routed.status_code == 201, routed.text
        assert routed.json()["outcome"] == "assigned"
        refused = http.post("/v1/route", json={"id": "x-1", "kind": "lead", "attributes": {}})
        assert refused.status_code == 422, refused.text
    # Three runs of one tenant held to one running task: two wait, ready, in the queue.
    with world.http(SLOW_TENANT) as http:
        slow = _http_action("slow", world.sink.url + "/slow")
        assert http.post("/v1/workflows", json=slow).status_code in (200, 201)
        runs = [
            http.post("/v1/runs", json={"family_slug": "slow", "input": {"n": n}}).json()["id"]
            for n in range(3)
        ]
    deadline = time.monotonic() + TIMEOUT
    while not any(
        p.value >= 1 for p in _where(_points("ductor.queue.depth"), ductor__tenant=SLOW_TENANT)
    ):
        assert time.monotonic() < deadline, _points("ductor.queue.depth")
        time.sleep(0.05)
    for run_id in runs:
        world.wait_run(run_id, SLOW_TENANT)
    # Once the queue drained, the tenant reads 0 (at the next collection, then no more).
    deadline = time.monotonic() + TIMEOUT
    while True:
        drained = _where(_points("ductor.queue.depth"), ductor__tenant=SLOW_TENANT)
        if [p.value for p in drained] == [0]:
            break
        assert time.monotonic() < deadline, drained
        time.sleep(0.05)
    assert drained[0].attributes == {"ductor.tier": 0, "ductor.tenant": SLOW_TENANT}

    api = _points("ductor.api.request.duration")
    [trigger] = _where(
        api, http__route="/v1/runs", http__request__method="POST", http__response__status_code=201
    )
    assert trigger.count >= 5
    assert trigger.sum > 0
    # the route template as the page says it is written, without a converter
    assert _where(api, http__route="/v1/runs/{run_id}", http__response__status_code=200), [
        p.attributes for p in api
    ]
    ticks = _points("ductor.coordinator.tick.duration")
    assert sum(p.count for p in ticks) >= 5
    assert {p.attributes["ductor.tick.mode"] for p in ticks} <= {"inline", "offloaded"}
    attempts = _points("ductor.attempt.duration")
    [bridge] = _where(attempts, ductor__handler="bridge", ductor__outcome="ok")
    assert bridge.count >= 3
    [action] = _where(attempts, ductor__handler="action:http", ductor__outcome="ok")
    assert action.count >= 5
    [slow_action] = [p for p in _where(attempts, ductor__handler="action:http") if p.max >= 0.9]
    assert slow_action.sum >= 3 * world.sink.slow * 0.9
    waits = _where(_points("ductor.task.wait.duration"), ductor__handler="action:http")
    assert waits
    assert max(p.max for p in waits) >= world.sink.slow * 0.9  # a slow tenant's task waited
    route = _where(_points("ductor.route.decision.duration"), ductor__route__origin="api")
    assert sorted((p.attributes["ductor.route.outcome"], p.count) for p in route) == [
        ("assigned", 1),
        ("invalid", 1),  # the 422 routing.routable_invalid: refused, as the page says
    ]


def test_connect_and_mcp_calls_are_named_by_their_route_not_by_the_callers_path(
    world: World,
) -> None:
    # A Connect call's span and metric name its procedure; a path under a mounted
    # endpoint that names no procedure is counted under the mount, so a caller
    # (even one without a key) cannot mint a series or a span name per path.
    junk = [f"/ductor.v1.RunService/Probe{n}" for n in range(3)] + ["/mcp/secret-token"]
    with world.http() as http, httpx.Client(base_url=world.server, timeout=30) as anyone:
        listed = http.post("/ductor.v1.RunService/ListRuns", json={})
        assert listed.status_code == 200, listed.text
        for path in junk:
            assert anyone.post(path, json={}).status_code == 404, path
    paths = ["/ductor.v1.RunService/ListRuns", *junk]
    deadline = time.monotonic() + 10
    while True:  # a span ends just after its answer is sent
        server_spans = [s for s in _spans() if s.kind == SpanKind.SERVER]
        if {_attr(s, "url.path") for s in server_spans} >= set(paths):
            break
        assert time.monotonic() < deadline, [_attr(s, "url.path") for s in server_spans]
        time.sleep(0.05)
    [call] = [s for s in server_spans if _attr(s, "url.path") == "/ductor.v1.RunService/ListRuns"]
    assert call.name == "POST /ductor.v1.RunService/ListRuns"
    assert _attr(call, "http.route") == "/ductor.v1.RunService/ListRuns"
    assert _attr(call, "http.response.status_code") == 200
    for path in junk:
        [span] = [s for s in server_spans if _attr(s, "url.path") == path]
        mount = path.rsplit("/", 1)[0]
        assert (span.name, _attr(span, "http.route")) == (f"POST {mount}", mount)
    routes = {p.attributes["http.route"] for p in _points("ductor.api.request.duration")}
    assert "/ductor.v1.RunService/ListRuns" in routes
    assert not [r for r in routes if "Probe" in r or "secret" in r or not r.startswith("/")]
    assert {"/ductor.v1.RunService", "/mcp"} <= routes


def test_a_method_outside_the_standard_set_is_counted_as_other(world: World) -> None:
    # A mount (MCP, a Connect procedure) answers any method: a caller without a key
    # could otherwise add a metric series, and a span name, per made-up method.
    made_up = [f"PROBE{n}" for n in range(3)]
    with httpx.Client(base_url=world.server, timeout=30) as anyone:
        for method in made_up:
            for path in ("/mcp", "/ductor.v1.RunService/GetRun"):
                assert anyone.request(method, path).status_code < 500, (method, path)
    deadline = time.monotonic() + 10
    while True:  # a span ends just after its answer is sent
        other = [
            s
            for s in _spans()
            if s.kind == SpanKind.SERVER and _attr(s, "http.request.method") == "_OTHER"
        ]
        if len(other) >= 2 * len(made_up):
            break
        assert time.monotonic() < deadline, [s.name for s in _spans()]
        time.sleep(0.05)
    assert {s.name for s in other} == {"HTTP /mcp", "HTTP /ductor.v1.RunService/GetRun"}
    assert not [s for s in _spans() if s.name.startswith("PROBE")]
    methods = {p.attributes["http.request.method"] for p in _points("ductor.api.request.duration")}
    assert "_OTHER" in methods
    assert methods <= {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "_OTHER"}


def test_a_client_that_hangs_up_mid_long_poll_is_counted_as_499_not_as_a_server_error(
    world: World,
) -> None:
    # A real client asks for a run that will not end within its wait, and closes
    # its socket while the server waits: nothing failed on the server's side, so
    # neither the metric nor the span may count a 5xx.
    nap = {
        "family_slug": "hang-up",
        "steps": [{"ref": "nap", "type": "STEP_TYPE_WAIT", "args": {"duration": "1h"}}],
    }
    with world.http() as http:
        assert http.post("/v1/workflows", json=nap).status_code in (200, 201)
        started = http.post("/v1/runs", json={"family_slug": "hang-up", "input": {}})
        assert started.status_code == 201, started.text
    run_id = started.json()["id"]
    route = "/v1/runs/{run_id}"
    path = f"/v1/runs/{run_id}"
    host, port = world.server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            f"GET {path}?wait=30 HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {world.keys[TENANT]}\r\n\r\n".encode()
        )
        time.sleep(0.5)  # the server is waiting for the run to end
        hung_up = time.monotonic()
    deadline = time.monotonic() + 20
    while True:  # the span ends once the server has noticed
        [*spans] = [
            s for s in _spans() if s.kind == SpanKind.SERVER and _attr(s, "url.path") == path
        ]
        if spans:
            break
        assert time.monotonic() < deadline, "the long poll went on after its client left"
        time.sleep(0.05)
    assert time.monotonic() - hung_up < 10, "the server waited out the poll"
    [span] = spans
    assert _attr(span, "http.response.status_code") == 499
    assert span.status.status_code != StatusCode.ERROR
    assert _attr(span, "error.type") is None
    polls = _where(_points("ductor.api.request.duration"), http__route=route)
    assert [p.count for p in _where(polls, http__response__status_code=499)] == [1], [
        (p.attributes, p.count) for p in polls
    ]
    assert not _where(polls, http__response__status_code=500)
    assert world.composition.runtime.endings.waiting == 0, "its waiter was let go"
    # A client that hangs up halfway through its body: the server cannot answer, and
    # the request is the client's doing, not a 500.
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            f"POST /v1/runs HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {world.keys[TENANT]}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            '{"family_slug": "hang-up", '.encode()
        )
        time.sleep(0.5)
    deadline = time.monotonic() + 20
    while True:
        triggers = _where(
            _points("ductor.api.request.duration"),
            http__route="/v1/runs",
            http__request__method="POST",
        )
        if _where(triggers, http__response__status_code=499):
            break
        assert time.monotonic() < deadline, [(p.attributes, p.count) for p in triggers]
        time.sleep(0.05)
    assert not _where(triggers, http__response__status_code=500)


def test_setup_keeps_providers_already_set_and_refuses_what_it_cannot_honour() -> None:
    _install_providers()
    assert not wanted({})
    assert wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert wanted({"DUCTOR_OTEL": "on"})
    assert not wanted({"DUCTOR_OTEL": "off", "OTEL_TRACES_EXPORTER": "otlp"})
    assert not wanted({"OTEL_SDK_DISABLED": "true", "DUCTOR_OTEL": "on"})
    assert setup_from_env({}) is None
    kept = setup_from_env({"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "shop"})
    assert kept is not None
    assert (kept.traces, kept.metrics, kept.service_name) == ("kept", "kept", "shop")
    for bad, message in [
        ({"DUCTOR_OTEL": "maybe"}, "DUCTOR_OTEL must be on or off"),
        # A bad switch is refused even when the SDK is disabled anyway.
        ({"DUCTOR_OTEL": "maybe", "OTEL_SDK_DISABLED": "true"}, "DUCTOR_OTEL must be on or off"),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER='zipkin'"),
        ({"OTEL_METRICS_EXPORTER": "otlp,console"}, "name one exporter"),
        ({"DUCTOR_OTEL": "1", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "http/json"),
    ]:
        with pytest.raises(ValueError, match=message):
            setup_from_env(bad)


def test_ductor_serve_exports_over_otlp_when_the_environment_asks(tmp_path: Path) -> None:
    """The `otel` extra for real: `ductor serve` with OTEL_EXPORTER_OTLP_ENDPOINT
    sends its spans and metrics to an OTLP/HTTP collector (a recording sink)."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    collector = Sink()
    stop = collector.start()
    try:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
            "OTEL_SERVICE_NAME": "ductor-otlp-test",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        with serve_process(tmp_path, tenants=[TENANT], env=env) as served:
            with httpx.Client(base_url=served.url, timeout=30) as http:
                assert http.get("/healthz").status_code == 200
                key = {"Authorization": f"Bearer {served.keys[TENANT]}"}
                assert http.get("/v1/runs", headers=key).status_code == 200
            deadline = time.monotonic() + TIMEOUT
            while not any(path == "/v1/traces" for path, _ in collector.bodies):
                assert time.monotonic() < deadline, collector.received
                time.sleep(0.1)
        log = (tmp_path / "server.log").read_text()
        assert "OpenTelemetry: service ductor-otlp-test, traces otlp, metrics otlp" in log, log
        # Stopping flushes the metrics.
        deadline = time.monotonic() + TIMEOUT
        while not any(path == "/v1/metrics" for path, _ in collector.bodies):
            assert time.monotonic() < deadline, collector.received
            time.sleep(0.1)
    finally:
        stop()
    spans, services, instruments = set(), set(), set()
    for path, body in collector.bodies:
        if path == "/v1/traces":
            request = ExportTraceServiceRequest.FromString(body)
            for resource in request.resource_spans:
                services.update(
                    a.value.string_value
                    for a in resource.resource.attributes
                    if a.key == "service.name"
                )
                spans.update(s.name for scope in resource.scope_spans for s in scope.spans)
        elif path == "/v1/metrics":
            metric_request = ExportMetricsServiceRequest.FromString(body)
            for resource_metrics in metric_request.resource_metrics:
                instruments.update(
                    m.name for scope in resource_metrics.scope_metrics for m in scope.metrics
                )
    assert {"GET /healthz", "GET /v1/runs"} <= spans
    assert services == {"ductor-otlp-test"}
    assert "ductor.api.request.duration" in instruments
    assert all(
        headers.get("content-type") == "application/x-protobuf"
        for path, headers in collector.received
    )


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "run under opentelemetry-instrument"),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            },
            "opentelemetry-exporter-otlp-proto-grpc",
        ),
    ],
)
def test_ductor_dev_refuses_to_start_with_telemetry_it_cannot_set_up(
    tmp_path: Path, env: dict[str, str], says: str
) -> None:
    # The workspace does not install the grpc exporter (uv.lock has none).
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DUCTOR_", "OTEL_"))}
    command = [sys.executable, "-m", "ductor_server.cli", "dev", "--data-dir", str(tmp_path)]
    done = subprocess.run(
        [*command, "--port", str(free_port())],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert says in done.stderr
    assert "on http://" not in done.stdout  # it never claimed to serve


def test_malformed_or_huge_trace_headers_start_a_new_trace(world: World) -> None:
    """A caller's trace headers group spans, nothing more: garbage or oversized
    ones are ignored (a new trace starts), and what a run stores stays small."""
    valid = f"00-{'1' * 32}-{'2' * 16}-01"
    cases = [
        {"traceparent": "00-" + "f" * 2000},
        {"traceparent": "not a traceparent", "tracestate": "a=b"},
        {"traceparent": f"00-{'0' * 32}-{'2' * 16}-01"},  # all-zero trace id: invalid
        {"traceparent": valid, "tracestate": "k=" + "v" * 5000},
        {"traceparent": valid, "tracestate": ",".join(f"k{i}=v" for i in range(40))},
    ]
    run_ids = []
    with world.http() as http:
        for headers in cases:
            response = http.post(
                "/v1/runs",
                json={"family_slug": f"bridge:{APP_ID}:two-steps", "input": {"id": 1, "total": 2}},
                headers=headers,
            )
            assert response.status_code == 201, response.text
            run_ids.append(response.json()["id"])
    for run_id in run_ids:
        world.wait_run(run_id)

    async def stored() -> dict[str, str | None]:
        store = open_store(world.composition.settings.store_target)
        await store.open()
        try:
            async with store.transaction() as tx:
                runs = [await tx.get_run(TENANT, run_id) for run_id in run_ids]
        finally:
            await store.close()
        return {r.id: r.trace_context for r in runs if r is not None}

    contexts = asyncio.run(stored())
    triggers = {_attr(s, "ductor.run_id"): s for s in _spans() if s.name == "ductor.runs.trigger"}
    for run_id, headers in zip(run_ids, cases, strict=True):
        context = contexts[run_id]
        assert context is not None
        assert " " not in context  # no caller's tracestate was kept
        trace_id = context.split("-")[1]
        assert trace_id == f"{triggers[run_id].context.trace_id:032x}"  # type: ignore[union-attr]
        if headers["traceparent"] == valid:
            assert trace_id == "1" * 32  # continued, without the bad tracestate
        else:
            assert trace_id != "0" * 32


def test_a_quarantined_attempt_is_counted_and_timed(tmp_path: Path) -> None:
    """A task leased once more after its worker died with it (`poison_after=1`)
    is quarantined: `ductor.attempts.poisoned` counts it, under the same
    attribute names as the other instruments, and its attempt is timed with
    outcome `poisoned`."""
    _install_providers()
    tenant = "t_poison"
    config = RuntimeConfig(poll_interval=0.05, lease_seconds=30.0, stop_grace=2.0, poison_after=1)
    ran: list[str] = []

    async def doomed(call: ActionCall) -> Any:
        ran.append(call.run_id)
        return {"ran": True}

    async def quarantine() -> str:
        clock = ManualClock()
        actions = default_registry()
        actions.register_action("doomed", doomed)
        store = open_store(tmp_path / "poison.db")
        await store.open()
        try:
            await store.migrate()
            async with store.transaction() as tx:
                await tx.ensure_tenant(tenant, name="Poison", now=clock.now())
            async with Runtime.start(
                store, roles=["coordinator", "timer"], config=config, clock=clock, actions=actions
            ) as runtime:
                services = build_services(runtime)
                definition = {
                    "family_slug": "doomed",
                    "steps": [
                        {"ref": "work", "type": "STEP_TYPE_ACTION", "args": {"action": "doomed"}}
                    ],
                    "edges": [],
                }
                await services.workflows.publish(tenant, definition)
                run = (await services.runs.trigger(tenant, "doomed", None, {}, None)).value
                # A worker that dies holding the task: its lease is taken, then lapses.
                deadline = time.monotonic() + TIMEOUT
                while True:
                    async with store.transaction() as tx:
                        leased = await tx.lease_tasks(
                            owner="dead-0",
                            limit=1,
                            lease_for=timedelta(seconds=30),
                            now=clock.now(),
                        )
                    if leased:
                        break
                    assert time.monotonic() < deadline, "the task was never queued"
                    await asyncio.sleep(0.01)
                clock.advance(timedelta(seconds=config.lease_seconds + 1))
                async with Runtime.start(
                    store, roles=["worker"], config=config, clock=clock, actions=actions
                ) as workers:
                    while not (view := await services.runs.get(tenant, run.id)).status.terminal:
                        assert time.monotonic() < deadline, view
                        await asyncio.sleep(0.01)
                    assert workers.workers.poisoned == 1
                [step] = view.steps
                assert step.error is not None
                return step.error.code
        finally:
            await store.close()

    assert asyncio.run(quarantine()) == "attempt.poisoned"
    assert ran == []  # quarantined, never run
    [poisoned] = _where(_points("ductor.attempts.poisoned"), ductor__tenant=tenant)
    assert poisoned.attributes == {"ductor.tenant": tenant, "ductor.handler": "action:doomed"}
    assert poisoned.value == 1
    [timed] = _where(_points("ductor.attempt.duration"), ductor__handler="action:doomed")
    assert timed.attributes["ductor.outcome"] == "poisoned"
    assert timed.count == 1


def test_a_route_step_and_a_failed_call_are_spans_of_the_runs_trace(world: World) -> None:
    """A ROUTE step's decision is a `ductor.route` span under its attempt; a call
    answered 404 is a CLIENT span marked as an error, with neither its path nor
    its query; the task, attempt and batch spans carry what the page lists."""
    with world.http() as http:
        assert http.post("/v1/workers", json={"id": "otel-w"}).status_code in (200, 201)
        pool = {"id": "otel-pool", "members": [{"worker": "otel-w"}]}
        assert http.post("/v1/pools", json=pool).status_code in (200, 201)
        rules = {"kinds": {"otel-job": {}, "ticket": {}}, "default_pool": "otel-pool"}
        assert http.post("/v1/rules", json=rules).status_code == 201
        definition = {
            "family_slug": "otel-route",
            "steps": [
                {
                    "ref": "assign",
                    "type": "STEP_TYPE_ROUTE",
                    "args": {"kind": "otel-job", "pool": "otel-pool", "attributes": {}},
                },
                {
                    "ref": "report",
                    "type": "STEP_TYPE_ACTION",
                    "args": {
                        "action": "http",
                        "params": {
                            "url": json.dumps(world.sink.url + "/gone?token=s3cret"),
                            "method": '"POST"',
                            "body": "input",
                        },
                    },
                },
            ],
            "edges": [{"source_ref": "assign", "target_ref": "report"}],
        }
        published = http.post("/v1/workflows", json=definition)
        assert published.status_code in (200, 201), published.text
        started = http.post(
            "/v1/runs",
            json={"family_slug": "otel-route", "input": {}},
            headers={"traceparent": f"00-{'3' * 32}-{'4' * 16}-01"},
        )
        assert started.status_code == 201, started.text
        run_id = started.json()["id"]
        deadline = time.monotonic() + TIMEOUT
        while (run := http.get(f"/v1/runs/{run_id}").json())["status"] != "RUN_STATUS_FAILED":
            assert run["status"] != "RUN_STATUS_SUCCEEDED", run
            assert time.monotonic() < deadline, run
            time.sleep(0.05)
    spans = _trace_of(int("3" * 32, 16))
    by_id = {s.context.span_id: s for s in spans}  # type: ignore[union-attr]

    [route] = [s for s in spans if s.name == "ductor.route"]
    assert _ancestry(route, by_id)[1:3] == ["ductor.attempt", "ductor.task"]
    assert _attr(by_id[route.parent.span_id], "ductor.handler") == "route"  # type: ignore[union-attr]
    assert _attr(route, "ductor.tenant") == TENANT
    assert _attr(route, "ductor.routable.kind") == "otel-job"
    assert _attr(route, "ductor.route.outcome") == "assigned"
    assert str(_attr(route, "ductor.decision_id")).startswith("dec_")

    [call] = [s for s in spans if s.name == "POST"]
    assert call.kind is SpanKind.CLIENT
    assert _attr(call, "http.response.status_code") == 404
    assert _attr(call, "error.type") == "404"
    assert call.status.status_code is StatusCode.ERROR
    assert (_attr(call, "server.address"), _attr(call, "url.scheme")) == ("127.0.0.1", "http")
    assert _attr(call, "server.port") == int(world.sink.url.rsplit(":", 1)[1])
    recorded = json.dumps({k: str(v) for s in spans for k, v in (s.attributes or {}).items()})
    assert "s3cret" not in recorded
    assert "/gone" not in recorded

    attempt = by_id[call.parent.span_id]  # type: ignore[union-attr]
    assert attempt.name == "ductor.attempt"
    assert {k: _attr(attempt, k) for k in ("ductor.run_id", "ductor.step_ref", "ductor.ok")} == {
        "ductor.run_id": run_id,
        "ductor.step_ref": "report",
        "ductor.ok": False,
    }
    assert (_attr(attempt, "ductor.attempt"), _attr(attempt, "ductor.outcome")) == (1, "error")
    assert _attr(attempt, "ductor.error_code")
    task = by_id[attempt.parent.span_id]  # type: ignore[union-attr]
    assert task.kind is SpanKind.CONSUMER
    assert {k: _attr(task, k) for k in ("ductor.tenant", "ductor.run_id", "ductor.step_ref")} == {
        "ductor.tenant": TENANT,
        "ductor.run_id": run_id,
        "ductor.step_ref": "report",
    }
    assert str(_attr(task, "ductor.task_id"))
    assert (_attr(task, "ductor.handler"), _attr(task, "ductor.item_index")) == ("action:http", -1)
    assert (_attr(task, "ductor.deliveries"), _attr(task, "ductor.deaths")) == (1, 0)
    assert isinstance(_attr(task, "ductor.tier"), int)

    # The coordinator's batches are roots of their own that link the ticks they ran.
    ticks = {
        s.context.span_id  # type: ignore[union-attr]
        for s in spans
        if s.name == "ductor.tick" and _attr(s, "ductor.run_id") == run_id
    }
    assert ticks
    batches = [s for s in _spans() if s.name == "ductor.coordinator.batch"]
    linked = {link.context.span_id for b in batches for link in b.links}
    assert ticks & linked
    for batch in batches:
        assert batch.parent is None
        assert _attr(batch, "ductor.tick.mode") in ("inline", "offloaded")
        assert _attr(batch, "ductor.runs") >= 1


def test_a_step_that_fails_in_the_app_is_an_error_span_with_its_code(world: World) -> None:
    with world.http() as http:
        response = http.post(
            "/v1/runs",
            json={"family_slug": f"bridge:{APP_ID}:out-of-stock", "input": {"sku": "A-1"}},
        )
        assert response.status_code == 201, response.text
        run_id = response.json()["id"]
        deadline = time.monotonic() + TIMEOUT
        while (run := http.get(f"/v1/runs/{run_id}").json())["status"] != "RUN_STATUS_FAILED":
            assert run["status"] != "RUN_STATUS_SUCCEEDED", run
            assert time.monotonic() < deadline, run
            time.sleep(0.05)
    executes = [
        s for s in _spans() if s.name == "ductor.execute" and _attr(s, "ductor.run_id") == run_id
    ]
    # The step failed in the first execute; the next one replayed it (no span: it did
    # not run) and ended the run.
    assert len(executes) == 2
    for execute in executes:
        assert {k: _attr(execute, k) for k in ("ductor.app_id", "ductor.workflow_id")} == {
            "ductor.app_id": APP_ID,
            "ductor.workflow_id": "out-of-stock",
        }
        assert _attr(execute, "ductor.attempt") == 1
    spans = _trace_of(executes[0].context.trace_id)  # type: ignore[union-attr]
    [step] = [s for s in spans if s.name == "ductor.step"]
    assert step.parent is not None
    assert step.parent.span_id in {e.context.span_id for e in executes}  # type: ignore[union-attr]
    assert (_attr(step, "ductor.step"), _attr(step, "ductor.attempt")) == ("reserve", 1)
    assert _attr(step, "ductor.error_code") == "stock.none"
    assert step.status.status_code is StatusCode.ERROR


def test_a_sub_workflow_and_a_bridge_steps_child_runs_continue_the_parents_trace(
    world: World,
) -> None:
    # The child calls the sink, so it has a task and a tick of its own (a child that
    # only computes ends inside its parent's tick).
    child = _http_action("otel-child", world.sink.url + "/child")
    parent = {
        "family_slug": "otel-parent",
        "steps": [
            {
                "ref": "sub",
                "type": "STEP_TYPE_SUBWORKFLOW",
                "args": {"family_slug": "otel-child", "input": "{'n': 21}"},
            },
            {
                "ref": "app",
                "type": "STEP_TYPE_BRIDGE",
                "args": {
                    "app_id": APP_ID,
                    "workflow": "two-steps",
                    "input": "{'id': 3, 'total': 4}",
                },
            },
        ],
        "edges": [{"source_ref": "sub", "target_ref": "app"}],
    }
    caller = "5" * 32
    with world.http() as http:
        for definition in (child, parent):
            published = http.post("/v1/workflows", json=definition)
            assert published.status_code in (200, 201), published.text
        started = http.post(
            "/v1/runs",
            json={"family_slug": "otel-parent", "input": {}},
            headers={"traceparent": f"00-{caller}-{'6' * 16}-01"},
        )
        assert started.status_code == 201, started.text
    run = world.wait_run(started.json()["id"])
    [sub] = [s["child_run_id"] for s in run["steps"] if s["ref"] == "sub"]
    spans = _trace_of(int(caller, 16))
    ticked = {_attr(s, "ductor.run_id") for s in spans if s.name == "ductor.tick"}
    # The parent, its sub-workflow's run and the bridge step's run of the app's workflow.
    assert {run["id"], sub} < ticked
    assert len(ticked) == 3
    [(_, headers)] = [r for r in world.sink.received if r[0] == "/child"]
    assert headers["traceparent"].split("-")[1] == caller
    # The app's steps ran in the same trace, under its bridge calls.
    steps = [s for s in spans if s.name == "ductor.step"]
    assert sorted(_attr(s, "ductor.step") for s in steps) == ["charge", "reserve"]
