"""docs/inbox.md, executed against a real `ductor dev`: the example scripts (the
approval and the email one) run and print what the doc says, an email's fields
are the documented ones, the NOTIFY step validates, the preferences request
answers as shown, and the token recipe is the server's. The JavaScript
browser snippet is the one block not run (it says so)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ductor_server.services.inbox import subscriber_token

from .conftest import ServerProcess

pytestmark = pytest.mark.timeout(90)

DOC = (Path(__file__).resolve().parents[1] / "docs" / "inbox.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", DOC, re.DOTALL | re.MULTILINE)


def test_the_example_runs_and_prints_what_the_doc_says(sqlite_server: ServerProcess) -> None:
    server = sqlite_server.start()
    script = next(b for b in blocks("python") if "asyncio.run(main())" in b)
    env = {
        **os.environ,
        "DUCTOR_URL": server.url,
        "DUCTOR_API_KEY": server.api_key,
        "DUCTOR_TENANT": "dev",
    }
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    [expected] = [b for b in blocks("text") if b.startswith("received:")]
    assert done.stdout == expected


def test_the_email_example_runs_and_prints_what_the_doc_says(
    sqlite_server: ServerProcess,
) -> None:
    server = sqlite_server.start()
    script = next(b for b in blocks("python") if "Controller(Mailbox()" in b)
    env = {**os.environ, "DUCTOR_URL": server.url, "DUCTOR_API_KEY": server.api_key}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr + server.log()[-3000:]
    [expected] = [b for b in blocks("text") if b.startswith("emails:")]
    assert done.stdout == expected
    option = json.loads(next(b for b in blocks("json") if b.startswith('{"connection"')))
    step = json.loads(next(b for b in blocks("json") if '"STEP_TYPE_NOTIFY"' in b))
    step["args"]["email"] = option
    definition = {"family_slug": "approval", "steps": [step], "edges": []}
    with server.client() as http:
        assert http.post("/v1/workflows/validate", json=definition).json()["valid"] is True
        [view] = http.get("/v1/inbox/emails").json()["emails"]
    documented = json.loads(next(b for b in blocks("json") if b.startswith('{"id": "eml_')))
    assert sorted(view) == sorted(documented)


def test_the_step_the_token_and_the_preferences_are_real(sqlite_server: ServerProcess) -> None:
    server = sqlite_server.start()
    step = json.loads(next(b for b in blocks("json") if '"STEP_TYPE_NOTIFY"' in b))
    definition = {"family_slug": "approval", "steps": [step], "edges": []}
    with server.client() as http:
        report = http.post("/v1/workflows/validate", json=definition).json()
        assert report == {"valid": True, "problems": []}
        [request] = blocks("http")
        first, _, body = request.partition("\n")
        method, path = first.split()
        answer = http.request(method, path, json=json.loads(body))
        assert answer.status_code == 200, answer.text
        rules = http.get(path).json()["rules"]
        assert [(r["feed"], r["workflow"], r["in_app"], r["email"]) for r in rules] == [
            ("digest", None, False, True),
            (None, "approval", True, False),
        ]
    recipe = next(b for b in blocks("python") if "def subscriber_token" in b)
    scope: dict[str, object] = {}
    exec(recipe, scope)
    made = scope["subscriber_token"]
    assert callable(made)
    assert made("s3cret", "ann") == subscriber_token("s3cret", "ann")
    frames = [json.loads(b) for b in blocks("json") if b.startswith('{"type"')]
    assert [f["type"] for f in frames] == ["auth", "change"]
    [browser] = blocks("javascript")
    assert browser.startswith("// Not run by the documentation tests")
    assert httpx.get(server.url + "/readyz").status_code == 200
