"""Lifecycle hooks: the events plugins are told about, and the dispatcher that tells them.

Every event is given after the work it reports has committed, each hook in its
own task under a timeout: a hook that raises, hangs or is slow is logged and
never fails, rolls back or stalls the run, decision or entry it hears about.
The dispatcher writes nothing and reads no store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import msgspec

from ductor_server.storage.protocol import Tx

_log = logging.getLogger("ductor.extensions.hooks")

SERVER_STARTED = "server.started"
SERVER_STOPPING = "server.stopping"
RUN_FINISHED = "run.finished"
DECISION_MADE = "routing.decision_made"
ENTRY_POSTED = "ledger.entry_posted"

EVENT_NAMES = (SERVER_STARTED, SERVER_STOPPING, RUN_FINISHED, DECISION_MADE, ENTRY_POSTED)
"""Every event a hook may be given."""

DEFAULT_HOOK_TIMEOUT = 5.0
"""How long one hook may take with one event, in seconds."""


class HookEvent(msgspec.Struct, frozen=True, kw_only=True):
    """What a hook is told.

    Attributes:
        name: one of `EVENT_NAMES`.
        at: when the server saw it happen.
        tenant_id: whose run, decision or entry it is (None for server events).
        data: the event's JSON facts (see docs/extending.md for each event's keys).
    """

    name: str
    at: datetime
    tenant_id: str | None = None
    data: dict[str, Any] = {}


Hook = Callable[[HookEvent], Awaitable[None]]
"""A lifecycle hook: an async function given each event."""


class HookExited(RuntimeError):
    """A hook called `sys.exit()`: a failure of that hook, not the end of the process."""


async def _contained(hook: Hook, event: HookEvent) -> None:
    """Run `hook` on `event`, turning a `SystemExit` it raises into `HookExited`
    inside its own task (a task that lets `SystemExit` out ends the event loop)."""
    try:
        await hook(event)
    except SystemExit as exc:
        raise HookExited(f"the hook called sys.exit({exc.code!r})") from None


class HookDispatcher:
    """Gives events to the process's hooks, after commit, each bounded by `timeout`.

    Args:
        hooks: (name, hook) pairs; the name is used in log lines.
        timeout: seconds one hook may take with one event.
    """

    def __init__(
        self, hooks: Sequence[tuple[str, Hook]] = (), *, timeout: float = DEFAULT_HOOK_TIMEOUT
    ) -> None:
        self.hooks = tuple(hooks)
        self.timeout = timeout
        self._pending: set[asyncio.Task[None]] = set()

    def __bool__(self) -> bool:
        return bool(self.hooks)

    async def _call(self, name: str, hook: Hook, event: HookEvent) -> None:
        try:
            await asyncio.wait_for(_contained(hook, event), self.timeout)
        except TimeoutError:
            _log.error(
                "hook %s took longer than %.1fs with %s; it was cancelled",
                name,
                self.timeout,
                event.name,
            )
        except Exception:
            _log.exception("hook %s failed with %s (ignored)", name, event.name)

    def emit(self, event: HookEvent) -> None:
        """Start every hook on `event` in its own task and return at once.

        Must be called on the event loop (an after-commit callback is).
        """
        for name, hook in self.hooks:
            task = asyncio.get_running_loop().create_task(self._call(name, hook, event))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    def after_commit(
        self, tx: Tx, name: str, *, at: datetime, tenant_id: str, data: Mapping[str, Any]
    ) -> None:
        """Emit the event `name` once `tx` has committed (nothing if it rolls back)."""
        if not self.hooks:
            return
        event = HookEvent(name=name, at=at, tenant_id=tenant_id, data=dict(data))
        tx.session.after_commit(lambda: self.emit(event))

    async def deliver(self, event: HookEvent) -> None:
        """Give `event` to every hook and wait for them (each still bounded): for the
        server's start and stop, which hooks should see before it goes on."""
        await asyncio.gather(*(self._call(name, hook, event) for name, hook in self.hooks))

    async def drain(self) -> None:
        """Wait for the events still being given (each bounded by the timeout)."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)


def to_data(value: Any) -> dict[str, Any]:
    """A struct (or mapping) as the JSON `data` of an event."""
    data = msgspec.to_builtins(value)
    assert isinstance(data, dict)
    return data


__all__ = [
    "DECISION_MADE",
    "DEFAULT_HOOK_TIMEOUT",
    "ENTRY_POSTED",
    "EVENT_NAMES",
    "RUN_FINISHED",
    "SERVER_STARTED",
    "SERVER_STOPPING",
    "Hook",
    "HookDispatcher",
    "HookEvent",
    "to_data",
]
