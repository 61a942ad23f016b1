"""Fixtures for receipts in the server: an in-process app on either backend with two
tenants, a signing ring the test holds too, run receipts on; and an opened store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from ductor_server import Settings
from ductor_server.composition import build
from ductor_server.services.receipts import ReceiptService
from ductor_server.storage import Store, open_store
from ductor_server.testing import TenantApi, served
from ductor_settlement import KeyRing, SigningKey

ONE_STEP: dict[str, Any] = {
    "family_slug": "greet",
    "title": "Greet",
    "steps": [
        {
            "ref": "greet",
            "type": "STEP_TYPE_DATAFLOW",
            "args": {"operation": "project", "project": {"message": '"hello"'}},
        }
    ],
    "edges": [],
}


def ring(*kids: str) -> KeyRing:
    """A ring of fresh keys with these ids; the last one signs."""
    keys = [SigningKey.generate(kid) for kid in kids]
    return KeyRing(keys, active=keys[-1].kid)


class Api(TenantApi):
    """The tenants' client, the server's signing ring, and a receipt service of the
    test's own (same database, same ring)."""

    def __init__(
        self,
        client: AsyncTestClient[Any],
        keys: tuple[str, str],
        store: Store,
        ring: KeyRing,
        backend: str,
    ) -> None:
        super().__init__(client, keys, store, backend)
        self.ring = ring
        self.receipts = ReceiptService(store, keys=ring)

    async def run_to_end(self, definition: dict[str, Any]) -> dict[str, Any]:
        """Publish `definition`, start a run of it and wait until it ends."""
        await self.ok("POST", "/v1/workflows", json=definition)
        run = await self.ok("POST", "/v1/runs", json={"family_slug": definition["family_slug"]})
        deadline = asyncio.get_running_loop().time() + 30
        while not run["status"].endswith(("SUCCEEDED", "FAILED", "CANCELLED")):
            assert asyncio.get_running_loop().time() < deadline, run
            await asyncio.sleep(0.05)
            run = await self.ok("GET", f"/v1/runs/{run['id']}")
        return run


def _database(request: pytest.FixtureRequest) -> str | None:
    return request.getfixturevalue("postgres_url") if request.param == "postgres" else None


@pytest.fixture(params=["sqlite", "postgres"])
async def api(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Api]:
    """The app with signing keys and receipts for runs on, every engine role running."""
    settings = Settings(
        data_dir=tmp_path,
        database_url=_database(request),
        poll_interval=0.05,
        receipts_for_runs=True,
    )
    signing = ring("k1")
    async with served(build(settings, receipt_keys=signing)) as (client, keys, store):
        yield Api(client, keys, store, signing, request.param)


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """An opened, migrated store of each backend in turn."""
    opened = open_store(_database(request) or str(tmp_path / "ductor.db"))
    await opened.open()
    await opened.migrate()
    try:
        yield opened
    finally:
        await opened.close()
