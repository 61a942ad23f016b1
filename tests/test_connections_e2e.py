"""Connections against real server processes on both backends: a secret given once
never comes back (no API answer, run history, step output or log line holds it)
while a workflow uses it against a real HTTP sink; and key rotation (k1, then
k2 with k1 kept, `ductor connections rotate`, then k2 alone) loses no connection.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from ductor_server.connections import new_secret_key
from ductor_server.storage import open_store

from .conftest import ServerProcess

SECRET = "sk-live-7Qx93hZp2LmV8rT4wN6yB1cD5fG0jK"


class EchoSink:
    """A real HTTP server on 127.0.0.1 that records each request's Authorization
    header and answers with it in the body (as a careless API would)."""

    def __init__(self) -> None:
        self.auth: list[str] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                auth = self.headers.get("authorization", "")
                sink.auth.append(auth)
                status = 500 if self.path.startswith("/fail") else 200
                payload = json.dumps(
                    {"seen_auth": auth, "path": self.path, "body": body.decode()}
                ).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            do_GET = do_POST = do_HEAD = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> EchoSink:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def echo_sink() -> Iterator[EchoSink]:
    with EchoSink() as sink:
        yield sink


def _definition(slug: str, connection: str, path: str) -> dict[str, Any]:
    return {
        "family_slug": slug,
        "title": slug,
        "steps": [
            {
                "ref": "call",
                "type": "STEP_TYPE_ACTION",
                "args": {
                    "connection": connection,
                    "operation": "request",
                    "input": {"method": "'POST'", "path": f"'{path}'", "body": "input"},
                },
                "retry": {"max_attempts": 1},
            }
        ],
        "edges": [],
    }


class Recorder:
    """An API client that keeps the text of every answer."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.http = server.client()
        self.answers: list[str] = []

    def __call__(self, method: str, path: str, status: int = 200, **kwargs: Any) -> Any:
        response = self.http.request(method, path, **kwargs)
        self.answers.append(response.text)
        assert response.status_code == status, response.text
        return response.json() if response.content else None

    def run(self, slug: str, input: Any) -> dict[str, Any]:
        run = self("POST", "/v1/runs", 201, json={"family_slug": slug, "input": input})
        ended = self.server.wait_for_run(run["id"])
        self("GET", f"/v1/runs/{run['id']}")
        self("GET", f"/v1/runs/{run['id']}/history")
        return ended


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_secret_never_comes_back(
    backend: str, request: pytest.FixtureRequest, echo_sink: EchoSink
) -> None:
    server: ServerProcess = request.getfixturevalue(f"{backend}_server")
    server.extra_env["DUCTOR_LOG_LEVEL"] = "debug"
    if backend == "postgres":  # `ductor dev` (SQLite) makes its own key file instead
        server.extra_env["DUCTOR_SECRET_KEYS"] = new_secret_key("k1")
    server.start()
    api = Recorder(server)
    created = api(
        "POST",
        "/v1/connections",
        201,
        json={
            "name": "crm",
            "provider": "http",
            "description": "the CRM",
            "config": {"base_url": echo_sink.url},
            "secrets": {"bearer_token": SECRET},
        },
        headers={"Idempotency-Key": "crm-1"},
    )
    assert created["secrets"] == {"bearer_token": "••••" + SECRET[-4:]}
    api("GET", "/v1/connections")
    api("GET", "/v1/connections/crm")
    api("POST", "/v1/connections/crm/test")
    api("PATCH", "/v1/connections/crm", json={"description": "still the CRM"})
    api("GET", "/v1/providers")
    api("POST", "/v1/workflows", 201, json=_definition("push", "crm", "/leads"))
    api("POST", "/v1/workflows", 201, json=_definition("fails", "crm", "/fail"))
    api("POST", "/v1/workflows/validate", json=_definition("push", "crm", "/leads"))
    ok = api.run("push", {"lead": 1})
    assert ok["status"] == "RUN_STATUS_SUCCEEDED", ok
    seen_auth = ok["output"]["call"]["body"]["seen_auth"]  # the sink echoed the header
    assert seen_auth
    assert SECRET not in seen_auth
    failed = api.run("fails", {"lead": 2})
    assert failed["status"] == "RUN_STATUS_FAILED"
    api("GET", "/v1/runs")
    listed = server.cli("connections", "list")
    assert "crm" in listed.stdout
    assert "bearer_token" in listed.stdout
    api.answers.append(server.cli("connections", "list", "--json").stdout)
    if backend == "sqlite":
        assert (server.data_dir / "secret_keys").exists()  # made by `ductor dev`
    # The secret did go out, on every request...
    assert echo_sink.auth
    assert all(a == f"Bearer {SECRET}" for a in echo_sink.auth)
    # ...and came back nowhere.
    for text in api.answers:
        assert SECRET not in text
    server.stop()
    log = server.log()
    assert "ductor" in log  # the server's output was captured
    assert SECRET not in log
    assert SECRET[4:-4] not in log


def _rows(target: str, tenant: str) -> list[tuple[str, str, str | None]]:
    async def read() -> list[tuple[str, str, str | None]]:
        store = open_store(target)
        await store.open()
        try:
            async with store.transaction() as tx:
                rows = await tx.session.fetch_all(
                    "SELECT tenant_id, name, secrets_key_id FROM connections"
                    " WHERE tenant_id = %s ORDER BY name",
                    (tenant,),
                )
        finally:
            await store.close()
        return [(str(r[0]), str(r[1]), r[2]) for r in rows]

    return asyncio.run(read())


def _copy_secrets(target: str, tenant: str, source: str, into: str) -> None:
    async def copy() -> None:
        store = open_store(target)
        await store.open()
        try:
            async with store.transaction() as tx:
                row = await tx.session.fetch_one(
                    "SELECT secrets_ciphertext, secrets_key_id FROM connections"
                    " WHERE tenant_id = %s AND name = %s",
                    (tenant, source),
                )
                assert row is not None
                await tx.session.execute(
                    "UPDATE connections SET secrets_ciphertext = %s, secrets_key_id = %s"
                    " WHERE tenant_id = %s AND name = %s",
                    (row[0], row[1], tenant, into),
                )
        finally:
            await store.close()

    asyncio.run(copy())


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_rotation_loses_no_connection(
    backend: str, request: pytest.FixtureRequest, echo_sink: EchoSink
) -> None:
    server: ServerProcess = request.getfixturevalue(f"{backend}_server")
    k1, k2 = new_secret_key("k1"), new_secret_key("k2")
    target = server.database_url or str(server.data_dir / "ductor.db")
    data_dir = ["--data-dir", str(server.data_dir)]
    tenant = "dev" if backend == "sqlite" else "acme"  # whose key the harness mints

    def restart(keys: str) -> Recorder:
        server.stop()
        server.extra_env["DUCTOR_SECRET_KEYS"] = keys
        server.start()
        return Recorder(server)

    def works(api: Recorder) -> None:
        for name in ("one", "two"):
            run = api.run(f"call-{name}", {"n": name})
            assert run["status"] == "RUN_STATUS_SUCCEEDED", run
        assert echo_sink.auth[-2:] == ["Bearer token-one-xxxxxxxx", "Bearer token-two-xxxxxxxx"]

    api = restart(k1)
    for name in ("one", "two"):
        api(
            "POST",
            "/v1/connections",
            201,
            json={
                "name": name,
                "provider": "http",
                "config": {"base_url": echo_sink.url},
                "secrets": {"bearer_token": f"token-{name}-xxxxxxxx"},
            },
        )
        api("POST", "/v1/workflows", 201, json=_definition(f"call-{name}", name, "/x"))
    works(api)
    assert [r[2] for r in _rows(target, tenant)] == ["k1", "k1"]

    api = restart(f"{k2},{k1}")
    works(api)  # k1's rows still open
    rotated = server.cli("connections", "rotate", *data_dir)
    assert "rotated 2 connection(s) to key k2 (0 already on it, 0 failed)" in rotated.stdout
    again = server.cli("connections", "rotate", *data_dir)
    assert "rotated 0 connection(s) to key k2 (2 already on it, 0 failed)" in again.stdout
    assert [r[2] for r in _rows(target, tenant)] == ["k2", "k2"]
    works(api)

    api = restart(k2)
    works(api)
    api("PATCH", "/v1/connections/one", json={"secrets": {"bearer_token": "token-one-xxxxxxxx"}})
    works(api)

    # A server that lost k2 says so; a ciphertext copied onto another row does not open.
    api = restart(k1)
    answer = api("POST", "/v1/connections/one/test", 503)
    assert answer["code"] == "secrets.undecryptable"
    stuck = server.cli("connections", "rotate", *data_dir, check=False)
    assert stuck.returncode == 1
    assert "0 connection(s) to key k1" in stuck.stdout
    assert "2 failed" in stuck.stdout
    api = restart(k2)
    _copy_secrets(target, tenant, "one", "two")
    answer = api("POST", "/v1/connections/two/test", 503)
    assert answer["code"] == "secrets.undecryptable"
    assert httpx.get(f"{server.url}/readyz").status_code == 200
