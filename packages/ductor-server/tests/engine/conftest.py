"""Fixtures for the engine tests: a migrated store on each backend, a Runtime on a
manual clock, and helpers to wait for runs without timed assertions."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from ductor_core.runs import RunStatus
from ductor_server.composition import build_services
from ductor_server.engine.actions import ActionRegistry, default_registry
from ductor_server.engine.clock import ManualClock
from ductor_server.engine.runtime import Runtime, RuntimeConfig
from ductor_server.services import RunView, Services
from ductor_server.storage import Store, open_store
from ductor_server.testing import free_port

TENANT = "t_acme"
OTHER_TENANT = "t_other"
WAIT_SECONDS = 20.0


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """An opened, migrated store with two tenants, on each backend in turn."""
    if request.param == "sqlite":
        target: str | Path = tmp_path / "ductor.db"
    else:
        target = request.getfixturevalue("postgres_url")
    opened = open_store(target)
    await opened.open()
    try:
        await opened.migrate()
        async with opened.transaction() as tx:
            clock = ManualClock()
            await tx.ensure_tenant(TENANT, name="Acme", now=clock.now())
            await tx.ensure_tenant(OTHER_TENANT, name="Other", now=clock.now())
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def pg_store(postgres_url: str) -> AsyncIterator[Store]:
    """A migrated store on Postgres only: the tests that take it have a second
    process lease, or a completion commit, in the middle of a first process's
    transaction, which SQLite (one writer at a time, for the whole transaction)
    never lets happen."""
    store = open_store(postgres_url)
    await store.open()
    try:
        await store.migrate()
        async with store.transaction() as tx:
            await tx.ensure_tenant(TENANT, name="Acme", now=ManualClock().now())
        yield store
    finally:
        await store.close()


@dataclass
class Engine:
    """A running Runtime on a manual clock, with helpers for tests."""

    store: Store
    clock: ManualClock
    actions: ActionRegistry
    runtime: Runtime

    @cached_property
    def services(self) -> Services:
        return build_services(self.runtime)

    async def publish(self, definition: dict[str, Any], tenant: str = TENANT) -> int:
        published = (await self.services.workflows.publish(tenant, definition)).value
        return published.version

    async def trigger(
        self, slug: str, input: Any = None, *, tenant: str = TENANT, key: str | None = None
    ) -> RunView:
        return (await self.services.runs.trigger(tenant, slug, None, input, key)).value

    async def advance(self, seconds: float) -> None:
        """Move the clock and wake every loop so timers and leases see the new time."""
        self.clock.advance(timedelta(seconds=seconds))
        self.runtime.wake()

    async def wait_run(
        self,
        run_id: str,
        predicate: Callable[[RunView], bool] | None = None,
        *,
        tenant: str = TENANT,
        what: str = "the run to end",
    ) -> RunView:
        """Poll the run until `predicate` (default: it ended); fail after WAIT_SECONDS."""
        check = predicate or (lambda r: r.status.terminal)
        deadline = asyncio.get_running_loop().time() + WAIT_SECONDS
        while True:
            view = await self.services.runs.get(tenant, run_id)
            if check(view):
                return view
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {view}")
            await asyncio.sleep(0.01)

    async def wait_step(self, run_id: str, ref: str, status: str, **kw: Any) -> RunView:
        """Poll until step `ref` has `status` (a StepStatus value or its short name)."""
        wanted = status if status.startswith("STEP_STATUS_") else f"STEP_STATUS_{status.upper()}"

        def has(view: RunView) -> bool:
            return any(s.ref == ref and s.status.value == wanted for s in view.steps)

        return await self.wait_run(run_id, has, what=f"step {ref} {wanted}", **kw)

    async def until(self, condition: Callable[[], Awaitable[bool]], what: str) -> None:
        deadline = asyncio.get_running_loop().time() + WAIT_SECONDS
        while not await condition():
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.01)


def step(view: RunView, ref: str) -> Any:
    """The StepView of `ref`."""
    [found] = [s for s in view.steps if s.ref == ref]
    return found


TEST_CONFIG = RuntimeConfig(poll_interval=0.05, lease_seconds=30.0, stop_grace=2.0)


@pytest.fixture
async def engine(store: Store) -> AsyncIterator[Engine]:
    """A Runtime with every role, on a manual clock and a private action registry."""
    clock = ManualClock()
    actions = default_registry()
    async with Runtime.start(store, config=TEST_CONFIG, clock=clock, actions=actions) as runtime:
        yield Engine(store=store, clock=clock, actions=actions, runtime=runtime)


SUCCEEDED = RunStatus.SUCCEEDED
FAILED = RunStatus.FAILED
CANCELLED = RunStatus.CANCELLED


class OwnRedis:
    """A redis-server of this test's own (never the shared one), restartable."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None, "redis-server is not installed"
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""],
            cwd=self.workdir,
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    """A redis-server of the test's own, stopped after it."""
    server = OwnRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def redis(own_redis: OwnRedis) -> AsyncIterator[Redis]:
    """A client of the test's own redis-server."""
    client = Redis(port=own_redis.port, socket_connect_timeout=1)
    try:
        yield client
    finally:
        await client.aclose()
