"""Receipts through the REST API on both backends: read one (another tenant's is 404),
list and filter with a cursor, the public key set without auth, and a receipt
issued in the transaction that ends a succeeded run (none for a failed one)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

from ductor_server.services.receipts import receipt_id_for
from ductor_settlement import (
    Cost,
    Subject,
    SubjectKind,
    decode_envelope,
    load_public_keys,
    verify_receipt,
)

from .conftest import ONE_STEP, Api

FAILING: dict[str, Any] = {
    "family_slug": "fails",
    "title": "Fails",
    "steps": [
        {
            "ref": "divide",
            "type": "STEP_TYPE_DATAFLOW",
            "args": {"operation": "project", "project": {"x": "1 / (size(input) - size(input))"}},
        }
    ],
    "edges": [],
}


async def _issue(api: Api, tenant: str, kind: SubjectKind, subject_id: str, at: int) -> str:
    async with api.store.transaction() as tx:
        view = await api.receipts.issue_in(
            tx,
            tenant,
            Subject(kind=kind, id=subject_id),
            cost=Cost(micros=at, currency="USD"),
            now=datetime(2030, 1, 1, 0, 0, at, tzinfo=UTC),
        )
    assert view is not None
    return view.id


async def test_a_receipt_is_read_by_its_tenant_only(api: Api) -> None:
    receipt_id = await _issue(api, "tenant-a", SubjectKind.ASSIGNMENT, "asg_1", 1)
    view = await api.ok("GET", f"/v1/receipts/{receipt_id}")
    assert (
        view["id"]
        == receipt_id
        == receipt_id_for("tenant-a", Subject(kind=SubjectKind.ASSIGNMENT, id="asg_1"))
    )
    assert view["subject"] == {"kind": "assignment", "id": "asg_1"}
    assert view["key_id"] == "k1"
    assert view["receipt"]["cost"] == {"micros": 1, "currency": "USD"}
    assert view["envelope"]["payloadType"] == "application/vnd.ductor.receipt+json"
    assert view["digest"].startswith("sha256:")
    # The envelope as served verifies with the served key set.
    keys = load_public_keys((await api.client.get("/.well-known/ductor-keys")).content)
    receipt = verify_receipt(decode_envelope(json.dumps(view["envelope"])), keys)
    assert receipt.id == receipt_id

    body = await api.fails("GET", f"/v1/receipts/{receipt_id}", 404, "receipt.not_found", as_b=True)
    assert body["details"] == {"receipt": receipt_id}
    await api.fails("GET", "/v1/receipts/rct_nothing", 404, "receipt.not_found")
    assert (await api.ok("GET", "/v1/receipts", as_b=True))["items"] == []


async def test_receipts_are_listed_newest_first_filtered_and_paged(api: Api) -> None:
    made = [
        await _issue(api, "tenant-a", SubjectKind.ASSIGNMENT, f"asg_{i}", i) for i in range(1, 4)
    ]
    run_receipt = await _issue(api, "tenant-a", SubjectKind.RUN, "run_x", 10)
    await _issue(api, "tenant-b", SubjectKind.ASSIGNMENT, "asg_1", 11)

    page = await api.ok("GET", "/v1/receipts", params={"kind": "assignment", "limit": 2})
    assert [v["id"] for v in page["items"]] == [made[2], made[1]]
    rest = await api.ok(
        "GET", "/v1/receipts", params={"kind": "assignment", "cursor": page["next_cursor"]}
    )
    assert [v["id"] for v in rest["items"]] == [made[0]]
    assert rest["next_cursor"] is None

    everything = await api.ok("GET", "/v1/receipts")
    assert [v["id"] for v in everything["items"]] == [run_receipt, *reversed(made)]
    one = await api.ok("GET", "/v1/receipts", params={"subject": "run:run_x"})
    assert [v["id"] for v in one["items"]] == [run_receipt]
    none = await api.ok("GET", "/v1/receipts", params={"subject": "run:asg_1"})
    assert none["items"] == []

    for params in ({"subject": "asg_1"}, {"subject": "lead:1"}, {"kind": "lead"}):
        await api.fails("GET", "/v1/receipts", 422, "request.invalid", params=params)
    await api.fails("GET", "/v1/receipts", 422, "request.invalid", params={"cursor": "nope"})
    await api.fails("GET", "/v1/receipts", 422, "request.invalid", params={"limit": 501})


async def test_the_public_keys_need_no_auth_and_hold_no_private_part(api: Api) -> None:
    response = await api.client.get("/.well-known/ductor-keys")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    jwks = response.json()
    assert [k["kid"] for k in jwks["keys"]] == ["k1"]
    assert [set(k) for k in jwks["keys"]] == [{"kty", "crv", "kid", "x", "alg", "use"}]
    public = api.ring.public_keys()["k1"]
    assert load_public_keys(response.content)["k1"] == public
    seed = base64.b64encode(api.ring.active.seed()).decode()
    assert seed not in response.text
    # The /v1 routes still want a key.
    assert (await api.client.get("/v1/receipts")).status_code == 401


async def test_a_succeeded_run_gets_a_receipt_in_the_transaction_that_ends_it(api: Api) -> None:
    run = await api.run_to_end(ONE_STEP)
    assert run["status"] == "RUN_STATUS_SUCCEEDED"
    page = await api.ok("GET", "/v1/receipts", params={"subject": f"run:{run['id']}"})
    [view] = page["items"]
    version = await api.ok("GET", "/v1/workflows/greet/versions/1")
    assert view["receipt"]["definition_hash"] == version["hash"]
    assert view["receipt"]["subject"] == {"kind": "run", "id": run["id"]}
    assert view["receipt"]["tenant_id"] == "tenant-a"
    assert view["receipt"]["cost"] == {"micros": 0, "currency": "USD"}
    verify_receipt(decode_envelope(json.dumps(view["envelope"])), api.ring.public_keys())
    assert view["created_at"] == run["finished_at"]

    failed = await api.run_to_end(FAILING)
    assert failed["status"] == "RUN_STATUS_FAILED", failed
    assert await api.count("SELECT COUNT(*) FROM receipts WHERE subject_id = %s", failed["id"]) == 0
    assert await api.count("SELECT COUNT(*) FROM receipts") == 1
