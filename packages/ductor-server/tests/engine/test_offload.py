"""Heavy work off the event loop and out of transactions: the lanes bound their
threads; the coordinator ticks with no transaction open and a writer that got
in between wins, the tick being recomputed, never applied twice; an event's
runs start once however many copies of it race."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import os
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ductor_core.runs import RunFinished, RunInput, RunState, RunStatus, SignalReceived, TickResult
from ductor_server.engine.actions import default_registry
from ductor_server.engine.clock import ManualClock
from ductor_server.engine.coordinator import OFFLOAD_DEATHS
from ductor_server.engine.effects import EngineParts
from ductor_server.engine.kinds import Computation, KindTick, PreparedTick, RunKinds
from ductor_server.engine.offload import ENGINE, ISOLATION, Lane
from ductor_server.engine.runtime import Runtime
from ductor_server.storage import NewInboxItem, NewRun, RunRef, RunUpdate, Store
from ductor_server.storage.protocol import Tx
from ductor_server.storage.records import RunRecord

from .conftest import OTHER_TENANT, TENANT, TEST_CONFIG, Engine
from .test_kinds import ECHO, EchoKind

WAIT = 20.0


async def test_a_lane_runs_at_most_its_slots_at_once_and_answers_every_call() -> None:
    lane = Lane("test", 2)
    lock = threading.Lock()
    running = 0
    peak = 0
    release = threading.Event()
    two_in = threading.Event()

    def work(n: int) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
            if running == 2:
                two_in.set()
        release.wait(WAIT)
        with lock:
            running -= 1
        return n * n

    calls = [asyncio.ensure_future(lane.run(work, n)) for n in range(6)]
    assert await asyncio.to_thread(two_in.wait, WAIT)
    await asyncio.sleep(0.02)  # the loop is free meanwhile, and no third call starts
    assert (lane.running, lane.waiting, peak) == (2, 4, 2)
    release.set()
    assert await asyncio.gather(*calls) == [n * n for n in range(6)]
    assert (peak, lane.running, lane.waiting) == (2, 0, 0)


async def test_one_tenant_flooding_a_lane_leaves_a_slot_to_another() -> None:
    lane = Lane("test", 2, processes=False)
    started: list[str] = []
    lock = threading.Lock()
    release = threading.Event()
    two_in = threading.Event()

    def work(who: str) -> str:
        with lock:
            started.append(who)
            if len(started) == 2:
                two_in.set()
        release.wait(WAIT)
        return who

    flood = [asyncio.ensure_future(lane.run_for("a", work, f"a{n}")) for n in range(5)]
    await asyncio.sleep(0.02)
    other = asyncio.ensure_future(lane.run_for("b", work, "b"))
    assert await asyncio.to_thread(two_in.wait, WAIT)
    await asyncio.sleep(0.02)
    # Tenant a holds one slot of two; b, who came after all of a's calls, the other.
    assert sorted(started) == ["a0", "b"], started
    assert (lane.running, lane.waiting) == (2, 0)  # a's others wait for a's turn
    release.set()
    assert await asyncio.gather(*flood, other) == [*(f"a{n}" for n in range(5)), "b"]
    assert lane.running == 0
    assert not lane._on_loop().turns  # no key is kept once done


async def test_a_cancelled_caller_holds_its_slot_until_its_thread_ends() -> None:
    lane = Lane("test", 1)
    release = threading.Event()
    entered = threading.Event()

    def work() -> bool:
        entered.set()
        return release.wait(WAIT)

    call = asyncio.ensure_future(lane.run(work))
    assert await asyncio.to_thread(entered.wait, WAIT)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    follower = asyncio.ensure_future(lane.run(lambda: "next"))
    await asyncio.sleep(0.02)
    assert not follower.done()  # the cancelled call's thread still holds the slot
    release.set()
    assert await follower == "next"


async def test_a_call_that_pickles_runs_in_a_worker_process_and_a_closure_in_a_thread() -> None:
    lane = Lane("test", 1)
    try:
        here = os.getpid()
        there = await lane.run(os.getpid)
        assert there != here
        assert await lane.run(os.getpid) == there  # the process is kept for the next call
        assert await lane.run(lambda: os.getpid()) == here  # a lambda does not pickle
        threads = Lane("test", 1, processes=False)
        assert await threads.run(os.getpid) == here
    finally:
        lane.close()


class GatedEcho(EchoKind):
    """The echo kind with a prepared tick that waits on a gate in its thread."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.computed = 0

    async def prepare_tick(
        self,
        tx: Tx,
        parts: EngineParts,
        run: RunRecord,
        inputs: Sequence[RunInput],
        now: datetime,
    ) -> Callable[[], KindTick]:
        def compute() -> KindTick:
            self.computed += 1
            self.entered.set()
            self.gate.wait(WAIT)
            count = int(run.kind_state["signals"]) + len(inputs)
            state = msgspec.structs.replace(
                run.state, status=RunStatus.SUCCEEDED, output={"signals": count}, finished_at=now
            )
            done = RunFinished(status=RunStatus.SUCCEEDED, output={"signals": count})
            return KindTick(TickResult(state=state, commands=[done]), kind_state={"signals": count})

        return compute


async def test_the_tick_runs_with_no_transaction_open_and_a_lost_race_is_retried_once(
    store: Store,
) -> None:
    clock = ManualClock()
    now = clock.now()
    async with store.transaction() as tx:
        state = RunState(run_id="r1", status=RunStatus.RUNNING, created_at=now)
        await tx.insert_runs(
            [
                NewRun(
                    tenant_id=TENANT,
                    family_slug="echo:x",
                    version=1,
                    state=state,
                    kind=ECHO,
                    kind_state={"signals": 0},
                )
            ]
        )
        await tx.enqueue_inbox(
            [
                NewInboxItem(
                    tenant_id=TENANT,
                    run_id="r1",
                    input=SignalReceived(signal_id="s", name="stop"),
                    available_at=now,
                )
            ]
        )
    gated = GatedEcho()
    assert isinstance(gated, PreparedTick)
    runtime = Runtime(
        store, roles=["coordinator"], config=TEST_CONFIG, clock=clock, kinds=RunKinds([gated])
    )
    batch = asyncio.ensure_future(runtime.coordinator.tick_batch())
    assert await asyncio.to_thread(gated.entered.wait, WAIT)
    # While the tick is in its thread, another writer changes the run. Had the
    # coordinator kept its transaction (and its row lock) open, this would wait
    # for the gate, which only opens after it: the test would hang.
    async with store.transaction() as tx:
        [run] = await tx.get_runs([RunRef(tenant_id=TENANT, run_id="r1")])
        assert await tx.update_runs(
            [
                RunUpdate(
                    tenant_id=TENANT,
                    run_id="r1",
                    expected_lock_version=run.lock_version,
                    state=run.state,
                    updated_at=now,
                    kind_state={"signals": 100},
                )
            ]
        ) == [True]
    gated.gate.set()
    assert await asyncio.wait_for(batch, WAIT) == 1
    ref = RunRef(tenant_id=TENANT, run_id="r1")
    async with store.transaction() as tx:
        lost = await tx.get_run(TENANT, "r1")
        assert lost is not None
        # The other writer's change stands; the input waits for the next round.
        assert (lost.status, lost.kind_state, lost.lock_version) == (
            RunStatus.RUNNING,
            {"signals": 100},
            1,
        )
        assert len(await tx.load_inbox([ref], now=now)) == 1
    assert await runtime.coordinator.tick_batch() == 1
    async with store.transaction() as tx:
        won = await tx.get_run(TENANT, "r1")
        assert won is not None
        assert await tx.load_inbox([ref], now=now) == []
    assert won.status == RunStatus.SUCCEEDED
    assert won.kind_state == {"signals": 101}  # the signal counted once, on the new state
    assert gated.computed == 2
    assert await runtime.coordinator.tick_batch() == 0


FILTERED = {
    "family_slug": "on-order",
    "title": "On order",
    "triggers": [{"event": "order.placed", "filter": "event.data.total > 10"}],
    "steps": [
        {
            "ref": "shape",
            "type": "STEP_TYPE_DATAFLOW",
            "title": "Shape",
            "args": {"operation": "project", "project": {"total": "input.total * 2"}},
        }
    ],
    "edges": [],
}


async def test_copies_of_one_event_racing_start_its_runs_once(engine: Engine) -> None:
    await engine.publish(FILTERED)
    events = engine.services.events

    async def send(total: int, event_id: str) -> Any:
        return (await events.send(TENANT, "order.placed", {"total": total}, event_id)).value

    answers = await asyncio.gather(*(send(42, "evt-race") for _ in range(6)))
    started = [run for answer in answers for run in answer.runs_started]
    assert len(started) == 1
    assert sorted(answer.duplicate for answer in answers) == [False] + [True] * 5
    view = await engine.wait_run(started[0])
    assert view.status == RunStatus.SUCCEEDED
    [shape] = [s for s in view.steps if s.ref == "shape"]
    assert shape.output == {"total": 84}
    # The filter still decides: a small order starts nothing.
    assert (await send(3, "evt-small")).runs_started == []


DYING_TICK = textwrap.dedent(
    """
    import multiprocessing
    import os
    from dataclasses import dataclass


    @dataclass(frozen=True)
    class Dying:
        ticked: object
        die: bool
        marker: str | None = None  # dies only while this file does not exist

        def __call__(self):
            if self.die and multiprocessing.parent_process() is not None:
                if self.marker is None:
                    os._exit(70)
                if not os.path.exists(self.marker):
                    open(self.marker, "w").close()
                    os._exit(70)
            return self.ticked
    """
)


@dataclass
class DyingKind(EchoKind):
    """The echo kind ticked in the engine lane's worker processes, whose tick kills
    the worker process for a run with "die" in its slug (only the first time for
    "die-once")."""

    prefix: str = "dying:"
    kind_name: str = "dying"
    module: Any = None
    marker: str = ""

    async def prepare_tick(
        self,
        tx: Tx,
        parts: EngineParts,
        run: RunRecord,
        inputs: Sequence[RunInput],
        now: datetime,
    ) -> Callable[[], KindTick]:
        ticked = await self.tick(tx, parts, run, inputs, now)
        once = self.marker if "die-once" in run.family_slug else None
        dying = self.module.Dying(ticked, "die" in run.family_slug, once)
        return Computation(dying, inline=False)


@pytest.fixture
def dying_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[DyingKind]:
    """A `DyingKind` whose computation's module the lanes' worker processes import
    (from a path they are started with)."""
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "dying_tick.py").write_text(DYING_TICK)
    monkeypatch.syspath_prepend(str(modules))
    monkeypatch.delitem(sys.modules, "dying_tick", raising=False)
    ENGINE.close()  # its next processes start with the module's path
    ISOLATION.close()
    yield DyingKind(module=importlib.import_module("dying_tick"), marker=str(tmp_path / "died"))
    ENGINE.close()
    ISOLATION.close()


async def test_a_run_whose_tick_kills_its_worker_each_time_fails_and_a_transient_death_does_not(
    store: Store, dying_kind: DyingKind
) -> None:
    clock = ManualClock()
    actions = default_registry()
    config = dataclasses.replace(TEST_CONFIG, coordinator_loops=2)
    isolated = ISOLATION.calls
    async with Runtime.start(
        store,
        config=config,
        clock=clock,
        actions=actions,
        setup=lambda rt: rt.kinds.register(dying_kind),
    ) as runtime:
        engine = Engine(store=store, clock=clock, actions=actions, runtime=runtime)
        runs = engine.services.runs
        bad = (await runs.trigger(TENANT, "dying:die", None, None, "k1")).value
        once = (await runs.trigger(TENANT, "dying:die-once", None, None, "k2")).value
        others = [
            (await runs.trigger(OTHER_TENANT, f"dying:fine-{i}", None, None, f"k{i}")).value
            for i in range(3)
        ]
        # The bad run's input comes first: every batch it is in loses its worker.
        await runs.signal(TENANT, bad.id, "stop", None, "s1")
        for other in others:
            await runs.signal(OTHER_TENANT, other.id, "stop", None, "s2")
        for other in others:
            done = await engine.wait_run(other.id, tenant=OTHER_TENANT)
            assert (done.status, done.output) == (RunStatus.SUCCEEDED, {"signals": 1})
        failed = await engine.wait_run(bad.id)
        assert failed.status == RunStatus.FAILED
        assert failed.error is not None
        assert failed.error.code == "engine.tick_failed"
        assert failed.error.message == (
            "the run's tick could not be computed: its worker process died"
            f" {OFFLOAD_DEATHS} times (engine.offload_failed)"
        )
        # A worker that dies once in a run's tick costs the run nothing.
        await runs.signal(TENANT, once.id, "stop", None, "s3")
        survived = await engine.wait_run(once.id)
        assert (survived.status, survived.output) == (RunStatus.SUCCEEDED, {"signals": 1})
        assert await asyncio.to_thread(Path(dying_kind.marker).exists)  # a worker did die
        assert (TENANT, once.id) not in runtime.coordinator._deaths  # its count is dropped
    # The ticks after a first death ran in the isolation lane.
    assert ISOLATION.calls > isolated
    assert sorted(dying_kind.finished) == sorted(
        [(bad.id, RunStatus.FAILED), (once.id, RunStatus.SUCCEEDED)]
        + [(other.id, RunStatus.SUCCEEDED) for other in others]
    )
