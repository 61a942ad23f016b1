"""The connect-es test client of `tests/connect_client/`: installed from its lock file
(`npm ci`) and its code generated from `proto/` by `buf generate`, once per test
process, under a file lock (tests run in parallel workers).

Without node and npm the Connect client tests skip, except under `CI=true`, where
they fail: CI must run them.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from ductor_server.pytest_plugin import unavailable

ROOT = Path(__file__).resolve().parents[1]
CLIENT = ROOT / "tests" / "connect_client"
PROTO = ROOT / "proto"
_prepared = False


def _tools() -> tuple[str, str]:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        unavailable("Node.js", "node and npm (Node 20+) run the Connect client tests")
    return node, npm


def _run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=300, check=False, **kwargs
    )
    assert result.returncode == 0, f"{' '.join(command)}:\n{result.stdout}\n{result.stderr}"
    return result


def bin_env() -> dict[str, str]:
    """The environment with the client's `node_modules/.bin` (buf, protoc-gen-es) first."""
    env = dict(os.environ)
    env["PATH"] = f"{CLIENT / 'node_modules' / '.bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def prepared_client() -> Path:
    """The client directory, its packages installed and its code generated from proto/."""
    global _prepared
    _, npm = _tools()
    if _prepared:
        return CLIENT
    with (CLIENT / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        installed = CLIENT / "node_modules" / ".package-lock.json"
        lockfile = CLIENT / "package-lock.json"
        if not installed.exists() or installed.stat().st_mtime < lockfile.stat().st_mtime:
            _run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=CLIENT)
        _run(["buf", "generate", str(PROTO)], cwd=CLIENT, env=bin_env())
    _prepared = True
    return CLIENT


def buf(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the client's `buf` on `proto/` (its module root); its answer, whatever it is."""
    prepared_client()
    return subprocess.run(
        ["buf", *args], cwd=PROTO, env=bin_env(), capture_output=True, text=True, timeout=120
    )


def node(script: str, *, env: dict[str, str] | None = None, stdin: str = "") -> Any:
    """Run a script of the client with node; its stdout, parsed as JSON."""
    node_bin, _ = _tools()
    prepared_client()
    result = _run([node_bin, script], cwd=CLIENT, env={**os.environ, **(env or {})}, input=stdin)
    return json.loads(result.stdout)


def schema_problems(messages: list[tuple[str, Any]]) -> list[str]:
    """What protobuf-es finds wrong in each `(message type, JSON)` against proto/."""
    payload = [{"type": kind, "json": value} for kind, value in messages]
    problems: list[str] = node("validate.mjs", stdin=json.dumps(payload))
    return problems
