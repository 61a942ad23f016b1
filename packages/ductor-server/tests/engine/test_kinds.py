"""The `RunKind` port: a kind plugged in from outside is triggered, ticked (with
its own bookkeeping), started by events and finished through the port; a run of
a kind a process does not know waits for one that does; the registry's rules."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import msgspec
import pytest

from ductor_core.runs import (
    ErrorInfo,
    RunFinished,
    RunInput,
    RunState,
    RunStatus,
    SignalReceived,
    StartChildRun,
    TickResult,
)
from ductor_server.engine import coordinator as coordinator_module
from ductor_server.engine.actions import default_registry
from ductor_server.engine.clock import ManualClock
from ductor_server.engine.coordinator import OFFLOAD_DEATHS, _lasting
from ductor_server.engine.effects import Effects, EngineParts, apply_commands
from ductor_server.engine.errors import DuplicateRunKind, OffloadFailed, UnknownRunKind
from ductor_server.engine.kinds import KindTick, RunKinds
from ductor_server.engine.runtime import Runtime
from ductor_server.errors import WorkflowNotFound
from ductor_server.storage import NewInboxItem, NewRun, RunRef, Store
from ductor_server.storage.errors import StoreError, StoreUnavailable
from ductor_server.storage.protocol import Tx
from ductor_server.storage.records import RunRecord

from .conftest import SUCCEEDED, TENANT, TEST_CONFIG, Engine

ECHO = "echo"


@dataclass
class EchoKind:
    """A toy kind: a run counts the signals it gets in its bookkeeping and ends on
    the signal "stop" with that count; an event "ping" starts one."""

    finished: list[tuple[str, RunStatus]] = field(default_factory=list)
    prefix: str = "echo:"
    kind_name: str = ECHO

    @property
    def name(self) -> str:
        return self.kind_name

    @property
    def slug_prefix(self) -> str | None:
        return self.prefix

    async def _insert(
        self, tx: Tx, effects: Effects, tenant_id: str, slug: str, now: datetime, key: str | None
    ) -> RunRecord:
        state = RunState(
            run_id=f"run_echo_{slug}_{key}", status=RunStatus.RUNNING, input=None, created_at=now
        )
        [inserted] = await tx.insert_runs(
            [
                NewRun(
                    tenant_id=tenant_id,
                    family_slug=slug,
                    version=1,
                    state=state,
                    kind=self.kind_name,
                    kind_state={"signals": 0},
                    idempotency_key=key,
                )
            ]
        )
        return inserted.run

    async def tick(
        self,
        tx: Tx,
        parts: EngineParts,
        run: RunRecord,
        inputs: Sequence[RunInput],
        now: datetime,
    ) -> KindTick:
        count = int(run.kind_state["signals"])
        stop = False
        for item in inputs:
            if isinstance(item, SignalReceived):
                count += 1
                stop = stop or item.name == "stop"
        state, commands = run.state, []
        if stop:
            state = msgspec.structs.replace(
                state, status=RunStatus.SUCCEEDED, output={"signals": count}, finished_at=now
            )
            commands = [RunFinished(status=RunStatus.SUCCEEDED, output={"signals": count})]
        return KindTick(TickResult(state=state, commands=commands), kind_state={"signals": count})

    async def trigger(
        self,
        tx: Tx,
        parts: EngineParts,
        effects: Effects,
        *,
        tenant_id: str,
        family_slug: str,
        version: int | None,
        input: Any,
        now: datetime,
        idempotency_key: str | None = None,
    ) -> RunRecord | None:
        if family_slug == "echo:missing":
            return None
        return await self._insert(tx, effects, tenant_id, family_slug, now, idempotency_key)

    async def start_child(
        self,
        tx: Tx,
        parts: EngineParts,
        effects: Effects,
        *,
        parent: RunRecord,
        command: StartChildRun,
        now: datetime,
        depth: int,
    ) -> ErrorInfo | None:
        return ErrorInfo(code="echo.no_children", message="no", retryable=False)

    async def start_triggered(
        self,
        tx: Tx,
        parts: EngineParts,
        effects: Effects,
        *,
        tenant_id: str,
        event_id: str,
        name: str,
        data: Any,
        now: datetime,
    ) -> list[str]:
        if name != "ping":
            return []
        run = await self._insert(tx, effects, tenant_id, "echo:pinged", now, event_id)
        return [run.id]

    async def on_finish(
        self,
        tx: Tx,
        parts: EngineParts,
        effects: Effects,
        *,
        run: RunRecord,
        finished: RunFinished,
        now: datetime,
    ) -> None:
        self.finished.append((run.id, finished.status))


async def test_a_plugged_in_kind_runs_through_the_port(store: Store) -> None:
    echo = EchoKind()
    clock = ManualClock()
    actions = default_registry()
    async with Runtime.start(
        store,
        config=TEST_CONFIG,
        clock=clock,
        actions=actions,
        setup=lambda rt: rt.kinds.register(echo),
    ) as runtime:
        engine = Engine(store=store, clock=clock, actions=actions, runtime=runtime)
        services = engine.services
        run = (await services.runs.trigger(TENANT, "echo:hello", None, None, "k1")).value
        again = (await services.runs.trigger(TENANT, "echo:hello", None, None, "k1")).value
        assert again.id == run.id
        with pytest.raises(WorkflowNotFound):
            await services.runs.trigger(TENANT, "echo:missing", None, None, None)
        await services.runs.signal(TENANT, run.id, "more", None, "s1")
        await services.runs.signal(TENANT, run.id, "stop", None, "s2")
        view = await engine.wait_run(run.id)
        # Events reach every kind: DAG definitions first, then the plugged-in one.
        accepted = (await services.events.send(TENANT, "ping", None, "evt-1")).value
    assert view.status == SUCCEEDED
    assert view.output == {"signals": 2}
    assert echo.finished == [(run.id, RunStatus.SUCCEEDED)]
    async with store.transaction() as tx:
        done = await tx.get_run(TENANT, run.id)
    assert done is not None
    assert (done.kind, done.kind_state) == (ECHO, {"signals": 2})
    assert accepted.runs_started == ["run_echo_echo:pinged_evt-1"]


async def test_a_run_of_a_kind_this_process_does_not_know_waits_for_one_that_does(
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
    plain = Runtime(store, roles=["coordinator"], config=TEST_CONFIG, clock=clock)
    assert await plain.coordinator.tick_batch() == 1
    ref = RunRef(tenant_id=TENANT, run_id="r1")
    async with store.transaction() as tx:
        run = await tx.get_run(TENANT, "r1")
        assert run is not None
        assert (run.status, run.lock_version) == (RunStatus.RUNNING, 0)
        assert await tx.load_inbox([ref], now=now) == []  # put off, not consumed
        assert await tx.claim_runs_with_inbox(now=now, limit=10) == []
    # A process that knows the kind ticks it once the input is due again.
    clock.advance(timedelta(seconds=30))
    knowing = Runtime(
        store, roles=["coordinator"], config=TEST_CONFIG, clock=clock, kinds=RunKinds([EchoKind()])
    )
    assert await knowing.coordinator.tick_batch() == 1
    async with store.transaction() as tx:
        run = await tx.get_run(TENANT, "r1")
    assert run is not None
    assert run.status == RunStatus.SUCCEEDED
    assert run.kind_state == {"signals": 1}


def test_the_registry_keeps_names_and_prefixes_apart() -> None:
    kinds = RunKinds()
    assert kinds.names() == ["dag"]
    assert kinds.for_slug("orders") is kinds.default
    assert kinds.for_slug("echo:x") is kinds.default
    echo = EchoKind()
    kinds.register(echo)
    assert kinds.names() == ["dag", ECHO]
    assert kinds.for_slug("echo:x") is echo
    assert kinds.get(ECHO) is echo
    assert kinds.find("nope") is None
    with pytest.raises(UnknownRunKind):
        kinds.get("nope")
    with pytest.raises(DuplicateRunKind):
        kinds.register(EchoKind(prefix="other:"))  # same name
    with pytest.raises(DuplicateRunKind):
        kinds.register(EchoKind(prefix="echo:deep:", kind_name="deep"))  # overlapping slugs
    with pytest.raises(DuplicateRunKind):
        kinds.register(EchoKind(prefix="", kind_name="greedy"))  # must claim a prefix
    assert kinds.names() == ["dag", ECHO]


class _Unknown(msgspec.Struct, frozen=True):
    step_ref: str


async def test_a_command_of_no_known_type_is_refused_not_dropped(store: Store) -> None:
    parts = EngineParts(catalog=Runtime(store).catalog)
    now = ManualClock().now()
    async with store.transaction() as tx:
        [inserted] = await tx.insert_runs(
            [
                NewRun(
                    tenant_id=TENANT,
                    family_slug="fam",
                    version=1,
                    state=RunState(run_id="r1", status=RunStatus.RUNNING, created_at=now),
                )
            ]
        )
        with pytest.raises(AssertionError):
            await apply_commands(
                tx,
                parts,
                Effects(),
                run=inserted.run,
                commands=[_Unknown(step_ref="x")],  # type: ignore[list-item]
                now=now,
            )


@dataclass
class PoisonKind(EchoKind):
    """An echo kind whose tick raises on the signal "boom": a tick that cannot be
    written however often it is tried, as a value the database refuses is."""

    prefix: str = "poison:"
    kind_name: str = "poison"

    async def tick(
        self,
        tx: Tx,
        parts: EngineParts,
        run: RunRecord,
        inputs: Sequence[RunInput],
        now: datetime,
    ) -> KindTick:
        if any(isinstance(item, SignalReceived) and item.name == "boom" for item in inputs):
            raise RuntimeError("a kind's bug")
        return await super().tick(tx, parts, run, inputs, now)


async def test_a_run_whose_tick_cannot_be_written_fails_and_holds_up_no_other(
    store: Store,
) -> None:
    poison = PoisonKind()
    clock = ManualClock()
    actions = default_registry()
    async with Runtime.start(
        store,
        config=TEST_CONFIG,
        clock=clock,
        actions=actions,
        setup=lambda rt: (rt.kinds.register(EchoKind()), rt.kinds.register(poison)),
    ) as runtime:
        engine = Engine(store=store, clock=clock, actions=actions, runtime=runtime)
        runs = engine.services.runs
        bad = (await runs.trigger(TENANT, "poison:p", None, None, "k1")).value
        others = [
            (await runs.trigger(TENANT, f"echo:{i}", None, None, f"k{i + 2}")).value
            for i in range(3)
        ]
        await runs.signal(TENANT, bad.id, "boom", None, "s1")
        for other in others:
            await runs.signal(TENANT, other.id, "stop", None, "s2")
        # The others end although the bad run's input came first and its tick is
        # tried again and again.
        for other in others:
            assert (await engine.wait_run(other.id)).status == SUCCEEDED
        failed = await engine.wait_run(bad.id)
    assert failed.status == RunStatus.FAILED
    assert failed.error is not None
    assert failed.error.code == "engine.tick_failed"
    assert failed.error.message == "the run's tick could not be written (RuntimeError)"
    assert poison.finished == [(bad.id, RunStatus.FAILED)]


def test_only_errors_that_retrying_will_not_mend_fail_a_run() -> None:
    assert _lasting(RuntimeError("a bug"))
    assert _lasting(StoreError("postgres: a NUL", code="storage.invalid_value", retryable=False))
    assert not _lasting(StoreUnavailable("postgres: the server closed the connection"))
    assert not _lasting(StoreError("postgres: deadlock detected"))  # retryable


async def test_worker_deaths_count_per_run_in_a_row_and_a_bounded_number_of_runs(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = ManualClock().now()

    def run(run_id: str, version: int = 0) -> RunRecord:
        state = RunState(run_id=run_id, status=RunStatus.RUNNING, created_at=now)
        return RunRecord(
            tenant_id=TENANT,
            id=run_id,
            family_slug="f",
            version=1,
            status=RunStatus.RUNNING,
            state=state,
            lock_version=version,
            created_at=now,
            updated_at=now,
        )

    coordinator = Runtime(store, roles=["coordinator"], config=TEST_CONFIG).coordinator
    died = OffloadFailed("a worker process died")
    assert not coordinator._died(run("a"), RuntimeError("not a death"))
    assert [coordinator._died(run("a"), died) for _ in range(OFFLOAD_DEATHS)] == [
        *[False] * (OFFLOAD_DEATHS - 1),
        True,
    ]
    assert not coordinator._suspect(run("a"))  # counted out once it is failed
    # A run that changed in between starts counting again.
    assert not coordinator._died(run("b", 0), died)
    assert coordinator._suspect(run("b", 0))
    assert not coordinator._suspect(run("b", 1))
    for _ in range(OFFLOAD_DEATHS - 1):
        assert not coordinator._died(run("b", 1), died)
    # Only so many runs are counted at once, the oldest forgotten first.
    monkeypatch.setattr(coordinator_module, "DEATHS_KEPT", 3)
    for name in "cdef":
        coordinator._died(run(name), died)
    assert list(coordinator._deaths) == [(TENANT, name) for name in "def"]
