"""The `store` fixture: every storage test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ductor_server.storage import Store, open_store


@pytest.fixture(params=["sqlite", "postgres"])
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the store lives: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "ductor.db")
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
async def store(store_target: str) -> AsyncIterator[Store]:
    """An open, migrated store of the parametrized backend."""
    opened = open_store(store_target)
    await opened.open()
    await opened.migrate()
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def pg_store(postgres_url: str) -> AsyncIterator[Store]:
    """An open, migrated Postgres store, for behaviour only Postgres has (SKIP LOCKED)."""
    opened = open_store(postgres_url)
    await opened.open()
    await opened.migrate()
    try:
        yield opened
    finally:
        await opened.close()
