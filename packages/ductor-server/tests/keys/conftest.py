"""The `store` fixture: every key and tenant test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ductor_server.storage import Store, open_store


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """An open, migrated store of the parametrized backend."""
    if request.param == "sqlite":
        target = str(tmp_path / "ductor.db")
    else:
        target = request.getfixturevalue("postgres_url")
    opened = open_store(target)
    await opened.open()
    await opened.migrate()
    try:
        yield opened
    finally:
        await opened.close()
