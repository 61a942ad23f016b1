"""docs/ai.md, executed: its example script runs with the `openai` client against a
real `ductor dev` and the scripted upstream and prints what the doc says; every
error code its table names is in the server's error table with the status shown."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ductor_server.transports.rest.errors import STATUS_BY_CODE

from .ai_upstream import UPSTREAM_KEY, ScriptedUpstream
from .conftest import ServerProcess

DOC = (Path(__file__).resolve().parents[1] / "docs" / "ai.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", DOC, re.DOTALL | re.MULTILINE)


@pytest.fixture
def upstream() -> Iterator[ScriptedUpstream]:
    scripted = ScriptedUpstream().start()
    try:
        yield scripted
    finally:
        scripted.stop()


def test_the_example_prints_what_the_doc_says(
    sqlite_server: ServerProcess, upstream: ScriptedUpstream
) -> None:
    server = sqlite_server.start()
    [script] = blocks("python")
    env = {
        **os.environ,
        "DUCTOR_URL": server.url,
        "DUCTOR_API_KEY": server.api_key,
        "UPSTREAM_URL": upstream.url,
        "UPSTREAM_KEY": UPSTREAM_KEY,
    }
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    [expected] = blocks("text")
    assert done.stdout == expected


def test_the_error_table_is_the_servers() -> None:
    section = DOC.split("## Errors", 1)[1]
    rows = re.findall(r"^\| (\d{3}) \| (.+?) \|", section, re.MULTILINE)
    assert len(rows) >= 10
    for status, codes in rows:
        for code in re.findall(r"`([a-z_.]+)`", codes):
            assert STATUS_BY_CODE[code] == int(status), code
