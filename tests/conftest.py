"""Harness for the end-to-end and fault tests: real server processes, a real HTTP sink.

`ductor_server` runs as a separate OS process (`python -m ductor_server.cli`),
so a test can `kill -9` it at any moment and start it again on the same data.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest

from ductor_server.cli_server import create_key
from ductor_server.storage import open_store
from ductor_server.testing import LoopbackHTTPServer, free_port

from .ai_upstream import ScriptedUpstream

pytest_plugins = ["ductor_server.pytest_plugin"]

CHECKOUT = Path(__file__).resolve().parents[1]

START_TIMEOUT = float(os.environ.get("DUCTOR_TEST_START_TIMEOUT", "120"))
"""Seconds a server process may take to answer /readyz: a bound on a hang, not a
measure (tests run in parallel, and a loaded machine starts a server slowly)."""

WAIT_READY = f"""\
"$PYTHON" - <<'PY'
import os, sys, time, httpx
deadline = time.monotonic() + {START_TIMEOUT}
while time.monotonic() < deadline:
    try:
        if httpx.get(os.environ["DUCTOR_URL"] + "/readyz", timeout=1).status_code == 200:
            sys.exit(0)
    except httpx.TransportError:
        pass
    time.sleep(0.1)
sys.exit("the server did not become ready in {START_TIMEOUT}s")
PY
"""
"""A shell snippet for docs tests: wait (as long as `START_TIMEOUT`) until the
server at `$DUCTOR_URL` is ready, with the Python at `$PYTHON`."""


def _untracked(root: Path) -> set[str] | None:
    """The checkout's untracked, unignored files (None outside a git checkout)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "ls-files", "--others", "--exclude-standard", "--directory"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return set(done.stdout.splitlines()) if done.returncode == 0 else None


@pytest.fixture(scope="session", autouse=True)
def _checkout_stays_clean() -> Iterator[None]:
    """Fail the session if a test wrote a file into the checkout (a database URL
    once taken for a file name left a SQLite file at its root): tests write under
    their tmp_path only."""
    before = _untracked(CHECKOUT)
    yield
    after = _untracked(CHECKOUT)
    if before is not None and after is not None:
        new = sorted(after - before)
        assert not new, f"tests wrote into the checkout {CHECKOUT}: {new}"


class ChildProcess:
    """A child process the tests start, SIGKILL and stop (its `proc` set by `start`)."""

    proc: subprocess.Popen[bytes] | None = None

    def kill9(self) -> None:
        """SIGKILL the process: no shutdown code runs."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Stop the process if it runs (SIGTERM, then SIGKILL)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


class ServerProcess(ChildProcess):
    """One `ductor dev` (SQLite) or `ductor serve` (Postgres) process, restartable.

    The data dir (and database URL) stay the same across restarts, so a restart
    finds every run where the killed process left it.
    """

    def __init__(
        self, *, data_dir: Path, database_url: str | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.data_dir = data_dir
        self.database_url = database_url
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra_env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}-server.log"
        self.api_key: str = ""
        self.start_timeout = START_TIMEOUT

    @property
    def backend(self) -> str:
        return "postgres" if self.database_url else "sqlite"

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_")}
        env.update(
            {
                "DUCTOR_LEASE_SECONDS": "2",
                "DUCTOR_POLL_INTERVAL": "0.2",
                "PYTHONUNBUFFERED": "1",
                # The sinks and apps of these tests listen on loopback, which the
                # outbound guard refuses unless allowed (`ductor dev` allows it).
                "DUCTOR_OUTBOUND_ALLOW": "127.0.0.0/8,::1",
            }
        )
        if self.database_url:
            env["DUCTOR_DATABASE_URL"] = self.database_url
        env.update(self.extra_env)
        return env

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a `ductor` command against this server (its URL, key and database)."""
        env = self._env()
        env["DUCTOR_URL"] = self.url
        if self.api_key:
            env["DUCTOR_API_KEY"] = self.api_key
        try:
            result = subprocess.run(
                [sys.executable, "-m", "ductor_server.cli", *args],
                env=env,
                capture_output=True,
                text=True,
                timeout=90,
            )
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(
                f"ductor {' '.join(args)} did not finish in 90s: {exc.stdout!r} {exc.stderr!r}\n"
                f"--- server log\n{self.log()[-4000:]}"
            ) from exc
        if check and result.returncode != 0:
            raise AssertionError(
                f"ductor {' '.join(args)} exited {result.returncode}:\n"
                f"{result.stdout}\n{result.stderr}\n--- server log\n{self.log()[-4000:]}"
            )
        return result

    def start(self, *extra: str) -> ServerProcess:
        """Start the process (`extra`: more arguments of `dev` or `serve`) and wait
        until /readyz answers 200."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.database_url:
            args = ["serve", "--migrate", "--port", str(self.port)]
        else:
            args = ["dev", "--port", str(self.port), "--data-dir", str(self.data_dir)]
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ductor_server.cli", *args, *extra],
            env=self._env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"server not ready in {self.start_timeout}s:\n{self.log()}")
            time.sleep(0.1)
        if not self.api_key:
            if self.database_url:
                self.api_key = asyncio.run(_create_key(self.database_url, "acme"))
            else:
                self.api_key = (self.data_dir / "api_key").read_text().strip()
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def client(self, api_key: str | None = None) -> httpx.Client:
        """An HTTP client for this server, authenticated with `api_key` (default: its key)."""
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {api_key or self.api_key}"},
            timeout=30,
        )

    def wait_for_run(
        self, run_id: str, *, timeout: float = 60.0, api_key: str | None = None
    ) -> dict[str, Any]:
        """Poll a run until it ends; fail with the last state after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        with self.client(api_key) as http:
            while time.monotonic() < deadline:
                response = http.get(f"/v1/runs/{run_id}")
                assert response.status_code == 200, response.text
                last = response.json()
                if last["status"] in {
                    "RUN_STATUS_SUCCEEDED",
                    "RUN_STATUS_FAILED",
                    "RUN_STATUS_CANCELLED",
                }:
                    return last
                time.sleep(0.2)
        raise AssertionError(
            f"run {run_id} did not end in {timeout}s: {json.dumps(last, indent=1)}\n"
            f"{self.log()[-4000:]}"
        )


async def _create_key(target: str, tenant_id: str) -> str:
    """Mint a key straight in the store (what `ductor keys create` does), in this process."""
    store = open_store(target)
    await store.open()
    try:
        return await create_key(store, tenant_id, name="test")
    finally:
        await store.close()


@pytest.fixture
def sqlite_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A not-yet-started `ductor dev` on a fresh data dir; stopped after the test."""
    server = ServerProcess(data_dir=tmp_path / "data")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_server(tmp_path: Path, postgres_url: str) -> Iterator[ServerProcess]:
    """A not-yet-started `ductor serve` on a fresh Postgres database; stopped after."""
    server = ServerProcess(data_dir=tmp_path / "data", database_url=postgres_url)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Build extra server processes (`name`, `database_url`, `env`); all stopped after."""
    made: list[ServerProcess] = []

    def make(
        name: str, *, database_url: str | None = None, env: dict[str, str] | None = None
    ) -> ServerProcess:
        server = ServerProcess(data_dir=tmp_path / name, database_url=database_url, env=env)
        made.append(server)
        return server

    try:
        yield make
    finally:
        for server in made:
            server.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest) -> ServerProcess:
    """A not-yet-started server process on each backend in turn."""
    fixture = "sqlite_server" if request.param == "sqlite" else "postgres_server"
    result: ServerProcess = request.getfixturevalue(fixture)
    return result


# --- the HTTP sink -------------------------------------------------------------


class Sink:
    """A real HTTP server in a thread that plays the external system.

    Paths: `/ok` answers 200 at once; `/flaky` answers 503 to the first request
    of each run (by the idempotency key's run id) and 200 after; `/slow` waits
    `slow_seconds` before answering 200, and answers nothing if the caller hung
    up meanwhile (as a server whose client vanished mid-request would).

    `effects` counts, per idempotency key, the requests answered 2xx: the side
    effects the external system performed. `deliveries` logs every request.
    """

    def __init__(self, *, slow_seconds: float = 6.0) -> None:
        self.slow_seconds = slow_seconds
        self.lock = threading.Lock()
        self.effects: dict[str, int] = {}
        self.deliveries: list[tuple[str, str, int]] = []  # (path, key, status or 0)
        self.failed_runs: set[str] = set()
        self.slow_started = threading.Event()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                key = self.headers.get("idempotency-key", "")
                status = sink.decide(self.path, key)
                if self.path.startswith("/slow"):
                    time.sleep(sink.slow_seconds)
                    if _peer_gone(self.connection):
                        sink.record(self.path, key, 0)
                        self.close_connection = True
                        return
                payload = json.dumps({"path": self.path, "key": key, "echo": body.decode()})
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload.encode())
                    self.wfile.flush()
                except OSError:
                    sink.record(self.path, key, 0)
                    return
                sink.record(self.path, key, status)

            do_GET = do_POST

        self.server = LoopbackHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def decide(self, path: str, key: str) -> int:
        run_id = key.split(":", 1)[0]
        if path.startswith("/slow"):
            self.slow_started.set()
        if path.startswith("/flaky"):
            with self.lock:
                if run_id not in self.failed_runs:
                    self.failed_runs.add(run_id)
                    return 503
        return 200

    def record(self, path: str, key: str, status: int) -> None:
        with self.lock:
            self.deliveries.append((path, key, status))
            if 200 <= status < 300:
                self.effects[key] = self.effects.get(key, 0) + 1

    def effects_for(self, run_id: str) -> dict[str, int]:
        """Keys of one run answered 2xx, with how many times each was."""
        with self.lock:
            return {k: n for k, n in self.effects.items() if k.startswith(run_id + ":")}

    def deliveries_for(self, run_id: str) -> list[tuple[str, str, int]]:
        """Every request of one run: (path, key, status; 0 = caller gone)."""
        with self.lock:
            return [d for d in self.deliveries if d[1].startswith(run_id + ":")]

    def __enter__(self) -> Sink:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _peer_gone(sock: socket.socket) -> bool:
    """True if the other end closed the connection (EOF or reset)."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


@pytest.fixture
def sink() -> Iterator[Sink]:
    """A running HTTP sink on 127.0.0.1."""
    with Sink() as s:
        yield s


@pytest.fixture
def wait_until() -> Callable[..., None]:
    """Poll `predicate` until true or fail after `timeout` seconds."""

    def wait(predicate: Callable[[], bool], *, timeout: float = 30.0, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(0.05)

    return wait


# --- a private Redis ----------------------------------------------------------------


class PrivateRedis:
    """A redis-server of a test's own, on a free port, that it may flush, kill and
    start again (never the shared Redis other tests use)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                *("redis-server", "--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while self.cli("PING") != "PONG":
            assert time.monotonic() < deadline, "the private redis-server did not start"
            time.sleep(0.05)

    def cli(self, *command: str) -> str:
        done = subprocess.run(
            ["redis-cli", "-p", str(self.port), *command],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return done.stdout.strip()

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    """A running private redis-server, killed after the test."""
    redis = PrivateRedis()
    redis.start()
    try:
        yield redis
    finally:
        if redis.proc is not None and redis.proc.poll() is None:
            redis.kill9()


@pytest.fixture
def upstream() -> Iterator[ScriptedUpstream]:
    """A scripted OpenAI-compatible upstream on loopback, stopped after the test
    (the agent's and Connect's tests keep one for their whole module)."""
    scripted = ScriptedUpstream().start()
    try:
        yield scripted
    finally:
        scripted.stop()
