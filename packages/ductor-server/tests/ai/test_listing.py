"""The AI records and agent conversations lists over REST, in process on both
backends: an empty cursor (`?cursor=&limit=`, as docs/ai.md writes them) is the
first page, as on GET /v1/runs; a cursor the API never gave is refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ductor_server import Settings
from ductor_server.composition import build
from ductor_server.connections import new_secret_key
from ductor_server.testing import TenantApi, served


@pytest.fixture(params=["sqlite", "postgres"])
async def api(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[TenantApi]:
    database_url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    settings = Settings(
        data_dir=tmp_path,
        database_url=database_url,
        poll_interval=0.05,
        secret_keys=new_secret_key(),
    )
    async with served(build(settings)) as (client, keys, store):
        yield TenantApi(client, keys, store, request.param)


async def test_an_empty_cursor_is_the_first_page(api: TenantApi) -> None:
    llm = {"base_url": "https://llm.example/v1"}
    connection = {"name": "llm", "provider": "openai", "config": llm, "secrets": {"api_key": "k"}}
    await api.ok("POST", "/v1/connections", json=connection)
    body = {"model": "m", "connection": "llm"}
    started = await api.ok("POST", "/v1/agent/conversations", json=body)
    for path, listed in (
        ("/v1/ai/requests", {"items": [], "next_cursor": None}),
        ("/v1/agent/conversations", None),
    ):
        page = await api.ok("GET", f"{path}?cursor=")
        if listed is not None:
            assert page == listed
        else:
            assert [c["id"] for c in page["items"]] == [started["conversation"]["id"]]
        refused = await api.fails("GET", f"{path}?cursor=zz", 422, "request.invalid")
        assert refused["details"] == {"pointer": "cursor"}
