"""What every service is given: the store and the parts of the engine it writes for.

Built once per process by the composition root; holds no state of its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from ductor_core.expressions import ExpressionEngine
from ductor_server.engine.catalog import WorkflowCatalog
from ductor_server.engine.clock import Clock
from ductor_server.engine.effects import EngineParts, StartTaker
from ductor_server.engine.endings import RunEndings
from ductor_server.engine.inboxfeed import InboxFeed
from ductor_server.engine.queue import WakeUp
from ductor_server.storage.protocol import Store


@dataclass(frozen=True, kw_only=True)
class ServiceContext:
    """The shared dependencies of the services.

    Attributes:
        store: the opened, migrated store.
        wake: how to wake the engine loops after writing.
        clock: where `now` comes from.
        parts: the engine's definition cache and expression engine, shared with
            the coordinator so a run started here is ticked the same way.
        feed: where inbox changes are announced to subscribers' open sessions.
        start_taker: gives a trigger's transaction, starting the given number
            of runs, a taker of their first tasks, when a worker of this process
            may lease them at once (`Runtime.start_taker`; None, or a call that
            answers None: the tasks wait in the queue).
        endings: where a request waits for a run to end (None: it cannot wait).
    """

    store: Store
    wake: WakeUp
    clock: Clock
    parts: EngineParts
    feed: InboxFeed | None = None
    start_taker: Callable[[int], StartTaker | None] | None = None
    endings: RunEndings | None = None

    @property
    def catalog(self) -> WorkflowCatalog:
        """The definition cache shared with the engine loops."""
        return self.parts.catalog

    @property
    def expressions(self) -> ExpressionEngine | None:
        """The CEL engine of validation and trigger filters (None: the default)."""
        return self.parts.engine


@asynccontextmanager
async def start_taking(context: ServiceContext, runs: int = 1) -> AsyncIterator[StartTaker | None]:
    """The taker a transaction that starts `runs` runs hands its new tasks to
    (None: they wait in the queue); settled when the block ends, as committed
    unless it raised. Open it around the transaction and nothing else: a
    worker's slots are held for it meanwhile."""
    taker = context.start_taker(runs) if context.start_taker is not None else None
    try:
        yield taker
    except BaseException:
        if taker is not None:
            await taker.settle(committed=False)
        raise
    if taker is not None:
        await taker.settle(committed=True)


__all__ = ["ServiceContext", "start_taking"]
