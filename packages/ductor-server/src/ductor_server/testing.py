"""Testing against the app in process: `served` runs a composition under Litestar's
test client with two tenants ("tenant-a" and "tenant-b") and their API keys, and
`TenantApi` calls it as either tenant. For the project's own suites and for
applications that embed the server; nothing else imports this module."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from litestar.testing import AsyncTestClient

from ductor_server import Settings, create_app
from ductor_server.cli_server import create_key
from ductor_server.composition import Composition
from ductor_server.storage import Store, open_store


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


__all__ = ["TenantApi", "served"]
