"""docs/configuration.md, executed: the YAML it shows is the files of examples/, and
every ```sh block runs, in order, in one bash, against the `ductor dev` it starts;
the output it shows is what the commands print ("..." stands for the rest of a line)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ductor_server.testing import free_port

from .conftest import WAIT_READY

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "configuration.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", DOC, re.DOTALL | re.MULTILINE)


def test_the_yaml_shown_is_the_example_files() -> None:
    shown = blocks("yaml")
    assert len(shown) == 3
    for block in shown:
        name = block.split("\n", 1)[0].removeprefix("# ")
        assert (ROOT / name).read_text() == block, name
    assert sorted(p.name for p in (ROOT / "examples" / "config").iterdir()) == [
        "connections.yaml",
        "new-lead.yaml",
        "routing.yaml",
    ]


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    for name in ("config", "config-broken"):
        shutil.copytree(ROOT / "examples" / name, tmp_path / "examples" / name)
    yield tmp_path
    pid_file = tmp_path / ".ductor" / "ductor.pid"
    if pid_file.exists():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


@pytest.mark.timeout(300)
def test_the_doc_runs_as_written(workdir: Path) -> None:
    parts = ["set -euo pipefail"]
    commands = blocks("sh")
    assert any(b.startswith("ductor dev --seed") for b in commands)
    for block in commands:
        if block.strip().startswith("ductor dev"):
            parts += [f"{block.strip()} >> server.log 2>&1 &", WAIT_READY]
        else:
            parts.append(block)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_")}
    env.update(
        {
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            "PYTHON": sys.executable,
            "DUCTOR_PORT": str(port),
            "DUCTOR_URL": f"http://127.0.0.1:{port}",
        }
    )
    env.pop("CRM_TOKEN", None)
    done = subprocess.run(
        ["bash", "-c", "\n".join(parts) + "\n"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    log = (workdir / "server.log").read_text() if (workdir / "server.log").exists() else ""
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n--- server\n{log}"
    assert "seed: created   Connection/crm" in log
    assert "seed examples/config (tenant dev): applied: 6 created, 0 updated, 0 unchanged" in log
    out = done.stdout
    shown = blocks("text")
    assert len(shown) == 4
    at = 0
    for block in shown:
        pattern = "\n".join(
            ".*".join(re.escape(part) for part in line.split("..."))
            for line in block.rstrip("\n").split("\n")
        )
        found = re.compile("^" + pattern + "$", re.MULTILINE).search(out, at)
        assert found, f"not in the output (in order):\n{block}\n--- output\n{out}"
        at = found.end()
