"""`/readyz` tells the truth: 503 while the database refuses connections, 200 again after."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
from litestar.testing import AsyncTestClient

from ductor_server import Settings, create_app
from ductor_server.pytest_plugin import admin_database_url


def _set_connections(database_url: str, *, allowed: bool) -> None:
    name = urlsplit(database_url).path.lstrip("/")
    with psycopg.connect(admin_database_url(), autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS {str(allowed).lower()}')
        if not allowed:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )


async def test_readyz_follows_the_database(tmp_path: Path, postgres_url: str) -> None:
    settings = Settings(data_dir=tmp_path, database_url=postgres_url, poll_interval=0.2)
    async with AsyncTestClient(app=create_app(settings)) as client:
        assert (await client.get("/readyz")).status_code == 200
        _set_connections(postgres_url, allowed=False)
        try:
            down = await client.get("/readyz")
            assert down.status_code == 503, down.text
            body = down.json()
            assert body["status"] == "unavailable"
            assert body["checks"]["store"].startswith("error")
            assert body["checks"]["queue"].startswith("error")
            assert (await client.get("/healthz")).status_code == 200  # alive, not ready
        finally:
            _set_connections(postgres_url, allowed=True)
        deadline = time.monotonic() + 20
        while (await client.get("/readyz")).status_code != 200:
            assert time.monotonic() < deadline, "readyz did not recover"
            await asyncio.sleep(0.2)
