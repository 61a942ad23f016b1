"""One Redis pub/sub channel between processes: coalesced publishing and a
subscription that heals itself, for the wake-ups and the inbox's pushes.

Nothing that matters travels only here: a message lost while Redis is down or
the subscription reconnects costs latency. After such a gap the subclass is
told (`on_gap`) so it can wake everything once. A process ignores its own
messages (each carries its `origin`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, TypeVar

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError

Item = TypeVar("Item", bound=Hashable)


class ReconnectingPubSub(PubSub):
    """A subscription that calls `on_reconnect` whenever redis-py reconnects it by
    itself (it resubscribes, but messages sent meanwhile are lost). redis-py
    registers `on_connect` on an already connected connection, so it only runs
    on reconnects."""

    def __init__(
        self,
        pool: ConnectionPool,
        *,
        ignore_subscribe_messages: bool,
        on_reconnect: Callable[[], None],
    ) -> None:
        super().__init__(pool, ignore_subscribe_messages=ignore_subscribe_messages)
        self._on_reconnect = on_reconnect

    async def on_connect(self, connection: Any) -> None:
        """Resubscribe, then report the reconnect."""
        await super().on_connect(connection)
        self._on_reconnect()


class RedisChannel(ABC, Generic[Item]):
    """Publishes queued items on `channel` (what is queued while a publish is on
    its way goes out together in the next message) and hands every other
    process's messages to `on_message`.

    Subclasses give `encode` (the items of one message, with `origin`), `on_message`
    (the raw data of a message from Redis) and `on_gap` (called after the
    subscription was lost and is back).
    """

    def __init__(
        self,
        redis: Redis,
        channel: str,
        *,
        log: logging.Logger,
        name: str,
        max_backoff: float,
    ) -> None:
        self.redis = redis
        self.channel = channel
        self.origin = uuid.uuid4().hex[:12]  # our own messages are not news to us
        self.published = 0  # messages sent
        self._log = log
        self._name = name
        self._max_backoff = max_backoff
        self._pending: set[Item] = set()
        self._publisher: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()

    @abstractmethod
    def encode(self, items: list[Item]) -> bytes | str:
        """One message carrying `items` (sorted) and `self.origin`."""

    @abstractmethod
    def on_message(self, data: object) -> None:
        """A message of the channel (possibly this process's own)."""

    def on_gap(self) -> None:
        """The subscription was lost and is back: messages may have been missed."""

    def publish(self, items: Iterable[Item]) -> None:
        """Queue `items` for the other processes (sent by a task of their own)."""
        self._pending.update(items)
        if self._pending and (self._publisher is None or self._publisher.done()):
            self._publisher = asyncio.get_running_loop().create_task(
                self._publish(), name=f"ductor-{self._name}-publish"
            )

    def start(self) -> None:
        """Subscribe to the channel (idempotent)."""
        if self._listener is None or self._listener.done():
            self._listener = asyncio.get_running_loop().create_task(
                self._listen(), name=f"ductor-{self._name}-listen"
            )

    async def subscribed(self) -> None:
        """Wait until subscribed (for tests and start-up; bound it with
        `asyncio.timeout`)."""
        self.start()
        await self._subscribed.wait()

    async def aclose(self) -> None:
        """Stop listening and publishing."""
        for task in (self._listener, self._publisher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._listener = self._publisher = None

    async def _publish(self) -> None:
        while self._pending:
            items = sorted(self._pending)  # type: ignore[type-var]
            self._pending.clear()
            try:
                await self.redis.publish(self.channel, self.encode(items))
                self.published += 1
            except RedisError as exc:
                self._log.warning("could not publish on %s (%s)", self.channel, exc)
                return

    async def _listen(self) -> None:
        failures = 0
        while True:
            pubsub = ReconnectingPubSub(
                self.redis.connection_pool,
                ignore_subscribe_messages=True,
                on_reconnect=self.on_gap,
            )
            try:
                await pubsub.subscribe(self.channel)
                if failures:
                    self.on_gap()
                failures = 0
                self._subscribed.set()
                while True:
                    message = await pubsub.get_message(timeout=None)
                    if message is not None:
                        self.on_message(message.get("data"))
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                failures += 1
                self._subscribed.clear()
                self._log.warning("%s lost (%s); retrying (%d)", self.channel, exc, failures)
                await asyncio.sleep(min(0.1 * 2**failures, self._max_backoff))
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]


__all__ = ["Item", "ReconnectingPubSub", "RedisChannel"]
