"""`ductor dev` as a real process: it starts, serves health, and stops."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_ductor_dev_serves_healthz(tmp_path: Path) -> None:
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ductor_server.cli",
            "dev",
            "--port",
            str(port),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                assert time.monotonic() < deadline, "ductor dev did not start in 30s"
                time.sleep(0.1)
        assert response.json() == {"status": "ok"}
        assert (tmp_path / "data").is_dir()
        assert (tmp_path / "data" / "ductor.pid").read_text().strip() == str(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert proc.returncode == 0
    assert not (tmp_path / "data" / "ductor.pid").exists(), "a clean stop removes the pid file"


def _ductor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_")}
    base.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "ductor_server.cli", *args],
        env=base,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_migrate_applies_once_then_reports_up_to_date(tmp_path: Path, postgres_url: str) -> None:
    for env, extra in (
        ({}, ["--data-dir", str(tmp_path / "data")]),
        ({"DUCTOR_DATABASE_URL": postgres_url}, []),
    ):
        first = _ductor("migrate", *extra, env=env)
        assert first.returncode == 0, first.stderr
        assert "applied 0001" in first.stdout
        again = _ductor("migrate", *extra, env=env)
        assert again.returncode == 0, again.stderr
        assert again.stdout.strip() == "database is up to date"
    assert (tmp_path / "data" / "ductor.db").is_file()


def test_help_lists_every_command() -> None:
    result = _ductor("--help")
    assert result.returncode == 0
    for command in (
        "dev",
        "serve",
        "migrate",
        "keys",
        "workflows",
        "runs",
        "events",
        "ledger",
        "receipts",
    ):
        assert command in result.stdout
