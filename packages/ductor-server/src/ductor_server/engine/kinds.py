"""The `RunKind` port: how the engine starts, ticks and ends the runs of one kind,
and `RunKinds`, the kinds one runtime knows.

The engine picks a stored run's kind by `runs.kind`, and the kind of a run it
is asked to start (a trigger, a child, an event) by the family slug: a kind
may claim slugs by prefix ("bridge:"); every other slug is a published DAG
definition. The DAG kind is built in; others (the bridge) are registered by
the composition root, so the engine never imports them. A kind writes only
through the `Tx` and `Effects` it is given, inside the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import msgspec

from ductor_core.runs import (
    ErrorInfo,
    RunFinished,
    RunInput,
    RunState,
    RunStatus,
    StartChildRun,
    TickResult,
)
from ductor_server.engine.errors import DuplicateRunKind, UnknownRunKind
from ductor_server.storage.protocol import Tx
from ductor_server.storage.records import RunRecord

if TYPE_CHECKING:
    from ductor_server.engine.effects import Effects, EngineParts


@dataclass(frozen=True)
class KindTick:
    """What ticking one run produced: the tick (new state, commands, ignored
    inputs) and the kind's new bookkeeping for `runs.kind_state` (None if the
    kind keeps none)."""

    result: TickResult
    kind_state: Any = None


@dataclass(frozen=True)
class Computation:
    """A prepared tick (`PreparedTick.prepare_tick`) and whether it is cheap
    enough to compute on the event loop inside the transaction that read it
    (see `engine.cheap`); one that is not goes to the engine lane."""

    compute: Callable[[], KindTick]
    inline: bool = False

    def __call__(self) -> KindTick:
        return self.compute()


def failed_tick(state: RunState, error: ErrorInfo, now: datetime) -> TickResult:
    """A tick that fails the run with `error` (when ticking it is impossible)."""
    failed = msgspec.structs.replace(state, status=RunStatus.FAILED, error=error, finished_at=now)
    return TickResult(state=failed, commands=[RunFinished(status=RunStatus.FAILED, error=error)])


class RunKind(Protocol):
    """One kind of run: how runs of it start, tick and end.

    `tick` must not fail for a bad run: a run that cannot be ticked comes back
    failed (see `failed_tick`); an exception fails the whole coordinator batch
    and is retried (use it for store errors only).
    """

    @property
    def name(self) -> str:
        """The kind's name, stored in `runs.kind` ("dag", "bridge", ...)."""
        ...

    @property
    def slug_prefix(self) -> str | None:
        """The family slugs this kind serves start with this; None for the DAG kind,
        which serves every slug no other kind claims."""
        ...

    async def tick(
        self,
        tx: Tx,
        parts: EngineParts,
        run: RunRecord,
        inputs: Sequence[RunInput],
        now: datetime,
    ) -> KindTick:
        """Apply `inputs` to a live run and say what to do next."""
        ...

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
        """Start a run of `family_slug` on request (`POST /v1/runs`), or return the
        run a taken `idempotency_key` started; None if there is nothing to run."""
        ...

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
        """Start the child run `command` asks for (idempotent by its child key).

        Returns None when started, or why it could not start (the parent then
        hears of a failed child at once).
        """
        ...

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
        """Start the runs of this kind whose triggers match a new event; their ids."""
        ...

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
        """Release what a run of this kind held once it has ended."""
        ...


@runtime_checkable
class PreparedTick(Protocol):
    """A run kind whose tick splits into a read and a pure computation, so the
    coordinator can compute it in a worker thread with no transaction open.

    The coordinator reads (claims runs, loads inboxes, calls `prepare_tick`)
    in one short transaction. When every computation of the batch is cheap
    (`Computation.inline`), it computes them there and writes in the same
    transaction; otherwise it calls them in the engine lane with no
    transaction open, then writes in a second transaction. Either way each
    run's lock_version guards the write. A kind without it is ticked by
    `RunKind.tick` inside the write transaction.
    """

    async def prepare_tick(
        self,
        tx: Tx,
        parts: EngineParts,
        run: RunRecord,
        inputs: Sequence[RunInput],
        now: datetime,
    ) -> Callable[[], KindTick]:
        """Read through `tx` what ticking `run` needs; return the tick itself.

        The returned computation is pure (no I/O, no event loop, no `tx`) and
        must not raise for a bad run (it returns a failed tick instead). It is
        called in a lane's worker after `tx` has ended, or, when it is a
        `Computation` that says it is `inline` and so is every other run of the
        batch, on the loop inside `tx`.
        """
        ...


class RunKinds:
    """The run kinds of one runtime, by name, in registration order.

    The DAG kind is always registered first; `register` adds the others.
    """

    def __init__(self, kinds: Iterable[RunKind] = ()) -> None:
        # The DAG kind builds on `effects`, which builds on this module.
        from ductor_server.engine.dag import DagKind

        self._default: RunKind = DagKind()
        self._by_name: dict[str, RunKind] = {self._default.name: self._default}
        for kind in kinds:
            self.register(kind)

    def register(self, kind: RunKind) -> None:
        """Add a kind.

        Raises:
            DuplicateRunKind: its name or slug prefix is taken, or it claims no prefix.
        """
        if kind.name in self._by_name:
            raise DuplicateRunKind(f"run kind {kind.name!r} is already registered")
        prefix = kind.slug_prefix
        if not prefix:
            raise DuplicateRunKind(f"run kind {kind.name!r} claims no slug prefix")
        for other in self._by_name.values():
            theirs = other.slug_prefix
            if theirs and (prefix.startswith(theirs) or theirs.startswith(prefix)):
                raise DuplicateRunKind(
                    f"run kinds {kind.name!r} and {other.name!r} claim overlapping slugs"
                )
        self._by_name[kind.name] = kind

    @property
    def default(self) -> RunKind:
        """The DAG kind, which serves every slug no other kind claims."""
        return self._default

    def find(self, name: str) -> RunKind | None:
        """The kind called `name`, or None."""
        return self._by_name.get(name)

    def get(self, name: str) -> RunKind:
        """The kind called `name`.

        Raises:
            UnknownRunKind: none is registered under that name.
        """
        kind = self._by_name.get(name)
        if kind is None:
            raise UnknownRunKind(f"no run kind {name!r} is registered")
        return kind

    def for_slug(self, family_slug: str) -> RunKind:
        """The kind that serves runs of `family_slug`."""
        for kind in self._by_name.values():
            prefix = kind.slug_prefix
            if prefix and family_slug.startswith(prefix):
                return kind
        return self._default

    def names(self) -> list[str]:
        """Every registered kind's name, in registration order."""
        return list(self._by_name)

    def __iter__(self) -> Iterator[RunKind]:
        return iter(self._by_name.values())


__all__ = ["Computation", "KindTick", "PreparedTick", "RunKind", "RunKinds", "failed_tick"]
