"""API keys, scopes and tenants against real server processes on 127.0.0.1: one
`ductor dev` (SQLite) and one `ductor serve` (Postgres) for the whole module, each
with an operator key.

Every route refuses a key without its scope (before it reads or writes anything),
an `events:send` key can only send events and signals, revoked and expired keys
fail on their very next request, tenants cannot reach each other's keys, twenty
concurrent creates with one Idempotency-Key make one key, malformed requests are
refused whole with pointers, MCP tools follow the same scopes, the CLI drives it
all, `ductor dev` prints its key on first start only, and docs/security.md runs
as written.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from ductor_server.pytest_plugin import create_database, drop_database
from ductor_server.transports.rest.scopes import ROUTE_SCOPES

from .conftest import ServerProcess

pytestmark = pytest.mark.timeout(600)

OPERATOR_KEY = "op-e2e-" + "k" * 40
DOC = Path(__file__).resolve().parents[1] / "docs" / "security.md"
SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.DOTALL | re.MULTILINE)
TEXT_BLOCK = re.compile(r"^```text\n(.*?)^```", re.DOTALL | re.MULTILINE)
HOLDS = {
    "admin": {"admin", "write", "read", "events:send"},
    "write": {"write", "read", "events:send"},
    "read": {"read"},
    "events:send": {"events:send"},
}


def _start(base: Path, database_url: str | None) -> ServerProcess:
    server = ServerProcess(
        data_dir=base / "data",
        database_url=database_url,
        env={"DUCTOR_OPERATOR_KEY": OPERATOR_KEY},
    )
    return server.start()


@pytest.fixture(scope="module")
def sqlite_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`ductor dev` for the module, with `DUCTOR_OPERATOR_KEY` set."""
    server = _start(tmp_path_factory.mktemp("keys-sqlite"), None)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def postgres_served(
    tmp_path_factory: pytest.TempPathFactory, _postgres_admin: str
) -> Iterator[ServerProcess]:
    """`ductor serve` on a database of the module's own, with `DUCTOR_OPERATOR_KEY` set."""
    database_url = create_database(_postgres_admin)
    server: ServerProcess | None = None
    try:
        server = _start(tmp_path_factory.mktemp("keys-postgres"), database_url)
        yield server
    finally:
        if server is not None:
            server.stop()
        drop_database(database_url, _postgres_admin)


@pytest.fixture(params=["sqlite", "postgres"])
def served(request: pytest.FixtureRequest) -> ServerProcess:
    """The module's server on each backend in turn."""
    server: ServerProcess = request.getfixturevalue(f"{request.param}_served")
    return server


def _http(server: ServerProcess, key: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=30)


def _tenant(server: ServerProcess, prefix: str) -> tuple[str, str]:
    """A new tenant made by the operator: its id and its admin key."""
    tenant = f"{prefix}-{uuid.uuid4().hex[:8]}"
    with _http(server, OPERATOR_KEY) as http:
        created = http.post("/v1/tenants", json={"id": tenant})
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["tenant"]["id"] == tenant
    assert body["key"]["scopes"] == ["admin"]
    return tenant, body["key"]["key"]


def _key(server: ServerProcess, admin: str, *scopes: str, **extra: Any) -> dict[str, Any]:
    with _http(server, admin) as http:
        created = http.post("/v1/keys", json={"name": "k", "scopes": list(scopes), **extra})
    assert created.status_code == 201, created.text
    body: dict[str, Any] = created.json()
    return body


def _error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, (response.request.url, response.text)
    body: dict[str, Any] = response.json()
    assert body["code"] == code, body
    return body


def _concrete(route: str) -> tuple[str, str]:
    """A method and a path for a route of the table (`1` for a version, `x` else)."""
    method, _, template = route.partition(" ")
    path = re.sub(r"\{version\}", "1", template)
    return method, re.sub(r"\{[^}]+\}", "x", path)


def test_the_operator_creates_tenants_that_cannot_reach_each_other(
    served: ServerProcess,
) -> None:
    a, a_admin = _tenant(served, "ta")
    b, b_admin = _tenant(served, "tb")
    b_reader = _key(served, b_admin, "read")
    with _http(served, None) as anonymous:
        _error(anonymous.get("/v1/tenants"), 401, "auth.unauthenticated")
    with _http(served, a_admin) as http:
        # A tenant's key is not the operator key, and the operator key is no tenant's.
        _error(http.post("/v1/tenants", json={"id": "sneaky"}), 401, "auth.unauthenticated")
        _error(http.get(f"/v1/keys/{b_reader['id']}"), 404, "key.not_found")
        _error(http.delete(f"/v1/keys/{b_reader['id']}"), 404, "key.not_found")
        listed = http.get("/v1/keys").json()
        assert [k["name"] for k in listed["items"]] == ["admin"]
        assert "key" not in listed["items"][0]
    with _http(served, OPERATOR_KEY) as operator:
        _error(operator.get("/v1/runs"), 401, "auth.unauthenticated")
        _error(operator.post("/v1/tenants", json={"id": a}), 409, "tenant.conflict")
        bad = _error(
            operator.post("/v1/tenants", json={"id": "-x y", "name": ""}), 422, "tenant.invalid"
        )
        assert [p["pointer"] for p in bad["details"]] == ["/id", "/name"]
        named = operator.post("/v1/tenants", json={"id": "ok-name", "name": "a\u0085b"})
        assert [p["pointer"] for p in _error(named, 422, "tenant.invalid")["details"]] == ["/name"]
        for wrong in ("", "a" * 257, "a\x01b"):  # no name given: only the id is wrong
            unnamed = _error(
                operator.post("/v1/tenants", json={"id": wrong}), 422, "tenant.invalid"
            )
            assert [p["pointer"] for p in unnamed["details"]] == ["/id"], wrong
        tenants = operator.get("/v1/tenants", params={"limit": 500}).json()["items"]
        assert {a, b} <= {t["id"] for t in tenants}
        added = operator.post(f"/v1/tenants/{b}/keys", json={"name": "rescue", "scopes": ["admin"]})
        assert added.status_code == 201, added.text
        _error(
            operator.post("/v1/tenants/nobody/keys", json={"name": "x", "scopes": ["read"]}),
            404,
            "tenant.not_found",
        )
    with _http(served, "x" * 40) as wrong:
        _error(wrong.get("/v1/tenants"), 401, "auth.unauthenticated")
    # B's reader still works, and sees B's data only.
    with _http(served, b_reader["key"]) as http:
        assert http.get("/v1/runs").status_code == 200
    with _http(served, added.json()["key"]) as http:
        names = sorted(k["name"] for k in http.get("/v1/keys").json()["items"])
        assert names == ["admin", "k", "rescue"]


def test_every_route_refuses_a_key_without_its_scope(served: ServerProcess) -> None:
    _, admin = _tenant(served, "scopes")
    keys = {scope: _key(served, admin, scope)["key"] for scope in ("read", "events:send", "write")}
    refused = 0
    for scope, key in keys.items():
        with _http(served, key) as http:
            for route, needed in ROUTE_SCOPES.items():
                if needed.value in HOLDS[scope]:
                    continue
                method, path = _concrete(route)
                body = _error(http.request(method, path, json={}), 403, "auth.forbidden")
                assert body["details"] == {"needed": needed.value, "scopes": [scope]}, route
                refused += 1
    assert refused > 150
    # None of those calls did anything: the tenant has what the operator made, no more.
    with _http(served, admin) as http:
        assert http.get("/v1/workflows").json() == []
        assert http.get("/v1/runs").json()["items"] == []
        assert http.get("/v1/accounts").json() == []
        assert len(http.get("/v1/keys").json()["items"]) == 4
    # A key with the scope gets past the check (to an answer of the call itself).
    for scope, key in keys.items():
        with _http(served, key) as http:
            for route, needed in ROUTE_SCOPES.items():
                if needed.value not in HOLDS[scope] or route.startswith("POST /v1/ai/"):
                    continue
                method, path = _concrete(route)
                response = http.request(method, path)
                assert response.status_code != 403 or response.json()["code"] != "auth.forbidden"
    # What a producer's key is for.
    with _http(served, keys["events:send"]) as http:
        sent = http.post("/v1/events", json={"name": "order.paid", "id": "o-1"})
        assert sent.status_code == 202, sent.text
        _error(http.post("/v1/runs/run_x/signals/go", json={}), 404, "run.not_found")


def test_revoked_and_expired_keys_fail_on_the_next_request(served: ServerProcess) -> None:
    _, admin = _tenant(served, "revoke")
    doomed = _key(served, admin, "write")
    short = _key(served, admin, "read", expires_in="2s")
    with _http(served, doomed["key"]) as victim, _http(served, admin) as http:
        assert victim.get("/v1/runs").status_code == 200
        assert http.delete(f"/v1/keys/{doomed['id']}").status_code == 204
        _error(victim.get("/v1/runs"), 401, "auth.unauthenticated")
        assert http.delete(f"/v1/keys/{doomed['id']}").status_code == 204  # again: fine
        listed = {k["id"]: k for k in http.get("/v1/keys").json()["items"]}
        assert listed[doomed["id"]]["status"] == "revoked"
        assert listed[doomed["id"]]["last_used_at"] is not None
        [me] = [k for k in listed.values() if k["name"] == "admin"]
        last = _error(http.delete(f"/v1/keys/{me['id']}"), 409, "key.last_admin")
        assert last["details"] == {"key_id": me["id"]}
    expires = datetime.fromisoformat(short["expires_at"])
    with _http(served, short["key"]) as reader:
        assert reader.get("/v1/runs").status_code == 200
        while datetime.now(expires.tzinfo) < expires:
            time.sleep(0.1)
        time.sleep(0.05)
        expired = _error(reader.get("/v1/runs"), 401, "auth.key_expired")
    # written as every other time of the API is (RFC 3339, UTC, `Z`): the key's own expires_at
    assert expired["details"] == {"expired_at": short["expires_at"]}
    assert expired["details"]["expired_at"].endswith("Z")


def test_twenty_concurrent_creates_with_one_idempotency_key_make_one_key(
    served: ServerProcess,
) -> None:
    _, admin = _tenant(served, "idem")
    body = {"name": "once", "scopes": ["read"], "expires_in": "30d"}

    def create(_: int) -> httpx.Response:
        with _http(served, admin) as http:
            return http.post("/v1/keys", json=body, headers={"Idempotency-Key": "create-1"})

    with ThreadPoolExecutor(max_workers=20) as pool:
        answers = list(pool.map(create, range(20)))
    assert {a.status_code for a in answers} == {201}, [a.text for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    fresh = [a for a in answers if a.headers.get("Idempotency-Replayed") != "true"]
    assert len(fresh) == 1
    assert fresh[0].json()["key"].startswith("dk_")
    assert all(a.json()["key"] is None for a in answers if a not in fresh)
    with _http(served, admin) as http:
        names = [k["name"] for k in http.get("/v1/keys").json()["items"]]
        assert names.count("once") == 1
        other = {**body, "scopes": ["write"]}
        conflict = http.post("/v1/keys", json=other, headers={"Idempotency-Key": "create-1"})
        _error(conflict, 422, "idempotency.conflict")
    with _http(served, fresh[0].json()["key"]) as reader:
        assert reader.get("/v1/runs").status_code == 200


def test_malformed_requests_are_refused_whole_with_pointers(served: ServerProcess) -> None:
    _, admin = _tenant(served, "bad")
    with _http(served, admin) as http:
        bad = http.post(
            "/v1/keys",
            json={"name": "", "scopes": ["read", "root"], "expires_in": "soon"},
        )
        body = _error(bad, 422, "key.invalid")
        assert [p["pointer"] for p in body["details"]] == ["/name", "/scopes/1", "/expires_in"]
        cases: list[tuple[dict[str, Any], str]] = [
            ({"name": "x", "scopes": []}, "/scopes"),
            ({"name": "x" * 100_000, "scopes": ["read"]}, "/name"),
            ({"name": "a\u0085b", "scopes": ["read"]}, "/name"),  # a C1 control
            ({"name": "a\x7fb", "scopes": ["read"]}, "/name"),
            ({"name": "x", "scopes": ["read"] * 1000}, "/scopes"),
            (
                {"name": "x", "scopes": ["read"], "expires_at": "2000-01-01T00:00:00Z"},
                "/expires_at",
            ),
            ({"name": "x", "scopes": ["read"], "expires_at": "2099-01-01"}, "/expires_at"),
            ({"name": "x", "scopes": ["read"], "expires_in": "-1d"}, "/expires_in"),
        ]
        for request, pointer in cases:
            answer = _error(http.post("/v1/keys", json=request), 422, "key.invalid")
            assert [p["pointer"] for p in answer["details"]] == [pointer], request
        typed = _error(
            http.post("/v1/keys", json={"name": "x", "scopes": "read"}), 422, "request.invalid"
        )
        assert typed["details"]["path"] == "$.scopes"
        _error(
            http.post("/v1/keys", json={"name": "x", "scopes": ["read"], "owner": "b"}),
            422,
            "request.invalid",
        )
        _error(http.post("/v1/keys", content=b'{"name": '), 400, "request.malformed_json")
        huge = b"x" * (1024 * 1024 + 1)
        too_large = http.post(
            "/v1/keys", content=huge, headers={"Content-Type": "application/json"}
        )
        _error(too_large, 413, "request.too_large")
        _error(http.get("/v1/keys", params={"cursor": "not-ours"}), 422, "request.invalid")
        assert len(http.get("/v1/keys").json()["items"]) == 1  # nothing half-written


def _mcp(server: ServerProcess, key: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(
        f"{server.url}/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
        headers={"Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()["result"]
    return result


def test_mcp_tools_need_the_scope_of_their_rest_call(served: ServerProcess) -> None:
    _, admin = _tenant(served, "mcp")
    producer = _key(served, admin, "events:send")["key"]
    reader = _key(served, admin, "read")["key"]
    listed = _mcp(served, producer, "tools/list", {})["tools"]
    assert sorted(t["name"] for t in listed) == ["send_event", "send_signal"]
    unknown = _mcp(served, producer, "tools/call", {"name": "nope", "arguments": {}})
    assert unknown["isError"]
    assert unknown["structuredContent"]["code"] == "request.invalid"
    assert unknown["structuredContent"]["details"]["tools"] == ["send_event", "send_signal"]
    sent = _mcp(served, producer, "tools/call", {"name": "send_event", "arguments": {"name": "e"}})
    assert not sent.get("isError"), sent
    refused = _mcp(served, reader, "tools/call", {"name": "send_event", "arguments": {"name": "e"}})
    assert refused["isError"]
    assert refused["structuredContent"]["code"] == "auth.forbidden"
    assert refused["structuredContent"]["details"]["needed"] == "events:send"
    assert "send_event" not in {t["name"] for t in _mcp(served, reader, "tools/list", {})["tools"]}


def test_mcp_resources_need_read_and_a_revoked_or_expired_key_is_refused(
    served: ServerProcess,
) -> None:
    """Reading the resources needs `read` (an `events:send` key is refused with
    `auth.forbidden`, through the `mcp` client too); a revoked key is a 401
    `auth.unauthenticated` and an expired one a 401 `auth.key_expired` at /mcp, each
    with `WWW-Authenticate: Bearer`, on their very next request."""
    _, admin = _tenant(served, "mcpkeys")
    producer = _key(served, admin, "events:send")["key"]
    for method, params in (
        ("resources/list", {}),
        ("resources/read", {"uri": "ductor://workflows/x"}),
        ("resources/read", {"uri": "ductor://runs/r/history"}),
    ):
        answer = httpx.post(
            f"{served.url}/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
            headers={
                "Authorization": f"Bearer {producer}",
                "Accept": "application/json, text/event-stream",
            },
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        data = answer.json()["error"]["data"]
        assert data["code"] == "auth.forbidden", (method, data)
        assert data["details"]["needed"] == "read"

    async def through_the_client() -> None:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {producer}"}) as http,
            Client(streamable_http_client(f"{served.url}/mcp", http_client=http)) as client,
        ):
            with pytest.raises(MCPError) as refused:
                await client.list_resources()
            assert refused.value.error.data["code"] == "auth.forbidden"
            sent = await client.call_tool("send_event", {"name": "e"})
            assert not sent.is_error, sent.structured_content

    asyncio.run(through_the_client())

    doomed = _key(served, admin, "write")
    short = _key(served, admin, "read", expires_in="2s")
    assert _mcp(served, doomed["key"], "tools/list", {})["tools"]
    assert _mcp(served, short["key"], "tools/list", {})["tools"]
    with _http(served, admin) as http:
        assert http.delete(f"/v1/keys/{doomed['id']}").status_code == 204
    expires = datetime.fromisoformat(short["expires_at"])
    while datetime.now(expires.tzinfo) < expires:
        time.sleep(0.1)
    time.sleep(0.05)
    for key, code in ((doomed["key"], "auth.unauthenticated"), (short["key"], "auth.key_expired")):
        answer = httpx.post(
            f"{served.url}/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            headers={"Authorization": f"Bearer {key}", "Accept": "application/json"},
            timeout=60,
        )
        assert answer.status_code == 401, answer.text
        assert answer.headers["www-authenticate"].startswith("Bearer")
        error = answer.json()["error"]
        assert (error["code"], error["data"]["code"]) == (-32600, code)
        assert answer.json()["id"] is None


def test_the_cli_manages_keys_and_tenants(sqlite_served: ServerProcess) -> None:
    served = sqlite_served
    tenant = f"cli-{uuid.uuid4().hex[:8]}"
    made = served.cli("tenants", "create", tenant, "--name", "CLI Inc.")
    admin = made.stdout.strip()
    assert admin.startswith("dk_")
    assert f"tenant '{tenant}' created; its admin key key_" in made.stderr
    assert "shown once" in made.stderr
    added = served.cli(
        "tenants", "add-key", tenant, "--name", "ops", "--scope", "read", "--expires-in", "1d"
    )
    assert added.stdout.strip().startswith("dk_")
    assert "(read, expires 20" in added.stderr
    listed = served.cli("tenants", "list")
    assert f"{tenant}  CLI Inc.  created" in listed.stdout
    refused = served.cli(
        "keys", "create", "--name", "x", "--scope", "root", "--api-key", admin, check=False
    )
    assert refused.returncode == 1
    assert "error: key.invalid: unknown scope 'root'" in refused.stderr
    assert '"pointer": "/scopes/0"' in refused.stderr
    # An id is sent as one path segment, whatever it holds: never a traceback, another
    # route or a query.
    odd = served.cli("keys", "revoke", "key_x?y#z\x01%41", "--api-key", admin, check=False)
    assert odd.returncode == 1
    assert odd.stderr.startswith("error: key.not_found: API key 'key_x?y#z\\x01%41'"), odd.stderr
    # A key read from a file keeps its newline there; a key no server made stops at once.
    assert served.cli("keys", "list", "--api-key", admin + "\n").stdout.count("key_") == 2
    assert tenant in served.cli("tenants", "list", "--operator-key", OPERATOR_KEY + "\n").stdout
    for command in (
        ["keys", "list", "--api-key", "dk_é"],
        ["tenants", "list", "--operator-key", "é"],
    ):
        unusable = served.cli(*command, check=False)
        assert unusable.returncode == 2, unusable
        assert unusable.stderr.startswith("error: client.usage: the key given by --"), unusable
    keys = served.cli("keys", "list", "--api-key", admin).stdout.splitlines()
    assert len(keys) == 2
    assert re.fullmatch(
        r"key_\w{16}  dk_\S{7}\.\.\.  ops  \[read\]  active  last used never  expires 20\S+",
        keys[0],
    )


def test_the_operator_cli_works_on_the_database(served: ServerProcess) -> None:
    tenant = f"db-{uuid.uuid4().hex[:8]}"
    extra = [] if served.database_url else ["--data-dir", str(served.data_dir)]
    made = served.cli("tenants", "create", tenant, "--database", *extra)
    with _http(served, made.stdout.strip()) as http:
        assert [k["scopes"] for k in http.get("/v1/keys").json()["items"]] == [["admin"]]
    # The older operator form: a key for a (new) tenant, straight in the database.
    old = served.cli("keys", "create", "--tenant", f"{tenant}-2", "--scope", "read", *extra)
    with _http(served, old.stdout.strip()) as http:
        assert http.get("/v1/runs").status_code == 200
        _error(http.post("/v1/events", json={"name": "e"}), 403, "auth.forbidden")


def test_dev_prints_its_key_on_the_first_start_only(sqlite_served: ServerProcess) -> None:
    served = sqlite_served
    log = served.log()
    assert f"API key (created, saved to {served.data_dir / 'api_key'}): {served.api_key}" in log
    served.stop()
    served.start()
    log = served.log()
    assert f"API key (from {served.data_dir / 'api_key'}; printed on first start only)" in log
    assert log.count(served.api_key) == 1
    with _http(served, served.api_key) as http:  # the same key, and still an admin key
        assert http.get("/v1/keys").status_code == 200


def test_serve_prints_no_key(postgres_served: ServerProcess) -> None:
    # `ductor serve` makes no key: they come from the operator.
    assert "API key" not in postgres_served.log()
    assert postgres_served.api_key not in postgres_served.log()


def test_the_security_doc_runs_as_written(sqlite_served: ServerProcess, tmp_path: Path) -> None:
    served = sqlite_served
    _, admin = _tenant(served, "docs")
    port = served.url.rsplit(":", 1)[1]
    script = "set -euo pipefail\n" + "\n".join(
        block.replace("127.0.0.1:7070", f"127.0.0.1:{port}")
        for block in SH_BLOCK.findall(DOC.read_text())
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_")}
    env.update(
        {
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            "DUCTOR_URL": served.url,
            "DUCTOR_API_KEY": admin,
            "DUCTOR_OPERATOR_KEY": OPERATOR_KEY,
        }
    )
    result = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    out = result.stdout
    for block in TEXT_BLOCK.findall(DOC.read_text()):
        pattern = "\n".join(
            ".*?".join(re.escape(part) for part in line.split("...")) + "$"
            for line in block.rstrip("\n").split("\n")
        )
        assert re.search("^" + pattern, out, re.MULTILINE), f"not in the output:\n{block}\n{out}"
