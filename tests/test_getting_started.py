"""docs/getting-started.md, executed: every ```sh block runs, in order, in one bash.

A block that starts the server (`ductor dev`) runs in the background and the
next block waits until the server answers; `kill -9` in the doc really kills
it. The port is a free one instead of 7070 (via DUCTOR_PORT / DUCTOR_URL).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ductor_server.testing import free_port

from .conftest import WAIT_READY

DOC = Path(__file__).resolve().parents[1] / "docs" / "getting-started.md"
SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.DOTALL | re.MULTILINE)
TEXT_BLOCK = re.compile(r"^```text\n(.*?)^```", re.DOTALL | re.MULTILINE)


def doc_blocks() -> list[str]:
    return SH_BLOCK.findall(DOC.read_text())


def doc_script(port: int) -> str:
    """The doc's shell blocks as one script; server starts go to the background."""
    parts = ["set -euo pipefail"]
    for block in doc_blocks():
        if block.strip().startswith("ductor dev"):
            parts.append(f"{block.strip()} >> server.log 2>&1 &")
            parts.append(WAIT_READY)
        else:
            parts.append(block.replace("127.0.0.1:7070", f"127.0.0.1:{port}"))
    return "\n".join(parts) + "\n"


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    pid_file = tmp_path / ".ductor" / "ductor.pid"
    if pid_file.exists():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_the_doc_has_the_steps_it_promises() -> None:
    blocks = doc_blocks()
    starts = [b for b in blocks if b.strip().startswith("ductor dev")]
    assert len(starts) == 2, "start, then start again after the kill"
    text = "\n".join(blocks)
    for command in (
        "ductor workflows validate",
        "ductor workflows publish",
        "ductor runs trigger",
        "ductor runs watch",
        'kill -9 "$(cat .ductor/ductor.pid)"',
    ):
        assert command in text, command


@pytest.mark.slow
def test_getting_started_runs_as_written(workdir: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_")}
    env.update(
        {
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            "PYTHON": sys.executable,
            "DUCTOR_PORT": str(port),
            "DUCTOR_URL": f"http://127.0.0.1:{port}",
            "DUCTOR_POLL_INTERVAL": "0.2",
        }
    )
    result = subprocess.run(
        ["bash", "-c", doc_script(port)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    log = (workdir / "server.log").read_text() if (workdir / "server.log").exists() else ""
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n--- server\n{log}"
    out = result.stdout
    assert "hello-world.json: valid" in out
    assert "published hello-world version 1 (sha256:" in out
    assert "published nap version 1" in out
    assert '"waited_until"' in out
    assert '"rested": true' in out
    assert "STEP_STATUS_WAITING" in out  # the nap was asleep when the server died
    assert '"message":"hello"' in out.replace(" ", "")  # from the curl call
    # Two servers started; the first was killed, the second finished the nap.
    assert log.count("(embedded) on http://127.0.0.1:") == 2
    assert "API key (created" in log
    assert "API key (from" in log
    # The key is printed on the first start only; the second prints its file's path.
    key = (workdir / ".ductor" / "api_key").read_text().strip()
    assert log.count(key) == 1
    assert oct((workdir / ".ductor" / "api_key").stat().st_mode & 0o777) == "0o600"
    # The sample output the doc shows is what the commands print ("..." stands
    # for what differs from run to run: ids, hashes, times).
    for block in TEXT_BLOCK.findall(DOC.read_text()):
        pattern = "\n".join(
            ".*?".join(re.escape(part) for part in line.split("...")) + "$"
            for line in block.rstrip("\n").split("\n")
        )
        assert re.search("^" + pattern, out, re.MULTILINE), f"not in the output:\n{block}"

    # What the page says around its blocks, against the server the walk-through
    # left running: the same content again is unchanged; a bad definition reports
    # every problem with its pointer and exits 1; the other run commands answer.
    def sh(command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", command],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    again = sh("ductor workflows publish hello-world.json")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("unchanged hello-world version 1 (sha256:"), again.stdout
    broken = json.loads((workdir / "hello-world.json").read_text())
    broken["steps"][1]["args"]["duration"] = "soon"
    broken["edges"][0]["target_ref"] = "nowhere"
    (workdir / "broken.json").write_text(json.dumps(broken))
    invalid = sh("ductor workflows validate broken.json")
    assert invalid.returncode == 1, invalid
    assert invalid.stdout.startswith("broken.json: 2 problem(s)\n"), invalid.stdout
    assert "\n  /steps/1/args/duration: " in invalid.stdout, invalid.stdout
    assert "\n  /edges/0/target_ref: " in invalid.stdout, invalid.stdout
    run_id = sh("ductor runs list --family nap").stdout.split()[0]
    for command in (f"ductor runs get {run_id}", f"ductor runs history {run_id}"):
        done = sh(command)
        assert done.returncode == 0, (command, done.stderr)
        assert "STEP_STATUS_SUCCEEDED" in done.stdout or "run.succeeded" in done.stdout
    waited = sh("ductor runs trigger hello-world --wait --timeout 60")
    assert waited.returncode == 0, waited.stderr
    assert json.loads(waited.stdout)["status"] == "RUN_STATUS_SUCCEEDED"
    # Step 4's pattern when the trigger fails (say, a slug mistyped): RUN_ID is
    # empty, and `runs watch ""` says so instead of reading the list of runs.
    typo = sh('RUN_ID=$(ductor runs trigger hello-wrld --quiet); ductor runs watch "$RUN_ID"')
    assert typo.returncode == 2, typo
    assert typo.stdout == ""
    assert typo.stderr.startswith("error: workflow.not_found: workflow 'hello-wrld' not found\n")
    assert typo.stderr.rstrip().endswith("error: argument run_id: must not be empty"), typo.stderr
    assert "Traceback" not in typo.stderr
