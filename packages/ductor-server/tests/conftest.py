from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from ductor_server import Settings, create_app
from ductor_server.storage import Store, open_store

pytest_plugins = ["ductor_server.pytest_plugin"]


@pytest.fixture(params=["sqlite", "postgres"])
async def served(
    tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[AsyncTestClient[Any], Store]]:
    """The app on each backend (polling every 50 ms), with a store of the test's
    own on the same database: the app runs its own event loop."""
    database_url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    settings = Settings(data_dir=tmp_path, database_url=database_url, poll_interval=0.05)
    async with AsyncTestClient(app=create_app(settings)) as client:
        store = open_store(settings.store_target)
        await store.open()
        try:
            yield client, store
        finally:
            await store.close()
