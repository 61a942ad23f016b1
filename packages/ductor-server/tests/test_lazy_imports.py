"""The idle server holds no library it has not used: cel-python, Redis, Connect-RPC,
jsonschema, pydantic and (without receipt or secret keys) cryptography load on
first use, and then work.

Each check runs in a fresh interpreter (this test process has imported
everything already): it builds the app as `ductor dev` does, on the embedded
store, starts it (lifespan and engine loops), and reports which libraries are
in `sys.modules` before and after the feature that needs them is used.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TypedDict

import pytest

# Loaded on first use only; each pair is (what the idle server must not hold, why).
DEFERRED = {
    "celpy": "the cel-python engine (the server's default is cel-rust)",
    "lark": "cel-python's parser",
    "pendulum": "cel-python's time types",
    "redis": "only with DUCTOR_REDIS_URL",
    "connectrpc": "the first Connect-RPC request",
    "protobuf": "the first Connect-RPC request",
    "cryptography": "receipt signing and connection secret keys",
    "pydantic": "the mcp library's models: the first MCP request",
    "pydantic_core": "pydantic's core",
    "jsonschema": "the first workflow with an input_schema",
    "referencing": "jsonschema's references",
}

IDLE_SERVER = """
import asyncio, json, sys
from pathlib import Path

from litestar.testing import TestClient

from ductor_server.app import create_app
from ductor_server.cli_server import ensure_dev_key, ensure_dev_receipt_keys, ensure_dev_secret_keys
from ductor_server.composition import build
from ductor_server.settings import Settings

DEFERRED = json.loads(sys.argv[2])


def held():
    return sorted({name.split(".")[0] for name in sys.modules} & set(DEFERRED))


settings = Settings.from_env(data_dir=Path(sys.argv[1]), migrate_on_start=True)
key, _ = asyncio.run(ensure_dev_key(settings))
report = {}
# As `ductor serve` on the embedded store without keys, then as `ductor dev`.
with TestClient(create_app(composition=build(settings))) as client:
    assert client.get("/readyz").status_code == 200
    report["idle_without_keys"] = held()
settings, _, _ = ensure_dev_receipt_keys(settings)
settings, _, _ = ensure_dev_secret_keys(settings)
with TestClient(create_app(composition=build(settings))) as client:
    assert client.get("/readyz").status_code == 200
    auth = {"Authorization": f"Bearer {key}"}
    noop = {"type": "STEP_TYPE_ACTION", "args": {"action": "noop"}}
    workflow = {
        "family_slug": "lazy",
        "steps": [{"ref": "a", **noop}, {"ref": "b", **noop}],
        "edges": [{"source_ref": "a", "target_ref": "b", "type": "EDGE_TYPE_CONDITION",
                   "condition": "input.n > 1"}],
    }
    answer = client.post("/v1/workflows", json=workflow, headers=auth)
    assert answer.status_code == 201, answer.text
    report["idle"] = held()

    typed = {**workflow, "family_slug": "typed", "input_schema": {"type": "object"}}
    answer = client.post("/v1/workflows", json=typed, headers=auth)
    assert answer.status_code == 201, answer.text
    refused = client.post("/v1/runs", json={"family_slug": "typed", "input": 1}, headers=auth)
    report["schema_status"] = refused.status_code
    report["after_input_schema"] = held()

    answer = client.post("/ductor.v1.RunService/ListRuns", json={}, headers=auth)
    report["connect_status"] = answer.status_code
    report["after_connect"] = held()

    initialize = {
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-03-26", "capabilities": {},
                   "clientInfo": {"name": "probe", "version": "1"}},
    }
    accept = {"Accept": "application/json, text/event-stream"}
    answer = client.post("/mcp", json=initialize, headers={**auth, **accept})
    report["mcp_status"] = answer.status_code
    report["mcp_server"] = answer.json()["result"]["serverInfo"]["name"]
    report["after_mcp"] = held()

    from ductor_core.expressions import engine_by_name

    celpy = engine_by_name("cel-python")
    report["celpy_value"] = celpy.evaluate("input.n * 2", {"input": {"n": 21}})
    report["after_cel_python"] = held()

    build(Settings.from_env(data_dir=Path(sys.argv[1]), redis_url="redis://127.0.0.1:1/0"))
    report["after_redis_build"] = held()
print(json.dumps(report))
"""


class Report(TypedDict):
    """What the probe saw: the deferred libraries held at each point, and answers."""

    idle_without_keys: list[str]
    idle: list[str]
    schema_status: int
    after_input_schema: list[str]
    connect_status: int
    after_connect: list[str]
    mcp_status: int
    mcp_server: str
    after_mcp: list[str]
    celpy_value: int
    after_cel_python: list[str]
    after_redis_build: list[str]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    data_dir = tmp_path_factory.mktemp("lazy") / "data"
    data_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DUCTOR_", "OTEL_"))}
    done = subprocess.run(
        [sys.executable, "-c", IDLE_SERVER, str(data_dir), json.dumps(sorted(DEFERRED))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: Report = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_idle_server_holds_none_of_the_deferred_libraries(report: Report) -> None:
    held = report["idle_without_keys"]
    assert held == [], {name: DEFERRED[name] for name in held}


def test_with_the_dev_keys_only_cryptography_is_loaded(report: Report) -> None:
    # `ductor dev` reads its receipt and secret keys at start: they need cryptography.
    assert report["idle"] == ["cryptography"]


def test_a_workflow_with_an_input_schema_loads_jsonschema_and_is_checked(report: Report) -> None:
    assert report["schema_status"] == 422
    assert {"jsonschema", "referencing"} <= set(report["after_input_schema"])


def test_a_connect_call_loads_connect_rpc_and_is_answered(report: Report) -> None:
    assert report["connect_status"] == 200
    assert {"connectrpc", "protobuf"} <= set(report["after_connect"])
    assert "celpy" not in report["after_connect"]


def test_an_mcp_request_loads_pydantic_and_is_answered(report: Report) -> None:
    assert "pydantic" not in report["after_connect"]
    assert report["mcp_status"] == 200
    assert report["mcp_server"]
    assert {"pydantic", "pydantic_core"} <= set(report["after_mcp"])


def test_the_cel_python_engine_loads_on_first_use_and_evaluates(report: Report) -> None:
    assert report["celpy_value"] == 42
    assert {"celpy", "lark"} <= set(report["after_cel_python"])
    assert "redis" not in report["after_cel_python"]


def test_configuring_redis_loads_redis(report: Report) -> None:
    assert "redis" in report["after_redis_build"]
