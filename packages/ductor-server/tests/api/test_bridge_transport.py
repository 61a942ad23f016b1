"""The bridge's signed routes in process: answers and errors are signed, a bad wire
message is a signed 400, and an Idempotency-Key replays a sync (signed again)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from ductor.protocol import SIGNATURE_HEADER, DescribeResponse, SigningKeys, encode
from ductor_server import Settings, create_app
from ductor_server.cli_server import create_key
from ductor_server.composition import build
from ductor_server.storage import open_store

KEY = "bridge-transport-key"


class Bridge:
    def __init__(self, client: AsyncTestClient[Any], api_key: str) -> None:
        self.client = client
        self.keys = SigningKeys(KEY)
        self.auth = {"Authorization": f"Bearer {api_key}"}

    async def post(self, path: str, body: bytes, *, key: str | None = None) -> Any:
        headers = {**self.auth, SIGNATURE_HEADER: self.keys.header(body, now=int(time.time()))}
        if key is not None:
            headers["Idempotency-Key"] = key
        response = await self.client.post(path, content=body, headers=headers)
        # Every answer of a signed route is signed, errors included.
        self.keys.verify(
            response.content, response.headers.get(SIGNATURE_HEADER), now=int(time.time())
        )
        return response


@pytest.fixture
async def bridge(tmp_path: Path) -> AsyncIterator[Bridge]:
    settings = Settings(data_dir=tmp_path, poll_interval=0.05)
    app = create_app(composition=build(settings, bridge_keys=SigningKeys(KEY)))
    async with AsyncTestClient(app=app) as client:
        store = open_store(settings.store_target)
        await store.open()
        try:
            api_key = await create_key(store, "t-bridge", name="bridge")
        finally:
            await store.close()
        yield Bridge(client, api_key)


def _describe(version: str = "1.0") -> bytes:
    return encode(DescribeResponse(app_id="shop", sdk="test", sdk_version=version))


async def test_a_sync_with_a_key_is_replayed_and_a_changed_one_conflicts(bridge: Bridge) -> None:
    first = await bridge.post("/v1/bridge/sync", _describe(), key="sync-1")
    assert first.status_code == 200, first.text
    assert first.json() == {"app_id": "shop", "accepted": []}
    assert "Idempotency-Replayed" not in first.headers
    again = await bridge.post("/v1/bridge/sync", _describe(), key="sync-1")
    assert (again.status_code, again.json()) == (200, first.json())
    assert again.headers["Idempotency-Replayed"] == "true"
    changed = await bridge.post("/v1/bridge/sync", _describe("2.0"), key="sync-1")
    assert changed.status_code == 422
    assert changed.json()["code"] == "idempotency.conflict"
    assert changed.json()["retryable"] is False
    apps = await bridge.client.get("/v1/bridge/apps", headers=bridge.auth)
    assert [a["sdk_version"] for a in apps.json()] == ["1.0"]


async def test_a_bad_wire_message_is_a_signed_400(bridge: Bridge) -> None:
    for body in (b'{"app_id": 5}', b"", b"{nope"):
        refused = await bridge.post("/v1/bridge/sync", body)
        assert refused.status_code == 400, (body, refused.text)
        assert refused.json()["code"] == "protocol.invalid"
        assert "DescribeResponse" in refused.json()["message"]


async def test_the_app_routes_are_plain_api_calls(bridge: Bridge) -> None:
    bad = await bridge.client.post("/v1/bridge/apps", json={"url": 5}, headers=bridge.auth)
    assert bad.status_code == 422
    assert bad.json()["details"]["path"] == "$.url"
    assert SIGNATURE_HEADER not in bad.headers
    missing = await bridge.client.post("/v1/bridge/apps/nope/health", headers=bridge.auth)
    assert (missing.status_code, missing.json()["code"]) == (404, "app.not_found")
