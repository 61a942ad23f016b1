"""docs/ai.md, executed: its two example scripts run against a real `ductor dev` and
the scripted upstream (the proxy with the `openai` client, then the chat agent)
and print what the doc says, as does its `ductor chat` command; every error
code its table names is in the server's error table with the status shown."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from ductor_server.transports.rest.errors import STATUS_BY_CODE

from .ai_upstream import UPSTREAM_KEY, ScriptedUpstream
from .conftest import ServerProcess

DOC = (Path(__file__).resolve().parents[1] / "docs" / "ai.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", DOC, re.DOTALL | re.MULTILINE)


def test_the_examples_print_what_the_doc_says(
    sqlite_server: ServerProcess, upstream: ScriptedUpstream
) -> None:
    server = sqlite_server.start()
    proxy, agent = blocks("python")
    printed, agent_printed, chat_printed = blocks("text")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_")},
        "DUCTOR_URL": server.url,
        "DUCTOR_API_KEY": server.api_key,
        "UPSTREAM_URL": upstream.url,
        "UPSTREAM_KEY": UPSTREAM_KEY,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    for script, expected in ((proxy, printed), (agent, agent_printed)):
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=180
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == expected

    # `ductor chat -m`, as the doc runs it (the agent script set everything up).
    [chat] = blocks("sh")
    assert chat.startswith("ductor chat ")
    done = subprocess.run(
        ["bash", "-c", chat], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(chat_printed)
    assert "The decision's explanation: {" in done.stdout
    assert "[tool] get_decision" in done.stderr
    assert "420 micros" in done.stderr


def test_the_error_table_is_the_servers() -> None:
    section = DOC.split("## Errors", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d{3}) \| (.+?) \|", section, re.MULTILINE)
    assert len(rows) >= 15
    for status, codes in rows:
        for code in re.findall(r"`([a-z_.]+)`", codes):
            assert STATUS_BY_CODE[code] == int(status), code
