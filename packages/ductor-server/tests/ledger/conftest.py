"""Fixtures for the ledger in the server: an in-process app on either backend with two
tenants and a manual clock, and an opened store of each backend."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from ductor_server import Settings, create_app
from ductor_server.cli_server import create_key
from ductor_server.composition import build
from ductor_server.engine.clock import ManualClock
from ductor_server.storage import Store, open_store

RECEIPT_KEY = "test-2030 " + base64.b64encode(bytes(range(32))).decode()
"""The receipt signing key of these tests' servers (`KEY_ID BASE64_SEED`)."""


class Api:
    """A test client, two tenants' keys, the app's clock and a store of the test's own."""

    def __init__(
        self,
        client: AsyncTestClient[Any],
        keys: tuple[str, str],
        store: Store,
        clock: ManualClock,
        backend: str,
    ) -> None:
        self.client = client
        self.store = store
        self.clock = clock
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
        assert response.status_code in (200, 201), response.text
        return response.json()

    async def fails(self, method: str, path: str, status: int, code: str, **kwargs: Any) -> Any:
        response = await self.call(method, path, **kwargs)
        assert response.status_code == status, response.text
        body = response.json()
        assert body["code"] == code, body
        return body

    async def open(self, code: str, kind: str = "liability", **fields: Any) -> Any:
        body = {"code": code, "currency": "USD", "kind": kind, **fields}
        return await self.ok("POST", "/v1/accounts", json=body)

    async def balance(self, code: str, *, as_b: bool = False) -> Any:
        return await self.ok("GET", f"/v1/accounts/{code}", as_b=as_b)

    async def count(self, sql: str, *params: Any) -> int:
        async with self.store.transaction() as tx:
            row = await tx.session.fetch_one(sql, params)
        assert row is not None
        return int(row[0] or 0)


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
    composition = build(settings, clock=clock)
    async with AsyncTestClient(app=create_app(composition=composition)) as client:
        store = open_store(settings.store_target)
        await store.open()
        try:
            keys = (
                await create_key(store, "tenant-a", name="a"),
                await create_key(store, "tenant-b", name="b"),
            )
            yield Api(client, keys, store, clock, request.param)
        finally:
            await store.close()


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
