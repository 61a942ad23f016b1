"""Live inbox pushes: "subscriber S of tenant T has news" from the writer of a
notification change to the open sessions (WebSockets) of that subscriber.

A push carries no notification, only whose feed moved: a woken session reads
the subscriber's change log from its cursor in the store, so a lost or
repeated push costs latency, never a change. `LocalInboxFeed` wakes sessions in
this process; `RedisInboxFeed` (`engine/redisinbox.py`, imported only when
Redis is configured) also publishes across processes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from ductor_server.errors import InboxSocketLimit

Key = tuple[str, str]
"""(tenant id, subscriber id)."""

MAX_PER_SUBSCRIBER = 20
"""Open sessions one subscriber may hold on one process (tabs, devices)."""
MAX_PER_TENANT = 10_000
"""Open sessions of one tenant's subscribers on one process: each session reads
the store while idle, so a tenant opening sockets without end would load the
store for every tenant."""


class Listener:
    """One session's wake-up: set by a push for its subscriber, cleared by `wait`."""

    def __init__(self, feed: LocalInboxFeed, key: Key) -> None:
        self.key = key
        self._feed = feed
        self._event = asyncio.Event()

    def wake(self) -> None:
        """Mark that the subscriber may have news."""
        self._event.set()

    async def wait(self, within: float) -> bool:
        """Sleep until woken or `within` seconds pass; True if woken. A wake that
        came while nobody waited ends the next wait at once."""
        if not self._event.is_set():
            try:
                async with asyncio.timeout(max(within, 0.0)):
                    await self._event.wait()
            except TimeoutError:
                return False
        self._event.clear()
        return True

    def close(self) -> None:
        """Stop listening."""
        self._feed.forget(self)


@runtime_checkable
class InboxFeed(Protocol):
    """Announce subscribers' news; listen for one subscriber's."""

    def announce(self, keys: Iterable[Key]) -> None:
        """Tell the sessions of each (tenant, subscriber) that their feed moved."""
        ...

    def listen(self, tenant_id: str, subscriber_id: str) -> Listener:
        """A listener woken by every announce of this subscriber (close it when done).

        Raises:
            InboxSocketLimit: the subscriber or its tenant holds as many listeners
                as one process allows.
        """
        ...


class LocalInboxFeed:
    """Pushes within this process."""

    def __init__(
        self, *, per_subscriber: int = MAX_PER_SUBSCRIBER, per_tenant: int = MAX_PER_TENANT
    ) -> None:
        self._listeners: dict[Key, set[Listener]] = {}
        self._per_tenant: dict[str, int] = {}
        self.per_subscriber = per_subscriber
        self.per_tenant = per_tenant

    def announce(self, keys: Iterable[Key]) -> None:
        """Wake this process's listeners of `keys`."""
        for key in keys:
            for listener in self._listeners.get(key, ()):
                listener.wake()

    def listen(self, tenant_id: str, subscriber_id: str) -> Listener:
        """A new listener of the subscriber; `InboxSocketLimit` past a limit."""
        key = (tenant_id, subscriber_id)
        if len(self._listeners.get(key, ())) >= self.per_subscriber:
            raise InboxSocketLimit("subscriber", self.per_subscriber)
        if self._per_tenant.get(tenant_id, 0) >= self.per_tenant:
            raise InboxSocketLimit("tenant", self.per_tenant)
        listener = Listener(self, key)
        self._listeners.setdefault(key, set()).add(listener)
        self._per_tenant[tenant_id] = self._per_tenant.get(tenant_id, 0) + 1
        return listener

    def forget(self, listener: Listener) -> None:
        """Drop a listener (`Listener.close`)."""
        listeners = self._listeners.get(listener.key)
        if listeners is None or listener not in listeners:
            return  # closed before
        listeners.discard(listener)
        if not listeners:
            del self._listeners[listener.key]
        tenant_id = listener.key[0]
        self._per_tenant[tenant_id] -= 1
        if not self._per_tenant[tenant_id]:
            del self._per_tenant[tenant_id]

    def wake_all(self) -> None:
        """Wake every listener of this process."""
        for listeners in self._listeners.values():
            for listener in listeners:
                listener.wake()

    @property
    def listening(self) -> int:
        """How many listeners are open."""
        return sum(len(s) for s in self._listeners.values())


__all__ = [
    "MAX_PER_SUBSCRIBER",
    "MAX_PER_TENANT",
    "InboxFeed",
    "Key",
    "Listener",
    "LocalInboxFeed",
]
