"""The `Runtime`: the engine loops (coordinator, workers, timers) of one process.

Started and stopped inside the application's lifespan; holds no state that
the store does not also hold, so a crash loses nothing.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from ductor_core.expressions import ExpressionEngine
from ductor_server.engine.clock import Clock, SystemClock
from ductor_server.engine.queue import InProcessWakeUp, Topic
from ductor_server.services import Services


class Role(enum.StrEnum):
    """What a process does; `ductor serve` selects any subset, default all."""

    API = "api"
    COORDINATOR = "coordinator"
    WORKER = "worker"
    TIMER = "timer"


ALL_ROLES: frozenset[Role] = frozenset(Role)


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    """Tuning of the engine loops.

    Attributes:
        poll_interval: seconds a loop sleeps without a wake-up before looking again.
        coordinator_batch: runs claimed and ticked per coordinator transaction.
        worker_batch: tasks leased per round trip.
        worker_concurrency: handlers running at once in this process.
        lease_seconds: how long a leased task is ours before another worker may take it.
        timer_batch: due timers moved into inboxes per transaction.
    """

    poll_interval: float = 0.5
    coordinator_batch: int = 64
    worker_batch: int = 64
    worker_concurrency: int = 64
    lease_seconds: float = 60.0
    timer_batch: int = 256


class Runtime:
    """The engine loops of this process, plus the `Services` bound to them."""

    def __init__(
        self,
        store: Any,
        *,
        roles: Iterable[Role | str] = ALL_ROLES,
        config: RuntimeConfig | None = None,
        clock: Clock | None = None,
        engine: ExpressionEngine | None = None,
    ) -> None:
        self.store = store
        self.roles = frozenset(Role(r) for r in roles)
        self.config = config or RuntimeConfig()
        self.clock = clock or SystemClock()
        self.engine = engine
        self.wakeup = InProcessWakeUp()
        self.services = Services(store, wake=self.wakeup, engine=engine, clock=self.clock)

    @classmethod
    @asynccontextmanager
    async def start(
        cls,
        store: Any,
        *,
        roles: Iterable[Role | str] = ALL_ROLES,
        config: RuntimeConfig | None = None,
        clock: Clock | None = None,
        engine: ExpressionEngine | None = None,
    ) -> AsyncIterator[Runtime]:
        """Start the loops for `roles` on an opened, migrated store; stop them on exit."""
        runtime = cls(store, roles=roles, config=config, clock=clock, engine=engine)
        yield runtime

    def wake(self) -> None:
        """Wake every loop of this process (after writing outside the services)."""
        for topic in Topic:
            self.wakeup.notify(topic)
