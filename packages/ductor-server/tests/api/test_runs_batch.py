"""Batch starts (`POST /v1/runs/batch`) on both backends: many runs in one
transaction, all or none; run keys and the batch key make a retry start nothing
twice; refusals point at the run; runs started together all complete."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from ductor_server.cli_server import create_key
from ductor_server.storage import Store

DOUBLE: dict[str, Any] = {
    "family_slug": "double",
    "steps": [
        {
            "ref": "twice",
            "type": "STEP_TYPE_DATAFLOW",
            "args": {"operation": "project", "project": {"n": "input.n * 2"}},
        },
        {"ref": "pause", "type": "STEP_TYPE_WAIT", "args": {"duration": "1ms"}},
    ],
    "edges": [{"source_ref": "twice", "target_ref": "pause"}],
}


class Client:
    def __init__(self, client: AsyncTestClient[Any], keys: tuple[str, str], store: Any) -> None:
        self.client = client
        self.store = store
        self.a = {"Authorization": f"Bearer {keys[0]}"}
        self.b = {"Authorization": f"Bearer {keys[1]}"}

    async def batch(
        self, runs: list[dict[str, Any]], *, key: str | None = None, as_b: bool = False
    ) -> Any:
        headers = dict(self.b if as_b else self.a)
        if key is not None:
            headers["Idempotency-Key"] = key
        return await self.client.post("/v1/runs/batch", json={"runs": runs}, headers=headers)

    async def count_runs(self) -> int:
        async with self.store.transaction() as tx:
            row = await tx.session.fetch_one("SELECT COUNT(*) FROM runs")
        assert row is not None
        return int(row[0])


@pytest.fixture
async def api(served: tuple[AsyncTestClient[Any], Store]) -> Client:
    client, store = served
    keys = (
        await create_key(store, "tenant-a", name="a"),
        await create_key(store, "tenant-b", name="b"),
    )
    made = Client(client, keys, store)
    published = await client.post("/v1/workflows", json=DOUBLE, headers=made.a)
    assert published.status_code == 201, published.text
    return made


async def test_a_batch_starts_every_run_and_they_complete(api: Client) -> None:
    answer = await api.batch([{"family_slug": "double", "input": {"n": n}} for n in range(50)])
    assert answer.status_code == 201, answer.text
    started = answer.json()
    assert started["created"] == 50
    ids = [r["id"] for r in started["runs"]]
    assert len(set(ids)) == 50
    assert all(r["created"] and r["version"] == 1 for r in started["runs"])
    outputs: dict[str, Any] = {}
    for _ in range(200):
        for run_id in ids:
            if run_id not in outputs:
                run = (await api.client.get(f"/v1/runs/{run_id}", headers=api.a)).json()
                if run["status"] == "RUN_STATUS_SUCCEEDED":
                    outputs[run_id] = next(s for s in run["steps"] if s["ref"] == "twice")["output"]
        if len(outputs) == 50:
            break
        await asyncio.sleep(0.1)
    assert [outputs[i] for i in ids] == [{"n": 2 * n} for n in range(50)]


async def test_keys_make_a_retry_start_nothing_twice(api: Client) -> None:
    runs = [{"family_slug": "double", "input": {"n": n}, "key": f"lead-{n}"} for n in range(3)]
    first = (await api.batch(runs)).json()
    overlap = [*runs[1:], {"family_slug": "double", "input": {"n": 9}, "key": "lead-9"}]
    second = (await api.batch(overlap)).json()
    assert second["created"] == 1
    assert [r["created"] for r in second["runs"]] == [False, False, True]
    assert [r["id"] for r in second["runs"][:2]] == [r["id"] for r in first["runs"][1:]]
    # The batch's own key: the same batch again is the same answer, and its runs
    # are named by the key and their index.
    plain = [{"family_slug": "double", "input": {"n": n}} for n in range(4)]
    keyed = await api.batch(plain, key="batch-7")
    again = await api.batch(plain, key="batch-7")
    assert again.headers.get("Idempotency-Replayed") == "true"
    assert again.json() == keyed.json()
    assert await api.count_runs() == 4 + 4
    conflict = await api.batch(plain[:2], key="batch-7")
    assert conflict.status_code == 422
    assert conflict.json()["code"] == "idempotency.conflict"
    # Concurrent retries of one batch start it once.
    answers = await asyncio.gather(*(api.batch(plain[:3], key="batch-8") for _ in range(8)))
    assert {a.status_code for a in answers} == {201}
    assert len({tuple(r["id"] for r in a.json()["runs"]) for a in answers}) == 1
    assert await api.count_runs() == 8 + 3


async def test_refusals_point_at_the_run_and_start_nothing(api: Client) -> None:
    good = {"family_slug": "double", "input": {"n": 1}}
    for runs, status, code, pointer in (
        ([], 422, "request.invalid", "/runs"),
        ([good] * 501, 422, "request.invalid", "/runs"),
        ([good, {**good, "version": 0}], 422, "request.invalid", "/runs/1/version"),
        ([{**good, "key": "k"}, {**good, "key": "k"}], 422, "request.invalid", "/runs/1/key"),
        ([{**good, "key": ""}], 422, "request.invalid", "/runs/0/key"),
        ([good, {"family_slug": "nope"}], 404, "workflow.not_found", "/runs/1"),
        ([good, {**good, "version": 7}], 404, "workflow.version_not_found", "/runs/1"),
    ):
        answer = await api.batch(runs)
        assert answer.status_code == status, answer.text
        assert answer.json()["code"] == code
        assert answer.json()["details"]["pointer"] == pointer, answer.json()
    unknown = await api.client.post(
        "/v1/runs/batch", json={"runs": [{**good, "extra": 1}]}, headers=api.a
    )
    assert unknown.status_code == 422
    # Another tenant has no such workflow.
    other = await api.batch([good], as_b=True)
    assert other.status_code == 404
    assert await api.count_runs() == 0
