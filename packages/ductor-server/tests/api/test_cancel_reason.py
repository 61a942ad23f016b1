"""A cancel's reason is bounded alike over REST and MCP (10,000 characters)."""

from __future__ import annotations

from typing import Any

from litestar.testing import AsyncTestClient

from ductor_server.cli_server import create_key
from ductor_server.storage import Store

WAITS = {
    "family_slug": "waits",
    "steps": [{"ref": "hold", "type": "STEP_TYPE_WAIT_FOR_SIGNAL", "args": {"signal": "go"}}],
}


async def test_a_reason_over_ten_thousand_characters_is_refused_and_changes_nothing(
    served: tuple[AsyncTestClient[Any], Store],
) -> None:
    client, store = served
    auth = {"Authorization": f"Bearer {await create_key(store, 'tenant-a', name='a')}"}
    assert (await client.post("/v1/workflows", json=WAITS, headers=auth)).status_code == 201
    started = await client.post("/v1/runs", json={"family_slug": "waits"}, headers=auth)
    run_id = started.json()["id"]
    path = f"/v1/runs/{run_id}/cancel"
    long = await client.post(path, json={"reason": "r" * 10_001}, headers=auth)
    assert long.status_code == 422, long.text
    assert long.json()["code"] == "request.invalid"
    assert long.json()["details"]["path"] == "$.reason"
    run = (await client.get(f"/v1/runs/{run_id}", headers=auth)).json()
    assert run["cancel_requested"] is False
    kept = await client.post(path, json={"reason": "r" * 10_000}, headers=auth)
    assert kept.status_code == 202, kept.text
