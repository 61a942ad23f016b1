"""Live inbox pushes across processes: `RedisInboxFeed`, on the channel `<prefix>inbox`.

It wakes this process's sessions as `LocalInboxFeed` does and publishes the same
push to every process listening on the channel; after its subscription is lost
and back it wakes every session once, since a push may have been missed. Only
a process with `DUCTOR_REDIS_URL` imports this module (and with it redis).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import msgspec
from redis.asyncio import Redis

from ductor_server.engine.inboxfeed import Key, Listener, LocalInboxFeed
from ductor_server.engine.redischannel import RedisChannel

log = logging.getLogger("ductor.inbox")


class RedisInboxFeed(RedisChannel[Key]):
    """Pushes shared by every process on one Redis (channel `<prefix>inbox`)."""

    def __init__(self, redis: Redis, *, prefix: str = "ductor:") -> None:
        super().__init__(redis, f"{prefix}inbox", log=log, name="inbox", max_backoff=2.0)
        self.local = LocalInboxFeed()

    def announce(self, keys: Iterable[Key]) -> None:
        """Wake this process's listeners of `keys` and publish them to the others."""
        keys = list(keys)
        self.local.announce(keys)
        self.publish(keys)

    def listen(self, tenant_id: str, subscriber_id: str) -> Listener:
        """A new listener of the subscriber (starts the subscription if needed)."""
        self.start()
        return self.local.listen(tenant_id, subscriber_id)

    def encode(self, items: list[Key]) -> bytes:
        """`{"o": origin, "k": [[tenant, subscriber], ...]}`."""
        return msgspec.json.encode({"o": self.origin, "k": items})

    def on_gap(self) -> None:
        """Wake every session once: a push may have been missed."""
        self.local.wake_all()

    def on_message(self, data: object) -> None:
        """Wake this process's sessions of the subscribers another process announced."""
        try:
            message = msgspec.json.decode(data if isinstance(data, bytes | str) else b"")
            if message.get("o") == self.origin:
                return
            keys = [(str(t), str(s)) for t, s in message.get("k", [])]
        except (msgspec.DecodeError, AttributeError, TypeError, ValueError):
            return
        self.local.announce(keys)


__all__ = ["RedisInboxFeed"]
