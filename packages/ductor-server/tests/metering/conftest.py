"""Fixtures for metering in the server: an in-process app on either backend with two
tenants and a manual clock, and the engine-less services of each backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from ductor_server import Settings
from ductor_server.composition import build
from ductor_server.engine.clock import ManualClock
from ductor_server.storage import Store
from ductor_server.testing import TenantApi, served

CHAIN = {
    "family_slug": "chain",
    "steps": [{"ref": "a", "type": "STEP_TYPE_ACTION", "args": {"action": "noop"}}],
}
"""A one-step workflow; with only the API role its runs are created, never ticked."""


class Api(TenantApi):
    """The tenants' client and the app's clock."""

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


@pytest.fixture(params=["sqlite", "postgres"])
async def api(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Api]:
    database_url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    settings = Settings(data_dir=tmp_path, database_url=database_url, roles=("api",))
    clock = ManualClock()
    async with served(build(settings, clock=clock)) as (client, keys, store):
        yield Api(client, keys, store, clock, request.param)
