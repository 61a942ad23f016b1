"""docs/mcp.md, held to the server: the example runs against a real `ductor dev` and
prints what the doc says, the tool table lists exactly the server's tools and
their arguments, the client configuration reaches /mcp, the error examples are
the server's, and docs/api.md points here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ductor_core.errors import DuctorError
from ductor_server.transports.mcp import TOOLS, input_schema

from .conftest import ServerProcess

pytestmark = pytest.mark.timeout(300)

DOCS = Path(__file__).resolve().parents[1] / "docs"
DOC = (DOCS / "mcp.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", DOC, re.DOTALL | re.MULTILINE)


def section(title: str) -> str:
    return DOC.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_tool_table_is_the_servers() -> None:
    rows = re.findall(r"^\| `(\w+)` \|([^|]*)\|", section("Tools"), re.MULTILINE)
    documented = {name: re.findall(r"`(\w+)(\??)`", arguments) for name, arguments in rows}
    assert list(documented) == [tool.name for tool in TOOLS]
    for tool in TOOLS:
        schema = input_schema(tool)
        required = set(schema["required"])
        expected = [(name, "" if name in required else "?") for name in schema["properties"]]
        assert documented[tool.name] == expected, tool.name


def test_the_example_runs_and_prints_what_the_doc_says(sqlite_server: ServerProcess) -> None:
    server = sqlite_server.start()
    [script] = [b for b in blocks("python") if "asyncio.run(main())" in b]
    env = {**os.environ, "DUCTOR_URL": server.url, "DUCTOR_API_KEY": server.api_key}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    [expected] = [b for b in blocks("text") if b.startswith("19 tools")]
    assert done.stdout == expected

    # The client configuration, with this server's address and key, reaches /mcp.
    [config] = [json.loads(b) for b in blocks("json") if "mcpServers" in b]
    entry = config["mcpServers"]["ductor"]
    assert entry["type"] == "http"
    assert entry["url"] == "http://127.0.0.1:7070/mcp"  # ductor dev's default port
    url = entry["url"].replace("http://127.0.0.1:7070", server.url)
    headers = {
        name: value.replace("dk_...", server.api_key) for name, value in entry["headers"].items()
    }
    listing = httpx.post(
        url,
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
        headers={**headers, "Accept": "application/json, text/event-stream"},
        timeout=120,
    )
    assert listing.status_code == 200, listing.text
    assert len(listing.json()["result"]["tools"]) == len(TOOLS)

    # The refusal shown for a bad key is the server's.
    [shown] = [json.loads(b) for b in blocks("json") if "auth.unauthenticated" in b]
    refused = httpx.post(url, json={}, headers={"Authorization": "Bearer dk_nope"})
    assert refused.status_code == 401
    assert refused.json() == shown

    # The definition refusal shown is the one publishing the doc's BROKEN gets.
    [invalid] = [json.loads(b) for b in blocks("json") if "definition.invalid" in b]
    broken = {"family_slug": "broken", "steps": [{"ref": "a", "type": "STEP_TYPE_NOPE"}]}
    with server.client() as http:
        answer = http.post("/v1/workflows", json={**broken, "edges": []})
    assert answer.status_code == 422
    assert answer.json() == invalid
    assert f"BROKEN = {json.dumps({**broken, 'edges': []})}" in script


def test_the_argument_error_shown_is_the_servers() -> None:
    from ductor_server.transports.mcp.server import decode_arguments
    from ductor_server.transports.mcp.tools import TriggerRunArgs

    [shown] = [json.loads(b) for b in blocks("json") if '"argument"' in b]
    with pytest.raises(DuctorError) as refused:
        decode_arguments({"family_slug": "gate", "version": "one"}, TriggerRunArgs)
    error = refused.value
    assert {"code": error.code, "message": error.message, "details": error.details} == shown


def test_api_md_points_here() -> None:
    api = (DOCS / "api.md").read_text()
    assert "(mcp.md)" in api
    assert "/mcp" in api
