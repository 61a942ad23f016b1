"""The CEL engine of routing (and every expression) is chosen at the server edge
(DUCTOR_CEL_ENGINE)."""

from __future__ import annotations

from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient

from ductor_server import Settings, create_app
from ductor_server.cli_server import create_key
from ductor_server.storage import open_store


def test_the_engine_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DUCTOR_CEL_ENGINE", raising=False)
    assert Settings.from_env().cel_engine == "cel-rust"
    monkeypatch.setenv("DUCTOR_CEL_ENGINE", "cel-python")
    assert Settings.from_env().cel_engine == "cel-python"


@pytest.mark.parametrize("engine", ["cel-rust", "cel-python"])
async def test_rules_with_cel_route_on_either_engine(engine: str, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, cel_engine=engine, poll_interval=0.05)
    async with AsyncTestClient(app=create_app(settings)) as client:
        store = open_store(settings.store_target)
        await store.open()
        try:
            key = await create_key(store, "t", name="t")
        finally:
            await store.close()
        auth = {"Authorization": f"Bearer {key}"}
        assert client.app.state.services.routing.engine.name == engine
        await client.post("/v1/workers", json={"id": "w"}, headers=auth)
        await client.post(
            "/v1/pools", json={"id": "big", "members": [{"worker": "w"}]}, headers=auth
        )
        rules = {
            "kinds": {"deal": {}},
            "enrichers": [{"attribute": "large", "expr": "attributes.amount >= 1000"}],
            "rules": [{"id": "large", "pool": "big", "when": "attributes.large"}],
        }
        assert (await client.post("/v1/rules", json=rules, headers=auth)).status_code == 201
        big = await client.post(
            "/v1/route",
            json={"id": "d1", "kind": "deal", "attributes": {"amount": 5000}},
            headers=auth,
        )
        small = await client.post(
            "/v1/route",
            json={"id": "d2", "kind": "deal", "attributes": {"amount": 5}},
            headers=auth,
        )
        assert big.json()["worker"] == "w"
        assert big.json()["explanation"]["enriched"] == {"large": True}
        assert small.json()["outcome"] == "unassigned"
        assert small.json()["explanation"]["rules_not_matched"][0]["reason"] == "when"
