"""Fixtures for the ledger in the server: an in-process app on either backend with two
tenants and a manual clock, and an opened store of each backend."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from ductor_server import Settings
from ductor_server.composition import build
from ductor_server.engine.clock import ManualClock
from ductor_server.storage import Store, open_store
from ductor_server.testing import TenantApi, served

RECEIPT_KEY = "test-2030 " + base64.b64encode(bytes(range(32))).decode()
"""The receipt signing key of these tests' servers (`KEY_ID BASE64_SEED`)."""


class Api(TenantApi):
    """The tenants' client, with the app's clock and a few ledger helpers."""

    def __init__(
        self,
        client: AsyncTestClient[Any],
        keys: tuple[str, str],
        store: Store,
        clock: ManualClock,
        backend: str,
    ) -> None:
        super().__init__(client, keys, store, backend)
        self.clock = clock

    async def open(self, code: str, kind: str = "liability", **fields: Any) -> Any:
        body = {"code": code, "currency": "USD", "kind": kind, **fields}
        return await self.ok("POST", "/v1/accounts", json=body)

    async def balance(self, code: str, *, as_b: bool = False) -> Any:
        return await self.ok("GET", f"/v1/accounts/{code}", as_b=as_b)


def _settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    database_url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    return Settings(
        data_dir=tmp_path,
        database_url=database_url,
        roles=("api",),
        receipt_key=RECEIPT_KEY,
    )


@pytest.fixture(params=["sqlite", "postgres"])
async def api(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Api]:
    settings = _settings(request, tmp_path)
    clock = ManualClock()
    async with served(build(settings, clock=clock)) as (client, keys, store):
        yield Api(client, keys, store, clock, request.param)


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """An opened, migrated store of each backend in turn."""
    target = (
        request.getfixturevalue("postgres_url")
        if request.param == "postgres"
        else str(tmp_path / "ductor.db")
    )
    opened = open_store(target)
    await opened.open()
    await opened.migrate()
    try:
        yield opened
    finally:
        await opened.close()
