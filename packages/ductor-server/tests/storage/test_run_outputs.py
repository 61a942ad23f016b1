"""Large step outputs are stored once, out of the run's state, and put back on read."""

from __future__ import annotations

from typing import Any

import msgspec

from ductor_core.runs import (
    CancelRequested,
    ItemState,
    RunState,
    RunStatus,
    StepState,
    StepStatus,
)
from ductor_server.storage import NewInboxItem, RunRef, RunUpdate, Store
from ductor_server.storage._outlined import OUTLINE_BYTES, Outlined

from .builders import NOW, at, new_run

BIG = {"text": "x" * (OUTLINE_BYTES + 1)}
OTHER_BIG = ["y" * OUTLINE_BYTES, 1]


def _state(run_id: str, **steps: StepState) -> RunState:
    # The input `new_run` gives: a tick never changes a run's input.
    return RunState(
        run_id=run_id, status=RunStatus.RUNNING, created_at=NOW, steps=steps, input={"n": run_id}
    )


def _done(ref: str, output: Any) -> StepState:
    return StepState(ref=ref, status=StepStatus.SUCCEEDED, attempt=1, output=output)


def _scatter() -> StepState:
    items = [
        ItemState(index=0, status=StepStatus.SUCCEEDED, attempt=1, output=OTHER_BIG),
        ItemState(index=1, status=StepStatus.SUCCEEDED, attempt=1, output=2),
        ItemState(index=2, status=StepStatus.RUNNING, attempt=1),
    ]
    return StepState(ref="fan", status=StepStatus.RUNNING, items=items)


async def _tick(
    store: Store,
    run_id: str,
    state: RunState,
    *,
    version: int,
    seconds: float,
    outlined: Outlined = (),
) -> bool:
    """One guarded state write, as the coordinator makes it."""
    async with store.transaction() as tx:
        [applied] = await tx.update_runs(
            [
                RunUpdate(
                    tenant_id="t1",
                    run_id=run_id,
                    expected_lock_version=version,
                    state=state,
                    updated_at=at(seconds),
                    outlined=outlined,
                )
            ]
        )
    return applied


async def _stored(store: Store, run_id: str) -> tuple[dict[str, Any], Any, int]:
    """The state as the row holds it, its `outlined` column, and the output rows."""
    async with store.transaction() as tx:
        row = await tx.session.fetch_one(
            "SELECT state, outlined FROM runs WHERE tenant_id = 't1' AND id = %s", (run_id,)
        )
        count = await tx.session.fetch_one(
            "SELECT COUNT(*) FROM run_outputs WHERE tenant_id = 't1' AND run_id = %s", (run_id,)
        )
    assert row is not None
    assert count is not None
    outlined = None if row[1] is None else msgspec.json.decode(row[1])
    return msgspec.json.decode(row[0]), outlined, int(count[0])


async def test_a_runs_input_is_kept_in_its_column_alone_and_read_back_as_sent(
    store: Store,
) -> None:
    # Keys out of order and a float that jsonb would print otherwise: the input
    # a tick sees is the JSON as it was sent, on both backends.
    sent = {"z": 1, "a": [2.50, {"y": None, "b": "ünï"}], "m": 10**20}
    run = new_run("t1", "r1")
    run = msgspec.structs.replace(run, state=msgspec.structs.replace(run.state, input=sent))
    async with store.transaction() as tx:
        [inserted] = await tx.insert_runs([run])
    assert inserted.run.state.input == sent
    raw, _, _ = await _stored(store, "r1")
    assert "input" not in raw  # every tick rewrites the state: the input is not in it
    async with store.transaction() as tx:
        got = await tx.get_run("t1", "r1")
        column = await tx.session.fetch_one("SELECT input FROM runs WHERE id = 'r1'")
    assert got is not None
    assert got.state.input == sent
    assert list(got.state.input) == ["z", "a", "m"]
    assert list(got.state.input["a"][1]) == ["y", "b"]
    assert got.input == sent
    assert column is not None
    assert msgspec.json.decode(column[0]) == sent
    # A tick's update leaves it out too, and the next read puts it back.
    ticked = msgspec.structs.replace(got.state, status=RunStatus.SUCCEEDED)
    assert await _tick(store, "r1", ticked, version=got.lock_version, seconds=1)
    raw, _, _ = await _stored(store, "r1")
    assert "input" not in raw
    async with store.transaction() as tx:
        [again] = await tx.get_runs([RunRef(tenant_id="t1", run_id="r1")])
    assert again.state == ticked

    # A state stored before inputs were kept apart holds its own, and is read as is.
    async with store.transaction() as tx:
        await tx.insert_runs([new_run("t1", "old")])
        old_state = msgspec.json.encode(
            msgspec.structs.replace(again.state, run_id="old", input={"kept": "in the state"})
        )
        await tx.session.execute(
            "UPDATE runs SET state = %s WHERE id = 'old'", (old_state.decode(),)
        )
        old = await tx.get_run("t1", "old")
    assert old is not None
    assert old.state.input == {"kept": "in the state"}


async def test_a_large_output_is_stored_once_out_of_the_state_and_read_back(
    store: Store,
) -> None:
    async with store.transaction() as tx:
        await tx.insert_runs([new_run("t1", "r1")])
        [record] = await tx.get_runs([RunRef(tenant_id="t1", run_id="r1")])
    full = _state("r1", big=_done("big", BIG), small=_done("small", {"n": 1}), fan=_scatter())
    assert await _tick(
        store, "r1", full, version=record.lock_version, seconds=1, outlined=record.outlined
    )

    raw, outlined, rows = await _stored(store, "r1")
    assert "output" not in raw["steps"]["big"]
    assert raw["steps"]["small"]["output"] == {"n": 1}
    assert "output" not in raw["steps"]["fan"]["items"][0]
    assert raw["steps"]["fan"]["items"][1]["output"] == 2
    assert outlined == [["big", -1], ["fan", 0]]
    assert rows == 2

    # Every read gives the whole state back.
    async with store.transaction() as tx:
        got = await tx.get_run("t1", "r1")
        [many] = await tx.get_runs([RunRef(tenant_id="t1", run_id="r1")])
        listed = (await tx.list_runs("t1")).items
    assert got is not None
    assert got.state == full
    assert got.outlined == (("big", -1), ("fan", 0))
    assert many.state == full
    assert [r.state for r in listed] == [full]

    # The next tick passes `outlined` back: the stored outputs are not written
    # again (a marker put in their place stays), and a new large one is.
    async with store.transaction() as tx:
        await tx.session.execute(
            "UPDATE run_outputs SET output = %s WHERE step_ref = 'big'",
            (tx.session.to_json("marker"),),
        )
    later = msgspec.structs.replace(full, steps={**full.steps, "last": _done("last", BIG)})
    assert await _tick(
        store, "r1", later, version=got.lock_version, seconds=2, outlined=got.outlined
    )
    async with store.transaction() as tx:
        again = await tx.get_run("t1", "r1")
    raw, outlined, rows = await _stored(store, "r1")
    assert outlined == [["big", -1], ["fan", 0], ["last", -1]]
    assert rows == 3
    assert again is not None
    assert again.state.steps["big"].output == "marker"
    assert again.state.steps["last"].output == BIG


async def test_a_lost_race_writes_no_output(store: Store) -> None:
    async with store.transaction() as tx:
        await tx.insert_runs([new_run("t1", "r1")])
    assert not await _tick(store, "r1", _state("r1", big=_done("big", BIG)), version=7, seconds=1)
    raw, outlined, rows = await _stored(store, "r1")
    assert (outlined, rows) == (None, 0)
    assert "steps" not in raw  # the state as inserted, with no step


async def test_a_run_inserted_with_a_large_output_keeps_it_out_of_its_state(
    store: Store,
) -> None:
    full = _state("r2", big=_done("big", BIG))
    async with store.transaction() as tx:
        [inserted] = await tx.insert_runs(
            [msgspec.structs.replace(new_run("t1", "r2"), state=full)]
        )
        # Claimed through the inbox, as the coordinator reads it.
        await tx.enqueue_inbox(
            [
                NewInboxItem(
                    tenant_id="t1",
                    run_id="r2",
                    input=CancelRequested(reason="test"),
                    available_at=NOW,
                )
            ]
        )
    assert inserted.run.outlined == (("big", -1),)
    assert inserted.run.state == full
    raw, outlined, rows = await _stored(store, "r2")
    assert "output" not in raw["steps"]["big"]
    assert (outlined, rows) == ([["big", -1]], 1)
    async with store.transaction() as tx:
        claimed = await tx.claim_runs(now=at(1), limit=10)
    assert [run.state for run in claimed] == [full]


async def test_a_step_that_is_no_longer_succeeded_leaves_the_list(store: Store) -> None:
    async with store.transaction() as tx:
        [inserted] = await tx.insert_runs(
            [msgspec.structs.replace(new_run("t1", "r3"), state=_state("r3", a=_done("a", BIG)))]
        )
    again = _state("r3", a=StepState(ref="a", status=StepStatus.RUNNING, attempt=2))
    assert await _tick(store, "r3", again, version=0, seconds=1, outlined=inserted.run.outlined)
    async with store.transaction() as tx:
        got = await tx.get_run("t1", "r3")
    _, outlined, _ = await _stored(store, "r3")
    assert outlined is None
    assert got is not None
    assert got.state == again
