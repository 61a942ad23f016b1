"""Testing against the app in process: `served` runs a composition under Litestar's
test client with two tenants ("tenant-a" and "tenant-b") and their API keys, and
`TenantApi` calls it as either tenant; `serve_process` runs a real `ductor
serve` process instead; `CommitCounter` counts the commits a process sends to
Postgres; `LoopbackHTTPServer` serves the HTTP services steps call. For the
project's own suites and benchmarks and for applications that embed the
server; nothing else imports this module."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from litestar.testing import AsyncTestClient

from ductor_server import Settings, create_app
from ductor_server.cli_server import create_key
from ductor_server.composition import Composition
from ductor_server.storage import Store, open_store


class LoopbackHTTPServer(ThreadingHTTPServer):
    """A thread per connection and the listen backlog of a real service.

    Python's default backlog is 5: a burst of new connections (a worker's many
    calls in flight) overflows it, and every dropped attempt waits out a 1 s SYN
    retransmit, a delay of the test's service that reads as the engine's."""

    daemon_threads = True
    request_queue_size = 1024


class TenantApi:
    """A test client, two tenants' keys, and a store of the test's own on the app's
    database; `backend` is "sqlite" or "postgres"."""

    def __init__(
        self, client: AsyncTestClient[Any], keys: tuple[str, str], store: Store, backend: str
    ) -> None:
        self.client = client
        self.store = store
        self.backend = backend
        self.a = {"Authorization": f"Bearer {keys[0]}"}
        self.b = {"Authorization": f"Bearer {keys[1]}"}

    async def call(
        self,
        method: str,
        path: str,
        *,
        key: str | None = None,
        as_b: bool = False,
        **kwargs: Any,
    ) -> Any:
        headers = dict(self.b if as_b else self.a)
        if key is not None:
            headers["Idempotency-Key"] = key
        return await self.client.request(method, path, headers=headers, **kwargs)

    async def ok(self, method: str, path: str, **kwargs: Any) -> Any:
        response = await self.call(method, path, **kwargs)
        assert response.status_code in (200, 201, 202), response.text
        return response.json()

    async def fails(self, method: str, path: str, status: int, code: str, **kwargs: Any) -> Any:
        response = await self.call(method, path, **kwargs)
        assert response.status_code == status, response.text
        body = response.json()
        assert body["code"] == code, body
        return body

    async def count(self, sql: str, *params: Any) -> int:
        async with self.store.transaction() as tx:
            row = await tx.session.fetch_one(sql, params)
        assert row is not None
        return int(row[0] or 0)


@asynccontextmanager
async def served(
    composition: Composition,
) -> AsyncIterator[tuple[AsyncTestClient[Any], tuple[str, str], Store]]:
    """Serve `composition` in process: its client, the two tenants' keys, and a store
    of the test's own (closed afterwards)."""
    settings: Settings = composition.settings
    async with AsyncTestClient(app=create_app(composition=composition)) as client:
        store = open_store(settings.store_target)
        await store.open()
        try:
            keys = (
                await create_key(store, "tenant-a", name="a"),
                await create_key(store, "tenant-b", name="b"),
            )
            yield client, keys, store
        finally:
            await store.close()


@dataclass(frozen=True)
class ServedProcess:
    """A running `ductor serve`: its URL, its store target and a key per tenant."""

    url: str
    target: str
    keys: dict[str, str]


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _mint_keys(target: str, tenants: Sequence[str]) -> dict[str, str]:
    store = open_store(target)
    await store.open()
    try:
        await store.migrate()
        return {t: await create_key(store, t, name=t) for t in tenants}
    finally:
        await store.close()


@contextmanager
def serve_process(
    data_dir: Path,
    *,
    tenants: Sequence[str],
    database_url: str | None = None,
    env: Mapping[str, str] | None = None,
    start_seconds: float = 120.0,
) -> Iterator[ServedProcess]:
    """Migrate the store, mint a key per tenant, and run `ductor serve` on a free
    port of 127.0.0.1 (SQLite under `data_dir` unless `database_url`), with none of
    this process's `DUCTOR_*` settings but `env`'s; stopped (SIGTERM) on exit. Its
    output goes to `data_dir/server.log`."""
    target = database_url or str(data_dir / "ductor.db")
    keys = asyncio.run(_mint_keys(target, tenants))
    settings = {k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_")}
    settings.update({"PYTHONUNBUFFERED": "1", **(env or {})})
    if database_url is not None:
        settings["DUCTOR_DATABASE_URL"] = database_url
    port = free_port()
    log_path = data_dir / "server.log"
    command = [sys.executable, "-m", "ductor_server.cli", "serve", "--port", str(port)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*command, "--data-dir", str(data_dir)],
            env=settings,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_seconds
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, f"the server did not start in {start_seconds} s"
            time.sleep(0.1)
        yield ServedProcess(url=url, target=target, keys=keys)
    finally:
        proc.terminate()
        proc.wait(timeout=15)


class _Statements:
    """Counts the statements a client sends on one Postgres connection: each
    Execute (extended protocol) and each simple Query message, BEGIN and COMMIT
    included; and its round trips: each Sync and each simple Query, after which
    the client waits for the server to be ready again (a pipeline of many
    statements is one). Expects no TLS (a server without ssl, or
    `sslmode=disable`)."""

    _PRELUDES = frozenset({80877103, 80877104})  # SSLRequest, GSSENCRequest: a startup follows

    def __init__(self) -> None:
        self._buffer = b""
        self._started = False

    def feed(self, chunk: bytes) -> tuple[int, int]:
        """Take the next bytes the client sent; return the statements and the
        round trips they completed."""
        self._buffer += chunk
        count = trips = 0
        while True:
            if not self._started:  # untyped: [length][code] ...
                if len(self._buffer) < 8:
                    return count, trips
                length = int.from_bytes(self._buffer[:4], "big")
                if len(self._buffer) < length:
                    return count, trips
                code = int.from_bytes(self._buffer[4:8], "big")
                self._buffer = self._buffer[length:]
                self._started = code not in self._PRELUDES
                continue
            if len(self._buffer) < 5:  # typed: [kind][length] ...
                return count, trips
            length = int.from_bytes(self._buffer[1:5], "big")
            if len(self._buffer) < 1 + length:
                return count, trips
            kind = self._buffer[:1]
            if kind in (b"E", b"Q"):
                count += 1
            if kind in (b"S", b"Q"):
                trips += 1
            self._buffer = self._buffer[1 + length :]


class CommitCounter:
    """A loopback TCP proxy in front of Postgres that counts the COMMITs its
    clients send, their statements and their round trips. Postgres' own
    `pg_stat_database.xact_commit` also counts transactions an idle backend runs
    to catch up on other databases' catalog changes: on a machine where other
    suites create and drop databases all the time that is noise of tens per
    second, so the wire is the exact measure."""

    def __init__(self, target: tuple[str, int]) -> None:
        """Listen on a free port of 127.0.0.1 and forward each connection to `target`."""
        self.target = target
        self.commits = 0
        self.statements = 0  # Execute and Query messages, BEGIN and COMMIT included
        self.round_trips = 0  # Sync and Query messages: the client waits after each
        self.reads = 0  # the chunks the clients' bytes arrived in: about their sends
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, database_url: str) -> str:
        """`database_url` with its host and port replaced by the counter's."""
        parts = urlsplit(database_url)
        netloc = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) > 1 else host))

    def close(self) -> None:
        """Stop accepting connections (those open stay open until their ends close)."""
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            # Each chunk goes on at once, as the client sent it: without this, a
            # pipeline that arrives in two reads waits on the delayed ACK (40 ms).
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        tail = b""
        statements = _Statements()
        try:
            while chunk := src.recv(65536):
                if count:
                    seen = tail + chunk
                    sent, trips = statements.feed(chunk)
                    with self._lock:
                        self.commits += seen.count(b"COMMIT\x00")
                        self.statements += sent
                        self.round_trips += trips
                        self.reads += 1
                    tail = chunk[-6:]  # a COMMIT split across two reads is still seen once
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


__all__ = ["CommitCounter", "ServedProcess", "TenantApi", "free_port", "serve_process", "served"]
