"""Fixtures for routing in the server: an in-process app on either backend with two
tenants, and an engine whose `route` handler is the routing service."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from ductor_core.expressions import engine_by_name
from ductor_server.cli_server import create_key
from ductor_server.composition import build_services
from ductor_server.engine.actions import default_registry
from ductor_server.engine.clock import ManualClock
from ductor_server.engine.runtime import Runtime, RuntimeConfig
from ductor_server.services import AssignmentView, RoutingService, RunView, Services
from ductor_server.services.route_step import RouteStep
from ductor_server.storage import Store, open_store


class Api:
    """A test client plus two tenants' keys and a store of the test's own."""

    def __init__(self, client: AsyncTestClient[Any], key_a: str, key_b: str, store: Any) -> None:
        self.client = client
        self.store = store
        self.a = {"Authorization": f"Bearer {key_a}"}
        self.b = {"Authorization": f"Bearer {key_b}"}

    async def call(
        self,
        method: str,
        path: str,
        *,
        headers: dict[str, str] | None = None,
        as_b: bool = False,
        **kwargs: Any,
    ) -> Any:
        sent = dict(self.b if as_b else self.a)
        sent.update(headers or {})
        return await self.client.request(method, path, headers=sent, **kwargs)

    async def ok(self, method: str, path: str, **kwargs: Any) -> Any:
        response = await self.call(method, path, **kwargs)
        assert response.status_code in (200, 201, 204), response.text
        return response.json() if response.content else None


@pytest.fixture
async def api(served: tuple[AsyncTestClient[Any], Store]) -> Api:
    client, store = served
    key_a = await create_key(store, "tenant-a", name="a")
    key_b = await create_key(store, "tenant-b", name="b")
    return Api(client, key_a, key_b, store)


TENANT = "t_route"


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """An opened, migrated store on each backend in turn, with one tenant."""
    target = (
        request.getfixturevalue("postgres_url")
        if request.param == "postgres"
        else str(tmp_path / "ductor.db")
    )
    opened = open_store(target)
    await opened.open()
    try:
        await opened.migrate()
        async with opened.transaction() as tx:
            await tx.ensure_tenant(TENANT, name="Route", now=ManualClock().now())
        yield opened
    finally:
        await opened.close()


@dataclass
class Engine:
    """A Runtime on a manual clock whose `route` handler is the routing service's."""

    store: Store
    clock: ManualClock
    runtime: Runtime
    routing: RoutingService
    services: Services

    async def wait_run(
        self, run_id: str, predicate: Callable[[RunView], bool] | None = None, what: str = "end"
    ) -> RunView:
        """Poll until `predicate` holds for the run (default: it ended); fail after 20 s."""
        check = predicate or (lambda r: r.status.terminal)
        deadline = asyncio.get_running_loop().time() + 20.0
        while True:
            view = await self.services.runs.get(TENANT, run_id)
            if check(view):
                return view
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {view}")
            await asyncio.sleep(0.01)

    async def open_assignment(self, routable_id: str, *, after: int = 0) -> AssignmentView:
        """Wait for the routable's assignment number `after` + 1 to exist and be open."""
        deadline = asyncio.get_running_loop().time() + 20.0
        while True:
            found = await self.routing.assignments_of(TENANT, routable_id)
            if len(found) > after and found[after].status == "assigned":
                return found[after]
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"no assignment #{after + 1} for {routable_id}: {found}")
            await asyncio.sleep(0.01)

    def advance(self, seconds: float) -> None:
        """Move the manual clock (retry backoffs) and wake the loops."""
        self.clock.advance(timedelta(seconds=seconds))
        self.runtime.wake()


@pytest.fixture
async def engine(store: Store) -> AsyncIterator[Engine]:
    """Every engine role on a manual clock, with RouteStep registered as `route`."""
    clock = ManualClock(datetime(2026, 11, 29, 12, 0, tzinfo=UTC))
    actions = default_registry()
    routing = RoutingService(store, engine=engine_by_name("cel-rust"), clock=clock)
    actions.register("route", RouteStep(routing, poll_interval=0.02))
    config = RuntimeConfig(poll_interval=0.05, lease_seconds=30.0, stop_grace=0.5)
    async with Runtime.start(store, config=config, clock=clock, actions=actions) as runtime:
        services = build_services(runtime)
        yield Engine(store=store, clock=clock, runtime=runtime, routing=routing, services=services)
