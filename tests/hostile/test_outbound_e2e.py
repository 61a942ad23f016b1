"""The outbound guard in a real `ductor serve` with no allowed range: a workflow's
`http` step aimed at the server's own host fails as `outbound.forbidden` without
a byte sent, and so does asking an app on loopback to register; the same server
with the range allowed reaches the sink."""

from __future__ import annotations

import json
from typing import Any

import pytest


def _probe(url: str) -> dict[str, Any]:
    return {
        "family_slug": "probe",
        "steps": [
            {
                "ref": "call",
                "type": "STEP_TYPE_ACTION",
                "args": {"action": "http", "params": {"url": json.dumps(url), "method": '"POST"'}},
                "retry": {"max_attempts": 3, "initial_interval": "1s"},
            }
        ],
        "edges": [],
    }


@pytest.mark.parametrize("allow", ["", "127.0.0.0/8,::1"])
def test_a_tenant_cannot_reach_loopback_unless_the_operator_allows_it(
    make_server: Any, postgres_url: str, sink: Any, allow: str
) -> None:
    env = {"DUCTOR_OUTBOUND_ALLOW": allow, "DUCTOR_BRIDGE_SIGNING_KEY": "k" * 32}
    server = make_server("guarded", database_url=postgres_url, env=env)
    server.start()
    # The sink, and the same port through other spellings of loopback.
    port = sink.url.rsplit(":", 1)[1]
    targets = [f"{sink.url}/ok", f"http://localhost:{port}/ok", f"http://2130706433:{port}/ok"]
    with server.client() as http:
        for n, url in enumerate(targets):
            definition = {**_probe(url), "family_slug": f"probe-{n}"}
            assert http.post("/v1/workflows", json=definition).status_code == 201
        runs = [
            http.post("/v1/runs", json={"family_slug": f"probe-{n}"}).json()["id"]
            for n in range(len(targets))
        ]
        sync = http.post("/v1/bridge/apps", json={"url": f"{sink.url}/bridge"})
    finished = [server.wait_for_run(run_id, timeout=60) for run_id in runs]
    if allow:
        assert [r["status"] for r in finished] == ["RUN_STATUS_SUCCEEDED"] * 3
        assert len(sink.deliveries) == 4  # and the sync request, answered badly by the sink
        assert sync.json()["code"] == "bridge.app_call_failed"
        return
    for run in finished:
        assert run["status"] == "RUN_STATUS_FAILED", run
        step = run["steps"][0]
        assert step["error"]["code"] == "outbound.forbidden", step
        assert step["attempt"] == 1  # refused, not retried
    assert sink.deliveries == []
    assert sync.status_code == 422, sync.text
    assert sync.json()["code"] == "outbound.forbidden"
