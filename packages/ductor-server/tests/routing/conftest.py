"""Fixtures for routing in the server: an in-process app on either backend, two tenants."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from ductor_server import Settings, create_app
from ductor_server.cli_server import create_key
from ductor_server.storage import open_store


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


@pytest.fixture(params=["sqlite", "postgres"])
async def api(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Api]:
    database_url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    settings = Settings(data_dir=tmp_path, database_url=database_url, poll_interval=0.05)
    async with AsyncTestClient(app=create_app(settings)) as client:
        store = open_store(settings.store_target)
        await store.open()
        try:
            key_a = await create_key(store, "tenant-a", name="a")
            key_b = await create_key(store, "tenant-b", name="b")
            yield Api(client, key_a, key_b, store)
        finally:
            await store.close()
