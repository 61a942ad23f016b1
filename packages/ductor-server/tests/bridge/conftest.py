"""Fixtures for the bridge tests: a migrated store on each backend and a Runtime
with the bridge installed, its `bridge` handler reaching an in-process SDK app
over ASGI."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import httpx
import pytest

from ductor import Client
from ductor.asgi import BridgeApp
from ductor.protocol import BRIDGE_PATH, SigningKeys
from ductor_server.bridge.driver import BridgeDriver
from ductor_server.bridge.kind import install
from ductor_server.bridge.registry import sync_app
from ductor_server.composition import build_services
from ductor_server.engine.actions import default_registry
from ductor_server.engine.clock import SystemClock
from ductor_server.engine.runtime import Runtime, RuntimeConfig
from ductor_server.services import RunView, Services
from ductor_server.storage import Store, open_store

TENANT = "t_acme"
KEY = "signkey-test-0001"
APP_URL = "http://app.test" + BRIDGE_PATH
WAIT_SECONDS = 30.0


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """An opened, migrated store with one tenant, on each backend in turn."""
    if request.param == "sqlite":
        target: str | Path = tmp_path / "ductor.db"
    else:
        target = request.getfixturevalue("postgres_url")
    opened = open_store(target)
    await opened.open()
    try:
        await opened.migrate()
        async with opened.transaction() as tx:
            await tx.ensure_tenant(TENANT, name="Acme", now=SystemClock().now())
        yield opened
    finally:
        await opened.close()


@dataclass
class BridgeEngine:
    """A running Runtime whose bridge calls reach `client` in-process."""

    store: Store
    runtime: Runtime
    driver: BridgeDriver

    @cached_property
    def services(self) -> Services:
        return build_services(self.runtime)

    async def register(self, client: Client) -> None:
        async with self.store.transaction() as tx:
            await sync_app(tx, TENANT, client.describe(APP_URL), url=APP_URL, now=_now())

    async def wait_run(
        self, run_id: str, predicate: Callable[[RunView], bool] | None = None, what: str = "end"
    ) -> RunView:
        check = predicate or (lambda r: r.status.terminal)
        deadline = asyncio.get_running_loop().time() + WAIT_SECONDS
        while True:
            view = await self.services.runs.get(TENANT, run_id)
            if check(view):
                return view
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"timed out waiting for the run to {what}: {view}")
            await asyncio.sleep(0.02)


def _now() -> Any:
    return SystemClock().now()


CONFIG = RuntimeConfig(poll_interval=0.05, lease_seconds=30.0, stop_grace=2.0)


@pytest.fixture
def make_engine(
    store: Store,
) -> Callable[..., Any]:
    """`async with make_engine(client, server_key=KEY) as engine:` a runtime for that app."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def make(client: Client, *, server_key: str = KEY) -> AsyncIterator[BridgeEngine]:
        drivers: list[BridgeDriver] = []

        def setup(runtime: Runtime) -> None:
            transport = httpx.ASGITransport(app=BridgeApp(client))
            drivers.append(install(runtime, keys=SigningKeys(server_key), transport=transport))

        actions = default_registry()
        async with Runtime.start(store, config=CONFIG, actions=actions, setup=setup) as runtime:
            engine = BridgeEngine(store=store, runtime=runtime, driver=drivers[0])
            await engine.register(client)
            yield engine

    return make
