"""`ductor dev` as a real process: it starts, serves health, and stops."""

from __future__ import annotations

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
    finally:
        proc.terminate()
        proc.wait(timeout=10)
