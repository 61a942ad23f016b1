"""The fair queue's limits, end to end, across two real server processes (an API
and coordinator process, and a worker process) on Postgres and a Redis of the
test's own:

- the operators' API: only the operator key gets in; hostile and malformed
  policies are refused with their pointers and nothing is stored; concurrent
  duplicate changes are one change;
- a tenant's policy set through the API process is applied by the worker
  process at once, without a restart;
- a definition's per-key `concurrency` limit holds for every key while Redis is
  flushed, killed and started again mid-load, and every run's call happens once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from .conftest import PrivateRedis, ServerProcess
from .test_fairness_e2e import TimingSink, _trigger_many

# Kills and flushes under load: these run alone, after the parallel part of the suite.
pytestmark = pytest.mark.serial

OPERATOR_KEY = "op-" + "k" * 29
CALL_MS = 300


def _one_call(slug: str, url: str, **extra: Any) -> dict[str, Any]:
    return {
        "family_slug": slug,
        "steps": [
            {
                "ref": "call",
                "type": "STEP_TYPE_ACTION",
                "args": {"action": "http", "params": {"url": url, "method": '"POST"'}},
                "retry": {"max_attempts": 5, "initial_interval": "1s"},
            }
        ],
        **extra,
    }


def _wait_all(server: ServerProcess, run_ids: list[str], timeout: float) -> list[dict[str, Any]]:
    return [server.wait_for_run(run_id, timeout=timeout) for run_id in run_ids]


def test_operator_policies_and_per_key_limits_hold_across_processes_and_redis_faults(
    make_server: Callable[..., ServerProcess],
    postgres_url: str,
    private_redis: PrivateRedis,
) -> None:
    sink = TimingSink()
    try:
        _check(make_server, postgres_url, private_redis, sink)
    finally:
        sink.close()


def _check(
    make_server: Callable[..., ServerProcess],
    postgres_url: str,
    private_redis: PrivateRedis,
    sink: TimingSink,
) -> None:
    env = {
        "DUCTOR_REDIS_URL": private_redis.url,
        "DUCTOR_REDIS_PREFIX": "limits:",
        "DUCTOR_OPERATOR_KEY": OPERATOR_KEY,
        "DUCTOR_LEASE_SECONDS": "30",
    }
    api = make_server("api", database_url=postgres_url, env=env)
    api.start("--roles", "api,coordinator,timer")
    worker = make_server("worker", database_url=postgres_url, env=env)
    worker.api_key = api.api_key
    worker.start("--roles", "worker")
    admin = httpx.Client(
        base_url=api.url, headers={"Authorization": f"Bearer {OPERATOR_KEY}"}, timeout=30
    )
    policy_url = "/v1/admin/tenants/acme/queue-policy"

    # --- who may call: the operator key only --------------------------------------
    assert httpx.get(api.url + policy_url).status_code == 401
    with api.client() as tenant:
        refused = tenant.put(policy_url, json={"weight": 1000})
    assert refused.status_code == 401
    assert refused.json()["code"] == "auth.unauthenticated"
    wrong = httpx.get(api.url + policy_url, headers={"Authorization": "Bearer " + "x" * 32})
    assert wrong.status_code == 401
    assert admin.get(policy_url).json()["source"] == "default"

    # --- hostile and malformed policies: refused where they are wrong --------------
    bad = admin.put(policy_url, json={"weight": 0, "tier": 12, "rate": -1, "workflows": {"x": 0}})
    assert bad.status_code == 422
    assert bad.json()["code"] == "request.invalid"
    pointers = [p["pointer"] for p in bad.json()["details"]["problems"]]
    assert pointers == ["/weight", "/tier", "/rate", "/workflows/x"]
    unknown = admin.put(policy_url, json={"wieght": 2})
    assert unknown.status_code == 422
    assert "wieght" in unknown.text
    assert admin.put(policy_url, json={"weight": 2**70}).status_code == 422
    too_many = {f"w{i}": 1 for i in range(101)}
    assert admin.put(policy_url, json={"workflows": too_many}).status_code == 422
    huge = admin.put(
        policy_url,
        content=b'{"workflows": {"' + b"x" * 2_000_000 + b'": 1}}',
        headers={"Content-Type": "application/json"},
    )
    assert huge.status_code == 413
    assert admin.put(f"/v1/admin/tenants/{'t' * 201}/queue-policy", json={}).status_code == 422
    nul = admin.put("/v1/admin/tenants/t%00x/queue-policy", json={})
    assert nul.status_code == 422
    assert nul.json()["details"]["path"] == "tenant"
    assert admin.get(policy_url).json()["source"] == "default"  # nothing was stored
    assert admin.get("/v1/admin/queue-policies").json()["tenants"] == []

    # --- concurrent duplicate changes: one is the change, the others find it -----
    with ThreadPoolExecutor(8) as pool:
        statuses = sorted(
            pool.map(lambda _: admin.put(policy_url, json={"weight": 3}).status_code, range(8))
        )
    assert statuses == [200] * 7 + [201]
    listed = admin.get("/v1/admin/queue-policies").json()
    assert [(t["tenant"], t["policy"]["weight"]) for t in listed["tenants"]] == [("acme", 3)]
    assert admin.delete(policy_url).json()["source"] == "default"

    # --- a policy set in the API process holds in the running worker process -----
    with api.client() as http:
        assert (
            http.post(
                "/v1/workflows",
                json=_one_call("plain", json.dumps(f"{sink.url}/sleep/{CALL_MS}/plain")),
            ).status_code
            == 201
        )
    put = admin.put(policy_url, json={"max_running": 1})
    assert put.status_code == 201
    assert put.json()["policy"]["max_running"] == 1
    # The announcement reaches the worker through Redis in milliseconds; without
    # it, the worker would still read the change within 5 seconds.
    time.sleep(0.5)
    plain = _trigger_many(api, api.api_key, "plain", 6)
    assert all(r["status"] == "RUN_STATUS_SUCCEEDED" for r in _wait_all(api, plain, 60))
    assert sink.peak_in_flight("plain") == 1
    assert admin.delete(policy_url).status_code == 200

    # --- a definition's per-key limit, through a flush and a restart of Redis ----
    limited = _one_call(
        "per-customer",
        f"'{sink.url}/sleep/{CALL_MS}/' + input.customer",
        concurrency={"limit": 2, "key": "input.customer"},
    )
    with api.client() as http:
        broken = http.post("/v1/workflows", json={**limited, "concurrency": {"limit": 0}})
        assert broken.status_code == 422
        assert [p["pointer"] for p in broken.json()["details"]] == ["/concurrency/limit"]
        assert http.post("/v1/workflows", json=limited).status_code == 201

        def trigger(count: int) -> list[str]:
            # One batch: the whole backlog is there at once, so the limit is what
            # holds each key back.
            body = {
                "runs": [
                    {"family_slug": "per-customer", "input": {"customer": customer}}
                    for _ in range(count // 2)
                    for customer in ("ann", "bob")
                ]
            }
            response = http.post("/v1/runs/batch", json=body)
            assert response.status_code == 201, response.text
            return [run["id"] for run in response.json()["runs"]]

        runs = trigger(24)
        time.sleep(0.5)
        in_use = int(private_redis.cli("DBSIZE") or 0)
        assert private_redis.cli("FLUSHALL") == "OK"
        runs += trigger(12)
        time.sleep(0.5)
        private_redis.kill9()
        runs += trigger(12)
        time.sleep(1.0)
        private_redis.start()
        runs += trigger(12)
    assert in_use > 0, "the queue kept nothing in Redis: nothing was tested"
    ended = _wait_all(api, runs, 120)
    assert all(r["status"] == "RUN_STATUS_SUCCEEDED" for r in ended)
    for customer in ("ann", "bob"):
        assert len(sink.calls_of(customer)) == 30, customer  # each run's call once
        assert sink.peak_in_flight(customer) <= 2, customer
    print(
        f"\nper-key limit 2 through FLUSHALL and a Redis restart: peak in flight"
        f" ann {sink.peak_in_flight('ann')}, bob {sink.peak_in_flight('bob')}"
    )
    admin.close()
