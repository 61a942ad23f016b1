"""docs/connections.md agrees with the server: its example requests run in order
against a real sink (its base URL swapped in), its error codes are the server's,
and its shown connection has the fields the API answers with."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from ductor_server.transports.rest.errors import STATUS_BY_CODE

from .conftest import Api, step
from .sink import HttpSink

DOC = (Path(__file__).resolve().parents[4] / "docs" / "connections.md").read_text()
EXAMPLE_BASE = "https://crm.example.com/api"


def requests() -> list[tuple[str, str, Any]]:
    out = []
    for block in re.findall(r"```http\n(.*?)```", DOC, flags=re.DOTALL):
        first, _, body = block.partition("\n")
        method, path = first.split()
        out.append((method, path, json.loads(body)))
    return out


async def test_the_example_runs(api: Api, sink: HttpSink) -> None:
    sink.answer(201, {"id": "lead_1"})
    samples = requests()
    assert [(m, p) for m, p, _ in samples] == [
        ("POST", "/v1/connections"),
        ("PATCH", "/v1/connections/crm"),
        ("POST", "/v1/workflows"),
        ("POST", "/v1/runs"),
    ]
    answers = []
    for method, path, body in samples:
        text = json.dumps(body).replace(EXAMPLE_BASE, sink.url + "/api")
        answers.append(await api.ok(method, path, json=json.loads(text)))
    created, patched = answers[0], answers[1]
    shown = json.loads(re.search(r"```json\n(\{\"id\".*?)```", DOC, re.DOTALL).group(1))  # type: ignore[union-attr]
    assert set(shown) == set(created)
    assert created["secrets"] == shown["secrets"] == {"bearer_token": "••••cdef"}
    assert shown["config"] == {"base_url": EXAMPLE_BASE}
    assert created["config"] == {"base_url": sink.url + "/api"}
    assert patched["config"]["timeout"] == 10
    run = answers[-1]
    deadline = asyncio.get_running_loop().time() + 30
    while not run["status"].endswith(("SUCCEEDED", "FAILED")):
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.05)
        run = await api.ok("GET", f"/v1/runs/{run['id']}")
    assert run["status"] == "RUN_STATUS_SUCCEEDED", run
    assert step(run, "push")["output"]["body"] == {"id": "lead_1"}
    seen = sink.last
    assert (seen.method, seen.path) == ("POST", "/api/leads")
    assert seen.json() == {"email": "ada@example.com"}
    assert seen.headers["authorization"] == "Bearer crm-token-0123456789abcdef"
    assert seen.headers["idempotency-key"] == f"{run['id']}:push:-1:1"


def test_the_documented_api_codes_are_the_servers() -> None:
    api_table = DOC.split("## The API", 1)[1].split("##", 1)[0]
    for code in re.findall(r"`(\d{3}) ([a-z_.]+)`", api_table):
        assert STATUS_BY_CODE[code[1]] == int(code[0]), code
    for code in ("connection.not_found", "connection.invalid", "secrets.undecryptable"):
        assert code in STATUS_BY_CODE
